//! Received pfsync frames: the checks, the decoder and the tables they are applied to must
//! take any bytes without a panic, and a bad frame must change nothing.
#![no_main]
use libfuzzer_sys::fuzz_target;
use xpf_state::{Config, Key4, Key6, Seed, StateTable};
use xpf_sync::replica::FloatingOnly;
use xpf_sync::{Endpoint, Replica, Tables};

fuzz_target!(|data: &[u8]| {
    let cfg = xpf_sync::Config::new(7);
    let mut ep = Endpoint::new(cfg.clone());
    let mut rep = Replica::new(&cfg, 0);
    let tc = |limit| Config { limit, rows: None, seed: Seed::fixed(3), events: 64, now: 1, prefault: false, grow_from: None };
    let mut t4 = StateTable::<Key4>::new(tc(256)).unwrap();
    let mut t6 = StateTable::<Key6>::new(tc(256)).unwrap();
    let mut msgs = Vec::new();
    // The last byte picks the TTL (mostly 255, as a frame from the link has); the rest is the
    // frame. (Taking it from the first byte, the frame's version, let no frame pass.)
    let (ttl, data) = match data.split_last() {
        Some((&t, f)) => (if t & 0x80 == 0 { 255 } else { t }, f),
        None => (255, data),
    };
    let before = t4.len() + t6.len();
    if ep.receive(0, data, ttl, &mut msgs).is_err() {
        assert!(msgs.is_empty());
        assert_eq!(t4.len() + t6.len(), before);
        return;
    }
    let mut t = Tables { t4: &mut t4, t6: &mut t6 };
    for m in &msgs {
        let _ = xpf_sync::wire::describe(m);
        rep.apply(&mut t, m, 2, &FloatingOnly);
    }
    rep.flush();
    // Whatever went in, what comes out parses.
    for f in rep.ready.drain(..) {
        xpf_sync::frame::parse(&f, None, |_| {}).unwrap();
    }
});
