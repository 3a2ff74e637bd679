//! Sequences of frames through two workers, as xpfd runs them: one with `synproxy state`, one
//! with `set syncookies always` (the same frames go to both). Each frame goes `in` on
//! interface 1 or 2 (the second byte of its chunk chooses), the segments the filter sends
//! must parse, and the frames that go on as another segment go through the `out` pass in the
//! frame's place. Input: chunks of [len, dir, frame...].
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use xpf_conf::Ruleset;
use xpf_engine::{Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::PDesc;

const PROXY: &str = "block all\npass in on one proto tcp to port 80 synproxy state\npass out proto tcp\n\
    pass in on two proto tcp from port 80\n";
const COOKIES: &str = "block all\npass in on one proto tcp to port 80\npass out proto tcp\n\
    pass in on two proto tcp from port 80\n";

fn worker(rules: &str, cookies: bool) -> Worker<Ruleset> {
    let cfg = WorkerConfig { limit: 512, rows: None, seed: Seed::fixed(2), events: 0, now: 0, prefault: false, secret: [5; 32] };
    let r = Ruleset::compile(&xpf_conf::parse(rules, "fuzz", &[]), &|n| Some(if n == "one" { 1 } else { 2 })).unwrap();
    let mut w = Worker::new(cfg, r).unwrap();
    if cookies {
        w.set_syncookies(xpf_engine::syncookie::Mode::Always, Some([6; 32]));
    }
    w
}

thread_local! {
    static W: RefCell<([Worker<Ruleset>; 2], u32)> = RefCell::new(([worker(PROXY, false), worker(COOKIES, true)], 0));
}

fn parses(f: &[u8]) {
    let mut pd = PDesc::default();
    assert_eq!(xpf_wire::parse_ether(f, &mut pd), Ok(()), "a segment the filter built: {f:?}");
}

fn run(w: &mut Worker<Ruleset>, data: &[u8], now: u32) {
    let mut rest = data;
    while rest.len() >= 2 {
        let (len, dir) = (rest[0] as usize, rest[1]);
        let frame = &rest[2..(2 + len).min(rest.len())];
        rest = &rest[(2 + len).min(rest.len())..];
        let (inif, outif) = if dir & 1 == 0 { (1, 2) } else { (2, 1) };
        let mut v = [Verdict::Pass];
        let mut tags = [0u16];
        w.process_tagged(&[frame], inif, Dir::In, inif, now, &mut v, &mut tags, 0);
        let answers: Vec<_> = std::mem::take(&mut w.batch_mut().returns);
        for (_, a) in answers {
            parses(&a);
            w.recycle(a);
        }
        let swapped = std::mem::take(&mut w.batch_mut().substitutes);
        let out: &[u8] = swapped.first().map_or(frame, |(_, b)| &b[..]);
        if let Some((_, b)) = swapped.first() {
            parses(b);
        }
        if v[0] == Verdict::Pass {
            w.process_tagged(&[out], outif, Dir::Out, inif, now, &mut v, &mut tags, 0);
            let answers: Vec<_> = std::mem::take(&mut w.batch_mut().returns);
            for (_, a) in answers {
                parses(&a);
                w.recycle(a);
            }
            for (_, b) in w.batch_mut().substitutes.drain(..) {
                parses(&b);
            }
        }
    }
    w.maintain(now, 64);
    let s = w.stats;
    assert_eq!(s.passed + s.dropped + s.to_host, s.packets);
    assert!(w.halfopen() <= w.states(), "half-open {} of {} states", w.halfopen(), w.states());
}

fuzz_target!(|data: &[u8]| {
    W.with(|w| {
        let (ws, now) = &mut *w.borrow_mut();
        *now += 1;
        for w in ws.iter_mut() {
            run(w, data, *now);
        }
    });
});
