//! Per-protocol state keeping: the initial peer states and timeout of a new state, and the
//! update on each packet. UDP, ICMP and other protocols follow pf (`pf_test_state`); TCP
//! creates states on SYN only (pf's default `flags S/SA`) and follows the handshake and
//! teardown by flags. Sequence-window checks (pf's `pf_tcp_track_full`) are the protocol
//! issue's work and plug in at [`on_packet`].

use xpf_state::{Peer, Timeout};
use xpf_wire::pdesc::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};
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
    pub const NAMES: [&str; 11] = [
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
    ];
}

/// Whether a packet that matched a keep-state rule may create a state (`flags S/SA` for TCP).
#[inline]
pub fn may_create(pd: &PDesc) -> bool {
    pd.proto != IPPROTO_TCP || pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
}

/// Initial (timeout, src state, dst state, TCP peers) of a state created by `pd`.
#[inline]
pub fn initial(pd: &PDesc) -> (Timeout, u8, u8, Option<[Peer; 2]>) {
    match pd.proto {
        IPPROTO_TCP => {
            let src = Peer {
                seqlo: pd.tcp_seq,
                seqhi: pd.tcp_seq.wrapping_add(1).wrapping_add(pd.payload_len as u32),
                max_win: pd.tcp_win.max(1),
                ..Peer::default()
            };
            (Timeout::TcpFirst, tcps::SYN_SENT, tcps::CLOSED, Some([src, Peer::default()]))
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
        assert!(may_create(&pd));
        pd.tcp_flags = tcp::SYN | tcp::ACK;
        assert!(!may_create(&pd));
        pd.tcp_flags = tcp::ACK;
        assert!(!may_create(&pd));
        pd.proto = IPPROTO_UDP;
        assert!(may_create(&pd));
    }
}
