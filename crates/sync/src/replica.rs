//! One worker's side of sync: its tables' events out, received records in. Each worker has
//! its own [`Replica`], drains its own tables' event queues into its own frames, and applies
//! the records routed to it: no lock is shared between workers (FreeBSD review D18373 split
//! pfsync's one lock into buckets for the same reason).
//!
//! A state's sync id is (creator id, 64-bit id). For a state this firewall made, the id names
//! the worker, the family, the slot and the low bits of its insert sequence, so a message
//! about it finds it without a lookup. A state learned from a peer keeps the peer's id: a map
//! (id -> slot) and a per-slot origin array hold it, for as long as the state lives.

use crate::endpoint::Config;
use crate::frame::FrameBuilder;
use crate::wire::{self, Clr, KeyRec, Msg, PeerRec, StateId, StateRec, UpdC};
use hashbrown::HashMap;
use xpf_state::table::{sf, TO_ALLOWOPTS, TO_PFLOW, TO_SLOPPY};
use xpf_state::{Dir, Key, Key4, Key6, NewState, Peer, Scrub, StateTable, Timeout};
use xpf_wire::Addr;

const TCP: u8 = 6;
/// TCPS_SYN_SENT: from here on a peer's sequence numbers mean something.
const TCPS_SYN_SENT: u8 = 2;
/// The default `maxupdates` (pf's).
pub const MAX_UPDATES: u8 = 128;
/// States a worker exports per millisecond during a bulk update: 10M states in 25 s, paced so
/// that the standby's receive buffer is not overrun (`xpf-bench sync`: at 500/ms a standby
/// without prefaulted memory lost 5.5% of 10M).
pub const BULK_PER_MS: u64 = 400;
/// Events queued before a worker sends them without waiting for the second to pass. Large on
/// purpose: a state's updates collapse for up to a second (one message per busy state per
/// second), except a TCP state past `maxupdates`. Sending at every 4096 events made one update
/// per packet with 9,800 round-robin flows (`xpf-bench sync`).
pub const FLUSH_EVENTS: usize = 1 << 12;

/// pf's PFTM_* number of each xpf timeout class (same order as `Timeout::ALL`).
fn pftm(t: Timeout) -> u8 {
    match t {
        Timeout::TcpFirst => 0,
        Timeout::TcpOpening => 1,
        Timeout::TcpEstablished => 2,
        Timeout::TcpClosing => 3,
        Timeout::TcpFinWait => 4,
        Timeout::TcpClosed => 5,
        Timeout::UdpFirst => 6,
        Timeout::UdpSingle => 7,
        Timeout::UdpMultiple => 8,
        Timeout::IcmpFirst => 9,
        Timeout::IcmpError => 10,
        Timeout::OtherFirst => 11,
        Timeout::OtherSingle => 12,
        Timeout::OtherMultiple => 13,
        Timeout::Frag => 14,
        Timeout::Interval => 15,
        Timeout::AdaptiveStart => 16,
        Timeout::AdaptiveEnd => 17,
        Timeout::SrcTrack => 18,
        Timeout::TcpTsDiff => 19,
    }
}

fn from_pftm(x: u8) -> Option<Timeout> {
    // pf's state timeouts are 0..=13 (tcp.first .. other.multiple); frag and interval are not a state's.
    Timeout::ALL.iter().copied().find(|&t| pftm(t) == x && x <= 13)
}

/// Counters of what the records did to the tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub cleared: u64,
    /// Updates older than the state held (pf's stale): ours was sent back.
    pub stale: u64,
    /// Compressed updates or deletes for states not held: an update request went out.
    pub unknown: u64,
    /// Records refused: unknown interface, bad values, table full (pf's badstate/badval).
    pub badstate: u64,
    /// Update requests answered.
    pub requests: u64,
    /// Insert acks: received for our states (defer mode), sent for the peer's.
    pub acks_in: u64,
    pub acks_out: u64,
}

impl ApplyStats {
    pub fn add(&mut self, o: &ApplyStats) {
        self.inserted += o.inserted;
        self.updated += o.updated;
        self.deleted += o.deleted;
        self.cleared += o.cleared;
        self.stale += o.stale;
        self.unknown += o.unknown;
        self.badstate += o.badstate;
        self.requests += o.requests;
        self.acks_in += o.acks_in;
        self.acks_out += o.acks_out;
    }
}

/// Interface names for records: index -> name and name -> index (0 is "all", floating).
pub trait Ifnames {
    fn name(&self, kif: u16) -> [u8; wire::IFNAMSIZ];
    fn index(&self, name: &[u8; wire::IFNAMSIZ]) -> Option<u16>;
}

/// Floating states only (tests, benches): every name but "all" is unknown.
pub struct FloatingOnly;

impl Ifnames for FloatingOnly {
    fn name(&self, _: u16) -> [u8; wire::IFNAMSIZ] {
        wire::ifname("all")
    }
    fn index(&self, name: &[u8; wire::IFNAMSIZ]) -> Option<u16> {
        (wire::ifname_str(name) == Some("all")).then_some(0)
    }
}

/// A worker's two tables.
pub struct Tables<'a> {
    pub t4: &'a mut StateTable<Key4>,
    pub t6: &'a mut StateTable<Key6>,
}

/// Runs `$body` with `$t` bound to the table of family `$fam` (0: IPv4, 1: IPv6).
macro_rules! with_table {
    ($tables:expr, $fam:expr, |$t:ident| $body:expr) => {
        if $fam == 0 {
            let $t = &mut *$tables.t4;
            $body
        } else {
            let $t = &mut *$tables.t6;
            $body
        }
    };
}

pub struct Replica {
    pub creatorid: u32,
    worker: u8,
    ids: HashMap<StateId, u32, foldhash::fast::FixedState>,
    /// Per family, per slot: the peer's id of a state learned by sync (zero: our own).
    origin: [Vec<StateId>; 2],
    out: FrameBuilder,
    /// Frames ready to send.
    pub ready: Vec<Vec<u8>>,
    first_event_ms: Option<u64>,
    /// When a push last drained the queues.
    pushed_ms: u64,
    pub stats: ApplyStats,
    /// Bulk export in progress: (family, next slot).
    bulk: Option<(usize, u32)>,
    pub bulk_sent: u64,
    evbuf: Vec<xpf_state::Event>,
    defer: bool,
    /// Defer mode: our states whose insert the peer acknowledged (slot references, family
    /// bit 31) since the caller last emptied this.
    pub acked: Vec<u32>,
    /// With `note_gone`: the peers' states this worker no longer holds (it removed them
    /// itself: expired, killed; or a peer's clear of one interface took them) since the
    /// caller last emptied this, for whoever placed them here to forget them.
    pub gone: Vec<StateId>,
    pub note_gone: bool,
    /// Translated states inserted from the peers since the caller last emptied this (slot
    /// references, family bit 31), for the engine to take into this box's translation
    /// (`Worker::adopt`).
    pub translated: Vec<u32>,
    /// A peer's clear emptied the tables since the caller last looked: what the translation
    /// held of the states it took in goes with them.
    pub emptied: bool,
}

const V6: u32 = 1 << 31;
const SEQ_BITS: u32 = 23;

impl Replica {
    pub fn new(cfg: &Config, worker: u8) -> Replica {
        Replica {
            creatorid: cfg.creatorid,
            worker,
            ids: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x9e37_79b9)),
            origin: [Vec::new(), Vec::new()],
            out: cfg.builder(1 + worker as u16),
            ready: Vec::new(),
            first_event_ms: None,
            pushed_ms: u64::MAX,
            stats: ApplyStats::default(),
            bulk: None,
            bulk_sent: 0,
            evbuf: Vec::new(),
            defer: cfg.defer,
            acked: Vec::new(),
            gone: Vec::new(),
            note_gone: false,
            translated: Vec::new(),
            emptied: false,
        }
    }

    /// Makes room for `states` peers' states (the table's limit) up front: growing the id map
    /// by doubling rehashes every entry at once (at 8M, a stall of a second that overran the
    /// socket buffer during a bulk update: 1.9-3.4% of 10M states lost). The memory is
    /// reserved, not touched, until states arrive.
    pub fn reserve(&mut self, states: usize) {
        self.ids.reserve(states.saturating_sub(self.ids.len()));
        for o in &mut self.origin {
            o.reserve(states.saturating_sub(o.len()));
        }
    }

    /// States learned from peers and held now.
    pub fn imported(&self) -> usize {
        self.ids.len()
    }

    fn send(&mut self, m: Msg) {
        if !self.out.push(&m) {
            self.ready.extend(self.out.finish());
            self.out.push(&m);
        }
    }

    /// Every state went at once (`-F states`) without its delete: the peer is told by one
    /// clear of the states this box created, as pf's `pfctl -F states` does (the peer's own
    /// states stay with it), and what this worker held of the peer's states is forgotten.
    /// The clear goes out with the next transmit.
    pub fn cleared(&mut self) {
        self.forget_all();
        self.send(Msg::Clear(wire::Clr { ifname: wire::ifname("all"), creatorid: self.creatorid }));
        self.flush();
    }

    /// Forgets every peer's state this worker held (its tables were emptied).
    fn forget_all(&mut self) {
        self.ids.clear();
        for o in &mut self.origin {
            o.clear();
        }
    }

    /// Closes the open frame so that it goes out with the next transmit.
    pub fn flush(&mut self) {
        self.ready.extend(self.out.finish());
    }

    /// The sync id of state `id` of family `fam` (slot reference).
    fn sid<K: Key>(&self, fam: usize, t: &StateTable<K>, id: u32) -> StateId {
        match self.origin[fam].get(id as usize) {
            Some(o) if o.creatorid != 0 || o.id != 0 => *o,
            _ => {
                let seq = (t.meta(id).seq & ((1 << SEQ_BITS) - 1)) as u64;
                StateId {
                    id: (self.worker as u64) << 56 | (fam as u64) << 55 | seq << 32 | id as u64,
                    creatorid: self.creatorid,
                }
            }
        }
    }

    /// The slot reference (family bit | slot) of the live state named `sid`.
    fn find(&self, tables: &Tables, sid: &StateId) -> Option<u32> {
        if sid.creatorid == self.creatorid {
            if (sid.id >> 56) as u8 != self.worker {
                return None;
            }
            let fam = ((sid.id >> 55) & 1) as usize;
            let slot = sid.id as u32;
            let seq = ((sid.id >> 32) as u32) & ((1 << SEQ_BITS) - 1);
            let live = if fam == 0 {
                tables.t4.live(slot).map(|_| tables.t4.meta(slot).seq)
            } else {
                tables.t6.live(slot).map(|_| tables.t6.meta(slot).seq)
            };
            let ours = self.origin[fam].get(slot as usize).is_none_or(|o| o.id == 0 && o.creatorid == 0);
            return match live {
                Some(s) if s & ((1 << SEQ_BITS) - 1) == seq && ours => Some(slot | if fam == 1 { V6 } else { 0 }),
                _ => None,
            };
        }
        let r = *self.ids.get(sid)?;
        let (fam, slot) = ((r >> 31) as usize, r & !V6);
        let live = if fam == 0 { tables.t4.live(slot).is_some() } else { tables.t6.live(slot).is_some() };
        (live && self.origin[fam].get(slot as usize) == Some(sid)).then_some(r)
    }

    fn forget(&mut self, fam: usize, slot: u32) {
        if let Some(o) = self.origin[fam].get_mut(slot as usize) {
            if o.id != 0 || o.creatorid != 0 {
                self.ids.remove(o);
                *o = StateId::default();
            }
        }
    }

    /// The whole state `id`, as insert, update and bulk send it.
    pub fn export<K: Key>(&self, fam: usize, t: &StateTable<K>, id: u32, now: u32, names: &dyn Ifnames) -> StateRec {
        let (s, m) = (t.state(id), t.meta(id));
        let k = &s.key;
        let key_rec = |k: &K| KeyRec { addr: [k.addr(0).0, k.addr(1).0], port: [k.port(0), k.port(1)] };
        let wire_key = key_rec(k);
        let stack_key = t.stack_key(id).map(|k| key_rec(&k)).unwrap_or(wire_key);
        let (src, dst) = peers_out(t.peers(id), s.peer_state);
        let sid = self.sid(fam, t, id);
        let deadline = s.expire.saturating_add(t.timeout_of(id));
        let scrub = t.actions.get(id).map_or(Scrub::NONE, |a| Scrub::unpack(a.scrub));
        StateRec {
            id: sid.id,
            ifname: names.name(k.kif()),
            key: [wire_key, stack_key],
            src,
            dst,
            rule: m.rule,
            anchor: u32::MAX,
            nat_rule: u32::MAX,
            creation: now.saturating_sub(m.creation),
            expire: deadline.saturating_sub(now),
            packets: [s.packets[0] as u64, s.packets[1] as u64],
            bytes: s.bytes,
            creatorid: sid.creatorid,
            af: if fam == 0 { wire::AF_INET } else { wire::AF_INET6 },
            proto: k.proto(),
            direction: if s.flags & sf::OUT != 0 { wire::PF_OUT } else { wire::PF_IN },
            state_flags: if s.timeout & TO_ALLOWOPTS != 0 { wire::PFSTATE_ALLOWOPTS } else { 0 }
                | if s.timeout & TO_SLOPPY != 0 { wire::PFSTATE_SLOPPY } else { 0 }
                | if s.timeout & TO_PFLOW != 0 { wire::PFSTATE_PFLOW } else { 0 }
                | if scrub.no_df { wire::PFSTATE_NODF } else { 0 }
                | if scrub.random_id { wire::PFSTATE_RANDOMID } else { 0 }
                | if scrub.set_tos.is_some() { wire::PFSTATE_SETTOS } else { 0 },
            min_ttl: scrub.min_ttl,
            set_tos: scrub.set_tos.unwrap_or(0),
            max_mss: scrub.max_mss,
            timeout: pftm(s.class()),
            rtableid: -1,
            ..Default::default()
        }
    }

    fn export_c<K: Key>(&self, fam: usize, t: &StateTable<K>, id: u32, now: u32) -> UpdC {
        let s = t.state(id);
        let (src, dst) = peers_out(t.peers(id), s.peer_state);
        let sid = self.sid(fam, t, id);
        UpdC {
            id: sid.id,
            src,
            dst,
            creatorid: sid.creatorid,
            expire: s.expire.saturating_add(t.timeout_of(id)).saturating_sub(now),
            timeout: pftm(s.class()),
        }
    }

    /// Sends what the tables queued when it is time (a frame's worth is waiting, a TCP state
    /// must be pushed (the engine's `sync_count`), or the oldest event has waited a second),
    /// and any answer.
    pub fn poll(&mut self, tables: &mut Tables, now: u32, now_ms: u64, names: &dyn Ifnames) {
        // Answers (update requests, newer states, bulk) do not wait.
        self.flush();
        let n = tables.t4.events_len() + tables.t6.events_len();
        if n == 0 {
            self.first_event_ms = None;
            return;
        }
        let first = *self.first_event_ms.get_or_insert(now_ms);
        // A push goes out at once, but once a millisecond at most: with many busy TCP flows a
        // state reaches its limit after nearly every batch, and a frame per batch would cost
        // a send each.
        let push = (tables.t4.sync_push || tables.t6.sync_push) && now_ms != self.pushed_ms;
        if push || n >= FLUSH_EVENTS || now_ms.saturating_sub(first) >= 1000 {
            if push {
                self.pushed_ms = now_ms;
            }
            self.drain(tables, now, names);
            self.flush();
        }
    }

    /// Turns every queued event into its message.
    pub fn drain(&mut self, tables: &mut Tables, now: u32, names: &dyn Ifnames) {
        self.first_event_ms = None;
        for fam in 0..2 {
            let mut evs = std::mem::take(&mut self.evbuf);
            evs.clear();
            with_table!(tables, fam, |t| {
                t.sync_push = false;
                t.drain_events(|e, _| evs.push(e));
                for e in &evs {
                    match e.kind {
                        xpf_state::EventKind::Insert | xpf_state::EventKind::Update => {
                            if t.live(e.id).is_none() {
                                continue;
                            }
                            if let Some(p) = t.peers_mut(e.id) {
                                p[0].sync_upd = 0;
                            }
                            let m = if e.kind == xpf_state::EventKind::Insert {
                                let mut r = self.export(fam, t, e.id, now, names);
                                if self.defer {
                                    r.state_flags |= wire::PFSTATE_ACK;
                                }
                                Msg::Insert(r)
                            } else {
                                Msg::UpdateC(self.export_c(fam, t, e.id, now))
                            };
                            self.send(m);
                        }
                        xpf_state::EventKind::Delete => {
                            let sid = self.sid(fam, t, e.id);
                            self.send(Msg::DeleteC(sid));
                            if self.note_gone && sid.creatorid != self.creatorid {
                                self.gone.push(sid);
                            }
                            self.forget(fam, e.id);
                        }
                    }
                }
            });
            self.evbuf = evs;
        }
    }

    /// Starts sending every state (a bulk update); [`Replica::bulk_step`] does the work.
    pub fn bulk_start(&mut self) {
        self.bulk = Some((0, 0));
        self.bulk_sent = 0;
    }

    pub fn bulk_running(&self) -> bool {
        self.bulk.is_some()
    }

    /// Exports up to `budget` states of the bulk; true when it is complete.
    pub fn bulk_step(&mut self, tables: &mut Tables, now: u32, budget: u32, names: &dyn Ifnames) -> bool {
        let Some((mut fam, mut slot)) = self.bulk else { return true };
        let mut left = budget;
        while fam < 2 && left > 0 {
            let done = with_table!(tables, fam, |t| {
                let end = t.high_water();
                while slot < end && left > 0 {
                    if t.live(slot).is_some_and(|s| s.flags & sf::NOSYNC == 0) {
                        let r = self.export(fam, t, slot, now, names);
                        self.send(Msg::Update(r));
                        self.bulk_sent += 1;
                    }
                    slot += 1;
                    left -= 1;
                }
                slot >= end
            });
            if done {
                fam += 1;
                slot = 0;
            }
        }
        if fam >= 2 {
            self.bulk = None;
            self.flush();
            true
        } else {
            self.bulk = Some((fam, slot));
            false
        }
    }

    /// Applies one record routed to this worker.
    pub fn apply(&mut self, tables: &mut Tables, m: &Msg, now: u32, names: &dyn Ifnames) {
        match m {
            Msg::Insert(r) | Msg::Update(r) => {
                self.apply_state(tables, r, now, names);
                // Defer mode: the peer holds the state's first packet until we have it.
                let sid = StateId { id: r.id, creatorid: r.creatorid };
                if matches!(m, Msg::Insert(_))
                    && r.state_flags & wire::PFSTATE_ACK != 0
                    && self.find(tables, &sid).is_some()
                {
                    self.send(Msg::InsertAck(sid));
                    self.stats.acks_out += 1;
                }
            }
            Msg::UpdateC(u) => {
                let sid = StateId { id: u.id, creatorid: u.creatorid };
                match self.find(tables, &sid) {
                    None => {
                        self.stats.unknown += 1;
                        self.send(Msg::UpdateReq(sid));
                    }
                    Some(r) => {
                        let (fam, slot) = ((r >> 31) as usize, r & !V6);
                        let stale =
                            with_table!(tables, fam, |t| merge(t, slot, &u.src, &u.dst, u.expire, u.timeout, now));
                        self.after_merge(tables, fam, slot, stale, now, names);
                    }
                }
            }
            Msg::UpdateReq(sid) => {
                if let Some(r) = self.find(tables, sid) {
                    let (fam, slot) = ((r >> 31) as usize, r & !V6);
                    let rec = with_table!(tables, fam, |t| self.export(fam, t, slot, now, names));
                    self.send(Msg::Update(rec));
                    self.stats.requests += 1;
                }
            }
            Msg::DeleteC(sid) => match self.find(tables, sid) {
                Some(r) => {
                    let (fam, slot) = ((r >> 31) as usize, r & !V6);
                    self.remove_quietly(tables, fam, slot);
                    self.stats.deleted += 1;
                }
                None => self.stats.unknown += 1,
            },
            Msg::Clear(c) => self.clear(tables, c, names),
            Msg::InsertAck(sid) => {
                if let Some(r) = self.find(tables, sid) {
                    self.acked.push(r);
                    self.stats.acks_in += 1;
                }
            }
            Msg::Bus(_) => {}
        }
    }

    fn after_merge(&mut self, tables: &mut Tables, fam: usize, slot: u32, stale: bool, now: u32, names: &dyn Ifnames) {
        if stale {
            // Ours is newer: the peer gets it (pf pushes it at once).
            self.stats.stale += 1;
            let rec = with_table!(tables, fam, |t| self.export(fam, t, slot, now, names));
            self.send(Msg::Update(rec));
            self.flush();
        } else {
            self.stats.updated += 1;
        }
    }

    /// Removes a state without telling the peer (it told us), nor exporting its flow (the
    /// peer that ended it did).
    fn remove_quietly(&mut self, tables: &mut Tables, fam: usize, slot: u32) {
        with_table!(tables, fam, |t| {
            let s = t.state_mut(slot);
            s.flags |= sf::NOSYNC;
            s.timeout &= !TO_PFLOW;
            t.remove(slot);
        });
        self.forget(fam, slot);
    }

    /// Every state of creator `c.creatorid` goes; with an interface name, those bound to it.
    fn clear(&mut self, tables: &mut Tables, c: &Clr, names: &dyn Ifnames) {
        let kif = match c.interface() {
            Some(_) => match names.index(&c.ifname) {
                Some(k) => Some(k),
                None => return,
            },
            None => None,
        };
        let victims: Vec<(StateId, u32)> =
            self.ids.iter().filter(|(k, _)| k.creatorid == c.creatorid).map(|(k, r)| (*k, *r)).collect();
        if kif.is_none() && victims.len() == (tables.t4.len() + tables.t6.len()) as usize {
            // Every state here is the clearing peer's (a standby's tables): emptied at once, as
            // this box's own `-F states` empties them, not a random read of each state through
            // the id map (1M states: 14 ms against 369 ms, `xpf-bench sync`).
            let n = tables.t4.remove_all_quietly() + tables.t6.remove_all_quietly();
            self.forget_all();
            self.translated.clear();
            self.emptied = true;
            self.stats.cleared += n as u64;
            return;
        }
        for (sid, r) in victims {
            let (fam, slot) = ((r >> 31) as usize, r & !V6);
            let on = with_table!(tables, fam, |t| t.state(slot).key.kif());
            if kif.is_some_and(|k| k != on) {
                continue;
            }
            self.remove_quietly(tables, fam, slot);
            self.stats.cleared += 1;
            // The sync thread forgets a whole creator at its clear of all states only.
            if self.note_gone && kif.is_some() {
                self.gone.push(sid);
            }
        }
    }

    fn apply_state(&mut self, tables: &mut Tables, r: &StateRec, now: u32, names: &dyn Ifnames) {
        let fam = match r.af {
            wire::AF_INET => 0,
            wire::AF_INET6 => 1,
            _ => {
                self.stats.badstate += 1;
                return;
            }
        };
        let sid = StateId { id: r.id, creatorid: r.creatorid };
        if let Some(x) = self.find(tables, &sid) {
            let slot = x & !V6;
            let stale = with_table!(tables, fam, |t| {
                let s = t.state_mut(slot);
                s.packets = [r.packets[0] as u32, r.packets[1] as u32];
                s.bytes = r.bytes;
                merge(t, slot, &r.src, &r.dst, r.expire, r.timeout, now)
            });
            self.after_merge(tables, fam, slot, stale, now, names);
            return;
        }
        let (Some(kif), Some(class)) = (names.index(&r.ifname), from_pftm(r.timeout)) else {
            self.stats.badstate += 1;
            return;
        };
        if r.direction != wire::PF_IN && r.direction != wire::PF_OUT {
            self.stats.badstate += 1;
            return;
        }
        let res = with_table!(tables, fam, |t| import(t, r, kif, class, now));
        match res {
            Some(slot) => {
                let o = &mut self.origin[fam];
                if o.len() <= slot as usize {
                    o.resize(slot as usize + 1, StateId::default());
                }
                o[slot as usize] = sid;
                let r = slot | if fam == 1 { V6 } else { 0 };
                self.ids.insert(sid, r);
                self.stats.inserted += 1;
                if with_table!(tables, fam, |t| t.stack_key(slot).is_some()) {
                    self.translated.push(r);
                }
            }
            None => self.stats.badstate += 1,
        }
    }
}

fn peer_out(p: Option<&Peer>, state: u8) -> PeerRec {
    let mut r = PeerRec { state, ..Default::default() };
    if let Some(p) = p {
        r.seqlo = p.seqlo;
        r.seqhi = p.seqhi;
        r.seqdiff = p.seqdiff;
        r.max_win = p.max_win;
        r.mss = p.mss;
        r.wscale = p.wscale;
    }
    r
}

fn peers_out(p: Option<&[Peer; 2]>, st: [u8; 2]) -> (PeerRec, PeerRec) {
    (peer_out(p.map(|p| &p[0]), st[0]), peer_out(p.map(|p| &p[1]), st[1]))
}

fn peer_in(p: &mut Peer, r: &PeerRec) {
    p.seqlo = r.seqlo;
    p.seqhi = r.seqhi;
    p.seqdiff = r.seqdiff;
    p.max_win = r.max_win;
    p.mss = r.mss;
    p.wscale = r.wscale;
}

fn seq_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// Takes a peer's view of state `slot` unless ours is newer (pfsync_upd_tcp: a peer's TCP
/// state never goes backwards, nor does its window). True when ours was newer (stale).
fn merge<K: Key>(
    t: &mut StateTable<K>,
    slot: u32,
    src: &PeerRec,
    dst: &PeerRec,
    expire: u32,
    timeout: u8,
    now: u32,
) -> bool {
    let tcp = t.state(slot).key.proto() == TCP;
    let st = t.state(slot).peer_state;
    let mut stale = 0;
    let mut take = [true, true];
    if tcp {
        let seqlo = t.peers(slot).map(|p| [p[0].seqlo, p[1].seqlo]);
        if st[0] > src.state || (st[0] == src.state && seqlo.is_some_and(|s| seq_gt(s[0], src.seqlo))) {
            stale += 1;
            take[0] = false;
        }
        if st[1] > dst.state || (st[1] >= TCPS_SYN_SENT && seqlo.is_some_and(|s| seq_gt(s[1], dst.seqlo))) {
            stale += 1;
            take[1] = false;
        }
    }
    if let Some(p) = t.peers_mut(slot) {
        if take[0] {
            peer_in(&mut p[0], src);
        }
        if take[1] {
            peer_in(&mut p[1], dst);
        }
    }
    let s = t.state_mut(slot);
    if take[0] {
        s.peer_state[0] = src.state;
    }
    if take[1] {
        s.peer_state[1] = dst.state;
    }
    let after = s.peer_state;
    if tcp {
        t.protostate_changed(st, after);
    }
    let s = t.state_mut(slot);
    if stale < 2 {
        if let Some(c) = from_pftm(timeout) {
            s.set_class(c);
        }
        let full = t.timeouts().get(t.state(slot).class());
        t.state_mut(slot).expire = now.saturating_sub(full.saturating_sub(expire));
    }
    stale > 0
}

/// Inserts the state of record `r` (not offered back to sync); its slot.
fn import<K: Key>(t: &mut StateTable<K>, r: &StateRec, kif: u16, class: Timeout, now: u32) -> Option<u32> {
    let key_of = |k: &KeyRec| K::from_parts(r.proto, [Addr(k.addr[0]), Addr(k.addr[1])], k.port, kif);
    let key = key_of(&r.key[0]);
    let stack = key_of(&r.key[1]);
    let sloppy = r.state_flags & wire::PFSTATE_SLOPPY != 0;
    let tcp = (r.proto == TCP && !sloppy).then(|| {
        let mut p = [Peer::default(); 2];
        peer_in(&mut p[0], &r.src);
        peer_in(&mut p[1], &r.dst);
        p
    });
    let ns = NewState {
        key,
        stack: (stack != key).then_some(stack),
        dir: if r.direction == wire::PF_OUT { Dir::Out } else { Dir::In },
        rule: r.rule,
        timeout: class,
        src_state: r.src.state,
        dst_state: r.dst.state,
        tcp,
        nosync: true,
        allow_opts: r.state_flags & wire::PFSTATE_ALLOWOPTS != 0,
        sloppy,
        // pfsync carries no tag and no packet rate; the scrub actions it does.
        tag: 0,
        scrub: Scrub {
            no_df: r.state_flags & wire::PFSTATE_NODF != 0,
            random_id: r.state_flags & wire::PFSTATE_RANDOMID != 0,
            min_ttl: r.min_ttl,
            set_tos: (r.state_flags & wire::PFSTATE_SETTOS != 0).then_some(r.set_tos),
            max_mss: r.max_mss,
            id: 0,
            tcp_clean: false,
        }
        .pack(),
        rate: 0,
        // Not exported here: the peer that made the state exports its flow (records from
        // both would count it twice; the counts synced are the peer's).
        pflow: false,
        log: 0,
        queue: 0,
        route: 0,
        // The peer's translation made it: it holds nothing of this box's allocator until the
        // engine takes it in (`translated`, `Worker::adopt`).
        held: 0,
    };
    let h = t.hash(&key);
    let slot = t.insert(h, ns, now).ok()?;
    let full = t.timeouts().get(class);
    t.meta_mut(slot).creation = now.saturating_sub(r.creation);
    let s = t.state_mut(slot);
    s.flags &= !sf::NOSYNC;
    s.expire = now.saturating_sub(full.saturating_sub(r.expire));
    s.packets = [r.packets[0] as u32, r.packets[1] as u32];
    s.bytes = r.bytes;
    Some(slot)
}

/// The worker (of `workers`) that applies records about `sid`: ours name theirs; a peer's
/// go by a hash of the id, so every record about one state reaches the same worker.
pub fn owner(sid: &StateId, creatorid: u32, workers: usize) -> usize {
    if sid.creatorid == creatorid {
        return ((sid.id >> 56) as usize).min(workers.saturating_sub(1));
    }
    let h = (sid.id ^ (sid.creatorid as u64).rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 32) as usize) % workers.max(1)
}

/// The state a record is about.
pub fn sid_of(m: &Msg) -> Option<StateId> {
    match m {
        Msg::Insert(r) | Msg::Update(r) => Some(StateId { id: r.id, creatorid: r.creatorid }),
        Msg::UpdateC(u) => Some(StateId { id: u.id, creatorid: u.creatorid }),
        Msg::UpdateReq(s) | Msg::DeleteC(s) | Msg::InsertAck(s) => Some(*s),
        Msg::Clear(_) | Msg::Bus(_) => None,
    }
}
