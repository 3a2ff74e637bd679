//! Transport checksums left to offload. A host sending through a virtual interface (veth,
//! tun/tap) or to a NIC with checksum offload hands the frame on with the TCP/UDP checksum
//! field holding only the pseudo-header sum (the kernel's CHECKSUM_PARTIAL): the device was
//! to finish it. A firewall that forwards the frame as bytes must finish it, or ask its own
//! transmit path to, or the receiver drops the segment.
//!
//! [`partial`] recognises such a frame by its field: equal to the folded pseudo-header sum.
//! A complete checksum has that value one time in 65,536; finishing such a frame writes the
//! same value again when its bytes are intact, so nothing is lost by the ambiguity.

use crate::{checksum, ethernet, ipv4, ipv6, tcp, udp};

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Where a frame's transport checksum lies, when it was left to offload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial {
    /// Offset of the TCP/UDP header in the frame.
    pub start: u16,
    /// Offset of the checksum field from `start` (16 for TCP, 6 for UDP).
    pub offset: u16,
}

/// The transport segment of a frame: its range, protocol and pseudo-header sum (for the
/// addresses and length the frame holds now). Ethernet with at most one 802.1Q tag; IPv4
/// not fragmented, or IPv6 not fragmented, its TCP or UDP after the fixed header and any
/// hop-by-hop or destination options (a routing header would put the final destination in
/// the pseudo-header: such frames are not taken as partial).
struct Segment {
    /// Where the IP header starts.
    l3: usize,
    start: usize,
    end: usize,
    proto: u8,
    pseudo: u32,
    v4: bool,
}

fn segment(frame: &[u8]) -> Option<Segment> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    let (mut et, mut off) = (eth.ethertype(), ethernet::HEADER_LEN);
    if et == 0x8100 {
        let tag = frame.get(off..off + 4)?;
        et = u16::from_be_bytes([tag[2], tag[3]]);
        off += 4;
    }
    match et {
        0x0800 => {
            let ip = ipv4::Packet::new_checked(&frame[off..]).ok()?;
            let proto = ip.protocol();
            if ip.is_fragment() || (proto != IPPROTO_TCP && proto != IPPROTO_UDP) {
                return None;
            }
            let (start, end) = (off + ip.header_len(), off + ip.total_len());
            let pseudo = checksum::pseudo_v4(ip.src(), ip.dst(), proto, (end - start) as u16);
            Some(Segment { l3: off, start, end, proto, pseudo, v4: true })
        }
        0x86dd => {
            let ip = ipv6::Packet::new_checked(&frame[off..]).ok()?;
            let payload = off + ipv6::HEADER_LEN;
            let end = payload + ip.payload_len();
            let ext = ipv6::walk(ip.next_header(), frame.get(payload..end)?).ok()?;
            let proto = ext.proto;
            if ext.fragment.is_some() || ext.routing || (proto != IPPROTO_TCP && proto != IPPROTO_UDP) {
                return None;
            }
            let start = payload + ext.offset;
            let pseudo = checksum::pseudo_v6(&ip.src(), &ip.dst(), proto, (end - start) as u32);
            Some(Segment { l3: off, start, end, proto, pseudo, v4: false })
        }
        _ => None,
    }
}

/// The segment's checksum field, through its view (None when the header does not fit).
fn field(frame: &[u8], s: &Segment) -> Option<u16> {
    let b = &frame[s.start..s.end];
    if s.proto == IPPROTO_TCP {
        tcp::Packet::new_checked(b).ok().map(|t| t.checksum())
    } else {
        udp::Packet::new_checked(b).ok().map(|u| u.checksum())
    }
}

fn set_field(frame: &mut [u8], s: &Segment, c: u16) {
    let b = &mut frame[s.start..s.end];
    if s.proto == IPPROTO_TCP {
        if let Ok(mut t) = tcp::Packet::new_checked(b) {
            t.set_checksum(c);
        }
    } else if let Ok(mut u) = udp::Packet::new_checked(b) {
        u.set_checksum(c);
    }
}

/// The bytes of IP and TCP/UDP header in `frame` (what every segment of a GSO packet
/// repeats); None when it is not TCP or UDP over IP.
pub fn headers_len(frame: &[u8]) -> Option<usize> {
    let s = segment(frame)?;
    let l4 = if s.proto == IPPROTO_TCP {
        tcp::Packet::new_checked(&frame[s.start..s.end]).ok()?.header_len()
    } else {
        udp::HEADER_LEN
    };
    Some(s.start - s.l3 + l4)
}

/// Whether `frame`'s TCP/UDP checksum was left to offload, and where it is.
#[inline]
pub fn partial(frame: &[u8]) -> Option<Partial> {
    let s = segment(frame)?;
    let c = field(frame, &s)?;
    // UDP over IPv4 with no checksum at all (0) is complete as it is.
    if s.v4 && s.proto == IPPROTO_UDP && c == 0 {
        return None;
    }
    (c == checksum::fold(s.pseudo))
        .then_some(Partial { start: s.start as u16, offset: if s.proto == IPPROTO_TCP { 16 } else { 6 } })
}

/// Finishes, in software, the checksum of a frame [`partial`] recognised (before it was
/// rewritten): over the pseudo-header of the addresses it holds now and the whole segment.
pub fn finish(frame: &mut [u8]) {
    let Some(s) = segment(frame) else { return };
    set_field(frame, &s, 0);
    let mut c = !checksum::fold(checksum::sum(&frame[s.start..s.end], s.pseudo));
    if s.proto == IPPROTO_UDP && c == 0 {
        c = 0xffff;
    }
    set_field(frame, &s, c);
}

/// Sets the field back to the pseudo-header sum of the frame as it is now, for a transmit
/// path that finishes the checksum (an AF_XDP checksum request, the device's offload): the
/// rewrites since [`partial`] (ports, sequence numbers, addresses) updated it as if complete.
pub fn prepare(frame: &mut [u8]) {
    if let Some(s) = segment(frame) {
        set_field(frame, &s, checksum::fold(s.pseudo));
    }
}

/// Cuts a GSO packet (TCP or UDP over IPv4 or IPv6, `frame` holding its headers once and
/// all its data) into the segments a device would send: `size` bytes of data each, the
/// headers repeated with their lengths, IPv4 identification (+1 a segment), TCP sequence
/// (FIN and PSH on the last segment only, CWR on the first) and checksums complete. Each
/// segment goes to `emit` in `buf` (reused). False, and nothing emitted, when `frame` is not
/// such a packet.
pub fn segment_gso(frame: &[u8], size: usize, buf: &mut Vec<u8>, mut emit: impl FnMut(&[u8])) -> bool {
    let Some(s) = segment(frame) else { return false };
    // TCP: header length, first sequence number and flags, read once.
    let (l4, seq, flags) = match s.proto {
        IPPROTO_TCP => match tcp::Packet::new_checked(&frame[s.start..s.end]) {
            Ok(t) => (t.header_len(), t.seq(), t.flags()),
            Err(_) => return false,
        },
        _ => (udp::HEADER_LEN, 0, 0),
    };
    let hdr = s.start + l4;
    if size == 0 || hdr >= s.end {
        return false;
    }
    let data = &frame[hdr..s.end];
    let ident = if s.v4 { ipv4::Packet::new_header(&frame[s.l3..]).map(|p| p.ident()).unwrap_or(0) } else { 0 };
    let n = data.len().div_ceil(size);
    for (i, chunk) in data.chunks(size).enumerate() {
        buf.clear();
        buf.extend_from_slice(&frame[..hdr]);
        buf.extend_from_slice(chunk);
        let len = buf.len();
        if s.v4 {
            if let Ok(mut ip) = ipv4::Packet::new_header(&mut buf[s.l3..]) {
                ip.set_len_ident((len - s.l3) as u16, ident.wrapping_add(i as u16));
                ip.fill_checksum();
            }
        } else if let Ok(mut ip) = ipv6::Packet::new_header(&mut buf[s.l3..]) {
            ip.set_payload_len((len - s.l3 - ipv6::HEADER_LEN) as u16);
        }
        if s.proto == IPPROTO_TCP {
            if let Ok(mut t) = tcp::Packet::new_checked(&mut buf[s.start..]) {
                t.set_seq(seq.wrapping_add((i * size) as u32));
                let mut f = flags;
                if i + 1 < n {
                    f &= !(tcp::FIN | tcp::PSH);
                }
                if i > 0 {
                    f &= !tcp::CWR;
                }
                t.set_flags(f);
            }
        } else if let Ok(mut u) = udp::Packet::new_header(&mut buf[s.start..]) {
            u.set_len((len - s.start) as u16);
        }
        finish(buf);
        emit(buf);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame of IPv4 TCP (20-byte header, `payload` after it), checksum complete.
    fn tcp4(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload.len()];
        f[12] = 8;
        ipv4::emit_header(&mut f[14..], [10, 0, 1, 2], [10, 0, 2, 2], 6, (40 + payload.len()) as u16, 64, 1);
        f[34..36].copy_from_slice(&40000u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x18;
        f[54..].copy_from_slice(payload);
        finish(&mut f);
        f
    }

    fn valid(f: &[u8]) -> bool {
        let s = segment(f).unwrap();
        checksum::fold(checksum::sum(&f[s.start..s.end], s.pseudo)) == 0xffff
    }

    #[test]
    fn a_partial_checksum_is_recognised_and_finished() {
        let mut f = tcp4(b"hello, world");
        assert!(valid(&f));
        assert_eq!(partial(&f), None, "complete");
        // What the sending kernel leaves for the device: the pseudo-header sum.
        prepare(&mut f);
        assert!(!valid(&f));
        assert_eq!(partial(&f), Some(Partial { start: 34, offset: 16 }));
        // A rewrite in between (a port, updated as if complete) does not matter.
        f[36..38].copy_from_slice(&8080u16.to_be_bytes());
        finish(&mut f);
        assert!(valid(&f));
        assert_eq!(partial(&f), None);
    }

    #[test]
    fn udp_ipv6_and_ipv4_without_checksum() {
        let mut f = vec![0u8; 14 + 40 + 8 + 5];
        f[12] = 0x86;
        f[13] = 0xdd;
        let (a, b) =
            ([0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        ipv6::emit_header(&mut f[14..], &a, &b, 17, 13, 64);
        udp::emit_header(&mut f[54..], 5000, 53, 13);
        f[62..].copy_from_slice(b"query");
        prepare(&mut f);
        assert_eq!(partial(&f), Some(Partial { start: 54, offset: 6 }));
        finish(&mut f);
        assert!(valid(&f));
        // The same behind a hop-by-hop header (8 bytes: next UDP, length 0, PadN).
        let mut h = vec![0u8; 14 + 40 + 8 + 8 + 5];
        h[12] = 0x86;
        h[13] = 0xdd;
        ipv6::emit_header(&mut h[14..], &a, &b, 0, 21, 64);
        h[54..62].copy_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
        udp::emit_header(&mut h[62..], 5000, 53, 13);
        h[70..].copy_from_slice(b"query");
        prepare(&mut h);
        assert_eq!(partial(&h), Some(Partial { start: 62, offset: 6 }));
        finish(&mut h);
        assert!(valid(&h));
        // Behind a routing header: not taken (its final destination is not in the header).
        h[20] = 43;
        h[54..62].copy_from_slice(&[17, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(partial(&h), None);
        // IPv4 UDP with checksum 0 (none) is left alone.
        let mut g = vec![0u8; 14 + 20 + 8];
        g[12] = 8;
        ipv4::emit_header(&mut g[14..], [1, 1, 1, 1], [2, 2, 2, 2], 17, 28, 64, 1);
        udp::emit_header(&mut g[34..], 1, 2, 8);
        assert_eq!(partial(&g), None);
    }

    #[test]
    fn a_gso_packet_is_cut_into_valid_segments() {
        // TCP over IPv4: 3,000 bytes of data in segments of 1,448, FIN|PSH|ACK|CWR on the whole.
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let mut f = tcp4(&data);
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[47] = tcp::FIN | tcp::PSH | tcp::ACK | tcp::CWR;
        prepare(&mut f);
        let mut segs: Vec<Vec<u8>> = Vec::new();
        assert!(segment_gso(&f, 1448, &mut Vec::new(), |b| segs.push(b.to_vec())));
        assert_eq!(segs.len(), 3);
        let mut got = Vec::new();
        for (i, g) in segs.iter().enumerate() {
            assert!(valid(g), "segment {i}'s TCP checksum");
            let ip = ipv4::Packet::new_checked(&g[14..]).unwrap();
            assert!(ip.verify_checksum());
            assert_eq!(ip.total_len(), g.len() - 14);
            assert_eq!(ip.ident(), 1 + i as u16);
            let t = tcp::Packet::new_checked(&g[34..]).unwrap();
            assert_eq!(t.seq(), 1000 + 1448 * i as u32);
            let want = match i {
                0 => tcp::ACK | tcp::CWR,
                1 => tcp::ACK,
                _ => tcp::FIN | tcp::PSH | tcp::ACK,
            };
            assert_eq!(t.flags(), want, "segment {i}");
            got.extend_from_slice(t.payload());
        }
        assert_eq!(got, data);
        assert_eq!(segs[2].len(), 54 + 3000 - 2 * 1448);

        // UDP over IPv6 (USO): 2,500 bytes in datagrams of 1,200.
        let (a, b) =
            ([0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let mut u = vec![0u8; 14 + 40 + 8 + 2500];
        u[12] = 0x86;
        u[13] = 0xdd;
        ipv6::emit_header(&mut u[14..], &a, &b, 17, 2508, 64);
        udp::emit_header(&mut u[54..], 5000, 443, 2508);
        prepare(&mut u);
        let mut segs: Vec<Vec<u8>> = Vec::new();
        assert!(segment_gso(&u, 1200, &mut Vec::new(), |b| segs.push(b.to_vec())));
        assert_eq!(segs.iter().map(|g| g.len() - 62).collect::<Vec<_>>(), [1200, 1200, 100]);
        for g in &segs {
            assert!(valid(g));
            assert_eq!(ipv6::Packet::new_checked(&g[14..]).unwrap().payload_len(), g.len() - 54);
            assert_eq!(udp::Packet::new_checked(&g[54..]).unwrap().len(), g.len() - 54);
        }
        // Not TCP or UDP over IP: refused, nothing emitted.
        assert!(!segment_gso(&[0u8; 60], 1448, &mut Vec::new(), |_| panic!("emitted")));
        assert!(!segment_gso(&f, 0, &mut Vec::new(), |_| panic!("emitted")));
    }

    #[test]
    fn headers_of_a_tcp_frame() {
        assert_eq!(headers_len(&tcp4(b"abc")), Some(40));
        assert_eq!(headers_len(&[0u8; 20]), None);
    }

    #[test]
    fn malformed_frames_are_not_partial() {
        let f = tcp4(b"x");
        for n in 0..f.len() {
            let _ = partial(&f[..n]);
            let mut g = f[..n].to_vec();
            finish(&mut g);
            prepare(&mut g);
            let _ = segment_gso(&f[..n], 1, &mut Vec::new(), |_| {});
        }
    }
}
