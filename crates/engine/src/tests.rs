//! Engine tests on crafted frames: verdicts, state creation, counters and drop reasons.

use super::*;
use xpf_state::Timeout;
use xpf_wire::{ipv4, tcp, udp};

fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], src, dst, 17, 46, 64, 1);
    udp::emit_header(&mut f[34..], sport, dport, 26);
    f
}

fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut f = vec![0u8; 54];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], src, dst, 6, 40, 64, 1);
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[46] = 0x50;
    f[47] = flags;
    f[48..50].copy_from_slice(&65535u16.to_be_bytes());
    f
}

fn worker<P: Policy>(p: P, limit: u32) -> Worker<P> {
    Worker::new(
        WorkerConfig { limit, rows: None, seed: Seed::fixed(9), events: 0, now: 0, prefault: false, secret: [7; 32] },
        p,
    )
    .unwrap()
}

fn run<P: Policy>(w: &mut Worker<P>, frames: &[Vec<u8>], dir: Dir, now: u32) -> Vec<Verdict> {
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let mut v = vec![Verdict::Pass; refs.len()];
    for (c, vc) in refs.chunks(BATCH).zip(v.chunks_mut(BATCH)) {
        w.process(c, 1, dir, now, vc);
    }
    v
}

#[test]
fn keep_state_lets_replies_back_through_block_policy() {
    // Out: pass keep state; in: block. The reply passes by state only.
    let p = |_: &PDesc, _: u16, d: Dir| Decision {
        action: if d == Dir::Out { Action::Pass } else { Action::Block },
        rule: 3,
        ..Decision::PASS
    };
    let mut w = worker(p, 1000);
    let out = udp4([10, 0, 0, 1], [8, 8, 8, 8], 5353, 53);
    assert_eq!(run(&mut w, &[out], Dir::Out, 1), vec![Verdict::Pass]);
    assert_eq!(w.states(), 1);
    let reply = udp4([8, 8, 8, 8], [10, 0, 0, 1], 53, 5353);
    let unsolicited = udp4([8, 8, 8, 8], [10, 0, 0, 1], 53, 5354);
    let v = run(&mut w, &[reply, unsolicited], Dir::In, 2);
    assert_eq!(v, vec![Verdict::Pass, Verdict::Drop(Reason::Match)]);
    let (id, s) = w.t4.iter().next().unwrap();
    assert_eq!(s.packets, [1, 1]);
    assert_eq!(w.t4.meta(id).rule, 3);
    assert_eq!((s.peer_state[0], s.peer_state[1]), (proto::MULTIPLE, proto::SINGLE));
    assert_eq!(s.class(), Timeout::UdpSingle);
    assert_eq!(id, 0);
    assert_eq!(w.stats.reasons[Reason::Match as usize], 1);
    assert_eq!((w.stats.packets, w.stats.passed, w.stats.dropped), (3, 2, 1));
    // pfctl -si: match counts both rule decisions (the outbound pass and the inbound block);
    // the reply passed by state is a search, not a match.
    let info = crate::info::Info::of(&w);
    assert_eq!(info.counter(Reason::Match), 2);
    assert_eq!((info.states, info.inserts, info.searches), (1, 1, 3));
    let text = info.render(10);
    assert!(text.contains("  current entries                        1\n"), "{text}");
    assert!(text.contains("  searches                               3            0.3/s\n"), "{text}");
    assert!(text.contains("  match                                  2            0.2/s\n"), "{text}");
    assert!(text.starts_with("Status: Enabled for 0 days 00:00:10"), "{text}");
}

#[test]
fn same_flow_twice_in_one_batch_makes_one_state() {
    let mut w = worker(PassAll, 1000);
    let f = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
    let v = run(&mut w, &[f.clone(), f.clone(), f], Dir::In, 0);
    assert_eq!(v, vec![Verdict::Pass; 3]);
    assert_eq!(w.states(), 1);
    assert_eq!(w.t4.counters.insert_exists, 0);
    assert_eq!(w.t4.iter().next().unwrap().1.packets[0], 3);
}

#[test]
fn state_limit_drops_are_counted_and_keep_existing_states() {
    let mut w = worker(PassAll, 2);
    let fs: Vec<Vec<u8>> = (0..4).map(|i| udp4([1, 1, 1, i], [2, 2, 2, 2], 1, 2)).collect();
    let v = run(&mut w, &fs, Dir::In, 0);
    assert_eq!(v[..2], [Verdict::Pass, Verdict::Pass]);
    assert_eq!(v[2..], [Verdict::Drop(Reason::StateLimit), Verdict::Drop(Reason::StateLimit)]);
    assert_eq!(w.states(), 2);
    assert_eq!(w.stats.reasons[Reason::StateLimit as usize], 2);
    // the first two still pass by state
    assert_eq!(run(&mut w, &fs[..2], Dir::In, 1), vec![Verdict::Pass; 2]);
}

#[test]
fn malformed_and_non_ip_frames() {
    let mut w = worker(PassAll, 10);
    let mut bad_ck = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
    bad_ck[24] ^= 1;
    let mut short = vec![0u8; 20];
    short[12] = 0x08; // IPv4 ethertype, header cut short
    let mut arp = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let v = run(&mut w, &[bad_ck, short, arp], Dir::In, 0);
    assert_eq!(v, vec![Verdict::Drop(Reason::BadIpChecksum), Verdict::Drop(Reason::Short), Verdict::Host]);
    assert_eq!(w.states(), 0);
    assert_eq!(w.stats.to_host, 1);
}

#[test]
fn tcp_state_only_from_syn() {
    let mut w = worker(PassAll, 10);
    let ack = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1000, 80, tcp::ACK);
    run(&mut w, &[ack], Dir::In, 0);
    assert_eq!(w.states(), 0);
    let syn = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1000, 80, tcp::SYN);
    let synack = tcp4([2, 2, 2, 2], [1, 1, 1, 1], 80, 1000, tcp::SYN | tcp::ACK);
    let ack = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1000, 80, tcp::ACK);
    run(&mut w, &[syn], Dir::In, 0);
    run(&mut w, &[synack], Dir::Out, 0);
    run(&mut w, &[ack], Dir::In, 0);
    let (id, s) = w.t4.iter().next().map(|(i, s)| (i, *s)).unwrap();
    assert_eq!((s.peer_state[0], s.peer_state[1]), (proto::tcps::ESTABLISHED, proto::tcps::ESTABLISHED));
    assert!(w.t4.peers(id).is_some());
}

#[test]
fn states_expire_through_maintain() {
    let mut w = worker(PassAll, 10);
    run(&mut w, &[udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)], Dir::In, 0);
    assert_eq!(w.maintain(59, 1000), 0);
    assert_eq!(w.maintain(60, 1000), 1); // udp.first
    assert_eq!(w.states(), 0);
}

#[test]
fn ip_options_need_allow_opts_on_rule_and_state() {
    let mut f = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
    // Insert a 4-byte router-alert option: header length 24.
    f.splice(34..34, [0x94, 0x04, 0x00, 0x00]);
    f[14] = 0x46;
    f[16..18].copy_from_slice(&50u16.to_be_bytes());
    ipv4::Packet::new_checked(&mut f[14..]).unwrap().fill_checksum();
    let plain = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
    let mut w = worker(PassAll, 10);
    assert_eq!(run(&mut w, &[f.clone()], Dir::In, 0), vec![Verdict::Drop(Reason::IpOption)]);
    assert_eq!(w.states(), 0);
    // A state made without allow-opts does not let options through either.
    run(&mut w, std::slice::from_ref(&plain), Dir::In, 0);
    assert_eq!(run(&mut w, &[f.clone()], Dir::In, 0), vec![Verdict::Drop(Reason::IpOption)]);
    let mut w = worker(|_: &PDesc, _: u16, _: Dir| Decision { allow_opts: true, ..Decision::PASS }, 10);
    assert_eq!(run(&mut w, &[f.clone(), plain], Dir::In, 0), vec![Verdict::Pass, Verdict::Pass]);
    assert_eq!(w.stats.reasons[Reason::IpOption as usize], 0);
}

proptest::proptest! {
    /// Random bytes and damaged real frames through the whole worker path: a verdict for every
    /// frame, counters that add up, and no panic (the libFuzzer target does the same at length).
    #[test]
    fn any_bytes_get_a_verdict(frames in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120usize), 1..64usize), flip in proptest::prelude::any::<(usize, u8)>()) {
        let mut frames = frames;
        // Half the batch starts from a valid frame with one byte changed.
        for (i, f) in frames.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
            let mut g = if i % 4 == 0 { udp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2) } else { tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, tcp::SYN) };
            let at = flip.0 % g.len();
            g[at] ^= flip.1;
            *f = g;
        }
        let mut w = worker(PassAll, 16);
        let v = run(&mut w, &frames, Dir::In, 0);
        proptest::prop_assert_eq!(v.len(), frames.len());
        let s = w.stats;
        proptest::prop_assert_eq!(s.passed + s.dropped + s.to_host, frames.len() as u64);
        proptest::prop_assert_eq!(s.reasons.iter().sum::<u64>(), s.dropped);
        w.maintain(10_000, 1000);
        proptest::prop_assert_eq!(w.states(), 0);
    }
}

/// A TCP segment with sequence numbers, window, `len` bytes of data and, on SYNs, a window
/// scale option.
#[allow(clippy::too_many_arguments)]
fn seg(fwd: bool, flags: u8, seq: u32, ack: u32, win: u16, len: usize, wscale: Option<u8>) -> Vec<u8> {
    let (src, dst, sport, dport): ([u8; 4], [u8; 4], u16, u16) =
        if fwd { ([1, 1, 1, 1], [2, 2, 2, 2], 1000, 80) } else { ([2, 2, 2, 2], [1, 1, 1, 1], 80, 1000) };
    let opt = if wscale.is_some() { 4 } else { 0 };
    let tl = 20 + opt + len;
    let mut f = vec![0u8; 14 + 20 + tl];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], src, dst, 6, (20 + tl) as u16, 64, 1);
    let t = &mut f[34..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = (((20 + opt) / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&win.to_be_bytes());
    if let Some(w) = wscale {
        t[20..24].copy_from_slice(&[1, 3, 3, w]); // NOP, wscale
    }
    f
}

/// Client 1000 -> server 80 through a `pass keep state` worker: the handshake with window
/// scaling (shift 7 both ways), then a segment of data each way. Returns the worker.
fn established() -> Worker<PassAll> {
    let mut w = worker(PassAll, 10);
    let c = |w: &mut Worker<PassAll>, f: Vec<u8>, d| run(w, &[f], d, 1)[0];
    assert_eq!(c(&mut w, seg(true, tcp::SYN, 1000, 0, 65535, 0, Some(7)), Dir::In), Verdict::Pass);
    assert_eq!(c(&mut w, seg(false, tcp::SYN | tcp::ACK, 5000, 1001, 65535, 0, Some(7)), Dir::Out), Verdict::Pass);
    assert_eq!(c(&mut w, seg(true, tcp::ACK, 1001, 5001, 512, 0, None), Dir::In), Verdict::Pass);
    assert_eq!(c(&mut w, seg(true, tcp::ACK | tcp::PSH, 1001, 5001, 512, 1000, None), Dir::In), Verdict::Pass);
    assert_eq!(c(&mut w, seg(false, tcp::ACK, 5001, 2001, 512, 1400, None), Dir::Out), Verdict::Pass);
    w
}

fn peer_states(w: &Worker<PassAll>) -> (u8, u8) {
    let s = w.t4.iter().next().unwrap().1;
    (s.peer_state[0], s.peer_state[1])
}

#[test]
fn tcp_window_tracking_passes_a_real_connection() {
    let w = established();
    assert_eq!(peer_states(&w), (proto::tcps::ESTABLISHED, proto::tcps::ESTABLISHED));
    let (id, _) = w.t4.iter().next().unwrap();
    let p = w.t4.peers(id).unwrap();
    assert_eq!(p[0].wscale, 0x87, "client's window scale seen on its SYN");
    assert_eq!(p[1].wscale, 0x87);
    assert_eq!(p[0].seqlo, 2001, "client sent up to 2001");
    assert_eq!(p[1].seqlo, 6401, "server sent up to 6401");
}

#[test]
fn tcp_segments_outside_the_window_are_dropped_and_the_state_kept() {
    let mut w = established();
    let before = peer_states(&w);
    // Data 10 MB ahead of anything the server allowed (window 512 << 7 = 64 KB).
    let far = seg(true, tcp::ACK, 2001 + 10_000_000, 6401, 512, 100, None);
    assert_eq!(run(&mut w, &[far], Dir::In, 2)[0], Verdict::Drop(Reason::StateMismatch));
    // An ACK for data the server never sent.
    let ack_ahead = seg(true, tcp::ACK, 2001, 6401 + 10_000_000, 512, 0, None);
    assert_eq!(run(&mut w, &[ack_ahead], Dir::In, 2)[0], Verdict::Drop(Reason::StateMismatch));
    assert_eq!(w.t4.counters.window_drops, 2);
    assert_eq!(peer_states(&w), before);
    // The connection goes on.
    assert_eq!(run(&mut w, &[seg(true, tcp::ACK, 2001, 6401, 512, 500, None)], Dir::In, 3)[0], Verdict::Pass);
    // A retransmission of data already seen passes.
    assert_eq!(run(&mut w, &[seg(true, tcp::ACK, 1001, 6401, 512, 1000, None)], Dir::In, 3)[0], Verdict::Pass);
}

/// Sync's push of a busy TCP state: after `maxupdates` segments (pf's rule), a segment's
/// payload counting one more per 256 bytes (so that a standby's windows are never a window
/// behind: 32 KB at the default 128).
#[test]
fn a_busy_tcp_state_is_pushed_to_the_sync_peer_by_segments_or_by_payload() {
    let mut w = established();
    w.t4.sync_max = 128;
    let (id, _) = w.t4.iter().next().unwrap();
    // Server data: 1400 bytes a segment, 1 + 5 counts: the 22nd reaches 128 (30.8 KB).
    let mut seq = 6401u32;
    for i in 1..=22 {
        let d = seg(false, tcp::ACK, seq, 2001, 512, 1400, None);
        assert_eq!(run(&mut w, &[d], Dir::Out, 4)[0], Verdict::Pass);
        seq += 1400;
        assert_eq!(w.t4.sync_push, i == 22, "segment {i} of 1400 bytes");
    }
    // What the sync side does when it sends the state's update.
    w.t4.sync_push = false;
    w.t4.peers_mut(id).unwrap()[0].sync_upd = 0;
    // Bare acknowledgements carry nothing: pushed after maxupdates of them.
    for i in 1..=128 {
        let a = seg(true, tcp::ACK, 2001, seq, 512, 0, None);
        assert_eq!(run(&mut w, &[a], Dir::In, 5)[0], Verdict::Pass);
        assert_eq!(w.t4.sync_push, i == 128, "acknowledgement {i}");
    }
}

/// A retransmitted SYN must not give the responder a window before it has spoken: in pf it
/// does (sequence 0 + the SYN's window), and a SYN|ACK whose sequence lies where that window
/// no longer reaches is dropped, each time the SYN is retransmitted again.
#[test]
fn a_retransmitted_syn_does_not_spoil_the_responders_window() {
    let mut w = worker(PassAll, 10);
    let c = |w: &mut Worker<PassAll>, f: Vec<u8>, d| run(w, &[f], d, 1)[0];
    let syn = || seg(true, tcp::SYN, 3_692_496_667, 0, 64240, 0, Some(10));
    assert_eq!(c(&mut w, syn(), Dir::In), Verdict::Pass);
    assert_eq!(c(&mut w, syn(), Dir::In), Verdict::Pass, "the SYN again (its SYN|ACK was lost)");
    // 2^31 - 8.1M: inside the band 2^31 - 64240 << 10 .. 2^31 + 64240.
    let isn = 2_139_345_092;
    let synack = seg(false, tcp::SYN | tcp::ACK, isn, 3_692_496_668, 65160, 0, Some(10));
    assert_eq!(c(&mut w, synack, Dir::Out), Verdict::Pass);
    assert_eq!(c(&mut w, seg(true, tcp::ACK, 3_692_496_668, isn + 1, 63, 0, None), Dir::In), Verdict::Pass);
    assert_eq!(peer_states(&w), (proto::tcps::ESTABLISHED, proto::tcps::ESTABLISHED));
    assert_eq!(w.t4.counters.window_drops, 0);
}

#[test]
fn a_spoofed_rst_does_not_kill_the_state() {
    let mut w = established();
    // In the window but not at the expected sequence number: a blind RST guess.
    let spoof = seg(false, tcp::RST, 6401 + 3000, 0, 0, 0, None);
    assert_eq!(run(&mut w, &[spoof], Dir::Out, 2)[0], Verdict::Drop(Reason::StateMismatch));
    assert_eq!(peer_states(&w), (proto::tcps::ESTABLISHED, proto::tcps::ESTABLISHED));
    // The real one, at the server's next sequence number, closes it.
    let rst = seg(false, tcp::RST, 6401, 0, 0, 0, None);
    assert_eq!(run(&mut w, &[rst], Dir::Out, 2)[0], Verdict::Pass);
    assert_eq!(peer_states(&w), (proto::tcps::TIME_WAIT, proto::tcps::TIME_WAIT));
}

#[test]
fn teardown_then_a_new_syn_on_the_same_ports_makes_a_new_state() {
    let mut w = established();
    let c = |w: &mut Worker<PassAll>, f: Vec<u8>, d| run(w, &[f], d, 4)[0];
    assert_eq!(c(&mut w, seg(true, tcp::FIN | tcp::ACK, 2001, 6401, 512, 0, None), Dir::In), Verdict::Pass);
    assert_eq!(c(&mut w, seg(false, tcp::FIN | tcp::ACK, 6401, 2002, 512, 0, None), Dir::Out), Verdict::Pass);
    assert_eq!(c(&mut w, seg(true, tcp::ACK, 2002, 6402, 512, 0, None), Dir::In), Verdict::Pass);
    assert_eq!(peer_states(&w), (proto::tcps::FIN_WAIT_2, proto::tcps::FIN_WAIT_2));
    assert_eq!(w.t4.iter().next().unwrap().1.class(), Timeout::TcpClosed);
    // The client reuses its port with a new ISN: the closed state gives way to a new one.
    assert_eq!(c(&mut w, seg(true, tcp::SYN, 900_000, 0, 65535, 0, Some(7)), Dir::In), Verdict::Pass);
    assert_eq!(w.t4.counters.reused, 1);
    assert_eq!(w.states(), 1);
    assert_eq!(peer_states(&w), (proto::tcps::SYN_SENT, proto::tcps::CLOSED));
    assert_eq!(c(&mut w, seg(false, tcp::SYN | tcp::ACK, 77_000, 900_001, 65535, 0, Some(7)), Dir::Out), Verdict::Pass);
}

/// An ICMPv4 destination unreachable (port unreachable) from `from` to `to`, quoting `quoted`
/// (a frame with an Ethernet header): its IP header and 8 transport bytes.
fn unreach(from: [u8; 4], to: [u8; 4], quoted: &[u8]) -> Vec<u8> {
    let q = &quoted[14..14 + 28];
    let mut f = vec![0u8; 14 + 20 + 8 + 28];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], from, to, 1, (20 + 8 + 28) as u16, 64, 7);
    f[34] = 3; // destination unreachable
    f[35] = 3; // port unreachable
    f[42..].copy_from_slice(q);
    f
}

/// Out: pass keep state; in: block. Only what a state lets in passes.
fn outbound_only() -> Worker<impl Policy> {
    let p = |_: &PDesc, _: u16, d: Dir| Decision {
        action: if d == Dir::Out { Action::Pass } else { Action::Block },
        ..Decision::PASS
    };
    worker(p, 10)
}

#[test]
fn an_icmp_error_passes_with_the_state_of_the_packet_it_quotes() {
    let mut w = outbound_only();
    let out = udp4([10, 0, 0, 1], [192, 0, 2, 9], 5000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&out), Dir::Out, 1)[0], Verdict::Pass);
    // The server (or a router on the way) answers port unreachable, to the client.
    let err = unreach([192, 0, 2, 9], [10, 0, 0, 1], &out);
    assert_eq!(run(&mut w, &[err], Dir::In, 1)[0], Verdict::Pass);
    let err = unreach([198, 51, 100, 1], [10, 0, 0, 1], &out);
    assert_eq!(run(&mut w, &[err], Dir::In, 1)[0], Verdict::Pass, "from a router on the path");
}

#[test]
fn an_icmp_error_quoting_no_state_is_left_to_the_rules() {
    let mut w = outbound_only();
    let never_sent = udp4([10, 0, 0, 1], [192, 0, 2, 9], 5000, 53);
    let err = unreach([192, 0, 2, 9], [10, 0, 0, 1], &never_sent);
    assert_eq!(run(&mut w, std::slice::from_ref(&err), Dir::In, 1)[0], Verdict::Drop(Reason::Match));
    assert_eq!(w.batch().logged, 0, "no rule logs");
    // A logging rule that blocks it marks it for pflog, as any packet it decides.
    let p = |_: &PDesc, _: u16, _: Dir| Decision { action: Action::Block, rule: 4, log: 1, ..Decision::PASS };
    let mut w = worker(p, 10);
    assert_eq!(run(&mut w, &[err], Dir::In, 1)[0], Verdict::Drop(Reason::Match));
    let l = w.batch().logs[0];
    assert_eq!((w.batch().logged, l.rule, l.dir), (1, 4, 1));
}

#[test]
fn an_icmp_error_to_someone_else_does_not_ride_a_state() {
    // FreeBSD CVE-2019-5598: the quoted packet matches a state, but the error is addressed to
    // another host behind the firewall.
    let mut w = outbound_only();
    let out = udp4([10, 0, 0, 1], [192, 0, 2, 9], 5000, 53);
    run(&mut w, std::slice::from_ref(&out), Dir::Out, 1);
    let spoof = unreach([192, 0, 2, 9], [10, 0, 0, 77], &out);
    assert_eq!(run(&mut w, &[spoof], Dir::In, 1)[0], Verdict::Drop(Reason::StateMismatch));
    assert_eq!(w.t4.counters.icmp_mismatch, 1);
}

#[test]
fn an_icmp_type_neither_query_nor_error_keeps_a_state_for_its_own_direction() {
    // pf_icmp_mapping: every other type gets its own state, keyed by the type, which a
    // packet of the same type the other way does not match.
    let icmp = |src: [u8; 4], dst: [u8; 4], t: u8| {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12] = 0x08;
        ipv4::emit_header(&mut f[14..], src, dst, 1, 28, 64, 1);
        xpf_wire::icmp::emit_header(&mut f[34..], t, 0, 0);
        f
    };
    let mut w = outbound_only();
    let (a, b) = ([10, 0, 0, 1], [192, 0, 2, 9]);
    assert_eq!(run(&mut w, &[icmp(a, b, 42)], Dir::Out, 1)[0], Verdict::Pass);
    assert_eq!(w.states(), 1);
    let v = run(&mut w, &[icmp(b, a, 42), icmp(b, a, 43)], Dir::In, 2);
    assert_eq!(v, [Verdict::Drop(Reason::Match); 2], "the same type back, and another type");
    assert_eq!(run(&mut w, &[icmp(a, b, 42)], Dir::Out, 3)[0], Verdict::Pass);
    assert_eq!(w.states(), 1, "its own direction again: the state's");
}

/// An ICMPv6 neighbour solicitation (`adv` false) or advertisement from `src` to `dst` about
/// `target`, with hop limit `hlim`.
fn nd6(adv: bool, src: [u8; 16], dst: [u8; 16], target: [u8; 16], hlim: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40 + 24];
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    xpf_wire::ipv6::emit_header(&mut f[14..], &src, &dst, 58, 24, hlim);
    xpf_wire::icmp::emit_header(&mut f[54..], if adv { 136 } else { 135 }, 0, if adv { 0x6000_0000 } else { 0 });
    f[62..78].copy_from_slice(&target);
    f
}

/// fd00:2::N
fn v6(n: u8) -> [u8; 16] {
    [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n]
}

/// ff02::1:ffXX:XXXX, the solicited-node multicast address of `a`.
fn solicited(a: [u8; 16]) -> [u8; 16] {
    [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, a[13], a[14], a[15]]
}

/// An ICMPv6 echo request (or reply) from `src` to `dst` with identifier `id`.
fn echo6(src: [u8; 16], dst: [u8; 16], id: u16, reply: bool) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40 + 8];
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    xpf_wire::ipv6::emit_header(&mut f[14..], &src, &dst, 58, 8, 64);
    let t = if reply { xpf_wire::icmp::V6_ECHO_REPLY } else { xpf_wire::icmp::V6_ECHO_REQUEST };
    xpf_wire::icmp::emit_header(&mut f[54..], t, 0, (id as u32) << 16 | 1);
    f
}

/// pf (PF_ICMP_MULTI_LINK): an echo to ff02::1 under `block all; pass out` is answered by
/// the link's nodes from their own addresses, each reply by the request's state; a reply
/// with another identifier, or to an echo to another group, has none.
#[test]
fn replies_to_an_echo_to_all_nodes_pass_by_its_state() {
    let mut w = outbound_only();
    let me = v6(1);
    let all = xpf_wire::pdesc::ALL_NODES.0;
    let routers = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let out = [echo6(me, all, 7, false), echo6(me, routers, 8, false)];
    assert_eq!(run(&mut w, &out, Dir::Out, 1), vec![Verdict::Pass; 2]);
    let replies =
        [echo6(v6(2), me, 7, true), echo6(v6(3), me, 7, true), echo6(v6(2), me, 9, true), echo6(v6(2), me, 8, true)];
    let v = run(&mut w, &replies, Dir::In, 2);
    assert_eq!(v, vec![Verdict::Pass, Verdict::Pass, Verdict::Drop(Reason::Match), Verdict::Drop(Reason::Match)]);
    assert_eq!(w.states(), 2, "the replies make none");
}

#[test]
fn a_neighbour_advertisement_finds_the_state_of_the_solicitation_it_answers() {
    // pf (pf_icmp_mapping, pf_state_key_addr_setup): `block all; pass out` resolves a
    // neighbour, the advertisement passing by the solicitation's state, keyed by the target.
    let mut w = outbound_only();
    let me = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let ns = nd6(false, me, solicited(v6(2)), v6(2), 255);
    assert_eq!(run(&mut w, &[ns], Dir::Out, 1)[0], Verdict::Pass);
    assert_eq!(w.states(), 1);
    let (_, s) = w.t6.iter().next().unwrap();
    let id = xpf_wire::icmp::nd_id(&v6(2));
    assert_eq!((s.key.addr, s.key.port), ([v6(2), me], [135, id]), "keyed by the target, not the multicast address");
    let na = |from: u8, target: u8, to: [u8; 16], hlim: u8| nd6(true, v6(from), to, v6(target), hlim);
    let v = run(
        &mut w,
        &[
            na(2, 2, me, 255),
            na(3, 3, me, 255),
            na(2, 2, [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], 255),
            na(2, 2, me, 64),
            nd6(true, v6(2), me, v6(2), 255)[..14 + 40 + 16].to_vec(),
        ],
        Dir::In,
        2,
    );
    assert_eq!(
        v,
        [
            Verdict::Pass,
            Verdict::Drop(Reason::Match),
            Verdict::Drop(Reason::Match),
            Verdict::Drop(Reason::Normalize),
            Verdict::Drop(Reason::Short),
        ],
        "the answer; another target; another host; from off the link (hop limit 64); no target"
    );
    // Duplicate address detection: a probe from :: to the target's solicited-node address,
    // defended by an advertisement to all nodes.
    let probe = nd6(false, [0; 16], solicited(v6(7)), v6(7), 255);
    assert_eq!(run(&mut w, &[probe], Dir::Out, 3)[0], Verdict::Pass);
    let all_nodes = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    assert_eq!(run(&mut w, &[na(7, 7, all_nodes, 255)], Dir::In, 3)[0], Verdict::Pass);
    assert_eq!(run(&mut w, &[na(8, 8, all_nodes, 255)], Dir::In, 3)[0], Verdict::Drop(Reason::Match));
    // An advertisement a rule passes makes no state (nobody waits for an answer to one).
    let mut w = worker(PassAll, 10);
    assert_eq!(run(&mut w, &[na(2, 2, me, 255)], Dir::In, 1)[0], Verdict::Pass);
    assert_eq!(w.states(), 0);
}

#[test]
fn an_icmp_error_quoting_tcp_must_quote_a_sequence_number_in_the_window() {
    let mut w = established();
    // What the client sent last (seq 2001): an error quoting it passes; one quoting a
    // sequence number 100 MB away does not.
    let good = seg(true, tcp::ACK, 2001, 6401, 512, 0, None);
    let bad = seg(true, tcp::ACK, 2001 + 100_000_000, 6401, 512, 0, None);
    assert_eq!(run(&mut w, &[unreach([2, 2, 2, 2], [1, 1, 1, 1], &good)], Dir::Out, 2)[0], Verdict::Pass);
    assert_eq!(
        run(&mut w, &[unreach([2, 2, 2, 2], [1, 1, 1, 1], &bad)], Dir::Out, 2)[0],
        Verdict::Drop(Reason::StateMismatch)
    );
}

/// A pass-keep-state policy whose rule has `limits` (limiter 7), deciding with `d`.
struct Limited(Decision, xpf_state::RuleLimits);

impl Policy for Limited {
    fn evaluate(&self, _: &PDesc, _: u16, _: Dir) -> Decision {
        Decision { limits: 1, ..self.0 }
    }
    fn limits(&self, i: u32) -> Option<&xpf_state::RuleLimits> {
        (i == 1).then_some(&self.1)
    }
}

fn limited(l: xpf_state::RuleLimits) -> Worker<Limited> {
    worker(Limited(Decision::PASS, xpf_state::RuleLimits { limiter: 7, ..l }), 1000)
}

/// A TCP segment from `src`:`sport` to 2.2.2.2:80 (or back, with `fwd` false).
fn tseg(src: [u8; 4], sport: u16, fwd: bool, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    let mut f = if fwd { tcp4(src, [2, 2, 2, 2], sport, 80, flags) } else { tcp4([2, 2, 2, 2], src, 80, sport, flags) };
    f[38..42].copy_from_slice(&seq.to_be_bytes());
    f[42..46].copy_from_slice(&ack.to_be_bytes());
    f
}

/// The three segments of a handshake from `src`:`sport`; the verdicts of each.
fn handshake<P: Policy>(w: &mut Worker<P>, src: [u8; 4], sport: u16) -> [Verdict; 3] {
    [
        run(w, &[tseg(src, sport, true, tcp::SYN, 100, 0)], Dir::In, 1)[0],
        run(w, &[tseg(src, sport, false, tcp::SYN | tcp::ACK, 900, 101)], Dir::Out, 1)[0],
        run(w, &[tseg(src, sport, true, tcp::ACK, 101, 901)], Dir::In, 1)[0],
    ]
}

const PASS3: [Verdict; 3] = [Verdict::Pass; 3];

#[test]
fn max_refuses_the_fourth_connection_until_one_goes() {
    let mut w = limited(xpf_state::RuleLimits { max: 3, ..Default::default() });
    for sport in 1..=3 {
        assert_eq!(handshake(&mut w, [1, 1, 1, 1], sport), PASS3);
    }
    let syn = tseg([1, 1, 1, 1], 4, true, tcp::SYN, 100, 0);
    assert_eq!(run(&mut w, std::slice::from_ref(&syn), Dir::In, 1), vec![Verdict::Drop(Reason::StateLimit)]);
    assert_eq!(w.states(), 3, "the three held are kept");
    assert_eq!(w.t4.track.counters.states, 1);
    let (id, _) = w.t4.iter().next().unwrap();
    w.t4.remove(id);
    assert_eq!(run(&mut w, &[syn], Dir::In, 2), vec![Verdict::Pass], "room again after one went");
}

#[test]
fn max_src_states_counts_per_source() {
    let mut w = limited(xpf_state::RuleLimits { max_src_states: 2, track_src: true, ..Default::default() });
    let syn = |src, sport| tseg(src, sport, true, tcp::SYN, 100, 0);
    let v = run(
        &mut w,
        &[syn([1, 1, 1, 1], 1), syn([1, 1, 1, 1], 2), syn([1, 1, 1, 1], 3), syn([3, 3, 3, 3], 1)],
        Dir::In,
        1,
    );
    assert_eq!(v, vec![Verdict::Pass, Verdict::Pass, Verdict::Drop(Reason::SrcLimit), Verdict::Pass]);
    assert_eq!(w.t4.track.nodes.len(), 2);
    assert_eq!(w.t4.track.counters.src_states, 1);
    // The nodes go with the states (src.track 0).
    let ids: Vec<u32> = w.t4.iter().map(|(i, _)| i).collect();
    for id in ids {
        w.t4.remove(id);
    }
    assert!(w.t4.track.nodes.is_empty() && w.t4.track.extra.is_empty());
}

#[test]
fn max_src_conn_overload_flushes_the_source_and_names_it_for_the_table() {
    let o = xpf_state::Overload { table: "bruteforce".into(), flush: true, global: false };
    let mut w =
        limited(xpf_state::RuleLimits { max_src_conn: 2, track_src: true, overload: Some(o), ..Default::default() });
    let bad = [1, 1, 1, 1];
    assert_eq!(handshake(&mut w, bad, 1), PASS3);
    assert_eq!(handshake(&mut w, bad, 2), PASS3);
    assert_eq!(handshake(&mut w, [3, 3, 3, 3], 1), PASS3);
    let third = handshake(&mut w, bad, 3);
    assert_eq!(third, [Verdict::Pass, Verdict::Pass, Verdict::Drop(Reason::SrcLimit)]);
    assert_eq!(w.states(), 1, "the source's states are flushed, the other source's kept");
    assert_eq!(w.t4.track.overloads, vec![("bruteforce".to_string(), xpf_wire::Addr::v4(bad))]);
    let c = w.t4.track.counters;
    assert_eq!((c.src_conn, c.overload_table, c.overload_flush), (1, 1, 1));
    // Its next segments find no state (the rules decide: here flags S/SA refuses them).
    let v = run(&mut w, &[tseg(bad, 1, true, tcp::ACK, 101, 901)], Dir::In, 2);
    assert_eq!(v, vec![Verdict::Pass], "PassAll-like rule passes it statelessly");
    assert_eq!(w.states(), 1, "but makes no state from a bare ACK");
}

#[test]
fn max_src_conn_rate_counts_connections_over_time() {
    let mut w = limited(xpf_state::RuleLimits { max_src_conn_rate: (2, 10), track_src: true, ..Default::default() });
    let src = [1, 1, 1, 1];
    assert_eq!(handshake(&mut w, src, 1), PASS3);
    assert_eq!(handshake(&mut w, src, 2), PASS3);
    assert_eq!(handshake(&mut w, src, 3)[2], Verdict::Drop(Reason::SrcLimit));
    assert_eq!(w.t4.track.counters.src_conn_rate, 1);
}

#[test]
fn a_sloppy_state_tracks_flags_only() {
    let d = Decision { sloppy: true, ..Decision::PASS };
    let mut w = worker(move |_: &PDesc, _: u16, _: Dir| d, 10);
    assert_eq!(handshake(&mut w, [1, 1, 1, 1], 1), PASS3);
    // Far outside any window: full tracking drops it, sloppy passes it.
    let wild = tseg([1, 1, 1, 1], 1, true, tcp::ACK, 101, 3_000_000_000);
    assert_eq!(run(&mut w, std::slice::from_ref(&wild), Dir::In, 2), vec![Verdict::Pass]);
    let (id, s) = w.t4.iter().next().unwrap();
    assert_eq!(s.peer_state, [proto::tcps::ESTABLISHED; 2]);
    assert!(w.t4.peers(id).is_none(), "no sequence record");
    let mut full = worker(PassAll, 10);
    assert_eq!(handshake(&mut full, [1, 1, 1, 1], 1), PASS3);
    assert_eq!(run(&mut full, &[wild], Dir::In, 2), vec![Verdict::Drop(Reason::StateMismatch)]);
}

#[test]
fn flags_any_picks_up_an_established_stream() {
    let d = Decision { pickup: true, ..Decision::PASS };
    let mut w = worker(move |_: &PDesc, _: u16, d2: Dir| if d2 == Dir::In { d } else { Decision::BLOCK }, 10);
    let mid = tseg([1, 1, 1, 1], 1, true, tcp::ACK, 5000, 7000);
    assert_eq!(run(&mut w, &[mid], Dir::In, 1), vec![Verdict::Pass]);
    assert_eq!(w.states(), 1);
    let back = tseg([1, 1, 1, 1], 1, false, tcp::ACK, 7000, 5000);
    assert_eq!(run(&mut w, &[back], Dir::Out, 1), vec![Verdict::Pass], "the reply rides the picked-up state");
    let rst = tseg([3, 3, 3, 3], 1, true, tcp::RST | tcp::ACK, 1, 1);
    run(&mut w, &[rst], Dir::In, 1);
    assert_eq!(w.states(), 1, "a RST makes no state");
}

#[test]
fn a_rule_timeout_overrides_the_global_one() {
    let mut w = limited(xpf_state::RuleLimits { timeouts: vec![(Timeout::UdpFirst, 5)], ..Default::default() });
    run(&mut w, &[udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 53)], Dir::In, 10);
    let (id, _) = w.t4.iter().next().unwrap();
    assert_eq!(w.t4.timeout_of(id), 5);
    w.maintain(14, 100);
    assert_eq!(w.states(), 1);
    w.maintain(15, 100);
    assert_eq!(w.states(), 0, "gone after the rule's 5 s, not udp.first's 60");
}

/// The IP payload of a UDP datagram from port 1000 to `dport` with `data` bytes, cut at the
/// offsets `cuts` (multiples of 8): (offset, part, more to come) for each fragment.
fn udp_parts(dport: u16, data: usize, cuts: &[usize]) -> Vec<(usize, Vec<u8>, bool)> {
    let mut payload = vec![0u8; 8 + data];
    udp::emit_header(&mut payload, 1000, dport, (8 + data) as u16);
    for (i, b) in payload[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(payload.len());
    bounds.windows(2).map(|w| (w[0], payload[w[0]..w[1]].to_vec(), w[1] < payload.len())).collect()
}

/// That datagram from 1.1.1.1 to 2.2.2.2 as IPv4 fragments.
fn frags4(id: u16, dport: u16, data: usize, cuts: &[usize]) -> Vec<Vec<u8>> {
    udp_parts(dport, data, cuts)
        .into_iter()
        .map(|(off, part, more)| {
            let mut f = vec![0u8; 34 + part.len()];
            f[12] = 0x08;
            ipv4::emit_header(&mut f[14..], [1, 1, 1, 1], [2, 2, 2, 2], 17, (20 + part.len()) as u16, 64, id);
            f[20..22].copy_from_slice(&((off / 8) as u16 | if more { 0x2000 } else { 0 }).to_be_bytes());
            f[24..26].copy_from_slice(&[0, 0]);
            let c = xpf_wire::checksum::checksum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
            f[34..].copy_from_slice(&part);
            f
        })
        .collect()
}

/// The same as IPv6 fragments (fragment header right after the fixed header).
fn frags6(id: u32, dport: u16, data: usize, cuts: &[usize]) -> Vec<Vec<u8>> {
    udp_parts(dport, data, cuts)
        .into_iter()
        .map(|(off, part, more)| {
            let mut f = vec![0u8; 14 + 40 + 8 + part.len()];
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            let ip = &mut f[14..];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
            ip[6] = 44;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            ip[24..40].copy_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            ip[40] = 17;
            ip[42..44].copy_from_slice(&(off as u16 | u16::from(more)).to_be_bytes());
            ip[44..48].copy_from_slice(&id.to_be_bytes());
            ip[48..].copy_from_slice(&part);
            f
        })
        .collect()
}

fn reassembling<P: Policy>(p: P) -> Worker<P> {
    let mut w = worker(p, 100);
    w.set_reassemble(true, 100, 60);
    w
}

/// Passes UDP to port 53 only.
fn dns_only() -> impl Policy {
    |pd: &PDesc, _: u16, _: Dir| {
        if pd.dport == 53 && pd.flags & pdf::HAS_PORTS != 0 {
            Decision::PASS
        } else {
            Decision::BLOCK
        }
    }
}

#[test]
fn fragments_are_held_then_filtered_as_one_datagram_and_released_in_order() {
    let mut w = reassembling(dns_only());
    let f = frags4(7, 53, 3000, &[1480, 2960]);
    // Out of order: the last, the first, then the middle one completes it.
    let v = run(&mut w, &[f[2].clone(), f[0].clone(), f[1].clone()], Dir::In, 1);
    assert_eq!(v, vec![Verdict::Held; 3]);
    let rel: Vec<(u8, Vec<u8>)> = std::mem::take(&mut w.batch_mut().released);
    assert_eq!(rel.len(), 3);
    assert!(rel.iter().all(|r| r.0 == 2), "released with the frame that completed it");
    assert_eq!(rel.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), f, "unchanged, in datagram order");
    assert_eq!(w.states(), 1, "a state by the datagram's ports");
    assert_eq!((w.stats.packets, w.stats.passed, w.stats.dropped), (3, 3, 0));
    let c = w.frags.as_ref().unwrap().counters;
    assert_eq!((c.held, c.reassembled), (0, 1));
    // The reply's fragments ride the state.
    let out = w.filter_datagram(&f.iter().map(|x| &x[..]).collect::<Vec<_>>(), 2, Dir::Out, 1, 1);
    assert_eq!(out, (Verdict::Pass, None), "passed, untranslated");
}

#[test]
fn a_datagram_the_rules_block_is_dropped_whole() {
    let mut w = reassembling(dns_only());
    let f = frags4(8, 54, 2000, &[1480]);
    let v = run(&mut w, &f, Dir::In, 1);
    assert_eq!(v, vec![Verdict::Held, Verdict::Drop(Reason::Match)]);
    assert!(w.batch().released.is_empty());
    assert_eq!((w.stats.dropped, w.stats.reasons[Reason::Match as usize]), (2, 2));
    // Without reassembly no fragment's ports are read (pf's way): a port rule passes neither
    // the first nor the later one, each counted as a blocked fragment, and no state is made.
    let mut plain = worker(dns_only(), 100);
    let f = frags4(9, 53, 2000, &[1480]);
    assert_eq!(run(&mut plain, &f, Dir::In, 1), vec![Verdict::Drop(Reason::Fragment); 2]);
    assert_eq!(plain.states(), 0);
}

#[test]
fn overlapping_fragments_drop_the_datagram_teardrop() {
    let mut w = reassembling(PassAll);
    let a = frags4(10, 53, 3000, &[1480, 2960]);
    // A second fragment at offset 1472 overlaps the first (0..1480).
    let b = frags4(10, 53, 3000, &[1472, 2960]);
    let v = run(&mut w, &[a[0].clone(), b[1].clone(), a[1].clone(), a[2].clone()], Dir::In, 1);
    assert_eq!(
        v,
        vec![
            Verdict::Held,
            Verdict::Drop(Reason::Fragment),
            Verdict::Drop(Reason::Fragment),
            Verdict::Drop(Reason::Fragment)
        ]
    );
    let c = w.frags.as_ref().unwrap().counters;
    assert_eq!((c.overlaps, c.after_drop, c.held, c.reassembled), (1, 2, 0, 0));
    assert_eq!(w.stats.dropped, 4, "the held first fragment is counted too");
    assert_eq!(w.states(), 0);
}

#[test]
fn incomplete_datagrams_expire_and_the_limit_flushes_the_oldest() {
    let mut w = worker(PassAll, 100);
    w.set_reassemble(true, 3, 30);
    run(&mut w, &[frags4(1, 53, 2000, &[1480])[0].clone()], Dir::In, 1);
    w.maintain(30, 10);
    assert_eq!(w.frags.as_ref().unwrap().counters.held, 1);
    w.maintain(31, 10);
    let c = w.frags.as_ref().unwrap().counters;
    assert_eq!((c.held, c.timeouts), (0, 1));
    assert_eq!(w.stats.reasons[Reason::Fragment as usize], 1);
    // Limit 3: a fourth datagram flushes the oldest.
    for id in 2..6 {
        run(&mut w, &[frags4(id, 53, 2000, &[1480])[0].clone()], Dir::In, 40);
    }
    let c = w.frags.as_ref().unwrap().counters;
    assert_eq!((c.held, c.flushed), (3, 1));
    // The survivors still complete.
    let v = run(&mut w, &[frags4(5, 53, 2000, &[1480])[1].clone()], Dir::In, 40);
    assert_eq!(v, vec![Verdict::Held]);
    assert_eq!(w.batch().released.len(), 2);
}

#[test]
fn bad_fragment_lengths_are_dropped() {
    let mut w = reassembling(PassAll);
    // A fragment with more to come must carry a multiple of 8 bytes.
    let mut f = frags4(3, 53, 2000, &[1480])[0].clone();
    f.truncate(f.len() - 3);
    let tl = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&tl.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = xpf_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    assert_eq!(run(&mut w, &[f], Dir::In, 1), vec![Verdict::Drop(Reason::Fragment)]);
    assert_eq!(w.frags.as_ref().unwrap().counters.bad, 1);
    // Reassembled past 65,535 bytes (ping of death): the last fragment starts at 65,528.
    let mut big = frags4(4, 53, 100, &[])[0].clone();
    big[20..22].copy_from_slice(&(65528u16 / 8).to_be_bytes());
    big[24..26].copy_from_slice(&[0, 0]);
    let c = xpf_wire::checksum::checksum(&big[14..34]);
    big[24..26].copy_from_slice(&c.to_be_bytes());
    assert_eq!(run(&mut w, &[big], Dir::In, 1), vec![Verdict::Drop(Reason::Fragment)]);
    assert_eq!(w.frags.as_ref().unwrap().counters.oversized, 1);
}

#[test]
fn ipv6_fragments_reassemble_and_match_by_port() {
    let mut w = reassembling(dns_only());
    let f = frags6(0xabcd, 53, 2500, &[1232]);
    let v = run(&mut w, &f, Dir::In, 1);
    assert_eq!(v, vec![Verdict::Held, Verdict::Held]);
    assert_eq!(w.batch().released.len(), 2);
    assert_eq!(w.t6.len(), 1);
    let blocked = frags6(0xabce, 54, 2500, &[1232]);
    assert_eq!(run(&mut w, &blocked, Dir::In, 1)[1], Verdict::Drop(Reason::Match));
}

#[test]
fn refused_connections_do_not_count_towards_max_src_conn() {
    let o = xpf_state::Overload { table: "bruteforce".into(), flush: false, global: false };
    let mut w =
        limited(xpf_state::RuleLimits { max_src_conn: 1, track_src: true, overload: Some(o), ..Default::default() });
    let src = [1, 1, 1, 1];
    for sport in 1..=3 {
        // SYN, then the server's RST|ACK (nothing listens).
        assert_eq!(run(&mut w, &[tseg(src, sport, true, tcp::SYN, 100, 0)], Dir::In, 1), vec![Verdict::Pass]);
        let rst = tseg(src, sport, false, tcp::RST | tcp::ACK, 0, 101);
        assert_eq!(run(&mut w, &[rst], Dir::Out, 1), vec![Verdict::Pass]);
    }
    assert!(w.t4.track.overloads.is_empty(), "no connection was made");
    assert_eq!(w.t4.track.counters.src_conn, 0);
    assert_eq!(handshake(&mut w, src, 9), PASS3, "the first real connection is within max-src-conn 1");
}

/// The TCP checksum of IPv4 frame `f`, computed whole.
fn tcp_cksum(f: &[u8]) -> u16 {
    let mut t = f[34..].to_vec();
    t[16..18].copy_from_slice(&[0, 0]);
    let src: [u8; 4] = f[26..30].try_into().unwrap();
    let dst: [u8; 4] = f[30..34].try_into().unwrap();
    let ps = xpf_wire::checksum::pseudo_v4(src, dst, 6, t.len() as u16);
    !xpf_wire::checksum::fold(xpf_wire::checksum::sum(&t, ps))
}

/// `f` with a valid TCP checksum.
fn ck(mut f: Vec<u8>) -> Vec<u8> {
    let c = tcp_cksum(&f);
    f[50..52].copy_from_slice(&c.to_be_bytes());
    f
}

fn seq_ack(f: &[u8]) -> (u32, u32) {
    (u32::from_be_bytes(f[38..42].try_into().unwrap()), u32::from_be_bytes(f[42..46].try_into().unwrap()))
}

#[test]
fn modulate_state_replaces_both_initial_sequence_numbers() {
    let d = Decision { modulate: true, ..Decision::PASS };
    let mut w = worker(move |_: &PDesc, _: u16, _: Dir| d, 10);
    // Each segment goes through the worker, then is rewritten as the I/O layer would.
    let pass = |w: &mut Worker<_>, f: Vec<u8>, dir| {
        let mut f = ck(f);
        assert_eq!(run(w, std::slice::from_ref(&f), dir, 1), vec![Verdict::Pass]);
        if w.batch().patched & 1 != 0 {
            let (a, s) = w.batch().patches[0];
            assert!(proto::apply_modulation(&mut f, a, s));
        }
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), tcp_cksum(&f), "checksum kept valid");
        f
    };
    let syn = pass(&mut w, seg(true, tcp::SYN, 1000, 0, 65535, 0, Some(7)), Dir::In);
    let isn_c = seq_ack(&syn).0;
    assert_ne!(isn_c, 1000, "the client's ISN is replaced");
    let synack =
        pass(&mut w, seg(false, tcp::SYN | tcp::ACK, 5000, isn_c.wrapping_add(1), 65535, 0, Some(7)), Dir::Out);
    let (isn_s, ack) = seq_ack(&synack);
    assert_ne!(isn_s, 5000, "the server's too");
    assert_eq!(ack, 1001, "the client sees its own numbers acknowledged");
    let a = pass(&mut w, seg(true, tcp::ACK, 1001, isn_s.wrapping_add(1), 512, 0, None), Dir::In);
    assert_eq!(seq_ack(&a), (isn_c.wrapping_add(1), 5001), "the server sees its own numbers acknowledged");
    let data = pass(&mut w, seg(true, tcp::ACK | tcp::PSH, 1001, isn_s.wrapping_add(1), 512, 100, None), Dir::In);
    assert_eq!(seq_ack(&data).0, isn_c.wrapping_add(1));
    assert_eq!(peer_states_of(&w), (proto::tcps::ESTABLISHED, proto::tcps::ESTABLISHED));
    // A segment that acknowledges the client's real numbers (a blind spoofer on the server's
    // side, who never saw the modulated ones) is out of the window.
    let spoof = ck(seg(false, tcp::ACK, 5001, 1101, 512, 10, None));
    assert_eq!(run(&mut w, &[spoof], Dir::Out, 1), vec![Verdict::Drop(Reason::StateMismatch)]);
}

fn peer_states_of<P: Policy>(w: &Worker<P>) -> (u8, u8) {
    let s = w.t4.iter().next().unwrap().1;
    (s.peer_state[0], s.peer_state[1])
}

#[test]
fn modulation_rewrites_sack_blocks() {
    // An ACK with a SACK block (NOP NOP kind 5 len 10 left right) shifted with the ACK.
    let mut f = vec![0u8; 14 + 20 + 32];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], [1, 1, 1, 1], [2, 2, 2, 2], 6, 52, 64, 1);
    let t = &mut f[34..];
    t[0..2].copy_from_slice(&80u16.to_be_bytes());
    t[2..4].copy_from_slice(&1000u16.to_be_bytes());
    t[8..12].copy_from_slice(&5000u32.to_be_bytes());
    t[12] = 8 << 4;
    t[13] = tcp::ACK;
    t[20..24].copy_from_slice(&[1, 1, 5, 10]);
    t[24..28].copy_from_slice(&6000u32.to_be_bytes());
    t[28..32].copy_from_slice(&7000u32.to_be_bytes());
    let mut f = ck(f);
    assert!(proto::apply_modulation(&mut f, 0, 100));
    assert_eq!(seq_ack(&f).1, 4900);
    assert_eq!(u32::from_be_bytes(f[58..62].try_into().unwrap()), 5900);
    assert_eq!(u32::from_be_bytes(f[62..66].try_into().unwrap()), 6900);
    assert_eq!(u16::from_be_bytes([f[50], f[51]]), tcp_cksum(&f));
}

/// `pass out nat-to 192.0.2.1 port lo:hi` (pool 1) and `pass in proto udp to port 53 rdr-to
/// 10.0.0.53 port 5353` (pool 2); everything else in is blocked.
struct Natting(Vec<nat::Pool>);

impl Policy for Natting {
    fn evaluate(&self, pd: &PDesc, _: u16, dir: Dir) -> Decision {
        match dir {
            Dir::Out => Decision { nat: 1, ..Decision::PASS },
            Dir::In if pd.proto == 17 && pd.dport == 53 => Decision { rdr: 2, ..Decision::PASS },
            Dir::In => Decision::BLOCK,
        }
    }
    fn pool(&self, i: u32) -> Option<&nat::Pool> {
        self.0.get(i as usize - 1)
    }
    fn pools(&self) -> &[nat::Pool] {
        &self.0
    }
}

fn natting(lo: u16, hi: u16) -> Worker<Natting> {
    let net = |a: [u8; 4]| nat::Net { addr: xpf_wire::Addr::v4(a), af: 4, len: 32 };
    let pool = |a, ports| nat::Pool {
        nets: vec![net(a)],
        method: nat::Method::None,
        ports,
        static_port: false,
        dst_base: 53,
        endpoint_independent: false,
        sticky: false,
        portset: None,
    };
    worker(Natting(vec![pool([192, 0, 2, 1], (lo, hi)), pool([10, 0, 0, 53], (5353, 5353))]), 1000)
}

#[test]
fn packed_scrub_actions_stay_below_a_states_log_unit() {
    let most = Scrub {
        no_df: true,
        random_id: true,
        min_ttl: 255,
        set_tos: Some(255),
        max_mss: u16::MAX,
        id: 0,
        tcp_clean: false,
    };
    assert_eq!(most.pack() & !crate::SCRUB_BITS, 0);
    assert_eq!(Scrub::unpack((most.pack() | 3 << crate::LOG_SHIFT) & crate::SCRUB_BITS), Scrub::unpack(most.pack()));
}

/// `pflow` on every decision of [`Natting`].
struct Pflowing(Natting);

impl Policy for Pflowing {
    fn evaluate(&self, pd: &PDesc, kif: u16, dir: Dir) -> Decision {
        Decision { pflow: true, ..self.0.evaluate(pd, kif, dir) }
    }
    fn pool(&self, i: u32) -> Option<&nat::Pool> {
        self.0.pool(i)
    }
}

#[test]
fn a_pflow_state_is_recorded_at_its_end_while_active_and_when_translated() {
    use xpf_state::FlowEvent;
    let mut w = worker(Pflowing(Natting(std::mem::take(&mut natting(50001, 50010).policy.0))), 1000);
    w.set_flow_active(10);
    let a = |x: [u8; 4]| xpf_wire::Addr::v4(x);
    let out = udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, &[out.clone(), out.clone()], Dir::Out, 1), vec![Verdict::Pass; 2]);
    let port = pd_of(&rewritten(&w, 0, &out)).sport;
    let mut f = Vec::new();
    assert_eq!(w.take_flows(&mut f), 0);
    // The translation's creation: inside and outside addresses (FreeBSD's NAT44 event).
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].event, FlowEvent::NatCreate);
    assert_eq!((f[0].src, f[0].dst), ((a([10, 0, 1, 2]), 40000), (a([198, 51, 100, 1]), 53)));
    assert_eq!((f[0].nat_src, f[0].nat_dst), ((a([192, 0, 2, 1]), port), (a([198, 51, 100, 1]), 53)));
    let reply = udp4([198, 51, 100, 1], [192, 0, 2, 1], 53, port);
    assert_eq!(run(&mut w, std::slice::from_ref(&reply), Dir::In, 3), vec![Verdict::Pass]);
    // Alive after its active timeout: a record of what it carried so far, each way.
    w.maintain(12, 100);
    f.clear();
    w.take_flows(&mut f);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].event, f[0].packets, f[0].start, f[0].end), (FlowEvent::Active, [2, 1], 1, 3));
    assert_eq!(f[0].bytes[0], 2 * (out.len() as u64 - 14));
    // Idle since: nothing at the next active time.
    w.maintain(22, 100);
    f.clear();
    w.take_flows(&mut f);
    assert!(f.is_empty(), "{f:?}");
    // One more packet: reported at the next active time, not again at the end (nothing new).
    assert_eq!(run(&mut w, std::slice::from_ref(&out), Dir::Out, 25), vec![Verdict::Pass]);
    for t in 26..=90 {
        w.maintain(t, 100);
    }
    f.clear();
    w.take_flows(&mut f);
    assert_eq!(w.states(), 0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].event, f[0].packets, f[0].start, f[0].end), (FlowEvent::Active, [1, 0], 22, 25));
    // A short flow (gone before its active time): one record at its end, all it carried.
    let short = udp4([10, 0, 1, 3], [198, 51, 100, 1], 40001, 53);
    run(&mut w, std::slice::from_ref(&short), Dir::Out, 100);
    f.clear();
    w.take_flows(&mut f);
    let id = w.t4.iter().next().unwrap().0;
    assert!(w.t4.remove(id));
    w.take_flows(&mut f);
    assert_eq!(f.iter().map(|r| r.event).collect::<Vec<_>>(), [FlowEvent::NatCreate, FlowEvent::End]);
    assert_eq!((f[1].packets, f[1].start, f[1].end), ([1, 0], 100, 100));
    // A rule without pflow: no records.
    let mut plain = natting(50001, 50010);
    run(&mut plain, std::slice::from_ref(&out), Dir::Out, 1);
    for t in 2..=90 {
        plain.maintain(t, 100);
    }
    f.clear();
    plain.take_flows(&mut f);
    assert!(f.is_empty());
}

/// Frame `f` rewritten as the worker's last batch said for frame `i`.
fn rewritten<P: Policy>(w: &Worker<P>, i: usize, f: &[u8]) -> Vec<u8> {
    assert!(w.batch().translated & (1 << i) != 0, "frame {i} not translated");
    let mut f = f.to_vec();
    assert!(xpf_wire::translate::apply(&mut f, &w.batch().rewrites[i]));
    f
}

fn pd_of(f: &[u8]) -> PDesc {
    let mut pd = PDesc::default();
    parse_ether(f, &mut pd).unwrap();
    pd
}

#[test]
fn nat_to_translates_out_and_back_in() {
    let mut w = natting(50001, 50010);
    let out = udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&out), Dir::Out, 1), vec![Verdict::Pass]);
    let o = pd_of(&rewritten(&w, 0, &out));
    assert_eq!(o.src, xpf_wire::Addr::v4([192, 0, 2, 1]));
    assert!((50001..=50010).contains(&o.sport), "{}", o.sport);
    assert_eq!((o.dst, o.dport), (xpf_wire::Addr::v4([198, 51, 100, 1]), 53));
    // A second packet of the flow: the same translation, by the stack key.
    assert_eq!(run(&mut w, std::slice::from_ref(&out), Dir::Out, 2), vec![Verdict::Pass]);
    assert_eq!(pd_of(&rewritten(&w, 0, &out)).sport, o.sport);
    // The reply to the public address comes back to the inside host.
    let reply = udp4([198, 51, 100, 1], [192, 0, 2, 1], 53, o.sport);
    let stray = udp4([198, 51, 100, 1], [192, 0, 2, 1], 53, if o.sport == 50001 { 50002 } else { 50001 });
    assert_eq!(run(&mut w, &[reply.clone(), stray], Dir::In, 3), vec![Verdict::Pass, Verdict::Drop(Reason::Match)]);
    let r = pd_of(&rewritten(&w, 0, &reply));
    assert_eq!(
        (r.dst, r.dport, r.src, r.sport),
        (xpf_wire::Addr::v4([10, 0, 1, 2]), 40000, xpf_wire::Addr::v4([198, 51, 100, 1]), 53)
    );
    assert_eq!(w.batch().translated & 2, 0);
    // Port unreachable from the server about the translated datagram: back to the inside
    // host, quoting what it sent.
    let q = rewritten_out(&out, &o);
    let err = unreach([198, 51, 100, 1], [192, 0, 2, 1], &q);
    assert_eq!(run(&mut w, std::slice::from_ref(&err), Dir::In, 4), vec![Verdict::Pass]);
    let e = rewritten(&w, 0, &err);
    assert_eq!(pd_of(&e).dst, xpf_wire::Addr::v4([10, 0, 1, 2]));
    let inner = xpf_wire::pdesc::parse_quoted(&e[42..], 4).unwrap();
    assert_eq!((inner.src, inner.sport), (xpf_wire::Addr::v4([10, 0, 1, 2]), 40000));
    assert_eq!(w.nat.counters.translated, 1);
}

/// `out` as it left (the translation `o` applied).
fn rewritten_out(out: &[u8], o: &PDesc) -> Vec<u8> {
    let mut f = out.to_vec();
    let rw = nat::Rewrite { addr: [o.src, o.dst], port: [o.sport, o.dport], ..Default::default() };
    assert!(xpf_wire::translate::apply(&mut f, &rw));
    f
}

/// A GRE packet (protocol 47, no ports) from `src` to `dst`.
fn gre4(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], src, dst, 47, 46, 64, 1);
    f[36..38].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}

/// A protocol without ports is translated by its addresses alone, as pf translates it: one
/// inside host at a time reaches a far end through one pool address; a second host's flow
/// to it is refused as `translate` (pf_get_sport), counted, and makes no state, while the
/// first's replies still find theirs; another far end is free.
#[test]
fn a_second_host_to_one_far_end_without_ports_is_refused_as_translate() {
    let mut w = natting(50001, 65535);
    let (far, other) = ([198, 51, 100, 1], [198, 51, 100, 2]);
    let flows = [gre4([10, 0, 1, 2], far), gre4([10, 0, 1, 3], far), gre4([10, 0, 1, 3], other)];
    let v = run(&mut w, &flows, Dir::Out, 1);
    assert_eq!(v, vec![Verdict::Pass, Verdict::Drop(Reason::Translate), Verdict::Pass]);
    assert_eq!((w.nat.counters.exhausted, w.nat.counters.translated, w.states()), (1, 2, 2));
    assert_eq!(w.nat.take_refusals(), vec![(1, 1, 0)]);
    let reply = gre4(far, [192, 0, 2, 1]);
    assert_eq!(run(&mut w, std::slice::from_ref(&reply), Dir::In, 2), vec![Verdict::Pass]);
    assert_eq!(pd_of(&rewritten(&w, 0, &reply)).dst, xpf_wire::Addr::v4([10, 0, 1, 2]));
}

/// A packet that cannot leave its link is not translated (Linux's conntrack leaves neighbour
/// discovery untracked for its NAT alike): the host's neighbour solicitation from its
/// link-local address and its advertisement (no state) out through a `nat-to` pass as they
/// are, and so does a datagram to a link-local multicast group, while a routed flow is
/// translated beside them; a `rdr-to` would send a link-local source's packet to a host that
/// cannot answer it, and refuses it as translate.
#[test]
fn packets_that_cannot_leave_their_link_are_not_translated() {
    let mut w = natting(50001, 50010);
    let me = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let out = [
        nd6(false, me, solicited(v6(2)), v6(2), 255),
        nd6(true, v6(1), v6(2), v6(1), 255),
        udp4([10, 0, 1, 2], [224, 0, 0, 251], 5353, 5353),
        udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 53),
    ];
    assert_eq!(run(&mut w, &out, Dir::Out, 1), vec![Verdict::Pass; 4]);
    assert_eq!((w.batch().translated, w.nat.counters.translated), (0b1000, 1));
    assert_eq!(w.states(), 3, "the solicitation's, the group's and the flow's");
    for (_, s) in w.t6.iter() {
        assert_eq!(s.key.addr[1], me, "the solicitation's state, as it left");
    }
    let from = |src| udp4(src, [192, 0, 2, 1], 40000, 53);
    let v = run(&mut w, &[from([169, 254, 1, 1]), from([198, 51, 100, 1])], Dir::In, 2);
    assert_eq!(v, vec![Verdict::Drop(Reason::Translate), Verdict::Pass]);
    assert_eq!(w.batch().translated, 0b10);
}

/// An ICMP echo request (or reply) from `src` to `dst` with identifier `id`.
fn echo4(src: [u8; 4], dst: [u8; 4], id: u16, reply: bool) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[12] = 0x08;
    ipv4::emit_header(&mut f[14..], src, dst, 1, 28, 64, 1);
    let t = if reply { xpf_wire::icmp::ECHO_REPLY } else { xpf_wire::icmp::ECHO_REQUEST };
    xpf_wire::icmp::emit_header(&mut f[34..], t, 0, (id as u32) << 16 | 1);
    f
}

/// Under `static-port` an echo keeps its identifier while it is free; two hosts pinging one
/// far end with one identifier (Windows' is always 1) both get through, the second with
/// another identifier (pf gives every echo one of 1-65535), and each reply finds its host.
#[test]
fn static_port_echoes_of_two_hosts_with_one_identifier_both_pass() {
    let mut w = natting(50001, 50010);
    w.policy.0[0].static_port = true;
    w.policy.0[0].ports = (0, 0);
    let far = [198, 51, 100, 1];
    let out = [echo4([10, 0, 1, 2], far, 1, false), echo4([10, 0, 1, 3], far, 1, false)];
    assert_eq!(run(&mut w, &out, Dir::Out, 1), vec![Verdict::Pass; 2]);
    let (a, b) = (pd_of(&rewritten(&w, 0, &out[0])), pd_of(&rewritten(&w, 1, &out[1])));
    assert_eq!((a.src, a.sport), (xpf_wire::Addr::v4([192, 0, 2, 1]), 1), "the first keeps its identifier");
    assert_eq!(b.src, xpf_wire::Addr::v4([192, 0, 2, 1]));
    assert_ne!(b.sport, 1, "the second gets another");
    for (host, id) in [([10, 0, 1, 2], 1), ([10, 0, 1, 3], b.sport)] {
        let reply = echo4(far, [192, 0, 2, 1], id, true);
        assert_eq!(run(&mut w, std::slice::from_ref(&reply), Dir::In, 2), vec![Verdict::Pass]);
        let r = pd_of(&rewritten(&w, 0, &reply));
        assert_eq!((r.dst, r.dport), (xpf_wire::Addr::v4(host), 1));
    }
    // UDP keeps its port under `static-port` or is refused, as pf refuses it.
    let udp = [udp4([10, 0, 1, 2], far, 5060, 5060), udp4([10, 0, 1, 3], far, 5060, 5060)];
    assert_eq!(run(&mut w, &udp, Dir::Out, 3), vec![Verdict::Pass, Verdict::Drop(Reason::Translate)]);
}

#[test]
fn nat_to_exhaustion_is_counted_and_released_ports_come_back() {
    let mut w = natting(50001, 50002);
    let flows: Vec<_> = (0..3).map(|k| udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000 + k, 53)).collect();
    // Two ports for three flows to one destination: the third is refused as `translate`.
    let v = run(&mut w, &flows, Dir::Out, 1);
    assert_eq!(v, vec![Verdict::Pass, Verdict::Pass, Verdict::Drop(Reason::Translate)]);
    assert_eq!(w.nat.counters.exhausted, 1);
    assert_eq!(w.states(), 2);
    // Named by its pool for xpfd's log, and taken once.
    assert!(w.nat.has_refusals());
    assert_eq!(w.nat.take_refusals(), [(1, 1, 0)]);
    assert!(!w.nat.has_refusals() && w.nat.take_refusals().is_empty());
    // To another destination, a port in use is shared (the wire keys differ).
    let other = udp4([10, 0, 1, 2], [198, 51, 100, 2], 40009, 53);
    assert_eq!(run(&mut w, &[other], Dir::Out, 1), vec![Verdict::Pass]);
    assert_eq!(w.nat.counters.shared, 1);
    // The states expire; their ports come back. With nothing else left, the third flow gets
    // one before its hold is over (counted), rather than being refused for two minutes.
    let gone = 1 + 60 + 1;
    w.maintain(gone, u32::MAX);
    assert_eq!(w.states(), 0);
    assert_eq!(w.nat.ports_used().0, 0);
    assert_eq!(run(&mut w, &flows[2..], Dir::Out, gone + 1), vec![Verdict::Pass]);
    assert_eq!(w.nat.counters.early, 1);
}

#[test]
fn a_synced_translated_state_gives_back_no_port_of_this_box() {
    let mut w = natting(50001, 50010);
    let out = udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&out), Dir::Out, 1), vec![Verdict::Pass]);
    let wire = w.t4.iter().next().map(|(_, s)| s.key).unwrap();
    assert_eq!(w.nat.ports_used().0, 1);
    // The peer's translated state on the same public address and port, to another server,
    // as pfsync inserts it (not taken in): it holds nothing of this box's allocator.
    let id = peer_translated(&mut w, ([10, 0, 1, 9], 1234), wire.port(1), [198, 51, 100, 2]);
    // Its end gives nothing back: the port is still the local flow's.
    assert!(w.t4.remove(id));
    w.maintain(2, 0);
    assert_eq!((w.states(), w.nat.ports_used().0), (1, 1));
    // The local flow's end does.
    w.maintain(2 + 61, u32::MAX);
    assert_eq!((w.states(), w.nat.ports_used().0), (0, 0));
}

/// A peer's translated UDP state from inside source `src` on public port `port` to
/// `server`:53, as pfsync inserts it (holding nothing of this box's translation); its id.
fn peer_translated<P: Policy>(w: &mut Worker<P>, src: ([u8; 4], u16), port: u16, server: [u8; 4]) -> u32 {
    let a = xpf_wire::Addr::v4;
    let key = Key4::from_parts(17, [a(server), a([192, 0, 2, 1])], [53, port], 1);
    let stack = Key4::from_parts(17, [a(server), a(src.0)], [53, src.1], 1);
    let ns = NewState {
        stack: Some(stack),
        dir: Dir::Out,
        timeout: Timeout::UdpMultiple,
        src_state: 2,
        dst_state: 2,
        tcp: None,
        ..xpf_state::fixtures::established_tcp(key, Default::default())
    };
    w.t4.insert(w.t4.hash(&key), ns, 1).unwrap()
}

#[test]
fn a_peers_translated_states_taken_in_keep_their_ports_and_mappings() {
    let mut w = natting(50001, 50004);
    w.policy.0[0].endpoint_independent = true;
    // Two of the peer's flows through this box's pool (the standby's view before it takes
    // over), taken in as sync's worker does.
    let a = peer_translated(&mut w, ([10, 0, 1, 2], 40000), 50003, [198, 51, 100, 1]);
    let b = peer_translated(&mut w, ([10, 0, 1, 3], 40000), 50001, [198, 51, 100, 1]);
    w.adopt(&[a, b]);
    assert_eq!(w.nat.ports_used().0, 2);
    assert_eq!(w.t4.held_of(a), xpf_state::held::PORT);
    // Taken in once: a second word about the same state changes nothing.
    w.adopt(&[a]);
    assert_eq!(w.nat.ports_used().0, 2);
    // The first source's next flow, to another server, leaves from the same address and port
    // (endpoint-independent, RFC 4787 REQ-1), as it did through the peer.
    let next = udp4([10, 0, 1, 2], [198, 51, 100, 9], 40000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&next), Dir::Out, 2), vec![Verdict::Pass]);
    let o = pd_of(&rewritten(&w, 0, &next));
    assert_eq!((o.src, o.sport), (xpf_wire::Addr::v4([192, 0, 2, 1]), 50003));
    // New sources get the two ports nobody holds, not the peer's.
    let others: Vec<_> = (0..2).map(|k| udp4([10, 0, 2, 1 + k], [198, 51, 100, 9], 41000, 53)).collect();
    assert!(run(&mut w, &others, Dir::Out, 2).iter().all(|v| *v == Verdict::Pass));
    let got: std::collections::BTreeSet<u16> = (0..2).map(|i| pd_of(&rewritten(&w, i, &others[i])).sport).collect();
    assert_eq!(got, [50002, 50004].into_iter().collect());
    assert_eq!(w.nat.counters.shared, 0);
    // The peer's states' end gives their ports back (the first's still used by its next flow).
    assert!(w.t4.remove(a) && w.t4.remove(b));
    w.maintain(3, 0);
    assert_eq!(w.nat.ports_used().0, 3);
    // A peer's clear of every state lets go of all it held.
    let c = peer_translated(&mut w, ([10, 0, 1, 4], 40000), 50001, [198, 51, 100, 1]);
    w.adopt(&[c]);
    assert_eq!(w.nat.ports_used().0, 4);
    w.t4.remove_all_quietly();
    w.peer_emptied(4);
    assert_eq!(w.nat.ports_used().0, 0);
}

#[test]
fn flushing_states_gives_every_port_back_at_once_and_holds_them() {
    let mut w = natting(50001, 50010);
    let flows = |base: u16| (0..5).map(|k| udp4([10, 0, 1, 2], [198, 51, 100, 1], base + k, 53)).collect::<Vec<_>>();
    let sports = |w: &Worker<_>, f: &[Vec<u8>]| {
        (0..f.len()).map(|i| pd_of(&rewritten(w, i, &f[i])).sport).collect::<std::collections::BTreeSet<_>>()
    };
    let first = flows(40000);
    assert!(run(&mut w, &first, Dir::Out, 1).iter().all(|v| *v == Verdict::Pass));
    let used = sports(&w, &first);
    assert_eq!((w.nat.ports_used().0, used.len()), (5, 5));
    assert_eq!(w.remove_all_states(false, 2), 5);
    assert_eq!((w.states(), w.nat.ports_used().0, w.t4.nat_gone.len()), (0, 0, 0));
    // The released ports wait out their hold: new flows get the five never used.
    let second = flows(41000);
    assert!(run(&mut w, &second, Dir::Out, 3).iter().all(|v| *v == Verdict::Pass));
    assert!(sports(&w, &second).is_disjoint(&used));
    assert_eq!((w.nat.counters.early, w.nat.counters.shared), (0, 0));
    // Past the hold, a released port is handed out again.
    w.maintain(3 + 61, u32::MAX);
    assert_eq!(w.states(), 0);
    let third = flows(42000);
    assert!(run(&mut w, &third, Dir::Out, 3 + nat::HOLD).iter().all(|v| *v == Verdict::Pass));
    assert_eq!(w.nat.counters.early, 0);
}

#[test]
fn rdr_to_forwards_to_the_inside_server_and_answers_from_the_public_address() {
    let mut w = natting(50001, 50010);
    let q = udp4([198, 51, 100, 7], [192, 0, 2, 1], 33333, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&q), Dir::In, 1), vec![Verdict::Pass]);
    let i = pd_of(&rewritten(&w, 0, &q));
    assert_eq!(
        (i.dst, i.dport, i.src, i.sport),
        (xpf_wire::Addr::v4([10, 0, 0, 53]), 5353, xpf_wire::Addr::v4([198, 51, 100, 7]), 33333)
    );
    // The server's answer leaves from the public address and port (the `out` pass matches
    // the stack key).
    let a = udp4([10, 0, 0, 53], [198, 51, 100, 7], 5353, 33333);
    assert_eq!(run(&mut w, std::slice::from_ref(&a), Dir::Out, 2), vec![Verdict::Pass]);
    let o = pd_of(&rewritten(&w, 0, &a));
    assert_eq!((o.src, o.sport), (xpf_wire::Addr::v4([192, 0, 2, 1]), 53));
    assert_eq!(w.states(), 1);
    // The inside address sent to from outside directly matches the state on its wrong side.
    let direct = udp4([198, 51, 100, 7], [10, 0, 0, 53], 33333, 5353);
    assert_eq!(run(&mut w, &[direct], Dir::In, 3), vec![Verdict::Drop(Reason::StateMismatch)]);
}

#[test]
fn a_translated_packet_that_makes_no_state_is_dropped_not_sent_untranslated() {
    let mut w = natting(50001, 50010);
    // A mid-stream ACK may not start a state under this rule: it must not leave with the
    // inside address.
    let ack = tcp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 80, tcp::ACK);
    assert_eq!(run(&mut w, &[ack], Dir::Out, 1), vec![Verdict::Drop(Reason::Translate)]);
    assert_eq!(w.batch().translated, 0);
    assert_eq!(w.states(), 0);
    let syn = tcp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 80, tcp::SYN);
    assert_eq!(run(&mut w, &[syn], Dir::Out, 1), vec![Verdict::Pass]);
    assert_eq!(w.batch().translated, 1);
}

#[test]
fn endpoint_independent_udp_keeps_a_sources_port_towards_every_destination() {
    let mut w = natting(50001, 50100);
    w.policy.0[0].endpoint_independent = true;
    let to = |dst: [u8; 4], sport: u16| udp4([10, 0, 1, 2], dst, sport, 53);
    let flows = [to([198, 51, 100, 1], 40000), to([198, 51, 100, 2], 40000), to([198, 51, 100, 3], 40001)];
    assert_eq!(run(&mut w, &flows, Dir::Out, 1), vec![Verdict::Pass; 3]);
    let port = |w: &Worker<Natting>, i: usize, f: &[u8]| pd_of(&rewritten(w, i, f)).sport;
    let (a, b, c) = (port(&w, 0, &flows[0]), port(&w, 1, &flows[1]), port(&w, 2, &flows[2]));
    assert_eq!(a, b, "one source, one mapping");
    assert_ne!(a, c, "another source port, another mapping");
    assert_eq!(w.nat.counters.mapped, 1);
    // The replies from both servers come back to the source.
    let back = udp4([198, 51, 100, 2], [192, 0, 2, 1], 53, a);
    assert_eq!(run(&mut w, std::slice::from_ref(&back), Dir::In, 2), vec![Verdict::Pass]);
    assert_eq!(pd_of(&rewritten(&w, 0, &back)).dport, 40000);
    // Filtering stays endpoint-dependent: a host the source never wrote to has no state.
    let stranger = udp4([198, 51, 100, 9], [192, 0, 2, 1], 53, a);
    assert_eq!(run(&mut w, &[stranger], Dir::In, 2), vec![Verdict::Drop(Reason::Match)]);
    // The flows end: the mapping goes with its port's last flow.
    w.maintain(200, u32::MAX);
    assert_eq!(w.states(), 0);
    assert_eq!(w.nat.mapping(xpf_wire::Addr::v4([10, 0, 1, 2]), xpf_wire::pdesc::AF_INET, 40000), None);
    // Without it, each destination gets its own port (the control).
    let mut w = natting(50001, 50100);
    assert_eq!(run(&mut w, &flows[..2], Dir::Out, 1), vec![Verdict::Pass; 2]);
    assert_ne!(port(&w, 0, &flows[0]), port(&w, 1, &flows[1]));
}

#[test]
fn sticky_address_keeps_a_sources_address_and_least_states_balances() {
    let net = |a: [u8; 4], len| nat::Net { addr: xpf_wire::Addr::v4(a), af: 4, len };
    let src_of = |w: &Worker<Natting>, i: usize, f: &[u8]| pd_of(&rewritten(w, i, f)).src;
    // sticky-address over four addresses, round-robin: a source keeps its first one.
    let mut w = natting(50001, 60000);
    w.policy.0[0].nets = vec![net([192, 0, 2, 0], 30)];
    w.policy.0[0].method = nat::Method::RoundRobin;
    w.policy.0[0].sticky = true;
    let a: Vec<_> = (0..3).map(|k| udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000 + k, 53)).collect();
    let b = udp4([10, 0, 1, 3], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, &a, Dir::Out, 1), vec![Verdict::Pass; 3]);
    let got: Vec<_> = (0..3).map(|i| src_of(&w, i, &a[i])).collect();
    assert!(got.iter().all(|x| *x == got[0]), "{got:?}");
    assert_eq!(run(&mut w, std::slice::from_ref(&b), Dir::Out, 1), vec![Verdict::Pass]);
    assert_ne!(src_of(&w, 0, &b), got[0], "another source, the next address");
    assert_eq!(w.nat.sticky_sources(), 2);
    // Its states gone, the source is let go.
    w.maintain(100, u32::MAX);
    assert_eq!(w.states(), 0);
    assert_eq!(w.nat.sticky_sources(), 0);

    // least-states over two addresses: the one with fewer states, where round-robin would
    // take the other.
    let mut w = natting(50001, 60000);
    w.policy.0[0].nets = vec![net([192, 0, 2, 0], 31)];
    w.policy.0[0].method = nat::Method::LeastStates;
    let u1 = udp4([10, 0, 1, 2], [198, 51, 100, 1], 40000, 53);
    let t2 = tcp4([10, 0, 1, 3], [198, 51, 100, 1], 40000, 80, tcp::SYN);
    let u3 = udp4([10, 0, 1, 4], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&u1), Dir::Out, 1), vec![Verdict::Pass]);
    let x = src_of(&w, 0, &u1);
    assert_eq!(run(&mut w, std::slice::from_ref(&t2), Dir::Out, 1), vec![Verdict::Pass]);
    let y = src_of(&w, 0, &t2);
    assert_ne!(x, y);
    assert_eq!(run(&mut w, std::slice::from_ref(&u3), Dir::Out, 1), vec![Verdict::Pass]);
    assert_eq!(src_of(&w, 0, &u3), x, "a tie goes in round-robin order");
    // The UDP states on x expire (60 s), the TCP one on y stays: x has fewer.
    w.maintain(62, u32::MAX);
    assert_eq!(w.states(), 1);
    let u4 = udp4([10, 0, 1, 5], [198, 51, 100, 1], 40000, 53);
    assert_eq!(run(&mut w, std::slice::from_ref(&u4), Dir::Out, 63), vec![Verdict::Pass]);
    assert_eq!(src_of(&w, 0, &u4), x, "round-robin's next would be {y:?}");
}

/// `f` (IPv4 fragments of one UDP datagram) from `src:sport` to `dst:dport`, with the IP
/// header checksums and the datagram's UDP checksum made right.
fn readdress(f: &mut [Vec<u8>], src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) {
    for x in f.iter_mut() {
        x[26..30].copy_from_slice(&src);
        x[30..34].copy_from_slice(&dst);
        x[24..26].copy_from_slice(&[0, 0]);
        let c = xpf_wire::checksum::checksum(&x[14..34]);
        x[24..26].copy_from_slice(&c.to_be_bytes());
    }
    f[0][34..36].copy_from_slice(&sport.to_be_bytes());
    f[0][36..38].copy_from_slice(&dport.to_be_bytes());
    f[0][40..42].copy_from_slice(&[0, 0]);
    let c = udp_sum(f);
    f[0][40..42].copy_from_slice(&c.to_be_bytes());
}

/// The UDP checksum the datagram in fragments `f` should carry (its field counted as zero
/// when it is).
fn udp_sum(f: &[Vec<u8>]) -> u16 {
    let mut d: Vec<u8> = Vec::new();
    for x in f {
        d.extend_from_slice(&x[34..]);
    }
    let mut p = Vec::new();
    p.extend_from_slice(&f[0][26..34]);
    p.extend_from_slice(&[0, 17]);
    p.extend_from_slice(&(d.len() as u16).to_be_bytes());
    p.extend_from_slice(&d);
    if p.len() % 2 == 1 {
        p.push(0);
    }
    match xpf_wire::checksum::checksum(&p) {
        0 => 0xffff,
        c => c,
    }
}

#[test]
fn fragments_of_a_translated_flow_are_translated_each() {
    let mut w = natting(50001, 50010);
    w.set_reassemble(true, 100, 60);
    let ip_ok = |x: &[u8]| xpf_wire::checksum::checksum(&x[14..34]) == 0;
    // Out: the datagram is filtered whole; its translation comes with the verdict, for the
    // caller to apply to each fragment it sends.
    let mut f = frags4(11, 53, 3000, &[1480, 2960]);
    readdress(&mut f, [10, 0, 1, 2], [198, 51, 100, 1], 40000, 53);
    let refs: Vec<&[u8]> = f.iter().map(|x| &x[..]).collect();
    let (v, to) = w.filter_datagram(&refs, 2, Dir::Out, 1, 1);
    assert_eq!(v, Verdict::Pass);
    let to = to.expect("the datagram's translation");
    let mut out = f.clone();
    for x in &mut out {
        assert!(xpf_wire::translate::apply_fragment(x, &to));
        assert!(ip_ok(x));
        assert_eq!(x[26..30], [192, 0, 2, 1]);
    }
    let sport = u16::from_be_bytes([out[0][34], out[0][35]]);
    assert!((50001..=50010).contains(&sport), "{sport}");
    let carried = u16::from_be_bytes([out[0][40], out[0][41]]);
    out[0][40..42].copy_from_slice(&[0, 0]);
    assert_eq!(carried, udp_sum(&out), "the UDP checksum follows the translation");
    assert_eq!(out[1][34..], f[1][34..], "a later fragment's payload is left alone");
    // In: the reply's fragments, to the public address and port, reach the inside host.
    let mut r = frags4(12, 53, 2000, &[1480]);
    readdress(&mut r, [198, 51, 100, 1], [192, 0, 2, 1], 53, sport);
    let v = run(&mut w, &[r[1].clone(), r[0].clone()], Dir::In, 2);
    assert_eq!(v, vec![Verdict::Held; 2]);
    assert_eq!(w.batch().released_translated, 1 << 1, "released with the frame that completed it");
    let back: Vec<Vec<u8>> = std::mem::take(&mut w.batch_mut().released).into_iter().map(|x| x.1).collect();
    for x in &back {
        assert!(ip_ok(x));
        assert_eq!(x[30..34], [10, 0, 1, 2]);
    }
    assert_eq!(u16::from_be_bytes([back[0][36], back[0][37]]), 40000);
    let carried = u16::from_be_bytes([back[0][40], back[0][41]]);
    let mut check = back.clone();
    check[0][40..42].copy_from_slice(&[0, 0]);
    assert_eq!(carried, udp_sum(&check));
}

/// `pass` in, `pass out nat-to 192.0.2.1 port 50001:50010` (pool 1): a firewall between
/// interface 1 (inside) and 2 (outside).
struct Gateway(Vec<nat::Pool>);

impl Policy for Gateway {
    fn evaluate(&self, _: &PDesc, kif: u16, dir: Dir) -> Decision {
        match dir {
            Dir::Out if kif == 2 => Decision { nat: 1, ..Decision::PASS },
            _ => Decision::PASS,
        }
    }
    fn pool(&self, i: u32) -> Option<&nat::Pool> {
        self.0.get(i as usize - 1)
    }
}

/// Frame `f` through the worker as xpfd forwards it (`in` on `from`, `out` on the other
/// interface, each pass's rewrite applied): what leaves.
fn forwarded<P: Policy>(w: &mut Worker<P>, f: &[u8], from: u16, now: u32) -> Vec<u8> {
    let mut f = f.to_vec();
    for (dir, kif) in [(Dir::In, from), (Dir::Out, 3 - from)] {
        let mut v = [Verdict::Pass];
        w.process(&[&f[..]], kif, dir, now, &mut v);
        assert_eq!(v[0], Verdict::Pass, "{dir:?} on {kif}");
        if w.batch().translated & 1 != 0 {
            f = rewritten(w, 0, &f);
        }
    }
    f
}

#[test]
fn the_fast_path_holds_a_translated_flow_by_its_states_each_way() {
    let mut w = worker(Gateway(std::mem::take(&mut natting(50001, 50010).policy.0)), 1000);
    let (c, s) = ([10, 0, 1, 2], [198, 51, 100, 1]);
    let syn = tcp4(c, s, 40000, 80, tcp::SYN);
    let syn_sent = forwarded(&mut w, &syn, 1, 1);
    let port = pd_of(&syn_sent).sport;
    assert_eq!(pd_of(&syn_sent).src, xpf_wire::Addr::v4([192, 0, 2, 1]));
    // Not established yet: no TCP fast path, but the states are found.
    let f = w.fast_flow(&syn, &syn_sent, 1, 2).expect("both states");
    assert!(f.translated);
    assert!(w.fast_tcp(&f.states).is_none());
    let mut synack = tcp4(s, [192, 0, 2, 1], 80, port, tcp::SYN | tcp::ACK);
    synack[38..42].copy_from_slice(&5000u32.to_be_bytes());
    synack[42..46].copy_from_slice(&1u32.to_be_bytes());
    let synack_sent = forwarded(&mut w, &synack, 2, 1);
    assert_eq!((pd_of(&synack_sent).dst, pd_of(&synack_sent).dport), (xpf_wire::Addr::v4(c), 40000));
    let mut ack = tcp4(c, s, 40000, 80, tcp::ACK);
    ack[38..42].copy_from_slice(&1u32.to_be_bytes());
    ack[42..46].copy_from_slice(&5001u32.to_be_bytes());
    let ack_sent = forwarded(&mut w, &ack, 1, 1);
    // Out: the inside state, then the translating one (by its stack key).
    let out = w.fast_flow(&ack, &ack_sent, 1, 2).expect("out");
    // Back: the translating state by its wire key, then the inside one.
    let back = w.fast_flow(&synack, &synack_sent, 2, 1).expect("back");
    assert_eq!(back.states, out.states.reversed());
    assert!(out.translated && back.translated);
    let (to, tb) = (w.fast_tcp(&out.states).expect("established"), w.fast_tcp(&back.states).expect("established"));
    assert_eq!(to.from, 1 - tb.from);
    assert_eq!(to.peers, tb.peers);
    // A frame that left otherwise than the states translate it names no flow.
    assert!(w.fast_flow(&synack, &synack, 2, 1).is_none());
    // Accounting by reference; gone with its state, and a reused id is told by its sequence.
    assert!(w.flow_account(&out.states, Some((3, 300)), 2));
    assert!(w.flow_deadline(&out.states).is_some());
    let stale = FlowRef { seqs: [out.states.seqs[0], out.states.seqs[1].wrapping_add(1)], ..out.states };
    assert!(!w.flow_account(&stale, None, 2));
    assert!(w.t4.remove(out.states.ids[1]));
    assert!(!w.flow_account(&out.states, None, 2));
    assert!(w.fast_tcp(&out.states).is_none());
    assert!(w.flow_deadline(&out.states).is_none());
}

#[test]
fn an_untranslated_forwarded_flow_is_held_by_its_states() {
    let mut w = worker(PassAll, 100);
    let f = udp4([10, 0, 1, 2], [10, 0, 2, 2], 4000, 53);
    let sent = forwarded(&mut w, &f, 1, 1);
    assert_eq!(sent, f);
    let h = w.fast_flow(&f, &sent, 1, 2).expect("both states");
    assert!(!h.translated);
    assert_eq!(h.packets, 1);
}

/// pf_normalize_tcp, before states and rules: segments no TCP sends are dropped as
/// `normalize` (null, FIN and Xmas scans, SYN with RST, FIN without ACK); a SYN's FIN is
/// taken off (the rules and the state see a SYN, the server gets one), and reserved bits and
/// an urgent pointer without URG are zeroed in the frame that goes on, its checksum right.
#[test]
fn tcp_segments_are_normalized_as_pf_normalizes_them() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let mut w = worker(
        move |pd: &PDesc, _: u16, _: Dir| {
            s2.lock().unwrap().push(pd.tcp_flags);
            Decision::PASS
        },
        100,
    );
    let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    use tcp::{ACK, FIN, PSH, RST, SYN, URG};
    for (flags, what) in [
        (0, "null scan"),
        (FIN, "FIN scan"),
        (FIN | PSH | URG, "Xmas scan"),
        (SYN | RST, "SYN+RST"),
        (PSH, "PSH alone"),
    ] {
        let v = run(&mut w, &[ck(tcp4(c, s, 4000, 80, flags))], Dir::In, 1);
        assert_eq!(v, vec![Verdict::Drop(Reason::Normalize)], "{what}");
    }
    assert!(seen.lock().unwrap().is_empty(), "no rule saw them");
    assert_eq!(w.states(), 0);
    // Sent on as the I/O layer would: the batch's scrub actions applied.
    let pass = |w: &mut Worker<_>, f: Vec<u8>| {
        let mut f = ck(f);
        assert_eq!(run(w, std::slice::from_ref(&f), Dir::In, 1), vec![Verdict::Pass]);
        let b = w.batch();
        if b.scrubbed & 1 != 0 {
            assert!(proto::apply_scrub(&mut f, &b.scrubs[0]));
        }
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), tcp_cksum(&f), "checksum kept valid");
        (f, b.scrubbed & 1 != 0)
    };
    let (syn, cleaned) = pass(&mut w, tcp4(c, s, 4000, 80, SYN | FIN));
    assert!(cleaned);
    assert_eq!(syn[47], SYN, "the FIN is taken off the SYN");
    assert_eq!(seen.lock().unwrap().pop(), Some(SYN), "the rules saw a SYN");
    let mut odd = tcp4(c, s, 4001, 80, ACK | RST);
    odd[46] |= 0x0f;
    odd[52..54].copy_from_slice(&7u16.to_be_bytes());
    let (f, cleaned) = pass(&mut w, odd);
    assert!(cleaned);
    assert_eq!((f[46], f[47], &f[52..54]), (0x50, ACK | RST, &[0u8, 0][..]), "reserved bits and urgent pointer zeroed");
    // An urgent pointer with URG stays; a clean segment is not touched.
    let mut urg = tcp4(c, s, 4002, 80, ACK | URG);
    urg[52..54].copy_from_slice(&7u16.to_be_bytes());
    let (f, cleaned) = pass(&mut w, urg);
    assert!(!cleaned && f[52..54] == [0, 7]);
    let (_, cleaned) = pass(&mut w, tcp4(c, s, 4003, 80, SYN | ACK));
    assert!(!cleaned);
    let norm = w.stats.reasons[Reason::Normalize as usize];
    assert_eq!(norm, 5, "each counted as normalize");
}

/// `pass in route-to (if2 192.0.2.1)` for port 53 and `pass in reply-to (if2 192.0.2.1)` for
/// port 54, interfaces 1 (where the clients are), 2 and 3; out passes.
struct Routing([RouteTarget; 2]);

impl Policy for Routing {
    fn evaluate(&self, pd: &PDesc, _: u16, dir: Dir) -> Decision {
        let route = match (dir, pd.dport) {
            (Dir::In, 53) => 1,
            (Dir::In, 54) => 2,
            _ => 0,
        };
        Decision { route, ..Decision::PASS }
    }
    fn route(&self, i: u16) -> Option<&RouteTarget> {
        self.0.get((i as usize).wrapping_sub(1))
    }
}

fn run_on<P: Policy>(w: &mut Worker<P>, f: &[u8], ifidx: u16, dir: Dir, now: u32) -> (Verdict, u16) {
    let mut v = [Verdict::Pass];
    w.process(&[f], ifidx, dir, now, &mut v);
    (v[0], w.batch().routes[0])
}

#[test]
fn route_to_marks_the_states_way_and_reply_to_the_other() {
    let hop =
        |reply| RouteTarget { reply, ifidx: 2, af: xpf_wire::pdesc::AF_INET, addr: xpf_wire::Addr::v4([192, 0, 2, 1]) };
    let mut w = worker(Routing([hop(false), hop(true)]), 1000);
    let (client, server) = ([10, 0, 0, 1], [10, 9, 9, 9]);
    // route-to: the first packet and the state's later ones in its rule's direction go to
    // the target; the replies go by the table.
    let q = udp4(client, server, 4000, 53);
    assert_eq!(run_on(&mut w, &q, 1, Dir::In, 1), (Verdict::Pass, 1));
    assert_eq!(run_on(&mut w, &q, 1, Dir::In, 1), (Verdict::Pass, 1));
    let a = udp4(server, client, 53, 4000);
    assert_eq!(run_on(&mut w, &a, 1, Dir::Out, 1), (Verdict::Pass, 0));
    // reply-to: not the first packet's way; its replies are, and one leaving by another
    // interface than the target's passes there unfiltered (pf's STATE_LOOKUP), its state
    // untouched until it leaves by the target's.
    let q = udp4(client, server, 4001, 54);
    assert_eq!(run_on(&mut w, &q, 1, Dir::In, 2), (Verdict::Pass, 0));
    let id = w.t4.iter().find(|(_, s)| s.key.port(1) == 54).unwrap().0;
    let a = udp4(server, client, 54, 4001);
    assert_eq!(run_on(&mut w, &a, 3, Dir::Out, 2), (Verdict::Pass, 2));
    assert_eq!(w.t4.state(id).packets, [1, 0]);
    assert_eq!(run_on(&mut w, &a, 2, Dir::Out, 2), (Verdict::Pass, 2));
    assert_eq!(w.t4.state(id).packets, [1, 1]);
    // A packet of no such state has no target, and a batch's routes start empty.
    let other = udp4(client, server, 4002, 99);
    assert_eq!(run_on(&mut w, &other, 1, Dir::In, 3), (Verdict::Pass, 0));
    assert_eq!(w.t4.actions.len(), 2);
    // A datagram in fragments: its target comes with the frame that completed it, and the
    // `out` pass of a reassembled one names its own.
    w.set_reassemble(true, 100, 60);
    let mut f = frags4(21, 53, 3000, &[1480]);
    readdress(&mut f, client, server, 4000, 53);
    let v = run(&mut w, &[f[1].clone(), f[0].clone()], Dir::In, 4);
    assert_eq!(v, vec![Verdict::Held; 2]);
    assert_eq!((w.batch().released.len(), w.batch().routes[1]), (2, 1));
    let mut r = frags4(22, 4001, 3000, &[1480]);
    readdress(&mut r, server, client, 54, 4001);
    let refs: Vec<&[u8]> = r.iter().map(|x| &x[..]).collect();
    assert_eq!(w.filter_datagram(&refs, 2, Dir::Out, 1, 4).0, Verdict::Pass);
    assert_eq!(w.datagram_route(), 2);
    let refs: Vec<&[u8]> = f.iter().map(|x| &x[..]).collect();
    w.filter_datagram(&refs, 2, Dir::Out, 1, 4);
    assert_eq!(w.datagram_route(), 0, "the `out` pass of a route-to flow's datagram: none");
}
