//! State sync's I/O: IP protocol 240 on the sync interface, to the peer (`--sync-peer`) or
//! the group 224.0.0.240, TTL 255 both ways; the sync thread that receives, checks and routes
//! records; and each worker's part, which sends its own tables' events (no lock between
//! workers) and applies the records routed to it between batches.

use crate::dataplane::{Cmd, Wake};
use crate::defer::{Defer, DeferStats, Released};
use crate::policy::Live;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use xpf_engine::Worker;
pub use xpf_io::rawip::Transport;
use xpf_sync::replica::ApplyStats;
use xpf_sync::wire::{self, IFNAMSIZ};
use xpf_sync::{replica, BulkIn, BulkOut, Config, Endpoint, Ifnames, Msg, Replica, Stats, Tables};

/// `--sync-*`.
#[derive(Debug, Clone)]
pub struct SyncArgs {
    pub dev: String,
    pub peer: Option<Ipv4Addr>,
    /// The shared key's file (`--sync-key FILE`).
    pub key_file: Option<String>,
    pub maxupd: u8,
    pub hostid: Option<u32>,
    /// `--sync-defer`: hold a new state's first packet until the peer has the state.
    pub defer: bool,
}

/// The MTU of `dev` (1500 if it cannot be read).
pub fn mtu(dev: &str) -> usize {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500)
}

/// Interface names by index, from the kernel, cached.
#[derive(Default)]
pub struct SysNames(RefCell<HashMap<u16, [u8; IFNAMSIZ]>>);

impl Ifnames for SysNames {
    fn name(&self, kif: u16) -> [u8; IFNAMSIZ] {
        if kif == 0 {
            return wire::ifname("all");
        }
        *self.0.borrow_mut().entry(kif).or_insert_with(|| {
            wire::ifname(&xpf_xdp::netlink::ifname(kif as u32).unwrap_or_else(|| format!("if{kif}")))
        })
    }
    fn index(&self, name: &[u8; IFNAMSIZ]) -> Option<u16> {
        let n = wire::ifname_str(name)?;
        if n == "all" {
            return Some(0);
        }
        xpf_xdp::netlink::ifindex(n).ok().and_then(|i| u16::try_from(i).ok())
    }
}

/// What every side reports, for `xpfctl -s info`.
#[derive(Debug, Default, Clone)]
pub struct WorkerReport {
    pub frames: u64,
    pub bytes: u64,
    pub send_errors: u64,
    pub events_dropped: u64,
    pub imported: u64,
    /// What the worker's replica applied (its own counters).
    pub apply: ApplyStats,
    pub defer: DeferStats,
}

pub struct Shared {
    pub workers: Vec<Mutex<WorkerReport>>,
    pub endpoint: Mutex<(Stats, String, String)>,
    /// Workers still exporting the bulk update in progress.
    pub bulk_left: AtomicUsize,
    pub bulk_sent: AtomicU64,
    pub stop: AtomicBool,
    pub dev: String,
    pub peer: String,
    pub auth: bool,
    pub defer: bool,
    pub creatorid: u32,
    /// With several workers: peers' states the workers removed themselves, or a worker that
    /// removed all its states, for the sync thread to forget where it placed them.
    pub placed_gone: Mutex<Vec<Gone>>,
    /// Peers' states the sync thread knows the worker of (several workers).
    pub placed: AtomicU64,
}

/// What a worker tells the sync thread it no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    State(wire::StateId),
    /// `-F states`: every state of this worker.
    Worker(u8),
}

/// A worker's part.
pub struct WorkerSync {
    pub rep: Replica,
    /// Defer mode's held packets (`--sync-defer`).
    pub defer: Option<Defer>,
    tx: Transport,
    names: SysNames,
    shared: Arc<Shared>,
    index: usize,
    start: Instant,
    last_report: u64,
    last_bulk_ms: u64,
    frames: u64,
    bytes: u64,
    errors: u64,
}

impl WorkerSync {
    pub fn new(cfg: &Config, index: usize, tx: Transport, shared: Arc<Shared>) -> WorkerSync {
        let mut rep = Replica::new(cfg, index as u8);
        rep.note_gone = shared.workers.len() > 1;
        WorkerSync {
            rep,
            defer: cfg.defer.then(Defer::default),
            tx,
            names: SysNames::default(),
            shared,
            index,
            start: Instant::now(),
            last_report: 0,
            last_bulk_ms: 0,
            frames: 0,
            bytes: 0,
            errors: 0,
        }
    }

    /// Between batches: bulk export, events out, frames sent, counters published each second.
    pub fn poll(&mut self, w: &mut Worker<Live>, now: u32) {
        let ms = self.start.elapsed().as_millis() as u64;
        let mut t = Tables { t4: &mut w.t4, t6: &mut w.t6 };
        // A bulk is paced (replica::BULK_PER_MS) so that the standby's socket buffer is not
        // overrun.
        let budget = (ms.saturating_sub(self.last_bulk_ms) * replica::BULK_PER_MS).min(4 * replica::BULK_PER_MS) as u32;
        self.last_bulk_ms = ms;
        if self.rep.bulk_running() && self.rep.bulk_step(&mut t, now, budget.max(1), &self.names) {
            self.shared.bulk_sent.fetch_add(self.rep.bulk_sent, Ordering::Relaxed);
            self.send_ready();
            self.shared.bulk_left.fetch_sub(1, Ordering::Release);
        }
        self.rep.poll(&mut t, now, ms, &self.names);
        self.send_ready();
        if ms >= self.last_report + 1000 {
            self.last_report = ms;
            let s = self.rep.stats;
            *self.shared.workers[self.index].lock().unwrap() = WorkerReport {
                frames: self.frames,
                bytes: self.bytes,
                send_errors: self.errors,
                events_dropped: w.t4.events_dropped() + w.t6.events_dropped(),
                imported: self.rep.imported() as u64,
                apply: s,
                defer: self.defer.as_ref().map(|d| d.stats).unwrap_or_default(),
            };
        }
    }

    fn send_ready(&mut self) {
        if !self.rep.gone.is_empty() {
            self.shared.placed_gone.lock().unwrap().extend(self.rep.gone.drain(..).map(Gone::State));
        }
        for f in self.rep.ready.drain(..) {
            if self.tx.send(&f) {
                self.frames += 1;
                self.bytes += f.len() as u64;
            } else {
                self.errors += 1;
            }
        }
    }

    /// Applies the records routed to this worker; packets held for the inserts they
    /// acknowledge are added to `released`.
    pub fn apply(&mut self, w: &mut Worker<Live>, msgs: &[Msg], now: u32, released: &mut Released) {
        let mut t = Tables { t4: &mut w.t4, t6: &mut w.t6 };
        for m in msgs {
            self.rep.apply(&mut t, m, now, &self.names);
        }
        // The translation takes in the peer's translated states (and lets go of them when a
        // clear emptied the tables): a standby that takes over keeps their ports, mappings
        // and counts.
        if std::mem::take(&mut self.rep.emptied) {
            w.peer_emptied(now);
        }
        if !self.rep.translated.is_empty() {
            w.adopt(&self.rep.translated);
            self.rep.translated.clear();
        }
        if let Some(d) = &mut self.defer {
            d.acked(&self.rep.acked, Instant::now(), released);
        }
        self.rep.acked.clear();
    }

    /// Sends the answers the applied records called for.
    pub fn answer(&mut self) {
        self.rep.flush();
        self.send_ready();
    }

    /// `-F states` with sync: the events queued before go out, then every state goes without
    /// its own delete and one clear tells the peer (as pf). Returns the states removed.
    pub fn flush_states(&mut self, w: &mut Worker<Live>, now: u32) -> u32 {
        self.send_now(w, now);
        let n = w.remove_all_states(false, now);
        self.rep.cleared();
        if self.rep.note_gone {
            self.shared.placed_gone.lock().unwrap().push(Gone::Worker(self.index as u8));
        }
        self.send_ready();
        n
    }

    /// Sends what is queued now (defer mode: the inserts of the states whose packets wait).
    pub fn send_now(&mut self, w: &mut Worker<Live>, now: u32) {
        let mut t = Tables { t4: &mut w.t4, t6: &mut w.t6 };
        self.rep.drain(&mut t, now, &self.names);
        self.rep.flush();
        self.send_ready();
    }
}

fn bulk_text(b: &BulkIn) -> String {
    match b {
        BulkIn::Idle => "idle".into(),
        BulkIn::Requested { tries, .. } => format!("requested (try {tries})"),
        BulkIn::Receiving { states, started, last, .. } => {
            format!("receiving: {states} states so far ({} ms)", last.saturating_sub(*started))
        }
        BulkIn::Done { states, ms, .. } => format!("done: {states} states in {:.1} s", *ms as f64 / 1000.0),
        BulkIn::Failed => "failed (no answer)".into(),
    }
}

fn bulk_out_text(b: &BulkOut, sent: u64) -> String {
    match b {
        BulkOut::Idle => "idle".into(),
        BulkOut::Sending { .. } => format!("sending: {sent} states so far"),
        BulkOut::Done { states, ms } => format!("done: {states} states in {:.1} s", *ms as f64 / 1000.0),
    }
}

/// The worker that holds (or is to hold) the state a record is about. Ours: the worker its
/// id names. A peer's, with several workers: the owner of its flow (the worker its packets
/// are handed to; `nat`, the ruleset's translations as the hand-off owns them), known from
/// the records that carry the key and remembered for those that carry only the id
/// (forgotten at the state's delete).
fn route(
    m: &Msg,
    sid: &wire::StateId,
    creatorid: u32,
    n: usize,
    nat: &crate::handoff::NatOwners,
    placed: &mut HashMap<wire::StateId, u8>,
) -> usize {
    if n <= 1 || sid.creatorid == creatorid {
        return replica::owner(sid, creatorid, n);
    }
    if let Msg::Insert(r) | Msg::Update(r) = m {
        // The stack key (the flow before translation): a translated state's flow is owned as
        // the packets before translation are, and its translated port is of that worker's
        // residue (docs/nat.md).
        let k = &r.key[1];
        let out = (r.direction == wire::PF_OUT).then_some(&r.key[0].addr);
        let w = nat.synced_owner(r.af == wire::AF_INET, r.proto, &k.addr, k.port, out, n);
        placed.insert(*sid, w as u8);
        return w;
    }
    let w = placed.get(sid).map_or_else(|| replica::owner(sid, creatorid, n), |&w| w as usize);
    if matches!(m, Msg::DeleteC(_)) {
        placed.remove(sid);
    }
    w
}

/// Puts a received record in the batch of the worker it concerns (a clear in every worker's).
fn dispatch(
    m: Msg,
    creatorid: u32,
    nat: &crate::handoff::NatOwners,
    placed: &mut HashMap<wire::StateId, u8>,
    per: &mut [Vec<Msg>],
) {
    match replica::sid_of(&m) {
        Some(sid) => {
            let w = route(&m, &sid, creatorid, per.len(), nat, placed);
            per[w].push(m)
        }
        None => {
            // A clear of all the peer's states also forgets where they were placed. Which
            // states an interface's clear ends is not known here: the workers report them, as
            // they report the peer's states they remove themselves.
            if let Msg::Clear(c) = &m {
                if c.interface().is_none() && c.creatorid != creatorid {
                    placed.retain(|sid, _| sid.creatorid != c.creatorid);
                }
            }
            per.iter_mut().for_each(|v| v.push(m))
        }
    }
}

/// Forgets where the states the workers no longer hold were placed.
fn forget_placed(placed: &mut HashMap<wire::StateId, u8>, gone: &[Gone]) {
    for g in gone {
        match g {
            Gone::State(sid) => {
                placed.remove(sid);
            }
            Gone::Worker(w) => placed.retain(|_, x| x != w),
        }
    }
}

/// The sync thread: receives frames, checks them, routes records to their workers, runs the
/// bulk state machines, and sends its own frames (update requests, bulk status).
pub fn run(
    mut ep: Endpoint,
    tx: Transport,
    workers: Vec<Sender<Cmd>>,
    wakes: Vec<Arc<Wake>>,
    shared: Arc<Shared>,
    mut rules: Live,
) {
    let start = Instant::now();
    let mut buf = vec![0u8; 65536];
    let mut msgs = Vec::new();
    let mut per: Vec<Vec<Msg>> = vec![Vec::new(); workers.len()];
    let mut placed = std::collections::HashMap::new();
    let mut nat = crate::handoff::NatOwners::of(rules.current().1);
    let mut last_log = 0u64;
    ep.request_bulk(0);
    log::info!("sync: asking the peer for a bulk update");
    while !shared.stop.load(Ordering::Relaxed) {
        tx.wait(10);
        let ms = start.elapsed().as_millis() as u64;
        // What the workers removed before this round's records are placed (a state removed
        // here and sent again by the peer is placed again).
        if workers.len() > 1 {
            let gone = std::mem::take(&mut *shared.placed_gone.lock().unwrap());
            forget_placed(&mut placed, &gone);
            shared.placed.store(placed.len() as u64, Ordering::Relaxed);
        }
        let mut got = 0;
        while let Some(n) = tx.recv(&mut buf) {
            got += 1;
            let p = &buf[..n];
            let ihl = ((p[0] & 0x0f) as usize) * 4;
            if n < ihl || p[0] >> 4 != 4 {
                ep.stats.ipackets += 1;
                ep.stats.hdrops += 1;
                continue;
            }
            let ttl = p[8];
            if ep.receive(ms, &p[ihl..], ttl, &mut msgs).is_err() {
                continue;
            }
            if rules.refresh() {
                nat = crate::handoff::NatOwners::of(rules.current().1);
            }
            for m in msgs.drain(..) {
                dispatch(m, ep.cfg.creatorid, &nat, &mut placed, &mut per);
            }
            if got >= 256 {
                break;
            }
        }
        for (w, v) in per.iter_mut().enumerate() {
            if !v.is_empty() {
                let _ = workers[w].send(Cmd::Sync(std::mem::take(v)));
                wakes[w].ring();
            }
        }
        ep.poll(ms);
        if ep.bulk_wanted && shared.bulk_left.load(Ordering::Acquire) == 0 {
            log::info!("sync: the peer asked for a bulk update; sending every state");
            shared.bulk_sent.store(0, Ordering::Relaxed);
            shared.bulk_left.store(workers.len(), Ordering::Release);
            ep.bulk_started(ms);
            for f in ep.transmit() {
                tx.send(&f);
            }
            for w in &workers {
                let _ = w.send(Cmd::SyncBulk);
            }
        }
        if matches!(ep.bulk_out, BulkOut::Sending { .. }) && shared.bulk_left.load(Ordering::Acquire) == 0 {
            let n = shared.bulk_sent.load(Ordering::Relaxed);
            ep.bulk_done(ms, n);
            log::info!("sync: bulk update sent: {}", bulk_out_text(&ep.bulk_out, n));
        }
        let before = ep.bulk_in;
        for f in ep.transmit() {
            tx.send(&f);
        }
        if ms >= last_log + 1000 || before != ep.bulk_in {
            if let BulkIn::Receiving { .. } = ep.bulk_in {
                if ms >= last_log + 1000 {
                    log::info!("sync: bulk update {}", bulk_text(&ep.bulk_in));
                }
            }
            last_log = ms;
        }
        let sent = shared.bulk_sent.load(Ordering::Relaxed);
        *shared.endpoint.lock().unwrap() = (ep.stats, bulk_text(&ep.bulk_in), bulk_out_text(&ep.bulk_out, sent));
        if let BulkIn::Done { .. } | BulkIn::Failed = ep.bulk_in {
            if before != ep.bulk_in {
                log::info!("sync: bulk update {}", bulk_text(&ep.bulk_in));
            }
        }
    }
}

/// `xpfctl -s info`'s sync section, and its JSON.
pub fn render(s: &Shared) -> (String, serde_json::Value) {
    use std::fmt::Write;
    let (st, bin, bout) = s.endpoint.lock().unwrap().clone();
    let mut w = WorkerReport::default();
    for r in &s.workers {
        let r = r.lock().unwrap();
        w.frames += r.frames;
        w.bytes += r.bytes;
        w.send_errors += r.send_errors;
        w.events_dropped += r.events_dropped;
        w.imported += r.imported;
        w.apply.add(&r.apply);
        w.defer.add(&r.defer);
    }
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Sync (pfsync 1400) on {} to {}, creator id {:08x}, authentication {}",
        s.dev,
        s.peer,
        s.creatorid,
        if s.auth { "on" } else { "off" }
    );
    // (key for JSON and metrics, text, value).
    let rows: [(&str, &str, u64); 25] = [
        ("frames_sent", "frames sent", w.frames + st.opackets),
        ("bytes_sent", "bytes sent", w.bytes + st.obytes),
        ("send_errors", "send errors", w.send_errors),
        ("events_lost", "events lost (queue full)", w.events_dropped),
        ("frames_received", "frames received", st.ipackets),
        ("bad_ttl", "bad: ttl not 255", st.badttl),
        ("bad_short", "bad: short", st.hdrops),
        ("bad_version", "bad: version", st.badver),
        ("bad_action", "bad: action", st.badact),
        ("bad_length", "bad: length", st.badlen),
        ("bad_auth", "bad: authentication", st.badauth),
        ("bad_replayed", "bad: replayed", st.replayed),
        ("records_skipped", "records skipped", st.skipped),
        ("states_inserted", "states inserted", w.apply.inserted),
        ("states_updated", "states updated", w.apply.updated),
        ("states_deleted", "states deleted", w.apply.deleted),
        ("states_cleared", "states cleared", w.apply.cleared),
        ("stale_updates", "stale updates", w.apply.stale),
        ("unknown_requested", "unknown (requested)", w.apply.unknown),
        ("refused_records", "refused records", w.apply.badstate),
        ("requests_answered", "requests answered", w.apply.requests),
        ("states_from_peers", "states from peers", w.imported),
        ("peer_states_placed", "peer states placed", s.placed.load(Ordering::Relaxed)),
        ("acks_received", "insert acks received", w.apply.acks_in),
        ("acks_sent", "insert acks sent", w.apply.acks_out),
    ];
    for (key, k, v) in &rows {
        // With one worker nothing is placed: the row would read 0 beside the states held.
        if *key == "peer_states_placed" && s.workers.len() <= 1 {
            continue;
        }
        let _ = writeln!(t, "  {:<25} {:>14}", k, v);
    }
    if s.defer {
        let d = &w.defer;
        let _ = writeln!(
            t,
            "  {:<25} {:>14}   released: {} acknowledged (after {:.2} ms on average, {:.2} at most), {} timed out, {} queue full; {} held now",
            "packets deferred",
            d.held,
            d.released_ack,
            d.ack_us_sum as f64 / d.released_ack.max(1) as f64 / 1000.0,
            d.ack_us_max as f64 / 1000.0,
            d.released_timeout,
            d.released_full,
            d.waiting
        );
    }
    let _ = writeln!(t, "  {:<25} {}", "bulk update received", bin);
    let _ = writeln!(t, "  {:<25} {}", "bulk update sent", bout);
    let mut m: serde_json::Map<String, serde_json::Value> =
        rows.iter().map(|(k, _, v)| (k.to_string(), serde_json::json!(v))).collect();
    m.insert("defer".into(), serde_json::json!({ "on": s.defer, "stats": w.defer }));
    m.insert("bulk_in".into(), serde_json::json!(bin));
    m.insert("bulk_out".into(), serde_json::json!(bout));
    (t, serde_json::Value::Object(m))
}

/// The endpoint's configuration from the flags: creator id, key, frame size.
/// The creator id is --sync-hostid, else pf.conf's `set hostid` (`conf`), else random.
pub fn config(a: &SyncArgs, conf: Option<u32>, cksum: [u8; 16]) -> Result<Config, String> {
    let creatorid = a.hostid.or(conf).unwrap_or_else(|| loop {
        let mut b = [0u8; 4];
        // SAFETY: getrandom writes at most 4 bytes into b.
        unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
        let v = u32::from_ne_bytes(b);
        if v != 0 {
            break v;
        }
    });
    let mut c = Config::new(creatorid);
    c.cksum = cksum;
    c.defer = a.defer;
    c.max_frame = mtu(&a.dev).saturating_sub(20).clamp(wire::HEADER_LEN + 400, 65000);
    c.epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(1);
    if let Some(f) = &a.key_file {
        let k = std::fs::read(f).map_err(|e| format!("--sync-key {f}: {e}"))?;
        let k = String::from_utf8_lossy(&k).trim().as_bytes().to_vec();
        c.key = Some(xpf_sync::auth::Key::new(&k).map_err(|e| format!("--sync-key {f}: {e}"))?);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_clear_of_all_its_states_forgets_where_they_were_placed() {
        let (ours, peer, other) = (0xa, 0xb, 0xc);
        let mut placed = HashMap::new();
        let mut per = vec![Vec::new(), Vec::new()];
        let insert = |creatorid: u32, id: u64, last: u8| {
            let mut r = wire::StateRec { id, creatorid, af: wire::AF_INET, ..Default::default() };
            r.key[1].addr[0][..4].copy_from_slice(&[10, 0, 0, last]);
            r.key[1].addr[1][..4].copy_from_slice(&[192, 0, 2, 1]);
            Msg::Insert(r)
        };
        for id in 0..20 {
            dispatch(insert(peer, id, id as u8), ours, &Default::default(), &mut placed, &mut per);
            dispatch(insert(other, id, id as u8), ours, &Default::default(), &mut placed, &mut per);
        }
        assert_eq!(placed.len(), 40);
        assert!(per.iter().all(|v| !v.is_empty()), "the flows spread over both workers");
        let clear = |creatorid: u32, ifname: &str| Msg::Clear(wire::Clr { ifname: wire::ifname(ifname), creatorid });
        // An interface's clear: the states it ends are not known here (the workers say).
        dispatch(clear(peer, "eth1"), ours, &Default::default(), &mut placed, &mut per);
        assert_eq!(placed.len(), 40);
        dispatch(clear(peer, "all"), ours, &Default::default(), &mut placed, &mut per);
        assert_eq!(placed.len(), 20);
        assert!(placed.keys().all(|sid| sid.creatorid == other), "the other creator's stay");
        dispatch(clear(other, ""), ours, &Default::default(), &mut placed, &mut per);
        assert!(placed.is_empty());
        let clears = |v: &Vec<Msg>| v.iter().filter(|m| matches!(m, Msg::Clear(_))).count();
        assert!(per.iter().all(|v| clears(v) == 3), "every clear reaches every worker");
    }

    #[test]
    fn what_the_workers_no_longer_hold_is_forgotten() {
        let sid = |id: u64| wire::StateId { id, creatorid: 0xb };
        let mut placed: HashMap<wire::StateId, u8> = (0..10).map(|i| (sid(i), (i % 2) as u8)).collect();
        forget_placed(&mut placed, &[Gone::State(sid(0)), Gone::State(sid(99))]);
        assert_eq!(placed.len(), 9);
        forget_placed(&mut placed, &[Gone::Worker(1)]);
        assert_eq!(placed.keys().map(|s| s.id).collect::<std::collections::BTreeSet<_>>(), [2, 4, 6, 8].into());
    }

    #[test]
    fn hostid_names_the_sync_creator() {
        let a = SyncArgs { dev: "s".into(), peer: None, key_file: None, maxupd: 128, hostid: None, defer: false };
        assert_eq!(config(&a, Some(0x1234), [0; 16]).unwrap().creatorid, 0x1234, "set hostid");
        let flag = SyncArgs { hostid: Some(7), ..a };
        assert_eq!(config(&flag, Some(0x1234), [0; 16]).unwrap().creatorid, 7, "--sync-hostid wins");
    }
}
