//! pflog's capture format: pcap files of link type DLT_PFLOG (117), each packet behind
//! OpenBSD's 100-byte `struct pfloghdr` (the layout that carries the translated addresses,
//! which tcpdump and Wireshark both decode by its `length` byte), then the IP packet.
//!
//! Field by field, as OpenBSD's if_pflog.h lays it out (network byte order for numbers):
//! length, af, action, reason (1 byte each), ifname (16), ruleset (16), rulenr, subrulenr,
//! uid, pid, rule_uid, rule_pid (4 each), dir, rewritten, naf, pad (1 each), saddr, daddr (16
//! each, `struct pf_addr`), sport, dport (2 each).

use xpf_wire::Addr;

/// pcap's link type for pflog.
pub const LINKTYPE_PFLOG: u32 = 117;
/// The header's length (what its `length` byte says; a multiple of 4, so no padding follows).
pub const HDRLEN: usize = 100;
/// Bytes of each packet kept after the header (pflogd's default snap length is 160 in all).
pub const SNAPLEN: usize = 160;
/// OpenBSD's address family numbers (what readers of pflog files expect).
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 24;
/// "No rule number in a sub-ruleset" (the rule is in the main ruleset).
const NO_SUBRULE: u32 = u32::MAX;
/// pf's "no user, no process" for packets not the host's own.
const NO_UID: u32 = u32::MAX;
const NO_PID: u32 = 99_999 + 1;

/// What one logged packet's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// [`AF_INET`] or [`AF_INET6`].
    pub af: u8,
    /// pf's PF_PASS (0) or PF_DROP (1).
    pub action: u8,
    /// pf's reason code (PFRES_*).
    pub reason: u8,
    /// The interface the packet was seen on (at most 15 bytes are kept).
    pub ifname: [u8; 16],
    /// The rule's number in the main ruleset; for a rule in an anchor, the number of the main
    /// ruleset's anchor rule that led there.
    pub rulenr: u32,
    /// For a rule in an anchor: its number there (None: a rule of the main ruleset).
    pub subrulenr: Option<u32>,
    /// For a rule in an anchor: the anchor's path (at most 15 bytes kept, as pf's).
    pub ruleset: [u8; 16],
    /// PF_IN (1) or PF_OUT (2).
    pub dir: u8,
    /// The translated packet's addresses and ports, if a translation rewrote it.
    pub rewritten: Option<([Addr; 2], [u16; 2])>,
}

impl Header {
    /// The interface name (or ruleset) field from a name (cut to 15 bytes, NUL-padded).
    pub fn ifname_of(name: &str) -> [u8; 16] {
        let mut b = [0u8; 16];
        let n = name.len().min(15);
        b[..n].copy_from_slice(&name.as_bytes()[..n]);
        b
    }

    /// The header's 100 bytes.
    pub fn bytes(&self) -> [u8; HDRLEN] {
        let mut h = [0u8; HDRLEN];
        h[0] = HDRLEN as u8;
        h[1] = self.af;
        h[2] = self.action;
        h[3] = self.reason;
        h[4..20].copy_from_slice(&self.ifname);
        h[20..36].copy_from_slice(&self.ruleset);
        h[35] = 0;
        h[36..40].copy_from_slice(&self.rulenr.to_be_bytes());
        h[40..44].copy_from_slice(&self.subrulenr.unwrap_or(NO_SUBRULE).to_be_bytes());
        h[44..48].copy_from_slice(&NO_UID.to_be_bytes());
        h[48..52].copy_from_slice(&NO_PID.to_be_bytes());
        h[52..56].copy_from_slice(&NO_UID.to_be_bytes());
        h[56..60].copy_from_slice(&NO_PID.to_be_bytes());
        h[60] = self.dir;
        if let Some((addr, port)) = self.rewritten {
            h[61] = 1;
            h[62] = self.af;
            for (k, a) in addr.iter().enumerate() {
                let at = 64 + 16 * k;
                if self.af == AF_INET {
                    h[at..at + 4].copy_from_slice(&a.v4_bytes());
                } else {
                    h[at..at + 16].copy_from_slice(&a.0);
                }
            }
            h[96..98].copy_from_slice(&port[0].to_be_bytes());
            h[98..100].copy_from_slice(&port[1].to_be_bytes());
        }
        h
    }

    /// Reads a header back (tests, `xpfctl log`'s filter): None if it is not one.
    pub fn parse(b: &[u8]) -> Option<Header> {
        if b.len() < HDRLEN || b[0] as usize != HDRLEN {
            return None;
        }
        let mut ifname = [0u8; 16];
        ifname.copy_from_slice(&b[4..20]);
        let be32 = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
        let rewritten = (b[61] != 0).then(|| {
            let addr = |at: usize| {
                if b[1] == AF_INET {
                    Addr::v4(b[at..at + 4].try_into().unwrap())
                } else {
                    Addr(b[at..at + 16].try_into().unwrap())
                }
            };
            let port = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
            ([addr(64), addr(80)], [port(96), port(98)])
        });
        let mut ruleset = [0u8; 16];
        ruleset.copy_from_slice(&b[20..36]);
        let subrulenr = Some(be32(40)).filter(|&n| n != NO_SUBRULE);
        Some(Header {
            af: b[1],
            action: b[2],
            reason: b[3],
            ifname,
            rulenr: be32(36),
            subrulenr,
            ruleset,
            dir: b[60],
            rewritten,
        })
    }
}

/// A pcap file's header for pflog records (microsecond timestamps, this host's byte order).
pub fn file_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_ne_bytes());
    h[4..6].copy_from_slice(&2u16.to_ne_bytes());
    h[6..8].copy_from_slice(&4u16.to_ne_bytes());
    h[16..20].copy_from_slice(&((HDRLEN + SNAPLEN) as u32).to_ne_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_PFLOG.to_ne_bytes());
    h
}

/// Whether `h` is a pflog file's header this writer may append to.
pub fn is_file_header(h: &[u8]) -> bool {
    h.len() >= 24 && h[..24] == file_header()
}

/// One record: its pcap header, the pflog header, and up to [`SNAPLEN`] bytes of `packet`
/// (the IP packet), at `ts` (seconds, microseconds).
pub fn record(out: &mut Vec<u8>, ts: (u32, u32), hdr: &Header, packet: &[u8]) {
    let kept = packet.len().min(SNAPLEN);
    out.extend_from_slice(&ts.0.to_ne_bytes());
    out.extend_from_slice(&ts.1.to_ne_bytes());
    out.extend_from_slice(&((HDRLEN + kept) as u32).to_ne_bytes());
    out.extend_from_slice(&((HDRLEN + packet.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&hdr.bytes());
    out.extend_from_slice(&packet[..kept]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_through_the_pcap_reader() {
        let hdr = Header {
            af: AF_INET,
            action: 1,
            reason: 0,
            ifname: Header::ifname_of("a-very-long-interface-name"),
            rulenr: 7,
            subrulenr: Some(2),
            ruleset: Header::ifname_of("campus/in/44.0.0"),
            dir: 1,
            rewritten: Some(([Addr::v4([192, 0, 2, 1]), Addr::v4([198, 51, 100, 1])], [50001, 53])),
        };
        let packet = vec![0x45u8; 400];
        let mut f = file_header().to_vec();
        record(&mut f, (1_700_000_000, 5), &hdr, &packet);
        assert!(is_file_header(&f));
        let r = crate::pcap::read(&f).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].linktype, LINKTYPE_PFLOG);
        assert_eq!(r[0].data.len(), HDRLEN + SNAPLEN);
        assert_eq!(r[0].orig_len as usize, HDRLEN + 400);
        let back = Header::parse(r[0].data).unwrap();
        assert_eq!(back, Header { ifname: Header::ifname_of("a-very-long-int"), ..hdr });
        assert_eq!(&back.ifname[..15], b"a-very-long-int");
        assert_eq!(back.ifname[15], 0);
        assert_eq!((back.rulenr, back.subrulenr, &back.ruleset[..15]), (7, Some(2), &b"campus/in/44.0."[..]));
        let main = Header { subrulenr: None, ruleset: [0; 16], ..hdr };
        assert_eq!(Header::parse(&main.bytes()).unwrap().subrulenr, None, "a main rule: no subrule number");
    }
}
