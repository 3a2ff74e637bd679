//! The userspace half of the kernel fast path (`xpfd --fastpath`).
//!
//! xpfd puts a flow it forwarded into the steering program's flow tables (bpf/steer.c,
//! `xpf_xdp::flows`; memory mapped here, written without system calls), naming a record of
//! this worker's by slot. Later packets of the flow, in that direction, are forwarded by the
//! program itself and counted in the entry:
//! - UDP, once its `in` state has seen two packets (one-packet flows never cost an entry);
//! - TCP, once both peers of both states are ESTABLISHED and nothing but pf's windows
//!   applies to its segments ([`xpf_engine::Worker::fast_tcp`]).
//! - Translated flows as well: the entry (keyed as the packets arrive) gets a rewrite record
//!   (the flow as it leaves: [`xpf_xdp::flows::Table::set_rewrite`]), and the program rewrites
//!   its packets. An entry names its two states by id and insert sequence
//!   ([`xpf_engine::FlowRef`]), which a translation does not change. Both directions go in
//!   together, with the states' windows; the program checks each segment as pf does and
//!   slides the windows in the entries. What it cannot judge (SYN, FIN, RST, outside the
//!   windows, a sync update due) comes to xpfd marked: xpfd first merges the entries' windows
//!   into its states ([`FastPath::pull`]), the engine judges the segment as usual, and
//!   [`FastPath::settle`] then writes the windows back, or takes the flow back when it is no
//!   longer established. The userspace engine stays the authority: an entry only ever
//!   lags its state (a window a moment behind makes the program hand a segment over, never
//!   pass one pf would drop).
//!
//! A read-back pass visits this worker's records (a slice per call: a million flows never
//! stall the worker), carries the counts into both states (which keeps them from expiring),
//! merges TCP windows (so `-s states` and sync see them) and takes back the flows whose
//! states are gone (killed with -k, flushed; at once after -k/-F) or idle and due to expire
//! before the next pass (a late packet then meets xpfd, as in pf, not an entry). Passes come
//! every third of the shortest UDP/TCP-established timeout, at most every 10 s: a state
//! cannot expire unseen; with pflow's active records (`--pflow-active S`) every S/2 at most. A flow taken back is held (the program stops matching it), read a
//! last time after [`GRACE`], then freed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpf_engine::Policy as _;
use xpf_engine::{FlowRef, Win, Worker};
use xpf_state::{Peer, Timeout};
use xpf_xdp::flows::{seq_max, FlowKey, FlowTables, Tail};

use crate::policy::Live;

/// The longest interval between read-back passes; shorter when timeouts are short.
const SYNC_MAX: Duration = Duration::from_secs(10);
/// The index of a record's protocol in `FastPath::by_proto`.
fn proto_index(proto: u8) -> usize {
    match proto {
        6 => 0,
        17 => 1,
        _ => 2,
    }
}

/// Records visited per slice of a pass.
const SLICE: usize = 4096;
/// After REFUSED_RUN refusals in a row (a table near full: at half load, 1 flow in 2,500 finds
/// its probe window full), offers wait this long.
const BACKOFF: Duration = Duration::from_secs(1);
const REFUSED_RUN: u32 = 64;
/// A UDP flow is offered once its `in` state has seen this many packets in the offered
/// direction.
const OFFER_AFTER: u32 = 2;
/// How long a flow taken back stays held before its last read and release: far longer than
/// a program run that matched the entry before it was held (microseconds).
pub const GRACE: Duration = Duration::from_millis(2);

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct FastStats {
    /// Flow directions in the tables now (this worker's; TCP among them), installed and
    /// removed since start.
    pub flows: u64,
    pub tcp: u64,
    /// Translated (among `flows`): the program rewrites their packets.
    pub translated: u64,
    pub installed: u64,
    pub removed: u64,
    /// No room: the probe window of the flow's hash was full (--fastpath FLOWS sizes the
    /// tables).
    pub refused: u64,
    /// TCP segments the program handed over to be judged here (SYN/FIN/RST, outside its
    /// windows, a sync update due), and flows taken back from it (no longer established).
    pub judged: u64,
    pub taken_back: u64,
    /// Packets and bytes the kernel forwarded, as carried into the states.
    pub packets: u64,
    pub bytes: u64,
    /// The last complete read-back pass: worker time it took (summed over its slices) and
    /// records it visited.
    pub last_pass_us: u64,
    pub last_pass_entries: u64,
}

impl FastStats {
    /// Adds another worker's (counts add up; the pass figures are the slowest worker's).
    pub fn add(&mut self, g: &FastStats) {
        self.flows += g.flows;
        self.tcp += g.tcp;
        self.translated += g.translated;
        self.installed += g.installed;
        self.removed += g.removed;
        self.refused += g.refused;
        self.judged += g.judged;
        self.taken_back += g.taken_back;
        self.packets += g.packets;
        self.bytes += g.bytes;
        self.last_pass_us = self.last_pass_us.max(g.last_pass_us);
        self.last_pass_entries = self.last_pass_entries.max(g.last_pass_entries);
    }
}

/// Which egress interfaces take redirected frames (`Steer::probe_egress`), shared by xpfd's
/// main thread (which probes them) and the workers (which install flows only towards those
/// that do, and take back their flows towards one that stopped).
pub struct Egresses {
    ok: Vec<(u32, Arc<AtomicBool>)>,
    /// Bumped on every change.
    pub generation: AtomicU32,
}

impl Egresses {
    pub fn new(ifindexes: &[u32]) -> Egresses {
        Egresses {
            ok: ifindexes.iter().map(|&i| (i, Arc::new(AtomicBool::new(false)))).collect(),
            generation: AtomicU32::new(0),
        }
    }

    /// The flag of one interface, for a reader that keeps it (a port's transmit lane).
    pub fn flag(&self, ifindex: u32) -> Option<Arc<AtomicBool>> {
        self.ok.iter().find(|(i, _)| *i == ifindex).map(|(_, f)| f.clone())
    }

    /// Whether any interface takes redirected frames.
    pub fn any(&self) -> bool {
        self.ok.iter().any(|(_, ok)| ok.load(Relaxed))
    }

    pub fn ok(&self, ifindex: u32) -> bool {
        self.ok.iter().any(|(i, ok)| *i == ifindex && ok.load(Relaxed))
    }

    /// Records a probe's answer; true when it changed.
    pub fn set(&self, ifindex: u32, ok: bool) -> bool {
        let Some((_, f)) = self.ok.iter().find(|(i, _)| *i == ifindex) else { return false };
        let changed = f.swap(ok, Relaxed) != ok;
        if changed {
            self.generation.fetch_add(1, Relaxed);
        }
        changed
    }
}

/// A worker's record of a flow direction it installed.
struct Rec {
    /// The flow as its packets come in, and as they leave when translated.
    key: FlowKey,
    sent: Option<FlowKey>,
    /// The entry in its family's table.
    idx: u32,
    in_if: u32,
    out_if: u32,
    /// The `in` and `out` states.
    states: FlowRef,
    /// The counts already carried into the states.
    packets: u32,
    bytes: u64,
    /// TCP: the reverse direction's record, and this direction's sender's side in the states.
    tcp: Option<(u32, usize)>,
    /// Taken back: held, waiting for its last read.
    held: bool,
}

pub struct FastPath {
    tables: Arc<FlowTables>,
    egresses: Arc<Egresses>,
    /// The egresses' generation this worker last acted on.
    egress_gen: u32,
    /// pf was disabled, or the ruleset had scrub rules with options, when [`FastPath::sync`]
    /// last looked: the flows came back, none is offered.
    disabled: bool,
    owner: u8,
    recs: Vec<Option<Rec>>,
    free: Vec<u32>,
    mine: HashMap<(u32, FlowKey), u32>,
    /// Translated flows by their key as they leave (what an ICMP error about them quotes).
    sent: HashMap<FlowKey, u32>,
    last_sync: Instant,
    /// Records by protocol (TCP, UDP, ICMP): the timeouts a pass must beat are those of the
    /// protocols the tables hold.
    by_proto: [u32; 3],
    /// The pass under way: the next record to visit.
    walking: Option<usize>,
    refused_at: Option<Instant>,
    refused_run: u32,
    /// Records held, with when: read a last time and freed after GRACE.
    cooling: VecDeque<(Instant, u32)>,
    pass_time: Duration,
    pass_entries: u64,
    pub stats: FastStats,
}

/// The entry fields of a TCP direction whose sender is side `si` of windows `p`.
fn write_tcp(t: &Tail, p: &[Peer; 2], si: usize, rev: u32) {
    let di = 1 - si;
    t.seqlo.store(p[si].seqlo, Relaxed);
    t.seqhi.store(p[si].seqhi, Relaxed);
    t.peer_seqhi.store(p[di].seqhi, Relaxed);
    t.peer_seqlo.store(p[di].seqlo, Relaxed);
    t.max_win.store(p[si].max_win, Relaxed);
    t.peer_max_win.store(p[di].max_win, Relaxed);
    t.rev.store(rev, Relaxed);
    let mask = xpf_engine::proto::WSCALE_MASK;
    let (sws, dws) =
        if p[si].wscale != 0 && p[di].wscale != 0 { (p[si].wscale & mask, p[di].wscale & mask) } else { (0, 0) };
    t.sws.store(sws, Relaxed);
    t.dws.store(dws, Relaxed);
    t.unsynced.store(0, Relaxed);
}

impl FastPath {
    pub fn new(tables: Arc<FlowTables>, egresses: Arc<Egresses>, owner: u32) -> FastPath {
        FastPath {
            tables,
            egresses,
            egress_gen: 0,
            disabled: false,
            owner: owner as u8,
            recs: Vec::new(),
            free: Vec::new(),
            mine: HashMap::new(),
            sent: HashMap::new(),
            last_sync: Instant::now(),
            by_proto: [0; 3],
            walking: None,
            refused_at: None,
            refused_run: 0,
            cooling: VecDeque::new(),
            pass_time: Duration::ZERO,
            pass_entries: 0,
            stats: FastStats::default(),
        }
    }

    /// Whether any TCP flow of this worker's is in the tables.
    pub fn tcp_flows(&self) -> bool {
        self.stats.tcp > 0
    }

    fn tail(&self, r: &Rec) -> &Tail {
        self.tables.of(&r.key).tail(r.idx)
    }

    /// After xpfd forwarded `frame` from `in_if` to `out_if` as `sent` (translated, or as it
    /// came): puts its flow in the tables if it is a UDP flow (or ICMP echo) with both states,
    /// or an established TCP flow (both directions). A translated flow's entries carry its
    /// rewrite: the program translates its packets as the states would.
    pub fn offer(&mut self, w: &mut Worker<Live>, frame: &[u8], sent: &[u8], in_if: u32, out_if: u32) {
        // The cheap refusals first: on hosts whose interfaces take no redirected frames this is
        // all a forwarded packet pays.
        if !self.egresses.ok(out_if) || self.refused_at.is_some_and(|t| t.elapsed() < BACKOFF) || self.disabled {
            return;
        }
        let Some(k) = FlowKey::of_frame(frame) else { return };
        if self.mine.contains_key(&(in_if, k)) {
            return;
        }
        let Some(f) = w.fast_flow(frame, sent, in_if as u16, out_if as u16) else { return };
        let to = if f.translated {
            match FlowKey::of_frame(sent) {
                Some(s) if s.proto == k.proto => Some(s),
                _ => return,
            }
        } else {
            None
        };
        // UDP and ICMP echoes one direction at a time, once its `in` state has seen packets.
        if k.proto != 6 {
            if f.packets >= OFFER_AFTER {
                if let Some((_, idx)) = self.claim(k, to, in_if, out_if, f.states) {
                    self.tables.of(&k).publish(idx);
                }
            }
            return;
        }
        // TCP goes in both ways: the reverse direction leaves where this one came in, its
        // packets arriving as this one's leave.
        if !self.egresses.ok(in_if) {
            return;
        }
        let Some(ft) = w.fast_tcp(&f.states) else { return };
        let rk = to.unwrap_or(k).reversed();
        if self.mine.contains_key(&(out_if, rk)) {
            return;
        }
        let rstates = f.states.reversed();
        let Some(rt) = w.fast_tcp(&rstates) else { return };
        if rt.from != 1 - ft.from {
            return;
        }
        let Some((a, ai)) = self.claim(k, to, in_if, out_if, f.states) else { return };
        let Some((b, bi)) = self.claim(rk, to.map(|_| k.reversed()), out_if, in_if, rstates) else {
            self.release(a);
            return;
        };
        let t = self.tables.of(&k);
        write_tcp(t.tail(ai), &ft.peers, ft.from, bi);
        write_tcp(t.tail(bi), &ft.peers, rt.from, ai);
        self.recs[a as usize].as_mut().unwrap().tcp = Some((b, ft.from));
        self.recs[b as usize].as_mut().unwrap().tcp = Some((a, rt.from));
        t.publish(ai);
        t.publish(bi);
        self.stats.tcp += 2;
    }

    /// Claims an entry for flow `k` (leaving as `to` when translated) and makes this worker's
    /// record of it (not yet published).
    fn claim(
        &mut self,
        k: FlowKey,
        to: Option<FlowKey>,
        in_if: u32,
        out_if: u32,
        states: FlowRef,
    ) -> Option<(u32, u32)> {
        let t = self.tables.of(&k);
        let Some(idx) = t.claim(&k, self.owner) else {
            self.stats.refused += 1;
            self.refused_run += 1;
            if self.refused_run >= REFUSED_RUN {
                self.refused_run = 0;
                self.refused_at = Some(Instant::now());
            }
            return None;
        };
        self.refused_run = 0;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.recs.push(None);
            self.recs.len() as u32 - 1
        });
        let tl = t.tail(idx);
        tl.in_if.store(in_if, Relaxed);
        tl.out_if.store(out_if, Relaxed);
        t.slot(idx).store(slot, Relaxed);
        if let Some(to) = &to {
            t.set_rewrite(idx, to);
            self.sent.insert(*to, slot);
            self.stats.translated += 1;
        }
        self.recs[slot as usize] =
            Some(Rec { key: k, sent: to, idx, in_if, out_if, states, packets: 0, bytes: 0, tcp: None, held: false });
        self.by_proto[proto_index(k.proto)] += 1;
        self.mine.insert((in_if, k), slot);
        self.stats.installed += 1;
        self.stats.flows = self.mine.len() as u64;
        Some((slot, idx))
    }

    /// The windows of TCP record `slot` and its reverse, by side of the states.
    fn windows(&self, slot: u32) -> Option<[Win; 2]> {
        let r = self.recs[slot as usize].as_ref()?;
        let (rs, si) = r.tcp?;
        let rv = self.recs[rs as usize].as_ref()?;
        let (e, re) = (self.tail(r), self.tail(rv));
        let later = |a: u32, b: u32| if (a.wrapping_sub(b) as i32) > 0 { a } else { b };
        let mut w = [Win::default(); 2];
        w[si] = Win {
            seqlo: later(e.seqlo.load(Relaxed), re.peer_seqlo.load(Relaxed)),
            seqhi: e.seqhi.load(Relaxed),
            max_win: e.max_win.load(Relaxed).max(re.peer_max_win.load(Relaxed)),
        };
        w[1 - si] = Win {
            seqlo: later(re.seqlo.load(Relaxed), e.peer_seqlo.load(Relaxed)),
            seqhi: re.seqhi.load(Relaxed),
            max_win: re.max_win.load(Relaxed).max(e.peer_max_win.load(Relaxed)),
        };
        Some(w)
    }

    /// Merges TCP record `slot`'s windows into its states (see `Worker::fast_tcp_merge`).
    fn merge(&self, w: &mut Worker<Live>, slot: u32, push: bool) -> Option<bool> {
        let win = self.windows(slot)?;
        let r = self.recs[slot as usize].as_ref()?;
        w.fast_tcp_merge(&r.states, win, push)
    }

    /// A TCP segment the program handed over (its metadata says the flow has an entry),
    /// before the engine judges it: the entries' windows go into the states, and an update
    /// goes to the sync peer when they moved (the program hands over a segment when one is
    /// due). False when the frame is no TCP segment of a flow this worker has in the tables
    /// (nothing to `settle` then).
    pub fn pull(&mut self, w: &mut Worker<Live>, frame: &[u8], in_if: u32) -> bool {
        let Some(k) = FlowKey::of_frame(frame).filter(|k| k.proto == 6) else { return false };
        let Some(&slot) = self.mine.get(&(in_if, k)) else { return false };
        if self.recs[slot as usize].as_ref().is_none_or(|r| r.held) {
            return false;
        }
        self.stats.judged += 1;
        let _ = self.merge(w, slot, true);
        true
    }

    /// An ICMP error about a TCP flow of this worker's on the fast path: the engine checks
    /// the quoted sequence number against the state's windows (pf's check), so the windows
    /// the program slid go into the states first. Without it a PMTU error about a busy
    /// transfer quotes a number beyond the state's `seqhi` and is dropped (a blackhole).
    pub fn pull_quoted(&mut self, w: &mut Worker<Live>, frame: &[u8]) {
        let mut pd = xpf_wire::PDesc::default();
        if xpf_wire::parse_ether(frame, &mut pd).is_err() || pd.flags & xpf_wire::pdesc::pdf::ICMP_ERROR == 0 {
            return;
        }
        let Some(q) = frame.get(pd.l4_off as usize + 8..).and_then(|q| xpf_wire::pdesc::parse_quoted(q, pd.af)) else {
            return;
        };
        if q.proto != xpf_wire::pdesc::IPPROTO_TCP {
            return;
        }
        let v6 = q.af != xpf_wire::pdesc::AF_INET;
        let word = |a: &xpf_wire::pdesc::Addr| -> [u32; 4] {
            std::array::from_fn(|i| u32::from_ne_bytes(a.0[4 * i..4 * i + 4].try_into().unwrap()))
        };
        let (mut src, mut dst) = (word(&q.src), word(&q.dst));
        if !v6 {
            src[1..].fill(0);
            dst[1..].fill(0);
        }
        let mut ports = [0u8; 4];
        ports[..2].copy_from_slice(&q.sport.to_be_bytes());
        ports[2..].copy_from_slice(&q.dport.to_be_bytes());
        // The quote is the flow as it left (translated or not).
        let k = FlowKey { v6, proto: q.proto, ports: u32::from_ne_bytes(ports), src, dst };
        let slot = match self.sent.get(&k) {
            Some(&slot) => slot,
            None => {
                let t = self.tables.of(&k);
                let Some(idx) = t.find(&k) else { return };
                let slot = t.slot(idx).load(Relaxed);
                let mine = self
                    .recs
                    .get(slot as usize)
                    .and_then(|r| r.as_ref())
                    .is_some_and(|r| r.idx == idx && r.key == k && r.sent.is_none());
                if !mine {
                    return;
                }
                slot
            }
        };
        let _ = self.merge(w, slot, false);
    }

    /// After the engine judged a segment `pull` saw: when it passed and the flow is still
    /// established, its windows go back into the entries (the program judges the next ones
    /// with them); when it is no longer, the flow is taken back.
    pub fn settle(&mut self, w: &mut Worker<Live>, frame: &[u8], in_if: u32, passed: bool) {
        let Some(k) = FlowKey::of_frame(frame).filter(|k| k.proto == 6) else { return };
        let Some(&slot) = self.mine.get(&(in_if, k)) else { return };
        let Some(r) = self.recs[slot as usize].as_ref().filter(|r| !r.held) else { return };
        let Some((rs, _)) = r.tcp else { return };
        let Some(rv) = self.recs[rs as usize].as_ref() else { return };
        let (e, re) = (self.tail(r), self.tail(rv));
        e.unsynced.store(0, Relaxed);
        re.unsynced.store(0, Relaxed);
        if !passed {
            return;
        }
        match w.fast_tcp(&r.states) {
            Some(ft) => {
                let (p, si) = (&ft.peers, ft.from);
                let di = 1 - si;
                seq_max(&e.seqlo, p[si].seqlo);
                seq_max(&re.peer_seqlo, p[si].seqlo);
                seq_max(&e.seqhi, p[si].seqhi);
                seq_max(&re.peer_seqhi, p[si].seqhi);
                e.max_win.fetch_max(p[si].max_win, Relaxed);
                re.peer_max_win.fetch_max(p[si].max_win, Relaxed);
                seq_max(&re.seqlo, p[di].seqlo);
                seq_max(&e.peer_seqlo, p[di].seqlo);
                seq_max(&re.seqhi, p[di].seqhi);
                seq_max(&e.peer_seqhi, p[di].seqhi);
                re.max_win.fetch_max(p[di].max_win, Relaxed);
                e.peer_max_win.fetch_max(p[di].max_win, Relaxed);
            }
            _ => self.take_back(slot),
        }
    }

    /// Holds record `slot`'s entry (and its reverse's): the program stops matching them; they
    /// are read a last time and freed after GRACE.
    fn take_back(&mut self, slot: u32) {
        let now = Instant::now();
        let rev = self.recs[slot as usize].as_ref().and_then(|r| r.tcp).map(|t| t.0);
        for s in std::iter::once(slot).chain(rev) {
            if let Some(r) = self.recs[s as usize].as_mut().filter(|r| !r.held) {
                r.held = true;
                self.tables.of(&r.key).hold(r.idx);
                self.cooling.push_back((now, s));
                self.stats.taken_back += 1;
            }
        }
    }

    /// The interval between passes: a third of the shortest timeout now in force (adaptive
    /// scaling included) among the protocols the tables hold (UDP's, established TCP's,
    /// ICMP's), at most SYNC_MAX; with pflow's active records, half their period at most, so
    /// that each record carries the kernel's counts of the period before it. (ICMP's 10-s
    /// error timeout set it for every flow before: a pass over 2M TCP records every 3 s took
    /// half the firewall core in the lab.)
    fn interval(&self, w: &Worker<Live>) -> Duration {
        let t = &w.t4;
        let classes: [&[Timeout]; 3] = [
            &[Timeout::TcpEstablished],
            &[Timeout::UdpFirst, Timeout::UdpSingle, Timeout::UdpMultiple],
            &[Timeout::IcmpFirst, Timeout::IcmpError],
        ];
        let shortest = classes
            .iter()
            .zip(self.by_proto)
            .filter(|&(_, n)| n > 0)
            .flat_map(|(c, _)| c.iter())
            .map(|&c| t.timeouts().effective(c, t.len() + w.t6.len(), t.limit()))
            .min()
            .unwrap_or(SYNC_MAX.as_secs() as u32 * 3);
        let iv = Duration::from_secs((shortest / 3).max(1) as u64).min(SYNC_MAX);
        match w.flow_active() {
            0 => iv,
            a => iv.min(Duration::from_millis(a as u64 * 500)),
        }
    }

    /// Starts a pass now (one walking is started again): the counts of every flow read back
    /// after this call, [`FastPath::forced_step`] a slice at a time.
    pub fn force(&mut self) {
        self.begin();
    }

    /// One slice of the pass [`FastPath::force`] started; true when it is done (the flows
    /// held after it freed too).
    pub fn forced_step(&mut self, w: &mut Worker<Live>, now: u32) -> bool {
        if self.walking.is_some() {
            self.step(w, now);
        }
        if self.walking.is_some() {
            return false;
        }
        self.cool(w, now, true);
        true
    }

    /// Carries the kernel's counts into the states and takes back the flows whose states are
    /// gone: a pass every `interval`, a slice per call. Frees the flows held long enough.
    pub fn sync(&mut self, w: &mut Worker<Live>, now: u32) {
        // pf disabled (`xpfctl -d`): every flow comes back at once, so that its packets pass
        // through xpfd unfiltered and untranslated, and none is offered until it is enabled.
        // So too while the ruleset has FreeBSD scrub rules with options (every packet they
        // select is rewritten in xpfd).
        if self.disabled == (w.policy.enabled() && !w.policy.packet_scrubs()) {
            self.disabled = !self.disabled;
            if self.disabled {
                for slot in 0..self.recs.len() as u32 {
                    if self.recs[slot as usize].as_ref().is_some_and(|r| !r.held) {
                        self.take_back(slot);
                    }
                }
            }
        }
        let g = self.egresses.generation.load(Relaxed);
        if g != self.egress_gen {
            // An egress stopped taking redirected frames: its flows come back at once.
            self.egress_gen = g;
            for slot in 0..self.recs.len() as u32 {
                if self.recs[slot as usize].as_ref().is_some_and(|r| !r.held && !self.egresses.ok(r.out_if)) {
                    self.take_back(slot);
                }
            }
        }
        self.cool(w, now, false);
        let iv = self.interval(w);
        match self.walking {
            None if self.last_sync.elapsed() < iv => return,
            None => self.begin(),
            // A pass is spread over half the interval: its cost a steady share of the core
            // rather than a burst (at 2M TCP flows a pass is about a second of the core's
            // time, and the lab's runs took it whole or not at all: 0-34% user time).
            Some(at) => {
                let due = self.recs.len() as f64 * self.last_sync.elapsed().as_secs_f64() / (iv.as_secs_f64() / 2.0);
                if (at as f64) > due {
                    return;
                }
            }
        }
        self.step(w, now);
    }

    fn begin(&mut self) {
        self.last_sync = Instant::now();
        self.walking = Some(0);
        self.pass_time = Duration::ZERO;
        self.pass_entries = 0;
    }

    /// Carries record `slot`'s new counts into its states: the packets added, None when the
    /// states are gone.
    fn account(&mut self, w: &mut Worker<Live>, slot: u32, now: u32) -> Option<u32> {
        let r = self.recs[slot as usize].as_ref()?;
        let t = self.tail(r);
        let (packets, bytes) = (t.packets.load(Relaxed), t.bytes.load(Relaxed));
        let (dp, db) = (packets.wrapping_sub(r.packets), bytes.wrapping_sub(r.bytes));
        let add = (dp > 0).then_some((dp, db));
        if !w.flow_account(&r.states, add, now) {
            return None;
        }
        let r = self.recs[slot as usize].as_mut().unwrap();
        r.packets = packets;
        r.bytes = bytes;
        self.stats.packets += dp as u64;
        self.stats.bytes += db;
        Some(dp)
    }

    /// Whether record `slot`'s states expire by `next` (the pass after this one) unless a
    /// packet comes: the flow goes back to xpfd then, so that a packet after the expiry meets
    /// no state (as in pf) rather than an entry not yet read back.
    fn expiring(&self, w: &Worker<Live>, slot: u32, next: u32) -> bool {
        let Some(r) = self.recs[slot as usize].as_ref() else { return true };
        w.flow_deadline(&r.states).is_none_or(|d| d <= next)
    }

    /// One slice of the current pass.
    fn step(&mut self, w: &mut Worker<Live>, now: u32) {
        let t = Instant::now();
        let Some(start) = self.walking.take() else { return };
        let end = (start + SLICE).min(self.recs.len());
        let next = now.saturating_add(self.interval(w).as_secs() as u32 + 1);
        for slot in start as u32..end as u32 {
            let Some(r) = self.recs[slot as usize].as_ref().filter(|r| !r.held) else { continue };
            let pair = r.tcp;
            if pair.is_some_and(|p| p.0 < slot) {
                continue; // visited with its reverse
            }
            self.pass_entries += 1;
            let mut seen = self.account(w, slot, now);
            if let Some((rs, _)) = pair {
                seen = seen.zip(self.account(w, rs, now)).map(|(a, b)| a + b);
                if self.merge(w, slot, false) != Some(true) {
                    seen = None;
                }
            }
            if seen.is_none_or(|n| n == 0 && self.expiring(w, slot, next)) {
                self.take_back(slot);
            }
        }
        self.pass_time += t.elapsed();
        if end < self.recs.len() {
            self.walking = Some(end);
        } else {
            self.stats.last_pass_us = self.pass_time.as_micros() as u64;
            self.stats.last_pass_entries = self.pass_entries;
            self.stats.flows = self.mine.len() as u64;
        }
    }

    /// Reads the flows held for GRACE (all with `all`) a last time and frees them.
    fn cool(&mut self, w: &mut Worker<Live>, now: u32, all: bool) {
        if all && !self.cooling.is_empty() {
            std::thread::sleep(GRACE);
        }
        while let Some(&(at, slot)) = self.cooling.front() {
            if !all && at.elapsed() < GRACE {
                break;
            }
            self.cooling.pop_front();
            let _ = self.account(w, slot, now);
            if let Some((rs, _)) = self.recs[slot as usize].as_ref().and_then(|r| r.tcp) {
                if self.recs[rs as usize].is_some() {
                    let _ = self.merge(w, slot, false);
                }
            }
            self.release(slot);
        }
    }

    /// Frees record `slot` and its entry.
    fn release(&mut self, slot: u32) {
        if let Some(r) = self.recs[slot as usize].take() {
            self.by_proto[proto_index(r.key.proto)] -= 1;
            let t = self.tables.of(&r.key);
            t.hold(r.idx);
            t.free(r.idx);
            self.mine.remove(&(r.in_if, r.key));
            if let Some(to) = &r.sent {
                if self.sent.get(to) == Some(&slot) {
                    self.sent.remove(to);
                }
                self.stats.translated -= 1;
            }
            self.free.push(slot);
            self.stats.removed += 1;
            if r.tcp.is_some() {
                self.stats.tcp -= 1;
            }
            self.stats.flows = self.mine.len() as u64;
        }
    }
}
