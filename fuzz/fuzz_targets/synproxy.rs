//! Sequences of frames through a worker with `synproxy state`, as xpfd runs them: each frame
//! `in` on interface 1 or 2 (the first byte of its chunk chooses), the segments the filter
//! sends must parse, and the frames that go on as another segment go through the `out` pass
//! in the frame's place. Input: chunks of [len, dir, frame...].
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use xpf_conf::Ruleset;
use xpf_engine::{Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::PDesc;

const RULES: &str = "block all\npass in on one proto tcp to port 80 synproxy state\npass out proto tcp\n\
    pass in on two proto tcp from port 80\n";

thread_local! {
    static W: RefCell<(Worker<Ruleset>, u32)> = RefCell::new((
        Worker::new(
            WorkerConfig { limit: 512, rows: None, seed: Seed::fixed(2), events: 0, now: 0, prefault: false, secret: [5; 32] },
            Ruleset::compile(&xpf_conf::parse(RULES, "fuzz", &[]), &|n| Some(if n == "one" { 1 } else { 2 })).unwrap(),
        )
        .unwrap(),
        0,
    ));
}

fn parses(f: &[u8]) {
    let mut pd = PDesc::default();
    assert_eq!(xpf_wire::parse_ether(f, &mut pd), Ok(()), "a segment the filter built: {f:?}");
}

fuzz_target!(|data: &[u8]| {
    W.with(|w| {
        let (w, now) = &mut *w.borrow_mut();
        *now += 1;
        let mut rest = data;
        while rest.len() >= 2 {
            let (len, dir) = (rest[0] as usize, rest[1]);
            let frame = &rest[2..(2 + len).min(rest.len())];
            rest = &rest[(2 + len).min(rest.len())..];
            let (inif, outif) = if dir & 1 == 0 { (1, 2) } else { (2, 1) };
            let mut v = [Verdict::Pass];
            let mut tags = [0u16];
            w.process_tagged(&[frame], inif, Dir::In, *now, &mut v, &mut tags);
            let answers: Vec<_> = w.take_returns().collect();
            for (_, a) in answers {
                parses(&a);
                w.recycle(a);
            }
            let swapped: Vec<_> = w.take_substitutes().collect();
            let out: &[u8] = swapped.first().map_or(frame, |(_, b)| &b[..]);
            if let Some((_, b)) = swapped.first() {
                parses(b);
            }
            if v[0] == Verdict::Pass {
                w.process_tagged(&[out], outif, Dir::Out, *now, &mut v, &mut tags);
                let answers: Vec<_> = w.take_returns().collect();
                for (_, a) in answers {
                    parses(&a);
                    w.recycle(a);
                }
                for (_, b) in w.take_substitutes() {
                    parses(&b);
                }
            }
        }
        w.maintain(*now, 64);
        let s = w.stats;
        assert_eq!(s.passed + s.dropped + s.to_host, s.packets);
    });
});
