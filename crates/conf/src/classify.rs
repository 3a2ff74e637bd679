//! First-packet classification for large rulesets: tuple-space search over coarse masks (the
//! family of VPP's ACL plugin and TupleMerge; docs/rules.md has the candidates measured and
//! why this one).
//!
//! Each rule is filed under a *shape* (which of interface, direction, protocol, ports are
//! exact, and its source and destination prefix lengths rounded down to a few levels) and a
//! key (its values under that shape's masks). A packet is looked up once per shape present:
//! its fields under the shape's masks, hashed, give the rules filed there. What comes back
//! is a superset of the rules whose indexed fields match, in rule order; the caller tests
//! each one in full, in order, with pf's semantics (last match, `quick`, anchors, `match`,
//! tags), so the classifier never decides a verdict: it only leaves out rules that cannot
//! match. Fields it does not index (tables, negations, ranges, flags, tags, ...) are
//! wildcards here and tested by the caller.
//!
//! The table stores a 64-bit hash per key, not the key: two keys with one hash share a list,
//! which only adds candidates the full test then rejects.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, HashMap};
use xpf_wire::pdesc::{AF_INET, AF_INET6};
use xpf_wire::PDesc;

/// What the classifier may index of one rule; `None`/0: any (a wildcard here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleKey {
    /// Interface index, 0: any (or a negated one).
    pub ifidx: u16,
    /// 1: in, 2: out, 0: either.
    pub dir: u8,
    /// AF_INET, AF_INET6, or 0 for either.
    pub af: u8,
    pub proto: Option<u8>,
    /// Network (IPv4 in the low 32 bits) and prefix length.
    pub src: Option<(u128, u8)>,
    pub dst: Option<(u128, u8)>,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
}

/// Prefix lengths a shape may have: a rule's length rounds down to the nearest (the rules
/// between two levels share buckets; the full test tells them apart).
const LEVELS4: [u8; 5] = [0, 8, 16, 24, 32];
const LEVELS6: [u8; 7] = [0, 16, 32, 48, 56, 64, 128];

fn level(af: u8, len: u8) -> u8 {
    let levels: &[u8] = if af == AF_INET6 { &LEVELS6 } else { &LEVELS4 };
    levels.iter().rev().copied().find(|&l| l <= len).unwrap_or(0)
}

fn mask(af: u8, len: u8) -> u128 {
    let (bits, full) = if af == AF_INET6 { (128u32, u128::MAX) } else { (32, u32::MAX as u128) };
    match len as u32 {
        0 => 0,
        l if l >= bits => full,
        l => full & !(full >> l),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ShapeId {
    af: u8,
    ifidx: bool,
    dir: bool,
    proto: bool,
    src: u8,
    dst: u8,
    sport: bool,
    dport: bool,
}

/// A shape with at least this share (1/N) of the rules, or [`COMMON_MIN`] rules, is kept as
/// it is; the rules of rarer shapes may move into a wider one.
const COMMON_SHARE: usize = 30;
const COMMON_MIN: usize = 16;
/// A rule moves into a wider shape only while the list it joins is shorter than this.
pub const MERGE_LIMIT: usize = 8;

/// A rule's own shape: prefix lengths rounded down to the levels.
fn shape_id(k: &RuleKey) -> ShapeId {
    let af = if k.src.is_some() || k.dst.is_some() { k.af } else { 0 };
    let lv = |l: u8| level(af, l);
    ShapeId {
        af,
        ifidx: k.ifidx != 0,
        dir: k.dir != 0,
        proto: k.proto.is_some(),
        src: k.src.map_or(0, |(_, l)| lv(l)),
        dst: k.dst.map_or(0, |(_, l)| lv(l)),
        sport: k.sport.is_some(),
        dport: k.dport.is_some(),
    }
}

impl ShapeId {
    /// Whether a rule of shape `r` can be filed under this one: every field here as wide as
    /// the rule's or wider (a family-free shape holds rules of either family only when it
    /// tests no address).
    fn covers(&self, r: &ShapeId) -> bool {
        (self.af == r.af || self.af == 0 && self.src == 0 && self.dst == 0)
            && (!self.ifidx || r.ifidx)
            && (!self.dir || r.dir)
            && (!self.proto || r.proto)
            && (!self.sport || r.sport)
            && (!self.dport || r.dport)
            && self.src <= r.src
            && self.dst <= r.dst
    }

    /// The id as one word (a map's key).
    fn packed(&self) -> u64 {
        u64::from_le_bytes([
            self.af,
            self.ifidx as u8,
            self.dir as u8,
            self.proto as u8,
            self.src,
            self.dst,
            self.sport as u8,
            self.dport as u8,
        ])
    }

    /// The shape a new one is made as for a rule of this shape: direction and source port
    /// left out (few rules differ only there), so that later rules fit it too.
    fn relaxed(&self) -> ShapeId {
        ShapeId { dir: false, sport: false, ..*self }
    }

    fn specificity(&self) -> u32 {
        self.src as u32
            + self.dst as u32
            + 16 * (self.ifidx as u32 + self.dir as u32 + self.proto as u32 + self.sport as u32 + self.dport as u32)
    }
}

/// A rule's key under shape `s`.
fn key_hash(s: &Shape, k: &RuleKey) -> u64 {
    let meta = meta_word(k.ifidx, k.dir, k.proto.unwrap_or(0), k.sport.unwrap_or(0), k.dport.unwrap_or(0));
    let (sa, da) = (k.src.map_or(0, |x| x.0), k.dst.map_or(0, |x| x.0));
    s.hash(meta, (sa as u64) << 32 | (da as u32) as u64, sa, da)
}

/// A shape with its masks, as the lookup uses it.
#[derive(Debug, Clone)]
struct Shape {
    seed: u64,
    /// The meta word's mask (interface, direction, protocol, ports).
    meta: u64,
    /// IPv4 shapes: source << 32 | destination mask. Family-free shapes: 0.
    addr4: u64,
    /// IPv6 shapes: the source's and destination's masks.
    src6: u128,
    dst6: u128,
    wide: bool,
    /// Its part of the [`Filter`]: first word and mask of its (power-of-two) word count.
    fbase: u32,
    fmask: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    hash: u64,
    start: u32,
    len: u32,
}

/// Slots from this many on (1 MiB, the size of a core's L2 here) get a [`Filter`].
const FILTER_FROM: usize = 1 << 16;

/// Which keys the slots may hold: a blocked Bloom filter (two bits of one word a key, a word
/// per 4-8 keys, so 8-16 bits a key: a few per cent of false positives). At a million rules
/// the slots (tens of MiB) are out of the caches and a probe that finds nothing costs a miss
/// like one that finds a list; the filter, 32 times smaller than the slots, leaves those
/// probes out (docs/rules.md has the figures). Each shape has its own part, sized for its
/// keys: a shape of a few hundred keys is a few lines a lookup finds in the caches, whatever
/// the packet, and only the shapes of many keys (per member address) cost a miss when their
/// key is new.
struct Filter {
    words: Vec<u64>,
}

impl Filter {
    #[inline(always)]
    fn at(h: u64, s: &Shape) -> (usize, u64) {
        let w = s.fbase as usize + ((h >> 24) as usize & s.fmask as usize);
        (w, 1u64 << (h >> 58) | 1u64 << ((h >> 52) & 63))
    }

    fn insert(&mut self, h: u64, s: &Shape) {
        let (w, bits) = Filter::at(h, s);
        self.words[w] |= bits;
    }

    #[inline(always)]
    fn prefetch(&self, h: u64, s: &Shape) {
        prefetch(&self.words[Filter::at(h, s).0]);
    }

    #[inline(always)]
    fn may_hold(&self, h: u64, s: &Shape) -> bool {
        let (w, bits) = Filter::at(h, s);
        self.words[w] & bits == bits
    }
}

/// The classifier of one list of rules.
pub struct Classifier {
    /// The shapes a packet probes, by family and direction (IPv4 in, IPv4 out, IPv6 in,
    /// IPv6 out: [`Classifier::shapes_for`]): its family's and the family-free ones that hold
    /// a rule of its direction or of either. A shape of `out` rules alone (a campus's
    /// outbound rules per member source address) is not probed by an inbound packet: its
    /// key there, a new source address at each new connection, would be a miss in the filter
    /// that finds nothing.
    shapes: [Vec<Shape>; 4],
    /// The shapes of each family, both directions together (what `shapes()` counts).
    families: [usize; 2],
    /// Open addressing, a power of two.
    slots: Vec<Slot>,
    /// For large tables: which keys the slots may hold.
    filter: Option<Filter>,
    ids: Vec<u32>,
    /// The longest list (a measure of the worst lookup).
    pub longest: usize,
}

/// A prefetch of the line holding `x`.
#[inline(always)]
fn prefetch<T>(x: &T) {
    xpf_state::region::prefetch(std::ptr::from_ref(x).cast());
}

#[inline(always)]
fn mix(x: u64, k: u64) -> u64 {
    let m = (x ^ k) as u128 * 0x9e37_79b9_7f4a_7c15u128;
    (m >> 64) as u64 ^ m as u64
}

/// The build's maps' hasher: their keys are words (a shape's id packed, a key's hash), each
/// mixed once. std's SipHash, over a million rules' keys, was a fifth of a build.
#[derive(Default, Clone, Copy)]
struct Mixer(u64);

impl std::hash::Hasher for Mixer {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0, b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(self.0, x);
    }
}

type Mixed = std::hash::BuildHasherDefault<Mixer>;

#[inline(always)]
fn meta_word(ifidx: u16, dir: u8, proto: u8, sport: u16, dport: u16) -> u64 {
    ifidx as u64 | (dir as u64) << 16 | (proto as u64) << 24 | (sport as u64) << 32 | (dport as u64) << 48
}

impl Shape {
    fn of(id: &ShapeId, n: usize) -> Shape {
        let meta = meta_word(
            if id.ifidx { u16::MAX } else { 0 },
            if id.dir { 0xff } else { 0 },
            if id.proto { 0xff } else { 0 },
            if id.sport { u16::MAX } else { 0 },
            if id.dport { u16::MAX } else { 0 },
        );
        let (s, d) = (mask(id.af, id.src), mask(id.af, id.dst));
        Shape {
            seed: mix(n as u64 + 1, 0x51_7cc1_b727_220a),
            meta,
            addr4: if id.af == AF_INET { (s as u64) << 32 | d as u64 } else { 0 },
            src6: if id.af == AF_INET6 { s } else { 0 },
            dst6: if id.af == AF_INET6 { d } else { 0 },
            wide: id.af == AF_INET6,
            fbase: 0,
            fmask: 0,
        }
    }

    #[inline(always)]
    fn hash(&self, meta: u64, a4: u64, s6: u128, d6: u128) -> u64 {
        let h = mix(self.seed, meta & self.meta);
        let h = if self.wide {
            let (s, d) = (s6 & self.src6, d6 & self.dst6);
            mix(mix(mix(mix(h, (s >> 64) as u64), s as u64), (d >> 64) as u64), d as u64)
        } else {
            mix(h, a4 & self.addr4)
        };
        h | 1
    }
}

/// Up to this many candidates are copied and sorted on the stack.
pub const INLINE: usize = 64;

/// Lists a lookup keeps on the stack; more go to [`Candidates::spill`]. The stack's are
/// written when a lookup starts: 16 is more than a campus's lookups find (a campus ruleset
/// has 10-14 shapes); a random one's at a million rules finds dozens.
const LISTS: usize = 16;

/// A lookup's candidates, handed out in rule order (an iterator).
///
/// The probes note the lists they find (each in rule order) and ask for their first line.
/// When they hold few candidates (up to [`INLINE`]), those are then copied and sorted on the
/// stack; past that, the lists are merged as the walk takes them: a walk that stops at a
/// `quick` rule pays for the candidates it took, not for sorting or copying all of them (a
/// random ruleset's lookup at a million rules finds thousands in dozens of lists).
pub struct Candidates<'a> {
    buf: [u32; INLINE],
    n: usize,
    /// The next of `buf` to hand out.
    pos: usize,
    /// The lists found: the first [`LISTS`] here, the rest in `spill`.
    lists: [&'a [u32]; LISTS],
    /// Lists in `lists`; after [`Candidates::finish`], 0 when the candidates were copied to
    /// `buf` (handed out from there) and the lists' count when they are merged.
    nl: usize,
    spill: Vec<&'a [u32]>,
    /// The rules in the lists found.
    total: usize,
    /// The merge (when `total` > [`INLINE`]): each list's next rule, as `rule << 32 | list`.
    heap: BinaryHeap<Reverse<u64>>,
}

impl<'a> Candidates<'a> {
    pub fn new() -> Candidates<'a> {
        Candidates {
            buf: [0; INLINE],
            n: 0,
            pos: 0,
            lists: [&[]; LISTS],
            nl: 0,
            spill: Vec::new(),
            total: 0,
            heap: BinaryHeap::new(),
        }
    }

    fn clear(&mut self) {
        self.n = 0;
        self.pos = 0;
        self.nl = 0;
        self.spill.clear();
        self.total = 0;
        self.heap.clear();
    }

    #[inline]
    fn extend(&mut self, ids: &'a [u32]) {
        if ids.is_empty() {
            return;
        }
        prefetch(&ids[0]);
        if self.nl < LISTS {
            self.lists[self.nl] = ids;
            self.nl += 1;
        } else {
            if self.spill.capacity() == 0 {
                // Once, for the many lists such a lookup finds.
                self.spill.reserve(4 * LISTS);
            }
            self.spill.push(ids);
        }
        self.total += ids.len();
    }

    /// After the probes: few candidates copied and sorted, or the merge started.
    fn finish(&mut self) {
        if self.total <= INLINE {
            // The spilled lists too: more than LISTS short lists still fit the copy.
            for l in self.lists[..self.nl].iter().chain(&self.spill) {
                self.buf[self.n..self.n + l.len()].copy_from_slice(l);
                self.n += l.len();
            }
            if self.nl > 1 {
                insertion_sort(&mut self.buf[..self.n]);
            }
            self.nl = 0;
            return;
        }
        let heads = self.lists[..self.nl].iter().chain(&self.spill).enumerate();
        self.heap = BinaryHeap::from(heads.map(|(k, r)| Reverse((r[0] as u64) << 32 | k as u64)).collect::<Vec<_>>());
    }

    /// How many candidates are left to hand out (all the lookup found, before the first).
    pub fn len(&self) -> usize {
        if self.nl == 0 {
            return self.n - self.pos;
        }
        self.lists[..self.nl].iter().chain(&self.spill).map(|r| r.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Iterator for Candidates<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.nl == 0 {
            let id = *self.buf[..self.n].get(self.pos)?;
            self.pos += 1;
            return Some(id);
        }
        let mut top = self.heap.peek_mut()?;
        let Reverse(head) = *top;
        let run = head as u32 as usize;
        let r = if run < LISTS { &mut self.lists[run] } else { &mut self.spill[run - LISTS] };
        *r = &r[1..];
        match r.first().copied() {
            Some(id) => *top = Reverse((id as u64) << 32 | run as u64),
            None => {
                PeekMut::pop(top);
            }
        }
        Some((head >> 32) as u32)
    }
}

impl Default for Candidates<'_> {
    fn default() -> Self {
        Candidates::new()
    }
}

#[inline]
fn insertion_sort(v: &mut [u32]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1] > x {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

impl std::fmt::Debug for Classifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier")
            .field("shapes4", &self.families[0])
            .field("shapes6", &self.families[1])
            .field("slots", &self.slots.len())
            .field("filter", &self.filter.is_some())
            .field("rules", &self.ids.len())
            .field("longest", &self.longest)
            .finish()
    }
}

impl Classifier {
    /// Files every rule of `keys` (index = rule index). Shapes with many rules stay as
    /// they are; a rule of a rare shape goes into the most specific common shape it fits
    /// (one whose every field is as wide or wider) while that shape's list for its key holds
    /// fewer than [`MERGE_LIMIT`] rules (TupleMerge's relaxation: fewer shapes to probe for
    /// a few more candidates per probe); otherwise its own shape is kept.
    ///
    /// A long list (rules that share every indexed field at the levels) stays one list: a
    /// lookup that finds it merges it with the others as the walk takes its rules, so it
    /// costs the rules the walk tests, not its length (an index of its own over the rules'
    /// exact prefix lengths cost more to probe than it saved: docs/rules.md).
    pub fn build(keys: &[RuleKey]) -> Classifier {
        let natural: Vec<ShapeId> = keys.iter().map(shape_id).collect();
        let mut count: HashMap<u64, u32, Mixed> = HashMap::default();
        for id in &natural {
            *count.entry(id.packed()).or_default() += 1;
        }
        let size: Vec<u32> = natural.iter().map(|id| count[&id.packed()]).collect();
        let big = (keys.len() / COMMON_SHARE).max(COMMON_MIN) as u32;
        // Shapes by size, then rule order inside each (stable).
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(size[i as usize]));
        let mut chosen: Vec<(ShapeId, Shape)> = Vec::new();
        // Per chosen shape, the directions of the rules filed under it (1: in, 2: out).
        let mut dirs: Vec<u8> = Vec::new();
        // Each rule's chosen shape.
        let mut shape_of: Vec<u32> = vec![0; keys.len()];
        // (key hash, rule) as filed, and each key's list length so far.
        let mut filed: Vec<(u64, u32)> = Vec::with_capacity(keys.len());
        let mut lens: HashMap<u64, u32, Mixed> = HashMap::with_capacity_and_hasher(keys.len(), Mixed::default());
        // Per rare shape, the chosen shapes that cover it, most specific first, as of how many
        // shapes were chosen then (the rules of a shape ask the same question).
        let mut fits_of: HashMap<u64, (usize, Vec<usize>), Mixed> = HashMap::default();
        let intern = |chosen: &mut Vec<(ShapeId, Shape)>, id: ShapeId| -> usize {
            match chosen.iter().position(|c| c.0 == id) {
                Some(i) => i,
                None => {
                    let n = chosen.len();
                    chosen.push((id, Shape::of(&id, n)));
                    n
                }
            }
        };
        for i in order {
            let k = &keys[i as usize];
            let own = natural[i as usize];
            let (t, h) = if size[i as usize] >= big {
                let t = intern(&mut chosen, own);
                (t, key_hash(&chosen[t].1, k))
            } else {
                // The most specific chosen shape it fits, with room in its list.
                let n = chosen.len();
                let fits = fits_of.entry(own.packed()).or_insert_with(|| (usize::MAX, Vec::new()));
                if fits.0 != n {
                    fits.1.clear();
                    fits.1.extend((0..n).filter(|&c| chosen[c].0.covers(&own)));
                    fits.1.sort_by_key(|&c| std::cmp::Reverse(chosen[c].0.specificity()));
                    fits.0 = n;
                }
                let room = |h: &u64| lens.get(h).is_none_or(|&l| (l as usize) < MERGE_LIMIT);
                match fits.1.iter().map(|&c| (c, key_hash(&chosen[c].1, k))).find(|(_, h)| room(h)) {
                    Some(found) => found,
                    None => {
                        let t = intern(&mut chosen, own.relaxed());
                        (t, key_hash(&chosen[t].1, k))
                    }
                }
            };
            dirs.resize(chosen.len(), 0);
            shape_of[i as usize] = t as u32;
            dirs[t] |= match k.dir {
                1 => 1,
                2 => 2,
                _ => 3,
            };
            *lens.entry(h).or_default() += 1;
            filed.push((h, i));
        }
        // Each list's rules together, in rule order.
        filed.sort_unstable();
        let cap = (lens.len() * 2).next_power_of_two().max(16);
        drop(lens);
        let mut slots = vec![Slot::default(); cap];
        let mut filter = (cap >= FILTER_FROM).then(|| {
            // Each shape's keys (a list of rules of several shapes, two keys of one hash, is
            // a key of each), then its part: a word per 8 keys or fewer, a power of two, the
            // largest first so that every part starts on a multiple of its size.
            let (mut keys_of, mut stamp) = (vec![0usize; chosen.len()], vec![usize::MAX; chosen.len()]);
            for (g, group) in filed.chunk_by(|a, b| a.0 == b.0).enumerate() {
                for x in group {
                    let t = shape_of[x.1 as usize] as usize;
                    if stamp[t] != g {
                        stamp[t] = g;
                        keys_of[t] += 1;
                    }
                }
            }
            let words_of = |t: usize| keys_of[t].div_ceil(8).next_power_of_two();
            let mut by_size: Vec<usize> = (0..chosen.len()).collect();
            by_size.sort_by_key(|&t| std::cmp::Reverse(words_of(t)));
            let mut base = 0;
            for t in by_size {
                let sh = &mut chosen[t].1;
                (sh.fbase, sh.fmask) = (base as u32, words_of(t) as u32 - 1);
                base += words_of(t);
            }
            Filter { words: vec![0; base] }
        });
        let mut ids = Vec::with_capacity(keys.len());
        let mut longest = 0;
        for group in filed.chunk_by(|a, b| a.0 == b.0) {
            let h = group[0].0;
            let mut j = h as usize & (cap - 1);
            while slots[j].hash != 0 {
                j = (j + 1) & (cap - 1);
            }
            if let Some(f) = &mut filter {
                for x in group {
                    f.insert(h, &chosen[shape_of[x.1 as usize] as usize].1);
                }
            }
            slots[j] = Slot { hash: h, start: ids.len() as u32, len: group.len() as u32 };
            longest = longest.max(group.len());
            ids.extend(group.iter().map(|x| x.1));
        }
        let of = |not: u8, dir: u8| -> Vec<Shape> {
            chosen
                .iter()
                .zip(&dirs)
                .filter(|((id, _), &d)| id.af != not && d & dir != 0)
                .map(|x| x.0 .1.clone())
                .collect()
        };
        let shapes = [of(AF_INET6, 1), of(AF_INET6, 2), of(AF_INET, 1), of(AF_INET, 2)];
        let families = [AF_INET6, AF_INET].map(|not| chosen.iter().filter(|(id, _)| id.af != not).count());
        Classifier { shapes, families, slots, filter, ids, longest }
    }

    /// How many shapes a packet of family `af` probes.
    pub fn shapes(&self, af: u8) -> usize {
        self.families[(af == AF_INET6) as usize]
    }

    /// Bytes the classifier holds.
    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
            + self.filter.as_ref().map_or(0, |f| f.words.len() * 8)
            + self.ids.len() * 4
            + self.shapes.iter().map(Vec::len).sum::<usize>() * std::mem::size_of::<Shape>()
    }

    #[inline]
    fn find(&self, h: u64) -> Option<&Slot> {
        let m = self.slots.len() - 1;
        let mut j = h as usize & m;
        loop {
            let s = &self.slots[j];
            if s.hash == h {
                return Some(s);
            }
            if s.hash == 0 {
                return None;
            }
            j = (j + 1) & m;
        }
    }

    /// The rules the packet may match on interface `ifidx` in direction `dir` (1 in, 2 out),
    /// in rule order, into `out` (cleared first).
    #[inline]
    pub fn candidates<'a>(&'a self, pd: &PDesc, ifidx: u16, dir: u8, out: &mut Candidates<'a>) {
        out.clear();
        let meta = meta_word(ifidx, dir, pd.proto, pd.sport, pd.dport);
        let shapes = self.shapes_for(pd.af, dir);
        if pd.af == AF_INET {
            self.probe(shapes, meta, (pd.src.v4_u32() as u64) << 32 | pd.dst.v4_u32() as u64, 0, 0, out);
        } else {
            self.probe(shapes, meta, 0, u128::from_be_bytes(pd.src.0), u128::from_be_bytes(pd.dst.0), out);
        }
        out.finish();
    }

    /// The shapes a packet of family `af` in direction `dir` (1 in, 2 out) probes.
    #[inline(always)]
    fn shapes_for(&self, af: u8, dir: u8) -> &[Shape] {
        &self.shapes[(af == AF_INET6) as usize * 2 + (dir == 2) as usize]
    }

    /// The packet's shapes probed with its words; what is found, into `out`.
    #[inline]
    fn probe<'a>(&'a self, shapes: &[Shape], meta: u64, a4: u64, s6: u128, d6: u128, out: &mut Candidates<'a>) {
        // Hashes first, each slot's line prefetched, then the probes: the loads overlap
        // instead of waiting one by one. With a filter, its words are asked for first and
        // only the slots it may hold are probed. Up to 64 shapes at a time: a random
        // ruleset's 62 wait on memory twice a lookup, not eight times as 16 at a time did.
        let m = self.slots.len() - 1;
        for chunk in shapes.chunks(64) {
            let mut hs = [0u64; 64];
            for (h, s) in hs.iter_mut().zip(chunk) {
                *h = s.hash(meta, a4, s6, d6);
            }
            let mut n = chunk.len();
            if let Some(f) = &self.filter {
                for (&h, s) in hs.iter().zip(chunk) {
                    f.prefetch(h, s);
                }
                n = 0;
                for (k, s) in chunk.iter().enumerate() {
                    if f.may_hold(hs[k], s) {
                        hs[n] = hs[k];
                        n += 1;
                    }
                }
            }
            for &h in &hs[..n] {
                prefetch(&self.slots[h as usize & m]);
            }
            for &h in &hs[..n] {
                if let Some(s) = self.find(h) {
                    out.extend(&self.ids[s.start as usize..(s.start + s.len) as usize]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_levels() {
        assert_eq!(mask(AF_INET, 0), 0);
        assert_eq!(mask(AF_INET, 8), 0xff00_0000);
        assert_eq!(mask(AF_INET, 32), 0xffff_ffff);
        assert_eq!(mask(AF_INET6, 128), u128::MAX);
        assert_eq!(mask(AF_INET6, 64), u128::MAX << 64);
        assert_eq!(level(AF_INET, 28), 24);
        assert_eq!(level(AF_INET, 7), 0);
        assert_eq!(level(AF_INET6, 60), 56);
    }

    /// Whether the rule's indexed fields match the packet (what no lookup may leave out).
    fn key_matches(k: &RuleKey, pd: &PDesc, ifidx: u16, dir: u8) -> bool {
        let net = |n: Option<(u128, u8)>, a: u32| n.is_none_or(|(v, l)| a as u128 & mask(AF_INET, l) == v);
        (k.ifidx == 0 || k.ifidx == ifidx)
            && (k.dir == 0 || k.dir == dir)
            && (k.af == 0 || k.af == pd.af)
            && k.proto.is_none_or(|p| p == pd.proto)
            && net(k.src, pd.src.v4_u32())
            && net(k.dst, pd.dst.v4_u32())
            && k.sport.is_none_or(|p| p == pd.sport)
            && k.dport.is_none_or(|p| p == pd.dport)
    }

    /// 5,000 rules over few values, so that lookups find hundreds of candidates (past the
    /// stack's copy, merged from the lists), and a large table (with its filter): every
    /// lookup hands out each rule whose indexed fields match, once, in rule order.
    #[test]
    fn candidates_past_the_stack_come_merged_in_rule_order() {
        let mut g = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            g ^= g << 13;
            g ^= g >> 7;
            g ^= g << 17;
            (g % n) as usize
        };
        let nets = [(0x0a00_0000u128, 8u8), (0x0a01_0000, 16), (0x0a01_0200, 24), (0x0a01_0203, 32), (0x0a01_0200, 28)];
        let mut keys: Vec<RuleKey> = (0..5000)
            .map(|_| RuleKey {
                ifidx: [0, 1][rnd(2)],
                dir: rnd(3) as u8,
                af: AF_INET,
                proto: [None, Some(6), Some(17)][rnd(3)],
                src: [None, Some(nets[rnd(5)])][rnd(2)],
                dst: [None, Some(nets[rnd(5)])][rnd(2)],
                sport: [None, Some(1000)][rnd(2)],
                dport: [None, Some(80), Some(443)][rnd(3)],
            })
            .collect();
        // Many distinct host rules besides: the table passes the filter's size.
        keys.extend((0..40_000u32).map(|k| RuleKey {
            af: AF_INET,
            proto: Some(6),
            dst: Some((0x0b00_0000 + k as u128, 32)),
            dport: Some(22),
            ..RuleKey::default()
        }));
        let c = Classifier::build(&keys);
        let f = c.filter.as_ref().expect("a table past the filter's size has one");
        // Keys it never held pass a shape's part at a few per cent (8-16 bits a key, two a
        // key); the part of the shape of 40,000 host keys holds them in 8,192 words.
        let mut sized = 0;
        for sh in c.shapes.iter().flatten() {
            let passed = (0..100_000u64).filter(|&k| f.may_hold(mix(k, 0x1234_5678) | 1, sh)).count();
            assert!(passed < 8_000, "{passed} of 100,000 absent keys passed the filter");
            sized += usize::from(sh.fmask == 8_191);
        }
        assert!(sized > 0, "no part of 8,192 words: {:?}", c.shapes[0].iter().map(|s| s.fmask).collect::<Vec<_>>());
        let (mut merged, mut spilled, mut lookups) = (0, 0, 0);
        for src in [0x0a01_0203u32, 0x0a01_0207, 0x0a02_0000, 0x0c00_0001] {
            for dst in [0x0a01_0203u32, 0x0a01_0301, 0x0b00_0005, 0x0b00_9c40] {
                for (proto, sport, dport) in [(6, 1000, 80), (17, 1000, 443), (6, 2000, 22), (1, 0, 0)] {
                    for (ifidx, dir) in [(1, 1), (2, 2)] {
                        let pd = PDesc {
                            af: AF_INET,
                            proto,
                            src: xpf_wire::pdesc::Addr::v4(src.to_be_bytes()),
                            dst: xpf_wire::pdesc::Addr::v4(dst.to_be_bytes()),
                            sport,
                            dport,
                            ..PDesc::default()
                        };
                        let mut out = Candidates::new();
                        c.candidates(&pd, ifidx, dir, &mut out);
                        let n = out.len();
                        merged += usize::from(n > INLINE);
                        spilled += usize::from(!out.spill.is_empty());
                        lookups += 1;
                        let first = out.next();
                        assert_eq!(out.len() + usize::from(first.is_some()), n);
                        let got: Vec<u32> = first.into_iter().chain(out.by_ref()).collect();
                        assert_eq!((got.len(), out.len()), (n, 0));
                        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order or twice: {got:?}");
                        for (i, k) in keys.iter().enumerate() {
                            if key_matches(k, &pd, ifidx, dir) {
                                assert!(got.binary_search(&(i as u32)).is_ok(), "rule {i} {k:?} left out for {pd:?}");
                            }
                        }
                    }
                }
            }
        }
        assert!(merged * 4 > lookups, "only {merged} of {lookups} lookups past the stack");
        assert!(spilled * 8 > lookups, "only {spilled} of {lookups} lookups found more lists than the stack holds");
    }

    /// Rules of one direction in a shape of their own: a packet of the other direction does
    /// not probe it (and finds none of them), a packet of theirs does; rules of either
    /// direction are found both ways.
    #[test]
    fn a_shape_of_one_direction_is_probed_by_that_direction_only() {
        let host = |k: u32| Some((0x2c00_0000 + k as u128, 32));
        let mut keys: Vec<RuleKey> = (0..1000)
            .map(|k| RuleKey {
                dir: 2,
                af: AF_INET,
                proto: Some(6),
                src: host(k),
                dport: Some(25),
                ..RuleKey::default()
            })
            .collect();
        keys.extend((0..1000).map(|k| RuleKey {
            dir: 1,
            af: AF_INET,
            proto: Some(6),
            dst: host(k),
            dport: Some(22),
            ..RuleKey::default()
        }));
        keys.push(RuleKey { af: AF_INET, proto: Some(6), ..RuleKey::default() });
        let c = Classifier::build(&keys);
        let (inb, outb) = (c.shapes_for(AF_INET, 1).len(), c.shapes_for(AF_INET, 2).len());
        assert_eq!((inb, outb, c.shapes(AF_INET)), (2, 2, 3), "in, out and the either-way shape");
        let lookup = |src: u32, dst: u32, dport: u16, dir: u8| -> Vec<u32> {
            let pd = PDesc {
                af: AF_INET,
                proto: 6,
                src: xpf_wire::pdesc::Addr::v4(src.to_be_bytes()),
                dst: xpf_wire::pdesc::Addr::v4(dst.to_be_bytes()),
                sport: 40000,
                dport,
                ..PDesc::default()
            };
            let mut out = Candidates::new();
            c.candidates(&pd, 1, dir, &mut out);
            out.collect()
        };
        // Member 7 sends mail out: its out rule and the either-way rule.
        assert_eq!(lookup(0x2c00_0007, 0x0808_0808, 25, 2), vec![7, 2000]);
        // The same addresses inbound: the out rule is not a candidate.
        assert_eq!(lookup(0x2c00_0007, 0x0808_0808, 25, 1), vec![2000]);
        // ssh in to member 9: its in rule; outbound, not.
        assert_eq!(lookup(0x0808_0808, 0x2c00_0009, 22, 1), vec![1009, 2000]);
        assert_eq!(lookup(0x0808_0808, 0x2c00_0009, 22, 2), vec![2000]);
    }

    /// More lists than the stack holds, but few rules in them: the lists past the stack are
    /// copied with the others (they were left out, and their rules with them).
    #[test]
    fn few_candidates_in_many_lists_are_all_found() {
        let a = 0x0a01_0203u32;
        let mut keys = Vec::new();
        // Shapes none of which covers another (one more indexed field, one less level), so
        // each stays its own: 34 lists of one rule, all matching the packet below.
        for (ifidx, proto, dport) in (0..8).map(|b| (b & 1 != 0, b & 2 != 0, b & 4 != 0)) {
            let fields = ifidx as u8 + proto as u8 + dport as u8;
            for s in 0..=4u8 {
                let Some(d) = (5 - fields).checked_sub(s).filter(|&d| d <= 4) else { continue };
                let net = |l: u8| (l > 0).then(|| ((a & mask(AF_INET, l * 8) as u32) as u128, l * 8));
                keys.push(RuleKey {
                    ifidx: if ifidx { 1 } else { 0 },
                    dir: 0,
                    af: AF_INET,
                    proto: proto.then_some(6),
                    src: net(s),
                    dst: net(d),
                    sport: None,
                    dport: dport.then_some(80),
                });
            }
        }
        assert_eq!(keys.len(), 34);
        let c = Classifier::build(&keys);
        assert!(c.shapes(AF_INET) > LISTS, "{c:?}");
        let v4 = xpf_wire::pdesc::Addr::v4(a.to_be_bytes());
        let pd = PDesc { af: AF_INET, proto: 6, src: v4, dst: v4, sport: 1000, dport: 80, ..PDesc::default() };
        let mut out = Candidates::new();
        c.candidates(&pd, 1, 1, &mut out);
        let got: Vec<u32> = out.collect();
        assert_eq!(got, (0..keys.len() as u32).collect::<Vec<_>>());
    }
}
