//! `synproxy state` (pf_synproxy): the firewall completes the handshake with the client
//! before the server hears of it, then opens the server side and splices the two sequence
//! spaces. A SYN flood therefore reaches no server: the flood's sources never answer the
//! firewall's SYN|ACK, and their states time out at `tcp.first`.
//!
//! The state (the `in` state of the client's SYN) goes PROXY_SRC -> PROXY_DST -> ESTABLISHED:
//! 1. Client's SYN (the miss that creates the state): answered with a SYN|ACK from pf's own
//!    initial number (`p[0].seqhi`), MSS as the client offered (at most 1460/1440); dropped.
//! 2. Client's ACK of it: becomes a SYN towards the server from a second random number
//!    (`p[1].seqhi`) and goes on in the frame's place, through the `out` rules as pf's own
//!    SYN does (so the `out` state is made).
//! 3. Server's SYN|ACK (met by the state the other way): an ACK goes back to the server,
//!    and the SYN|ACK goes on as the ACK that completes the client's view. The state is then
//!    ESTABLISHED with each side's seqdiff set, so `modulate state`'s rewrite translates
//!    every later segment between the two numberings; window scaling is off (neither SYN
//!    the firewall sent offered it), as in pf.
//!
//! Anything else in the PROXY states is dropped as `synproxy`. The engine records what to
//! send here ([`Proxy`]); [`emit`] builds the segments after the batch, from the frames.

use crate::proto::tcps;
use crate::reply::{segment, tcp_mss, Segment};
use crate::Verdict;
use rand_chacha::ChaCha20Rng;
use rand_core::Rng;
use xpf_state::Peer;
use xpf_wire::pdesc::AF_INET;
use xpf_wire::{tcp, PDesc, Reason};

pub const PROXY_SRC: u8 = tcps::TIME_WAIT + 1;
pub const PROXY_DST: u8 = tcps::TIME_WAIT + 2;

/// What a packet of a proxied handshake makes the filter send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// Step 1: the SYN|ACK to the client (`seq` pf's number, `ack` the client's + 1); the
    /// state's MSS is taken from the SYN when it is built.
    SynAck { seq: u32, ack: u32, mss: u16 },
    /// Step 2: the frame goes on as the SYN to the server.
    Syn { seq: u32, mss: u16 },
    /// Step 3: the ACK back to the server, and the frame goes on as the client's ACK.
    Done { server: (u32, u32, u16), client: (u32, u32, u16) },
    /// `set syncookies`: a SYN|ACK to the client whose number is a cookie, for a SYN that
    /// made no state (the cookie is computed where the SYN's options are at hand, and this
    /// becomes a `SynAck`).
    Cookie,
}

/// The MSS the firewall announces for a client that offered `mss` (RFC 9293 3.7.1's default
/// when it offered none), at most what an Ethernet MTU carries.
pub fn mss_for(offered: Option<u16>, af: u8) -> u16 {
    let max = if af == AF_INET { 1460 } else { 1440 };
    offered.unwrap_or(if af == AF_INET { 536 } else { 1220 }).clamp(64, max)
}

/// A state made by the ACK `ack` that proved a syncookie announcing `mss`: the handshake
/// with the client is done (the filter's number was the cookie, `ack - 1`), the one with the
/// server is next (PROXY_DST; [`step`] with `ack` sends the SYN).
pub fn proven(p: &mut [Peer; 2], st: &mut [u8; 2], ack: &PDesc, mss: u16) {
    st[0] = PROXY_DST;
    p[0].seqhi = ack.tcp_ack.wrapping_sub(1);
    p[0].seqlo = ack.tcp_seq.wrapping_sub(1);
    p[0].mss = mss;
    p[0].wscale = 0;
}

/// A segment of a state still in PROXY_SRC or PROXY_DST (`st[0]`), from side `from` (0: the
/// client). The verdict, and what to send.
pub fn step(
    p: &mut [Peer; 2],
    st: &mut [u8; 2],
    pd: &PDesc,
    from: usize,
    rng: &mut ChaCha20Rng,
) -> (Verdict, Option<Proxy>) {
    let drop = (Verdict::Drop(Reason::Synproxy), None);
    let flags = pd.tcp_flags;
    if st[0] == PROXY_SRC {
        if from != 0 {
            return drop;
        }
        if flags & tcp::SYN != 0 {
            // A retransmitted SYN gets the same SYN|ACK again.
            if pd.tcp_seq != p[0].seqlo {
                return drop;
            }
            let a = Proxy::SynAck { seq: p[0].seqhi, ack: pd.tcp_seq.wrapping_add(1), mss: p[0].mss };
            return (Verdict::Drop(Reason::Synproxy), Some(a));
        }
        if flags & (tcp::ACK | tcp::RST | tcp::FIN) != tcp::ACK
            || pd.tcp_ack != p[0].seqhi.wrapping_add(1)
            || pd.tcp_seq != p[0].seqlo.wrapping_add(1)
        {
            return drop;
        }
        st[0] = PROXY_DST;
    }
    if from == 0 {
        if flags & (tcp::SYN | tcp::ACK) != tcp::ACK
            || pd.tcp_ack != p[0].seqhi.wrapping_add(1)
            || pd.tcp_seq != p[0].seqlo.wrapping_add(1)
        {
            return drop;
        }
        p[0].max_win = pd.tcp_win.max(1);
        if p[1].seqhi == 1 {
            p[1].seqhi = rng.next_u32();
        }
        return (Verdict::Pass, Some(Proxy::Syn { seq: p[1].seqhi, mss: p[0].mss }));
    }
    if flags & (tcp::SYN | tcp::ACK) != tcp::SYN | tcp::ACK || pd.tcp_ack != p[1].seqhi.wrapping_add(1) {
        return drop;
    }
    p[1].max_win = pd.tcp_win.max(1);
    p[1].seqlo = pd.tcp_seq;
    let done = Proxy::Done {
        server: (pd.tcp_ack, pd.tcp_seq.wrapping_add(1), p[0].max_win),
        client: (p[0].seqhi.wrapping_add(1), p[0].seqlo.wrapping_add(1), p[1].max_win),
    };
    // From here each side is tracked in its own numbering, the other's acknowledgements
    // translated by the seqdiffs (as under modulate state).
    p[0].seqdiff = p[1].seqhi.wrapping_sub(p[0].seqlo);
    p[1].seqdiff = p[0].seqhi.wrapping_sub(p[1].seqlo);
    p[0].seqhi = p[0].seqlo.wrapping_add(p[1].max_win as u32);
    p[1].seqhi = p[1].seqlo.wrapping_add(p[0].max_win as u32);
    p[0].wscale = 0;
    p[1].wscale = 0;
    *st = [tcps::ESTABLISHED, tcps::ESTABLISHED];
    (Verdict::Pass, Some(done))
}

/// Builds what `a` sends for `frame`: answers (back out of the interface the frame came in
/// on) into `answers`, and the segment the frame goes on as into `instead`. False when the
/// frame cannot carry them (not TCP).
pub fn emit(frame: &[u8], pd: &PDesc, a: &Proxy, answers: &mut Vec<u8>, instead: &mut Vec<u8>) -> (bool, bool) {
    let (flags_sa, ack) = (tcp::SYN | tcp::ACK, tcp::ACK);
    match *a {
        Proxy::SynAck { seq, ack: a, mss } => {
            let s = Segment { back: true, ttl: 64, seq, ack: a, flags: flags_sa, win: 0, mss: Some(mss) };
            (segment(frame, pd, &s, answers), false)
        }
        Proxy::Syn { seq, mss } => {
            let s = Segment { back: false, ttl: pd.ttl, seq, ack: 0, flags: tcp::SYN, win: 0, mss: Some(mss) };
            (false, segment(frame, pd, &s, instead))
        }
        Proxy::Done { server, client } => {
            let to_server =
                Segment { back: true, ttl: 64, seq: server.0, ack: server.1, flags: ack, win: server.2, mss: None };
            let to_client = Segment {
                back: false,
                ttl: pd.ttl,
                seq: client.0,
                ack: client.1,
                flags: ack,
                win: client.2,
                mss: None,
            };
            (segment(frame, pd, &to_server, answers), segment(frame, pd, &to_client, instead))
        }
        Proxy::Cookie => (false, false),
    }
}

/// The MSS a client's SYN offers (the proxy's SYN|ACK states it back).
pub fn offered_mss(frame: &[u8], pd: &PDesc) -> u16 {
    mss_for(tcp_mss(frame, pd), pd.af)
}
