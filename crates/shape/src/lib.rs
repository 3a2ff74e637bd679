//! pf's queues on one worker: [`Shaper`] holds one interface's queue tree ([`TreeSpec`]) and
//! the packets waiting in it; the worker enqueues what leaves by that interface and takes
//! from [`Shaper::dequeue`] what may go now. No I/O, no clock: `now` (ns) is passed in.
//!
//! The meaning is pf's (OpenBSD's HFSC as pf.conf states it): a queue's `bandwidth` is its
//! share of its parent when siblings compete (work-conserving: what one leaves, the others
//! take), `max` caps it, `min` is guaranteed (leaf queues), the root's bandwidth caps the
//! interface. Leaves are served in three tiers: within their `min`, then within their
//! `bandwidth` (children never add up to more than their parent, so every leaf's can be
//! kept), each tier earliest due first from a heap ordered by the leaves' GCRA timers (a
//! queue that was idle sends at once, whatever the number of queues); what they leave is
//! borrowed by a deficit round robin per parent with quanta in proportion to the children's
//! bandwidth. Caps are GCRA timers too (one number per cap); capped classes wait in a timer
//! heap until they conform. A leaf is a FIFO of `qlimit` packets (tail drop) or
//! FQ-CoDel ([`fq`]). Design and figures: docs/shaper.md.

pub mod coord;
pub mod fq;
mod wheel;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A packet waiting in the shaper: its frame, when it came (ns), the caller's own word (how
/// to transmit it), and what it takes on the wire beyond the frame (a GSO packet, segmented
/// after the shaper, repeats its headers in each segment after the first; 0 for a frame).
/// Rates and queue bytes count [`Pkt::wire`].
pub struct Pkt {
    pub buf: Vec<u8>,
    pub enq: u64,
    pub meta: u64,
    pub extra: u32,
}

impl Pkt {
    /// Bytes on the wire: the frame's, and the segments' repeated headers.
    #[inline]
    pub fn wire(&self) -> usize {
        self.buf.len() + self.extra as usize
    }
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
    /// `burst M for T ms` on `min`, `bandwidth` and `max`, in that order (none: zero).
    pub burst: [Burst; 3],
}

impl ClassSpec {
    /// A queue with a bandwidth and nothing else set (`queue NAME parent P bandwidth B`).
    pub fn new(name: impl Into<String>, qid: u16, parent: Option<usize>, bandwidth: u64) -> ClassSpec {
        ClassSpec {
            name: name.into(),
            qid,
            parent,
            bandwidth,
            min: 0,
            max: 0,
            qlimit: 0,
            flows: 0,
            quantum: 0,
            default: false,
            burst: Default::default(),
        }
    }
}

/// A rate's `burst M for T ms` (HFSC's two-piece service curve): a class that starts sending
/// after an idle spell goes at M for up to T, then at its rate. M is above the rate (the
/// configuration refuses a lower one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Burst {
    pub bits: u64,
    pub ms: u32,
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

/// How far ahead of its rate a class may send, in ns: the worker's wake-ups come late by up
/// to about a millisecond, and a rate must not lose that time.
pub const TOLERANCE_NS: u64 = 2_000_000;
/// How far behind its schedule a backlogged rate may fall and still send all it was due: the
/// root's (the interface's: a worker preempted for up to this long, its core shared with the
/// kernel's packet work, sends what it could not meanwhile; 2 ms lost 10% of the interface's
/// rate in the shaper lab, its worker at saturation) and each leaf's own (after a stall the
/// leaves that were due catch up, before the round robin lends anything: when the root
/// caught up alone, what the leaves had lost went to whichever members the round robin
/// turned to, and in the shaper lab some members got 5-10% over their rates, others under).
pub const CATCH_UP_NS: u64 = 10_000_000;

/// Per queue counters, as `pfctl -s queue` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pkts: u64,
    pub bytes: u64,
    pub drop_pkts: u64,
    pub drop_bytes: u64,
    pub qlen: u32,
    /// The longest a packet waited in the queue, ns.
    pub wait_max: u64,
}

impl QueueStats {
    pub fn add(&mut self, o: &QueueStats) {
        self.pkts += o.pkts;
        self.bytes += o.bytes;
        self.drop_pkts += o.drop_pkts;
        self.drop_bytes += o.drop_bytes;
        self.qlen += o.qlen;
        self.wait_max = self.wait_max.max(o.wait_max);
    }
}

/// A rate as a GCRA: the theoretical arrival time of the next byte.
#[derive(Debug, Clone, Copy, Default)]
struct Gcra {
    /// ns per byte << 20; 0: no rate.
    cost: u64,
    tat: u64,
    /// How far ahead of `now` the theoretical time may run ([`TOLERANCE_NS`]).
    tol: u64,
}

impl Gcra {
    fn new(bits: u64) -> Gcra {
        if bits == 0 {
            return Gcra::default();
        }
        // ns per byte << 20 fits 64 bits (8e9 << 20 < 2^53): a 64-bit division, not a call
        // for a 128-bit one (a worker's report sets two or three rates for each queue).
        Gcra { cost: ((8_000_000_000u64 << 20) / bits).max(1), tat: 0, tol: TOLERANCE_NS }
    }
    fn on(&self) -> bool {
        self.cost != 0
    }
    #[inline]
    fn conforms(&self, now: u64) -> bool {
        self.cost == 0 || self.tat <= now + self.tol
    }
    /// When it conforms again.
    fn next(&self) -> u64 {
        self.tat.saturating_sub(self.tol)
    }
    #[inline]
    fn charge(&mut self, now: u64, len: usize) {
        if self.cost != 0 {
            self.tat = self.tat.max(now) + ((len as u64 * self.cost) >> 20);
        }
    }
    /// A rate charged while its class stays backlogged (a leaf's tiers, the root): a clock
    /// left behind `now` (the worker late, preempted) keeps up to [`CATCH_UP_NS`] of its
    /// schedule.
    #[inline]
    fn charge_backlogged(&mut self, now: u64, len: usize) {
        if self.cost != 0 {
            let c = (len as u64 * self.cost) >> 20;
            self.tat = self.tat.max(now.saturating_sub(CATCH_UP_NS + c)) + c;
        }
    }
    /// A class with something to send again after nothing: its clock starts at `now` at the
    /// earliest (an idle spell earns no catching up; `burst` is what earns a spell).
    #[inline]
    fn anchor(&mut self, now: u64) {
        self.tat = self.tat.max(now);
    }
    /// When a packet of `len` bytes sent from now on at this rate would be done: its deadline
    /// (from `now` for a clock left behind: catching up is no claim to go before a leaf that
    /// just woke).
    #[inline]
    fn finish(&self, now: u64, len: usize) -> u64 {
        self.tat.max(now) + ((len as u64 * self.cost) >> 20)
    }
    /// A new rate (bits/s) from `now` on. What was sent ahead of `now` is re-priced: the same
    /// bytes at the new rate. Keeping the clock as it stood held a queue to the rate it had
    /// when its packet left: a 64 KB GSO packet charged at a worker's floor share ran the
    /// clock seconds ahead, and a share raised a period later could not send until then
    /// (packet mode with two workers: 0.1-1 Mbit/s where 40 were due).
    fn set_rate(&mut self, bits: u64, now: u64) {
        // 1 kbit/s at least: a cost per byte that a 64 KB packet cannot overflow.
        self.reprice(Gcra::new(bits.max(1000)).cost, now);
    }
    /// The cost per byte from `now` on, what was sent ahead re-priced.
    fn reprice(&mut self, cost: u64, now: u64) {
        if self.cost != 0 && self.tat > now {
            self.tat = now + ((self.tat - now) as u128 * cost as u128 / self.cost as u128) as u64;
        }
        self.cost = cost;
    }
}

/// A rate's `burst` in effect: kept apart from the rates (a class's hot part stays small
/// for the classes without one; 24,000 classes measured 11% slower with it inline).
#[derive(Debug, Clone, Copy, Default)]
struct Bursting {
    /// Configured (bits/s): the burst's and its rate's, so that a worker's share scales both.
    bits: u64,
    rate_bits: u64,
    /// The rate's cost and the burst's now (0: no burst on this rate).
    base: u64,
    cost: u64,
    /// The longest spell (ns), and when the current one ends (0: none).
    ns: u64,
    until: u64,
}

impl Bursting {
    fn new(b: Burst, bits: u64) -> Bursting {
        if bits == 0 || b.ms == 0 || b.bits <= bits {
            return Bursting::default();
        }
        Bursting {
            bits: b.bits,
            rate_bits: bits,
            base: Gcra::new(bits).cost,
            cost: Gcra::new(b.bits).cost,
            ns: b.ms as u64 * 1_000_000,
            until: 0,
        }
    }
    /// The class has something to send after an idle spell: the burst, for as long as the
    /// spell earned, at most its time. HFSC re-anchors the two-piece curve now, and it meets
    /// the rate's line left behind once the burst has used the service the spell left unused
    /// (idle x rate): after idle x rate / (M - rate).
    #[inline]
    fn start(&mut self, g: &mut Gcra, now: u64) {
        // A spell under way goes on (HFSC keeps the curve that gives more): a flow whose
        // queue empties between its packets starts it once.
        if self.cost == 0 || self.until > now || g.tat >= now {
            return;
        }
        let earned =
            ((now - g.tat) as u128 * self.cost as u128 / self.base.saturating_sub(self.cost).max(1) as u128) as u64;
        self.until = now + earned.min(self.ns).max(1);
        g.cost = self.cost;
    }
    /// After a packet: the rate again once the spell is over.
    #[inline]
    fn end(&mut self, g: &mut Gcra, now: u64) {
        if self.until != 0 && now >= self.until {
            self.until = 0;
            g.cost = self.base;
        }
    }
    /// The rate was set to `bits` (a worker's share): the burst scales with it.
    /// `g` was just set to the share's rate (what it sent ahead priced at it): in a spell,
    /// back to the burst's.
    fn rescale(&mut self, g: &mut Gcra, bits: u64, now: u64) {
        if self.cost == 0 {
            return;
        }
        self.base = g.cost;
        let m1 = (self.bits as u128 * bits.max(1000) as u128 / self.rate_bits.max(1) as u128) as u64;
        self.cost = Gcra::new(m1.max(1000)).cost;
        if self.until != 0 {
            g.reprice(self.cost, now);
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
    Fifo(Fifo),
    Fq(Box<fq::Fq>),
}

/// A FIFO leaf's packets: its first and last slot in the tree's [`Slots`] (NONE: empty),
/// and the first one's bytes on the wire (its deadline's length, read without its slot).
#[derive(Clone, Copy)]
struct Fifo {
    head: u32,
    tail: u32,
    head_len: u32,
}

/// The packets waiting in a tree's FIFO leaves, in one arena: each slot links to the next of
/// its leaf, and a freed slot is the next one taken (still in cache). A queue of its own per
/// leaf put each packet in a line of that queue's buffer, a cache miss per packet with
/// 24,000 members (`xpf-bench shaper`: 67% of `enqueue` on that store).
struct Slots {
    v: Vec<Slot>,
    free: u32,
}

/// A packet and the link to its leaf's next one, with that one's bytes on the wire: taking
/// a packet gives the leaf its new first packet's length without a read of that slot, which
/// with 24,000 backlogged members is a cache miss (the packet came seconds before).
struct Slot {
    pkt: Option<Pkt>,
    next: u32,
    next_len: u32,
}

impl Slots {
    fn new() -> Slots {
        Slots { v: Vec::new(), free: NONE }
    }

    #[inline]
    fn push(&mut self, q: &mut Fifo, p: Pkt) {
        let len = p.wire() as u32;
        let i = if self.free != NONE {
            let i = self.free;
            let s = &mut self.v[i as usize];
            self.free = s.next;
            *s = Slot { pkt: Some(p), next: NONE, next_len: 0 };
            i
        } else {
            self.v.push(Slot { pkt: Some(p), next: NONE, next_len: 0 });
            (self.v.len() - 1) as u32
        };
        if q.tail == NONE {
            q.head = i;
            q.head_len = len;
        } else {
            let t = &mut self.v[q.tail as usize];
            t.next = i;
            t.next_len = len;
        }
        q.tail = i;
    }

    #[inline]
    fn pop(&mut self, q: &mut Fifo) -> Option<Pkt> {
        if q.head == NONE {
            return None;
        }
        let i = q.head;
        let s = &mut self.v[i as usize];
        q.head = s.next;
        q.head_len = s.next_len;
        if q.head == NONE {
            q.tail = NONE;
        }
        let p = s.pkt.take();
        s.next = self.free;
        self.free = i;
        p
    }
}

struct Class {
    parent: u32,
    st: St,
    /// What a turn of the parent's round robin adds, in 256ths of [`Shaper::turn_bytes`] (at
    /// most 4,096 x 256: an i32).
    quantum: i32,
    deficit: i64,
    cap: Gcra,
    /// The configured cap (`max`; the root's bandwidth), bits/s, 0: none; a worker's share
    /// ([`Shaper::sync`]) never raises it.
    cap_bits: u64,
    /// Bytes offered (sent, waiting or dropped), and the drops at the last report.
    offered: u64,
    seen_drops: u32,
    /// The leaf's tiers: its `min` and its `bandwidth` as rates (none for inner classes and
    /// a root leaf), bits/s as configured, and whether it is in the tier's heap.
    tier: [Gcra; 2],
    tier_bits: [u64; 2],
    in_tier: [bool; 2],
    /// In the shaper's `to_report` (a leaf given packets since the last report, or still
    /// holding some).
    to_report: bool,
    /// `burst` on `min`, `bandwidth`, `max` (None: none on any).
    bursts: Option<Box<[Bursting; 3]>>,
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

/// Packets a drain takes with [`Shaper::dequeue_batch`] before it sends them (xpfd's drain
/// and the bench's): with every member backlogged a held frame came seconds before, and copied
/// out one at a time the copies were 9% of the worker's time in the shaper lab, each a miss
/// on its own.
pub const DRAIN_BATCH: usize = 16;

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
    /// Per tier, the leaves with packets: those their rate lets send, by the deadline of their
    /// next packet (earliest deadline first: a queue of a high rate that was idle goes before
    /// the first packets of many slow ones), and those it does not yet, by when it will.
    ready: [BinaryHeap<Reverse<(u64, u32)>>; 2],
    pending: [wheel::Wheel; 2],
    /// The pending leaves a tier takes at once (storage kept).
    due: Vec<(u64, u32)>,
    backlog: u32,
    spare: Vec<Vec<u8>>,
    slots: Slots,
    dropped: Vec<Pkt>,
    /// Turns the round robin gave (a class moved to its ring's back): its cost.
    turns: u64,
    /// What a turn gives the smallest share, x16: the mean of the lent packets' bytes (a
    /// moving average over the last 16 or so, from [`TURN0`]), so that a turn is one packet
    /// of the smallest share whatever their size. A fixed turn of 256 bytes handed 60-byte
    /// packets out in lumps of four or five (a member of the shaper lab with 57 packets in its
    /// 10-s window got 7% over its rate from one turn) and a 1,500-byte packet after six
    /// turns; one of an MTU had handed small packets out in lumps of 25.
    turn_bytes: u32,
    /// The leaves [`Shaper::sync`] reports (those given packets since it last ran, and those
    /// still holding some), and the inner classes, which it always does.
    to_report: Vec<u32>,
    inner: Vec<u32>,
}

/// A packet's bytes as the round robin counts them before it has lent any: the smallest
/// frame (60 bytes without its check sequence).
const TURN0: u32 = 60;

/// The quanta of siblings with these bandwidths, in proportion, in 256ths of a turn's bytes
/// ([`Shaper::turn_bytes`]): the smallest 256 (one packet a turn), the largest at most 4,096
/// times that (beyond that ratio the small ones get less per turn and wait more turns: still
/// exact over time).
fn quanta(bws: &[u64]) -> Vec<i64> {
    const BASE: u128 = 256;
    let lo = bws.iter().copied().filter(|&b| b > 0).min().unwrap_or(1) as u128;
    let hi = bws.iter().copied().max().unwrap_or(1).max(1) as u128;
    bws.iter()
        .map(|&b| {
            let b = b.max(1) as u128;
            let q = if hi / lo <= 4096 { b * BASE / lo } else { b * 4096 * BASE / hi };
            q.max(16) as i64
        })
        .collect()
}

impl Shaper {
    pub fn new(spec: &TreeSpec) -> Shaper {
        let n = spec.classes.len();
        let mut classes = Vec::with_capacity(n);
        let mut kids: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, c) in spec.classes.iter().enumerate() {
            if let Some(p) = c.parent.filter(|&p| p < n) {
                kids[p].push(i);
            }
        }
        let is_parent = |i: usize| !kids[i].is_empty();
        for (i, c) in spec.classes.iter().enumerate() {
            let leaf = (!is_parent(i)).then(|| {
                if c.flows > 0 {
                    Leaf::Fq(Box::new(fq::Fq::new(c.flows, if c.quantum > 0 { c.quantum } else { 1514 })))
                } else {
                    Leaf::Fifo(Fifo { head: NONE, tail: NONE, head_len: 0 })
                }
            });
            let qlimit = match c.qlimit {
                0 if c.flows > 0 => DEFAULT_FQ_QLIMIT,
                0 => DEFAULT_QLIMIT,
                q => q,
            };
            let tiers = if leaf.is_some() && c.parent.is_some() { [c.min, c.bandwidth] } else { [0, 0] };
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
                cap: Gcra { tol: if c.parent.is_none() { CATCH_UP_NS } else { TOLERANCE_NS }, ..Gcra::new(cap) },
                cap_bits: cap,
                offered: 0,
                seen_drops: 0,
                tier: tiers.map(Gcra::new),
                bursts: {
                    let b = [
                        Bursting::new(c.burst[0], tiers[0]),
                        Bursting::new(c.burst[1], tiers[1]),
                        Bursting::new(c.burst[2], cap),
                    ];
                    b.iter().any(|x| x.cost != 0).then(|| Box::new(b))
                },
                tier_bits: tiers,
                in_tier: [false; 2],
                to_report: false,
                ring: VecDeque::new(),
                leaf,
                qlimit,
                stats: QueueStats::default(),
            });
        }
        for kids in &kids {
            let bws: Vec<u64> = kids.iter().map(|&k| spec.classes[k].bandwidth).collect();
            for (k, q) in kids.iter().zip(quanta(&bws)) {
                classes[*k].quantum = q as i32;
                // One turn to start with, at the packets' size before any was lent (none: the
                // first pick turned past every sibling, 24,000 for one packet). Counted at 256
                // bytes a turn, a member of 4 parts in the shaper lab was first lent 17 of its
                // 60-byte frames at once, 13% over its rate in a 10-s window.
                classes[*k].deficit = (q * TURN0 as i64) >> 8;
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
        let inner = (0..n as u32).filter(|&c| classes[c as usize].leaf.is_none()).collect();
        Shaper {
            ifname: spec.ifname.clone(),
            classes,
            names: spec.classes.iter().map(|c| c.name.clone()).collect(),
            by_qid,
            default,
            root,
            capped: BinaryHeap::new(),
            ready: [BinaryHeap::new(), BinaryHeap::new()],
            pending: Default::default(),
            due: Vec::new(),
            backlog: 0,
            spare: Vec::new(),
            slots: Slots::new(),
            dropped: Vec::new(),
            turns: 0,
            turn_bytes: TURN0 << 4,
            to_report: Vec::new(),
            inner,
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

    /// The interface's bandwidth (the root's cap), bits/s.
    pub fn root_bits(&self) -> u64 {
        self.classes.get(self.root as usize).map_or(0, |c| c.cap_bits)
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
                Leaf::Fifo(q) => self.slots.pop(q),
                Leaf::Fq(f) => f.take_any(),
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

    /// Whether the queue `qid` names spreads its packets by flow (FQ-CoDel): [`Shaper::enqueue`]
    /// reads `hash` only for those.
    #[inline]
    pub fn hashes(&self, qid: u16) -> bool {
        matches!(self.classes[self.leaf_of(qid)].leaf, Some(Leaf::Fq(_)))
    }

    /// A packet of `len` bytes on the wire for the queue `qid` names, refused before it is
    /// built when that queue is a full FIFO (tail drop): offered, dropped and counted as
    /// [`Shaper::enqueue`] would. With every member backlogged a third of the frames are
    /// refused, and copying each into a buffer to drop it was the caller's work for nothing.
    pub fn refuse(&mut self, qid: u16, len: usize) -> bool {
        self.refuse_at(self.leaf_of(qid), len as u64)
    }

    /// [`Shaper::refuse`] for leaf `c`.
    #[inline]
    fn refuse_at(&mut self, c: usize, len: u64) -> bool {
        let cl = &self.classes[c];
        if cl.stats.qlen < cl.qlimit || !matches!(cl.leaf, Some(Leaf::Fifo(_))) {
            return false;
        }
        self.offer(c, len);
        let st = &mut self.classes[c].stats;
        st.drop_pkts += 1;
        st.drop_bytes += len;
        true
    }

    /// Counts `len` bytes offered to leaf `c` (reported to the coordinator).
    #[inline]
    fn offer(&mut self, c: usize, len: u64) {
        let cl = &mut self.classes[c];
        cl.offered += len;
        if !cl.to_report {
            cl.to_report = true;
            self.to_report.push(c as u32);
        }
    }

    /// Queues packet `p` (of flow `hash`) in the queue `qid` names; false when the queue is
    /// full (the packet is dropped and counted).
    pub fn enqueue(&mut self, qid: u16, mut p: Pkt, hash: u32, now: u64) -> bool {
        let c = self.leaf_of(qid);
        p.enq = now;
        let len = p.wire() as u64;
        if self.refuse_at(c, len) {
            self.recycle(p.buf);
            return false;
        }
        self.offer(c, len);
        let cl = &mut self.classes[c];
        if cl.stats.qlen >= cl.qlimit {
            // A full flow queue (a FIFO refused it above): FQ-CoDel makes room at the fattest
            // flow's head.
            if let Some(Leaf::Fq(f)) = cl.leaf.as_mut() {
                let mut gone = std::mem::take(&mut self.dropped);
                f.drop_fattest(&mut gone);
                cl.stats.drop_pkts += gone.len() as u64;
                cl.stats.qlen -= gone.len() as u32;
                self.backlog -= gone.len() as u32;
                for old in gone.drain(..) {
                    self.classes[c].stats.drop_bytes += old.wire() as u64;
                    self.recycle(old.buf);
                }
                self.dropped = gone;
            }
        }
        let cl = &mut self.classes[c];
        match cl.leaf.as_mut() {
            Some(Leaf::Fifo(q)) => self.slots.push(q, p),
            Some(Leaf::Fq(f)) => f.push(p, hash),
            None => unreachable!("leaf_of gives leaves"),
        }
        cl.stats.qlen += 1;
        if cl.stats.qlen == 1 {
            // Bursts are leaves' (the configuration refuses them on parents): they start
            // when the leaf has something to send again.
            if let Some(b) = cl.bursts.as_deref_mut() {
                for (x, t) in b.iter_mut().zip(cl.tier.iter_mut()) {
                    x.start(t, now);
                }
                b[2].start(&mut cl.cap, now);
            }
            for t in cl.tier.iter_mut() {
                t.anchor(now);
            }
        }
        if self.backlog == 0 {
            self.classes[self.root as usize].cap.anchor(now);
        }
        self.backlog += 1;
        for k in 0..2 {
            if self.classes[c].tier[k].on() && !self.classes[c].in_tier[k] {
                self.classes[c].in_tier[k] = true;
                self.file_tier(c, k, now, true);
            }
        }
        let cl = &mut self.classes[c];
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
            Leaf::Fifo(q) => self.slots.pop(q),
            Leaf::Fq(f) => f.pop(now, &mut self.dropped),
        };
        let gone = self.dropped.len() as u32 + p.is_some() as u32;
        if let Some(p) = &p {
            cl.stats.wait_max = cl.stats.wait_max.max(now.saturating_sub(p.enq));
        }
        cl.stats.qlen -= gone;
        self.backlog -= gone;
        for d in self.dropped.drain(..) {
            cl.stats.drop_pkts += 1;
            cl.stats.drop_bytes += d.wire() as u64;
            if self.spare.len() < 4096 {
                self.spare.push(d.buf);
            }
        }
        p
    }

    /// Charges a packet of `len` bytes sent from leaf `c` to it and every class above; to
    /// the round robin's deficits only when it was `borrowed` (the round robin shares what the
    /// tiers leave: a class the tiers served would otherwise owe the round robin what it
    /// got, and every turn of it would add one quantum: with 24,000 members a pick went round
    /// the ring for hundreds of milliseconds).
    fn charge(&mut self, mut c: u32, len: usize, now: u64, borrowed: bool) {
        let cl = &mut self.classes[c as usize];
        for t in cl.tier.iter_mut() {
            t.charge_backlogged(now, len);
        }
        if let Some(b) = cl.bursts.as_deref_mut() {
            for (x, t) in b.iter_mut().zip(cl.tier.iter_mut()) {
                x.end(t, now);
            }
        }
        let root = self.root;
        while c != NONE {
            let cl = &mut self.classes[c as usize];
            if borrowed {
                cl.deficit -= len as i64;
            }
            if c == root {
                cl.cap.charge_backlogged(now, len);
            } else {
                cl.cap.charge(now, len);
            }
            if let Some(b) = cl.bursts.as_deref_mut() {
                b[2].end(&mut cl.cap, now);
            }
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
                cl.deficit += (cl.quantum as i64 * self.turn_bytes as i64) >> 12;
                self.turns += 1;
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

    /// The length of leaf `c`'s next packet (an MTU when FQ-CoDel's is not known).
    fn head_len(&self, c: usize) -> usize {
        match &self.classes[c].leaf {
            Some(Leaf::Fifo(q)) if q.head != NONE => q.head_len as usize,
            _ => 1514,
        }
    }

    /// Files leaf `c` (with packets) in tier `k`: ready by its next packet's deadline if its
    /// rate lets it send now, else pending until it does.
    ///
    /// A leaf `woken` (packets again after none) goes no later than the earliest deadline
    /// waiting: when the interface is slower than the tree (every busy leaf behind its rate,
    /// catching up), the ready leaves' deadlines lag behind now, and one just woken, dated
    /// from now, waited that lag behind them (an idle member's ping, ~10 ms). Within its rate
    /// it goes first, one packet before the busy ones, as a sparse flow in FQ-CoDel.
    fn file_tier(&mut self, c: usize, k: usize, now: u64, woken: bool) {
        let t = &self.classes[c].tier[k];
        if t.conforms(now) {
            let mut d = t.finish(now, self.head_len(c));
            if woken {
                if let Some(&Reverse((first, _))) = self.ready[k].peek() {
                    d = d.min(first);
                }
            }
            self.ready[k].push(Reverse((d, c as u32)));
        } else {
            self.pending[k].push(t.next(), c as u32);
        }
    }

    /// A packet of tier `k`'s leaf with the earliest deadline among those its rate lets send
    /// now, if any.
    fn serve_tier(&mut self, k: usize, now: u64) -> Option<Pkt> {
        if !self.pending[k].is_empty() {
            let mut due = std::mem::take(&mut self.due);
            self.pending[k].take_due(now, &mut due);
            for &(_, c) in &due {
                let c = c as usize;
                if self.classes[c].stats.qlen == 0 {
                    self.classes[c].in_tier[k] = false;
                } else {
                    self.file_tier(c, k, now, false);
                }
            }
            due.clear();
            self.due = due;
        }
        while let Some(Reverse((_, c))) = self.ready[k].pop() {
            let c = c as usize;
            let cl = &self.classes[c];
            if cl.stats.qlen == 0 {
                self.classes[c].in_tier[k] = false;
                continue;
            }
            if !cl.tier[k].conforms(now) {
                // Served meanwhile (by another tier or the shares): pending again.
                self.pending[k].push(cl.tier[k].next(), c as u32);
                continue;
            }
            // Within its own and its parents' caps (the root's is checked already).
            if let Some(t) = self.capped_above(c, now) {
                self.pending[k].push(t, c as u32);
                continue;
            }
            let Some(p) = self.pop_leaf(c, now) else {
                // FQ-CoDel dropped what it held.
                self.classes[c].in_tier[k] = false;
                continue;
            };
            self.charge(c as u32, p.wire(), now, false);
            if self.classes[c].stats.qlen > 0 {
                self.file_tier(c, k, now, false);
            } else {
                self.classes[c].in_tier[k] = false;
            }
            return Some(p);
        }
        None
    }

    /// When leaf `c` or a class above it (the root aside) is over its cap: when it conforms.
    fn capped_above(&self, mut c: usize, now: u64) -> Option<u64> {
        while c != self.root as usize && c != NONE as usize {
            let cl = &self.classes[c];
            if !cl.cap.conforms(now) {
                return Some(cl.cap.next());
            }
            c = cl.parent as usize;
        }
        None
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
        // The tiers first, `min` then `bandwidth`: the leaf due earliest.
        for k in 0..2 {
            if let Some(p) = self.serve_tier(k, now) {
                return Out::Packet(p);
            }
        }
        // What the tiers leave is lent only up to `now` on the root's clock: its tolerance
        // ahead is the tiers' (a leaf due a moment later finds the interface's time free, not
        // taken by a loan).
        let lent = self.classes[self.root as usize].cap.tat;
        while let Some(c) = if lent <= now { self.pick(now) } else { None } {
            if let Some(p) = self.pop_leaf(c, now) {
                let len = p.wire() as u32;
                self.turn_bytes = self.turn_bytes - (self.turn_bytes >> 4) + len.min(65_535);
                self.charge(c as u32, len as usize, now, true);
                return Out::Packet(p);
            }
        }
        if self.backlog == 0 {
            return Out::Empty;
        }
        let a = self.capped.peek().map_or(u64::MAX, |r| r.0 .0);
        let b = self.pending.iter().filter_map(|w| w.next()).min().unwrap_or(u64::MAX);
        let c = if lent > now { lent } else { u64::MAX };
        Out::Wait(a.min(b).min(c).max(now))
    }

    /// Up to `most` packets that may leave now, appended to `out`, each one's frame asked of
    /// memory as it is taken: a frame held a while is out of the caches, and its copy out then
    /// waits on memory once for the batch instead of once a packet. Gives what ended the
    /// batch: `None` when `most` were taken (more may be ready), else [`Out::Wait`] or
    /// [`Out::Empty`].
    pub fn dequeue_batch(&mut self, now: u64, out: &mut Vec<Pkt>, most: usize) -> Option<Out> {
        for _ in 0..most {
            match self.dequeue(now) {
                Out::Packet(p) => {
                    xpf_state::region::prefetch(p.buf.as_ptr());
                    out.push(p);
                }
                end => return Some(end),
            }
        }
        None
    }

    /// Reports to `coord` what worker `w`'s tree was offered, and takes this worker's share
    /// of every rate from it (each within its configured cap).
    pub fn sync(&mut self, coord: &coord::Coord, w: usize, now: u64) {
        if coord.classes() != self.classes.len() {
            return;
        }
        // The leaves given packets since the last report, or holding some, and the inner
        // classes: a leaf idle since it last reported has nothing new to say (its offered
        // bytes stand, so its rate decays at the coordinator), and takes its share when it
        // next has packets. Visiting all 24,000 every period walked 6 MB of classes through
        // the worker's caches (`xpf-bench shaper`).
        let mut leaves = std::mem::take(&mut self.to_report);
        let classes = &mut self.classes;
        leaves.retain(|&c| {
            let cl = &mut classes[c as usize];
            // Reported again while it says packets wait: its last word is "none".
            cl.to_report = Self::report(cl, coord, w, c as usize, now);
            cl.to_report
        });
        self.to_report = leaves;
        for &c in &self.inner {
            Self::report(&mut self.classes[c as usize], coord, w, c as usize, now);
        }
    }

    /// One class's report to `coord` and its share from it ([`Shaper::sync`]).
    #[inline]
    fn report(cl: &mut Class, coord: &coord::Coord, w: usize, c: usize, now: u64) -> bool {
        // The drops' low bits: a change between two reports is what counts.
        let waiting = cl.stats.qlen > 0 || cl.stats.drop_pkts as u32 != cl.seen_drops;
        cl.seen_drops = cl.stats.drop_pkts as u32;
        coord.report(w, c, cl.offered, waiting);
        let share = coord.cap(w, c);
        if share != 0 {
            let cap = if cl.cap_bits == 0 { share } else { share.min(cl.cap_bits) };
            cl.cap.set_rate(cap, now);
            if let Some(b) = cl.bursts.as_deref_mut() {
                b[2].rescale(&mut cl.cap, cap, now);
            }
            // This worker's part of the tiers' rates: each worker would keep the whole.
            for k in 0..2 {
                if cl.tier_bits[k] != 0 {
                    cl.tier[k].set_rate(share.min(cl.tier_bits[k]), now);
                    if let Some(b) = cl.bursts.as_deref_mut() {
                        b[k].rescale(&mut cl.tier[k], share.min(cl.tier_bits[k]), now);
                    }
                }
            }
        }
        waiting
    }

    /// Each queue's name and counters, in the tree's order.
    pub fn stats(&self) -> impl Iterator<Item = (&str, QueueStats)> + '_ {
        self.names.iter().zip(self.classes.iter()).map(|(n, c)| (n.as_str(), c.stats))
    }
}

#[cfg(test)]
mod tests;
