//! One queue tree shaped by several workers: each worker keeps its own [`crate::Shaper`] (no
//! lock per packet), and a [`Coord`] turns what every worker reports each period (the bytes
//! offered to each queue, whether packets wait in it) into each worker's share of every rate.
//!
//! Each period ([`Coord::tick`]) computes what one tree would give every queue from the
//! queues' demand, all workers together: pf's shares by bandwidth, `max` caps and `min`
//! guarantees, as a weighted max-min fill from the root down; a queue with packets waiting
//! on any worker wants more than it gets, one without wants what it was offered (with room to
//! grow). Each queue's allocation is split between the workers by their demand (a worker where
//! packets wait counts double, so that a flow held back on one worker gains there); the
//! root's bandwidth by what the queues under it were given there, with the spare split
//! evenly, so that the workers' root caps add up to the interface's. Workers take their rates
//! at their next report ([`crate::Shaper::sync`]).

use crate::TreeSpec;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// No cap (a rate of "everything").
const INF: f64 = f64::INFINITY;

/// The lowest rate a queue is given on a worker, bits/s: enough for a queue that has been idle
/// to be seen offering packets at the next period.
pub const FLOOR: u64 = 64_000;

/// How much more than its allocation a queue that had nothing waiting may take on a worker
/// before the next period (its senders may be speeding up).
const HEADROOM: f64 = 1.25;

pub struct Coord {
    pub workers: usize,
    n: usize,
    parent: Vec<usize>,
    root: usize,
    leaf: Vec<bool>,
    kids: Vec<Vec<usize>>,
    bw: Vec<f64>,
    max: Vec<f64>,
    min: Vec<f64>,
    /// Written by worker w: bytes offered to queue c so far (w * n + c).
    offered: Vec<AtomicU64>,
    /// Written by worker w: queue c had packets waiting (or dropped some) at its last report.
    /// It stands until the worker reports again: a worker reports as often as its loop turns,
    /// which may be less often than the coordinator ticks (asleep until a held packet's time).
    waiting: Vec<AtomicBool>,
    /// Written by [`Coord::tick`]: queue c's rate on worker w, bits/s.
    caps: Vec<AtomicU64>,
    last: Mutex<Last>,
}

#[derive(Default)]
struct Last {
    offered: Vec<u64>,
    /// Smoothed offered rate per (worker, queue), bits/s.
    rate: Vec<f64>,
    /// A period's working arrays, kept: made afresh each period, their pages were mapped and
    /// faulted in and unmapped every time (a tick of 24,000 queues took ~1 ms, most of it that).
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    waiting: Vec<bool>,
    want: Vec<f64>,
    wants_more: Vec<bool>,
    alloc: Vec<f64>,
    part: Vec<f64>,
}

/// `v` as `n` copies of `x`, in the memory it has.
fn reset<T: Copy>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    v.resize(n, x);
}

impl Coord {
    /// The coordination of `spec`'s tree over `workers` workers; until the first period each
    /// worker has an equal part of every rate.
    pub fn new(spec: &TreeSpec, workers: usize) -> Coord {
        let n = spec.classes.len();
        let workers = workers.max(1);
        let parent: Vec<usize> = spec.classes.iter().map(|c| c.parent.unwrap_or(usize::MAX)).collect();
        let mut kids: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (c, &p) in parent.iter().enumerate() {
            if p < n {
                kids[p].push(c);
            }
        }
        let leaf: Vec<bool> = kids.iter().map(Vec::is_empty).collect();
        let root = parent.iter().position(|&p| p == usize::MAX).unwrap_or(0);
        let rate = |b: u64| if b == 0 { INF } else { b as f64 };
        let c = Coord {
            workers,
            n,
            root,
            leaf,
            kids,
            bw: spec.classes.iter().map(|c| c.bandwidth as f64).collect(),
            max: spec.classes.iter().map(|c| rate(c.max)).collect(),
            min: spec.classes.iter().map(|c| c.min as f64).collect(),
            parent,
            offered: (0..workers * n).map(|_| AtomicU64::new(0)).collect(),
            waiting: (0..workers * n).map(|_| AtomicBool::new(false)).collect(),
            caps: (0..workers * n).map(|_| AtomicU64::new(0)).collect(),
            last: Mutex::new(Last {
                offered: vec![0; workers * n],
                rate: vec![0.0; workers * n],
                scratch: Scratch::default(),
            }),
        };
        for w in 0..workers {
            for q in 0..n {
                let share = match spec.classes[q].bandwidth {
                    0 => 0,
                    b => (b / workers as u64).max(FLOOR),
                };
                c.caps[w * n + q].store(share, Relaxed);
            }
        }
        c
    }

    pub fn classes(&self) -> usize {
        self.n
    }

    /// Worker `w`'s report for queue `c`: bytes offered so far, and whether packets waited.
    #[inline]
    pub fn report(&self, w: usize, c: usize, offered: u64, waiting: bool) {
        self.offered[w * self.n + c].store(offered, Relaxed);
        self.waiting[w * self.n + c].store(waiting, Relaxed);
    }

    /// Queue `c`'s rate on worker `w`, bits/s (0: none set, the tree's own).
    #[inline]
    pub fn cap(&self, w: usize, c: usize) -> u64 {
        self.caps[w * self.n + c].load(Relaxed)
    }

    /// One period of `dt` ns: new rates for every worker from what they reported.
    pub fn tick(&self, dt: u64) {
        let (n, nw) = (self.n, self.workers);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let dt = (dt.max(1)) as f64 / 1e9;
        // Offered rates per worker (smoothed over about four periods) and waiting flags.
        let Last { offered, rate, scratch } = &mut *last;
        let Scratch { waiting, want, wants_more, alloc, part } = scratch;
        waiting.clear();
        waiting.extend(self.waiting.iter().map(|w| w.load(Relaxed)));
        for ((o, seen), r) in self.offered.iter().zip(offered.iter_mut()).zip(rate.iter_mut()) {
            let o = o.load(Relaxed);
            *r = 0.75 * *r + 0.25 * (o.saturating_sub(*seen) as f64 * 8.0 / dt);
            *seen = o;
        }
        let rate = &*rate;
        // What each queue wants, all workers together, leaves up.
        reset(want, n, 0.0);
        reset(wants_more, n, false);
        for c in 0..n {
            if self.leaf[c] {
                let any = (0..nw).any(|w| waiting[w * n + c]);
                wants_more[c] = any;
                want[c] = if any { INF } else { (0..nw).map(|w| rate[w * n + c]).sum() };
            }
        }
        // Children come after their parents in the spec: sum bottom-up.
        for c in (0..n).rev() {
            want[c] = want[c].min(self.max[c]);
            let p = self.parent[c];
            if p != usize::MAX {
                want[p] += want[c];
                wants_more[p] |= wants_more[c];
            }
        }
        // The fill, top-down.
        reset(alloc, n, 0.0);
        let top =
            if self.bw[self.root] > 0.0 { self.bw[self.root].min(self.max[self.root]) } else { self.max[self.root] };
        // The whole interface, wanted or not: what the queues do not want is shared among them
        // as room to grow ([`Coord::fill`]).
        alloc[self.root] =
            if top.is_finite() { top } else { top.min(if wants_more[self.root] { INF } else { want[self.root] }) };
        for p in 0..n {
            if !self.kids[p].is_empty() {
                self.fill(&self.kids[p], alloc[p], want, alloc);
            }
        }
        // Each worker's part of a leaf's allocation: by its demand there (waiting counts
        // double, and a worker where packets wait has an equal part of the allocation on top:
        // one held back at the floor offers nothing new, so its rate alone would keep it
        // there while another worker's decaying rate took the whole); a parent's part on a
        // worker is its children's there.
        reset(part, nw * n, 0.0);
        for c in (0..n).rev() {
            if self.leaf[c] {
                let each = if alloc[c].is_finite() { alloc[c] / nw as f64 } else { 0.0 };
                let d = |w: usize| {
                    let r = rate[w * n + c];
                    if waiting[w * n + c] {
                        2.0 * r + each
                    } else {
                        r
                    }
                };
                let total: f64 = (0..nw).map(d).sum();
                for w in 0..nw {
                    let frac = if total > 0.0 { d(w) / total } else { 1.0 / nw as f64 };
                    part[w * n + c] = alloc[c] * frac;
                }
            }
            let p = self.parent[c];
            if p != usize::MAX {
                for w in 0..nw {
                    part[w * n + p] += part[w * n + c];
                }
            }
        }
        let given: f64 = (0..nw).map(|w| part[w * n + self.root]).sum();
        let spare = (top - given).max(0.0) / nw as f64;
        for c in 0..n {
            let room = if wants_more[c] { 1.0 } else { HEADROOM };
            for w in 0..nw {
                let rate = if c == self.root {
                    // The interface's bandwidth: what the worker's queues were given, and the
                    // spare evenly; the parts add up to the whole.
                    (part[w * n + c] + spare).min(top)
                } else {
                    (part[w * n + c] * room).max(FLOOR as f64)
                };
                let rate = if rate.is_finite() { rate as u64 } else { 0 };
                self.caps[w * n + c].store(rate.max(1), Relaxed);
            }
        }
    }

    /// pf's shares of `amount` among siblings `kids`: `min` first, then by bandwidth up to
    /// what each wants (a weighted max-min fill).
    fn fill(&self, kids: &[usize], amount: f64, want: &[f64], alloc: &mut [f64]) {
        let mut left = amount;
        for &k in kids {
            let g = self.min[k].min(want[k]);
            alloc[k] = g;
            left -= g;
        }
        let mut open: Vec<usize> = kids.iter().copied().filter(|&k| want[k] > alloc[k]).collect();
        // Each round settles the siblings that want less than their share; the rest share
        // what is left. Rounds: at most one per distinct demand level.
        while left > 1e-6 && !open.is_empty() {
            let weights: f64 = open.iter().map(|&k| self.bw[k].max(1.0)).sum();
            let share = left / weights;
            let before = open.len();
            open.retain(|&k| {
                let more = share * self.bw[k].max(1.0);
                if want[k] - alloc[k] <= more {
                    left -= want[k] - alloc[k];
                    alloc[k] = want[k];
                    false
                } else {
                    true
                }
            });
            if open.len() == before {
                for &k in &open {
                    alloc[k] += share * self.bw[k].max(1.0);
                }
                return;
            }
        }
        // Every sibling has what it wants and some of `amount` is left: it goes to them all by
        // bandwidth, each up to its `max`, so that a queue whose senders speed up may take it
        // before the next period without passing its parent (their allocations still add up
        // to at most `amount`). Left unallocated, it capped each queue at its measured rate
        // (times HEADROOM): an underloaded tree of 24,000 queues on two workers parked up to 2%
        // of its packets at caps nothing configured (`xpf-bench shaper`).
        if left > 1e-6 && left.is_finite() {
            let weights: f64 = kids.iter().map(|&k| self.bw[k].max(1.0)).sum();
            for &k in kids {
                alloc[k] = (alloc[k] + left * self.bw[k].max(1.0) / weights).min(self.max[k].max(alloc[k]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClassSpec, TreeSpec};

    /// A worker whose queue waits with nothing newly offered (its packets held at the floor,
    /// its sender stalled) gets a real part, not the floor, while another worker's rate for
    /// the queue is small but not yet zero (it took the whole: a stall of seconds with 64 KB
    /// GSO packets, packet mode with two workers).
    #[test]
    fn a_waiting_worker_with_no_new_bytes_is_not_left_at_the_floor() {
        let m = 1_000_000;
        let spec = TreeSpec {
            ifname: "x".into(),
            classes: vec![
                ClassSpec::new("root", 1, None, 40 * m),
                ClassSpec::new("a", 2, Some(0), 10 * m),
                ClassSpec { default: true, ..ClassSpec::new("b", 3, Some(0), 30 * m) },
            ],
        };
        let k = Coord::new(&spec, 2);
        // Worker 1 holds a's flow: a packet offered, then nothing new for 80 ms (held at a
        // low share, its sender waiting); worker 0 is offered one packet of a meanwhile.
        k.report(1, 1, 65_000, true);
        k.tick(2_000_000);
        for i in 0..40 {
            if i == 30 {
                k.report(0, 1, 1500, false);
            }
            k.report(1, 1, 65_000, true);
            k.tick(2_000_000);
        }
        assert!(k.cap(1, 1) >= 10 * m, "worker 1's share of a: {}", k.cap(1, 1));
    }
}
