//! What a `block return` rule sends back (pf_return): for TCP a RST built as pf_send_tcp builds
//! it (from the blocked segment's destination to its source, SEQ = its ACK, ACK = its SEQ +
//! its length, counting SYN and FIN), otherwise an ICMP or ICMPv6 destination unreachable
//! quoting the packet, as icmp_error does. The frame is whole, with the blocked frame's link
//! header turned around, for the caller to send out of the interface the packet came in on.
//!
//! As in pf: no answer to a RST, to an ICMP error, or to a TCP segment whose checksum is
//! wrong (an answer must not be provoked by a forged or damaged segment); ICMP errors quote
//! at most 548 bytes (576 in all, RFC 1812 4.3.2.3) and ICMPv6 errors at most 1,232 (1,280 in
//! all, RFC 4443 2.4). The error's source is the blocked packet's destination.

use crate::policy::Return;
use xpf_wire::checksum::{fold, pseudo_v4, pseudo_v6, sum};
use xpf_wire::pdesc::{pdf, AF_INET, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP};
use xpf_wire::{icmp, ipv4, ipv6, tcp, PDesc};

const ICMP_UNREACH: u8 = 3;
const ICMP6_DST_UNREACH: u8 = 1;
const QUOTE4: usize = 576 - 20 - 8;
const QUOTE6: usize = 1280 - 40 - 8;
/// pf's TTL and hop limit for what it sends (ip_defttl, ip6_defhlim).
const DEFAULT_TTL: u8 = 64;

/// ICMP informational types (BSD's ICMP_INFOTYPE): a blocked query may be answered, an error
/// never is.
fn icmp_info(t: u8) -> bool {
    matches!(t, 0 | 8 | 9 | 10 | 13 | 14 | 15 | 16 | 17 | 18)
}

/// Writes into `out` the answer rule return `r` gives the blocked `frame` (descriptor `pd`);
/// false when there is none to give.
pub fn build(frame: &[u8], pd: &PDesc, r: &Return, out: &mut Vec<u8>) -> bool {
    let l3 = pd.l3_off as usize;
    let end = l3 + pd.ip_len as usize;
    if l3 < 14 || frame.len() < end || pd.flags & pdf::NOT_FIRST_FRAG != 0 {
        return false;
    }
    let ttl = if r.ttl != 0 { r.ttl } else { DEFAULT_TTL };
    if pd.proto == IPPROTO_TCP && r.rst && pd.flags & pdf::HAS_PORTS != 0 {
        if pd.tcp_flags & tcp::RST != 0 || !tcp_checksum_ok(frame, pd) {
            return false;
        }
        let mut ack = pd.tcp_seq.wrapping_add(pd.payload_len as u32);
        if pd.tcp_flags & tcp::SYN != 0 {
            ack = ack.wrapping_add(1);
        }
        if pd.tcp_flags & tcp::FIN != 0 {
            ack = ack.wrapping_add(1);
        }
        let seg = Segment { back: true, ttl, seq: pd.tcp_ack, ack, flags: tcp::RST | tcp::ACK, win: 0, mss: None };
        return segment(frame, pd, &seg, out);
    }
    out.clear();
    // The link header turned around (VLAN tags kept).
    out.extend_from_slice(&frame[..l3]);
    out[0..6].copy_from_slice(&frame[6..12]);
    out[6..12].copy_from_slice(&frame[0..6]);
    let quoted = &frame[l3..end];
    if pd.af == AF_INET {
        let Some(code) = r.icmp4 else { return false };
        if pd.proto == IPPROTO_ICMP && !icmp_info(pd.icmp_type) {
            return false;
        }
        let q = &quoted[..quoted.len().min(QUOTE4)];
        let total = 20 + 8 + q.len();
        let ip = out.len();
        out.resize(ip + total, 0);
        ipv4::emit_header(&mut out[ip..], pd.dst.v4_bytes(), pd.src.v4_bytes(), IPPROTO_ICMP, total as u16, ttl, 0);
        icmp::emit_header(&mut out[ip + 20..], ICMP_UNREACH, code, 0);
        out[ip + 28..].copy_from_slice(q);
        let c = !fold(sum(&out[ip + 20..], 0));
        out[ip + 22..ip + 24].copy_from_slice(&c.to_be_bytes());
    } else {
        let Some(code) = r.icmp6 else { return false };
        // Errors and redirects are never answered; other informational messages may be.
        if pd.proto == IPPROTO_ICMPV6 && (pd.icmp_type < 128 || pd.icmp_type == 137) {
            return false;
        }
        let q = &quoted[..quoted.len().min(QUOTE6)];
        let len = 8 + q.len();
        let ip = out.len();
        out.resize(ip + 40 + len, 0);
        ipv6::emit_header(&mut out[ip..], &pd.dst.0, &pd.src.0, IPPROTO_ICMPV6, len as u16, ttl);
        icmp::emit_header(&mut out[ip + 40..], ICMP6_DST_UNREACH, code, 0);
        out[ip + 48..].copy_from_slice(q);
        let c = !fold(sum(&out[ip + 40..], pseudo_v6(&pd.dst.0, &pd.src.0, IPPROTO_ICMPV6, len as u32)));
        out[ip + 42..ip + 44].copy_from_slice(&c.to_be_bytes());
    }
    true
}

/// A TCP segment the filter sends itself (pf_send_tcp): towards the packet's sender
/// (`back`) or on towards its destination, with its addresses and ports.
pub struct Segment {
    pub back: bool,
    pub ttl: u8,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub win: u16,
    /// An MSS option.
    pub mss: Option<u16>,
}

/// Writes into `out` segment `s` for the flow of TCP packet `frame` (descriptor `pd`): the
/// frame's link header (turned around when `back`), an IPv4 or IPv6 header and a TCP header
/// with the checksums.
pub fn segment(frame: &[u8], pd: &PDesc, s: &Segment, out: &mut Vec<u8>) -> bool {
    let l3 = pd.l3_off as usize;
    if l3 < 14 || frame.len() < l3 || pd.proto != IPPROTO_TCP {
        return false;
    }
    out.clear();
    out.extend_from_slice(&frame[..l3]);
    let (src, dst, sport, dport) =
        if s.back { (pd.dst, pd.src, pd.dport, pd.sport) } else { (pd.src, pd.dst, pd.sport, pd.dport) };
    if s.back {
        out[0..6].copy_from_slice(&frame[6..12]);
        out[6..12].copy_from_slice(&frame[0..6]);
    }
    let tlen = if s.mss.is_some() { 24 } else { 20 };
    let ip = out.len();
    let t = if pd.af == AF_INET {
        out.resize(ip + 20 + tlen, 0);
        ipv4::emit_header(&mut out[ip..], src.v4_bytes(), dst.v4_bytes(), IPPROTO_TCP, (20 + tlen) as u16, s.ttl, 0);
        ip + 20
    } else {
        out.resize(ip + 40 + tlen, 0);
        ipv6::emit_header(&mut out[ip..], &src.0, &dst.0, IPPROTO_TCP, tlen as u16, s.ttl);
        ip + 40
    };
    tcp::emit_header(&mut out[t..], sport, dport, s.seq, s.ack, s.flags, s.win);
    if let Some(m) = s.mss {
        out[t + 12] = 6 << 4;
        out[t + 20..t + 24].copy_from_slice(&[2, 4, (m >> 8) as u8, m as u8]);
    }
    let ph = if pd.af == AF_INET {
        pseudo_v4(src.v4_bytes(), dst.v4_bytes(), IPPROTO_TCP, tlen as u16)
    } else {
        pseudo_v6(&src.0, &dst.0, IPPROTO_TCP, tlen as u32)
    };
    let c = !fold(sum(&out[t..], ph));
    out[t + 16..t + 18].copy_from_slice(&c.to_be_bytes());
    true
}

/// The MSS option of TCP segment `frame`, if it has one.
pub fn tcp_mss(frame: &[u8], pd: &PDesc) -> Option<u16> {
    let t = pd.l4_off as usize;
    let hl = (*frame.get(t + 12)? >> 4) as usize * 4;
    tcp::Options::parse(frame.get(t + 20..t + hl)?).ok()?.mss
}

/// Whether the blocked segment's TCP checksum verifies (pf checks before it answers). A
/// checksum its sender left to offload (veth, tun/tap: the field holds the pseudo-header sum)
/// cannot be checked and is taken as good, as the kernel takes its own such segments.
fn tcp_checksum_ok(frame: &[u8], pd: &PDesc) -> bool {
    if xpf_wire::offload::partial(frame).is_some() {
        return true;
    }
    let (l4, end) = (pd.l4_off as usize, pd.l3_off as usize + pd.ip_len as usize);
    let Some(seg) = frame.get(l4..end) else { return false };
    let ph = if pd.af == AF_INET {
        pseudo_v4(pd.src.v4_bytes(), pd.dst.v4_bytes(), IPPROTO_TCP, seg.len() as u16)
    } else {
        pseudo_v6(&pd.src.0, &pd.dst.0, IPPROTO_TCP, seg.len() as u32)
    };
    fold(sum(seg, ph)) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpf_wire::parse_ether;

    fn syn() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xfe]); // the firewall
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x01]); // the client
        f[12] = 8;
        ipv4::emit_header(&mut f[14..], [10, 0, 1, 2], [10, 0, 2, 2], IPPROTO_TCP, 40, 64, 7);
        tcp::emit_header(&mut f[34..], 40000, 23, 1000, 0, tcp::SYN, 64240);
        let c = !fold(sum(&f[34..], pseudo_v4([10, 0, 1, 2], [10, 0, 2, 2], IPPROTO_TCP, 20)));
        f[50..52].copy_from_slice(&c.to_be_bytes());
        f
    }

    fn rst() -> Return {
        Return { rst: true, ttl: 0, icmp4: Some(3), icmp6: Some(4) }
    }

    #[test]
    fn a_blocked_syn_gets_pfs_rst() {
        let f = syn();
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        let mut out = Vec::new();
        assert!(build(&f, &pd, &rst(), &mut out));
        let mut r = PDesc::default();
        parse_ether(&out, &mut r).unwrap();
        assert_eq!(&out[0..12], &[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0xfe], "link addresses turned around");
        assert_eq!((r.src.v4_bytes(), r.dst.v4_bytes(), r.sport, r.dport), ([10, 0, 2, 2], [10, 0, 1, 2], 23, 40000));
        assert_eq!((r.tcp_flags, r.tcp_seq, r.tcp_ack, r.ttl), (tcp::RST | tcp::ACK, 0, 1001, 64));
        assert!(tcp_checksum_ok(&out, &r));
        assert_eq!(xpf_wire::checksum::checksum(&out[14..34]), 0, "IP header checksum");
    }

    #[test]
    fn no_answer_to_a_rst_or_a_damaged_segment() {
        let mut f = syn();
        f[47] = tcp::RST;
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert!(!build(&f, &pd, &rst(), &mut Vec::new()), "RST");
        let mut f = syn();
        f[53] ^= 1;
        parse_ether(&f, &mut pd).unwrap();
        assert!(!build(&f, &pd, &rst(), &mut Vec::new()), "bad checksum");
        // A checksum left to offload by the sender is answered.
        let mut g = syn();
        xpf_wire::offload::prepare(&mut g);
        let mut pg = PDesc::default();
        parse_ether(&g, &mut pg).unwrap();
        assert!(build(&g, &pg, &rst(), &mut Vec::new()), "left to offload");
    }

    #[test]
    fn udp_gets_port_unreachable_quoting_it_and_return_rst_alone_gives_it_nothing() {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12] = 8;
        ipv4::emit_header(&mut f[14..], [10, 0, 1, 2], [10, 0, 2, 2], 17, 32, 64, 9);
        xpf_wire::udp::emit_header(&mut f[34..], 5000, 53, 12);
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        let mut out = Vec::new();
        assert!(build(&f, &pd, &rst(), &mut out));
        assert_eq!(out.len(), 14 + 20 + 8 + 32);
        assert_eq!((out[34], out[35]), (3, 3), "destination unreachable, port");
        assert_eq!(&out[42..], &f[14..], "the whole datagram quoted");
        assert_eq!(xpf_wire::checksum::checksum(&out[34..]), 0, "ICMP checksum");
        let only_rst = Return { rst: true, ttl: 0, icmp4: None, icmp6: None };
        assert!(!build(&f, &pd, &only_rst, &mut out));
    }
}
