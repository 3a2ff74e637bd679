//! The state table of one worker: entries in a slab, two keys per state (wire and stack), the
//! index, the expiry wheel, the event queue and pfctl's counters.
//!
//! Entries are never moved. A state's id is its slot in the slab; index refs are ids with bit
//! 31 set when the ref was made for the stack-side key. Removed states stay `DEAD` (unlinked,
//! invisible) until the wheel frees their slot, so a queued delete event can still read them.

use crate::event::{offer, sync_epoch, Event, EventKind, EventQueue};
use crate::index::{Index, Probe};
use crate::key::{Dir, Key, Seed};
use crate::region::{MapError, Region, Side, Zeroable};
use crate::timeout::{Timeout, Timeouts};
use crate::track::{RuleLimits, Tracking};
use crate::wheel::Wheel;

/// No state.
pub const NONE: u32 = u32::MAX;
const CHAIN: u32 = u32::MAX - 1;
/// Ref bit: the ref was found through the state's stack-side key.
pub const STACK: u32 = 1 << 31;
pub const ID_MASK: u32 = STACK - 1;
/// The most states one table can ever hold; its address space is reserved up front.
pub const MAX_STATES: u32 = 1 << 30;
/// States per index row chosen automatically: rows grow linearly with the limit. At 6 per
/// ten-slot row, 4% of rows overflow when the table is full (Poisson), and the index costs
/// 10.7 bytes per state. `xpf-bench hashsize` measured the alternatives (docs/state-table.md).
pub const ROW_LOAD: u32 = 6;

/// Entry flags.
pub mod sf {
    /// In the index.
    pub const LIVE: u8 = 1 << 0;
    /// Removed from the index, slot not yet freed.
    pub const DEAD: u8 = 1 << 1;
    /// Created by an outbound packet.
    pub const OUT: u8 = 1 << 2;
    /// An insert, update or delete event is queued.
    pub const EVQ_INS: u8 = 1 << 3;
    pub const EVQ_UPD: u8 = 1 << 4;
    pub const EVQ_DEL: u8 = 1 << 5;
    /// Has a stack-side key different from the wire key (NAT).
    pub const NAT: u8 = 1 << 6;
    /// `no-sync`: never offered to sync.
    pub const NOSYNC: u8 = 1 << 7;
}

/// What a translated state holds of this box's translation (the engine's port allocator and
/// its counts by address), given back through [`StateTable::nat_gone`] when the state goes.
/// A state synced from a peer is inserted holding none of it (the peer's translation made it);
/// the engine takes it in afterwards ([`StateTable::set_held`]).
pub mod held {
    /// Counted by the translation that made it here (pools' loads, `sticky-address`).
    pub const COUNTED: u8 = 1;
    /// Its translated source port came from the allocator.
    pub const PORT: u8 = 2;
}

/// A translated state that went while holding some of this box's translation ([`held`]):
/// its keys, flags and what it held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatGone<K> {
    pub wire: K,
    pub stack: K,
    pub flags: u8,
    pub held: u8,
}

/// One state. 64 bytes for IPv4 (one cache line), 88 for IPv6. TCP sequence tracking lives in
/// a side record so that UDP states pay nothing for it.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct State<K: Key> {
    /// The wire-side key (the packet as it is on this interface).
    pub key: K,
    /// Last activity, engine seconds (pf's `expire`).
    pub expire: u32,
    /// Side record index (TCP peers and/or what translation moved there), or NONE.
    pub ext: u32,
    /// The state's [`Meta`]; for a translated IPv4 state, its stack key's addresses and ports
    /// instead ([`Key::lend`]). Read it with [`StateTable::meta`].
    pub(crate) line: Meta,
    /// `Timeout` class in the low 5 bits; rule options in the top bits (`TO_*`). Use
    /// [`State::class`] and [`State::set_class`].
    pub timeout: u8,
    /// pf's peer states [src, dst] (TCPS_* for TCP, PFUDPS_* / PFOTHERS_* otherwise).
    pub peer_state: [u8; 2],
    pub flags: u8,
    /// [from the creator, towards the creator], as pfctl -ss -v shows them.
    pub packets: [u32; 2],
    pub bytes: [u64; 2],
}
// SAFETY: plain integers and keys of integers; all-zero is a free slot.
unsafe impl<K: Key> Zeroable for State<K> {}

/// Bits of `State::timeout` above the class: options of the rule that made the state.
pub const TO_CLASS: u8 = 0x0f;
/// `pflow`: the state's flow is exported ([`crate::flow`]).
pub const TO_PFLOW: u8 = 0x10;
/// `allow-opts`: packets with IP options may pass by this state.
pub const TO_ALLOWOPTS: u8 = 0x80;
/// The state has an entry in the table's [`Tracking`] (a rule with limits made it).
pub const TO_EXTRA: u8 = 0x40;
/// `sloppy`: TCP tracked by flags alone, without sequence windows (no peer record).
pub const TO_SLOPPY: u8 = 0x20;
// A state's class is one of the protocol timeouts (tcp.first .. other.multiple); the others
// (frag, interval, adaptive.*, src.track) are never a state's.
const _: () = assert!(Timeout::OtherMultiple as usize <= TO_CLASS as usize);

impl<K: Key> State<K> {
    #[inline(always)]
    pub fn class(&self) -> Timeout {
        Timeout::from_u8(self.timeout & TO_CLASS)
    }
    #[inline(always)]
    pub fn set_class(&mut self, t: Timeout) {
        debug_assert!(t as u8 <= TO_CLASS, "{t:?} is not a state's timeout");
        self.timeout = (self.timeout & !TO_CLASS) | (t as u8 & TO_CLASS);
    }
    #[inline(always)]
    pub fn allow_opts(&self) -> bool {
        self.timeout & TO_ALLOWOPTS != 0
    }
}
/// What a state keeps that no packet reads: pf's creation time, the rule that made it, and
/// its insert sequence (with the id, a unique export id for sync).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Meta {
    pub creation: u32,
    /// Number of the rule that created the state.
    pub rule: u32,
    pub seq: u32,
}
// SAFETY: integers.
unsafe impl Zeroable for Meta {}

const _: () = assert!(core::mem::size_of::<State<crate::Key4>>() == 64);
const _: () = assert!(core::mem::size_of::<State<crate::Key6>>() == 88);

/// pf's per-peer TCP tracking data (`pf_state_peer`); the tracking itself is in the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Peer {
    // 0..18, padded to 20: 40 bytes for both peers of a TCP state.
    pub seqlo: u32,
    pub seqhi: u32,
    pub seqdiff: u32,
    pub max_win: u16,
    pub mss: u16,
    pub wscale: u8,
    pub pflags: u8,
    /// Sync (peer 0 only): what the engine counted since the state's last update went out
    /// (pf's `sync_updates`, with the payload counted too; the engine's `sync_count`).
    pub sync_upd: u8,
}
// SAFETY: integers only.
unsafe impl Zeroable for Peer {}
const _: () = assert!(core::mem::size_of::<[Peer; 2]>() == 40);

/// What a new state starts with.
#[derive(Debug, Clone, Copy)]
pub struct NewState<K: Key> {
    pub key: K,
    /// The stack-side key when NAT makes it differ from `key` (its protocol and interface
    /// are `key`'s).
    pub stack: Option<K>,
    pub dir: Dir,
    pub rule: u32,
    pub timeout: Timeout,
    pub src_state: u8,
    pub dst_state: u8,
    pub tcp: Option<[Peer; 2]>,
    pub nosync: bool,
    /// The rule's `allow-opts`.
    pub allow_opts: bool,
    /// The rule's `sloppy` (TCP: `tcp` is None then).
    pub sloppy: bool,
    /// pf's tag (`tag NAME`, an id; 0: none): the state's packets carry it to later passes.
    pub tag: u16,
    /// The rules' `scrub (...)` actions, packed by the engine (0: none): applied to every
    /// packet of the state.
    pub scrub: u64,
    /// The rule's `max-pkt-rate` meter (the policy's; 0: none): the state's packets in its
    /// first direction count against it.
    pub rate: u32,
    /// `pflow`: the state's flow is exported.
    pub pflow: bool,
    /// `log (all)`: the pflog unit + 1 the state's packets go to (0: none).
    pub log: u8,
    /// `set queue`: the queue ids (`q | ack << 16`) the state's packets go to (0: none).
    pub queue: u32,
    /// `route-to` / `reply-to`: the rule's routing target (the policy's number, 0: none).
    pub route: u16,
    /// A translated state: what it holds of this box's translation ([`held`]; 0 for a state
    /// synced from a peer).
    pub held: u8,
}

/// What a state keeps of the rules that made it besides its key and counters (pf's tag,
/// scrub actions and packet-rate meter): beside the entries ([`StateActions`]), since many
/// states have none. All zero: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Actions {
    pub tag: u16,
    pub scrub: u64,
    pub rate: u32,
    /// `log (all)`: the pflog unit + 1 every packet of the state goes to (0: none).
    pub log: u8,
    /// `set queue`: `q | ack << 16` (0: none).
    pub queue: u32,
    /// `route-to` / `reply-to`: the routing target (the policy's number, 0: none).
    pub route: u16,
}

// SAFETY: integers only; all zero is "no actions".
unsafe impl Zeroable for Actions {}

impl Actions {
    /// Whether the state has any action.
    #[inline(always)]
    pub fn any(&self) -> bool {
        self.tag != 0 || self.scrub != 0 || self.rate != 0 || self.log != 0 || self.queue != 0 || self.route != 0
    }
}

/// The actions of the states that have some, a record per state id in memory reserved for
/// every id: a record is where its state's id says (no hashing; an insert is one store near
/// the last state's), and memory is backed only where ids with actions fall. A hash map here
/// cost a SYN flood through the campus ruleset, whose `scrub (max-mss)` gives every TCP state
/// actions, 11% of the worker in its insert alone (a random bucket a new state, growing by
/// rehashing millions of entries at once): docs/state-table.md.
pub struct StateActions {
    v: Region<Actions>,
    /// Records holding actions.
    live: u32,
    /// One past the highest id that held actions: the memory backed is at most this many records.
    top: u32,
}

impl StateActions {
    fn new() -> Result<Self, MapError> {
        Ok(StateActions { v: Region::new(MAX_STATES as usize)?, live: 0, top: 0 })
    }

    /// Whether no state has actions (one test on a hit for rulesets without them).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// States with actions.
    pub fn len(&self) -> usize {
        self.live as usize
    }

    /// State `id`'s actions, if it has any.
    #[inline(always)]
    pub fn get(&self, id: u32) -> Option<&Actions> {
        if self.live == 0 || id >= self.top {
            return None;
        }
        let a = self.v.get(id as usize);
        a.any().then_some(a)
    }

    #[inline(always)]
    pub fn contains(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    /// Gives state `id` actions `a` (none when `a` has none).
    #[inline]
    pub fn insert(&mut self, id: u32, a: Actions) {
        let r = self.v.get_mut(id as usize);
        self.live = self.live + a.any() as u32 - r.any() as u32;
        *r = a;
        if a.any() && id >= self.top {
            self.top = id + 1;
        }
    }

    /// State `id` has no actions (any more). Touches no record while no state has any.
    #[inline]
    pub fn remove(&mut self, id: u32) {
        if self.live != 0 && id < self.top {
            let r = self.v.get_mut(id as usize);
            if r.any() {
                *r = Actions::default();
                self.live -= 1;
            }
        }
    }

    /// The memory the records up to the highest id with actions take (an upper bound).
    pub fn bytes(&self) -> usize {
        self.top as usize * core::mem::size_of::<Actions>()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// `set limit states` reached (pf's state-limit).
    Limit,
    /// A state with this key exists (pf's state-insert); its ref.
    Exists(u32),
    /// No slot left in the reserved space (pf's memory).
    Memory,
}

/// pfctl -si's state-table counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub searches: u64,
    pub inserts: u64,
    pub removals: u64,
    pub insert_exists: u64,
    pub limit_drops: u64,
    pub memory_drops: u64,
    /// TCP segments outside the state's sequence window (dropped, state kept).
    pub window_drops: u64,
    /// Closed TCP states replaced by a new connection on the same ports.
    pub reused: u64,
    /// ICMP errors that quoted a packet of a state but did not fit it (wrong addressee, TCP
    /// sequence outside the window): dropped.
    pub icmp_mismatch: u64,
}

pub struct Config {
    pub limit: u32,
    /// Index rows; None sizes them from the limit. For experiments only.
    pub rows: Option<u32>,
    pub seed: Seed,
    /// Event queue capacity; 0 turns events off (no sync configured).
    pub events: usize,
    /// Engine seconds at creation.
    pub now: u32,
    /// Commit memory for `limit` entries at creation, so that inserts never take a page fault
    /// (the daemon's choice: a limit too large for the machine fails at startup, not under
    /// load). Entries past the limit, after a raise, are faulted in on first use.
    pub prefault: bool,
    /// Start the index at this many rows and grow it (online, by 4x) whenever the load passes
    /// `ROW_LOAD` per row, up to what the limit calls for. None starts at the full size.
    pub grow_from: Option<u32>,
}

/// Memory the table holds, by part.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub entries: usize,
    pub index: usize,
    pub wheel: usize,
    pub side: usize,
}

impl Memory {
    pub fn total(&self) -> usize {
        self.entries + self.index + self.wheel + self.side
    }
}

pub struct StateTable<K: Key> {
    slab: Region<State<K>>,
    hwm: u32,
    free_head: u32,
    index: Index,
    migrating: Option<(Index, u32)>,
    /// A resize's new index while its pages are faulted in (`prepared` rows so far); nothing
    /// reads it until it is complete and becomes the index.
    pending: Option<Index>,
    prepared: u32,
    /// The thread faulting `pending` in, when one could be started.
    preparer: Option<std::thread::JoinHandle<()>>,
    scratch: Vec<u32>,
    wheel: Wheel,
    tcp: Side<[Peer; 2]>,
    /// Translated states' side records ([`Key::Aside`]), with TCP peers for TCP states.
    nat: Side<K::Aside>,
    tcpnat: Side<([Peer; 2], K::Aside)>,
    events: EventQueue,
    seed: Seed,
    timeouts: Timeouts,
    limit: u32,
    rows_fixed: bool,
    grow: bool,
    len: u32,
    /// TCP states whose handshake has not completed (pf's `states_halfopen`), kept by
    /// [`StateTable::insert`], removal and [`StateTable::protostate_changed`].
    halfopen: u32,
    seq: u32,
    /// The latest time the table was told (insert, maintain): removals outside those stamp
    /// source nodes with it.
    now: u32,
    pub counters: Counters,
    /// Limits and source nodes of the states made by limited rules.
    pub track: Tracking,
    /// `modulate state`: the sequence rewrite (added to SEQ, taken from ACK) that the engine
    /// computed for the packet it just tracked; it takes it at once.
    pub modulated: Option<(u32, u32)>,
    /// The state the last packet created (set by the engine, taken by its batch loop).
    pub created: Option<u32>,
    /// Sync's `maxupdates` (0: sync off): a TCP state that counted this much since its last
    /// update went out (segments and payload, the engine's `sync_count`) sets `sync_push`,
    /// and the sync side sends what is queued at once.
    pub sync_max: u8,
    pub sync_push: bool,
    /// The actions of the states that have some (only rules with `tag`, `scrub`,
    /// `max-pkt-rate`, `log (all)` or `set queue` make them, or `match` rules with those
    /// before them: then every state of theirs), by id.
    pub actions: StateActions,
    /// The translated states holding some of this box's translation ([`held`]) removed
    /// since the engine last took them: their ports go back to the translation's allocator.
    pub nat_gone: Vec<NatGone<K>>,
    /// [`held`] of each translated state, two bits an id (written at every translated
    /// insert, so an id's bits are its current state's).
    held: Vec<u64>,
    /// Flow records of `pflow` states, for the worker to take.
    pub flows: crate::flow::FlowLog,
    /// The rules' counts that no state in the table holds ([`crate::tally`]): the states
    /// that ended, folded in at their removal, and what the engine decided without a state.
    pub tally: crate::tally::RuleTally,
}

impl<K: Key> Drop for StateTable<K> {
    fn drop(&mut self) {
        // The preparer writes into `pending`'s mapping: it must end before the mapping does.
        if let Some(h) = self.preparer.take() {
            let _ = h.join();
        }
    }
}

/// Whether TCP peer states `st` are those of a handshake not completed: a peer below
/// ESTABLISHED (4 in pf's numbering; synproxy's states are above TIME_WAIT on the client's
/// side, and the server's side is below ESTABLISHED until the splice).
#[inline(always)]
pub fn half_open(st: [u8; 2]) -> bool {
    st[0].min(st[1]) < 4
}

pub fn auto_rows(limit: u32) -> u32 {
    limit.div_ceil(ROW_LOAD).max(16)
}

impl<K: Key> StateTable<K> {
    pub fn new(cfg: Config) -> Result<Self, MapError> {
        let slab = Region::new(MAX_STATES as usize)?;
        if cfg.prefault {
            slab.populate(cfg.limit as usize);
        }
        let rows = cfg.rows.or(cfg.grow_from).unwrap_or_else(|| auto_rows(cfg.limit)).min(auto_rows(cfg.limit).max(16));
        let rows = cfg.rows.unwrap_or(rows);
        Ok(StateTable {
            slab,
            hwm: 0,
            free_head: NONE,
            index: Index::new(rows, true)?,
            migrating: None,
            pending: None,
            prepared: 0,
            preparer: None,
            scratch: Vec::new(),
            wheel: Wheel::new(cfg.now),
            tcp: Side::new()?,
            nat: Side::new()?,
            tcpnat: Side::new()?,
            events: EventQueue::new(cfg.events),
            seed: cfg.seed,
            timeouts: Timeouts::default(),
            limit: cfg.limit,
            rows_fixed: cfg.rows.is_some(),
            grow: cfg.grow_from.is_some(),
            len: 0,
            halfopen: 0,
            seq: 0,
            now: cfg.now,
            counters: Counters::default(),
            track: Tracking::default(),
            modulated: None,
            created: None,
            sync_max: 0,
            sync_push: false,
            actions: StateActions::new()?,
            nat_gone: Vec::new(),
            held: Vec::new(),
            flows: Default::default(),
            tally: Default::default(),
        })
    }

    /// The sequence number of the last state made ([`Meta::seq`]).
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// The latest time the table was told.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Current entries.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// TCP states whose handshake has not completed: `set syncookies adaptive` turns the
    /// cookies on and off by this count.
    pub fn halfopen(&self) -> u32 {
        self.halfopen
    }

    /// The peer states of TCP state `id`'s peers went from `before` to `after` (the engine's
    /// tracking, a sync update): keeps the half-open count.
    #[inline(always)]
    pub fn protostate_changed(&mut self, before: [u8; 2], after: [u8; 2]) {
        match (half_open(before), half_open(after)) {
            (true, false) => self.halfopen = self.halfopen.saturating_sub(1),
            (false, true) => self.halfopen += 1,
            _ => {}
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn limit(&self) -> u32 {
        self.limit
    }
    pub fn rows(&self) -> u32 {
        self.index.nrows()
    }
    pub fn resizing(&self) -> bool {
        self.migrating.is_some() || self.pending.is_some()
    }
    /// Whether a resize is moving rows to the new index now (past preparing it).
    pub fn moving_rows(&self) -> bool {
        self.migrating.is_some()
    }
    pub fn overflow_buckets(&self) -> usize {
        self.index.overflow_buckets()
    }
    pub fn longest_chain(&self) -> u32 {
        self.index.longest_chain()
    }
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }
    pub fn set_timeouts(&mut self, t: Timeouts) {
        self.timeouts = t;
    }
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped
    }
    /// Events queued for sync.
    pub fn events_len(&self) -> usize {
        self.events.len()
    }
    pub fn events_enabled(&self) -> bool {
        self.events.enabled()
    }
    /// Slots ever used: live states have ids below this.
    pub fn high_water(&self) -> u32 {
        self.hwm
    }
    /// Turns sync events on (capacity > 0) or off, keeping the states.
    pub fn set_events(&mut self, cap: usize) {
        self.events = EventQueue::new(cap);
    }

    /// Changes the limit. Raising it grows the index online: a new index is made and rows move
    /// to it a few at a time in `maintain`, while lookups search both. Lowering it keeps every
    /// state; new ones are refused until the table is below the limit.
    pub fn set_limit(&mut self, limit: u32) -> Result<(), MapError> {
        let limit = limit.min(MAX_STATES - 1);
        self.limit = limit;
        self.maybe_start_resize()
    }

    /// The rows the index should have now. It is made for the limit's states with one entry
    /// each (growing to that with the load when it starts small); a translated state has two
    /// (its wire and its stack key), so when translated states bring the entries to the load
    /// the index was made for, it doubles, up to two entries for every state of the limit.
    fn wanted_rows(&self) -> u32 {
        let cur = self.index.nrows();
        if self.rows_fixed {
            return cur;
        }
        let entries = self.index.used();
        let loaded = entries >= cur as u64 * ROW_LOAD as u64;
        let plain = auto_rows(self.limit);
        if cur < plain {
            return if !self.grow {
                plain
            } else if loaded {
                cur.saturating_mul(4).min(plain)
            } else {
                cur
            };
        }
        if loaded && entries > self.len as u64 {
            cur.saturating_mul(2).min(auto_rows(self.limit.saturating_mul(2))).max(cur)
        } else {
            cur
        }
    }

    fn maybe_start_resize(&mut self) -> Result<(), MapError> {
        let want = self.wanted_rows();
        if self.resizing() || want <= self.index.nrows() {
            return Ok(());
        }
        let p = Index::new(want, false)?;
        // Committing the new index's memory is slow (here ~5 ms per 2 MB page never touched
        // before): a helper thread does it, off the packet path. If no thread can be started,
        // maintain() does it a slice per call.
        self.preparer = p.populate_in_background().ok();
        self.pending = Some(p);
        self.prepared = 0;
        Ok(())
    }

    #[inline(always)]
    pub fn hash(&self, k: &K) -> u64 {
        k.hash_with(&self.seed)
    }

    #[inline(always)]
    pub fn state(&self, id: u32) -> &State<K> {
        self.slab.get(id as usize)
    }

    #[inline(always)]
    pub fn state_mut(&mut self, id: u32) -> &mut State<K> {
        self.slab.get_mut(id as usize)
    }

    /// The stack-side key of a NAT state.
    #[inline(always)]
    pub fn stack_key(&self, id: u32) -> Option<K> {
        let s = self.state(id);
        if s.flags & sf::NAT == 0 || s.ext == NONE {
            return None;
        }
        Some(s.key.stack_of(&s.line, || self.aside(s)))
    }

    /// What the side record of translated state `s` holds besides peers ([`Key::Aside`]).
    /// An IPv4 state's stack key never needs it: the record is not read for that.
    #[inline(always)]
    fn aside(&self, s: &State<K>) -> &K::Aside {
        if self.has_tcp(s) {
            &self.tcpnat.get(s.ext).1
        } else {
            self.nat.get(s.ext)
        }
    }

    /// State `id`'s creation time, rule and insert sequence.
    pub fn meta(&self, id: u32) -> Meta {
        let s = self.state(id);
        if s.flags & sf::NAT == 0 || s.ext == NONE {
            return s.line;
        }
        *K::meta_of(&s.line, self.aside(s))
    }

    /// [`StateTable::meta`], writable (a state that arrives by sync keeps its age).
    pub fn meta_mut(&mut self, id: u32) -> &mut Meta {
        let s = *self.state(id);
        if s.flags & sf::NAT == 0 || s.ext == NONE {
            return &mut self.state_mut(id).line;
        }
        let tcp = self.has_tcp(&s);
        let line = &mut self.slab.get_mut(id as usize).line;
        let aside = if tcp { &mut self.tcpnat.get_mut(s.ext).1 } else { self.nat.get_mut(s.ext) };
        K::meta_of_mut(line, aside)
    }

    /// Prefetches the side record of state `id` if its stack key is there (IPv6).
    #[inline(always)]
    fn prefetch_stack_key(&self, id: u32) {
        // SAFETY: refs in the index point below hwm, inside the region.
        let s = unsafe { self.slab.get_unchecked(id as usize) };
        if s.flags & sf::NAT == 0 || s.ext == NONE {
            return;
        }
        if self.has_tcp(s) {
            self.tcpnat.prefetch(s.ext);
        } else {
            self.nat.prefetch(s.ext);
        }
    }

    #[inline(always)]
    fn has_tcp(&self, s: &State<K>) -> bool {
        s.key.proto() == xpf_wire::pdesc::IPPROTO_TCP && s.timeout & TO_SLOPPY == 0
    }

    /// TCP peers of a TCP state.
    pub fn peers_mut(&mut self, id: u32) -> Option<&mut [Peer; 2]> {
        let s = *self.state(id);
        if !self.has_tcp(&s) || s.ext == NONE {
            return None;
        }
        if s.flags & sf::NAT != 0 {
            Some(&mut self.tcpnat.get_mut(s.ext).0)
        } else {
            Some(self.tcp.get_mut(s.ext))
        }
    }

    /// A TCP state and its peers, both writable (the window tracking's one access).
    #[inline(always)]
    pub fn state_and_peers_mut(&mut self, id: u32) -> (&mut State<K>, Option<&mut [Peer; 2]>) {
        assert!((id as usize) < self.slab.capacity());
        // SAFETY: bounds checked above.
        let s = unsafe { self.slab.get_unchecked_mut(id as usize) };
        let p = if s.key.proto() != xpf_wire::pdesc::IPPROTO_TCP || s.timeout & TO_SLOPPY != 0 || s.ext == NONE {
            // A sloppy state has no peers (a translated one's record is the nat side's).
            None
        } else if s.flags & sf::NAT != 0 {
            Some(&mut self.tcpnat.get_mut(s.ext).0)
        } else {
            Some(self.tcp.get_mut(s.ext))
        };
        (s, p)
    }

    pub fn peers(&self, id: u32) -> Option<&[Peer; 2]> {
        let s = self.state(id);
        if !self.has_tcp(s) || s.ext == NONE {
            return None;
        }
        if s.flags & sf::NAT != 0 {
            Some(&self.tcpnat.get(s.ext).0)
        } else {
            Some(self.tcp.get(s.ext))
        }
    }

    /// The key of ref `r` (a wire or a stack ref).
    #[inline(always)]
    fn key_of_ref(&self, r: u32) -> K {
        // SAFETY: refs in the index point below hwm, inside the region.
        let s = unsafe { self.slab.get_unchecked((r & ID_MASK) as usize) };
        if r & STACK == 0 {
            s.key
        } else {
            s.key.stack_of(&s.line, || self.aside(s))
        }
    }

    /// Finds the ref of `k` (hash `h`), walking rows and chains; no counters.
    #[inline]
    pub fn find(&self, k: &K, h: u64) -> Option<u32> {
        let eq = |r: u32| self.key_of_ref(r) == *k;
        if let Some((old, cursor)) = &self.migrating {
            if old.row_of(h) >= *cursor {
                if let Some(r) = old.find(h, eq) {
                    return Some(r);
                }
            }
        }
        self.index.find(h, eq)
    }

    /// One lookup (the slow path); counts a search.
    pub fn lookup(&mut self, k: &K) -> Option<u32> {
        self.counters.searches += 1;
        self.find(k, self.hash(k))
    }

    /// Looks up a batch of keys in three stages so that the memory reads of different packets
    /// overlap: hash every key and prefetch its row; probe each row's tags and prefetch the
    /// entry a tag points to; compare keys. `out[i]` is the ref of `keys[i]` or NONE, and
    /// `hashes[i]` its hash (for an insert after a miss).
    // PERF: 17.9 ns/pkt at 10M states, 9.7 ns at 9,800 (parse + lookup + update, batch of 32;
    // xpf-bench states, docs/bench-results.md).
    #[inline]
    pub fn lookup_batch(&mut self, keys: &[K], hashes: &mut [u64], out: &mut [u32]) {
        let n = keys.len();
        let (hashes, out) = (&mut hashes[..n], &mut out[..n]);
        for (k, h) in keys.iter().zip(hashes.iter_mut()) {
            *h = k.hash_with(&self.seed);
            self.index.prefetch(*h);
        }
        self.counters.searches += n as u64;
        if let Some((old, _)) = &self.migrating {
            for h in hashes.iter() {
                old.prefetch(*h);
            }
            for i in 0..n {
                out[i] = self.find(&keys[i], hashes[i]).unwrap_or(NONE);
            }
            return;
        }
        for (h, o) in hashes.iter().zip(out.iter_mut()) {
            *o = match self.index.probe(*h) {
                Probe::Miss => NONE,
                Probe::Candidate(r) => {
                    self.slab.prefetch((r & ID_MASK) as usize);
                    r
                }
                Probe::Chain => CHAIN,
            };
        }
        // A translated IPv6 state's side record holds its stack key, which a candidate found
        // by that key needs to compare; only the state's line says where it is. Once the
        // batch's lines are on their way, those records are asked for too, rather than each
        // packet waiting for both in turn. (An IPv4 state's line holds its stack key.)
        if !K::STACK_IN_LINE && (self.nat.used() || self.tcpnat.used()) {
            for &r in out.iter() {
                if r < CHAIN && r & STACK != 0 {
                    self.prefetch_stack_key(r & ID_MASK);
                }
            }
        }
        for i in 0..n {
            let r = out[i];
            if r == NONE || (r != CHAIN && self.key_of_ref(r) == keys[i]) {
                continue;
            }
            out[i] = self.find(&keys[i], hashes[i]).unwrap_or(NONE);
        }
    }

    /// Inserts a state; `h` is the hash of `s.key`. Returns its id.
    pub fn insert(&mut self, h: u64, s: NewState<K>, now: u32) -> Result<u32, InsertError> {
        if self.len >= self.limit {
            self.counters.limit_drops += 1;
            return Err(InsertError::Limit);
        }
        if let Some(r) = self.find(&s.key, h) {
            self.counters.insert_exists += 1;
            return Err(InsertError::Exists(r));
        }
        let stack = s.stack.filter(|k| *k != s.key);
        debug_assert!(stack.is_none_or(|k| (k.proto(), k.kif()) == (s.key.proto(), s.key.kif())));
        let hs = stack.map(|k| self.hash(&k));
        if let (Some(k), Some(hs)) = (&stack, hs) {
            if let Some(r) = self.find(k, hs) {
                self.counters.insert_exists += 1;
                return Err(InsertError::Exists(r));
            }
        }
        let id = if self.free_head != NONE {
            let id = self.free_head;
            self.free_head = self.slab.get(id as usize).ext;
            id
        } else if self.hwm < MAX_STATES - 1 {
            self.hwm += 1;
            self.hwm - 1
        } else {
            self.counters.memory_drops += 1;
            return Err(InsertError::Memory);
        };
        self.seq = self.seq.wrapping_add(1);
        let meta = Meta { creation: now, rule: s.rule, seq: self.seq };
        let (line, ext) = match (s.tcp, stack) {
            (Some(p), None) => (meta, self.tcp.alloc(p)),
            (None, None) => (meta, NONE),
            (tcp, Some(k)) => {
                let (line, aside) = K::lend(&k, meta);
                (line, if let Some(p) = tcp { self.tcpnat.alloc((p, aside)) } else { self.nat.alloc(aside) })
            }
        };
        let mut flags = sf::LIVE;
        if s.dir == Dir::Out {
            flags |= sf::OUT;
        }
        if stack.is_some() {
            flags |= sf::NAT;
        }
        if s.nosync {
            flags |= sf::NOSYNC;
        } else if self.events.enabled() && self.events.push(Event { id, kind: EventKind::Insert }) {
            flags |= sf::EVQ_INS;
        }
        *self.slab.get_mut(id as usize) = State {
            key: s.key,
            expire: now,
            ext,
            line,
            timeout: (s.timeout as u8 & TO_CLASS)
                | if s.allow_opts { TO_ALLOWOPTS } else { 0 }
                | if s.sloppy { TO_SLOPPY } else { 0 }
                | if s.pflow { TO_PFLOW } else { 0 },
            peer_state: [s.src_state, s.dst_state],
            flags,
            packets: [0; 2],
            bytes: [0; 2],
        };
        self.index.insert(h, id);
        let a = Actions { tag: s.tag, scrub: s.scrub, rate: s.rate, log: s.log, queue: s.queue, route: s.route };
        if a.any() {
            self.actions.insert(id, a);
        }
        if let Some(hs) = hs {
            self.index.insert(hs, id | STACK);
            self.set_held(id, s.held);
        }
        let mut due = now.saturating_add(self.timeouts.get(s.timeout));
        if s.pflow {
            due = self.pflow_inserted(id, now, due);
        }
        self.wheel.file(id, due);
        self.now = self.now.max(now);
        self.len += 1;
        if s.key.proto() == xpf_wire::pdesc::IPPROTO_TCP && half_open([s.src_state, s.dst_state]) {
            self.halfopen += 1;
        }
        self.counters.inserts += 1;
        Ok(id)
    }

    /// Puts new state `id`, made by a rule with limits `l` for a packet from `src`, under
    /// those limits (after [`Tracking::admit`] allowed it).
    pub fn attach(&mut self, id: u32, l: &RuleLimits, src: xpf_wire::Addr, now: u32) {
        let rule = self.meta(id).rule;
        self.track.attach(id, l, src, rule, now);
        let s = self.state_mut(id);
        s.timeout |= TO_EXTRA;
        let class = s.class();
        if !l.timeouts.is_empty() {
            // The rule's own timeout may be shorter than the one the wheel was given.
            let t = self.track.timeout(l.limiter, class, &self.timeouts, self.len, self.limit);
            self.wheel.file(id, now.saturating_add(t));
        }
    }

    /// Seconds after its last packet that state `id` expires: its class's timeout, its rule's
    /// if it has one, scaled down as the table fills (pf_state_expires).
    pub fn timeout_of(&self, id: u32) -> u32 {
        let s = self.state(id);
        if s.timeout & TO_EXTRA != 0 {
            if let Some(x) = self.track.extra.get(&id) {
                return self.track.timeout(x.limiter, s.class(), &self.timeouts, self.len, self.limit);
            }
        }
        self.timeouts.effective(s.class(), self.len, self.limit)
    }

    /// Accounts a packet of `bytes` going in direction `dir` to state `id`, marks its activity
    /// and offers an update event (collapsed with one already queued).
    // PERF: part of the 17.9 ns/pkt at 10M states measured by xpf-bench states.
    #[inline(always)]
    pub fn touch(&mut self, id: u32, dir: Dir, bytes: u16, now: u32) -> &mut State<K> {
        assert!((id as usize) < self.slab.capacity());
        // SAFETY: bounds checked above.
        let s = unsafe { self.slab.get_unchecked_mut(id as usize) };
        let side = (((s.flags & sf::OUT) >> 2) ^ dir as u8) as usize;
        s.packets[side] = s.packets[side].wrapping_add(1);
        s.bytes[side] += bytes as u64;
        // Sync: an active state is offered on its first packet of each SYNC_EVERY-second
        // epoch (phase-shifted by id so that 1M states do not fall due in the same second),
        // which keeps the peer's timer within SYNC_EVERY s of ours. The engine offers TCP
        // states besides on a state change, after `maxupdates` segments and after 32 KB of
        // payload (its `sync_count`). Offering on every packet made one message per packet
        // with 1M round-robin flows (sync on at 0.26x of off, `xpf-bench sync`).
        if self.events.enabled() && sync_epoch(now, id) != sync_epoch(s.expire, id) {
            offer(&mut self.events, s, id);
        }
        s.expire = now;
        s
    }

    /// Offers state `id` to sync now (collapsed with an event already queued).
    pub fn queue_update(&mut self, id: u32) {
        offer(&mut self.events, self.slab.get_mut(id as usize), id);
    }

    /// State `id` if it is live (in the index): for holders of an id that may be stale.
    pub fn live(&self, id: u32) -> Option<&State<K>> {
        if id >= self.hwm {
            return None;
        }
        let s = self.state(id);
        (s.flags & sf::LIVE != 0 && s.flags & sf::DEAD == 0).then_some(s)
    }

    /// Removes state `id` now (pfctl -k, a sync delete). False if it was not live.
    pub fn remove(&mut self, id: u32) -> bool {
        if id >= self.hwm || self.state(id).flags & sf::LIVE == 0 {
            return false;
        }
        self.unlink(id);
        true
    }

    /// Removes every state (`-F states`), each as [`remove`](Self::remove) does (source
    /// tracking, side records, counters, flow records), with its sync delete event if
    /// `events` (else the caller clears the peer's copies in one message, as pf's `pfctl -F
    /// states` does), except that translated states are not queued in
    /// [`nat_gone`](Self::nat_gone): the caller gives every port back at once (the engine's
    /// `Worker::remove_all_states`), not one queued release a state (10M translated states:
    /// 400 MB of queue). With many states the index is emptied at once instead of entry by
    /// entry: taking an entry out waits on its row's cache line (~0.1-0.3 us a state at
    /// millions), where zeroing costs a few ns a row. Returns the states removed.
    pub fn remove_all(&mut self, events: bool) -> u32 {
        self.remove_every(events, true)
    }

    /// Removes every state as a peer's clear does: no sync event and no flow record (the
    /// peer that ended them tells its own collector), no port released one by one (the
    /// caller lets go of what the peer's states held at once), the index emptied at once as
    /// [`remove_all`](Self::remove_all) does. Returns the states removed.
    pub fn remove_all_quietly(&mut self) -> u32 {
        self.remove_every(false, false)
    }

    fn remove_every(&mut self, events: bool, flows: bool) -> u32 {
        /// Emptied at once from one state per this many rows.
        const WHOLE: u64 = 16;
        let whole = self.len as u64 * WHOLE >= self.index.nrows() as u64;
        let mut n = 0;
        for id in 0..self.hwm {
            if self.state(id).flags & sf::LIVE != 0 {
                if !flows {
                    self.state_mut(id).timeout &= !TO_PFLOW;
                }
                self.unlink_from(id, !whole, events, false);
                n += 1;
            }
        }
        if whole {
            // An index resize in progress has nothing left to move: the old index goes (on a
            // helper thread, as at a resize's end) and the new one is emptied.
            if let Some((old, _)) = self.migrating.take() {
                let _ = crate::region::spawn_away("xpf-unmap", move || drop(old));
            }
            self.index.clear();
        }
        n
    }

    fn index_remove(&mut self, h: u64, r: u32) {
        if self.index.remove(h, r) {
            return;
        }
        if let Some((old, _)) = &mut self.migrating {
            let found = old.remove(h, r);
            debug_assert!(found, "ref {r:#x} in neither index");
        }
    }

    /// A `pflow` state was inserted: its NAT44 creation record, and when the wheel is to
    /// visit it first (its deadline, or its first active record if sooner).
    #[cold]
    fn pflow_inserted(&mut self, id: u32, now: u32, deadline: u32) -> u32 {
        let (s, m) = (*self.state(id), self.meta(id));
        if let Some(k) = self.stack_key(id) {
            self.flows.record(id, &s, m, Some(k), crate::flow::FlowEvent::NatCreate, now);
        }
        self.flows.next_active(id, m.seq, m.creation).map_or(deadline, |a| a.min(deadline))
    }

    #[cold]
    fn pflow_record(&mut self, id: u32, event: crate::flow::FlowEvent, now: u32) {
        let s = *self.state(id);
        self.flows.record(id, &s, self.meta(id), self.stack_key(id), event, now);
    }

    fn unlink(&mut self, id: u32) {
        self.unlink_from(id, true, true, true);
    }

    /// [`unlink`](Self::unlink), taking the state's keys out of the index or not (the caller
    /// then empties the index itself), with its delete event or not (the caller tells the
    /// peer otherwise), queueing a translated state's keys in `nat_gone` or not (the caller
    /// releases the ports otherwise).
    #[inline(always)]
    fn unlink_from(&mut self, id: u32, index: bool, event: bool, gone: bool) {
        let s = *self.state(id);
        // Its packets stay with its rule (read before the side record, which may hold the
        // rule, is released).
        let m = self.meta(id);
        if self.tally.counts(m.rule, m.creation, m.seq) {
            self.tally.ended(id, m.rule, s.flags & sf::OUT != 0, s.packets, s.bytes);
        }
        if s.timeout & TO_PFLOW != 0 {
            self.pflow_record(id, crate::flow::FlowEvent::End, self.now);
        }
        if index {
            self.index_remove(self.hash(&s.key), id);
        }
        if let Some(k) = self.stack_key(id) {
            if index {
                self.index_remove(self.hash(&k), id | STACK);
            }
            let held = self.held_of(id);
            if gone && held != 0 {
                self.nat_gone.push(NatGone { wire: s.key, stack: k, flags: s.flags, held });
            }
        }
        if s.ext != NONE {
            match (self.has_tcp(&s), s.flags & sf::NAT != 0) {
                (true, false) => self.tcp.release(s.ext),
                (true, true) => self.tcpnat.release(s.ext),
                (false, true) => self.nat.release(s.ext),
                (false, false) => {}
            }
        }
        if s.timeout & TO_EXTRA != 0 {
            self.track.detach(id, self.now, self.timeouts.get(Timeout::SrcTrack));
        }
        self.actions.remove(id);
        let mut flags = (s.flags & !(sf::LIVE | sf::NAT)) | sf::DEAD;
        if event
            && self.events.enabled()
            && s.flags & sf::NOSYNC == 0
            && self.events.push(Event { id, kind: EventKind::Delete })
        {
            flags |= sf::EVQ_DEL;
        }
        let e = self.state_mut(id);
        e.flags = flags;
        e.ext = NONE;
        e.timeout &= !TO_EXTRA;
        self.len -= 1;
        if s.key.proto() == xpf_wire::pdesc::IPPROTO_TCP && half_open(s.peer_state) {
            self.halfopen = self.halfopen.saturating_sub(1);
        }
        self.counters.removals += 1;
    }

    fn free_slot(&mut self, id: u32) {
        let head = self.free_head;
        let e = self.state_mut(id);
        e.flags = 0;
        e.ext = head;
        self.free_head = id;
    }

    /// Background work, bounded by `budget` units: moves index rows during a resize, and
    /// expires the states whose deadline has passed. Returns the states expired.
    pub fn maintain(&mut self, now: u32, budget: u32) -> u32 {
        self.now = self.now.max(now);
        let st = self.timeouts.get(Timeout::SrcTrack);
        if st != 0 && now >= self.track.next_purge && !self.track.nodes.is_empty() {
            // Nodes without states are few next to states: a scan every few seconds.
            self.track.purge_nodes(now, st);
            self.track.next_purge = now + 4;
        }
        if self.resizing() {
            self.migrate(budget / 4 + 1);
        } else if self.wanted_rows() > self.index.nrows() {
            let _ = self.maybe_start_resize();
        }
        let mut expired = 0;
        for _ in 0..budget {
            let Some(id) = self.wheel.next_due(now) else {
                break;
            };
            expired += self.due(id, now) as u32;
        }
        expired
    }

    fn due(&mut self, id: u32, now: u32) -> bool {
        let s = *self.state(id);
        if s.flags & sf::DEAD != 0 {
            if s.flags & sf::EVQ_DEL != 0 {
                self.wheel.file(id, now + 1);
            } else {
                self.free_slot(id);
            }
            return false;
        }
        let t = self.timeout_of(id);
        let deadline = s.expire.saturating_add(t);
        if deadline > now {
            let mut next = deadline;
            if s.timeout & TO_PFLOW != 0 {
                let m = self.meta(id);
                if let Some(a) = self.flows.next_active(id, m.seq, m.creation) {
                    if a <= now {
                        self.pflow_record(id, crate::flow::FlowEvent::Active, now);
                    }
                    next = next.min(self.flows.next_active(id, m.seq, m.creation).unwrap_or(next).max(now + 1));
                }
            }
            self.wheel.file(id, next);
            return false;
        }
        self.unlink(id);
        if self.state(id).flags & sf::EVQ_DEL != 0 {
            self.wheel.file(id, now + 1);
        } else {
            self.free_slot(id);
        }
        true
    }

    /// Rows faulted in per maintenance call while preparing a resize: 256 KB. Memory never
    /// touched before costs ~2.5 ms per MB here (the hypervisor backs guest RAM on first touch),
    /// so 2 MB per call made 6.5 ms stalls; 256 KB keeps a call under a millisecond.
    const PREPARE_ROWS: u32 = 4096;

    fn migrate(&mut self, rows: u32) {
        if let Some(p) = &self.pending {
            // The new index is faulted in before anything reads it: letting lookups read it
            // untouched cost one call 6.8 ms (a page fault per first read).
            match &self.preparer {
                Some(h) if !h.is_finished() => return,
                Some(_) => {
                    let _ = self.preparer.take().unwrap().join();
                    self.prepared = p.nrows();
                }
                None => {
                    p.populate_rows(self.prepared, Self::PREPARE_ROWS);
                    self.prepared = self.prepared.saturating_add(Self::PREPARE_ROWS);
                }
            }
            if self.prepared >= p.nrows() {
                let new = self.pending.take().unwrap();
                let old = std::mem::replace(&mut self.index, new);
                self.migrating = Some((old, 0));
            }
            return;
        }
        let Some((old, mut cursor)) = self.migrating.take() else {
            return;
        };
        let end = cursor.saturating_add(rows).min(old.nrows());
        let mut refs = std::mem::take(&mut self.scratch);
        while cursor < end {
            refs.clear();
            old.row_refs(cursor, |r| refs.push(r));
            for &r in &refs {
                let h = self.hash(&self.key_of_ref(r));
                self.index.insert(h, r);
            }
            cursor += 1;
        }
        self.scratch = refs;
        if cursor < old.nrows() {
            self.migrating = Some((old, cursor));
        } else {
            // Unmapping the old index (107 MB at 10M states) took the worker 1.7 ms; a helper
            // thread does it (inline if none can be started).
            let _ = crate::region::spawn_away("xpf-unmap", move || drop(old));
        }
    }

    /// Runs the resize to its end (tests, and a daemon that is told to).
    /// Runs resizing to its end, including any further growth the load calls for (tests, and
    /// a daemon told to).
    pub fn finish_resize(&mut self) {
        loop {
            if let Some(h) = self.preparer.take() {
                let _ = h.join();
                self.prepared = u32::MAX;
            }
            while self.resizing() {
                self.migrate(1 << 16);
            }
            if self.wanted_rows() <= self.index.nrows() || self.maybe_start_resize().is_err() {
                return;
            }
        }
    }

    /// Hands queued events to `f` in order, with the state as it is now. An update queued
    /// before its state was removed and the slot reused is skipped.
    pub fn drain_events(&mut self, mut f: impl FnMut(Event, &State<K>)) -> usize {
        let mut n = 0;
        while let Some(e) = self.events.pop() {
            let s = self.slab.get_mut(e.id as usize);
            let bit = match e.kind {
                EventKind::Insert => sf::EVQ_INS,
                EventKind::Update => sf::EVQ_UPD,
                EventKind::Delete => sf::EVQ_DEL,
            };
            if s.flags & bit == 0 {
                continue;
            }
            s.flags &= !bit;
            f(e, s);
            n += 1;
        }
        n
    }

    /// Live states, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &State<K>)> + '_ {
        (0..self.hwm).map(move |i| (i, self.state(i))).filter(|(_, s)| s.flags & sf::LIVE != 0)
    }

    /// Notes what translated state `id` holds ([`held`]): given back through
    /// [`nat_gone`](Self::nat_gone) when it goes (the engine takes a peer's synced states in
    /// this way).
    pub fn set_held(&mut self, id: u32, h: u8) {
        let (w, b) = (id as usize / 32, (id % 32) * 2);
        if w >= self.held.len() {
            if h == 0 {
                return;
            }
            self.held.resize((w + 1).next_power_of_two(), 0);
        }
        self.held[w] = (self.held[w] & !(3 << b)) | ((h as u64 & 3) << b);
    }

    /// [`held`] of translated state `id`.
    pub fn held_of(&self, id: u32) -> u8 {
        self.held.get(id as usize / 32).map_or(0, |w| (w >> ((id % 32) * 2)) as u8 & 3)
    }

    /// The bytes this table holds (entries up to the high-water mark, index, wheel, side).
    pub fn memory(&self) -> Memory {
        Memory {
            entries: self.hwm as usize * core::mem::size_of::<State<K>>(),
            index: self.index.bytes()
                + self.migrating.as_ref().map_or(0, |(o, _)| o.bytes())
                + self.pending.as_ref().map_or(0, |p| p.populated_bytes(self.prepared)),
            wheel: self.wheel.bytes(),
            side: self.tcp.bytes()
                + self.nat.bytes()
                + self.tcpnat.bytes()
                + self.actions.bytes()
                + self.held.capacity() * 8,
        }
    }

    /// Prefetches the index row of hash `h` (for callers that pipeline their own work).
    #[inline(always)]
    pub fn prefetch_row(&self, h: u64) {
        self.index.prefetch(h);
    }

    /// Prefetches state `id` (for callers that pipeline their own work).
    #[inline(always)]
    pub fn prefetch_state(&self, id: u32) {
        self.slab.prefetch(id as usize);
    }
}
