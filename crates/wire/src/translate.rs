//! Address translation's rewrite of a frame (pf's `pf_translate`): new addresses and ports (the
//! ICMP query identifier standing for both ports), every checksum that covers them updated
//! incrementally (RFC 1624), and for an ICMP error the packet it quotes translated as well,
//! with the error's own addresses where they were the quoted packet's (RFC 5508 REQ-4).
//!
//! A transport checksum its sender left to offload holds the pseudo-header sum; it is updated
//! here as if it were complete, which is what [`crate::offload::finish`] and
//! [`crate::offload::prepare`] expect of every rewrite before them.

#[cfg(test)]
use crate::checksum;
use crate::checksum::{update128, update16, update32};
use crate::pdesc::{pdf, Addr, AF_INET, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};
use crate::{parse_ether, PDesc};

/// What a translated packet becomes: its source and destination address and port (for an
/// ICMP query or reply both ports are the identifier); for an ICMP error (`quoted`), those
/// of the packet it quotes. With `at` (see [`Rewrite::prepare`]) the frame is not parsed
/// again: the headers' places and the checksums' changes come with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rewrite {
    pub addr: [Addr; 2],
    pub port: [u16; 2],
    pub quoted: bool,
    pub at: Option<At>,
}

/// Where a whole packet's headers are: taken from the descriptor the filter already has, so
/// that [`apply`] does not parse the frame again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct At {
    l3: u16,
    l4: u16,
    v4: bool,
    proto: u8,
    ports: bool,
    /// The change the new addresses make to the IPv4 header's checksum, and to the transport
    /// checksum (its pseudo-header's addresses and its ports or identifier): sums in memory
    /// order, folded ([`change`]).
    ip_sum: u16,
    l4_sum: u16,
}

impl Rewrite {
    /// Makes this the rewrite of the packet `pd` describes to addresses `addr` and ports
    /// `port` (source first). Written in place, field by field: the per-packet path builds
    /// no rewrite on its stack to copy (a wide copy of one built by narrow stores waits for
    /// them to reach the cache). The checksums' changes are summed here, from the
    /// descriptor's fields (what [`apply`] replaces in the frame the descriptor was parsed
    /// from), so that writing the frame is stores and two checksum updates.
    // PERF: summed here, in the filter's pass, the sums overlap the state table's loads; in
    // apply's pass, which only writes, nothing hid them (bench-results, "The checksums'
    // changes summed where the packet is filtered").
    #[inline(always)]
    pub fn prepare(&mut self, pd: &PDesc, addr: [Addr; 2], port: [u16; 2]) {
        self.addr = addr;
        self.port = port;
        self.quoted = false;
        let v4 = pd.af == AF_INET;
        let ports = pd.flags & pdf::HAS_PORTS != 0 && pd.flags & pdf::NOT_FIRST_FRAG == 0;
        let ip = if v4 {
            change(v4_bytes(&pd.src), v4_bytes(&addr[0])) + change(v4_bytes(&pd.dst), v4_bytes(&addr[1]))
        } else {
            change(&pd.src.0, &addr[0].0) + change(&pd.dst.0, &addr[1].0)
        };
        // ICMP's checksum covers no pseudo-header.
        let mut l4 = if pd.proto == IPPROTO_ICMP { 0 } else { ip };
        if ports {
            if matches!(pd.proto, IPPROTO_ICMP | IPPROTO_ICMPV6) {
                // The identifier (at 4) stands for both ports.
                l4 += u64::from(!pd.sport.to_be()) + u64::from(port[0].to_be());
            } else {
                l4 += u64::from(!ports_word(pd.sport, pd.dport)) + u64::from(ports_word(port[0], port[1]));
            }
        }
        self.at = Some(At {
            l3: pd.l3_off,
            l4: pd.l4_off,
            v4,
            proto: pd.proto,
            ports,
            ip_sum: fold64(ip),
            l4_sum: fold64(l4),
        });
    }
}

/// The ones' complement sum (RFC 1624's `~m + m'`) of replacing the `N` bytes `old` by `new`,
/// taken in 32-bit words in memory order, not folded. A sum of byte-swapped words is the
/// byte-swapped sum (RFC 1071), so a checksum field read in the same order takes it with no
/// swap on either side.
#[inline(always)]
fn change<const N: usize>(old: &[u8; N], new: &[u8; N]) -> u64 {
    let mut s = 0u64;
    for i in (0..N).step_by(4) {
        let o = u32::from_ne_bytes([old[i], old[i + 1], old[i + 2], old[i + 3]]);
        let n = u32::from_ne_bytes([new[i], new[i + 1], new[i + 2], new[i + 3]]);
        s += (!o) as u64 + n as u64;
    }
    s
}

/// Two ports as the header holds them, as one word in memory order.
#[inline(always)]
fn ports_word(a: u16, b: u16) -> u32 {
    ((u32::from(a) << 16) | u32::from(b)).to_be()
}

/// [`change`]'s sum folded to 16 bits (ones' complement: each carry added back).
#[inline(always)]
fn fold64(s: u64) -> u16 {
    let (t, c) = (s as u32).overflowing_add((s >> 32) as u32);
    let t = t as u64 + c as u64; // <= 2^32
    let (u, c) = (t as u16).overflowing_add((t >> 16) as u16);
    u.wrapping_add(c as u16)
}

/// `c` with ones' complement sum `d` of changes added (RFC 1624, eqn. 3); both in the same
/// byte order. One fold: `!c + d` is at most 0x1fffe, whose fold fits 16 bits.
#[inline(always)]
fn add(c: u16, d: u16) -> u16 {
    let (s, carry) = (!c).overflowing_add(d);
    !(s.wrapping_add(carry as u16))
}

/// [`apply`] with the places and sums [`Rewrite::prepare`] took: each field replaced, each
/// checksum given its change. Each header is taken once as a fixed-size array, so that
/// nothing after is checked again.
#[inline(always)]
fn apply_at(f: &mut [u8], rw: &Rewrite, at: &At) -> bool {
    let (l3, l4) = (at.l3 as usize, at.l4 as usize);
    if at.v4 {
        let Some(h) = f.get_mut(l3..l3 + 20) else { return false };
        let h: &mut [u8; 20] = h.try_into().expect("20 bytes");
        h[12..16].copy_from_slice(v4_bytes(&rw.addr[0]));
        h[16..20].copy_from_slice(v4_bytes(&rw.addr[1]));
        let c = u16::from_ne_bytes([h[10], h[11]]);
        h[10..12].copy_from_slice(&add(c, at.ip_sum).to_ne_bytes());
    } else {
        let Some(b) = f.get_mut(l3 + 8..l3 + 40) else { return false };
        b[..16].copy_from_slice(&rw.addr[0].0);
        b[16..].copy_from_slice(&rw.addr[1].0);
    }
    match at.proto {
        IPPROTO_TCP => transport::<18, 16>(f, l4, rw, at, Kind::Ports),
        IPPROTO_UDP => transport::<8, 6>(f, l4, rw, at, Kind::Udp { v4: at.v4 }),
        IPPROTO_ICMPV6 | IPPROTO_ICMP => transport::<6, 2>(f, l4, rw, at, Kind::Id),
        _ => {}
    }
    true
}

/// The bytes of an IPv4 address.
#[inline(always)]
fn v4_bytes(a: &Addr) -> &[u8; 4] {
    a.0[..4].try_into().expect("4 bytes")
}

/// How a transport header takes a translation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Two ports (TCP).
    Ports,
    /// Two ports; a computed zero checksum is sent as all ones, and over IPv4 a zero one is
    /// "none" and stays.
    Udp { v4: bool },
    /// The ICMP query identifier (at 4) stands for both ports.
    Id,
}

/// The transport header's part of [`apply_at`]: its first `N` bytes (through its checksum,
/// at `SUM`) taken whole, or nothing written when the frame is shorter.
#[inline(always)]
fn transport<const N: usize, const SUM: usize>(f: &mut [u8], l4: usize, rw: &Rewrite, at: &At, kind: Kind) {
    let Some(t) = f.get_mut(l4..l4 + N) else { return };
    let t: &mut [u8; N] = t.try_into().expect("N bytes");
    if at.ports {
        if kind == Kind::Id {
            t[4..6].copy_from_slice(&rw.port[0].to_be_bytes());
        } else {
            t[..4].copy_from_slice(&ports_word(rw.port[0], rw.port[1]).to_ne_bytes());
        }
    }
    let c = u16::from_ne_bytes([t[SUM], t[SUM + 1]]);
    // UDP over IPv4 without a checksum keeps none; a computed zero is sent as all ones.
    if kind == (Kind::Udp { v4: true }) && c == 0 {
        return;
    }
    let mut n = add(c, at.l4_sum);
    if matches!(kind, Kind::Udp { .. }) && n == 0 {
        n = 0xffff;
    }
    t[SUM..SUM + 2].copy_from_slice(&n.to_ne_bytes());
}

/// Where a checksum that covers a changed field lies, and how it covers it.
#[derive(Clone, Copy)]
struct Sum {
    at: usize,
    /// The checksum covers the addresses (a TCP/UDP/ICMPv6 pseudo-header).
    pseudo: bool,
    /// UDP over IPv4: a zero field means "no checksum" and stays zero.
    udp4: bool,
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Rewrites the IP packet at `b[l3..]` of family `af` (header length `hl`, transport at `l4`,
/// protocol `proto`, ports present when `ports`) to `addr`/`port`, updating the header
/// checksum (IPv4), the transport checksum, and `outer` (the checksum of an ICMP error that
/// quotes this packet, which covers every byte changed here). Only the bytes present are
/// touched: a quoted packet carries 8 bytes of its transport header.
#[allow(clippy::too_many_arguments)]
fn rewrite_ip(
    b: &mut [u8],
    l3: usize,
    l4: usize,
    af: u8,
    proto: u8,
    ports: bool,
    addr: &[Addr; 2],
    port: &[u16; 2],
    outer: Option<usize>,
) {
    let end = b.len();
    let l4sum = match proto {
        IPPROTO_TCP if l4 + 18 <= end => Some(Sum { at: l4 + 16, pseudo: true, udp4: false }),
        IPPROTO_UDP if l4 + 8 <= end => Some(Sum { at: l4 + 6, pseudo: true, udp4: af == AF_INET }),
        IPPROTO_ICMP if l4 + 4 <= end => Some(Sum { at: l4 + 2, pseudo: false, udp4: false }),
        IPPROTO_ICMPV6 if l4 + 4 <= end => Some(Sum { at: l4 + 2, pseudo: true, udp4: false }),
        _ => None,
    };
    let l4sum = l4sum.filter(|s| !(s.udp4 && get16(b, s.at) == 0));
    // One changed 16-bit word at `at`: every checksum covering it follows.
    let word = |b: &mut [u8], at: usize, new: u16, ip_hdr: bool, in_pseudo: bool, in_l4: bool| {
        let old = get16(b, at);
        if old == new {
            return;
        }
        put16(b, at, new);
        if ip_hdr && af == AF_INET {
            let c = l3 + 10;
            let v = update16(get16(b, c), old, new);
            if let Some(o) = outer {
                put_tracked(b, o, c, v);
            } else {
                put16(b, c, v);
            }
        }
        if let Some(s) = l4sum {
            if (in_pseudo && s.pseudo) || in_l4 {
                let mut v = update16(get16(b, s.at), old, new);
                if s.udp4 && v == 0 {
                    v = 0xffff;
                }
                if let Some(o) = outer {
                    put_tracked(b, o, s.at, v);
                } else {
                    put16(b, s.at, v);
                }
            }
        }
        if let Some(o) = outer {
            let v = update16(get16(b, o), old, new);
            put16(b, o, v);
        }
    };
    let (src_at, alen) = if af == AF_INET { (l3 + 12, 4) } else { (l3 + 8, 16) };
    for (side, a) in addr.iter().enumerate() {
        let at = src_at + side * alen;
        for w in (0..alen).step_by(2) {
            word(b, at + w, u16::from_be_bytes([a.0[w], a.0[w + 1]]), true, true, false);
        }
    }
    if !ports {
        return;
    }
    match proto {
        IPPROTO_TCP | IPPROTO_UDP if l4 + 4 <= end => {
            word(b, l4, port[0], false, false, true);
            word(b, l4 + 2, port[1], false, false, true);
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 if l4 + 6 <= end => word(b, l4 + 4, port[0], false, false, true),
        _ => {}
    }
}

/// Writes checksum field `at` (inside a quoted packet) and carries its change into the outer
/// checksum at `o`.
fn put_tracked(b: &mut [u8], o: usize, at: usize, v: u16) {
    let old = get16(b, at);
    put16(b, at, v);
    let ov = update16(get16(b, o), old, v);
    put16(b, o, ov);
}

/// The translation `to` of a whole datagram (as [`Rewrite`] gives it) applied to one of its
/// fragments: every fragment's addresses (and IPv4 header checksum); the first fragment's
/// ports and transport checksum too (the checksum covers the whole datagram, so the same
/// change applies). A later fragment's payload is not a transport header and is not touched.
pub fn apply_fragment(frame: &mut [u8], to: &Rewrite) -> bool {
    let mut pd = PDesc::default();
    if parse_ether(frame, &mut pd).is_err() || pd.flags & pdf::FRAGMENT == 0 {
        return false;
    }
    let (l3, l4) = (pd.l3_off as usize, pd.l4_off as usize);
    let ip_end = (l3 + pd.ip_len as usize).min(frame.len());
    let frame = &mut frame[..ip_end];
    if pd.flags & pdf::NOT_FIRST_FRAG != 0 {
        // No transport header here: the addresses alone (protocol 0: no transport checksum).
        rewrite_ip(frame, l3, l4, pd.af, 0, false, &to.addr, &to.port, None);
    } else {
        let ports = pd.flags & pdf::HAS_PORTS != 0;
        rewrite_ip(frame, l3, l4, pd.af, pd.proto, ports, &to.addr, &to.port, None);
    }
    true
}

/// Applies `rw` to Ethernet `frame`. False (nothing written) when the frame is not one it
/// can translate: not IP, or an ICMP error without the quoted header it needs.
#[inline]
pub fn apply(frame: &mut [u8], rw: &Rewrite) -> bool {
    if let Some(at) = &rw.at {
        return apply_at(frame, rw, at);
    }
    let mut pd = PDesc::default();
    if parse_ether(frame, &mut pd).is_err() {
        return false;
    }
    let (l3, l4) = (pd.l3_off as usize, pd.l4_off as usize);
    let ip_end = (l3 + pd.ip_len as usize).min(frame.len());
    let frame = &mut frame[..ip_end];
    if !rw.quoted {
        let ports = pd.flags & pdf::HAS_PORTS != 0 && pd.flags & pdf::NOT_FIRST_FRAG == 0;
        rewrite_ip(frame, l3, l4, pd.af, pd.proto, ports, &rw.addr, &rw.port, None);
        return true;
    }
    if pd.flags & pdf::ICMP_ERROR == 0 {
        return false;
    }
    // The quoted packet: its header right after the error's 8 bytes.
    let q3 = l4 + 8;
    let Some(inner) = frame.get(q3..).and_then(|q| crate::pdesc::parse_quoted(q, pd.af)) else { return false };
    let qhl = if pd.af == AF_INET { ((frame[q3] & 0x0f) as usize) * 4 } else { 40 };
    let osum = l4 + 2;
    // The error's own addresses, where they were the quoted packet's: the source when the
    // quoted packet's destination sent it, the destination (always the quoted packet's
    // sender, or the error would not belong to its state).
    let mut outer = [pd.src, pd.dst];
    if pd.src == inner.dst {
        outer[0] = rw.addr[1];
    }
    if pd.dst == inner.src {
        outer[1] = rw.addr[0];
    }
    rewrite_ip(frame, q3, q3 + qhl, pd.af, inner.proto, true, &rw.addr, &rw.port, Some(osum));
    // The outer header: its addresses enter the ICMPv6 checksum's pseudo-header, not ICMP's.
    let (src_at, alen) = if pd.af == AF_INET { (l3 + 12, 4) } else { (l3 + 8, 16) };
    for (side, a) in outer.iter().enumerate() {
        let at = src_at + side * alen;
        let old: [u8; 16] = {
            let mut o = [0u8; 16];
            o[..alen].copy_from_slice(&frame[at..at + alen]);
            o
        };
        if old[..alen] == a.0[..alen] {
            continue;
        }
        frame[at..at + alen].copy_from_slice(&a.0[..alen]);
        if pd.af == AF_INET {
            let c = update32(
                get16(frame, l3 + 10),
                u32::from_be_bytes(old[..4].try_into().unwrap()),
                u32::from_be_bytes(a.0[..4].try_into().unwrap()),
            );
            put16(frame, l3 + 10, c);
        } else {
            let c = update128(get16(frame, osum), &old, &a.0);
            put16(frame, osum, c);
        }
    }
    true
}

/// The ICMP checksum of `frame`'s error message computed afresh (tests).
#[cfg(test)]
fn icmp_ok(frame: &[u8]) -> bool {
    let mut pd = PDesc::default();
    parse_ether(frame, &mut pd).unwrap();
    let l4 = pd.l4_off as usize;
    let end = pd.l3_off as usize + pd.ip_len as usize;
    let init =
        if pd.af == AF_INET { 0 } else { checksum::pseudo_v6(&pd.src.0, &pd.dst.0, IPPROTO_ICMPV6, (end - l4) as u32) };
    checksum::fold(checksum::sum(&frame[l4..end], init)) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ipv4, ipv6};

    fn eth(et: u16, rest: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&et.to_be_bytes());
        f.extend_from_slice(rest);
        f
    }

    fn udp4(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, payload: &[u8]) -> Vec<u8> {
        let len = 28 + payload.len();
        let mut p = vec![0u8; len];
        ipv4::emit_header(&mut p, src, dst, IPPROTO_UDP, len as u16, 64, 7);
        crate::udp::emit_header(&mut p[20..], sp, dp, (8 + payload.len()) as u16);
        p[28..].copy_from_slice(payload);
        let c = !checksum::fold(checksum::sum(
            &p[20..],
            checksum::pseudo_v4(src, dst, IPPROTO_UDP, (8 + payload.len()) as u16),
        ));
        p[26..28].copy_from_slice(&c.to_be_bytes());
        eth(0x0800, &p)
    }

    fn tcp6(src: [u8; 16], dst: [u8; 16], sp: u16, dp: u16) -> Vec<u8> {
        let mut p = vec![0u8; 60];
        ipv6::emit_header(&mut p, &src, &dst, IPPROTO_TCP, 20, 64);
        crate::tcp::emit_header(&mut p[40..], sp, dp, 1000, 2000, 0x10, 512);
        let c = !checksum::fold(checksum::sum(&p[40..], checksum::pseudo_v6(&src, &dst, IPPROTO_TCP, 20)));
        p[56..58].copy_from_slice(&c.to_be_bytes());
        eth(0x86dd, &p)
    }

    fn l4_ok(f: &[u8]) -> bool {
        let mut pd = PDesc::default();
        parse_ether(f, &mut pd).unwrap();
        let (l4, end) = (pd.l4_off as usize, pd.l3_off as usize + pd.ip_len as usize);
        let ph = if pd.af == AF_INET {
            checksum::pseudo_v4(pd.src.v4_bytes(), pd.dst.v4_bytes(), pd.proto, (end - l4) as u16)
        } else {
            checksum::pseudo_v6(&pd.src.0, &pd.dst.0, pd.proto, (end - l4) as u32)
        };
        checksum::fold(checksum::sum(&f[l4..end], ph)) == 0xffff
    }

    #[test]
    fn udp4_source_translated_with_valid_checksums() {
        let mut f = udp4([10, 0, 1, 2], [10, 0, 2, 2], 40000, 53, b"hello world");
        let rw = Rewrite {
            addr: [Addr::v4([192, 0, 2, 1]), Addr::v4([10, 0, 2, 2])],
            port: [50001, 53],
            ..Default::default()
        };
        assert!(apply(&mut f, &rw));
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap(); // checks the IPv4 header checksum
        assert_eq!((pd.src, pd.sport, pd.dst, pd.dport), (rw.addr[0], 50001, rw.addr[1], 53));
        assert!(l4_ok(&f));
    }

    #[test]
    fn prepared_rewrites_write_what_the_parsing_ones_write() {
        let a = |x: u8| {
            let mut b = [0u8; 16];
            b[0] = 0xfd;
            b[15] = x;
            b
        };
        let frames = [
            udp4([10, 0, 1, 2], [10, 0, 2, 2], 40000, 53, b"hello world"),
            tcp6(a(1), a(2), 33000, 80),
            {
                let mut f = udp4([10, 0, 1, 2], [10, 0, 2, 2], 40000, 53, b"x");
                f[40..42].copy_from_slice(&[0, 0]);
                f
            },
            echo4([10, 0, 1, 2], [10, 0, 2, 2], 0x4242),
            echo6(a(1), a(2), 0x4242),
        ];
        // Each frame to many addresses and ports (a fixed LCG), words of all ones among them:
        // the prepared rewrite, which sums its changes from the bytes it replaces in memory
        // order, writes what the field-by-field one writes, and the checksums hold.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 24) as u32
        };
        for f in frames {
            let mut pd = PDesc::default();
            parse_ether(&f, &mut pd).unwrap();
            let from = Rewrite { addr: [pd.src, pd.dst], port: [pd.sport, pd.dport], ..Default::default() };
            for round in 0..200 {
                let mut to = from;
                let alen = if pd.af == AF_INET { 4 } else { 16 };
                for side in 0..2 {
                    for b in 0..alen {
                        to.addr[side].0[b] = match round % 4 {
                            0 => 0xff,
                            1 => to.addr[side].0[b],
                            _ => next() as u8,
                        };
                    }
                }
                to.port = if round % 4 == 0 { [0xffff, 0xffff] } else { [next() as u16, next() as u16] };
                if round == 0 {
                    to.port = [pd.sport ^ 0x1234, pd.dport.wrapping_add(7)];
                }
                let (mut slow, mut fast) = (f.clone(), f.clone());
                assert!(apply(&mut slow, &to));
                let mut rw = Rewrite::default();
                rw.prepare(&pd, to.addr, to.port);
                assert!(apply(&mut fast, &rw));
                assert_eq!(slow, fast, "round {round}");
                let mut q = PDesc::default();
                parse_ether(&fast, &mut q).unwrap(); // checks the IPv4 header checksum
                if !(pd.proto == IPPROTO_UDP && f[40..42] == [0, 0]) {
                    assert!(if pd.proto == IPPROTO_ICMP { icmp_ok(&fast) } else { l4_ok(&fast) }, "round {round}");
                }
            }
        }
    }

    fn echo4(src: [u8; 4], dst: [u8; 4], id: u16) -> Vec<u8> {
        let mut p = vec![0u8; 36];
        ipv4::emit_header(&mut p, src, dst, IPPROTO_ICMP, 36, 64, 7);
        p[20] = 8;
        p[24..26].copy_from_slice(&id.to_be_bytes());
        p[26..28].copy_from_slice(&[0, 1]);
        let c = !checksum::fold(checksum::sum(&p[20..], 0));
        p[22..24].copy_from_slice(&c.to_be_bytes());
        eth(0x0800, &p)
    }

    fn echo6(src: [u8; 16], dst: [u8; 16], id: u16) -> Vec<u8> {
        let mut p = vec![0u8; 56];
        ipv6::emit_header(&mut p, &src, &dst, IPPROTO_ICMPV6, 16, 64);
        p[40] = 128;
        p[44..46].copy_from_slice(&id.to_be_bytes());
        let c = !checksum::fold(checksum::sum(&p[40..], checksum::pseudo_v6(&src, &dst, IPPROTO_ICMPV6, 16)));
        p[42..44].copy_from_slice(&c.to_be_bytes());
        eth(0x86dd, &p)
    }

    #[test]
    fn udp4_without_checksum_keeps_none() {
        let mut f = udp4([10, 0, 1, 2], [10, 0, 2, 2], 40000, 53, b"x");
        f[14 + 26] = 0;
        f[14 + 27] = 0;
        let rw =
            Rewrite { addr: [Addr::v4([192, 0, 2, 1]), Addr::v4([10, 0, 2, 2])], port: [1, 53], ..Default::default() };
        assert!(apply(&mut f, &rw));
        assert_eq!(&f[40..42], &[0, 0]);
    }

    #[test]
    fn tcp6_destination_translated_with_valid_checksum() {
        let a = |x: u8| {
            let mut b = [0u8; 16];
            b[0] = 0x20;
            b[1] = 0x01;
            b[15] = x;
            b
        };
        let mut f = tcp6(a(1), a(2), 33000, 80);
        let rw = Rewrite { addr: [Addr(a(1)), Addr(a(9))], port: [33000, 8080], ..Default::default() };
        assert!(apply(&mut f, &rw));
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!((pd.dst, pd.dport), (Addr(a(9)), 8080));
        assert!(l4_ok(&f));
    }

    #[test]
    fn icmp_error_translated_outside_and_inside() {
        // Port unreachable from 10.0.2.2 about a UDP datagram 192.0.2.1:50001 -> 10.0.2.2:53,
        // translated back to the inside host's view 10.0.1.2:40000.
        let quoted = udp4([192, 0, 2, 1], [10, 0, 2, 2], 50001, 53, b"question");
        let q = &quoted[14..];
        let mut p = vec![0u8; 20 + 8 + q.len()];
        let n = p.len() as u16;
        ipv4::emit_header(&mut p, [10, 0, 2, 2], [192, 0, 2, 1], IPPROTO_ICMP, n, 64, 9);
        crate::icmp::emit_header(&mut p[20..], 3, 3, 0);
        p[28..].copy_from_slice(q);
        let c = checksum::checksum(&p[20..]);
        p[22..24].copy_from_slice(&c.to_be_bytes());
        let mut f = eth(0x0800, &p);
        assert!(icmp_ok(&f));
        let rw = Rewrite {
            addr: [Addr::v4([10, 0, 1, 2]), Addr::v4([10, 0, 2, 2])],
            port: [40000, 53],
            quoted: true,
            at: None,
        };
        assert!(apply(&mut f, &rw));
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!(pd.dst, Addr::v4([10, 0, 1, 2]));
        assert_eq!(pd.src, Addr::v4([10, 0, 2, 2]));
        assert!(icmp_ok(&f), "ICMP checksum");
        let inner = crate::pdesc::parse_quoted(&f[42..], AF_INET).unwrap();
        assert_eq!((inner.src, inner.sport), (Addr::v4([10, 0, 1, 2]), 40000));
        // The quoted header's checksum and the quoted UDP checksum still hold.
        assert_eq!(checksum::checksum(&f[42..62]), 0);
        assert!(l4_ok(&eth(0x0800, &f[42..])));
    }
}
