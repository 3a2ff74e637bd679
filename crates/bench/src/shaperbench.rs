//! `xpf-bench shaper`: the shaper alone (xpf-shape, the code each xpfd worker runs), with N
//! member queues (default 24,000; 1 to 4 parts of one root each, as the shaper lab's tree),
//! fed as fast as one core takes packets: each worker its own tree and its own members (a
//! member's flow reaches one worker, as RSS or the hand-off puts it), every packet enqueued
//! to its member's queue and dequeued through the tree. With several workers a coordinator
//! thread shares the rates between them as xpfd's does (every 2 ms, or 20 times what its
//! tick costs), and each worker reports and takes its shares at that period (or 20 times
//! what its report costs). Runs of 1 and 2 workers alternate, ABBA. The root binds nobody here
//! (100 Gbit/s): the figure is what classifying and scheduling cost per packet, which the
//! shaper lab's saturation phase measures end to end on one worker.
//!
//! A second measurement times one worker's frame on a clock of the bench's own (the
//! shaper takes `now` as an argument), in the two regimes of the shaper lab: a root that binds
//! nobody (every frame leaves as it comes) and every member backlogged (equal shares, the
//! frames offered at 1.5 times the root as the lab's last phase offers them: each member's
//! queue full, a third of the frames dropped at its `qlimit`). Each frame is copied into the
//! shaper's buffer (unless its queue refuses it) and out of it as xpfd's worker copies it; the figure is wall time over
//! frames offered, the regimes alternated.

use crate::stats::{self, Summary};
use crate::Opts;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use xpf_shape::coord::Coord;
use xpf_shape::{ClassSpec, Out, Pkt, Shaper, TreeSpec, DRAIN_BATCH};

const ROOT: u64 = 100_000_000_000;
const FRAME: usize = 60;
const PERIOD: Duration = Duration::from_millis(2);

/// `n` members under a root of `root` bits/s, member i's share `part(i)` parts of it.
fn tree(n: u32, root: u64, part: impl Fn(u64) -> u64) -> TreeSpec {
    let parts: u64 = (0..n as u64).map(&part).sum();
    let mut classes = vec![ClassSpec::new("root", 1, None, root)];
    classes
        .extend((0..n).map(|i| ClassSpec::new(format!("m{i}"), 2 + i as u16, Some(0), root / parts * part(i as u64))));
    classes[1].default = true;
    TreeSpec { ifname: "bench0".into(), classes }
}

/// Packets each of `workers` workers moved through its tree in `secs`.
fn run(n: u32, workers: usize, secs: f64) -> Vec<u64> {
    let spec = Arc::new(tree(n, ROOT, |i| 1 + i % 4));
    let coord = Arc::new(Coord::new(&spec, workers));
    let period = Arc::new(AtomicU64::new(PERIOD.as_nanos() as u64));
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(workers + 1));
    let coordinator = (workers > 1).then(|| {
        let (coord, period, stop) = (coord.clone(), period.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                coord.tick(t.duration_since(last).as_nanos() as u64);
                let p = PERIOD.max(t.elapsed() * 20);
                period.store(p.as_nanos() as u64, Ordering::Relaxed);
                last = t;
                std::thread::sleep(p);
            }
        })
    });
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (spec, coord, period, stop, go) =
                (spec.clone(), coord.clone(), period.clone(), stop.clone(), go.clone());
            std::thread::spawn(move || {
                crate::sys::pin(w);
                let mut sh = Shaper::new(&spec);
                // This worker's members: every workers-th one.
                let mine: Vec<u16> = (0..n).filter(|i| *i as usize % workers == w).map(|i| 2 + i as u16).collect();
                let (mut next, mut done, mut next_sync) = (0usize, 0u64, 0u64);
                go.wait();
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let now = t0.elapsed().as_nanos() as u64;
                    for _ in 0..64 {
                        let q = mine[next];
                        next = if next + 1 == mine.len() { 0 } else { next + 1 };
                        let mut b = sh.buffer();
                        b.resize(FRAME, 0);
                        sh.enqueue(q, Pkt { buf: b, enq: now, meta: 0, extra: 0 }, q as u32, now);
                    }
                    while let Out::Packet(p) = sh.dequeue(now) {
                        sh.recycle(p.buf);
                        done += 1;
                    }
                    if workers > 1 && now >= next_sync {
                        // As xpfd's worker: no more often than 20 times what a report costs.
                        let t = Instant::now();
                        sh.sync(&coord, w, now);
                        next_sync = now + period.load(Ordering::Relaxed).max(t.elapsed().as_nanos() as u64 * 20);
                    }
                }
                done
            })
        })
        .collect();
    go.wait();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let out = handles.into_iter().map(|h| h.join().unwrap_or(0)).collect();
    if let Some(c) = coordinator {
        let _ = c.join();
    }
    out
}

/// The shaper lab's last phase: a root of this many frames/s, offered 1.5 times it.
const BACKLOG_ROOT_PPS: f64 = 200_000.0;
const BACKLOG_OFFERED: f64 = 1.5;

/// ns of one worker's time a frame offered to `n` members in turn, on the bench's clock:
/// `backlogged`, equal shares of a root of [`BACKLOG_ROOT_PPS`] offered 1.5 times it; else
/// the same tree's root at 100 Gbit/s (nothing waits). Also the frames sent and dropped.
fn one_worker(n: u32, backlogged: bool, frames: u64) -> (f64, u64, u64) {
    let root = if backlogged { (BACKLOG_ROOT_PPS * FRAME as f64 * 8.0) as u64 } else { ROOT };
    let sh = Shaper::new(&tree(n, root, |_| 1));
    // The queues fill first, untimed: a member gains half its rate over what it is served,
    // so its 50 frames (pf's qlimit) take 150 of its frames offered.
    let warm = if backlogged { n as u64 * 200 } else { n as u64 };
    offer(sh, n, |i| 2 + i as u16, |i| 2 + i, warm, frames)
}

/// ns of one worker's time a frame offered to one queue of `flows SUBS` (FQ-CoDel) by `n`
/// flows in turn, every one backlogged (the frames offered at 1.5 times the root as above,
/// a third dropped at the queue's 1,024 packets); also the frames sent and dropped.
fn one_fq(subs: u32, n: u32, frames: u64) -> (f64, u64, u64) {
    let root = (BACKLOG_ROOT_PPS * FRAME as f64 * 8.0) as u64;
    let mut spec = tree(1, root, |_| 1);
    spec.classes[1].flows = subs;
    // A flow's hash as xpfd's worker takes it (a keyed hash of its key): a mix of its number.
    let hash = |i: u32| ((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32;
    // The queue's 1,024 packets fill in about 3,000 frames.
    offer(Shaper::new(&spec), n, |_| 2, hash, 8192, frames)
}

/// The FQ-CoDel queues of [`one_fq`]: sub-queues (pf.conf's `flows N`) and flows offered:
/// the common `flows 1024` with 1,000 flows, and pfctl's largest with 30,000 (many small
/// flows over a queue's limit, as a flood of new flows is).
const FQ_CASES: [(u32, u32); 2] = [(1024, 1_000), (32767, 30_000)];

/// Offers `warm` frames untimed then `frames` timed, of `n` sources in turn, to `sh`, source
/// i's to queue `queue(i)` with flow hash `hash(i)`, and drains it as xpfd's worker does.
fn offer(
    mut sh: Shaper,
    n: u32,
    queue: impl Fn(u32) -> u16,
    hash: impl Fn(u32) -> u32,
    warm: u64,
    frames: u64,
) -> (f64, u64, u64) {
    // One frame a member, its source address the member's.
    let frames_of: Vec<[u8; FRAME]> = (0..n)
        .map(|i| {
            let mut f = [0u8; FRAME];
            f[12] = 0x08;
            f[14] = 0x45;
            f[26..30].copy_from_slice(&(0xc612_0000u32 + i).to_be_bytes());
            f
        })
        .collect();
    let gap = 1e9 / (BACKLOG_ROOT_PPS * BACKLOG_OFFERED);
    let (mut clock, mut next, mut sent) = (0f64, 0usize, 0u64);
    // Drops as the queues count them: refused by a full FIFO, or made room for by FQ-CoDel.
    let drops = |sh: &Shaper| sh.stats().map(|(_, s)| s.drop_pkts).sum::<u64>();
    let mut dropped0 = 0;
    let mut tx = [0u8; FRAME];
    let mut batch = Vec::with_capacity(DRAIN_BATCH);
    let mut t0 = Instant::now();
    let mut i = 0u64;
    while i < warm + frames {
        if i == warm {
            (sent, dropped0, t0) = (0, drops(&sh), Instant::now());
        }
        for _ in 0..64 {
            clock += gap;
            let now = clock as u64;
            let (q, h) = (queue(next as u32), hash(next as u32));
            let f = &frames_of[next];
            next = if next + 1 == n as usize { 0 } else { next + 1 };
            // As xpfd's worker holds a frame: refused unbuilt by a full queue, else copied.
            if sh.refuse(q, FRAME) {
                continue;
            }
            let mut b = sh.buffer();
            b.extend_from_slice(f);
            sh.enqueue(q, Pkt { buf: b, enq: now, meta: 0, extra: 0 }, h, now);
        }
        i += 64;
        // As xpfd's worker drains: a batch taken, then copied out.
        loop {
            let end = sh.dequeue_batch(clock as u64, &mut batch, DRAIN_BATCH).is_some();
            for p in batch.drain(..) {
                tx.copy_from_slice(&p.buf[..FRAME]);
                std::hint::black_box(&tx);
                sh.recycle(p.buf);
                sent += 1;
            }
            if end {
                break;
            }
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / frames as f64;
    (ns, sent, drops(&sh) - dropped0)
}

pub fn bench(o: &Opts) -> Result<(), String> {
    let n = if o.shaper > 0 { o.shaper } else { 24_000 };
    let secs = if o.quick { 1.0 } else { o.seconds.max(3.0) };
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    if cpus < 2 {
        return Err("the shaper bench compares 1 and 2 workers: it needs two CPUs".into());
    }
    println!(
        "xpf-bench shaper: {n} member queues (1 to 4 parts of a 100 Gbit/s root), 60-byte packets, each worker its\n\
         own tree and members, a coordinator sharing the rates with 2; {} runs of {secs} s, 1 and 2 workers alternated (ABBA)",
        o.runs
    );
    let (mut one, mut two) = (Vec::new(), Vec::new());
    // ABBA: the order alternates as well, so that neither kind always runs after the other.
    for r in 0..o.runs {
        for workers in if r % 2 == 0 { [1, 2] } else { [2, 1] } {
            let _s = crate::progress::step(if workers == 1 { "1 worker" } else { "2 workers" });
            let pps = run(n, workers, secs).iter().sum::<u64>() as f64 / secs;
            if workers == 1 {
                one.push(pps)
            } else {
                two.push(pps)
            }
        }
    }
    let (a, b) = (Summary::of(&one), Summary::of(&two));
    println!("{}", stats::header("workers", "packets/s through the shaper"));
    println!("{}", stats::row("1", &a));
    println!("{}", stats::row("2", &b));
    println!("  2 workers / 1: {:.2}x", b.median / a.median);
    // One worker's cost a frame, with the root binding nobody and with every member backlogged.
    let frames = if o.quick { 2_000_000 } else { 10_000_000 };
    println!(
        "\none worker's time a frame offered ({frames} frames, {n} members in turn, each copied in and out), on the\n\
         bench's clock: the root binding nobody, and equal shares of a root of {BACKLOG_ROOT_PPS:.0} frames/s offered\n\
         {BACKLOG_OFFERED} times it (every member backlogged); {} runs of each, alternated",
        o.runs
    );
    let (mut free, mut held, mut split) = (Vec::new(), Vec::new(), (0u64, 0u64));
    for r in 0..o.runs {
        for backlogged in if r % 2 == 0 { [false, true] } else { [true, false] } {
            let _s = crate::progress::step(if backlogged { "backlogged" } else { "unbound" });
            let (ns, sent, dropped) = one_worker(n, backlogged, frames);
            if backlogged {
                held.push(ns);
                split = (sent, dropped);
            } else {
                free.push(ns);
            }
        }
    }
    // FQ-CoDel: one queue, every flow backlogged.
    let mut fq = vec![(Vec::new(), (0u64, 0u64)); FQ_CASES.len()];
    for _ in 0..o.runs {
        for (k, &(subs, n)) in FQ_CASES.iter().enumerate() {
            let _s = crate::progress::step(format!("flows {subs}"));
            let (ns, sent, dropped) = one_fq(subs, n, frames);
            fq[k].0.push(ns);
            fq[k].1 = (sent, dropped);
        }
    }
    let (c, d) = (Summary::of(&free), Summary::of(&held));
    let e: Vec<Summary> = fq.iter().map(|f| Summary::of(&f.0)).collect();
    println!("{}", stats::header("regime", "ns a frame offered, one worker"));
    println!("{}", stats::row("unbound", &c));
    println!("{}", stats::row("backlogged", &d));
    for (&(subs, _), e) in FQ_CASES.iter().zip(&e) {
        println!("{}", stats::row(&format!("flows {subs}"), e));
    }
    println!(
        "  backlogged / unbound: {:.2}x (a backlogged run sent {} and dropped {} of its frames)",
        d.median / c.median,
        split.0,
        split.1
    );
    for (&(subs, n), f) in FQ_CASES.iter().zip(&fq) {
        println!(
            "  flows {subs}: one queue of FQ-CoDel, {n} flows in turn offered 1.5 times its root (sent {}, dropped {})",
            f.1 .0, f.1 .1
        );
    }
    if o.json {
        let j = serde_json::json!({"members": n, "one": a, "two": b, "ratio": b.median / a.median,
            "ns_unbound": c, "ns_backlogged": d,
            "ns_fq": FQ_CASES.iter().zip(&e).map(|(&(subs, n), e)| serde_json::json!({"flows": subs, "offered_by": n, "ns": e})).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    Ok(())
}
