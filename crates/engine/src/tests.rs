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
    Worker::new(WorkerConfig { limit, rows: None, seed: Seed::fixed(9), events: 0, now: 0, prefault: false }, p)
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
    assert_eq!(s.rule, 3);
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
