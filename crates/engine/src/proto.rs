//! Per-protocol state keeping: the initial peer states and timeout of a new state, and the
//! update on each packet. UDP, ICMP and other protocols follow pf (`pf_test_state`); TCP
//! creates states on SYN only (pf's default `flags S/SA`) and each segment is checked against
//! both peers' sequence windows ([`tcp_track`], pf's `pf_tcp_track_full`, from Guido van
//! Rooij's "Real Stateful TCP Packet Filtering in IP Filter"): a segment outside the window,
//! or a RST that does not hit the expected sequence number, is dropped and the state kept.

use xpf_state::{Peer, Timeout};
use xpf_wire::pdesc::{pdf, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};
use xpf_wire::{tcp, PDesc};

/// pf's UDP / other peer states (PFUDPS_*, PFOTHERS_*).
pub const NO_TRAFFIC: u8 = 0;
pub const SINGLE: u8 = 1;
pub const MULTIPLE: u8 = 2;

/// pf's TCP peer states (TCPS_*).
pub mod tcps {
    pub const CLOSED: u8 = 0;
    pub const LISTEN: u8 = 1;
    pub const SYN_SENT: u8 = 2;
    pub const SYN_RECEIVED: u8 = 3;
    pub const ESTABLISHED: u8 = 4;
    pub const CLOSE_WAIT: u8 = 5;
    pub const FIN_WAIT_1: u8 = 6;
    pub const CLOSING: u8 = 7;
    pub const LAST_ACK: u8 = 8;
    pub const FIN_WAIT_2: u8 = 9;
    pub const TIME_WAIT: u8 = 10;
    pub const NAMES: [&str; 13] = [
        "CLOSED",
        "LISTEN",
        "SYN_SENT",
        "SYN_RCVD",
        "ESTABLISHED",
        "CLOSE_WAIT",
        "FIN_WAIT_1",
        "CLOSING",
        "LAST_ACK",
        "FIN_WAIT_2",
        "TIME_WAIT",
        "PROXY:SRC",
        "PROXY:DST",
    ];
}

/// Whether a packet that matched a keep-state rule may create a state (`flags S/SA` for TCP).
/// With `pickup` (a rule with `flags any`), any segment but a RST makes one.
#[inline]
pub fn may_create(pd: &PDesc, pickup: bool) -> bool {
    if pd.proto != IPPROTO_TCP {
        // A neighbour advertisement answers a solicitation's state or passes without one
        // (pf: nobody expects an answer to an unsolicited advertisement).
        return pd.proto != IPPROTO_ICMPV6 || pd.icmp_type != xpf_wire::icmp::V6_NEIGHBOR_ADVERT;
    }
    pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN || (pickup && pd.tcp_flags & tcp::RST == 0)
}

/// Initial (timeout, src state, dst state, TCP peers) of a state created by `pd`.
#[inline]
pub fn initial(pd: &PDesc) -> (Timeout, u8, u8, Option<[Peer; 2]>) {
    match pd.proto {
        IPPROTO_TCP => {
            // pf_create_state: the creator's window starts at its SYN; the peer's is unknown
            // (seqhi 1, max_win 1) until its first segment.
            let mut src = Peer {
                seqlo: pd.tcp_seq,
                seqhi: pd.tcp_seq.wrapping_add(pd.payload_len as u32).wrapping_add(1),
                max_win: pd.tcp_win.max(1),
                ..Peer::default()
            };
            if pd.tcp_flags & tcp::SYN != 0 {
                src.seqhi = src.seqhi.wrapping_add(1);
                src.wscale = pd.tcp_wscale;
            }
            let sws = src.wscale & WSCALE_MASK;
            if sws != 0 {
                // The window of a SYN is not scaled: keep max_win in the scaled unit.
                src.max_win = ((src.max_win as u32 + (1 << sws) - 1) >> sws) as u16;
            }
            if pd.tcp_flags & tcp::FIN != 0 {
                src.seqhi = src.seqhi.wrapping_add(1);
            }
            let dst = Peer { seqhi: 1, max_win: 1, ..Peer::default() };
            (Timeout::TcpFirst, tcps::SYN_SENT, tcps::CLOSED, Some([src, dst]))
        }
        IPPROTO_UDP => (Timeout::UdpFirst, SINGLE, NO_TRAFFIC, None),
        IPPROTO_ICMP | IPPROTO_ICMPV6 => (Timeout::IcmpFirst, 0, 0, None),
        _ => (Timeout::OtherFirst, SINGLE, NO_TRAFFIC, None),
    }
}

/// Updates the peer states (`st` = [src, dst] as stored in the state) and returns the timeout
/// class for a packet from side `from` (0 = the state's creator).
// PERF: the states are updated in place: returning them by value through a [u8; 2] cost a
// store-forwarding stall of ~5 ns per packet (perf annotate, xpf-bench states at 9,800).
#[inline(always)]
pub fn on_packet(proto: u8, flags: u8, from: usize, st: &mut [u8; 2]) -> Timeout {
    match proto {
        IPPROTO_TCP => {
            // pf's flag-driven peer states (the part of pf_tcp_track_full after the window checks).
            let (s, d) = (from, 1 - from);
            if flags & tcp::SYN != 0 && st[s] < tcps::SYN_SENT {
                st[s] = tcps::SYN_SENT;
            }
            if flags & tcp::FIN != 0 && st[s] < tcps::CLOSING {
                st[s] = tcps::CLOSING;
            }
            if flags & tcp::ACK != 0 {
                if st[d] == tcps::SYN_SENT {
                    st[d] = tcps::ESTABLISHED;
                } else if st[d] == tcps::CLOSING {
                    st[d] = tcps::FIN_WAIT_2;
                }
            }
            if flags & tcp::RST != 0 {
                *st = [tcps::TIME_WAIT, tcps::TIME_WAIT];
            }
            tcp_class(st)
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => Timeout::IcmpError,
        _ => {
            let (s, d) = (from, 1 - from);
            if st[s] < SINGLE {
                st[s] = SINGLE;
            }
            if st[d] == SINGLE {
                st[d] = MULTIPLE;
            }
            let udp = proto == IPPROTO_UDP;
            match (st[s] == MULTIPLE && st[d] == MULTIPLE, udp) {
                (true, true) => Timeout::UdpMultiple,
                (false, true) => Timeout::UdpSingle,
                (true, false) => Timeout::OtherMultiple,
                (false, false) => Timeout::OtherSingle,
            }
        }
    }
}

/// pf's PF_WSCALE_FLAG / PF_WSCALE_MASK on `Peer::wscale`.
pub const WSCALE_FLAG: u8 = 0x80;
pub const WSCALE_MASK: u8 = 0x0f;
/// pf's MAXACKWINDOW: how far an ACK may lag (one window plus a fudge for a fragment).
const MAXACKWINDOW: i64 = 0xffff + 1500;
const TCP_MAXWIN: u32 = 65535;

#[inline(always)]
fn seq_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

#[inline(always)]
fn seq_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The timeout class of TCP peer states `st` (pf_tcp_track_full's last step).
fn tcp_class(st: &[u8; 2]) -> Timeout {
    if st[0] >= tcps::FIN_WAIT_2 && st[1] >= tcps::FIN_WAIT_2 {
        Timeout::TcpClosed
    } else if st[0] >= tcps::CLOSING && st[1] >= tcps::CLOSING {
        Timeout::TcpFinWait
    } else if st[0] < tcps::ESTABLISHED || st[1] < tcps::ESTABLISHED {
        Timeout::TcpOpening
    } else if st[0] >= tcps::CLOSING || st[1] >= tcps::CLOSING {
        Timeout::TcpClosing
    } else {
        Timeout::TcpEstablished
    }
}

/// What the window check made of a TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Track {
    /// In the window: the timeout class to use now.
    Pass(Timeout),
    /// Accepted loosely (pf's second branch: a SYN shotgun, a stream picked up late, stray
    /// segments after a close): passes, but the state's timeout is not refreshed.
    Loose,
    /// Outside the window, or a RST off the expected sequence number: drop, keep the state.
    Bad,
}

/// pf's `pf_tcp_track_full` for a segment `pd` from side `from` (0: the side that created the
/// state) of a state with peers `p` and peer states `st`.
pub fn tcp_track(p: &mut [Peer; 2], st: &mut [u8; 2], pd: &PDesc, from: usize) -> Track {
    let (si, di) = (from, 1 - from);
    let flags = pd.tcp_flags;
    let mut win = pd.tcp_win as u32;
    let (mut sws, mut dws) = if p[si].wscale != 0 && p[di].wscale != 0 && flags & tcp::SYN == 0 {
        (p[si].wscale & WSCALE_MASK, p[di].wscale & WSCALE_MASK)
    } else {
        (0, 0)
    };
    let orig_seq = pd.tcp_seq;
    let mut seq = orig_seq;
    // Under `modulate state` the other side's numbers on the wire are shifted by its seqdiff:
    // its acknowledgements are tracked in the sender's own numbering.
    let mut ack = pd.tcp_ack.wrapping_sub(p[di].seqdiff);
    let mut end;
    let mut data_end;
    if p[si].seqlo == 0 {
        // First segment from this side (the SYN|ACK of the responder, usually).
        end = seq.wrapping_add(pd.payload_len as u32);
        if flags & tcp::SYN != 0 {
            end = end.wrapping_add(1);
            if p[di].wscale & WSCALE_FLAG != 0 {
                p[si].wscale = pd.tcp_wscale;
                if p[si].wscale & WSCALE_FLAG != 0 {
                    sws = p[si].wscale & WSCALE_MASK;
                    win = (win + (1 << sws) - 1) >> sws;
                    dws = p[di].wscale & WSCALE_MASK;
                } else {
                    // The other side asked for scaling, this one did not: neither scales.
                    p[di].max_win = ((p[di].max_win as u32) << (p[di].wscale & WSCALE_MASK)).min(TCP_MAXWIN) as u16;
                    p[di].wscale = 0;
                }
            }
        }
        data_end = end;
        if flags & tcp::FIN != 0 {
            end = end.wrapping_add(1);
        }
        p[si].seqlo = seq;
        if st[si] < tcps::SYN_SENT {
            st[si] = tcps::SYN_SENT;
        }
        let reach = end.wrapping_add(((p[di].max_win as u32) << dws).max(1));
        if p[si].seqhi == 1 || seq_geq(reach, p[si].seqhi) {
            p[si].seqhi = reach;
        }
        if win > p[si].max_win as u32 {
            p[si].max_win = win.min(u16::MAX as u32) as u16;
        }
    } else {
        end = seq.wrapping_add(pd.payload_len as u32);
        if flags & tcp::SYN != 0 {
            end = end.wrapping_add(1);
        }
        data_end = end;
        if flags & tcp::FIN != 0 {
            end = end.wrapping_add(1);
        }
    }
    // Until the other side has sent anything, an acknowledgement says nothing about its
    // window: pf slides it anyway (to the SYN's window above sequence 0 when a SYN is
    // retransmitted), and the responder's SYN|ACK is then dropped as a mismatch whenever its
    // sequence lies in the 1.5% of the space that `seqhi` no longer reaches - every time,
    // as each retransmitted SYN does it again: a handshake that never completes (seen in
    // scripts/failover.sh). xpf leaves the window unset (seqhi 1) until that first segment.
    let ack_known = st[di] >= tcps::SYN_SENT;
    if flags & tcp::ACK == 0 {
        // Let it pass the ack skew check.
        ack = p[di].seqlo;
    } else if (ack == 0 && flags & (tcp::ACK | tcp::RST) == tcp::ACK | tcp::RST) || st[di] < tcps::SYN_SENT {
        // Stacks that send RST|ACK with ack 0, or an ACK before the peer said anything.
        ack = p[di].seqlo;
    }
    if seq == end {
        // No data: ease the sequencing restrictions.
        seq = p[si].seqlo;
        end = seq;
        data_end = seq;
    }
    let ackskew = p[di].seqlo.wrapping_sub(ack) as i32 as i64;
    let rst_ok = flags & tcp::RST == 0
        || orig_seq == p[si].seqlo
        || orig_seq == p[si].seqlo.wrapping_add(1)
        || orig_seq.wrapping_add(1) == p[si].seqlo;
    let dwin = (p[di].max_win as u32) << dws;
    if seq_geq(p[si].seqhi, data_end)
        && seq_geq(seq, p[si].seqlo.wrapping_sub(dwin))
        && ackskew >= -MAXACKWINDOW
        && ackskew <= MAXACKWINDOW << sws
        && rst_ok
    {
        slide(p, si, di, win, sws, end, ack, ack_known);
        if flags & tcp::SYN != 0 && st[si] < tcps::SYN_SENT {
            st[si] = tcps::SYN_SENT;
        }
        if flags & tcp::FIN != 0 && st[si] < tcps::CLOSING {
            st[si] = tcps::CLOSING;
        }
        if flags & tcp::ACK != 0 {
            if st[di] == tcps::SYN_SENT {
                st[di] = tcps::ESTABLISHED;
            } else if st[di] == tcps::CLOSING {
                st[di] = tcps::FIN_WAIT_2;
            }
        }
        if flags & tcp::RST != 0 {
            *st = [tcps::TIME_WAIT, tcps::TIME_WAIT];
        }
        Track::Pass(tcp_class(st))
    } else if (st[di] < tcps::SYN_SENT || st[di] >= tcps::FIN_WAIT_2 || st[si] >= tcps::FIN_WAIT_2)
        && seq_geq(p[si].seqhi.wrapping_add(MAXACKWINDOW as u32), data_end)
        && seq_geq(seq, p[si].seqlo.wrapping_sub(MAXACKWINDOW as u32))
    {
        slide(p, si, di, win, sws, end, ack, ack_known);
        if flags & tcp::FIN != 0 && st[si] < tcps::CLOSING {
            st[si] = tcps::CLOSING;
        }
        if flags & tcp::RST != 0 {
            *st = [tcps::TIME_WAIT, tcps::TIME_WAIT];
        }
        Track::Loose
    } else {
        if st[0] == tcps::SYN_SENT && st[1] == tcps::SYN_SENT {
            // A mismatch during the handshake: forget this side's window (pf also sends a RST).
            p[si].seqlo = 0;
            p[si].seqhi = 1;
            p[si].max_win = 1;
        }
        Track::Bad
    }
}

/// Whether sequence number `seq`, quoted by an ICMP error, lies in the window of side `from`
/// (the quoted segment's sender): pf's check in pf_test_state_icmp.
/// Under `modulate state` the quote may carry the number before or after the rewrite,
/// depending on which side of the firewall answered.
pub fn quoted_seq_ok(p: &[Peer; 2], from: usize, seq: u32) -> bool {
    let (s, d) = (&p[from], &p[1 - from]);
    let dws = if s.wscale != 0 && d.wscale != 0 { d.wscale & WSCALE_MASK } else { 0 };
    let ok = |seq: u32| seq_geq(s.seqhi, seq) && seq_geq(seq, s.seqlo.wrapping_sub((d.max_win as u32) << dws));
    ok(seq) || (s.seqdiff != 0 && ok(seq.wrapping_sub(s.seqdiff)))
}

/// A random non-zero offset that turns `seq` into a random initial sequence number (pf's
/// `arc4random() - seq`), from the worker's ChaCha20 keyed with getrandom's bytes.
pub fn new_seqdiff(rng: &mut rand_chacha::ChaCha20Rng, seq: u32) -> u32 {
    use rand_core::Rng;
    loop {
        let d = rng.next_u32().wrapping_sub(seq);
        if d != 0 {
            return d;
        }
    }
}

/// Rewrites TCP segment `frame` (Ethernet) for `modulate state`: SEQ + `seq_add`, and, on an
/// ACK, ACK and the SACK blocks - `ack_sub`, the checksum updated. False if it is not a
/// TCP segment it can rewrite.
pub fn apply_modulation(frame: &mut [u8], seq_add: u32, ack_sub: u32) -> bool {
    let mut pd = PDesc::default();
    if xpf_wire::parse_ether(frame, &mut pd).is_err() || pd.proto != IPPROTO_TCP || pd.flags & pdf::HAS_PORTS == 0 {
        return false;
    }
    let t = pd.l4_off as usize;
    let Some(h) = frame.get_mut(t..) else { return false };
    let hl = ((h[12] >> 4) as usize * 4).min(h.len());
    let mut ck = u16::from_be_bytes([h[16], h[17]]);
    let mut shift = |h: &mut [u8], at: usize, by: u32, add: bool| {
        let old = u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let new = if add { old.wrapping_add(by) } else { old.wrapping_sub(by) };
        h[at..at + 4].copy_from_slice(&new.to_be_bytes());
        ck = xpf_wire::checksum::update32(ck, old, new);
    };
    if seq_add != 0 {
        shift(h, 4, seq_add, true);
    }
    if ack_sub != 0 && pd.tcp_flags & tcp::ACK != 0 {
        shift(h, 8, ack_sub, false);
        // SACK blocks (kind 5) acknowledge in the same numbering (pf_modulate_sack).
        let mut o = 20;
        while o < hl {
            match h[o] {
                0 => break,
                1 => o += 1,
                kind => {
                    let len = h.get(o + 1).copied().unwrap_or(0) as usize;
                    if len < 2 || o + len > hl {
                        break;
                    }
                    if kind == 5 {
                        let mut b = o + 2;
                        while b + 8 <= o + len {
                            shift(h, b, ack_sub, false);
                            shift(h, b + 4, ack_sub, false);
                            b += 8;
                        }
                    }
                    o += len;
                }
            }
        }
    }
    h[16..18].copy_from_slice(&ck.to_be_bytes());
    true
}

/// Whether pf_normalize_tcp leaves TCP segment `pd` as it is without a closer look
/// ([`tcp_normal`]): a clean header on an ACK without SYN, a plain SYN, or a SYN-ACK without
/// FIN or RST. The per-packet test; `tcp_normal` is out of line for the rest.
#[inline(always)]
pub fn tcp_plain(pd: &PDesc) -> bool {
    use tcp::{ACK, FIN, PSH, RST, SYN, URG};
    let f = pd.tcp_flags;
    pd.flags & pdf::TCP_UNCLEAN == 0
        && (f & (SYN | ACK) == ACK
            || f & (SYN | ACK | RST | FIN | PSH | URG) == SYN
            || f & (SYN | ACK | RST | FIN) == SYN | ACK)
}

/// pf_normalize_tcp's judgement of a TCP segment `pd`, which pf makes of every segment before
/// its state or rules see it: None for one no TCP sends (SYN with RST; neither SYN, ACK nor
/// RST; FIN, PSH or URG without ACK): dropped, `normalize`. Otherwise whether its header
/// needs cleaning before it goes on: a SYN's FIN is taken off (here in `pd` too, so that
/// the rules and the state see the SYN pf sees), and reserved bits and an urgent pointer
/// without URG are zeroed ([`apply_scrub`] with [`crate::Scrub::tcp_clean`]).
#[cold]
#[inline(never)]
pub fn tcp_normal(pd: &mut PDesc) -> Option<bool> {
    let mut f = pd.tcp_flags;
    if f & tcp::SYN != 0 {
        if f & tcp::RST != 0 {
            return None;
        }
        f &= !tcp::FIN;
    } else if f & (tcp::ACK | tcp::RST) == 0 {
        return None;
    }
    if f & tcp::ACK == 0 && f & (tcp::FIN | tcp::PSH | tcp::URG) != 0 {
        return None;
    }
    let unclean = f != pd.tcp_flags || pd.flags & pdf::TCP_UNCLEAN != 0;
    pd.tcp_flags = f;
    Some(unclean)
}

/// Applies scrub actions `s` to `frame` (Ethernet), as pf_scrub and pf_normalize_mss do:
/// IPv4 don't-fragment cleared, a random identification on an unfragmented packet, the TTL
/// (hop limit) raised to `min_ttl`, the TOS (traffic class) set with its ECN bits kept, and a
/// TCP SYN's MSS option lowered to `max_mss`; checksums updated incrementally (RFC 1624).
pub fn apply_scrub(frame: &mut [u8], s: &crate::Scrub) -> bool {
    use xpf_wire::checksum::update16;
    let mut pd = PDesc::default();
    if xpf_wire::parse_ether(frame, &mut pd).is_err() {
        return false;
    }
    let l3 = pd.l3_off as usize;
    let word = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    if pd.af == xpf_wire::pdesc::AF_INET {
        let mut ck = word(frame, l3 + 10);
        let mut set = |f: &mut [u8], at: usize, new: u16| {
            let old = word(f, at);
            f[at..at + 2].copy_from_slice(&new.to_be_bytes());
            ck = update16(ck, old, new);
        };
        let off = word(frame, l3 + 6);
        if s.no_df && off & 0x4000 != 0 {
            set(frame, l3 + 6, off & !0x4000);
        }
        if s.random_id && word(frame, l3 + 6) & !0x4000 == 0 {
            set(frame, l3 + 4, s.id);
        }
        let (ttl, tos) = (frame[l3 + 8], frame[l3 + 1]);
        if s.min_ttl != 0 && ttl < s.min_ttl {
            set(frame, l3 + 8, u16::from_be_bytes([s.min_ttl, frame[l3 + 9]]));
        }
        if let Some(t) = s.set_tos {
            set(frame, l3, u16::from_be_bytes([frame[l3], (t & !0x03) | (tos & 0x03)]));
        }
        frame[l3 + 10..l3 + 12].copy_from_slice(&ck.to_be_bytes());
    } else {
        if s.min_ttl != 0 && frame[l3 + 7] < s.min_ttl {
            frame[l3 + 7] = s.min_ttl;
        }
        if let Some(t) = s.set_tos {
            // Traffic class: the low 4 bits of byte 0 and the high 4 of byte 1.
            let tc = (t & !0x03) | (((frame[l3] & 0x0f) << 4 | frame[l3 + 1] >> 4) & 0x03);
            frame[l3] = (frame[l3] & 0xf0) | tc >> 4;
            frame[l3 + 1] = (frame[l3 + 1] & 0x0f) | tc << 4;
        }
    }
    if s.tcp_clean && pd.proto == IPPROTO_TCP && pd.flags & pdf::HAS_PORTS != 0 {
        // pf_normalize_tcp: the data offset's reserved bits and a SYN's FIN cleared (one
        // 16-bit word with the flags), the urgent pointer zeroed without URG.
        let t = pd.l4_off as usize;
        let mut ck = word(frame, t + 16);
        let old = word(frame, t + 12);
        let flags = if old & tcp::SYN as u16 != 0 { old as u8 & !tcp::FIN } else { old as u8 };
        let new = u16::from_be_bytes([frame[t + 12] & 0xf0, flags]);
        if new != old {
            frame[t + 12..t + 14].copy_from_slice(&new.to_be_bytes());
            ck = update16(ck, old, new);
        }
        let urp = word(frame, t + 18);
        if flags & tcp::URG == 0 && urp != 0 {
            frame[t + 18..t + 20].copy_from_slice(&[0, 0]);
            ck = update16(ck, urp, 0);
        }
        frame[t + 16..t + 18].copy_from_slice(&ck.to_be_bytes());
    }
    if s.max_mss != 0 && pd.proto == IPPROTO_TCP && pd.tcp_flags & tcp::SYN != 0 && pd.flags & pdf::HAS_PORTS != 0 {
        let t = pd.l4_off as usize;
        let hl = ((frame[t + 12] >> 4) as usize * 4).min(frame.len() - t);
        let mut o = 20;
        while o < hl {
            match frame[t + o] {
                0 => break,
                1 => o += 1,
                kind => {
                    let len = frame.get(t + o + 1).copied().unwrap_or(0) as usize;
                    if len < 2 || o + len > hl {
                        break;
                    }
                    if kind == 2 && len == 4 {
                        let mss = word(frame, t + o + 2);
                        if mss > s.max_mss {
                            frame[t + o + 2..t + o + 4].copy_from_slice(&s.max_mss.to_be_bytes());
                            let ck = update16(word(frame, t + 16), mss, s.max_mss);
                            frame[t + 16..t + 18].copy_from_slice(&ck.to_be_bytes());
                        }
                    }
                    o += len;
                }
            }
        }
    }
    true
}

/// The window updates both of pf's accepting branches make.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn slide(p: &mut [Peer; 2], si: usize, di: usize, win: u32, sws: u8, end: u32, ack: u32, ack_known: bool) {
    if (p[si].max_win as u32) < win {
        p[si].max_win = win.min(u16::MAX as u32) as u16;
    }
    if seq_gt(end, p[si].seqlo) {
        p[si].seqlo = end;
    }
    let w = win << sws;
    if ack_known && seq_geq(ack.wrapping_add(w), p[di].seqhi) {
        p[di].seqhi = ack.wrapping_add(w.max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_single_then_multiple() {
        let mut st = [SINGLE, NO_TRAFFIC];
        assert_eq!(on_packet(IPPROTO_UDP, 0, 0, &mut st), Timeout::UdpSingle);
        assert_eq!(st, [SINGLE, NO_TRAFFIC]);
        assert_eq!(on_packet(IPPROTO_UDP, 0, 1, &mut st), Timeout::UdpSingle);
        assert_eq!(st, [MULTIPLE, SINGLE]);
        assert_eq!(on_packet(IPPROTO_UDP, 0, 0, &mut st), Timeout::UdpMultiple);
        assert_eq!(st, [MULTIPLE, MULTIPLE]);
    }

    #[test]
    fn tcp_handshake_and_teardown_by_flags() {
        let mut st = [tcps::SYN_SENT, tcps::CLOSED];
        assert_eq!(on_packet(IPPROTO_TCP, tcp::SYN | tcp::ACK, 1, &mut st), Timeout::TcpOpening);
        assert_eq!(st, [tcps::ESTABLISHED, tcps::SYN_SENT]);
        assert_eq!(on_packet(IPPROTO_TCP, tcp::ACK, 0, &mut st), Timeout::TcpEstablished);
        assert_eq!(st, [tcps::ESTABLISHED, tcps::ESTABLISHED]);
        assert_eq!(on_packet(IPPROTO_TCP, tcp::FIN | tcp::ACK, 0, &mut st), Timeout::TcpClosing);
        assert_eq!(st, [tcps::CLOSING, tcps::ESTABLISHED]);
        on_packet(IPPROTO_TCP, tcp::FIN | tcp::ACK, 1, &mut st);
        assert_eq!(on_packet(IPPROTO_TCP, tcp::ACK, 0, &mut st), Timeout::TcpClosed);
        assert_eq!(st, [tcps::FIN_WAIT_2, tcps::FIN_WAIT_2]);
        assert_eq!(on_packet(IPPROTO_TCP, tcp::RST, 0, &mut st), Timeout::TcpClosed);
        assert_eq!(st, [tcps::TIME_WAIT, tcps::TIME_WAIT]);
    }

    #[test]
    fn only_bare_syn_creates_tcp_state() {
        let mut pd = PDesc { proto: IPPROTO_TCP, tcp_flags: tcp::SYN, ..Default::default() };
        assert!(may_create(&pd, false));
        pd.tcp_flags = tcp::SYN | tcp::ACK;
        assert!(!may_create(&pd, false));
        pd.tcp_flags = tcp::ACK;
        assert!(!may_create(&pd, false));
        assert!(may_create(&pd, true), "flags any picks up a stream");
        pd.tcp_flags = tcp::RST | tcp::ACK;
        assert!(!may_create(&pd, true), "but never from a RST");
        pd.proto = IPPROTO_UDP;
        assert!(may_create(&pd, false));
    }
}
