//! pfsync's messages as FreeBSD 14 puts them on the wire (if_pfsync.h and pfvar.h, message
//! version 1400): a 20-byte frame header, then sections of one action each (a 4-byte
//! subheader with the action and a count, then `count` records of the action's fixed length),
//! closed by an end-of-frame section. Every multi-byte field is big-endian.
//!
//! Each record is an owned struct with `parse` (from exactly its length of bytes, so that no
//! accessor can fail) and `emit`. Offsets are commented as FreeBSD's packed structs lay them
//! out; the tests at the bottom check them on literal bytes.

/// IP protocol number of pfsync.
pub const PROTO: u8 = 240;
/// Frames are sent, and must arrive, with this TTL: a frame from beyond the link is refused.
pub const TTL: u8 = 255;
/// The multicast group used when no `syncpeer` is set.
pub const GROUP: [u8; 4] = [224, 0, 0, 240];
/// `pfsync_header.version` (PFSYNC_VERSION; the 1400 layout is chosen by the action numbers).
pub const VERSION: u8 = 5;

pub const HEADER_LEN: usize = 20;
pub const SUBHEADER_LEN: usize = 4;
/// `struct pfsync_state_peer`.
pub const PEER_LEN: usize = 32;
/// `struct pfsync_state_1400`.
pub const STATE_LEN: usize = 277;
/// `struct pfsync_upd_c`.
pub const UPD_C_LEN: usize = 84;
/// `struct pfsync_upd_req`, `pfsync_del_c`, `pfsync_ins_ack`: an id and a creator id.
pub const ID_LEN: usize = 12;
/// `struct pfsync_clr`.
pub const CLR_LEN: usize = 20;
/// `struct pfsync_bus`.
pub const BUS_LEN: usize = 12;
pub const IFNAMSIZ: usize = 16;

/// Action numbers (PFSYNC_ACT_*).
pub mod act {
    pub const CLR: u8 = 0;
    pub const INS_1301: u8 = 1;
    pub const INS_ACK: u8 = 2;
    pub const UPD_1301: u8 = 3;
    pub const UPD_C: u8 = 4;
    pub const UPD_REQ: u8 = 5;
    pub const DEL: u8 = 6;
    pub const DEL_C: u8 = 7;
    pub const INS_F: u8 = 8;
    pub const DEL_F: u8 = 9;
    pub const BUS: u8 = 10;
    pub const TDB: u8 = 11;
    pub const EOF: u8 = 12;
    pub const INS: u8 = 13;
    pub const UPD: u8 = 14;
    /// One past the last action.
    pub const MAX: u8 = 15;
    /// pfctl's names, indexed by action.
    pub const NAMES: [&str; MAX as usize] = [
        "clear",
        "insert-1301",
        "insert-ack",
        "update-1301",
        "update-compressed",
        "update-request",
        "delete",
        "delete-compressed",
        "insert-fragment",
        "delete-fragments",
        "bulk-status",
        "tdb",
        "end-of-frame",
        "insert",
        "update",
    ];
}

/// `pfsync_bus.status`.
pub const BUS_START: u8 = 1;
pub const BUS_END: u8 = 2;

/// pf's address family numbers (FreeBSD's AF_INET, AF_INET6).
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 28;
/// pf's directions (PF_IN, PF_OUT).
pub const PF_IN: u8 = 1;
pub const PF_OUT: u8 = 2;
/// `state_flags` bits (PFSTATE_*) that xpf keeps.
pub const PFSTATE_ALLOWOPTS: u16 = 0x0001;
pub const PFSTATE_SLOPPY: u16 = 0x0002;
pub const PFSTATE_PFLOW: u16 = 0x0004;
pub const PFSTATE_NOSYNC: u16 = 0x0008;
/// On an insert: the sender holds the state's first packet until the receiver answers with
/// an insert ack (defer mode).
pub const PFSTATE_ACK: u16 = 0x0010;
/// Scrub actions the state applies (with `min_ttl`, `set_tos`, `max_mss`).
pub const PFSTATE_NODF: u16 = 0x0020;
pub const PFSTATE_SETTOS: u16 = 0x0040;
pub const PFSTATE_RANDOMID: u16 = 0x0080;
/// `pfsync_state_scrub.scrub_flag`: the scrub part is meaningful.
pub const SCRUB_FLAG_VALID: u8 = 0x01;

#[inline]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
#[inline]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}
#[inline]
fn be64(b: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(b[o..o + 8].try_into().unwrap())
}
#[inline]
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}
fn arr<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    b[o..o + N].try_into().unwrap()
}

/// An interface name field: NUL-padded, at most 15 bytes of name.
pub fn ifname(name: &str) -> [u8; IFNAMSIZ] {
    let mut b = [0u8; IFNAMSIZ];
    let n = name.len().min(IFNAMSIZ - 1);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    b
}

/// The name in an interface name field (up to its first NUL), if it is UTF-8.
pub fn ifname_str(b: &[u8; IFNAMSIZ]) -> Option<&str> {
    let n = b.iter().position(|&c| c == 0).unwrap_or(IFNAMSIZ);
    std::str::from_utf8(&b[..n]).ok()
}

/// `struct pfsync_header`: version, pad, length of the whole frame, ruleset checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    /// Bytes from the start of this header to the end of the frame's last section.
    pub len: u16,
    /// The sender's ruleset checksum: rule numbers in its states mean something to a receiver
    /// only when this equals its own.
    pub cksum: [u8; 16],
}

impl Header {
    pub fn parse(b: &[u8]) -> Option<Header> {
        (b.len() >= HEADER_LEN).then(|| Header { version: b[0], len: be16(b, 2), cksum: arr(b, 4) })
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.version; // 0
        b[1] = 0; // 1: _pad
        put16(b, 2, self.len); // 2..4
        b[4..20].copy_from_slice(&self.cksum); // 4..20
    }
}

/// `struct pfsync_subheader`: action, pad, count of records that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subheader {
    pub action: u8,
    pub count: u16,
}

impl Subheader {
    pub fn parse(b: &[u8]) -> Option<Subheader> {
        (b.len() >= SUBHEADER_LEN).then(|| Subheader { action: b[0], count: be16(b, 2) })
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.action;
        b[1] = 0;
        put16(b, 2, self.count);
    }
}

/// `struct pfsync_state_peer`: one side's TCP tracking data, with its scrub part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerRec {
    /// `pfsync_state_scrub`: pfss_flags (2), pfss_ttl (1), scrub_flag (1), pfss_ts_mod (4).
    pub scrub: [u8; 8],
    pub seqlo: u32,
    pub seqhi: u32,
    pub seqdiff: u32,
    pub max_win: u16,
    pub mss: u16,
    /// TCPS_* for TCP; PFUDPS_* / PFOTHERS_* otherwise.
    pub state: u8,
    pub wscale: u8,
}

impl PeerRec {
    pub fn parse(b: &[u8]) -> PeerRec {
        PeerRec {
            scrub: arr(b, 0),     // 0..8
            seqlo: be32(b, 8),    // 8
            seqhi: be32(b, 12),   // 12
            seqdiff: be32(b, 16), // 16
            max_win: be16(b, 20), // 20
            mss: be16(b, 22),     // 22
            state: b[24],         // 24
            wscale: b[25],        // 25, then pad[6] to 32
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.scrub);
        put32(b, 8, self.seqlo);
        put32(b, 12, self.seqhi);
        put32(b, 16, self.seqdiff);
        put16(b, 20, self.max_win);
        put16(b, 22, self.mss);
        b[24] = self.state;
        b[25] = self.wscale;
        b[26..32].fill(0);
    }
}

/// `struct pfsync_state_key`: two addresses (`struct pf_addr`, 16 bytes, IPv4 in the first
/// four) and two ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyRec {
    pub addr: [[u8; 16]; 2],
    pub port: [u16; 2],
}

impl KeyRec {
    fn parse(b: &[u8]) -> KeyRec {
        KeyRec { addr: [arr(b, 0), arr(b, 16)], port: [be16(b, 32), be16(b, 34)] }
    }
    fn emit(&self, b: &mut [u8]) {
        b[0..16].copy_from_slice(&self.addr[0]);
        b[16..32].copy_from_slice(&self.addr[1]);
        put16(b, 32, self.port[0]);
        put16(b, 34, self.port[1]);
    }
}

/// `struct pfsync_state_1400`: a whole state, as insert, update and bulk send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateRec {
    pub id: u64,
    pub ifname: [u8; IFNAMSIZ],
    /// [wire side, stack side] (PF_SK_WIRE, PF_SK_STACK); equal without NAT.
    pub key: [KeyRec; 2],
    pub src: PeerRec,
    pub dst: PeerRec,
    pub rt_addr: [u8; 16],
    pub rule: u32,
    pub anchor: u32,
    pub nat_rule: u32,
    /// Age, seconds.
    pub creation: u32,
    /// Seconds until it expires.
    pub expire: u32,
    /// [from src, from dst]; sent as two 32-bit halves each, high first.
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
    pub creatorid: u32,
    pub af: u8,
    pub proto: u8,
    pub direction: u8,
    pub state_flags: u16,
    pub log: u8,
    /// PFTM_* of the state's timeout class.
    pub timeout: u8,
    pub sync_flags: u8,
    pub updates: u8,
    pub qid: u16,
    pub pqid: u16,
    pub dnpipe: u16,
    pub dnrpipe: u16,
    pub rtableid: i32,
    pub min_ttl: u8,
    pub set_tos: u8,
    pub max_mss: u16,
    pub set_prio: [u8; 2],
    pub rt: u8,
    pub rt_ifname: [u8; IFNAMSIZ],
}

fn counter(b: &[u8], o: usize) -> u64 {
    ((be32(b, o) as u64) << 32) | be32(b, o + 4) as u64
}
fn put_counter(b: &mut [u8], o: usize, v: u64) {
    put32(b, o, (v >> 32) as u32);
    put32(b, o + 4, v as u32);
}

impl StateRec {
    pub fn parse(b: &[u8]) -> StateRec {
        let b = &b[..STATE_LEN];
        StateRec {
            id: be64(b, 0),    // 0..8
            ifname: arr(b, 8), // 8..24
            key: [KeyRec::parse(&b[24..60]), KeyRec::parse(&b[60..96])],
            src: PeerRec::parse(&b[96..128]),  // 96..128
            dst: PeerRec::parse(&b[128..160]), // 128..160
            rt_addr: arr(b, 160),              // 160..176
            rule: be32(b, 176),
            anchor: be32(b, 180),
            nat_rule: be32(b, 184),
            creation: be32(b, 188),
            expire: be32(b, 192),
            packets: [counter(b, 196), counter(b, 204)], // 196..212
            bytes: [counter(b, 212), counter(b, 220)],   // 212..228
            creatorid: be32(b, 228),
            af: b[232],
            proto: b[233],
            direction: b[234],
            state_flags: be16(b, 235),
            log: b[237],
            // 238: __spare
            timeout: b[239],
            sync_flags: b[240],
            updates: b[241],
            // The 1301 layout ends here (242 bytes); 1400 goes on.
            qid: be16(b, 242),
            pqid: be16(b, 244),
            dnpipe: be16(b, 246),
            dnrpipe: be16(b, 248),
            rtableid: be32(b, 250) as i32,
            min_ttl: b[254],
            set_tos: b[255],
            max_mss: be16(b, 256),
            set_prio: [b[258], b[259]],
            rt: b[260],
            rt_ifname: arr(b, 261), // 261..277
        }
    }

    pub fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..STATE_LEN];
        put64(b, 0, self.id);
        b[8..24].copy_from_slice(&self.ifname);
        self.key[0].emit(&mut b[24..60]);
        self.key[1].emit(&mut b[60..96]);
        self.src.emit(&mut b[96..128]);
        self.dst.emit(&mut b[128..160]);
        b[160..176].copy_from_slice(&self.rt_addr);
        put32(b, 176, self.rule);
        put32(b, 180, self.anchor);
        put32(b, 184, self.nat_rule);
        put32(b, 188, self.creation);
        put32(b, 192, self.expire);
        put_counter(b, 196, self.packets[0]);
        put_counter(b, 204, self.packets[1]);
        put_counter(b, 212, self.bytes[0]);
        put_counter(b, 220, self.bytes[1]);
        put32(b, 228, self.creatorid);
        b[232] = self.af;
        b[233] = self.proto;
        b[234] = self.direction;
        put16(b, 235, self.state_flags);
        b[237] = self.log;
        b[238] = 0;
        b[239] = self.timeout;
        b[240] = self.sync_flags;
        b[241] = self.updates;
        put16(b, 242, self.qid);
        put16(b, 244, self.pqid);
        put16(b, 246, self.dnpipe);
        put16(b, 248, self.dnrpipe);
        put32(b, 250, self.rtableid as u32);
        b[254] = self.min_ttl;
        b[255] = self.set_tos;
        put16(b, 256, self.max_mss);
        b[258..260].copy_from_slice(&self.set_prio);
        b[260] = self.rt;
        b[261..277].copy_from_slice(&self.rt_ifname);
    }
}

/// `struct pfsync_upd_c`: a compressed update (the peers and the timer, by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpdC {
    pub id: u64,
    pub src: PeerRec,
    pub dst: PeerRec,
    pub creatorid: u32,
    pub expire: u32,
    pub timeout: u8,
}

impl UpdC {
    pub fn parse(b: &[u8]) -> UpdC {
        UpdC {
            id: be64(b, 0),                  // 0..8
            src: PeerRec::parse(&b[8..40]),  // 8..40
            dst: PeerRec::parse(&b[40..72]), // 40..72
            creatorid: be32(b, 72),          // 72
            expire: be32(b, 76),             // 76
            timeout: b[80],                  // 80, then _pad[3] to 84
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        put64(b, 0, self.id);
        self.src.emit(&mut b[8..40]);
        self.dst.emit(&mut b[40..72]);
        put32(b, 72, self.creatorid);
        put32(b, 76, self.expire);
        b[80] = self.timeout;
        b[81..84].fill(0);
    }
}

/// A state named by id and creator: update request, compressed delete, insert ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateId {
    pub id: u64,
    pub creatorid: u32,
}

impl StateId {
    pub fn parse(b: &[u8]) -> StateId {
        StateId { id: be64(b, 0), creatorid: be32(b, 8) }
    }
    pub fn emit(&self, b: &mut [u8]) {
        put64(b, 0, self.id);
        put32(b, 8, self.creatorid);
    }
}

/// `struct pfsync_clr`: every state of a creator (on an interface, or all) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clr {
    pub ifname: [u8; IFNAMSIZ],
    pub creatorid: u32,
}

impl Clr {
    pub fn parse(b: &[u8]) -> Clr {
        Clr { ifname: arr(b, 0), creatorid: be32(b, 16) }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[..16].copy_from_slice(&self.ifname);
        put32(b, 16, self.creatorid);
    }
    /// The interface whose states go; None: all of them (no name, or "all").
    pub fn interface(&self) -> Option<&str> {
        ifname_str(&self.ifname).filter(|n| !n.is_empty() && *n != "all")
    }
}

/// `struct pfsync_bus`: a bulk update starts or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bus {
    pub creatorid: u32,
    /// Seconds since the bulk started (pf: time_uptime - bulk start) at END.
    pub endtime: u32,
    pub status: u8,
}

impl Bus {
    pub fn parse(b: &[u8]) -> Bus {
        Bus { creatorid: be32(b, 0), endtime: be32(b, 4), status: b[8] }
    }
    pub fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.creatorid);
        put32(b, 4, self.endtime);
        b[8] = self.status;
        b[9..12].fill(0);
    }
}

/// One decoded record of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    Clear(Clr),
    Insert(StateRec),
    InsertAck(StateId),
    Update(StateRec),
    UpdateC(UpdC),
    UpdateReq(StateId),
    DeleteC(StateId),
    Bus(Bus),
}

impl Msg {
    pub fn action(&self) -> u8 {
        match self {
            Msg::Clear(_) => act::CLR,
            Msg::Insert(_) => act::INS,
            Msg::InsertAck(_) => act::INS_ACK,
            Msg::Update(_) => act::UPD,
            Msg::UpdateC(_) => act::UPD_C,
            Msg::UpdateReq(_) => act::UPD_REQ,
            Msg::DeleteC(_) => act::DEL_C,
            Msg::Bus(_) => act::BUS,
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        match self {
            Msg::Clear(m) => m.emit(b),
            Msg::Insert(m) | Msg::Update(m) => m.emit(b),
            Msg::InsertAck(m) | Msg::UpdateReq(m) | Msg::DeleteC(m) => m.emit(b),
            Msg::UpdateC(m) => m.emit(b),
            Msg::Bus(m) => m.emit(b),
        }
    }
}

/// What a receiver does with a section: the handler table, indexed by action, with each
/// action's record length (pf's `pfsync_acts[]`).
#[derive(Debug, Clone, Copy)]
pub struct Handler {
    /// Record length; sections of this action are `count * len` bytes.
    pub len: usize,
    /// Decodes one record; None for actions xpf does not take (their sections are skipped by
    /// length and counted as bad actions).
    pub decode: Option<fn(&[u8]) -> Msg>,
}

pub const HANDLERS: [Handler; act::MAX as usize] = [
    Handler { len: CLR_LEN, decode: Some(|b| Msg::Clear(Clr::parse(b))) },
    // The 1301 layout (242 bytes): older peers; skipped, counted.
    Handler { len: 242, decode: None },
    Handler { len: ID_LEN, decode: Some(|b| Msg::InsertAck(StateId::parse(b))) },
    Handler { len: 242, decode: None },
    Handler { len: UPD_C_LEN, decode: Some(|b| Msg::UpdateC(UpdC::parse(b))) },
    Handler { len: ID_LEN, decode: Some(|b| Msg::UpdateReq(StateId::parse(b))) },
    // DEL carries a whole state; FreeBSD never sends it (it sends DEL_C).
    Handler { len: STATE_LEN, decode: None },
    Handler { len: ID_LEN, decode: Some(|b| Msg::DeleteC(StateId::parse(b))) },
    Handler { len: 0, decode: None },
    Handler { len: 0, decode: None },
    Handler { len: BUS_LEN, decode: Some(|b| Msg::Bus(Bus::parse(b))) },
    Handler { len: 0, decode: None },
    // EOF: no records; ends the frame.
    Handler { len: 0, decode: None },
    Handler { len: STATE_LEN, decode: Some(|b| Msg::Insert(StateRec::parse(b))) },
    Handler { len: STATE_LEN, decode: Some(|b| Msg::Update(StateRec::parse(b))) },
];

/// Record length of `action` as xpf sends it.
pub fn len_of(action: u8) -> usize {
    HANDLERS[action as usize].len
}

fn addr_text(a: &[u8; 16], af: u8) -> String {
    if af == AF_INET6 {
        std::net::Ipv6Addr::from(*a).to_string()
    } else {
        std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string()
    }
}

/// One record as `xpfctl sync-decode` prints it (tcpdump's pfsync printer's style).
pub fn describe(m: &Msg) -> String {
    let peer =
        |p: &PeerRec| format!("state {} seq {}:{} win {} ws {}", p.state, p.seqlo, p.seqhi, p.max_win, p.wscale & 0x0f);
    match m {
        Msg::Insert(r) | Msg::Update(r) => {
            let k = &r.key[0];
            format!(
                "{} id {:016x} creator {:08x} {} proto {} {} {}:{} {} {}:{} [{}] [{}] age {} expires in {} timeout {} pkts {}:{} bytes {}:{} rule {}",
                if matches!(m, Msg::Insert(_)) { "insert" } else { "update" },
                r.id,
                r.creatorid,
                ifname_str(&r.ifname).unwrap_or("?"),
                r.proto,
                if r.direction == PF_OUT { "out" } else { "in" },
                addr_text(&k.addr[1], r.af),
                k.port[1],
                if r.direction == PF_OUT { "->" } else { "<-" },
                addr_text(&k.addr[0], r.af),
                k.port[0],
                peer(&r.src),
                peer(&r.dst),
                r.creation,
                r.expire,
                r.timeout,
                r.packets[0],
                r.packets[1],
                r.bytes[0],
                r.bytes[1],
                r.rule as i32
            )
        }
        Msg::UpdateC(u) => format!(
            "update-compressed id {:016x} creator {:08x} [{}] [{}] expires in {} timeout {}",
            u.id,
            u.creatorid,
            peer(&u.src),
            peer(&u.dst),
            u.expire,
            u.timeout
        ),
        Msg::UpdateReq(s) if s.id == 0 && s.creatorid == 0 => "update-request: bulk (every state)".into(),
        Msg::UpdateReq(s) => format!("update-request id {:016x} creator {:08x}", s.id, s.creatorid),
        Msg::DeleteC(s) => format!("delete-compressed id {:016x} creator {:08x}", s.id, s.creatorid),
        Msg::InsertAck(s) => format!("insert-ack id {:016x} creator {:08x}", s.id, s.creatorid),
        Msg::Clear(c) => format!("clear creator {:08x} on {}", c.creatorid, ifname_str(&c.ifname).unwrap_or("?")),
        Msg::Bus(b) => format!(
            "bulk-status {} creator {:08x} endtime {}",
            match b.status {
                BUS_START => "start",
                BUS_END => "end",
                _ => "?",
            },
            b.creatorid,
            b.endtime
        ),
    }
}
