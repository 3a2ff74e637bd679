//! Arbitrary bytes as a frame, through the descriptor parser (both paths must agree) and the
//! whole worker path, in both directions.
#![no_main]
use libfuzzer_sys::fuzz_target;
use xpf_engine::{PassAll, Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::{pdesc, PDesc};

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
    let cfg = WorkerConfig { limit: 64, rows: None, seed: Seed::fixed(1), events: 16, now: 0, prefault: false };
    let mut w = Worker::new(cfg, PassAll).unwrap();
    let mut v = [Verdict::Pass; 2];
    w.process(&[data, data], 1, Dir::In, 0, &mut v);
    w.process(&[data], 2, Dir::Out, 1, &mut v);
    w.maintain(1000, 100);
});
