//! The alternative to per-worker tables that docs/state-table.md weighs: one table shared by
//! all workers, its rows striped over spin locks (64 stripes, each a table of its own), so that
//! any worker can take any packet and no flow steering is needed. Each packet takes its
//! stripe's lock; rows are prefetched before, but entries cannot be (a row read without the
//! lock could be changing under another worker's insert).

use crate::runner::{Measured, CHUNK};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;
use xpf_io::gen::{Gen, FRAME_LEN};
use xpf_state::{Config, Dir, Key, Key4, NewState, Seed, StateTable, Timeout, ID_MASK};
use xpf_wire::{parse_ether, PDesc};

pub const STRIPES: usize = 64;

#[repr(align(64))]
struct Stripe {
    locked: AtomicBool,
    t: UnsafeCell<StateTable<Key4>>,
}

// SAFETY: `t` is only reached with `locked` held (or, for prefetch_row, through fields no
// thread writes while the bench runs: the row array's base and length, fixed by `rows`).
unsafe impl Sync for Stripe {}

impl Stripe {
    #[inline(always)]
    fn lock(&self) -> Guard<'_> {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        Guard(self)
    }
}

/// The stripe's table while its lock is held; dropping it unlocks.
struct Guard<'a>(&'a Stripe);

impl std::ops::Deref for Guard<'_> {
    type Target = StateTable<Key4>;
    fn deref(&self) -> &StateTable<Key4> {
        // SAFETY: the lock is held for the guard's life.
        unsafe { &*self.0.t.get() }
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut StateTable<Key4> {
        // SAFETY: the lock is held for the guard's life, and the guard is not shared.
        unsafe { &mut *self.0.t.get() }
    }
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.locked.store(false, Ordering::Release);
    }
}

struct Shared {
    stripes: Vec<Stripe>,
    seed: Seed,
}

impl Shared {
    fn new(limit: u64) -> Shared {
        let seed = Seed::random();
        let per = (limit / STRIPES as u64) * 5 / 4 + 64;
        let stripes = (0..STRIPES)
            .map(|_| Stripe {
                locked: AtomicBool::new(false),
                t: UnsafeCell::new(
                    StateTable::new(Config {
                        limit: per as u32,
                        rows: Some(xpf_state::auto_rows(per as u32)),
                        seed,
                        events: 0,
                        now: 1,
                        grow_from: None,
                        prefault: false,
                    })
                    .unwrap(),
                ),
            })
            .collect();
        Shared { stripes, seed }
    }

    /// The same work as the worker's path (parse, key, lookup or insert, count), per packet
    /// under its stripe's lock. Returns packets passed.
    fn process(&self, frames: &[&[u8]], now: u32, pd: &mut [PDesc], keys: &mut [Key4], hs: &mut [u64]) -> usize {
        let n = frames.len();
        for i in 0..n {
            pd[i] = PDesc::default();
            if parse_ether(frames[i], &mut pd[i]).is_err() {
                hs[i] = u64::MAX;
                continue;
            }
            keys[i] = Key4::from_pdesc(&pd[i], Dir::In, 0);
            hs[i] = keys[i].hash_with(&self.seed);
            let s = &self.stripes[((hs[i] >> 32) as usize) % STRIPES];
            // SAFETY: see `unsafe impl Sync`: only the fixed row array is read.
            unsafe { (*s.t.get()).prefetch_row(hs[i]) };
        }
        let mut passed = 0;
        for i in 0..n {
            if hs[i] == u64::MAX {
                continue;
            }
            let s = &self.stripes[((hs[i] >> 32) as usize) % STRIPES];
            let mut t = s.lock();
            let ok = match t.find(&keys[i], hs[i]) {
                Some(r) => {
                    t.touch(r & ID_MASK, Dir::In, pd[i].ip_len, now);
                    true
                }
                None => {
                    let ns = NewState {
                        key: keys[i],
                        stack: None,
                        dir: Dir::In,
                        rule: 0,
                        timeout: Timeout::UdpFirst,
                        src_state: 1,
                        dst_state: 0,
                        tcp: None,
                        nosync: false,
                        allow_opts: false,
                        sloppy: false,
                        tag: 0,
                        scrub: 0,
                        rate: 0,
                        pflow: false,
                        log: 0,
                        queue: 0,
                        route: 0,
                        held: 0,
                    };
                    match t.insert(hs[i], ns, now) {
                        Ok(id) => {
                            t.touch(id, Dir::In, pd[i].ip_len, now);
                            true
                        }
                        Err(_) => false,
                    }
                }
            };
            t.counters.searches += 1;
            drop(t);
            passed += ok as usize;
        }
        passed
    }

    fn states(&self) -> u64 {
        self.stripes.iter().map(|s| s.lock().len() as u64).sum()
    }
}

#[allow(clippy::too_many_arguments)]
fn pump(
    sh: &Shared,
    gen: &Gen,
    pos: &mut u64,
    min_pkts: u64,
    min_secs: f64,
    batch: usize,
    now: u32,
    buf: &mut [[u8; FRAME_LEN]],
) -> (u64, f64, u64) {
    let (mut pkts, mut secs, mut passed) = (0u64, 0f64, 0u64);
    let mut pd = [PDesc::default(); 64];
    let mut keys = [Key4::default(); 64];
    let mut hs = [0u64; 64];
    while pkts < min_pkts || secs < min_secs {
        let k = if min_secs == 0.0 { ((min_pkts - pkts) as usize).min(CHUNK) } else { CHUNK };
        for b in &mut buf[..k] {
            gen.write(*pos, b);
            *pos = (*pos + 1) % gen.flows();
        }
        let mut frames: [&[u8]; 64] = [&[]; 64];
        let t = Instant::now();
        for c in buf[..k].chunks(batch) {
            for (f, b) in frames.iter_mut().zip(c) {
                *f = &b[..];
            }
            passed += sh.process(&frames[..c.len()], now, &mut pd, &mut keys, &mut hs) as u64;
        }
        secs += t.elapsed().as_secs_f64();
        pkts += k as u64;
    }
    (pkts, secs, passed)
}

/// Warms the shared table with all flows (split between the workers), then measures runs in
/// which every worker sends every flow, starting at different points.
pub fn shared_runs(gen: &Gen, workers: usize, runs: usize, min_secs: f64, batch: usize) -> Measured {
    let rss0 = crate::sys::rss();
    let sh = Arc::new(Shared::new(gen.flows()));
    let n = gen.flows();
    let barrier = Arc::new(Barrier::new(workers + 1));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut hs = Vec::new();
    for w in 0..workers {
        let (sh, gen, barrier, tx) = (sh.clone(), gen.clone(), barrier.clone(), tx.clone());
        hs.push(std::thread::spawn(move || {
            crate::sys::pin(w);
            let mut buf = vec![[0u8; FRAME_LEN]; CHUNK];
            let (lo, hi) = (n * w as u64 / workers as u64, n * (w as u64 + 1) / workers as u64);
            let mut pos = lo;
            let (p, s, _) = pump(&sh, &gen, &mut pos, hi - lo, 0.0, batch, 1, &mut buf);
            tx.send(p as f64 / s).unwrap();
            barrier.wait();
            for _ in 0..runs {
                barrier.wait();
                let (p, s, passed) = pump(&sh, &gen, &mut pos, n.min(1 << 22), min_secs, batch, 2, &mut buf);
                assert_eq!(passed, p);
                tx.send(p as f64 / s).unwrap();
                barrier.wait();
            }
        }));
    }
    drop(tx);
    let warm_rate: f64 = (0..workers).map(|_| rx.recv().unwrap()).sum();
    barrier.wait();
    assert_eq!(sh.states(), n);
    let rss1 = crate::sys::rss();
    let mut out = Vec::new();
    for _ in 0..runs {
        barrier.wait();
        out.push((0..workers).map(|_| rx.recv().unwrap()).sum());
        barrier.wait();
    }
    for h in hs {
        h.join().unwrap();
    }
    Measured { runs: out, warm_rate, rss_per_state: rss1.saturating_sub(rss0) as f64 / n as f64, extra: Vec::new() }
}
