//! Arbitrary text as pf.conf: the parser must answer rules or errors, never panic, and what it
//! accepts must print to a fixed point (printed, parsed again and printed: the same text).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    let p = xpf_conf::parse(&src, "fuzz", &[]);
    if p.errors.is_empty() {
        // Refusing and compiling what parsed never panics either.
        let _ = xpf_conf::support::refusals(&p);
        // Against a fixed set of routes (no rtnetlink dump per input): a default route out of
        // interface 1 and a blackhole.
        let fib = xpf_conf::routes::Fib {
            routes: vec![
                xpf_conf::routes::Route { addr: [0u8; 4].into(), len: 0, reject: false, oifs: vec![1] },
                xpf_conf::routes::Route { addr: [192, 0, 2, 0].into(), len: 24, reject: true, oifs: vec![] },
            ],
        };
        let _ = xpf_conf::Ruleset::compile_at(&p, &|_| Some(1), &fib);
        let once = xpf_conf::print::ruleset(&p.rules);
        let q = xpf_conf::parse(&once, "printed", &[]);
        assert!(q.errors.is_empty(), "printed form refused: {:?}\n{once}", q.errors);
        assert_eq!(xpf_conf::print::ruleset(&q.rules), once);
    }
});
