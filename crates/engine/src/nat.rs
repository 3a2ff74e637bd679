//! Address translation (pf's `nat-to`, `rdr-to`, `binat-to`): the address a rule's pool gives
//! a new flow (pf_map_addr), the source port it gets (the allocator below), and the rewrite a
//! packet of a translated state takes to the state's other key.
//!
//! A translated state has two keys, as in pf: the wire key (the packet as it is on the
//! interface) and the stack key (the packet as the host behind the firewall sees it). A packet
//! going `in` must match a state by its wire key and is rewritten to the stack key; a packet
//! going `out` must match by the stack key and is rewritten to the wire key.
//!
//! Source ports (and ICMP query identifiers) come from a per-address allocator with a bounded
//! cost per new flow, whatever the occupancy: ports never used go first, in a random order (a
//! permutation of the range, so ports are not predictable, RFC 6056); a released port goes to
//! the tail of a FIFO and is not handed out again for [`HOLD`] seconds (RFC 6888 REQ-8); a
//! port is given to one flow at a time while free ports remain. When none is free, a port in use may be shared by a flow to
//! another destination (the wire keys still differ, as pf's and Linux's endpoint-dependent
//! ports are): [`TRIES`] random ports at most are tried, then the packet is dropped as pf's
//! `translate`. pf instead scans the range linearly (up to the whole range per new flow when
//! it is nearly full); Linux caps its search at 248 tries, VPP at 10.

use rand_chacha::ChaCha20Rng;
use rand_core::Rng;
use std::collections::hash_map::Entry;
use std::collections::VecDeque;

/// The allocator's maps: keyed by the pools' own addresses and the ports it chose, nothing a
/// sender picks, so a fast unkeyed-strength hash will do (foldhash, seeded per process).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use xpf_wire::pdesc::{AF_INET, AF_INET6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};
use xpf_wire::{Addr, PDesc};

pub use xpf_wire::translate::Rewrite;

/// Seconds a released port waits before it is handed out again (RFC 6888 REQ-8).
pub const HOLD: u32 = 120;
/// Ports tried at most per new flow once none is free.
pub const TRIES: u32 = 8;

/// How a pool picks an address (pf's pool types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// The pool's (first) address; a network maps host bits as [`Method::Bitmask`].
    None,
    /// The pool's network bits over the host bits of the address being replaced (binat).
    Bitmask,
    Random,
    RoundRobin,
    /// A keyed hash of the source address picks the address: a source keeps its address.
    SourceHash([u8; 16]),
    /// The address with the fewest translated states among [`LEAST_OF`] in round-robin
    /// order (all of them in a pool that small; pf walks the whole pool).
    LeastStates,
}

/// Addresses `least-states` compares per new flow: a bounded cost on a /16 pool.
pub const LEAST_OF: u64 = 8;

/// One network of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    pub addr: Addr,
    pub af: u8,
    pub len: u8,
}

/// A translation target and its options, compiled from a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub nets: Vec<Net>,
    pub method: Method,
    /// nat-to: the source ports to choose from (pf's default 50001:65535); rdr-to: the new
    /// destination port, (0, 0) to keep it, (p, q) with q > p to map the rule's destination
    /// ports from `dst_base` onto p..q.
    pub ports: (u16, u16),
    /// nat-to `static-port`: the source port is kept.
    pub static_port: bool,
    pub dst_base: u16,
    /// `endpoint-independent`: a UDP source (address and port) keeps the translated address
    /// and port it was given towards every destination while it has a state (RFC 4787
    /// REQ-1); filtering stays endpoint-dependent (a new endpoint's packets need a state).
    pub endpoint_independent: bool,
    /// `sticky-address`: a source keeps the address it was first given while it has
    /// translated states to it.
    pub sticky: bool,
    /// FreeBSD's `map-e-portset`: the source ports are a MAP-E port set (RFC 7597), and
    /// `ports` its span.
    pub portset: Option<PortSet>,
}

/// A MAP-E port set (RFC 7597 5.1, FreeBSD's `map-e-portset OFFSET/LEN/PSID`): the ports
/// whose `offset` high bits are not all zero and whose next `len` bits are `psid`; the low
/// 16 - offset - len bits are free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortSet {
    pub offset: u8,
    pub len: u8,
    pub psid: u16,
}

impl PortSet {
    /// The free low bits.
    fn low_bits(&self) -> u32 {
        16 - self.offset as u32 - self.len as u32
    }

    /// How many ports the set holds.
    pub fn size(&self) -> u32 {
        ((1u32 << self.offset) - 1) << self.low_bits()
    }

    /// Its `i`th port (`i` below [`size`](Self::size)), in ascending order.
    pub fn port(&self, i: u32) -> u16 {
        let m = self.low_bits();
        let a = (i >> m) + 1;
        ((a << (16 - self.offset as u32)) | ((self.psid as u32) << m) | (i & ((1 << m) - 1))) as u16
    }

    /// Whether `port` is one of the set's.
    pub fn holds(&self, port: u16) -> bool {
        let (p, m) = (port as u32, self.low_bits());
        p >> (16 - self.offset as u32) != 0 && (p >> m) & ((1 << self.len) - 1) == self.psid as u32
    }

    /// The lowest and highest of its ports.
    pub fn span(&self) -> (u16, u16) {
        (self.port(0), self.port(self.size() - 1))
    }
}

/// The source ports a pool hands out: `lo..=hi`, or the port set `set` (whose span
/// `lo..=hi` then is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub lo: u16,
    pub hi: u16,
    pub set: Option<PortSet>,
}

impl From<(u16, u16)> for Range {
    fn from((lo, hi): (u16, u16)) -> Range {
        Range { lo, hi, set: None }
    }
}

fn width(af: u8) -> u32 {
    if af == AF_INET {
        32
    } else {
        128
    }
}

fn to_int(a: &Addr, af: u8) -> u128 {
    if af == AF_INET {
        u32::from_be_bytes(a.v4_bytes()) as u128
    } else {
        u128::from_be_bytes(a.0)
    }
}

fn from_int(v: u128, af: u8) -> Addr {
    if af == AF_INET {
        Addr::v4((v as u32).to_be_bytes())
    } else {
        Addr(v.to_be_bytes())
    }
}

/// The host-part mask of a `/len` network.
fn host_mask(af: u8, len: u8) -> u128 {
    let w = width(af);
    let len = (len as u32).min(w);
    if len == w {
        0
    } else if w - len == 128 {
        u128::MAX
    } else {
        (1u128 << (w - len)) - 1
    }
}

/// `net`'s network bits over `host`'s host bits (pf_poolmask).
fn graft(net: &Net, host: u128) -> Addr {
    let m = host_mask(net.af, net.len);
    from_int((to_int(&net.addr, net.af) & !m) | (host & m), net.af)
}

/// Addresses in `net` as counted by round-robin (an IPv6 network's count is capped at 2^32).
fn size(net: &Net) -> u64 {
    let bits = (width(net.af) - (net.len as u32).min(width(net.af))).min(32);
    1u64 << bits
}

fn keyed_hash(a: &Addr, key: &[u8; 16]) -> u64 {
    let k0 = u64::from_le_bytes(key[..8].try_into().unwrap());
    let k1 = u64::from_le_bytes(key[8..].try_into().unwrap());
    let w0 = u64::from_le_bytes(a.0[..8].try_into().unwrap());
    let w1 = u64::from_le_bytes(a.0[8..].try_into().unwrap());
    let m = |x: u64, y: u64| {
        let p = (x as u128) * (y as u128);
        (p as u64) ^ ((p >> 64) as u64)
    };
    m(m(w0 ^ k0, w1 ^ k1 ^ 0x9e37_79b9_7f4a_7c15), k0 ^ k1 ^ 0xc2b2_ae3d_27d4_eb4f)
}

impl Pool {
    /// The address this pool gives a packet of family `af` from `src` whose address `orig`
    /// is being replaced (`cursor`: the worker's round-robin position for this pool); None
    /// when the pool has no address of the family.
    pub fn pick(&self, af: u8, src: &Addr, orig: &Addr, rng: &mut ChaCha20Rng, cursor: &mut u64) -> Option<Addr> {
        let nets = || self.nets.iter().filter(|n| n.af == af);
        let n = nets().count();
        let first = nets().next()?;
        Some(match &self.method {
            // A network with no pool type maps host to host (binat-to's networks, which
            // pfctl prints without `bitmask`); pf would hand out the network's own address.
            Method::None | Method::Bitmask => graft(first, to_int(orig, af)),
            Method::Random => {
                let net = nets().nth(rng.next_u32() as usize % n)?;
                let r = ((rng.next_u64() as u128) << 64) | rng.next_u64() as u128;
                graft(net, r)
            }
            Method::SourceHash(key) => {
                let h = keyed_hash(src, key);
                let net = nets().nth((h % n as u64) as usize)?;
                let h2 = h.rotate_left(29).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                graft(net, ((h2 as u128) << 64) | h as u128)
            }
            Method::RoundRobin | Method::LeastStates => {
                let a = self.nth(af, *cursor)?;
                *cursor = cursor.wrapping_add(1);
                a
            }
        })
    }

    /// How many addresses of family `af` round-robin counts in the pool.
    pub fn count(&self, af: u8) -> u64 {
        self.nets.iter().filter(|n| n.af == af).map(size).sum()
    }

    /// The `i`th address of family `af` in round-robin order (modulo the pool's count).
    pub fn nth(&self, af: u8, i: u64) -> Option<Addr> {
        let nets = || self.nets.iter().filter(|n| n.af == af);
        let first = nets().next()?;
        let mut i = i % self.count(af).max(1);
        let mut pick = *first;
        let mut off = 0;
        for net in nets() {
            if i < size(net) {
                pick = *net;
                off = i;
                break;
            }
            i -= size(net);
        }
        Some(if pick.len as u32 >= width(af) {
            pick.addr
        } else {
            graft(&pick, (to_int(&pick.addr, af) & host_mask(af, pick.len)).wrapping_add(off as u128))
        })
    }

    /// Whether `a` (family `af`) is one of the pool's addresses.
    pub fn contains(&self, af: u8, a: &Addr) -> bool {
        let v = to_int(a, af);
        self.nets.iter().any(|n| n.af == af && (to_int(&n.addr, af) ^ v) & !host_mask(af, n.len) == 0)
    }

    /// The source ports it hands out (nat-to).
    pub fn range(&self) -> Range {
        Range { lo: self.ports.0, hi: self.ports.1, set: self.portset }
    }

    /// rdr-to: the destination port for a packet to `dport`.
    pub fn rdr_port(&self, dport: u16) -> u16 {
        match self.ports {
            (0, _) => dport,
            (p, q) if q <= p => p,
            (p, q) => {
                let span = (q - p) as u32 + 1;
                (((dport.wrapping_sub(self.dst_base)) as u32 % span) + p as u32) as u16
            }
        }
    }
}

/// Whether packets of `pd` carry a port (or an ICMP query identifier) a translation maps.
pub fn has_port(pd: &PDesc) -> bool {
    pd.flags & xpf_wire::pdesc::pdf::HAS_PORTS != 0
        && matches!(pd.proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6)
}

/// The ports of one address, protocol class and range. Memory goes with use, not with the
/// range: ports never handed out are a counter through a random permutation of the range
/// (an affine map, so no table of them), released ports a FIFO with the time each may go
/// again; which ports are in use is [`Users`], one table for every address. A pool of a /16
/// costs nothing per address it has not used.
#[derive(Debug)]
struct Ports {
    /// Its name in [`Users`].
    id: u32,
    /// The ports are first, first + step, ... (n of them): with several workers each has
    /// those of its own residue (p mod workers = its index), so the replies' destination
    /// port names the worker that holds the state.
    first: u16,
    step: u16,
    n: u32,
    /// The range as the rule gave it.
    range: Range,
    /// The permutation i -> (mul * i + add) mod n, mul coprime to n.
    mul: u32,
    add: u32,
    /// Ports handed out fresh so far (indexes of the permutation).
    fresh: u32,
    /// Released ports, oldest first, with when each may be handed out again.
    free: VecDeque<(u16, u32)>,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Ports {
    /// The ports of `range` in worker `share.0`'s residue class modulo `share.1` (a port
    /// set's own, which runs on one worker), named `id` in [`Users`].
    fn new(id: u32, range: Range, share: (u16, u16), rng: &mut ChaCha20Rng) -> Ports {
        let (lo, hi) = (range.lo, range.hi);
        let (w, k) = (share.0 as u32, share.1.max(1) as u32);
        let (first, k) = if range.set.is_some() { (0, 1) } else { (lo as u32 + (w + k - lo as u32 % k) % k, k) };
        let n = match range.set {
            Some(set) => set.size(),
            None if first > hi as u32 => 0,
            None => (hi as u32 - first) / k + 1,
        };
        let mut mul = if n > 0 { rng.next_u32() % n } else { 0 };
        while n > 0 && gcd(mul, n) != 1 {
            mul = (mul + 1) % n;
        }
        Ports {
            id,
            range,
            first: first.min(u16::MAX as u32) as u16,
            step: k as u16,
            n,
            mul,
            add: if n > 0 { rng.next_u32() % n } else { 0 },
            fresh: 0,
            free: VecDeque::new(),
        }
    }

    fn port(&self, i: u32) -> u16 {
        match self.range.set {
            Some(set) => set.port(i),
            None => (self.first as u32 + i * self.step as u32) as u16,
        }
    }

    fn in_range(&self, port: u16) -> bool {
        if let Some(set) = self.range.set {
            return set.holds(port);
        }
        port >= self.first
            && (port - self.first).is_multiple_of(self.step)
            && (((port - self.first) / self.step) as u32) < self.n
    }
}

/// The allocators of one address and protocol class: one per port range that rules drew
/// from it (nearly always one, kept inline). Each range has its own ports in use, as each
/// has its own order and released ports: a port goes back to the range that gave it.
#[derive(Debug)]
struct Allocs {
    /// Its ranges' ports in use (by one flow or more).
    held: u32,
    /// When the last port it released is out of its hold.
    until: u32,
    /// In [`Nat::idle`] (once at most).
    queued: bool,
    first: Ports,
    more: Vec<Ports>,
}

impl Allocs {
    fn ranges(&self) -> impl Iterator<Item = &Ports> {
        std::iter::once(&self.first).chain(self.more.iter())
    }

    fn range_mut(&mut self, k: usize) -> &mut Ports {
        if k == 0 {
            &mut self.first
        } else {
            &mut self.more[k - 1]
        }
    }

    fn ranges_mut(&mut self) -> impl Iterator<Item = &mut Ports> {
        std::iter::once(&mut self.first).chain(self.more.iter_mut())
    }
}

/// Ports in use, of every address, and the flows using each: one table of one word per
/// port (its range's [`Ports::id`], the port, the count), so that a new flow's claim
/// reads one place, where a map per address cost an allocation per address and a lookup
/// through its allocator to its own map.
#[derive(Default)]
struct Users {
    t: hashbrown::HashTable<u64>,
    h: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Users({} ports)", self.t.len())
    }
}

/// A [`Users`] entry: the key in the top 48 bits, the flows in the low 16.
fn user_key(id: u32, port: u16) -> u64 {
    (id as u64) << 16 | port as u64
}

impl Users {
    fn hash(h: &foldhash::fast::RandomState, key: u64) -> u64 {
        use std::hash::BuildHasher;
        h.hash_one(key)
    }

    /// The table's entry for `key` ([`user_key`]), there or its place.
    #[inline(always)]
    fn entry(&mut self, key: u64) -> hashbrown::hash_table::Entry<'_, u64> {
        let h = &self.h;
        self.t.entry(Self::hash(h, key), |&e| e >> 16 == key, |&e| Self::hash(h, e >> 16))
    }

    /// The entry of `port` of allocator `id`, if a flow uses it.
    fn get_mut(&mut self, id: u32, port: u16) -> Option<&mut u64> {
        let key = user_key(id, port);
        self.t.find_mut(Self::hash(&self.h, key), |&e| e >> 16 == key)
    }

    /// Offers `port` to a new flow: taken (one flow) when no flow here holds it and its key
    /// is free.
    #[inline(always)]
    fn claim(&mut self, id: u32, port: u16, free: &mut impl FnMut(u16) -> bool) -> Claim {
        let key = user_key(id, port);
        match self.entry(key) {
            hashbrown::hash_table::Entry::Occupied(_) => Claim::InUse,
            hashbrown::hash_table::Entry::Vacant(v) if free(port) => {
                v.insert(key << 16 | 1);
                Claim::Taken
            }
            hashbrown::hash_table::Entry::Vacant(_) => Claim::KeyTaken,
        }
    }

    /// One more flow on `port`: Some(true) when it was free, None when it has as many as
    /// a count holds.
    fn add(&mut self, id: u32, port: u16) -> Option<bool> {
        let key = user_key(id, port);
        match self.entry(key) {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                let e = o.get_mut();
                (*e as u16 != u16::MAX).then(|| {
                    *e += 1;
                    false
                })
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(key << 16 | 1);
                Some(true)
            }
        }
    }

    /// One flow fewer on `port`: Some(true) when that was its last (it is free now), None
    /// when no flow held it.
    fn sub(&mut self, id: u32, port: u16) -> Option<bool> {
        let key = user_key(id, port);
        let Ok(mut o) = self.t.find_entry(Self::hash(&self.h, key), |&e| e >> 16 == key) else { return None };
        if *o.get() as u16 > 1 {
            *o.get_mut() -= 1;
            return Some(false);
        }
        o.remove();
        Some(true)
    }
}

/// The translation side of a worker: round-robin positions and the port allocators.
#[derive(Debug, Default)]
pub struct Nat {
    /// This worker's index and the number of workers (ports are shared out by residue).
    share: (u16, u16),
    cursors: Vec<u64>,
    /// By (address, protocol class and family: [`class`]): the allocators of the ranges
    /// drawn from it.
    ports: HashMap<(Addr, u8), Allocs>,
    /// Ports in use, of every allocator.
    users: Users,
    /// The next range's [`Ports::id`], and those of ranges dropped (no port of theirs in
    /// [`Users`]), taken first: ids stay below the ranges in use at once.
    next_id: u32,
    free_ids: Vec<u32>,
    /// Allocators that may have no port in use, by (address, class) and when they may go,
    /// each once at most: once none of their ports is in use or in its hold they are
    /// dropped ([`Nat::reap`]), so a pool of many addresses (an IPv6 prefix under `random`)
    /// costs what its addresses in use cost, not every address it ever gave.
    idle: VecDeque<(Addr, u8, u32)>,
    /// `endpoint-independent` UDP: an inside source (address, family, port) to the address
    /// and port it was given, and back (to forget it when its port's last flow ends). Every
    /// map here is keyed by family too: an IPv4 address and an IPv6 address of twelve
    /// trailing zero bytes are one [`Addr`].
    mappings: HashMap<(Addr, u8, u16), (Addr, u16)>,
    mapped: HashMap<(Addr, u8, u16), (Addr, u16)>,
    /// On once a `sticky-address` or `least-states` pool has translated a flow: translated
    /// states are counted by the address they were given ([`Use`]), and by source.
    track: bool,
    /// Translated states per (address given, family, use).
    loads: HashMap<(Addr, u8, Use), u32>,
    /// `sticky-address`: per (inside source, family, use), the address it keeps, the
    /// translated states it has to that address, and since when (pf's source node of type
    /// nat or rdr: `-s Sources`, `-K`).
    sticky: HashMap<(Addr, u8, Use), (Addr, u32, u32)>,
    /// New flows refused per pool since [`Nat::take_refusals`] (by pool index - 1): no port
    /// left, no address of the flow's family. xpfd logs them, once a minute a pool.
    refused: Vec<(u64, u64)>,
    any_refused: bool,
    /// The pools [`Nat::pool_holding`] found last, per [`Use`]: a peer's translated states
    /// come by the thousand from one or a few pools.
    hint: [usize; 2],
    pub counters: Counters,
}

/// What a translated address is to a state: its new source (`nat-to`) or destination
/// (`rdr-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Use {
    Source,
    Destination,
}

/// Translation counters (`xpfctl -s info`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// States made with a translation.
    pub translated: u64,
    /// Ports given to a flow while another used them (none was free).
    pub shared: u64,
    /// Free ports skipped because their key was in use by a state (static or synced ones).
    pub collisions: u64,
    /// Released ports handed out again before their hold was over (nothing else was left).
    pub early: u64,
    /// New flows refused: no port free or shareable (pf's `translate`).
    pub exhausted: u64,
    /// New flows refused: the pool had no address of their family.
    pub no_address: u64,
    /// New UDP flows given the address and port their source already had (`endpoint-
    /// independent`).
    pub mapped: u64,
}

/// The protocol class a port belongs to (ICMP and ICMPv6 identifiers share one space per
/// address, as TCP and UDP ports have their own), with the family in the top bit: an IPv4
/// address is held in the first four bytes of an [`Addr`], as an IPv6 address with twelve
/// zero bytes after them would be, and the two must not share ports.
fn class(af: u8, proto: u8) -> u8 {
    let c = if proto == IPPROTO_ICMPV6 { IPPROTO_ICMP } else { proto };
    c | if af == AF_INET6 { V6 } else { 0 }
}

/// [`class`]'s family bit.
const V6: u8 = 0x80;

impl Nat {
    /// Worker `index` of `workers`: it hands out only ports p with p mod workers = index.
    pub fn set_share(&mut self, index: u16, workers: u16) {
        self.share = (index, workers.max(1));
        self.ports.clear();
        self.users.t.clear();
        self.idle.clear();
        self.free_ids.clear();
        self.next_id = 0;
    }

    /// This worker's index and the number of workers.
    pub fn share(&self) -> (u16, u16) {
        self.share
    }

    /// The round-robin position of pool `i`.
    pub fn cursor(&mut self, i: usize) -> &mut u64 {
        if self.cursors.len() <= i {
            self.cursors.resize(i + 1, 0);
        }
        &mut self.cursors[i]
    }

    /// The allocators of `addr`'s ports for `proto` (made on first use), the index of the
    /// one of `range` among them (made on first use), the ports in use and the counters.
    #[inline(always)]
    fn ports_of(
        &mut self,
        (addr, af): (Addr, u8),
        proto: u8,
        range: Range,
        rng: &mut ChaCha20Rng,
        now: u32,
    ) -> (&mut Allocs, usize, &mut Users, &mut Counters) {
        let share = (self.share.0, self.share.1.max(1));
        let c = class(af, proto);
        let (free_ids, next_id) = (&mut self.free_ids, &mut self.next_id);
        let mut new_id = || {
            free_ids.pop().unwrap_or_else(|| {
                *next_id += 1;
                *next_id - 1
            })
        };
        let a = match self.ports.entry((addr, c)) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                // Dropped again if it never holds a port (a range with none of this
                // worker's, every key taken).
                self.idle.push_back((addr, c, now));
                let first = Ports::new(new_id(), range, share, rng);
                v.insert(Allocs { held: 0, until: now, queued: true, first, more: Vec::new() })
            }
        };
        let found = a.ranges().position(|p| p.range == range);
        let k = match found {
            Some(k) => k,
            None => {
                a.more.push(Ports::new(new_id(), range, share, rng));
                a.more.len()
            }
        };
        (a, k, &mut self.users, &mut self.counters)
    }

    /// The first of `pools` whose addresses hold `addr` (family `af`) and, with `port`, whose
    /// source port range holds that port (else the first that holds the address), by its
    /// index, and whether the port is in its range. The pool found before is asked first.
    pub fn pool_holding(
        &mut self,
        pools: &[Pool],
        u: Use,
        (addr, af): (Addr, u8),
        port: Option<u16>,
    ) -> Option<(usize, bool)> {
        let ranged =
            |pl: &Pool| port.is_some_and(|p| pl.ports.0 < pl.ports.1 && (pl.ports.0..=pl.ports.1).contains(&p));
        let h = &mut self.hint[u as usize];
        if let Some(pl) = pools.get(*h).filter(|pl| pl.contains(af, &addr)) {
            if port.is_none() || ranged(pl) {
                return Some((*h, ranged(pl)));
            }
        }
        let holding = || pools.iter().enumerate().filter(|(_, pl)| pl.contains(af, &addr));
        let (i, r) = match holding().find(|(_, pl)| ranged(pl)) {
            Some((i, _)) => (i, true),
            None => (holding().next()?.0, false),
        };
        *h = i;
        Some((i, r))
    }

    /// A translated state this box's allocator did not make (a peer's, synced) uses `port` of
    /// `addr` (family `af`) in range `lo..=hi`: counted as a flow of that port, so that it is
    /// not handed out fresh while the state lasts and goes back when the state does
    /// ([`put_port`](Self::put_port)). False when the port is not this worker's share of the
    /// range.
    pub fn adopt_port(
        &mut self,
        (addr, af): (Addr, u8),
        proto: u8,
        range: impl Into<Range>,
        port: u16,
        rng: &mut ChaCha20Rng,
    ) -> bool {
        let range = range.into();
        if port < range.lo || port > range.hi {
            return false;
        }
        let (a, k, users, _) = self.ports_of((addr, af), proto, range, rng, 0);
        let p = a.range_mut(k);
        if !p.in_range(port) {
            return false;
        }
        match users.add(p.id, port) {
            Some(first) => {
                a.held += first as u32;
                true
            }
            None => false,
        }
    }

    /// A source port of `addr` (of family `af`) in `lo..=hi` for a new flow of `proto` at
    /// `now`, for which `free(port)` says its key is unused: a port never used yet, else the
    /// longest released one once its hold is over, else (none left) one in use shared with a
    /// flow elsewhere, else a released one still in its hold. At most [`TRIES`] keys are tried
    /// each way.
    pub fn take_port(
        &mut self,
        (addr, af): (Addr, u8),
        proto: u8,
        range: impl Into<Range>,
        now: u32,
        rng: &mut ChaCha20Rng,
        mut free: impl FnMut(u16) -> bool,
    ) -> Option<u16> {
        let (a, k, users, counters) = self.ports_of((addr, af), proto, range.into(), rng, now);
        let id = a.range_mut(k).id;
        let taken = |a: &mut Allocs, port: u16| {
            a.held += 1;
            Some(port)
        };
        let p = a.range_mut(k);
        let mut tries = 0;
        while p.fresh < p.n && tries < TRIES {
            let i = ((p.mul as u64 * p.fresh as u64 + p.add as u64) % p.n as u64) as u32;
            p.fresh += 1;
            let port = p.port(i);
            match users.claim(id, port, &mut free) {
                Claim::Taken => return taken(a, port),
                // Released when the state that holds it, or its key, goes, as any other.
                Claim::InUse => {}
                Claim::KeyTaken => counters.collisions += 1,
            }
            tries += 1;
        }
        for _ in 0..TRIES {
            let p = a.range_mut(k);
            match p.free.front() {
                Some(&(port, ready)) if ready <= now => {
                    p.free.pop_front();
                    match users.claim(id, port, &mut free) {
                        Claim::Taken => return taken(a, port),
                        // Taken again meanwhile by a peer's flow: queued again when that ends.
                        Claim::InUse => {}
                        Claim::KeyTaken => {
                            counters.collisions += 1;
                            p.free.push_back((port, now));
                        }
                    }
                }
                _ => break,
            }
        }
        // None free: share one in use with a flow elsewhere.
        let p = a.range_mut(k);
        for _ in 0..TRIES.min(p.n) {
            let port = p.port(rng.next_u32() % p.n);
            if let Some(e) = users.get_mut(id, port) {
                if *e as u16 != u16::MAX && free(port) {
                    *e += 1;
                    counters.shared += 1;
                    return Some(port);
                }
            }
        }
        // Nothing else: a released port before its hold is over (the hold is a preference: a
        // range whose flows all ended at once, `-F states`, must not refuse every new flow
        // for two minutes).
        for _ in 0..TRIES {
            let p = a.range_mut(k);
            let Some((port, _)) = p.free.pop_front() else { break };
            match users.claim(id, port, &mut free) {
                Claim::Taken => {
                    counters.early += 1;
                    return taken(a, port);
                }
                Claim::InUse => {}
                Claim::KeyTaken => {
                    counters.collisions += 1;
                    p.free.push_back((port, now));
                }
            }
        }
        counters.exhausted += 1;
        None
    }

    /// Every translated state ended at `now` (`-F states`): every port in use goes back,
    /// held as [`put_port`](Self::put_port) holds it, and what was kept per flow (mappings,
    /// counts by address, sticky addresses) is forgotten.
    pub fn release_all(&mut self, now: u32) {
        let ready = now.saturating_add(HOLD);
        let mut by_id: HashMap<u32, Vec<u16>> = HashMap::default();
        for e in self.users.t.drain() {
            by_id.entry((e >> 32) as u32).or_default().push((e >> 16) as u16);
        }
        for (&(addr, c), a) in self.ports.iter_mut() {
            a.held = 0;
            a.until = a.until.max(ready);
            if !a.queued {
                a.queued = true;
                self.idle.push_back((addr, c, ready));
            }
            for p in a.ranges_mut() {
                p.free.extend(by_id.remove(&p.id).into_iter().flatten().map(|port| (port, ready)));
            }
        }
        self.mappings.clear();
        self.mapped.clear();
        self.loads.clear();
        self.sticky.clear();
    }

    /// Gives back port `port` of `addr` (family `af`; a translated state ended at `now`).
    pub fn put_port(&mut self, addr: Addr, af: u8, proto: u8, port: u16, now: u32) {
        let Some(a) = self.ports.get_mut(&(addr, class(af, proto))) else { return };
        let users = &mut self.users;
        // The range whose flows hold it (ranges of one address may overlap).
        let Some((p, last)) = a.ranges_mut().filter(|p| p.in_range(port)).find_map(|p| {
            let last = users.sub(p.id, port)?;
            Some((p, last))
        }) else {
            return;
        };
        if !last {
            return;
        }
        let ready = now.saturating_add(HOLD);
        p.free.push_back((port, ready));
        a.held -= 1;
        a.until = a.until.max(ready);
        if a.held == 0 && !a.queued {
            a.queued = true;
            self.idle.push_back((addr, class(af, proto), ready));
        }
        if proto == IPPROTO_UDP && !self.mapped.is_empty() {
            if let Some((a, p)) = self.mapped.remove(&(addr, af, port)) {
                self.mappings.remove(&(a, af, p));
            }
        }
    }

    /// Drops, of the allocators that became idle by `now` (at most `budget` looked at), those
    /// with no port in use or in its hold: a later flow to their address starts a new one
    /// (a new random order of the range; every port it had was released over [`HOLD`]
    /// seconds ago). Returns how many went.
    pub fn reap(&mut self, now: u32, budget: u32) -> u32 {
        let mut gone = 0;
        for _ in 0..budget {
            match self.idle.front() {
                Some(&(addr, c, ready)) if ready <= now => {
                    self.idle.pop_front();
                    let Entry::Occupied(mut o) = self.ports.entry((addr, c)) else { continue };
                    let a = o.get_mut();
                    a.queued = false;
                    if a.held > 0 {
                        // Queued again when its last port in use goes.
                        continue;
                    }
                    if a.until > now {
                        // A port it released since it was queued is in its hold.
                        a.queued = true;
                        self.idle.push_back((addr, c, a.until));
                        continue;
                    }
                    // No port of its ranges in use: their ids may name other ranges.
                    self.free_ids.extend(o.remove().ranges().map(|p| p.id));
                    gone += 1;
                }
                _ => break,
            }
        }
        gone
    }

    /// The address and port inside source `(src, sport)` (family `af`) was given by an
    /// `endpoint-independent` pool, while it has a flow.
    pub fn mapping(&self, src: Addr, af: u8, sport: u16) -> Option<(Addr, u16)> {
        if self.mappings.is_empty() {
            return None;
        }
        self.mappings.get(&(src, af, sport)).copied()
    }

    /// Another UDP flow of `src:sport` on the port it was mapped to (`to`, of range `range`):
    /// false when the port is no longer in use (the mapping then goes).
    pub fn reuse_mapping(&mut self, (src, sport): (Addr, u16), af: u8, to: (Addr, u16), range: Range) -> bool {
        let id = self.ports.get(&(to.0, class(af, IPPROTO_UDP))).and_then(|a| a.ranges().find(|p| p.range == range));
        match id.and_then(|p| self.users.get_mut(p.id, to.1)) {
            Some(e) if *e as u16 != u16::MAX => {
                *e += 1;
                self.counters.mapped += 1;
                true
            }
            _ => {
                self.mappings.remove(&(src, af, sport));
                self.mapped.remove(&(to.0, af, to.1));
                false
            }
        }
    }

    /// Whether translated states are being counted (a `sticky-address` or `least-states` pool
    /// has been used).
    #[inline]
    pub fn tracking(&self) -> bool {
        self.track
    }

    /// Translated states given address `a` (family `af`) for `u`.
    pub fn load(&self, a: Addr, af: u8, u: Use) -> u32 {
        self.loads.get(&(a, af, u)).copied().unwrap_or(0)
    }

    /// The address `sticky-address` keeps for source `inside` (family `af`, for `u`).
    pub fn stuck(&self, inside: Addr, af: u8, u: Use) -> Option<Addr> {
        self.sticky.get(&(inside, af, u)).map(|e| e.0)
    }

    /// A translated state of family `af` was made at `now`: `inside` was given `to` for `u`
    /// (`sticky`: by a `sticky-address` pool, which makes the source keep it).
    pub fn note(&mut self, u: Use, af: u8, inside: Addr, to: Addr, sticky: bool, now: u32) {
        self.track = true;
        *self.loads.entry((to, af, u)).or_default() += 1;
        let e = if sticky {
            Some(self.sticky.entry((inside, af, u)).or_insert((to, 0, now)))
        } else {
            self.sticky.get_mut(&(inside, af, u))
        };
        if let Some(e) = e.filter(|e| e.0 == to) {
            e.1 += 1;
        }
    }

    /// A translated state ended ([`Nat::note`]'s reverse; states made before counting began,
    /// or synced ones, were not counted and are let go).
    pub fn forget(&mut self, u: Use, af: u8, inside: Addr, to: Addr) {
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.loads.entry((to, af, u)) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.sticky.entry((inside, af, u)) {
            if e.get().0 == to {
                e.get_mut().1 = e.get().1.saturating_sub(1);
                if e.get().1 == 0 {
                    e.remove();
                }
            }
        }
    }

    /// A new flow was refused by pool `pool` (1-based): no port left (`no_port`), or no
    /// address of its family.
    #[cold]
    pub fn refuse(&mut self, pool: u32, no_port: bool) {
        let Some(i) = (pool as usize).checked_sub(1) else { return };
        if self.refused.len() <= i {
            self.refused.resize(i + 1, (0, 0));
        }
        let c = &mut self.refused[i];
        if no_port {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
        self.any_refused = true;
    }

    /// Whether a pool refused a flow since the last [`take_refusals`](Self::take_refusals).
    #[inline]
    pub fn has_refusals(&self) -> bool {
        self.any_refused
    }

    /// The flows each pool refused since the last call: (pool, no port left, no address).
    pub fn take_refusals(&mut self) -> Vec<(u32, u64, u64)> {
        self.any_refused = false;
        let v = self
            .refused
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != (0, 0))
            .map(|(i, c)| (i as u32 + 1, c.0, c.1))
            .collect();
        self.refused.iter_mut().for_each(|c| *c = (0, 0));
        v
    }

    /// The sources `sticky-address` keeps an address for: (source, family, use, address,
    /// translated states, since when).
    pub fn sticky_rows(&self) -> impl Iterator<Item = (Addr, u8, Use, Addr, u32, u32)> + '_ {
        self.sticky.iter().map(|(&(inside, af, u), &(to, n, since))| (inside, af, u, to, n, since))
    }

    /// Forgets the addresses `sticky-address` keeps for the sources `kill(source, family,
    /// address)` names (pf's `-K`): their states stay, their next flows pick anew. Returns
    /// how many went.
    pub fn unstick(&mut self, kill: impl Fn(&Addr, u8, &Addr) -> bool) -> u32 {
        let before = self.sticky.len();
        self.sticky.retain(|(inside, af, _), (to, _, _)| !kill(inside, *af, to));
        (before - self.sticky.len()) as u32
    }

    /// Sources with a `sticky-address` address (`xpfctl -s info`).
    pub fn sticky_sources(&self) -> u64 {
        self.sticky.len() as u64
    }

    /// Remembers that UDP source `src:sport` was given `to` (`endpoint-independent`). A port
    /// maps one source: one shared with another source's flow (none was free) is not
    /// remembered, so that every mapping goes when its port's last flow does.
    pub fn map(&mut self, af: u8, inside: (Addr, u16), to: (Addr, u16)) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.mapped.entry((to.0, af, to.1)) {
            e.insert(inside);
            if let Some(old) = self.mappings.insert((inside.0, af, inside.1), to) {
                self.mapped.remove(&(old.0, af, old.1));
            }
        }
    }

    /// Per (address, its family, protocol class: 1 for ICMP's identifiers, 6, 17...): ports
    /// in use, and ports in its ranges (this worker's share).
    pub fn ports_by_address(&self) -> impl Iterator<Item = (Addr, u8, u8, u64, u64)> + '_ {
        self.ports.iter().map(|(&(a, c), al)| {
            let af = if c & V6 != 0 { AF_INET6 } else { AF_INET };
            (a, af, c & !V6, al.held as u64, al.ranges().map(|p| p.n as u64).sum())
        })
    }

    /// Ports in use, and ports in all allocators (`xpfctl -s info`).
    pub fn ports_used(&self) -> (u64, u64) {
        let all = self.ports.values();
        (all.clone().map(|a| a.held as u64).sum(), all.flat_map(|a| a.ranges()).map(|p| p.n as u64).sum())
    }
}

/// A packet's own addresses and ports, as a rewrite would leave them.
#[inline]
pub fn of_packet(pd: &PDesc) -> Rewrite {
    Rewrite { addr: [pd.src, pd.dst], port: [pd.sport, pd.dport], ..Rewrite::default() }
}

/// Where a packet's own addresses and ports are in key `k` oriented for direction `dir`:
/// (source, destination) as the packet carries them.
pub fn oriented<K: xpf_state::Key>(k: &K, dir: xpf_state::Dir) -> Rewrite {
    let (s, d) = if dir == xpf_state::Dir::In { (0, 1) } else { (1, 0) };
    Rewrite { addr: [k.addr(s), k.addr(d)], port: [k.port(s), k.port(d)], ..Rewrite::default() }
}

/// What became of a port offered to a new flow.
enum Claim {
    /// Now the flow's.
    Taken,
    /// A flow here holds it (a peer's synced state among them).
    InUse,
    /// No flow here holds it, but its key is a state's that does not (one that kept its port).
    KeyTaken,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    fn rng() -> ChaCha20Rng {
        ChaCha20Rng::from_seed([7; 32])
    }

    #[test]
    fn ports_are_unique_while_free_then_shared_then_refused() {
        let mut nat = Nat::default();
        let mut r = rng();
        let a = Addr::v4([192, 0, 2, 1]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let p = nat.take_port((a, AF_INET), IPPROTO_TCP, (1000, 1099), 5, &mut r, |_| true).unwrap();
            assert!((1000..=1099).contains(&p));
            assert!(seen.insert(p), "port {p} handed out twice while others were free");
        }
        assert_eq!(nat.ports_used(), (100, 100));
        // All in use: shared, as long as the keys differ.
        assert!(nat.take_port((a, AF_INET), IPPROTO_TCP, (1000, 1099), 5, &mut r, |_| true).is_some());
        assert_eq!(nat.counters.shared, 1);
        // Nothing shareable: refused after a bounded number of tries.
        let mut tries = 0;
        assert!(nat
            .take_port((a, AF_INET), IPPROTO_TCP, (1000, 1099), 5, &mut r, |_| {
                tries += 1;
                false
            })
            .is_none());
        assert!(tries <= TRIES);
        assert_eq!(nat.counters.exhausted, 1);
    }

    #[test]
    fn every_range_is_a_permutation() {
        for seed in 0..8u8 {
            let mut r = ChaCha20Rng::from_seed([seed; 32]);
            for n in 1..=40u16 {
                let mut nat = Nat::default();
                let a = Addr::v4([192, 0, 2, seed]);
                let mut got: Vec<u16> = (0..n)
                    .map(|_| nat.take_port((a, AF_INET), IPPROTO_UDP, (100, 99 + n), 1, &mut r, |_| true).unwrap())
                    .collect();
                got.sort_unstable();
                assert_eq!(got, (100..100 + n).collect::<Vec<_>>(), "range of {n}");
            }
        }
    }

    #[test]
    fn workers_share_the_ports_by_residue() {
        let mut r = rng();
        let a = Addr::v4([192, 0, 2, 1]);
        for w in 0..3u16 {
            let mut nat = Nat::default();
            nat.set_share(w, 3);
            let mut got = Vec::new();
            while let Some(p) = nat.take_port((a, AF_INET), IPPROTO_TCP, (1000, 1099), 1, &mut r, |p| !got.contains(&p))
            {
                got.push(p);
            }
            assert!(got.iter().all(|p| p % 3 == w), "worker {w}: {got:?}");
            let want = (1000..=1099u16).filter(|p| p % 3 == w).count();
            assert_eq!(got.len(), want);
            nat.put_port(a, AF_INET, IPPROTO_TCP, got[0], 1);
            assert_eq!(nat.ports_used().0 as usize, want - 1);
        }
    }

    #[test]
    fn an_ipv4_and_an_ipv6_address_of_the_same_bytes_have_their_own_ports() {
        // 192.0.2.1 is held as c000:201:: is: the family keeps their ports apart.
        let mut r = rng();
        let (a4, mut a6) = (Addr::v4([192, 0, 2, 1]), Addr::default());
        a6.0[..4].copy_from_slice(&[192, 0, 2, 1]);
        assert_eq!(a4, a6);
        let mut nat = Nat::default();
        let p4 = nat.take_port((a4, AF_INET), IPPROTO_UDP, (7, 7), 1, &mut r, |_| true);
        let p6 = nat.take_port((a6, AF_INET6), IPPROTO_UDP, (7, 7), 1, &mut r, |_| true);
        assert_eq!((p4, p6, nat.counters.shared), (Some(7), Some(7), 0), "each its own fresh port");
        assert_eq!(nat.ports_by_address().count(), 2);
        nat.put_port(a6, AF_INET6, IPPROTO_UDP, 7, 2);
        let used: Vec<(u8, u64)> = nat.ports_by_address().map(|(_, af, _, used, _)| (af, used)).collect();
        assert!(used.contains(&(AF_INET, 1)) && used.contains(&(AF_INET6, 0)), "{used:?}");
    }

    #[test]
    fn counts_sticky_addresses_and_mappings_keep_the_families_apart() {
        // An IPv4 inside source and an IPv6 one of the same bytes, given the same-byte address
        // of their own family: neither sees the other's count, sticky address or mapping.
        let (a4, mut a6) = (Addr::v4([10, 0, 0, 2]), Addr::default());
        a6.0[..4].copy_from_slice(&[10, 0, 0, 2]);
        let (t4, mut t6) = (Addr::v4([192, 0, 2, 1]), Addr::default());
        t6.0[..4].copy_from_slice(&[192, 0, 2, 1]);
        let mut nat = Nat::default();
        nat.note(Use::Source, AF_INET, a4, t4, true, 1);
        assert_eq!((nat.load(t4, AF_INET, Use::Source), nat.load(t6, AF_INET6, Use::Source)), (1, 0));
        assert_eq!((nat.stuck(a4, AF_INET, Use::Source), nat.stuck(a6, AF_INET6, Use::Source)), (Some(t4), None));
        // A sticky source as `-s Sources` lists it, and `-K` of another address leaves it.
        assert_eq!(nat.sticky_rows().collect::<Vec<_>>(), [(a4, AF_INET, Use::Source, t4, 1, 1)]);
        assert_eq!(nat.unstick(|_, af, to| af == AF_INET6 && *to == t6), 0, "t6 is t4's bytes, of the other family");
        assert_eq!(nat.sticky_sources(), 1);
        nat.forget(Use::Source, AF_INET6, a6, t6);
        assert_eq!(nat.load(t4, AF_INET, Use::Source), 1, "the IPv6 state's end leaves the IPv4 count");
        nat.forget(Use::Source, AF_INET, a4, t4);
        assert_eq!((nat.load(t4, AF_INET, Use::Source), nat.sticky_sources()), (0, 0));
        nat.map(AF_INET, (a4, 4000), (t4, 50001));
        assert_eq!((nat.mapping(a4, AF_INET, 4000), nat.mapping(a6, AF_INET6, 4000)), (Some((t4, 50001)), None));
    }

    #[test]
    fn released_port_waits_its_hold() {
        let mut nat = Nat::default();
        let mut r = rng();
        let a = Addr::v4([192, 0, 2, 1]);
        let p = nat.take_port((a, AF_INET), IPPROTO_UDP, (7, 8), 10, &mut r, |_| true).unwrap();
        nat.put_port(a, AF_INET, IPPROTO_UDP, p, 10);
        assert_eq!(nat.ports_used(), (0, 2));
        // The other port, never used, goes first; then the held one, counted as early.
        let q = nat.take_port((a, AF_INET), IPPROTO_UDP, (7, 8), 11, &mut r, |_| true).unwrap();
        assert_ne!(p, q);
        assert_eq!(nat.counters.early, 0);
        assert_eq!(nat.take_port((a, AF_INET), IPPROTO_UDP, (7, 8), 12, &mut r, |k| k == p), Some(p));
        assert_eq!(nat.counters.early, 1);
        // Once its hold is over a released port goes without being early.
        nat.put_port(a, AF_INET, IPPROTO_UDP, p, 20);
        assert_eq!(nat.take_port((a, AF_INET), IPPROTO_UDP, (7, 8), 20 + HOLD, &mut r, |k| k == p), Some(p));
        assert_eq!(nat.counters.early, 1);
    }

    #[test]
    fn an_allocator_with_no_port_in_use_or_held_goes() {
        // A pool of many addresses, one flow each (an IPv6 prefix under `random`): the
        // allocators go once their flows have ended and their ports' holds are over.
        let mut nat = Nat::default();
        let mut r = rng();
        let addrs: Vec<Addr> = (0..1000u32).map(|i| Addr::v4((0xc633_0000 + i).to_be_bytes())).collect();
        let ports: Vec<u16> = addrs
            .iter()
            .map(|&a| nat.take_port((a, AF_INET), IPPROTO_UDP, (50001, 65535), 5, &mut r, |_| true).unwrap())
            .collect();
        assert_eq!(nat.reap(5, 10_000), 0, "every one holds a port");
        assert_eq!(nat.ports_by_address().count(), 1000);
        for (&a, &p) in addrs.iter().zip(&ports).skip(1) {
            nat.put_port(a, AF_INET, IPPROTO_UDP, p, 10);
        }
        assert_eq!(nat.reap(10 + HOLD - 1, 10_000), 0, "their ports are in their hold");
        assert_eq!(nat.reap(10 + HOLD, 100), 100, "a bounded number a call");
        assert_eq!(nat.reap(10 + HOLD, 10_000), 899);
        assert_eq!(nat.ports_used(), (1, 15535), "the one with a flow stays");
        // A flow to a reaped address starts a new allocator; a port taken in the hold keeps
        // its allocator until it is released and held in turn.
        assert!(nat.take_port((addrs[7], AF_INET), IPPROTO_UDP, (50001, 65535), 200, &mut r, |_| true).is_some());
        let q = nat.take_port((addrs[0], AF_INET), IPPROTO_UDP, (50001, 65535), 200, &mut r, |_| true).unwrap();
        nat.put_port(addrs[0], AF_INET, IPPROTO_UDP, ports[0], 200);
        assert_eq!(nat.reap(200 + HOLD, 10_000), 0, "addrs[0] has q in use");
        nat.put_port(addrs[0], AF_INET, IPPROTO_UDP, q, 300);
        assert_eq!(nat.reap(300 + HOLD - 1, 10_000), 0);
        assert_eq!(nat.reap(300 + HOLD, 10_000), 1);
        assert_eq!(nat.ports_by_address().count(), 1);
        // `-F states`: all of them go back, and go after the hold.
        nat.release_all(1000);
        assert_eq!(nat.ports_used().0, 0);
        assert_eq!((nat.reap(1000 + HOLD - 1, 10_000), nat.reap(1000 + HOLD, 10_000)), (0, 1));
        assert_eq!((nat.ports_by_address().count(), nat.idle.len()), (0, 0));
        // One that never held a port (no port of this worker's share in the range) goes at
        // the next reap.
        nat.set_share(1, 2);
        assert!(nat.take_port((addrs[1], AF_INET), IPPROTO_UDP, (1000, 1000), 2000, &mut r, |_| true).is_none());
        assert_eq!((nat.ports_by_address().count(), nat.reap(2000, 10)), (1, 1));
        // The ranges' ids in the table of ports in use are those of dropped ranges again.
        for round in 0..3u32 {
            for &a in &addrs {
                let p = nat.take_port((a, AF_INET), IPPROTO_UDP, (50001, 65535), 3000 + round * 1000, &mut r, |_| true);
                nat.put_port(a, AF_INET, IPPROTO_UDP, p.unwrap(), 3000 + round * 1000);
            }
            nat.reap(3000 + round * 1000 + HOLD, 10_000);
            assert_eq!((nat.ports_by_address().count(), nat.next_id), (0, 1000), "round {round}");
        }
        // An address whose one flow comes and goes is queued once, not once a flow.
        for t in 0..100 {
            let p = nat.take_port((addrs[0], AF_INET), IPPROTO_UDP, (50001, 65535), 9000 + t, &mut r, |_| true);
            nat.put_port(addrs[0], AF_INET, IPPROTO_UDP, p.unwrap(), 9000 + t);
        }
        assert_eq!(nat.idle.len(), 1);
        assert_eq!((nat.reap(9000 + HOLD, 10), nat.idle.len()), (0, 1), "its last port is in its hold: queued again");
        assert_eq!((nat.reap(9099 + HOLD, 10), nat.idle.len()), (1, 0));
    }

    #[test]
    fn a_port_goes_back_to_the_range_that_gave_it() {
        // Two rules draw overlapping ranges from one address: a small one runs out, and
        // what `-F states` or a flow's end gives back returns to it, not to the wide range
        // that also holds those ports.
        let mut nat = Nat::default();
        let mut r = rng();
        let a = Addr::v4([192, 0, 2, 1]);
        let (wide, small) = ((50001, 65535), (50001, 50003));
        let w = nat.take_port((a, AF_INET), IPPROTO_UDP, wide, 1, &mut r, |_| true).unwrap();
        let got: Vec<u16> =
            (0..3).map(|_| nat.take_port((a, AF_INET), IPPROTO_UDP, small, 1, &mut r, |_| true).unwrap()).collect();
        assert!(got.iter().all(|p| (50001..=50003).contains(p)));
        assert!(nat.take_port((a, AF_INET), IPPROTO_UDP, small, 1, &mut r, |_| false).is_none());
        assert_eq!(nat.ports_used().0, 4);
        nat.release_all(2);
        let p = nat.take_port((a, AF_INET), IPPROTO_UDP, small, 3, &mut r, |_| true);
        assert!(p.is_some_and(|p| got.contains(&p)), "{p:?}: released into the small range, taken before its hold");
        assert_eq!(nat.counters.early, 1);
        nat.put_port(a, AF_INET, IPPROTO_UDP, p.unwrap(), 4);
        let q = nat.take_port((a, AF_INET), IPPROTO_UDP, small, 5, &mut r, |_| true);
        assert!(q.is_some_and(|q| got.contains(&q)));
        // The wide range's port, released, is the wide range's again.
        let x = nat.take_port((a, AF_INET), IPPROTO_UDP, wide, 5, &mut r, |_| true).unwrap();
        nat.put_port(a, AF_INET, IPPROTO_UDP, x, 5);
        let _ = w;
        assert_eq!(nat.ports_used().0, 1);
    }

    #[test]
    fn a_map_e_port_set_is_its_ports_in_a_random_order() {
        // RFC 7597 5.1: offset 6, psid length 8, psid 0x34: A = 1..63 in the 6 high bits,
        // 0x34 in the next 8, the 2 low bits free: 252 ports, the first 1232.
        let set = PortSet { offset: 6, len: 8, psid: 0x34 };
        assert_eq!((set.size(), set.port(0), set.span()), (252, 1232, (1232, 64723)));
        let all: Vec<u16> = (0..set.size()).map(|i| set.port(i)).collect();
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(all, (0..=u16::MAX).filter(|&p| set.holds(p)).collect::<Vec<_>>());
        let mut nat = Nat::default();
        let mut r = rng();
        let a = Addr::v4([192, 0, 2, 1]);
        let range = Range { lo: 1232, hi: 64723, set: Some(set) };
        let mut got: Vec<u16> =
            (0..252).map(|_| nat.take_port((a, AF_INET), IPPROTO_UDP, range, 1, &mut r, |_| true).unwrap()).collect();
        assert_ne!(got[..8], all[..8], "not in order");
        got.sort_unstable();
        assert_eq!(got, all);
        assert!(nat.take_port((a, AF_INET), IPPROTO_UDP, range, 1, &mut r, |_| false).is_none());
        // A synced state's port is adopted only if the set holds it.
        assert!(!nat.adopt_port((Addr::v4([192, 0, 2, 2]), AF_INET), IPPROTO_UDP, range, 1236, &mut r));
        assert!(nat.adopt_port((Addr::v4([192, 0, 2, 2]), AF_INET), IPPROTO_UDP, range, 1235, &mut r));
    }

    #[test]
    fn pools_pick_as_pf() {
        let mut r = rng();
        let mut c = 0u64;
        let net = |a: [u8; 4], len| Net { addr: Addr::v4(a), af: AF_INET, len };
        let src = Addr::v4([10, 0, 0, 77]);
        let pool = |nets: Vec<Net>, method| Pool {
            nets,
            method,
            ports: (0, 0),
            static_port: false,
            dst_base: 0,
            endpoint_independent: false,
            sticky: false,
            portset: None,
        };
        let p = pool(vec![net([192, 0, 2, 0], 24)], Method::Bitmask);
        assert_eq!(p.pick(AF_INET, &src, &src, &mut r, &mut c), Some(Addr::v4([192, 0, 2, 77])));
        let p = pool(vec![net([192, 0, 2, 1], 32), net([192, 0, 2, 9], 32)], Method::RoundRobin);
        let got: Vec<_> = (0..4).map(|_| p.pick(AF_INET, &src, &src, &mut r, &mut c).unwrap()).collect();
        assert_eq!(got, [[192, 0, 2, 1], [192, 0, 2, 9], [192, 0, 2, 1], [192, 0, 2, 9]].map(Addr::v4));
        let p = pool(vec![net([192, 0, 2, 0], 28)], Method::SourceHash([3; 16]));
        let a = p.pick(AF_INET, &src, &src, &mut r, &mut c).unwrap();
        assert_eq!(p.pick(AF_INET, &src, &src, &mut r, &mut c), Some(a));
        assert_eq!(a.v4_bytes()[..3], [192, 0, 2]);
        assert!(p.pick(xpf_wire::pdesc::AF_INET6, &src, &src, &mut r, &mut c).is_none());
        let p = Pool { ports: (8000, 8009), dst_base: 80, ..pool(vec![], Method::None) };
        assert_eq!((p.rdr_port(80), p.rdr_port(85), p.rdr_port(90)), (8000, 8005, 8000));
    }
}
