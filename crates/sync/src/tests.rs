//! Byte fixtures of every message (offsets from FreeBSD 14's packed structs, written out here
//! independently of `emit`), frame checks, and a two-firewall simulation over a lossy link.

use crate::auth::Key;
use crate::endpoint::{BulkIn, Config, Endpoint};
use crate::frame::{self, Bad, FrameBuilder};
use crate::replica::{FloatingOnly, Replica, Tables};
use crate::wire::*;
use xpf_state::{Config as TConfig, Dir, Key4, Key6, NewState, Peer, Seed, StateTable, Timeout};
use xpf_wire::Addr;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Bytes of `len` with the given (offset, hex) pieces; the rest zero.
fn fixture(len: usize, parts: &[(usize, &str)]) -> Vec<u8> {
    let mut b = vec![0u8; len];
    for (o, h) in parts {
        let v = hex(h);
        b[*o..*o + v.len()].copy_from_slice(&v);
    }
    b
}

fn sample_state() -> StateRec {
    StateRec {
        id: 0x0102_0304_0506_0708,
        ifname: ifname("vtnet0"),
        key: [
            KeyRec { addr: [Addr::v4([10, 0, 1, 2]).0, Addr::v4([10, 0, 2, 3]).0], port: [40000, 80] },
            KeyRec { addr: [Addr::v4([192, 0, 2, 1]).0, Addr::v4([10, 0, 2, 3]).0], port: [50000, 80] },
        ],
        src: PeerRec {
            scrub: [0; 8],
            seqlo: 0x1111_1111,
            seqhi: 0x2222_2222,
            seqdiff: 0,
            max_win: 0xfaf0,
            mss: 1460,
            state: 4,
            wscale: 0x87,
        },
        dst: PeerRec {
            seqlo: 0x3333_3333,
            seqhi: 0x4444_4444,
            max_win: 65535,
            mss: 1448,
            state: 4,
            ..Default::default()
        },
        rt_addr: [0; 16],
        rule: 3,
        anchor: u32::MAX,
        nat_rule: u32::MAX,
        creation: 61,
        expire: 86390,
        packets: [0x1_0000_0002, 5],
        bytes: [700, 0x2_0000_0000],
        creatorid: 0xdead_beef,
        af: AF_INET,
        proto: 6,
        direction: PF_IN,
        state_flags: PFSTATE_ALLOWOPTS | PFSTATE_SLOPPY,
        log: 0,
        timeout: 2,
        sync_flags: 0,
        updates: 0,
        qid: 7,
        pqid: 8,
        dnpipe: 0,
        dnrpipe: 0,
        rtableid: -1,
        min_ttl: 0,
        set_tos: 0,
        max_mss: 1400,
        set_prio: [0, 0],
        rt: 0,
        rt_ifname: [0; 16],
    }
}

/// `pfsync_state_1400` of `sample_state`, field by field at FreeBSD's offsets.
fn sample_state_bytes() -> Vec<u8> {
    fixture(
        STATE_LEN,
        &[
            (0, "0102030405060708"),                      // id
            (8, "76746e657430"),                          // ifname "vtnet0"
            (24, "0a000102"),                             // key[0].addr[0]
            (40, "0a000203"),                             // key[0].addr[1]
            (56, "9c40 0050"),                            // key[0].port 40000, 80
            (60, "c0000201"),                             // key[1].addr[0]
            (76, "0a000203"),                             // key[1].addr[1]
            (92, "c350 0050"),                            // key[1].port 50000, 80
            (96 + 8, "11111111 22222222 00000000"),       // src seqlo, seqhi, seqdiff
            (96 + 20, "faf0 05b4 04 87"),                 // src max_win, mss, state, wscale
            (128 + 8, "33333333 44444444"),               // dst seqlo, seqhi
            (128 + 20, "ffff 05a8 04"),                   // dst max_win, mss, state
            (176, "00000003 ffffffff ffffffff"),          // rule, anchor, nat_rule
            (188, "0000003d 00015176"),                   // creation 61, expire 86390
            (196, "00000001 00000002 00000000 00000005"), // packets
            (212, "00000000 000002bc 00000002 00000000"), // bytes
            (228, "deadbeef"),                            // creatorid
            (232, "02 06 01 0003"),                       // af, proto, direction, state_flags
            (239, "02"),                                  // timeout
            (242, "0007 0008"),                           // qid, pqid
            (250, "ffffffff"),                            // rtableid
            (256, "0578"),                                // max_mss
        ],
    )
}

#[test]
fn state_1400_matches_freebsd_layout_byte_for_byte() {
    let s = sample_state();
    let mut b = vec![0u8; STATE_LEN];
    s.emit(&mut b);
    assert_eq!(b, sample_state_bytes());
    assert_eq!(StateRec::parse(&b), s);
    assert_eq!(STATE_LEN, 277);
}

#[test]
fn header_and_small_records_match_their_layouts() {
    let mut h = [0u8; HEADER_LEN];
    Header { version: 5, len: 0x0123, cksum: [0xab; 16] }.emit(&mut h);
    assert_eq!(h.to_vec(), fixture(20, &[(0, "05 00 0123"), (4, &"ab".repeat(16))]));
    assert_eq!(HEADER_LEN, 20);

    let mut b = [0u8; 4];
    Subheader { action: act::UPD_C, count: 300 }.emit(&mut b);
    assert_eq!(b.to_vec(), hex("04 00 012c"));

    let id = StateId { id: 0xaabb_ccdd_eeff_0011, creatorid: 0x0102_0304 };
    let mut b = [0u8; ID_LEN];
    id.emit(&mut b);
    assert_eq!(b.to_vec(), hex("aabbccddeeff0011 01020304"));
    assert_eq!(StateId::parse(&b), id);

    let clr = Clr { ifname: ifname("all"), creatorid: 9 };
    let mut b = [0u8; CLR_LEN];
    clr.emit(&mut b);
    assert_eq!(b.to_vec(), fixture(20, &[(0, "616c6c"), (16, "00000009")]));
    assert_eq!(Clr::parse(&b), clr);

    let bus = Bus { creatorid: 0x11223344, endtime: 12, status: BUS_END };
    let mut b = [0u8; BUS_LEN];
    bus.emit(&mut b);
    assert_eq!(b.to_vec(), hex("11223344 0000000c 02 000000"));
    assert_eq!(Bus::parse(&b), bus);

    let s = sample_state();
    let u = UpdC { id: s.id, src: s.src, dst: s.dst, creatorid: s.creatorid, expire: 30, timeout: 2 };
    let mut b = vec![0u8; UPD_C_LEN];
    u.emit(&mut b);
    let st = sample_state_bytes();
    let mut want = fixture(UPD_C_LEN, &[(0, "0102030405060708"), (72, "deadbeef 0000001e 02")]);
    want[8..72].copy_from_slice(&st[96..160]); // the two peers, as in the state record
    assert_eq!(b, want);
    assert_eq!(UpdC::parse(&b), u);
    assert_eq!(UPD_C_LEN, 84);
}

#[test]
fn handler_table_lengths_are_freebsds() {
    let lens: Vec<usize> = HANDLERS.iter().map(|h| h.len).collect();
    assert_eq!(lens, [20, 242, 12, 242, 84, 12, 277, 12, 0, 0, 12, 0, 0, 277, 277]);
    assert_eq!(act::NAMES.len(), act::MAX as usize);
}

#[test]
fn a_frame_groups_records_by_action_and_ends_with_eof() {
    let mut fb = FrameBuilder::new(1480, [7; 16], None);
    let s = sample_state();
    let ids = [StateId { id: 1, creatorid: 2 }, StateId { id: 3, creatorid: 2 }];
    assert!(fb.push(&Msg::Insert(s)));
    assert!(fb.push(&Msg::DeleteC(ids[0])));
    assert!(fb.push(&Msg::DeleteC(ids[1])));
    let f = fb.finish().unwrap();
    assert_eq!(f.len(), 20 + 4 + 277 + 4 + 24 + 4);
    assert_eq!(&f[..4], &hex("05 00 014d")); // version 5, length 333
    assert_eq!(&f[20..24], &hex("0d 00 0001")); // INS (1400), one record
    assert_eq!(&f[301..305], &hex("07 00 0002")); // DEL_C, two records
    assert_eq!(&f[329..333], &hex("0c 00 0001")); // EOF
    let mut got = Vec::new();
    let info = frame::parse(&f, None, |m| got.push(m)).unwrap();
    assert_eq!(got, vec![Msg::Insert(s), Msg::DeleteC(ids[0]), Msg::DeleteC(ids[1])]);
    assert_eq!(info.header.unwrap().cksum, [7; 16]);
    assert!(fb.finish().is_none());
}

#[test]
fn a_full_frame_refuses_more_and_respects_the_size() {
    let mut fb = FrameBuilder::new(1480, [0; 16], None);
    let s = sample_state();
    let mut n = 0;
    while fb.push(&Msg::Update(s)) {
        n += 1;
    }
    assert_eq!(n, fb.capacity(act::UPD));
    assert_eq!(n, 5); // (1480 - 20 - 4 - 4) / 277
    assert!(fb.finish().unwrap().len() <= 1480);
}

#[test]
fn bad_frames_are_refused_whole() {
    let mut fb = FrameBuilder::new(1480, [0; 16], None);
    fb.push(&Msg::DeleteC(StateId { id: 1, creatorid: 2 }));
    let good = fb.finish().unwrap();
    let none = |_| panic!("nothing of a bad frame is applied");
    assert_eq!(frame::parse(&good[..10], None, none), Err(Bad::Short));
    let mut v = good.clone();
    v[0] = 4;
    assert_eq!(frame::parse(&v, None, none), Err(Bad::Version(4)));
    let mut v = good.clone();
    v[3] += 1; // header claims a byte more than the frame has
    assert_eq!(frame::parse(&v, None, none), Err(Bad::Len));
    let mut v = good.clone();
    v[23] = 9; // nine records announced, one present
    assert_eq!(frame::parse(&v, None, none), Err(Bad::Len));
    let mut v = good.clone();
    v[20] = 99;
    assert_eq!(frame::parse(&v, None, none), Err(Bad::Action(99)));
    let mut v = good.clone();
    v[20] = act::TDB; // no length to skip by
    assert_eq!(frame::parse(&v, None, none), Err(Bad::Action(act::TDB)));
    // A FreeBSD frame has no EOF section: the header's length ends it.
    let mut v = good[..good.len() - 4].to_vec();
    let l = v.len() as u16;
    v[2..4].copy_from_slice(&l.to_be_bytes());
    let mut n = 0;
    frame::parse(&v, None, |_| n += 1).unwrap();
    assert_eq!(n, 1);
}

// ---- two firewalls ----------------------------------------------------------------------

struct Node {
    ep: Endpoint,
    rep: Replica,
    t4: StateTable<Key4>,
    t6: StateTable<Key6>,
}

fn table<K: xpf_state::Key>() -> StateTable<K> {
    let mut t = StateTable::new(TConfig {
        limit: 10_000,
        rows: None,
        seed: Seed::fixed(1),
        events: 100_000,
        now: 1,
        prefault: false,
        grow_from: None,
    })
    .unwrap();
    t.sync_max = crate::replica::MAX_UPDATES;
    t
}

fn cfg(creator: u32, key: Option<&[u8]>) -> Config {
    let mut c = Config::new(creator);
    c.key = key.map(|k| Key::new(k).unwrap());
    c.epoch = 1000;
    c.retry_ms = 2000;
    c
}

impl Node {
    fn new(c: Config) -> Node {
        Node { rep: Replica::new(&c, 0), ep: Endpoint::new(c), t4: table(), t6: table() }
    }
    /// Frames this node sends at `ms`: bulk START, the states, END, in that order, as xpfd
    /// does (END only after the workers have sent).
    fn transmit(&mut self, now: u32, ms: u64) -> Vec<Vec<u8>> {
        self.ep.poll(ms);
        if self.ep.bulk_wanted {
            self.rep.bulk_start();
            self.ep.bulk_started(ms);
        }
        let mut v = self.ep.transmit();
        let mut done = false;
        let mut t = Tables { t4: &mut self.t4, t6: &mut self.t6 };
        if self.rep.bulk_running() {
            done = self.rep.bulk_step(&mut t, now, 64, &FloatingOnly);
        }
        self.rep.poll(&mut t, now, ms, &FloatingOnly);
        v.append(&mut self.rep.ready);
        if done {
            self.ep.bulk_done(ms, self.rep.bulk_sent);
            v.append(&mut self.ep.transmit());
        }
        v
    }
    /// Frames with every queued event, now.
    fn push(&mut self, now: u32) -> Vec<Vec<u8>> {
        let mut t = Tables { t4: &mut self.t4, t6: &mut self.t6 };
        self.rep.drain(&mut t, now, &FloatingOnly);
        self.rep.flush();
        std::mem::take(&mut self.rep.ready)
    }
    fn receive(&mut self, now: u32, ms: u64, f: &[u8]) -> Result<(), Bad> {
        let mut msgs = Vec::new();
        self.ep.receive(ms, f, TTL, &mut msgs)?;
        let mut t = Tables { t4: &mut self.t4, t6: &mut self.t6 };
        for m in &msgs {
            self.rep.apply(&mut t, m, now, &FloatingOnly);
        }
        Ok(())
    }
}

/// A deterministic link: drops one frame in `loss`, swaps neighbours one time in `reorder`.
struct Link {
    rng: u64,
    loss: u64,
    reorder: u64,
    dropped: u64,
}

impl Link {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
    fn carry(&mut self, mut frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        if self.reorder > 0 {
            for i in 1..frames.len() {
                if self.next().is_multiple_of(self.reorder) {
                    frames.swap(i - 1, i);
                }
            }
        }
        frames
            .into_iter()
            .filter(|_| {
                let keep = self.loss == 0 || !self.next().is_multiple_of(self.loss);
                self.dropped += !keep as u64;
                keep
            })
            .collect()
    }
}

fn tcp_state(i: u32) -> NewState<Key4> {
    let key = Key4 {
        addr: [[10, 0, 1, (i % 250) as u8 + 1], [10, 0, 2, 1]],
        port: [10_000 + i as u16, 80],
        proto: 6,
        _pad: 0,
        kif: 0,
    };
    let p = Peer { seqlo: i * 1000, seqhi: i * 1000 + 65535, max_win: 65535, mss: 1460, ..Default::default() };
    xpf_state::fixtures::established_tcp(key, [p, Peer { seqlo: i * 7, seqhi: i * 7 + 65535, ..p }])
}

fn add<K: xpf_state::Key>(t: &mut StateTable<K>, s: NewState<K>, now: u32) -> u32 {
    let h = t.hash(&s.key);
    t.insert(h, s, now).unwrap()
}

/// Nodes a (creator 0xa) and b (0xb), a holding TCP states `states`.
fn pair(states: std::ops::Range<u32>) -> (Node, Node) {
    let mut a = Node::new(cfg(0xa, None));
    for i in states {
        add(&mut a.t4, tcp_state(i), 1);
    }
    (a, Node::new(cfg(0xb, None)))
}

/// Runs both nodes for `rounds` rounds of 100 ms, frames crossing the links.
fn run(a: &mut Node, b: &mut Node, ab: &mut Link, ba: &mut Link, t0: &mut u64, rounds: u32) {
    for _ in 0..rounds {
        *t0 += 100;
        let now = (*t0 / 1000) as u32 + 1;
        for f in ab.carry(a.transmit(now, *t0)) {
            let _ = b.receive(now, *t0, &f);
        }
        for f in ba.carry(b.transmit(now, *t0)) {
            let _ = a.receive(now, *t0, &f);
        }
    }
}

/// Every state of `a` is in `b` with the same key, peer states and sequence windows.
fn same_tables(a: &Node, b: &Node) -> usize {
    let mut n = 0;
    for (id, s) in a.t4.iter() {
        let h = b.t4.hash(&s.key);
        let Some(r) = b.t4.find(&s.key, h) else { panic!("state {:?} missing on the standby", s.key) };
        let r = r & xpf_state::table::ID_MASK;
        let o = b.t4.state(r);
        assert_eq!(o.peer_state, s.peer_state);
        assert_eq!(
            b.t4.peers(r).map(|p| (p[0].seqlo, p[0].seqhi, p[1].seqlo)),
            a.t4.peers(id).map(|p| (p[0].seqlo, p[0].seqhi, p[1].seqlo))
        );
        n += 1;
    }
    assert_eq!(a.t4.len(), b.t4.len());
    n
}

const SCRUB: xpf_state::Scrub = xpf_state::Scrub {
    no_df: true,
    random_id: true,
    min_ttl: 64,
    set_tos: Some(0x10),
    max_mss: 1300,
    id: 0,
    tcp_clean: false,
};

#[test]
fn standby_gets_every_state_by_bulk_then_follows_updates_over_a_lossy_reordering_link() {
    let (mut a, mut b) = pair(0..500);
    let k6 = Key6 { addr: [[0x20; 16], [0x21; 16]], port: [1, 53], proto: 17, _pad: 0, kif: 0 };
    let u6 = NewState {
        key: k6,
        stack: None,
        dir: Dir::Out,
        rule: 2,
        timeout: Timeout::UdpMultiple,
        src_state: 2,
        dst_state: 2,
        tcp: None,
        nosync: false,
        allow_opts: false,
        sloppy: false,
        tag: 0,
        scrub: SCRUB.pack(),
        rate: 0,
        pflow: false,
        log: 0,
        queue: 0,
        route: 0,
        held: 0,
    };
    add(&mut a.t6, u6, 1);
    // The inserts go out as they happen; the standby starts later and asks for a bulk.
    let (mut ab, mut ba) =
        (Link { rng: 7, loss: 0, reorder: 0, dropped: 0 }, Link { rng: 9, loss: 0, reorder: 0, dropped: 0 });
    let mut t = 0;
    let _ = a.transmit(1, 0); // the peer is not listening yet
    b.ep.request_bulk(0);
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 30);
    assert!(matches!(b.ep.bulk_in, BulkIn::Done { states: 501, .. }), "{:?}", b.ep.bulk_in);
    assert_eq!(same_tables(&a, &b), 500);
    assert_eq!(b.t6.len(), 1);
    // The scrub actions came with the state (pfsync's state_flags, min_ttl, set_tos, max_mss).
    let (id6, _) = b.t6.iter().next().unwrap();
    assert_eq!(b.t6.actions.get(id6).map(|x| xpf_state::Scrub::unpack(x.scrub)), Some(SCRUB));

    // Traffic moves the windows; one frame in 5 is lost, one pair in 4 swapped.
    let (mut ab, mut ba) =
        (Link { rng: 11, loss: 5, reorder: 4, dropped: 0 }, Link { rng: 13, loss: 5, reorder: 4, dropped: 0 });
    for round in 1..=20u32 {
        let now = (t / 1000) as u32 + 1;
        for id in 0..500 {
            if id % 3 == round % 3 {
                let p = a.t4.peers_mut(id).unwrap();
                p[0].seqlo = p[0].seqlo.wrapping_add(1448 * round);
                p[0].seqhi = p[0].seqhi.wrapping_add(1448 * round);
                a.t4.touch(id, Dir::In, 1500, now);
                a.t4.queue_update(id); // what the engine does for a TCP state due
            }
        }
        run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 12);
    }
    assert!(ab.dropped > 0);
    // Then quiet: the last touches cover every state once more over a clean link.
    for id in 0..500 {
        a.t4.touch(id, Dir::In, 100, (t / 1000) as u32 + 1);
        a.t4.queue_update(id);
    }
    let (mut ab, mut ba) =
        (Link { rng: 1, loss: 0, reorder: 0, dropped: 0 }, Link { rng: 2, loss: 0, reorder: 0, dropped: 0 });
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 15);
    assert_eq!(same_tables(&a, &b), 500);

    // Deletes follow, and the standby does not echo them back.
    for id in 0..100 {
        a.t4.remove(id);
    }
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 15);
    assert_eq!(b.t4.len(), 400);
    assert_eq!(a.t4.len(), 400);
    assert_eq!(same_tables(&a, &b), 400);
    assert_eq!(b.rep.stats.deleted, 100);
}

#[test]
fn lost_inserts_are_recovered_by_update_requests() {
    let (mut a, mut b) = pair(0..50);
    let _ = a.push(1); // every insert lost: the standby was not there
    assert_eq!(b.t4.len(), 0);
    for id in 0..50 {
        a.t4.queue_update(id);
    }
    let (mut ab, mut ba) =
        (Link { rng: 3, loss: 0, reorder: 0, dropped: 0 }, Link { rng: 4, loss: 0, reorder: 0, dropped: 0 });
    let mut t = 1500;
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 30);
    assert_eq!(b.ep.stats.bad(), 0, "{:?}", b.ep.stats);
    assert_eq!(b.rep.stats.unknown, 50, "{:?} {:?}", b.rep.stats, b.ep.stats);
    assert_eq!(a.rep.stats.requests, 50);
    assert_eq!(same_tables(&a, &b), 50);
}

#[test]
fn a_restarted_standby_asks_again_and_gets_everything() {
    let mut a = Node::new(cfg(0xa, Some(b"a shared key of 32 bytes, or so")));
    let mut b = Node::new(cfg(0xb, Some(b"a shared key of 32 bytes, or so")));
    for i in 0..200 {
        add(&mut a.t4, tcp_state(i), 1);
    }
    let (mut ab, mut ba) =
        (Link { rng: 5, loss: 0, reorder: 0, dropped: 0 }, Link { rng: 6, loss: 0, reorder: 0, dropped: 0 });
    let mut t = 0;
    b.ep.request_bulk(t);
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 20);
    assert_eq!(same_tables(&a, &b), 200);
    // The standby restarts (empty tables, a later epoch) while the request is lost twice.
    let mut c = cfg(0xb, Some(b"a shared key of 32 bytes, or so"));
    c.epoch = 1001;
    let mut b = Node::new(c);
    b.ep.request_bulk(t);
    let mut lossy = Link { rng: 8, loss: 1, reorder: 0, dropped: 0 }; // drops everything
    run(&mut a, &mut b, &mut ab, &mut lossy, &mut t, 45);
    assert!(matches!(b.ep.bulk_in, BulkIn::Requested { tries: 3, .. }), "{:?}", b.ep.bulk_in);
    run(&mut a, &mut b, &mut ab, &mut ba, &mut t, 40);
    assert!(matches!(b.ep.bulk_in, BulkIn::Done { states: 200, .. }), "{:?}", b.ep.bulk_in);
    assert_eq!(same_tables(&a, &b), 200);
    assert_eq!(a.ep.stats.bad(), 0);
}

#[test]
fn forged_altered_and_replayed_frames_are_dropped_and_counted() {
    let key = b"a shared key of 32 bytes, or so";
    let mut a = Node::new(cfg(0xa, Some(key)));
    let mut b = Node::new(cfg(0xb, Some(key)));
    add(&mut a.t4, tcp_state(1), 1);
    let f = a.push(1).pop().unwrap();
    // Altered: one byte of the state.
    let mut g = f.clone();
    g[100] ^= 0x40;
    assert!(matches!(b.receive(1, 1000, &g), Err(Bad::Auth(crate::auth::AuthError::Mac))));
    // Forged: a frame from a sender without the key.
    let mut m = Node::new(cfg(0xa, None));
    add(&mut m.t4, tcp_state(2), 1);
    let forged = m.push(1).pop().unwrap();
    assert!(matches!(b.receive(1, 1000, &forged), Err(Bad::Auth(crate::auth::AuthError::Missing))));
    assert_eq!(b.t4.len(), 0);
    // The real one passes once.
    b.receive(1, 1000, &f).unwrap();
    assert!(matches!(b.receive(1, 1000, &f), Err(Bad::Auth(crate::auth::AuthError::Replay))));
    assert_eq!(b.t4.len(), 1);
    assert_eq!((b.ep.stats.badauth, b.ep.stats.replayed), (2, 1));
    // A frame from beyond the link.
    let mut msgs = Vec::new();
    assert_eq!(b.ep.receive(1000, &f, 64, &mut msgs), Err(Bad::Ttl));
    assert_eq!(b.ep.stats.badttl, 1);
}

#[test]
fn with_the_key_off_frames_are_exactly_pfsync() {
    let mut a = Node::new(cfg(0xa, None));
    add(&mut a.t4, tcp_state(1), 1);
    let f = a.push(1).pop().unwrap();
    let h = Header::parse(&f).unwrap();
    assert_eq!(h.len as usize, f.len()); // nothing past the pfsync frame
    assert_eq!(f.len(), 20 + 4 + STATE_LEN + 4);
}

#[test]
fn a_busy_tcp_state_is_pushed_after_maxupdates() {
    let mut a = Node::new(cfg(0xa, None));
    let id = add(&mut a.t4, tcp_state(1), 1);
    assert_eq!(a.transmit(1, 0).len(), 0);
    a.t4.sync_push = true; // what the engine sets on the 128th segment (engine tests cover that)
    assert_eq!(a.transmit(1, 10).len(), 1);
    a.t4.queue_update(id);
    assert_eq!(a.transmit(1, 20).len(), 0); // waits for its second
    a.t4.queue_update(id); // collapsed
    assert_eq!(a.transmit(1, 1030).len(), 1);
}

#[test]
fn a_stale_update_is_answered_with_the_newer_state() {
    let mut a = Node::new(cfg(0xa, None));
    let mut b = Node::new(cfg(0xb, None));
    let id = add(&mut a.t4, tcp_state(5), 1);
    for f in a.push(1) {
        b.receive(1, 1000, &f).unwrap();
    }
    // The standby is ahead (it saw newer packets): an old compressed update is stale.
    let r = b.t4.find(&a.t4.state(id).key, b.t4.hash(&a.t4.state(id).key)).unwrap();
    b.t4.peers_mut(r).unwrap()[0].seqlo += 10_000;
    a.t4.queue_update(id);
    let frames = a.push(1);
    for f in frames {
        b.receive(1, 2100, &f).unwrap();
    }
    assert_eq!(b.rep.stats.stale, 1);
    for f in b.transmit(1, 2100) {
        a.receive(1, 2100, &f).unwrap();
    }
    assert_eq!(a.t4.peers(id).unwrap()[0].seqlo, 5000 + 10_000);
}

#[test]
fn defer_mode_inserts_ask_for_an_ack_and_the_peer_answers_once_it_holds_the_state() {
    let mut ca = cfg(0xa, Some(b"0123456789abcdef0123"));
    ca.defer = true;
    let mut a = Node::new(ca);
    let mut b = Node::new(cfg(0xb, Some(b"0123456789abcdef0123")));
    let id = add(&mut a.t4, tcp_state(1), 1);
    let frames = a.push(1);
    let mut msgs = Vec::new();
    crate::frame::parse(&frames[0], None, |m| msgs.push(m)).unwrap();
    match &msgs[0] {
        Msg::Insert(r) => assert_ne!(r.state_flags & crate::wire::PFSTATE_ACK, 0, "defer asks for an ack"),
        m => panic!("{m:?}"),
    }
    for f in frames {
        b.receive(1, 10, &f).unwrap();
    }
    assert_eq!((b.rep.stats.inserted, b.rep.stats.acks_out), (1, 1));
    // The ack goes out at once (answers do not wait for the second), names our state...
    let back = b.transmit(1, 10);
    assert_eq!(back.len(), 1);
    for f in back {
        a.receive(1, 10, &f).unwrap();
    }
    assert_eq!(a.rep.acked, vec![id]);
    assert_eq!(a.rep.stats.acks_in, 1);
    // ... and an update (not an insert) or a replayed insert for a state already held asks
    // nothing more; without defer, inserts carry no ack request at all.
    a.t4.queue_update(id);
    for f in a.push(1) {
        b.receive(1, 20, &f).unwrap();
    }
    assert_eq!(b.rep.stats.acks_out, 1);
    let mut c = Node::new(cfg(0xc, None));
    add(&mut c.t4, tcp_state(2), 1);
    let mut d = Node::new(cfg(0xd, None));
    for f in c.push(1) {
        d.receive(1, 10, &f).unwrap();
    }
    assert_eq!((d.rep.stats.inserted, d.rep.stats.acks_out), (1, 0));
}

/// `-F states` with sync: one clear instead of a delete per state, as pf. The peer drops the
/// states the flushing box created and keeps its own; states made after the flush in the
/// freed slots are the box's own again and reach the peer.
#[test]
fn the_peers_states_a_worker_removes_itself_are_noted_for_the_sync_thread() {
    let (mut a, mut b) = pair(0..10);
    b.rep.note_gone = true;
    for f in a.push(1) {
        b.receive(1, 1000, &f).unwrap();
    }
    let own = add(&mut b.t4, tcp_state(50), 1);
    let _ = b.push(1);
    let theirs: Vec<u32> = b.t4.iter().map(|(id, _)| id).filter(|&id| id != own).take(3).collect();
    for &id in theirs.iter().chain([own].iter()) {
        b.t4.remove(id);
    }
    assert!(b.rep.gone.is_empty(), "noted when the deletes go out");
    let _ = b.push(2);
    assert_eq!(b.rep.gone.len(), 3, "the peer's three, not b's own");
    assert!(b.rep.gone.iter().all(|sid| sid.creatorid == a.rep.creatorid));
    assert_eq!(b.rep.imported(), 7);
}

#[test]
fn a_peers_clear_of_one_interface_notes_the_states_it_took() {
    /// Every state's interface (index 0) is "em0".
    struct Em0;
    impl crate::replica::Ifnames for Em0 {
        fn name(&self, _: u16) -> [u8; IFNAMSIZ] {
            ifname("em0")
        }
        fn index(&self, name: &[u8; IFNAMSIZ]) -> Option<u16> {
            matches!(ifname_str(name), Some("em0" | "all")).then_some(0)
        }
    }
    let (mut a, mut b) = pair(0..10);
    b.rep.note_gone = true;
    for f in a.push(1) {
        b.receive(1, 1000, &f).unwrap();
    }
    add(&mut b.t4, tcp_state(50), 1);
    let _ = b.push(1);
    let clr = Msg::Clear(Clr { ifname: ifname("em0"), creatorid: a.rep.creatorid });
    let mut t = Tables { t4: &mut b.t4, t6: &mut b.t6 };
    b.rep.apply(&mut t, &clr, 2, &Em0);
    assert_eq!((b.t4.len(), b.rep.imported(), b.rep.stats.cleared), (1, 0, 10));
    // The sync thread placed them by id: it is told, as for the states a worker removes.
    assert_eq!(b.rep.gone.len(), 10);
    assert!(b.rep.gone.iter().all(|sid| sid.creatorid == a.rep.creatorid));
}

#[test]
fn a_standby_holding_only_the_peers_states_empties_its_tables_at_its_clear() {
    let (mut a, mut b) = pair(0..40);
    for f in a.push(1) {
        b.receive(1, 1000, &f).unwrap();
    }
    assert_eq!(b.t4.len(), 40);
    let _ = a.push(1);
    a.t4.remove_all(false);
    a.rep.cleared();
    for f in std::mem::take(&mut a.rep.ready) {
        b.receive(2, 2000, &f).unwrap();
    }
    assert_eq!((b.t4.len(), b.rep.stats.cleared, b.rep.imported()), (0, 40, 0));
    assert_eq!(b.push(2).len(), 0, "nothing told back to the peer");
    // The emptied index takes the primary's next states, found by their keys.
    for i in 300..310 {
        add(&mut a.t4, tcp_state(i), 3);
    }
    for f in a.push(3) {
        b.receive(3, 3000, &f).unwrap();
    }
    assert_eq!(same_tables(&a, &b), 10);
    assert_eq!(b.rep.stats.inserted, 50);
}

#[test]
fn flushing_states_clears_the_peers_copies_with_one_message() {
    let (mut a, mut b) = pair(0..30);
    for i in 100..120 {
        add(&mut b.t4, tcp_state(i), 1);
    }
    for f in a.push(1) {
        b.receive(1, 1000, &f).unwrap();
    }
    for f in b.push(1) {
        a.receive(1, 1000, &f).unwrap();
    }
    assert_eq!((a.t4.len(), b.t4.len()), (50, 50));
    let _ = a.push(1);
    assert_eq!(a.t4.remove_all(false) + a.t6.remove_all(false), 50);
    a.rep.cleared();
    let frames = std::mem::take(&mut a.rep.ready);
    assert_eq!(frames.len(), 1, "one frame, the clear");
    assert_eq!(a.push(2).len(), 0, "no delete queued");
    for f in &frames {
        b.receive(2, 2000, f).unwrap();
    }
    assert_eq!((a.t4.len(), b.t4.len()), (0, 20));
    assert_eq!(b.rep.stats.cleared, 30);
    for (_, s) in b.t4.iter() {
        assert!(s.key.port[0] >= 10_100, "b kept {:?}, not its own", s.key);
    }
    a.t4.maintain(400, 1 << 20);
    for i in 200..210 {
        add(&mut a.t4, tcp_state(i), 400);
    }
    for f in a.push(400) {
        b.receive(400, 400_000, &f).unwrap();
    }
    assert_eq!(b.t4.len(), 30);
    assert_eq!(b.rep.stats.inserted, 40);
}
