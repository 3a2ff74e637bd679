//! Arbitrary bytes as a frame, through the descriptor parser (both paths must agree) and the
//! whole worker path, in both directions, under a ruleset that tags, answers blocked packets
//! (`block return`), modulates TCP and translates (`nat-to` out, `rdr-to` in; the second copy
//! of the frame comes in as addressed to this host, at a translation target). Every rewrite
//! is applied, and a frame the parser took before must still parse after it (its IPv4 header
//! checksum still right). One worker lives across inputs, so states made by earlier inputs
//! meet later ones.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use xpf_conf::Ruleset;
use xpf_engine::{Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::{pdesc, PDesc};

const RULES: &str = "block return in proto { tcp, udp, icmp } to port 7\n\
    block return-icmp6 in inet6 proto udp to port 9\n\
    match in tos 0x10 tag LOW\n\
    pass in proto { tcp, udp, icmp, ipv6-icmp } tag T\n\
    pass out tagged T\n\
    pass out proto tcp modulate state\n\
    match out inet proto { tcp, udp, icmp } nat-to 192.0.2.1 port 1024:1100\n\
    match in inet proto tcp to port 8080 rdr-to 10.9.9.9 port 80\n";

fn ruleset() -> Ruleset {
    let p = xpf_conf::parse(RULES, "fuzz", &[]);
    Ruleset::compile(&p, &|_| Some(1)).unwrap()
}

thread_local! {
    static W: RefCell<(Worker<Ruleset>, u32)> = RefCell::new((
        Worker::new(WorkerConfig { limit: 256, rows: None, seed: Seed::fixed(1), events: 16, now: 0, prefault: false, secret: [3; 32] }, ruleset()).unwrap(),
        0,
    ));
}

fuzz_target!(|data: &[u8]| {
    let mut a = PDesc::default();
    let mut b = PDesc::default();
    let ra = xpf_wire::parse_ether(data, &mut a);
    let rb = pdesc::parse_ether_general(data, &mut b);
    assert_eq!(ra, rb);
    if ra.is_ok() {
        assert_eq!(a, b);
    }
    let _ = xpf_wire::parse_raw_ip(data, &mut a);
    W.with(|w| {
        let (w, now) = &mut *w.borrow_mut();
        *now += 1;
        let mut v = [Verdict::Pass; 2];
        let mut tags = [0u16; 2];
        w.process_tagged(&[data, data], 1, Dir::In, 1, *now, &mut v, &mut tags, 0b10);
        translated_still_parse(w, &[data, data], ra.is_ok());
        let answers: Vec<(u8, Vec<u8>)> = std::mem::take(&mut w.batch_mut().returns);
        for (i, a) in answers {
            // An answer is a well-formed frame the parser takes.
            assert!(i < 2);
            let mut pd = PDesc::default();
            assert_eq!(xpf_wire::parse_ether(&a, &mut pd), Ok(()), "answer {a:?}");
            w.recycle(a);
        }
        w.process_tagged(&[data], 2, Dir::Out, 1, *now, &mut v[..1], &mut tags[..1], 0);
        translated_still_parse(w, &[data], ra.is_ok());
        w.maintain(*now, 64);
        w.t4.drain_events(|_, _| {});
        w.t6.drain_events(|_, _| {});
        let s = w.stats;
        assert_eq!(s.passed + s.dropped + s.to_host, s.packets);
    });
});

/// Applies the last batch's rewrites to copies of `frames`; each must parse again when the
/// original did.
fn translated_still_parse(w: &Worker<Ruleset>, frames: &[&[u8]], parsed: bool) {
    for (i, f) in frames.iter().enumerate() {
        let b = w.batch();
        if b.translated & (1 << i) == 0 {
            continue;
        }
        let mut c = f.to_vec();
        xpf_wire::translate::apply(&mut c, &b.rewrites[i]);
        if parsed {
            let mut pd = PDesc::default();
            assert_eq!(xpf_wire::parse_ether(&c, &mut pd), Ok(()), "translated {c:?}");
        }
    }
}
