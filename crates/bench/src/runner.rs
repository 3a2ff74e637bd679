//! Measuring loops. Frames are generated a chunk at a time into a buffer that stays in cache
//! (as an RX ring's frames are when the worker reads them) and only the engine's work on them
//! is timed: the generator's cost is outside every figure.

use crate::engines::Engine;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use xpf_io::gen::{Gen, FRAME_LEN};

pub const CHUNK: usize = 4096;

/// A stream of frames over flows `start, start + stride, ...` of a generator, wrapping.
pub struct Feed {
    gen: Gen,
    start: u64,
    stride: u64,
    /// Flows in this feed.
    pub count: u64,
    pos: u64,
    /// Multiplier of the scattered order; 1 keeps pkt-gen's order.
    scatter: u64,
    buf: Vec<[u8; FRAME_LEN]>,
}

impl Feed {
    pub fn new(gen: Gen, start: u64, stride: u64) -> Feed {
        let count = (gen.flows() - start).div_ceil(stride);
        Feed { gen, start, stride, count, pos: 0, scatter: 1, buf: vec![[0; FRAME_LEN]; CHUNK] }
    }

    /// Visits this feed's flows in a scattered order (position p -> flow p * S mod count, with
    /// S a prime not dividing count): each flow still once per pass, but states are no longer
    /// met in the order they were created.
    pub fn shuffle(&mut self) {
        const PRIMES: [u64; 3] = [1_000_003, 998_244_353, 2_147_483_647];
        self.scatter = PRIMES.into_iter().find(|p| !self.count.is_multiple_of(*p)).unwrap_or(1) % self.count.max(1);
        if self.scatter == 0 {
            self.scatter = 1;
        }
    }

    fn fill(&mut self, k: usize) {
        for b in &mut self.buf[..k] {
            let i = if self.scatter > 1 {
                ((self.pos as u128 * self.scatter as u128) % self.count as u128) as u64
            } else {
                self.pos
            };
            self.gen.write(self.start + i * self.stride, b);
            self.pos += 1;
            if self.pos == self.count {
                self.pos = 0;
            }
        }
    }
}

/// One timed stretch: packets fed, seconds spent in the engine, packets passed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pumped {
    pub packets: u64,
    pub secs: f64,
    pub passed: u64,
}

/// Feeds at least `min_pkts` packets and at least `min_secs` of engine time, in batches of
/// `batch`; the engine's maintenance runs once per chunk, inside the timed part, as it would in
/// the daemon's loop.
pub fn pump<E: Engine>(e: &mut E, feed: &mut Feed, min_pkts: u64, min_secs: f64, batch: usize, now: u32) -> Pumped {
    let mut p = Pumped::default();
    while p.packets < min_pkts || p.secs < min_secs {
        let k = if min_secs == 0.0 { ((min_pkts - p.packets) as usize).min(CHUNK) } else { CHUNK };
        feed.fill(k);
        let t = Instant::now();
        for c in feed.buf[..k].chunks_mut(batch) {
            // The batch's frames as slices, made afresh for each batch (the transmit stage
            // below writes into them) without initialising all 64.
            let mut frames = [std::mem::MaybeUninit::<&[u8]>::uninit(); 64];
            for (f, b) in frames.iter_mut().zip(c.iter()) {
                f.write(&b[..]);
            }
            // SAFETY: the first c.len() (<= 64, the batch) were written just above.
            let frames = unsafe { std::slice::from_raw_parts(frames.as_ptr() as *const &[u8], c.len()) };
            p.passed += e.process(frames, now) as u64;
            e.transmit(c);
        }
        e.maintain(now);
        p.secs += t.elapsed().as_secs_f64();
        p.packets += k as u64;
    }
    p
}

/// What a point measured for one engine.
pub struct Measured {
    /// Packets per second of each run (summed over workers).
    pub runs: Vec<f64>,
    /// States per second while the table was first filled.
    pub warm_rate: f64,
    /// Resident bytes the engines added, per state.
    pub rss_per_state: f64,
    pub extra: Vec<(String, f64)>,
}

/// Warms `workers` engines (each with its share of the flows, as RSS steering would give them)
/// and measures `runs` runs of established traffic. `make(limit)` builds one engine; `inspect`
/// reads extra figures from the first engine after warming.
#[allow(clippy::too_many_arguments)]
pub fn shard_runs<E: Engine + 'static>(
    gen: &Gen,
    workers: usize,
    runs: usize,
    min_secs: f64,
    batch: usize,
    shuffle: bool,
    make: impl Fn(u64) -> E + Send + Sync + 'static,
    inspect: impl Fn(&E) -> Vec<(String, f64)> + Send + Sync + 'static,
) -> Measured {
    let rss0 = crate::sys::rss();
    let barrier = Arc::new(Barrier::new(workers + 1));
    let make = Arc::new(make);
    let inspect = Arc::new(inspect);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for w in 0..workers {
        let (gen, barrier, make, inspect, tx) =
            (gen.clone(), barrier.clone(), make.clone(), inspect.clone(), tx.clone());
        handles.push(std::thread::spawn(move || {
            crate::sys::pin(w);
            let mut feed = Feed::new(gen, w as u64, workers as u64);
            let mut e = make(feed.count);
            let count = feed.count;
            let warm = pump(&mut e, &mut feed, count, 0.0, batch, 1);
            assert_eq!(e.states(), feed.count, "warm-up must create one state per flow");
            e.settle();
            let extra = if w == 0 { inspect(&e) } else { Vec::new() };
            feed.gen.established();
            if shuffle {
                feed.shuffle();
            }
            tx.send(("warm", warm.packets as f64 / warm.secs, extra)).unwrap();
            let inserts = e.inserts();
            for _ in 0..runs {
                barrier.wait();
                let p = pump(&mut e, &mut feed, count.min(1 << 22), min_secs, batch, 2);
                assert_eq!(p.passed, p.packets, "established traffic must all pass");
                tx.send(("run", p.packets as f64 / p.secs, Vec::new())).unwrap();
                barrier.wait();
            }
            assert_eq!(e.inserts(), inserts, "no state may be created while measuring");
            barrier.wait();
            drop(e);
        }));
    }
    drop(tx);
    let mut warm_rate = 0.0;
    let mut extra = Vec::new();
    for _ in 0..workers {
        let (_, r, x) = rx.recv().unwrap();
        warm_rate += r;
        if !x.is_empty() {
            extra = x;
        }
    }
    let rss1 = crate::sys::rss();
    let mut out = Vec::new();
    for _ in 0..runs {
        barrier.wait();
        let mut sum = 0.0;
        for _ in 0..workers {
            sum += rx.recv().unwrap().1;
        }
        out.push(sum);
        barrier.wait();
    }
    barrier.wait();
    for h in handles {
        h.join().unwrap();
    }
    let states = gen.flows();
    Measured { runs: out, warm_rate, rss_per_state: rss1.saturating_sub(rss0) as f64 / states as f64, extra }
}

/// Two engines on one worker (pinned to CPU 0), each warmed with all of `gen`'s flows, then
/// measured in turn, ABBA, `runs` runs each of established traffic: a ratio of the two taken
/// in the same stretch of time (this VM's speed drifts between minutes). `inspect` reads
/// extra figures from each after warming. Each engine's `rss_per_state` is what building it
/// added.
#[allow(clippy::too_many_arguments)]
pub fn paired_runs<A: Engine, B: Engine>(
    gen: &Gen,
    runs: usize,
    min_secs: f64,
    batch: usize,
    shuffle: bool,
    make_a: impl Fn(u64) -> A,
    make_b: impl Fn(u64) -> B,
    inspect_a: impl Fn(&A) -> Vec<(String, f64)>,
    inspect_b: impl Fn(&B) -> Vec<(String, f64)>,
) -> (Measured, Measured) {
    crate::sys::pin(0);
    fn warm<E: Engine>(
        gen: &Gen,
        batch: usize,
        shuffle: bool,
        make: impl Fn(u64) -> E,
        inspect: impl Fn(&E) -> Vec<(String, f64)>,
    ) -> (E, Feed, Measured) {
        let rss0 = crate::sys::rss();
        let mut feed = Feed::new(gen.clone(), 0, 1);
        let mut e = make(feed.count);
        let count = feed.count;
        let w = pump(&mut e, &mut feed, count, 0.0, batch, 1);
        assert_eq!(e.states(), feed.count, "warm-up must create one state per flow");
        e.settle();
        feed.gen.established();
        if shuffle {
            feed.shuffle();
        }
        let m = Measured {
            runs: Vec::new(),
            warm_rate: w.packets as f64 / w.secs,
            rss_per_state: crate::sys::rss().saturating_sub(rss0) as f64 / count.max(1) as f64,
            extra: inspect(&e),
        };
        (e, feed, m)
    }
    let (mut a, mut fa, mut ma) = warm(gen, batch, shuffle, make_a, inspect_a);
    let (mut b, mut fb, mut mb) = warm(gen, batch, shuffle, make_b, inspect_b);
    let (ia, ib) = (a.inserts(), b.inserts());
    let (ca, cb) = (fa.count.min(1 << 22), fb.count.min(1 << 22));
    fn run<E: Engine>(e: &mut E, f: &mut Feed, count: u64, min_secs: f64, batch: usize) -> f64 {
        let p = pump(e, f, count, min_secs, batch, 2);
        assert_eq!(p.passed, p.packets, "established traffic must all pass");
        p.packets as f64 / p.secs
    }
    for r in 0..runs {
        for first in [r % 2 == 0, r % 2 != 0] {
            if first {
                ma.runs.push(run(&mut a, &mut fa, ca, min_secs, batch));
            } else {
                mb.runs.push(run(&mut b, &mut fb, cb, min_secs, batch));
            }
        }
    }
    assert_eq!((a.inserts(), b.inserts()), (ia, ib), "no state may be created while measuring");
    (ma, mb)
}

/// Packets per second over `gen`'s flows once each: `runs` runs, each of a fresh engine, that
/// `check` holds to what it must have done (given the engine, the run and the flows' count).
fn once_runs<E: Engine>(
    gen: &Gen,
    runs: usize,
    batch: usize,
    make: impl Fn(u64) -> E,
    check: impl Fn(&E, &Pumped, u64),
) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let mut feed = Feed::new(gen.clone(), 0, 1);
            let mut e = make(feed.count);
            let count = feed.count;
            let p = pump(&mut e, &mut feed, count, 0.0, batch, 1);
            check(&e, &p, count);
            p.packets as f64 / p.secs
        })
        .collect()
}

/// New states per second: each run fills a fresh engine with `gen`'s flows once.
pub fn insert_runs<E: Engine>(gen: &Gen, runs: usize, batch: usize, make: impl Fn(u64) -> E) -> Vec<f64> {
    once_runs(gen, runs, batch, make, |e, _, n| assert_eq!(e.states(), n))
}

/// Packets per second an engine that keeps no state (`block all`) decides over `gen`'s flows
/// once each; each run checks that every packet was dropped.
pub fn blocked_runs<E: Engine>(gen: &Gen, runs: usize, batch: usize, make: impl Fn(u64) -> E) -> Vec<f64> {
    once_runs(gen, runs, batch, make, |e, p, _| {
        assert_eq!((e.states(), p.passed), (0, 0), "every packet dropped, no state made")
    })
}
