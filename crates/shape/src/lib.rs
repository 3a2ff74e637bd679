//! pf's queues on one worker: [`Shaper`] holds one interface's queue tree ([`TreeSpec`]) and
//! the packets waiting in it; the worker enqueues what leaves by that interface and takes
//! from [`Shaper::dequeue`] what may go now. No I/O, no clock: `now` (ns) is passed in.
//!
//! The meaning is pf's (OpenBSD's HFSC as pf.conf states it): a queue's `bandwidth` is its
//! share of its parent when siblings compete (work-conserving: what one leaves, the others
//! take), `max` caps it, `min` is served first (leaf queues), the root's bandwidth caps the
//! interface. Scheduling is a deficit round robin per parent with quanta in proportion to the
//! children's bandwidth (exact shares over time, O(1) per packet), caps as GCRA timers (one
//! number per cap), capped classes parked in a timer heap until they conform, `min` as a
//! GCRA-ordered heap of leaves served before the shares. A leaf is a FIFO of `qlimit`
//! packets (tail drop) or FQ-CoDel ([`fq`]). Design and figures: docs/shaper.md.

pub mod fq;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A packet waiting in the shaper: its frame, when it came (ns), and the caller's own word
/// (how to transmit it).
pub struct Pkt {
    pub buf: Vec<u8>,
    pub enq: u64,
    pub meta: u64,
}

/// One queue of a tree, as the configuration gives it: rates in bits per second (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassSpec {
    pub name: String,
    /// The queue id rules name it by (`set queue`), global across interfaces.
    pub qid: u16,
    /// Index of the parent in [`TreeSpec::classes`] (parents come first); None: the root.
    pub parent: Option<usize>,
    pub bandwidth: u64,
    pub min: u64,
    pub max: u64,
    /// Packets the queue holds at most.
    pub qlimit: u32,
    /// FQ-CoDel sub-queues (0: a FIFO) and their quantum in bytes.
    pub flows: u32,
    pub quantum: u32,
    pub default: bool,
}

/// One interface's queue tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSpec {
    pub ifname: String,
    pub classes: Vec<ClassSpec>,
}

/// pf's default queue length (HFSC's `qlimit`), and FQ-CoDel's.
pub const DEFAULT_QLIMIT: u32 = 50;
pub const DEFAULT_FQ_QLIMIT: u32 = 1024;

/// How far ahead of its rate a capped class (and the root) may send, in ns: the worker's
/// wake-ups come late by up to about a millisecond, and a cap must not lose that time.
pub const TOLERANCE_NS: u64 = 2_000_000;

/// Per queue counters, as `pfctl -s queue` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pkts: u64,
    pub bytes: u64,
    pub drop_pkts: u64,
    pub drop_bytes: u64,
    pub qlen: u32,
}

impl QueueStats {
    pub fn add(&mut self, o: &QueueStats) {
        self.pkts += o.pkts;
        self.bytes += o.bytes;
        self.drop_pkts += o.drop_pkts;
        self.drop_bytes += o.drop_bytes;
        self.qlen += o.qlen;
    }
}

/// A rate as a GCRA: the theoretical arrival time of the next byte.
#[derive(Debug, Clone, Copy, Default)]
struct Gcra {
    /// ns per byte << 20; 0: no rate.
    cost: u64,
    tat: u64,
}

impl Gcra {
    fn new(bits: u64) -> Gcra {
        if bits == 0 {
            return Gcra::default();
        }
        Gcra { cost: ((8_000_000_000u128 << 20) / bits as u128).max(1) as u64, tat: 0 }
    }
    fn on(&self) -> bool {
        self.cost != 0
    }
    #[inline]
    fn conforms(&self, now: u64) -> bool {
        self.cost == 0 || self.tat <= now + TOLERANCE_NS
    }
    /// When it conforms again.
    fn next(&self) -> u64 {
        self.tat.saturating_sub(TOLERANCE_NS)
    }
    #[inline]
    fn charge(&mut self, now: u64, len: usize) {
        if self.cost != 0 {
            self.tat = self.tat.max(now) + ((len as u64 * self.cost) >> 20);
        }
    }
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// Nothing to send: in no list.
    Idle,
    /// In its parent's ring (possibly empty since: removed when met at the front).
    Active,
    /// Over its cap: in the timer heap until it conforms.
    Capped,
}

enum Leaf {
    Fifo(VecDeque<Pkt>),
    Fq(Box<fq::Fq>),
}

struct Class {
    parent: u32,
    st: St,
    quantum: i64,
    deficit: i64,
    cap: Gcra,
    min: Gcra,
    in_rt: bool,
    /// Active children (inner classes).
    ring: VecDeque<u32>,
    leaf: Option<Leaf>,
    qlimit: u32,
    stats: QueueStats,
}

impl Class {
    fn backlogged(&self) -> bool {
        match self.leaf {
            Some(_) => self.stats.qlen > 0,
            None => !self.ring.is_empty(),
        }
    }
}

/// What [`Shaper::dequeue`] gives.
pub enum Out {
    Packet(Pkt),
    /// Packets wait, none may go before this time (ns).
    Wait(u64),
    /// Nothing waits.
    Empty,
}

/// One interface's queue tree with its packets (one per worker).
pub struct Shaper {
    ifname: String,
    classes: Vec<Class>,
    names: Vec<String>,
    /// Queue id -> leaf class (NONE: the default queue).
    by_qid: Vec<u32>,
    default: u32,
    root: u32,
    capped: BinaryHeap<Reverse<(u64, u32)>>,
    rt: BinaryHeap<Reverse<(u64, u32)>>,
    backlog: u32,
    spare: Vec<Vec<u8>>,
    dropped: Vec<Pkt>,
}

/// The quanta of siblings with these bandwidths: in proportion, the smallest one an MTU,
/// the largest at most 256 MTUs (beyond a ratio of 256 the small ones get less than an MTU
/// per round and wait more rounds: still exact over time).
fn quanta(bws: &[u64]) -> Vec<i64> {
    const MTU: u128 = 1514;
    let lo = bws.iter().copied().filter(|&b| b > 0).min().unwrap_or(1) as u128;
    let hi = bws.iter().copied().max().unwrap_or(1).max(1) as u128;
    bws.iter()
        .map(|&b| {
            let b = b.max(1) as u128;
            let q = if hi / lo <= 256 { b * MTU / lo } else { b * 256 * MTU / hi };
            q.max(16) as i64
        })
        .collect()
}

impl Shaper {
    pub fn new(spec: &TreeSpec) -> Shaper {
        let n = spec.classes.len();
        let mut classes = Vec::with_capacity(n);
        let is_parent = |i: usize| spec.classes.iter().any(|c| c.parent == Some(i));
        for (i, c) in spec.classes.iter().enumerate() {
            let leaf = (!is_parent(i)).then(|| {
                if c.flows > 0 {
                    Leaf::Fq(Box::new(fq::Fq::new(c.flows, if c.quantum > 0 { c.quantum } else { 1514 })))
                } else {
                    Leaf::Fifo(VecDeque::new())
                }
            });
            let qlimit = match c.qlimit {
                0 if c.flows > 0 => DEFAULT_FQ_QLIMIT,
                0 => DEFAULT_QLIMIT,
                q => q,
            };
            // The root's bandwidth is the interface's: a cap. Below it, bandwidth is a share.
            let cap = match (c.parent, c.max) {
                (None, 0) => c.bandwidth,
                (None, m) if c.bandwidth > 0 => m.min(c.bandwidth),
                (_, m) => m,
            };
            classes.push(Class {
                parent: c.parent.map_or(NONE, |p| p as u32),
                st: St::Idle,
                quantum: 1514,
                deficit: 0,
                cap: Gcra::new(cap),
                min: if leaf.is_some() { Gcra::new(c.min) } else { Gcra::default() },
                in_rt: false,
                ring: VecDeque::new(),
                leaf,
                qlimit,
                stats: QueueStats::default(),
            });
        }
        for p in 0..n {
            let kids: Vec<usize> = (0..n).filter(|&k| spec.classes[k].parent == Some(p)).collect();
            let bws: Vec<u64> = kids.iter().map(|&k| spec.classes[k].bandwidth).collect();
            for (k, q) in kids.iter().zip(quanta(&bws)) {
                classes[*k].quantum = q;
                classes[*k].deficit = q;
            }
        }
        let max_qid = spec.classes.iter().map(|c| c.qid).max().unwrap_or(0) as usize;
        let mut by_qid = vec![NONE; max_qid + 1];
        for (i, c) in spec.classes.iter().enumerate() {
            if classes[i].leaf.is_some() {
                by_qid[c.qid as usize] = i as u32;
            }
        }
        let default = spec.classes.iter().position(|c| c.default).or_else(|| (n == 1).then_some(0)).unwrap_or(0) as u32;
        let root = spec.classes.iter().position(|c| c.parent.is_none()).unwrap_or(0) as u32;
        Shaper {
            ifname: spec.ifname.clone(),
            classes,
            names: spec.classes.iter().map(|c| c.name.clone()).collect(),
            by_qid,
            default,
            root,
            capped: BinaryHeap::new(),
            rt: BinaryHeap::new(),
            backlog: 0,
            spare: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// A buffer for a frame to enqueue (from the ones the shaper is done with).
    pub fn buffer(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Gives a sent frame's buffer back.
    pub fn recycle(&mut self, b: Vec<u8>) {
        if self.spare.len() < 4096 {
            self.spare.push(b);
        }
    }

    /// The interface the tree is on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Takes a waiting packet out, unsent and uncounted (a tree replaced by a reload hands
    /// its packets to the new one).
    pub fn take_any(&mut self) -> Option<Pkt> {
        for cl in self.classes.iter_mut().filter(|c| c.stats.qlen > 0) {
            let p = match cl.leaf.as_mut()? {
                Leaf::Fifo(q) => q.pop_front(),
                Leaf::Fq(f) => f.drop_fattest(),
            };
            if let Some(p) = p {
                cl.stats.qlen -= 1;
                self.backlog -= 1;
                return Some(p);
            }
        }
        None
    }

    /// Packets waiting.
    pub fn backlog(&self) -> u32 {
        self.backlog
    }

    /// The leaf a queue id names here: the default queue when it names none of this
    /// interface's leaves (pf: a packet whose queue is elsewhere, or none, goes to the
    /// interface's default queue).
    #[inline]
    pub fn leaf_of(&self, qid: u16) -> usize {
        match self.by_qid.get(qid as usize) {
            Some(&c) if c != NONE => c as usize,
            _ => self.default as usize,
        }
    }

    /// Queues packet `p` (of flow `hash`) in the queue `qid` names; false when the queue is
    /// full (the packet is dropped and counted).
    pub fn enqueue(&mut self, qid: u16, mut p: Pkt, hash: u32, now: u64) -> bool {
        let c = self.leaf_of(qid);
        p.enq = now;
        let len = p.buf.len() as u64;
        let cl = &mut self.classes[c];
        if cl.stats.qlen >= cl.qlimit {
            match cl.leaf.as_mut() {
                Some(Leaf::Fq(f)) => {
                    // FQ-CoDel makes room at the fattest flow's head.
                    if let Some(old) = f.drop_fattest() {
                        cl.stats.drop_pkts += 1;
                        cl.stats.drop_bytes += old.buf.len() as u64;
                        cl.stats.qlen -= 1;
                        self.backlog -= 1;
                        self.recycle(old.buf);
                    }
                }
                _ => {
                    cl.stats.drop_pkts += 1;
                    cl.stats.drop_bytes += len;
                    self.recycle(p.buf);
                    return false;
                }
            }
        }
        let cl = &mut self.classes[c];
        match cl.leaf.as_mut() {
            Some(Leaf::Fifo(q)) => q.push_back(p),
            Some(Leaf::Fq(f)) => f.push(p, hash),
            None => unreachable!("leaf_of gives leaves"),
        }
        cl.stats.qlen += 1;
        self.backlog += 1;
        if cl.min.on() && !cl.in_rt {
            cl.in_rt = true;
            let t = cl.min.next();
            self.rt.push(Reverse((t, c as u32)));
        }
        if cl.st == St::Idle {
            self.activate(c as u32, now);
        }
        true
    }

    /// Class `c` (idle) has something to send: into its parent's ring, and so on up while
    /// the parents were idle; parked instead while it is over its cap.
    fn activate(&mut self, mut c: u32, now: u64) {
        loop {
            let cl = &mut self.classes[c as usize];
            if cl.st != St::Idle {
                return;
            }
            if !cl.cap.conforms(now) {
                cl.st = St::Capped;
                let t = cl.cap.next();
                self.capped.push(Reverse((t, c)));
                return;
            }
            cl.st = St::Active;
            let p = cl.parent;
            if p == NONE {
                return;
            }
            self.classes[p as usize].ring.push_back(c);
            c = p;
        }
    }

    /// Wakes the capped classes whose time has come.
    fn wake(&mut self, now: u64) {
        while let Some(&Reverse((t, c))) = self.capped.peek() {
            if t > now {
                break;
            }
            self.capped.pop();
            let cl = &mut self.classes[c as usize];
            if cl.st != St::Capped {
                continue;
            }
            cl.st = St::Idle;
            if cl.backlogged() {
                self.activate(c, now);
            }
        }
    }

    /// Takes a leaf's next packet (FQ-CoDel may drop some first; counted).
    fn pop_leaf(&mut self, c: usize, now: u64) -> Option<Pkt> {
        let cl = &mut self.classes[c];
        let p = match cl.leaf.as_mut()? {
            Leaf::Fifo(q) => q.pop_front(),
            Leaf::Fq(f) => f.pop(now, &mut self.dropped),
        };
        let gone = self.dropped.len() as u32 + p.is_some() as u32;
        cl.stats.qlen -= gone;
        self.backlog -= gone;
        for d in std::mem::take(&mut self.dropped) {
            cl.stats.drop_pkts += 1;
            cl.stats.drop_bytes += d.buf.len() as u64;
            if self.spare.len() < 4096 {
                self.spare.push(d.buf);
            }
        }
        p
    }

    /// Charges a packet of `len` bytes sent from leaf `c` to it and every class above.
    fn charge(&mut self, mut c: u32, len: usize, now: u64) {
        self.classes[c as usize].min.charge(now, len);
        while c != NONE {
            let cl = &mut self.classes[c as usize];
            cl.deficit -= len as i64;
            cl.cap.charge(now, len);
            cl.stats.pkts += 1;
            cl.stats.bytes += len as u64;
            c = cl.parent;
        }
    }

    /// The leaf the shares choose now, if any may send: a deficit round robin down from the
    /// root, dropping empty classes and parking capped ones met at the front of a ring.
    fn pick(&mut self, now: u64) -> Option<usize> {
        let mut node = self.root;
        if self.classes[node as usize].leaf.is_some() {
            // A tree of one queue (`queue q on IF flows N default`).
            return self.classes[node as usize].backlogged().then_some(node as usize);
        }
        loop {
            let Some(&c) = self.classes[node as usize].ring.front() else {
                if node == self.root {
                    return None;
                }
                // Nothing left below: idle, out of its parent's ring (it is at the front).
                let p = self.classes[node as usize].parent;
                self.classes[node as usize].st = St::Idle;
                self.classes[p as usize].ring.pop_front();
                node = p;
                continue;
            };
            let cl = &mut self.classes[c as usize];
            if !cl.backlogged() {
                cl.st = St::Idle;
                self.classes[node as usize].ring.pop_front();
                continue;
            }
            if !cl.cap.conforms(now) {
                cl.st = St::Capped;
                let t = cl.cap.next();
                self.capped.push(Reverse((t, c)));
                self.classes[node as usize].ring.pop_front();
                continue;
            }
            if cl.deficit <= 0 {
                cl.deficit += cl.quantum;
                let ring = &mut self.classes[node as usize].ring;
                ring.pop_front();
                ring.push_back(c);
                continue;
            }
            if cl.leaf.is_some() {
                return Some(c as usize);
            }
            node = c;
        }
    }

    /// The next packet that may leave now, or when one may.
    pub fn dequeue(&mut self, now: u64) -> Out {
        if self.backlog == 0 {
            return Out::Empty;
        }
        self.wake(now);
        let root = &self.classes[self.root as usize];
        if !root.cap.conforms(now) {
            return Out::Wait(root.cap.next());
        }
        // `min` first: the leaf whose guarantee is due earliest.
        while let Some(&Reverse((t, c))) = self.rt.peek() {
            if t > now {
                break;
            }
            self.rt.pop();
            let c = c as usize;
            let cl = &self.classes[c];
            if cl.stats.qlen > 0 && !cl.min.conforms(now) {
                // The shares served it meanwhile: due later.
                let t = cl.min.next();
                self.rt.push(Reverse((t, c as u32)));
                continue;
            }
            if let Some(p) = self.pop_leaf(c, now) {
                self.charge(c as u32, p.buf.len(), now);
                let cl = &mut self.classes[c];
                if cl.stats.qlen > 0 {
                    let t = cl.min.next();
                    self.rt.push(Reverse((t, c as u32)));
                } else {
                    cl.in_rt = false;
                }
                return Out::Packet(p);
            }
            self.classes[c].in_rt = false;
        }
        while let Some(c) = self.pick(now) {
            if let Some(p) = self.pop_leaf(c, now) {
                self.charge(c as u32, p.buf.len(), now);
                return Out::Packet(p);
            }
        }
        if self.backlog == 0 {
            return Out::Empty;
        }
        let a = self.capped.peek().map_or(u64::MAX, |r| r.0 .0);
        let b = self.rt.peek().map_or(u64::MAX, |r| r.0 .0);
        Out::Wait(a.min(b).max(now))
    }

    /// Each queue's name and counters, in the tree's order.
    pub fn stats(&self) -> impl Iterator<Item = (&str, QueueStats)> + '_ {
        self.names.iter().zip(self.classes.iter()).map(|(n, c)| (n.as_str(), c.stats))
    }
}

#[cfg(test)]
mod tests;
