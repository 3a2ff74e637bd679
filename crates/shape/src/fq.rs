//! FQ-CoDel inside one queue (`flows N [quantum Q]`, RFC 8290): packets hashed by flow into
//! N sub-queues served by deficit round robin, new flows first; each sub-queue drops at its
//! head by CoDel (RFC 8289) once its packets have waited over `TARGET` for an `INTERVAL`.
//!
//! The sub-queues are found as cake finds them, set-associatively: a flow's hash picks a set
//! of about `WAYS` sub-queues, and in it the sub-queue tagged with the flow's whole hash, else
//! one that is idle (which takes the tag). Two flows share a sub-queue only when more than a
//! set's sub-queues are busy at once: with the plain `hash % N` of RFC 8290 (Linux's fq_codel,
//! OpenBSD's) a ping beside four bulk flows in 1,024 sub-queues shares one with a bulk flow
//! once in 256 flows and waits behind it for CoDel's target and more.

use crate::Pkt;
use std::collections::VecDeque;

/// CoDel's target sojourn time and interval (RFC 8289 section 4.2, 4.3), in ns.
pub const TARGET: u64 = 5_000_000;
pub const INTERVAL: u64 = 100_000_000;

/// Packets an overflow drops at most from the fattest flow (Linux's fq_codel drop_batch).
pub const DROP_BATCH: usize = 64;

/// Packets that come with no overflow before the heap of sub-queues is let go.
pub const HEAP_KEEP: u32 = 65_535;

/// Sub-queues a set (cake's 8): a sub-queue is searched among this many, so that a collision
/// needs more than this many busy flows in one set.
pub const WAYS: usize = 8;

#[derive(Default)]
struct Codel {
    /// When the sojourn time went above target, plus an interval (0: below).
    first_above: u64,
    drop_next: u64,
    count: u32,
    lastcount: u32,
    dropping: bool,
}

#[derive(Default)]
struct Flow {
    q: VecDeque<Pkt>,
    bytes: u64,
    deficit: i64,
    codel: Codel,
    /// On the new or the old list.
    listed: bool,
    /// The hash of the flow that last took this sub-queue.
    tag: u32,
    /// Its place in [`Fq::heap`] while that is kept.
    at: u32,
}

pub(crate) struct Fq {
    flows: Vec<Flow>,
    /// Sets of sub-queues: set `s` is `s * N / sets .. (s + 1) * N / sets`.
    sets: usize,
    new: VecDeque<u32>,
    old: VecDeque<u32>,
    quantum: i64,
    /// The largest packet seen: CoDel does not drop from a sub-queue holding at most one.
    mtu: u64,
    /// The sub-queues as a binary heap by their bytes, the largest first, so that an overflow
    /// finds the fattest flow at once rather than by a search of every sub-queue (1,024 by
    /// default, 32,767 at most: a flood of packets of new flows over the limit would pay the
    /// search for each). Kept as cake keeps its own: built at an overflow and kept up by
    /// every packet in and out until [`HEAP_KEEP`] packets come with no overflow.
    heap: Vec<u32>,
    /// Packets left before the heap is let go; 0: not kept.
    keep: u32,
}

/// What a dequeue dropped on the way (CoDel), to count and recycle.
pub(crate) type Dropped = Vec<Pkt>;

impl Fq {
    pub(crate) fn new(flows: u32, quantum: u32) -> Fq {
        let mut v = Vec::new();
        v.resize_with(flows.max(1) as usize, Flow::default);
        let sets = (v.len() / WAYS).max(1);
        Fq {
            flows: v,
            sets,
            new: VecDeque::new(),
            old: VecDeque::new(),
            quantum: quantum.max(1) as i64,
            mtu: 1514,
            heap: Vec::new(),
            keep: 0,
        }
    }

    /// Swaps heap places `a` and `b`.
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.flows[self.heap[a] as usize].at = a as u32;
        self.flows[self.heap[b] as usize].at = b as u32;
    }

    fn bytes_at(&self, k: usize) -> u64 {
        self.flows[self.heap[k] as usize].bytes
    }

    /// Sub-queue `i` grew: it moves up the heap.
    fn grew(&mut self, i: usize) {
        if self.keep == 0 {
            return;
        }
        let mut k = self.flows[i].at as usize;
        while k > 0 {
            let up = (k - 1) / 2;
            if self.bytes_at(up) >= self.bytes_at(k) {
                break;
            }
            self.swap(k, up);
            k = up;
        }
    }

    /// Sub-queue `i` shrank: it moves down the heap.
    fn shrank(&mut self, i: usize) {
        if self.keep == 0 {
            return;
        }
        self.sift_down(self.flows[i].at as usize);
    }

    fn sift_down(&mut self, mut k: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * k + 1, 2 * k + 2);
            let mut big = k;
            if l < n && self.bytes_at(l) > self.bytes_at(big) {
                big = l;
            }
            if r < n && self.bytes_at(r) > self.bytes_at(big) {
                big = r;
            }
            if big == k {
                return;
            }
            self.swap(k, big);
            k = big;
        }
    }

    /// The sub-queue holding the most bytes: the heap's top, the heap built first when it
    /// is not kept (once for up to [`HEAP_KEEP`] packets).
    fn fattest(&mut self) -> usize {
        if self.keep == 0 {
            let n = self.flows.len();
            self.heap.clear();
            self.heap.extend(0..n as u32);
            for (i, f) in self.flows.iter_mut().enumerate() {
                f.at = i as u32;
            }
            for k in (0..n / 2).rev() {
                self.sift_down(k);
            }
        }
        self.keep = HEAP_KEEP;
        self.heap[0] as usize
    }

    /// The sub-queue of the flow of `hash`: in its set, the one tagged with it, else an idle
    /// one (tagged now, its CoDel state of another flow cleared), else the hash's own place
    /// in the set, shared.
    fn slot(&mut self, hash: u32) -> usize {
        let (n, sets) = (self.flows.len(), self.sets);
        let s = hash as usize % sets;
        let (lo, hi) = (s * n / sets, (s + 1) * n / sets);
        let set = &self.flows[lo..hi];
        if let Some(k) = set.iter().position(|f| f.tag == hash) {
            return lo + k;
        }
        if let Some(k) = set.iter().position(|f| !f.listed) {
            let f = &mut self.flows[lo + k];
            f.tag = hash;
            f.codel = Codel::default();
            return lo + k;
        }
        lo + (hash as usize / sets) % (hi - lo)
    }

    pub(crate) fn push(&mut self, p: Pkt, hash: u32) {
        let i = self.slot(hash);
        self.mtu = self.mtu.max(p.wire() as u64);
        let f = &mut self.flows[i];
        f.bytes += p.wire() as u64;
        f.q.push_back(p);
        if !f.listed {
            f.listed = true;
            f.deficit = self.quantum;
            self.new.push_back(i as u32);
        }
        if self.keep > 0 {
            self.keep -= 1;
            self.grew(i);
        }
    }

    /// Overflow: packets from the head of the sub-queue holding the most bytes (RFC 8290
    /// section 4.1: the fattest flow pays, not the newcomer) to `out`, as Linux's fq_codel
    /// drops them: up to half its bytes, at most [`DROP_BATCH`] packets.
    pub(crate) fn drop_fattest(&mut self, out: &mut Vec<Pkt>) {
        let i = self.fattest();
        let f = &mut self.flows[i];
        let half = f.bytes / 2;
        while let Some(p) = f.q.pop_front() {
            f.bytes -= p.wire() as u64;
            out.push(p);
            if f.bytes <= half || out.len() >= DROP_BATCH {
                break;
            }
        }
        self.shrank(i);
    }

    /// A waiting packet, any (a tree replaced by a reload hands its packets over).
    pub(crate) fn take_any(&mut self) -> Option<Pkt> {
        self.keep = 0;
        let f = self.flows.iter_mut().find(|f| !f.q.is_empty())?;
        let p = f.q.pop_front()?;
        f.bytes -= p.wire() as u64;
        Some(p)
    }

    pub(crate) fn pop(&mut self, now: u64, dropped: &mut Dropped) -> Option<Pkt> {
        loop {
            let (from_new, i) = match (self.new.front(), self.old.front()) {
                (Some(&i), _) => (true, i),
                (None, Some(&i)) => (false, i),
                (None, None) => return None,
            };
            let f = &mut self.flows[i as usize];
            if f.deficit <= 0 {
                f.deficit += self.quantum;
                if from_new {
                    self.new.pop_front();
                } else {
                    self.old.pop_front();
                }
                self.old.push_back(i);
                continue;
            }
            let got = codel_pop(f, now, self.mtu, dropped);
            self.shrank(i as usize);
            let f = &mut self.flows[i as usize];
            match got {
                Some(p) => {
                    f.deficit -= p.wire() as i64;
                    return Some(p);
                }
                None => {
                    // Empty: a new flow goes to the old list once (RFC 8290 section 4.2),
                    // an old one leaves.
                    if from_new {
                        self.new.pop_front();
                        self.old.push_back(i);
                    } else {
                        self.old.pop_front();
                        f.listed = false;
                    }
                }
            }
        }
    }
}

fn head(f: &mut Flow, now: u64, mtu: u64) -> Option<(Pkt, bool)> {
    let p = f.q.pop_front()?;
    f.bytes -= p.wire() as u64;
    let sojourn = now.saturating_sub(p.enq);
    let ok = if sojourn < TARGET || f.bytes <= mtu {
        f.codel.first_above = 0;
        false
    } else if f.codel.first_above == 0 {
        f.codel.first_above = now + INTERVAL;
        false
    } else {
        now >= f.codel.first_above
    };
    Some((p, ok))
}

fn control_law(t: u64, count: u32) -> u64 {
    t + (INTERVAL as f64 / (count.max(1) as f64).sqrt()) as u64
}

/// CoDel's dequeue (RFC 8289 section 5): the next packet to send, the ones it drops to
/// `dropped`.
fn codel_pop(f: &mut Flow, now: u64, mtu: u64, dropped: &mut Dropped) -> Option<Pkt> {
    let Some((mut p, mut ok)) = head(f, now, mtu) else {
        f.codel.dropping = false;
        return None;
    };
    if f.codel.dropping {
        if !ok {
            f.codel.dropping = false;
        }
        while f.codel.dropping && now >= f.codel.drop_next {
            dropped.push(p);
            f.codel.count += 1;
            match head(f, now, mtu) {
                None => {
                    f.codel.dropping = false;
                    return None;
                }
                Some((q, o)) => {
                    p = q;
                    ok = o;
                }
            }
            if !ok {
                f.codel.dropping = false;
            } else {
                f.codel.drop_next = control_law(f.codel.drop_next, f.codel.count);
            }
        }
    } else if ok {
        dropped.push(p);
        let next = head(f, now, mtu);
        f.codel.dropping = true;
        let delta = f.codel.count.wrapping_sub(f.codel.lastcount);
        f.codel.count = if delta > 1 && now.saturating_sub(f.codel.drop_next) < 16 * INTERVAL { delta } else { 1 };
        f.codel.drop_next = control_law(now, f.codel.count);
        f.codel.lastcount = f.codel.count;
        return next.map(|(q, _)| q);
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(len: usize, enq: u64, tag: u8) -> Pkt {
        Pkt { buf: vec![tag; len], enq, meta: 0, extra: 0 }
    }

    #[test]
    fn a_new_sparse_flow_goes_before_a_backlogged_one() {
        let mut fq = Fq::new(64, 1514);
        for _ in 0..20 {
            fq.push(pkt(1500, 0, 1), 1);
        }
        let mut d = Vec::new();
        // The bulk flow has been served; a ping arrives.
        let _ = fq.pop(1, &mut d);
        let _ = fq.pop(1, &mut d);
        fq.push(pkt(100, 1, 2), 2);
        let next = fq.pop(2, &mut d).unwrap();
        assert_eq!(next.buf[0], 2, "the sparse flow waits behind the bulk flow");
    }

    #[test]
    fn flows_share_a_sub_queue_only_when_their_set_is_full() {
        // 64 sub-queues: 8 sets of 8. Hashes 3, 11, 19, ... are all of set 3 and of one
        // place in it (hash % 64 is 3 for 3 and 67): RFC 8290's hash % N puts 3 and 67 in one
        // sub-queue.
        let mut fq = Fq::new(64, 1514);
        let same: Vec<u32> = (0..9).map(|k| 3 + 64 * k).collect();
        let mut d = Vec::new();
        for &h in &same[..8] {
            for _ in 0..10 {
                fq.push(pkt(1500, 0, h as u8), h);
            }
        }
        // Eight bulk flows in eight sub-queues of the set.
        let slots: std::collections::BTreeSet<usize> = same[..8].iter().map(|&h| fq.slot(h)).collect();
        assert_eq!(slots.len(), 8);
        assert!(slots.iter().all(|&i| (24..32).contains(&i)), "{slots:?}");
        // A ninth flow in the full set shares; in another set it has its own.
        assert!(slots.contains(&fq.slot(same[8])));
        assert!(!slots.contains(&fq.slot(4)));
        // Four bulk flows, served a while; a ping whose hash % 64 is theirs goes first.
        let mut fq = Fq::new(64, 1514);
        for &h in &same[..4] {
            for _ in 0..10 {
                fq.push(pkt(1500, 0, h as u8), h);
            }
        }
        for _ in 0..8 {
            fq.pop(1, &mut d).unwrap();
        }
        fq.push(pkt(100, 1, 0xee), 3 + 64 * 20);
        assert_eq!(fq.pop(2, &mut d).unwrap().buf[0], 0xee);
        // A flow that leaves frees its sub-queue for the next flow of the set.
        let mut fq = Fq::new(64, 1514);
        fq.push(pkt(1500, 0, 1), 3);
        let first = fq.slot(3);
        while fq.pop(5, &mut d).is_some() {}
        let _ = fq.pop(5, &mut d);
        assert!(!fq.flows[first].listed);
        assert_eq!(fq.slot(67), first, "the idle sub-queue is taken again");
        // Fewer sub-queues than a set's ways: one set of all.
        let mut fq = Fq::new(4, 1514);
        let s: std::collections::BTreeSet<usize> = (0..4u32)
            .map(|h| {
                fq.push(pkt(100, 0, 0), h * 4);
                fq.slot(h * 4)
            })
            .collect();
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn an_overflow_drops_from_the_fattest_sub_queue_as_a_search_finds_it() {
        // Random pushes, pops and overflows: the heap's top holds as many bytes as the
        // largest sub-queue a search finds, through its building, its upkeep and its end.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for flows in [1, 7, 64, 1024] {
            let mut fq = Fq::new(flows, 1514);
            let mut d = Vec::new();
            let mut t = 0;
            for step in 0..40_000u32 {
                match rnd(10) {
                    0..=5 => fq.push(pkt(64 + rnd(1400) as usize, t, 0), rnd(3 * flows as u64) as u32),
                    6..=8 => {
                        t += 1000;
                        fq.pop(t, &mut d);
                    }
                    _ => {
                        let before: Vec<u64> = fq.flows.iter().map(|f| f.bytes).collect();
                        let most = *before.iter().max().unwrap();
                        let mut out = Vec::new();
                        fq.drop_fattest(&mut out);
                        if most > 0 {
                            // The one sub-queue that shrank held the most.
                            let shrank: Vec<usize> =
                                (0..before.len()).filter(|&i| fq.flows[i].bytes < before[i]).collect();
                            assert_eq!(shrank.len(), 1, "flows {flows}, step {step}");
                            assert_eq!(before[shrank[0]], most, "flows {flows}, step {step}: not the fattest");
                        }
                        // Every sub-queue's place in the heap is its own.
                        for (k, &i) in fq.heap.iter().enumerate() {
                            assert_eq!(fq.flows[i as usize].at as usize, k);
                        }
                        for k in 1..fq.heap.len() {
                            assert!(
                                fq.bytes_at((k - 1) / 2) >= fq.bytes_at(k),
                                "flows {flows}, step {step}: heap order"
                            );
                        }
                    }
                }
                if step % 5000 == 4999 {
                    // A quiet spell lets the heap go; the next overflow builds it again.
                    fq.keep = 1;
                }
            }
        }
        // The fattest, exactly: a flow of 10 packets and nine of one.
        let mut fq = Fq::new(16, 1514);
        for h in 0..9 {
            fq.push(pkt(1500, 0, h as u8), h);
        }
        for _ in 0..10 {
            fq.push(pkt(1500, 0, 0xf0), 100);
        }
        let mut out = Vec::new();
        fq.drop_fattest(&mut out);
        assert!(!out.is_empty() && out.iter().all(|p| p.buf[0] == 0xf0));
        // Kept up: the same flow pays again while it is the fattest, then another.
        for _ in 0..3 {
            out.clear();
            fq.drop_fattest(&mut out);
            assert!(out.iter().all(|p| p.buf[0] == 0xf0), "{:?}", out.iter().map(|p| p.buf[0]).collect::<Vec<_>>());
        }
    }

    #[test]
    fn codel_drops_from_a_standing_queue_and_not_from_a_short_one() {
        let mut fq = Fq::new(1, 1514);
        let mut d = Vec::new();
        // Packets that waited 1 ms: nothing dropped.
        for t in 0..200u64 {
            fq.push(pkt(1500, t * 1_000_000, 0), 0);
            fq.pop(t * 1_000_000 + 1_000_000, &mut d).unwrap();
        }
        assert!(d.is_empty());
        // A standing queue of 50 ms for 1 s: CoDel drops.
        let mut fq = Fq::new(1, 1514);
        let mut t = 0u64;
        for _ in 0..50 {
            fq.push(pkt(1500, 0, 0), 0);
        }
        while t < 1_000_000_000 {
            fq.push(pkt(1500, t, 0), 0);
            t += 1_000_000;
            fq.pop(t + 50_000_000, &mut d);
        }
        assert!(d.len() > 5, "codel dropped {} of a 50 ms standing queue", d.len());
    }

    #[test]
    fn overflow_drops_from_the_fattest_flow() {
        let mut fq = Fq::new(8, 1514);
        for _ in 0..10 {
            fq.push(pkt(1500, 0, 1), 1);
        }
        fq.push(pkt(100, 0, 2), 2);
        let mut out = Vec::new();
        fq.drop_fattest(&mut out);
        // Half the fattest flow's bytes, from its head.
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|p| p.buf[0] == 1));
        // At most DROP_BATCH at once.
        let mut fq = Fq::new(8, 1514);
        for _ in 0..1000 {
            fq.push(pkt(100, 0, 1), 1);
        }
        out.clear();
        fq.drop_fattest(&mut out);
        assert_eq!(out.len(), DROP_BATCH);
    }
}
