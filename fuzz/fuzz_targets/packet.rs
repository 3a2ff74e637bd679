//! Arbitrary bytes as a frame, through the descriptor parser (both paths must agree) and the
//! whole worker path, in both directions. One worker lives across inputs, so states made by
//! earlier inputs meet later ones.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use xpf_engine::{PassAll, Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::{pdesc, PDesc};

thread_local! {
    static W: RefCell<(Worker<PassAll>, u32)> = RefCell::new((
        Worker::new(WorkerConfig { limit: 256, rows: None, seed: Seed::fixed(1), events: 16, now: 0, prefault: false }, PassAll).unwrap(),
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
        w.process(&[data, data], 1, Dir::In, *now, &mut v);
        w.process(&[data], 2, Dir::Out, *now, &mut v);
        w.maintain(*now, 64);
        w.t4.drain_events(|_, _| {});
        w.t6.drain_events(|_, _| {});
        let s = w.stats;
        assert_eq!(s.passed + s.dropped + s.to_host, s.packets);
    });
});
