//! xpf-engine: the per-packet path, with no I/O and no clock.
//!
//! A [`Worker`] takes a batch of frames received on one interface in one direction, and the
//! time, sets a [`Verdict`] per frame and returns the rest of the batch's output as one
//! [`Batch`] (rewrites to apply, answers and frames to send, states made). The order is pf's
//! (`pf_test`): fill the descriptor once, look the state up first, evaluate the ruleset only
//! on a miss, create the state when the deciding rule keeps state, and count every drop with
//! its reason. Lookups are batched ([`xpf_state::StateTable::lookup_batch`]); nothing on this
//! path allocates, locks or makes a system call. The daemon, the benches and the replay tool
//! all run this same code.

pub mod batch;
pub mod frag;
pub mod info;
pub mod nat;
pub mod policy;
pub mod proto;
pub mod reply;
pub mod syncookie;
pub mod synproxy;

pub use batch::Batch;
pub use policy::{Action, BlockAll, Context, Decision, LogName, PassAll, Policy, Return, RouteTarget, Scrub};

use nat::Rewrite;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use xpf_state::{sf, Config, Dir, Key, Key4, Key6, NewState, Refusal, Seed, StateTable, ID_MASK, NONE, STACK};
use xpf_wire::pdesc::{pdf, AF_INET, IPPROTO_TCP};
use xpf_wire::tcp;
use xpf_wire::{parse_ether, PDesc, Parse, Reason};

/// Frames per batch at most (the I/O layer hands at most this many at a time).
pub const BATCH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Pass,
    /// Drop it, counted under this reason.
    Drop(Reason),
    /// Not for the filter (ARP, LLDP...): hand it to the host stack.
    Host,
    /// A fragment kept for reassembly (a copy: the frame itself may be reused). Its datagram
    /// leaves by [`Batch::released`] when complete and passed.
    Held,
}

/// The worker's packet counters (pfctl -si's "Counters" and interface totals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub packets: u64,
    pub bytes: u64,
    pub passed: u64,
    pub dropped: u64,
    pub to_host: u64,
    /// Packets a rule passed (pf counts them under `match` with the blocked ones).
    pub rule_passes: u64,
    /// Drops per `Reason` (`match`: blocked by a rule).
    pub reasons: [u64; Reason::COUNT],
    /// `block return`: answers sent (RST, ICMP unreachable), and answers not sent because
    /// more than [`RETURN_PER_SECOND`] were due in one second.
    pub returned: u64,
    pub return_limited: u64,
    /// Segments `synproxy state` sent (SYN|ACKs, SYNs, ACKs).
    pub proxied: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            packets: 0,
            bytes: 0,
            passed: 0,
            dropped: 0,
            to_host: 0,
            rule_passes: 0,
            reasons: [0; Reason::COUNT],
            returned: 0,
            return_limited: 0,
            proxied: 0,
        }
    }
}

pub struct WorkerConfig {
    /// `set limit states`, for IPv4 and IPv6 together.
    pub limit: u32,
    /// Fixed index rows (experiments only; None sizes them from the limit).
    pub rows: Option<u32>,
    pub seed: Seed,
    /// Event queue capacity per family; 0 when sync is off.
    pub events: usize,
    pub now: u32,
    /// Commit the memory of `limit` IPv4 entries at creation (see `xpf_state::Config`).
    pub prefault: bool,
    /// The key of the worker's random numbers (`modulate state`'s initial sequence numbers):
    /// the daemon passes 32 bytes from getrandom ([`xpf_state::os_random`]); tests a fixed one.
    pub secret: [u8; 32],
}

/// Answers to blocked packets (`block return`) a worker sends per second at most: a flood of
/// blocked packets must not become a flood of answers (the kernel's icmp_ratelimit is 1,000).
pub const RETURN_PER_SECOND: u32 = 1000;

/// A logging rule decided frame `i` (a miss just now): noted for pflog.
#[inline(always)]
fn take_log(aux: &mut Aux, logs: &mut [LogMark; BATCH], logged: &mut u64, i: usize) {
    if let Some(l) = aux.log.take() {
        if i < BATCH {
            logs[i] = l;
            *logged |= 1 << i;
        }
    }
}

/// A miss context's rewrite slot for a reassembled datagram ([`Worker::dgram`]).
const DGRAM: usize = BATCH + 1;

/// In [`Batch::created_ids`]: the slot is an IPv6 state's.
pub const V6_SLOT: u32 = 1 << 31;

pub struct Worker<P: Policy> {
    pub t4: StateTable<Key4>,
    pub t6: StateTable<Key6>,
    pub policy: P,
    pub stats: Stats,
    /// Fragment reassembly (`set reassemble yes`); None passes fragments to the rules.
    pub frags: Option<Box<frag::Frags>>,
    /// What the last batch leaves its caller besides the verdicts.
    out: Batch,
    /// Where the filter notes a reassembled datagram's translation (slot 0).
    dgram: Box<[Rewrite; BATCH]>,
    dgram_mask: u64,
    /// The datagram being filtered came to this host's address.
    dgram_local: bool,
    frag_buf: Vec<u8>,
    /// Half-open TCP states this `in` pass made: each gets its `out` state when the batch's
    /// `out` pass runs, and `set syncookies adaptive` counts them already (pf's count after
    /// each packet's whole path).
    syn_pending: u32,
    /// The pools' round-robin positions and the source-port allocators.
    pub nat: nat::Nat,
    /// The batch's frames addressed to this host ([`Worker::process_tagged`]'s `local`).
    local: u64,
    /// Random numbers, and the synproxy action of the packet just handled.
    aux: Aux,
    /// `synproxy state`: what the batch's packets make the filter send (frame, state slot with
    /// V6_SLOT for IPv6, action), built after the batch ([`synproxy::emit`]).
    proxies: Vec<(u8, u32, synproxy::Proxy)>,
    /// Buffers of answers given back ([`Worker::recycle`]).
    spare: Vec<Vec<u8>>,
    /// What blocked frames of the batch are to get (set by a miss, answered after the batch).
    ret: [Return; BATCH],
    ret_mask: u64,
    /// Frames of this batch whose TCP header pf_normalize_tcp cleans ([`proto::tcp_normal`]).
    unclean: u64,
    /// The answers left for the current second, and that second.
    return_budget: (u32, u32),
    limit: u32,
    any_if_bound: bool,
    /// The interface the batch at hand came in on (set by each call that filters).
    rcvif: u16,
    pd: [PDesc; BATCH],
    k4: [Key4; BATCH],
    h4: [u64; BATCH],
    r4: [u32; BATCH],
    i4: [u8; BATCH],
    k6: [Key6; BATCH],
    h6: [u64; BATCH],
    r6: [u32; BATCH],
    i6: [u8; BATCH],
}

impl<P: Policy> Worker<P> {
    pub fn new(cfg: WorkerConfig, policy: P) -> Result<Self, xpf_state::region::MapError> {
        let t4 = StateTable::new(Config {
            limit: cfg.limit,
            rows: cfg.rows,
            seed: cfg.seed,
            events: cfg.events,
            now: cfg.now,
            grow_from: None,
            prefault: cfg.prefault,
        })?;
        // IPv6 states are usually few: its index starts at 1/16 of the automatic size and grows
        // online with the load, up to the size the limit calls for.
        let s6 = Seed([cfg.seed.0[1], cfg.seed.0[2], cfg.seed.0[3], cfg.seed.0[0] | 1]);
        let grow = cfg.rows.is_none().then(|| xpf_state::auto_rows(cfg.limit) / 16);
        let t6 = StateTable::new(Config {
            limit: cfg.limit,
            rows: cfg.rows,
            seed: s6,
            events: cfg.events,
            now: cfg.now,
            grow_from: grow,
            prefault: false,
        })?;
        Ok(Worker {
            t4,
            t6,
            policy,
            stats: Stats::default(),
            frags: None,
            out: Batch::new(),
            dgram: Box::new([Rewrite::default(); BATCH]),
            dgram_mask: 0,
            dgram_local: false,
            frag_buf: Vec::new(),
            syn_pending: 0,
            nat: nat::Nat::default(),
            local: 0,
            aux: {
                let mut rng = ChaCha20Rng::from_seed(cfg.secret);
                let mut key = [0u8; 32];
                rand_core::Rng::fill_bytes(&mut rng, &mut key);
                Aux { rng, proxy: None, log: None, cookies: Box::new(syncookie::Cookies::new(key)), worker: 0 }
            },
            proxies: Vec::new(),
            spare: Vec::new(),
            ret: [Return::DROP; BATCH],
            ret_mask: 0,
            unclean: 0,
            return_budget: (RETURN_PER_SECOND, cfg.now),
            limit: cfg.limit,
            any_if_bound: false,
            rcvif: 0,
            pd: [PDesc::default(); BATCH],
            k4: [Key4::default(); BATCH],
            h4: [0; BATCH],
            r4: [0; BATCH],
            i4: [0; BATCH],
            k6: [Key6::default(); BATCH],
            h6: [0; BATCH],
            r6: [0; BATCH],
            i6: [0; BATCH],
        })
    }

    /// States in both tables.
    pub fn states(&self) -> u32 {
        self.t4.len() + self.t6.len()
    }

    /// TCP states of both tables whose handshake has not completed.
    pub fn halfopen(&self) -> u32 {
        self.t4.halfopen() + self.t6.halfopen()
    }

    /// Worker `index` of `workers`: the row of the rules' evaluation counters it counts in,
    /// and its share of the translation source ports (p mod workers = index).
    pub fn set_index(&mut self, index: u16, workers: u16) {
        self.aux.worker = index;
        self.nat.set_share(index, workers);
    }

    /// `set syncookies`; `secret` keys the cookies (one secret for all the workers of a
    /// firewall, from getrandom, so that any of them proves a cookie another sent; None
    /// keeps the worker's own).
    pub fn set_syncookies(&mut self, mode: syncookie::Mode, secret: Option<[u8; 32]>) {
        if let Some(k) = secret {
            *self.aux.cookies = syncookie::Cookies::new(k);
        }
        self.aux.cookies.set_mode(mode);
        let h = self.halfopen();
        self.aux.cookies.watch(h, self.limit);
    }

    /// The cookies' mode, whether they are on, and their counters.
    pub fn syncookies(&self) -> (syncookie::Mode, bool, syncookie::Counters) {
        let c = &self.aux.cookies;
        (c.mode(), c.active(), c.counters)
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// `set limit states`: raising it grows the indexes online.
    /// `set limit src-nodes`: this worker's share of the source nodes, both families
    /// together (0: no limit).
    pub fn set_src_node_limit(&mut self, n: u32) {
        self.t4.track.node_limit = n;
        self.t6.track.node_limit = n;
    }

    pub fn set_limit(&mut self, limit: u32) -> Result<(), xpf_state::region::MapError> {
        self.limit = limit;
        self.t4.set_limit(limit)?;
        self.t6.set_limit(limit)
    }

    /// Filters a batch of frames that arrived on (`dir` = In) or leave by (Out) interface
    /// `ifidx`. `verdicts[i]` is set for `frames[i]`; what else the batch asks of the caller
    /// (rewrites, frames to send, states made) is returned.
    // PERF: 9.7 ns/pkt at 9,800 states and 17.9 ns/pkt at 10M (one core, established UDP,
    // xpf-bench states; docs/bench-results.md).
    pub fn process(
        &mut self,
        frames: &[&[u8]],
        ifidx: u16,
        dir: Dir,
        now: u32,
        verdicts: &mut [Verdict],
    ) -> &mut Batch {
        let mut tags = [0u16; BATCH];
        let rcvif = if dir == Dir::In { ifidx } else { 0 };
        self.process_tagged(frames, ifidx, dir, rcvif, now, verdicts, &mut tags, 0)
    }

    /// [`Worker::process`] for frames received on `rcvif` (for an `out` pass, the interface
    /// of their `in` pass; 0 for the host's own), with pf's packet tags: `tags[i]` is the tag
    /// frame `i` carries in (0: none; from its `in` pass when this is its `out` pass), and on
    /// return the tag it carries on: set by a `tag` rule of this pass, or by the state it
    /// matched. The frames of `local` (bit i: frame i) are addressed to this host, at a
    /// translation target: each is filtered only as far as a translation goes (a translated
    /// state's packet, or a new flow a `rdr-to` rule takes); anything else is the host's,
    /// [`Verdict::Host`], untouched and uncounted by states and rules (the host's own
    /// filtering sees it when the kernel has it).
    #[allow(clippy::too_many_arguments)]
    pub fn process_tagged(
        &mut self,
        frames: &[&[u8]],
        ifidx: u16,
        dir: Dir,
        rcvif: u16,
        now: u32,
        verdicts: &mut [Verdict],
        tags: &mut [u16],
        local: u64,
    ) -> &mut Batch {
        self.rcvif = rcvif;
        self.local = local;
        let n = frames.len().min(BATCH);
        let (mut n4, mut n6) = (0usize, 0usize);
        self.out.clear(n);
        self.syn_pending = 0;
        self.ret_mask = 0;
        self.unclean = 0;
        if self.policy.skip(ifidx) {
            self.skipped(&frames[..n], verdicts);
            return &mut self.out;
        }
        // Parse the whole batch first, then key it: reading a descriptor right after the parser
        // wrote it stalled on store forwarding (~30% of the worker's samples at 9,800 states).
        let mut parsed = 0u64;
        for i in 0..n {
            verdicts[i] = match parse_ether(frames[i], &mut self.pd[i]) {
                Ok(()) => {
                    parsed |= 1 << i;
                    Verdict::Pass
                }
                Err(Parse::NotIp(_)) => Verdict::Host,
                Err(Parse::Drop(r)) => Verdict::Drop(r),
            };
        }
        let mut m = parsed;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            let pd = &self.pd[i];
            // pf_normalize_tcp, before the state and the rules; what it leaves as it is (a
            // clean header on an ACK without SYN, a plain SYN, a SYN-ACK) passes these tests.
            if pd.proto == IPPROTO_TCP && pd.flags & pdf::HAS_PORTS != 0 && !proto::tcp_plain(pd) {
                match proto::tcp_normal(&mut self.pd[i]) {
                    None => {
                        verdicts[i] = Verdict::Drop(Reason::Normalize);
                        continue;
                    }
                    Some(true) => self.unclean |= 1 << i,
                    Some(false) => {}
                }
            }
            let pd = &self.pd[i];
            if pd.flags & (pdf::FRAGMENT | pdf::ICMP_ERROR | pdf::ND) != 0 {
                let pd = *pd;
                // To this host: reassembled here when reassembly is on (a translated flow's
                // fragments to a pool address are xpfd's; the rest go back whole to the host).
                if local & (1 << i) != 0 && pd.flags & pdf::FRAGMENT != 0 && self.frags.is_none() {
                    verdicts[i] = Verdict::Host;
                    continue;
                }
                verdicts[i] = self.special(i, frames[i], &pd, ifidx, dir, now);
                if let Some((id, a)) = self.aux.proxy.take() {
                    self.proxies.push((i as u8, if pd.af == AF_INET { id } else { id | V6_SLOT }, a));
                }
                if pd.flags & pdf::FRAGMENT == 0 {
                    self.take_patch(i);
                }
                self.t4.modulated = None;
                self.t6.modulated = None;
                self.t4.created = None;
                self.t6.created = None;
            } else if pd.af == AF_INET {
                self.k4[n4] = Key4::from_pdesc(pd, dir, 0);
                self.i4[n4] = i as u8;
                n4 += 1;
            } else {
                self.k6[n6] = Key6::from_pdesc(pd, dir, 0);
                self.i6[n6] = i as u8;
                n6 += 1;
            }
        }
        // PERF: the IPv4 and IPv6 halves are written out twice on purpose: one generic lane
        // type for both measured 3-5% slower (A/B, xpf-bench states at 9,800 and 10M states).
        if n4 > 0 {
            self.t4.lookup_batch(&self.k4[..n4], &mut self.h4[..n4], &mut self.r4[..n4]);
            for j in 0..n4 {
                let i = self.i4[j] as usize;
                let pd = &self.pd[i];
                let v = if self.r4[j] != NONE {
                    if let Some(rt) = leaves_elsewhere(&self.t4, &self.policy, self.r4[j], dir, ifidx) {
                        verdicts[i] = Verdict::Pass;
                        self.out.routes[i] = rt;
                        continue;
                    }
                    let out = Some((&mut self.out.rewrites, &mut self.out.translated, i));
                    let local = self.local & (1 << i) != 0;
                    hit_nat(&mut self.t4, self.r4[j], pd, dir, now, &mut self.aux, out, local).map(|v| {
                        match state_actions(
                            &self.t4,
                            &self.policy,
                            self.r4[j],
                            dir,
                            now,
                            &mut tags[i],
                            &mut self.out.queues[i],
                            &mut self.out.routes[i],
                        ) {
                            Ok(0) => v,
                            Ok(a) => {
                                let rule = self.t4.meta(self.r4[j] & ID_MASK).rule;
                                let marks = (
                                    &mut self.out.scrubs,
                                    &mut self.out.scrubbed,
                                    &mut self.out.logs,
                                    &mut self.out.logged,
                                );
                                state_marks(marks, i, a, rule, dir);
                                v
                            }
                            Err(why) => Verdict::Drop(why),
                        }
                    })
                } else {
                    None
                };
                verdicts[i] = if let Some(v) = v {
                    v
                } else {
                    let c = ctx!(self, t6, ifidx, dir, now, &mut tags[i], i, i);
                    let v = miss(&mut self.t4, &self.policy, c, pd, self.k4[j], self.h4[j]);
                    take_log(&mut self.aux, &mut self.out.logs, &mut self.out.logged, i);
                    if let Some(id) = self.t4.created.take() {
                        self.out.created |= 1 << i;
                        self.out.created_ids[i] = id;
                        if dir == Dir::In && pd.proto == IPPROTO_TCP && pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
                        {
                            self.syn_pending += 1;
                        }
                    }
                    v
                };
                if self.t4.modulated.is_some() {
                    self.take_patch(i);
                }
                if self.aux.proxy.is_some() {
                    self.take_proxy(i, 0);
                }
            }
        }
        if n6 > 0 {
            self.t6.lookup_batch(&self.k6[..n6], &mut self.h6[..n6], &mut self.r6[..n6]);
            for j in 0..n6 {
                let i = self.i6[j] as usize;
                let pd = &self.pd[i];
                let v = if self.r6[j] != NONE {
                    if let Some(rt) = leaves_elsewhere(&self.t6, &self.policy, self.r6[j], dir, ifidx) {
                        verdicts[i] = Verdict::Pass;
                        self.out.routes[i] = rt;
                        continue;
                    }
                    let out = Some((&mut self.out.rewrites, &mut self.out.translated, i));
                    let local = self.local & (1 << i) != 0;
                    hit_nat(&mut self.t6, self.r6[j], pd, dir, now, &mut self.aux, out, local).map(|v| {
                        match state_actions(
                            &self.t6,
                            &self.policy,
                            self.r6[j],
                            dir,
                            now,
                            &mut tags[i],
                            &mut self.out.queues[i],
                            &mut self.out.routes[i],
                        ) {
                            Ok(0) => v,
                            Ok(a) => {
                                let rule = self.t6.meta(self.r6[j] & ID_MASK).rule;
                                let marks = (
                                    &mut self.out.scrubs,
                                    &mut self.out.scrubbed,
                                    &mut self.out.logs,
                                    &mut self.out.logged,
                                );
                                state_marks(marks, i, a, rule, dir);
                                v
                            }
                            Err(why) => Verdict::Drop(why),
                        }
                    })
                } else {
                    None
                };
                verdicts[i] = if let Some(v) = v {
                    v
                } else {
                    let c = ctx!(self, t4, ifidx, dir, now, &mut tags[i], i, i);
                    let v = miss(&mut self.t6, &self.policy, c, pd, self.k6[j], self.h6[j]);
                    take_log(&mut self.aux, &mut self.out.logs, &mut self.out.logged, i);
                    if let Some(id) = self.t6.created.take() {
                        self.out.created |= 1 << i;
                        self.out.created_ids[i] = id | V6_SLOT;
                        if dir == Dir::In && pd.proto == IPPROTO_TCP && pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
                        {
                            self.syn_pending += 1;
                        }
                    }
                    v
                };
                if self.t6.modulated.is_some() {
                    self.take_patch(i);
                }
                if self.aux.proxy.is_some() {
                    self.take_proxy(i, V6_SLOT);
                }
            }
        }
        if self.ret_mask != 0 {
            self.answer(frames, now);
        }
        if self.out.logged != 0 {
            self.log_verdicts(verdicts);
        }
        self.release_ports(now);
        if self.unclean != 0 {
            self.clean_tcp(verdicts);
        }
        if self.policy.packet_scrubs() {
            self.scrub_rules(ifidx, dir, &verdicts[..n]);
        }
        if self.out.scrubbed != 0 {
            self.scrub_ids();
        }
        if !self.proxies.is_empty() {
            self.proxy_out(frames, now);
        }
        let st = &mut self.stats;
        st.packets += n as u64;
        for i in 0..n {
            st.bytes += frames[i].len() as u64;
            match verdicts[i] {
                Verdict::Pass => st.passed += 1,
                Verdict::Host => st.to_host += 1,
                Verdict::Drop(r) => {
                    st.dropped += 1;
                    st.reasons[r as usize] += 1;
                }
                // Counted when its datagram is passed or dropped.
                Verdict::Held => {}
            }
        }
        &mut self.out
    }

    /// What the last batch left ([`Worker::process_tagged`]'s return), until the next.
    pub fn batch(&self) -> &Batch {
        &self.out
    }

    /// The same, to take its vectors.
    pub fn batch_mut(&mut self) -> &mut Batch {
        &mut self.out
    }

    /// What the logged frames' verdicts were: pflog's action and reason.
    #[cold]
    fn log_verdicts(&mut self, verdicts: &[Verdict]) {
        let mut m = self.out.logged;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            let l = &mut self.out.logs[i];
            (l.action, l.reason) = match verdicts[i] {
                Verdict::Drop(r) => (PF_DROP, pf_reason(r)),
                _ => (PF_PASS, 0),
            };
        }
    }

    /// `set skip on` this interface: IP passes unfiltered and without state, the rest goes to
    /// the host as always.
    #[cold]
    fn skipped(&mut self, frames: &[&[u8]], verdicts: &mut [Verdict]) {
        let mut pd = PDesc::default();
        for (f, v) in frames.iter().zip(verdicts.iter_mut()) {
            *v = match parse_ether(f, &mut pd) {
                Err(Parse::NotIp(_)) => Verdict::Host,
                _ => Verdict::Pass,
            };
            self.stats.packets += 1;
            self.stats.bytes += f.len() as u64;
            match v {
                Verdict::Host => self.stats.to_host += 1,
                _ => self.stats.passed += 1,
            }
        }
    }

    /// Builds the answers blocked frames of the batch are due (`block return`), within the
    /// per-second budget.
    #[cold]
    #[inline(never)]
    fn answer(&mut self, frames: &[&[u8]], now: u32) {
        if self.return_budget.1 != now {
            self.return_budget = (RETURN_PER_SECOND, now);
        }
        let mut m = self.ret_mask;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if self.return_budget.0 == 0 {
                self.stats.return_limited += 1;
                continue;
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            if reply::build(frames[i], &self.pd[i], &self.ret[i], &mut buf) {
                self.return_budget.0 -= 1;
                self.stats.returned += 1;
                self.out.returns.push((i as u8, buf));
            } else {
                self.spare.push(buf);
            }
        }
    }

    /// The passed frames whose TCP header pf_normalize_tcp cleans get it cleaned with their
    /// scrub actions (with none of a rule's, alone).
    #[cold]
    #[inline(never)]
    fn clean_tcp(&mut self, verdicts: &[Verdict]) {
        let mut m = self.unclean;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if verdicts[i] != Verdict::Pass {
                continue;
            }
            if self.out.scrubbed & (1 << i) == 0 {
                self.out.scrubs[i] = Scrub::NONE;
                self.out.scrubbed |= 1 << i;
            }
            self.out.scrubs[i].tcp_clean = true;
        }
    }

    /// FreeBSD's scrub rules on the passed frames: the first rule that matches a frame gives
    /// its options, applied before its state's or rules' (pf_normalize_ip runs first).
    #[cold]
    #[inline(never)]
    fn scrub_rules(&mut self, ifidx: u16, dir: Dir, verdicts: &[Verdict]) {
        let at = Context { ifidx, dir, rcvif: self.rcvif, tag: 0, rnd: 0, now: 0, worker: self.aux.worker };
        for (i, v) in verdicts.iter().enumerate() {
            if *v != Verdict::Pass {
                continue;
            }
            let s = self.policy.packet_scrub(&self.pd[i], &at);
            if s.is_none() {
                continue;
            }
            let bit = 1u64 << i;
            self.out.scrubs[i] = if self.out.scrubbed & bit != 0 { s.then(&self.out.scrubs[i]) } else { s };
            self.out.scrubbed |= bit;
        }
    }

    /// Draws the random identifications `scrub (random-id)` frames of the batch get.
    #[cold]
    fn scrub_ids(&mut self) {
        let mut m = self.out.scrubbed;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if self.out.scrubs[i].random_id {
                self.out.scrubs[i].id = rand_core::Rng::next_u32(&mut self.aux.rng) as u16;
            }
        }
    }

    /// Builds the segments `synproxy state` sends for the batch: answers (out of the ingress
    /// interface, with the `block return` answers) and substitutes. A new proxied state takes
    /// its MSS from the client's SYN here, where the frame is at hand.
    #[cold]
    #[inline(never)]
    fn proxy_out(&mut self, frames: &[&[u8]], now: u32) {
        for (i, id, mut a) in std::mem::take(&mut self.proxies) {
            let (i, pd) = (i as usize, self.pd[i as usize]);
            if a == synproxy::Proxy::Cookie {
                let (seq, mss) = self.aux.cookies.make(&pd, reply::tcp_mss(frames[i], &pd), now);
                a = synproxy::Proxy::SynAck { seq, ack: pd.tcp_seq.wrapping_add(1), mss };
            }
            if let synproxy::Proxy::SynAck { mss: mss @ 0, .. } = &mut a {
                *mss = synproxy::offered_mss(frames[i], &pd);
                let peers = if id & V6_SLOT != 0 { self.t6.peers_mut(id & !V6_SLOT) } else { self.t4.peers_mut(id) };
                if let Some(p) = peers {
                    p[0].mss = *mss;
                }
            }
            let mut answer = self.spare.pop().unwrap_or_default();
            let mut instead = Vec::new();
            let (sent, goes_on) = synproxy::emit(frames[i], &pd, &a, &mut answer, &mut instead);
            if sent {
                self.stats.proxied += 1;
                self.out.returns.push((i as u8, answer));
            } else {
                self.spare.push(answer);
            }
            if goes_on {
                self.stats.proxied += 1;
                self.out.substitutes.push((i as u8, instead));
            }
        }
    }

    /// Moves the synproxy action the last packet (frame `i`) left into the batch's list.
    // PERF: a load-only test in the lanes and this cold call; an unconditional `take()` per
    // packet (a store) cost 4-6% of established UDP (xpf-bench states --quick, A/B).
    #[cold]
    #[inline(never)]
    fn take_proxy(&mut self, i: usize, family: u32) {
        if let Some((id, a)) = self.aux.proxy.take() {
            self.proxies.push((i as u8, id | family, a));
        }
    }

    /// The queue frame `i` of the last batch goes to (0: none, the interface's default):
    /// `set queue (q, ack)`'s second for a TCP segment with no data but its ACK, or a packet
    /// whose TOS asks for low delay, as pf does; the first otherwise.
    pub fn queue_of(&self, i: usize) -> u16 {
        let q = self.out.queues[i];
        let ack = (q >> 16) as u16;
        let pd = &self.pd[i];
        let prio =
            pd.tos & 0x10 != 0 || (pd.proto == IPPROTO_TCP && pd.tcp_flags & tcp::ACK != 0 && pd.payload_len == 0);
        if prio && ack != 0 {
            ack
        } else {
            q as u16
        }
    }

    /// Hands a buffer of [`Batch::returns`] back for reuse.
    pub fn recycle(&mut self, b: Vec<u8>) {
        if self.spare.len() < BATCH {
            self.spare.push(b);
        }
    }

    /// Moves the sequence rewrite the tables computed for frame `i` into `patches`.
    #[cold]
    fn take_patch(&mut self, i: usize) {
        if let Some(m) = self.t4.modulated.take().or_else(|| self.t6.modulated.take()) {
            self.out.patches[i] = m;
            self.out.patched |= 1 << i;
        }
    }

    /// Turns fragment reassembly on (`set reassemble yes`, `set limit frags`, the `frag`
    /// timeout) or off. Turning it off drops what is held.
    pub fn set_reassemble(&mut self, on: bool, limit: u32, timeout: u32) {
        match (&mut self.frags, on) {
            (Some(f), true) => {
                f.limit = limit;
                f.timeout = timeout;
            }
            (None, true) => self.frags = Some(Box::new(frag::Frags::new(limit, timeout))),
            (_, false) => {
                if let Some(f) = self.frags.take() {
                    self.count_dropped(f.counters.held as u32, Reason::Fragment);
                }
            }
        }
    }

    fn count_dropped(&mut self, n: u32, r: Reason) {
        self.stats.dropped += n as u64;
        self.stats.reasons[r as usize] += n as u64;
    }

    /// Fragments and ICMP errors, out of the batch's way (frame `i`). With reassembly, a
    /// fragment waits for its datagram; without it, every fragment, the first too, is left to
    /// the rules as a fragment ([`Worker::unreassembled`]). An ICMP error passes with the
    /// state of the packet it quotes, or else the rules decide.
    // PERF: one cold call behind one flag test: with the branches inline the batch loop ran
    // 5-7% slower on whole UDP packets (xpf-bench states --quick --points 9800, A/B).
    #[cold]
    #[inline(never)]
    fn special(&mut self, i: usize, frame: &[u8], pd: &PDesc, ifidx: u16, dir: Dir, now: u32) -> Verdict {
        if pd.flags & pdf::FRAGMENT != 0 && self.frags.is_some() {
            self.fragment(i, frame, pd, ifidx, dir, now)
        } else if pd.flags & pdf::FRAGMENT != 0 {
            self.unreassembled(i, pd, ifidx, dir)
        } else {
            self.single(i, frame, pd, ifidx, dir, now)
        }
    }

    /// A fragment with reassembly off (frame `i`), as pf takes one (PF_VPROTO_FRAGMENT): the
    /// first one too is a fragment, its transport header unread, so it matches no rule with
    /// ports, TCP flags or an ICMP type, makes no state, and a blocked one is counted as a
    /// fragment. Without this a first fragment would make a state (and pass by its ports)
    /// that its later fragments, without ports, could never use.
    fn unreassembled(&mut self, i: usize, pd: &PDesc, ifidx: u16, dir: Dir) -> Verdict {
        let mut f = *pd;
        f.flags = (f.flags | pdf::NOT_FIRST_FRAG) & !(pdf::HAS_PORTS | pdf::ICMP_ERROR);
        (f.sport, f.dport, f.tcp_flags, f.icmp_type, f.icmp_code) = (0, 0, 0, 0, 0);
        match self.stateless(i, &f, ifidx, dir) {
            Verdict::Drop(Reason::Match) => Verdict::Drop(Reason::Fragment),
            v => v,
        }
    }

    /// What the rules decide for a packet that makes no state (a fragment not reassembled, an
    /// ICMP error no state claims); a logging rule's mark for pflog, as on any other miss.
    fn stateless(&mut self, i: usize, pd: &PDesc, ifidx: u16, dir: Dir) -> Verdict {
        let d = self.policy.evaluate_in(pd, &Context { worker: self.aux.worker, ..Context::new(ifidx, dir) });
        if d.log != 0 && i < BATCH {
            self.out.logs[i] = LogMark::of(d.rule, d.log, dir);
            self.out.logged |= 1 << i;
        }
        match d.action {
            Action::Block => Verdict::Drop(Reason::Match),
            // A fragment without ports of a flow the rules translate: it cannot be rewritten.
            Action::Pass if d.nat != 0 || d.rdr != 0 => Verdict::Drop(Reason::Translate),
            Action::Pass if pd.flags & pdf::IP_OPTIONS != 0 && !d.allow_opts => Verdict::Drop(Reason::IpOption),
            Action::Pass => {
                self.stats.rule_passes += 1;
                Verdict::Pass
            }
        }
    }

    /// A fragment (frame `i` of the batch) under reassembly.
    #[cold]
    #[inline(never)]
    fn fragment(&mut self, i: usize, frame: &[u8], pd: &PDesc, ifidx: u16, dir: Dir, now: u32) -> Verdict {
        let Some(f) = self.frags.as_mut() else { return Verdict::Drop(Reason::Fragment) };
        match f.insert(frame, pd, now) {
            frag::Outcome::Held => Verdict::Held,
            frag::Outcome::Drop(r, n) => {
                self.count_dropped(n, r);
                Verdict::Drop(r)
            }
            frag::Outcome::Complete(pieces) => {
                let n = pieces.len() as u32;
                self.dgram_local = self.local & (1 << i) != 0;
                let v = self.filter_pieces(&pieces, ifidx, dir, now);
                self.dgram_local = false;
                match v {
                    Verdict::Pass => {
                        self.stats.passed += n as u64;
                        let to = (self.dgram_mask != 0).then_some(self.dgram[0]);
                        if to.is_some() {
                            self.out.released_translated |= 1 << i;
                        }
                        // Its routing target goes with the frame that completed it.
                        self.out.routes[i] = self.out.routes[BATCH];
                        self.out.released.extend(pieces.into_iter().map(|mut p| {
                            if let Some(to) = &to {
                                xpf_wire::translate::apply_fragment(&mut p.frame, to);
                            }
                            (i as u8, p.frame)
                        }));
                        Verdict::Held
                    }
                    Verdict::Drop(r) => {
                        // This frame is counted by its verdict, the others here.
                        self.count_dropped(n - 1, r);
                        v
                    }
                    Verdict::Host if self.local & (1 << i) != 0 => {
                        // The host's own: every fragment back to it, as it came.
                        self.stats.to_host += n as u64;
                        self.out.host_pieces.extend(pieces.into_iter().map(|p| (i as u8, p.frame)));
                        Verdict::Held
                    }
                    Verdict::Host | Verdict::Held => {
                        self.stats.passed += n as u64 - 1;
                        v
                    }
                }
            }
        }
    }

    /// Filters complete `pieces` as the one datagram they make.
    fn filter_pieces(&mut self, pieces: &[frag::Piece], ifidx: u16, dir: Dir, now: u32) -> Verdict {
        self.dgram_mask = 0;
        self.out.routes[BATCH] = 0;
        let mut buf = std::mem::take(&mut self.frag_buf);
        let mut whole = PDesc::default();
        let v = match frag::Frags::assemble(pieces, &mut buf) {
            None => Verdict::Drop(Reason::Fragment),
            Some(()) => match parse_ether(&buf, &mut whole) {
                // A segment that came in fragments is checked as pf_normalize_tcp checks one;
                // one whose header it would clean is dropped (its fragments go on as they
                // came, and the cleaning would be of the first one's header).
                Ok(()) if whole.proto == IPPROTO_TCP && proto::tcp_normal(&mut whole) != Some(false) => {
                    Verdict::Drop(Reason::Normalize)
                }
                Ok(()) => self.single(BATCH, &buf, &whole, ifidx, dir, now),
                Err(Parse::NotIp(_)) => Verdict::Drop(Reason::Fragment),
                Err(Parse::Drop(r)) => Verdict::Drop(r),
            },
        };
        self.frag_buf = buf;
        v
    }

    /// Filters the fragments of one datagram, complete and in datagram order, as a whole, on
    /// `ifidx` in direction `dir`, without holding them: the `out` pass of a datagram that
    /// [`Batch::released`] gave after its `in` pass on `rcvif`. Counted as that many packets.
    /// With its verdict comes its translation, if it has one: the caller applies it to each
    /// fragment it sends ([`xpf_wire::translate::apply_fragment`]). The last batch's
    /// [`Batch`] is left as it was.
    pub fn filter_datagram(
        &mut self,
        frames: &[&[u8]],
        ifidx: u16,
        dir: Dir,
        rcvif: u16,
        now: u32,
    ) -> (Verdict, Option<Rewrite>) {
        self.rcvif = rcvif;
        let mut pieces = Vec::with_capacity(frames.len());
        for f in frames {
            let mut pd = PDesc::default();
            if parse_ether(f, &mut pd).is_err() || pd.flags & pdf::FRAGMENT == 0 {
                return (Verdict::Drop(Reason::Fragment), None);
            }
            pieces.push(frag::Piece::of(f, &pd));
        }
        let n = frames.len() as u64;
        self.stats.packets += n;
        self.stats.bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
        let v = if frag::complete(&pieces) {
            self.filter_pieces(&pieces, ifidx, dir, now)
        } else {
            Verdict::Drop(Reason::Fragment)
        };
        match v {
            Verdict::Pass => self.stats.passed += n,
            Verdict::Drop(r) => self.count_dropped(n as u32, r),
            _ => self.stats.to_host += n,
        }
        (v, (v == Verdict::Pass && self.dgram_mask != 0).then_some(self.dgram[0]))
    }

    /// The routing target (`route-to`, `reply-to`; 0: none) of the datagram
    /// [`Worker::filter_datagram`] last passed.
    pub fn datagram_route(&self) -> u16 {
        self.out.routes[BATCH]
    }

    /// One packet, whole, through the state table and the rules (frame `i` of the batch;
    /// BATCH for a reassembled datagram, whose translation goes to [`Worker::dgram`]).
    fn single(&mut self, i: usize, frame: &[u8], pd: &PDesc, ifidx: u16, dir: Dir, now: u32) -> Verdict {
        if pd.flags & pdf::ICMP_ERROR != 0 {
            let q = frame.get(pd.l4_off as usize + 8..).unwrap_or(&[]);
            let out = (i < BATCH).then_some((&mut self.out.rewrites, &mut self.out.translated, i));
            let v = if pd.af == AF_INET {
                icmp_error(&mut self.t4, q, pd, ifidx, dir, self.any_if_bound, out)
            } else {
                icmp_error(&mut self.t6, q, pd, ifidx, dir, self.any_if_bound, out)
            };
            // To this host and about no translation: the host's.
            if i < BATCH && self.local & (1 << i) != 0 && self.out.translated & (1 << i) == 0 {
                return Verdict::Host;
            }
            return v.unwrap_or_else(|| self.stateless(i, pd, ifidx, dir));
        }
        // Tags of fragmented datagrams and ICMP errors are not carried to the `out` pass.
        let mut tag = 0;
        // A first fragment's later fragments would leave untranslated: no rewrite for it
        // (reassembly off). A reassembled datagram's goes to each of its fragments.
        let rw = if pd.flags & pdf::FRAGMENT != 0 {
            BATCH
        } else if i == BATCH {
            DGRAM
        } else {
            i
        };
        let v = if pd.af == AF_INET {
            let c = ctx!(self, t6, ifidx, dir, now, &mut tag, BATCH, rw);
            miss_whole(&mut self.t4, &self.policy, c, pd, pd)
        } else if pd.flags & pdf::ND != 0 {
            // Neighbour discovery: keyed by its target, matched by its own addresses.
            let c = ctx!(self, t4, ifidx, dir, now, &mut tag, BATCH, rw);
            miss_whole(&mut self.t6, &self.policy, c, pd, &xpf_wire::pdesc::nd_key(frame, pd))
        } else {
            let c = ctx!(self, t4, ifidx, dir, now, &mut tag, BATCH, rw);
            miss_whole(&mut self.t6, &self.policy, c, pd, pd)
        };
        take_log(&mut self.aux, &mut self.out.logs, &mut self.out.logged, i);
        v
    }

    /// For a packet forwarded in on `in_if` and out on `out_if`, `arrived` as it came in and
    /// `sent` as it left (translated, when one of its states translates it; read only when
    /// the `in` state does): its two states
    /// (`in` and `out`, floating or bound to those interfaces) for the kernel fast path
    /// (xpfd --fastpath) to hold, and the `in` state's packets in the packet's direction. None
    /// without both, when they have actions every packet needs (scrub, tag, max-pkt-rate,
    /// log (all)), when both translate (the fast path rewrites a packet once), or while
    /// FreeBSD scrub rules with options are loaded ([`Policy::packet_scrubs`]).
    pub fn fast_flow(&self, arrived: &[u8], sent: &[u8], in_if: u16, out_if: u16) -> Option<FastFlow> {
        // FreeBSD scrub rules with options act on every packet: none leaves through the kernel.
        if self.policy.packet_scrubs() {
            return None;
        }
        let pa = flow_pd(arrived)?;
        if pa.af == AF_INET {
            flow_pair(&self.t4, &pa, sent, in_if, out_if, self.any_if_bound)
        } else {
            flow_pair(&self.t6, &pa, sent, in_if, out_if, self.any_if_bound)
        }
    }

    /// Accounts (packets, bytes) that went by another path to the two states of `f`, and
    /// marks them active at `now`; with `add` None, only checks them. False when either
    /// state is gone (expired, killed; an id reused by another state is caught by its insert
    /// sequence).
    pub fn flow_account(&mut self, f: &FlowRef, add: Option<(u32, u64)>, now: u32) -> bool {
        if f.v6 {
            account_pair(&mut self.t6, f, add, now)
        } else {
            account_pair(&mut self.t4, f, add, now)
        }
    }

    /// The TCP flow `f` holds, if the fast path may judge its segments: both states
    /// established on both sides, tracked with windows (not `sloppy`), no modulation, scrub,
    /// tag or packet-rate meter, and the same windows in both (they saw the same segments).
    /// A translation changes addresses and ports only: the windows are the same on both sides
    /// of it.
    pub fn fast_tcp(&self, f: &FlowRef) -> Option<FastTcp> {
        if f.v6 {
            fast_tcp_of(&self.t6, f)
        } else {
            fast_tcp_of(&self.t4, f)
        }
    }

    /// Merges windows the fast path moved (`win`, by side of the states) into the two states
    /// of `f`: each edge only forward (sequence order), the largest window seen. A state that
    /// changed is offered to sync, pushed at once with `push` (the fast path's pacing said an
    /// update is due). None when either state is gone; else whether the fast path may still
    /// judge the flow (both sides still established).
    pub fn fast_tcp_merge(&mut self, f: &FlowRef, win: [Win; 2], push: bool) -> Option<bool> {
        if f.v6 {
            merge_windows(&mut self.t6, f, &win, push)
        } else {
            merge_windows(&mut self.t4, f, &win, push)
        }
    }

    /// When the first of the two states of `f` expires unless a packet comes (engine
    /// seconds); None when either is gone.
    pub fn flow_deadline(&self, f: &FlowRef) -> Option<u32> {
        fn of<K: Key>(t: &StateTable<K>, f: &FlowRef) -> Option<u32> {
            let d = |i: usize| held(t, f, i).map(|s| s.expire.saturating_add(t.timeout_of(f.ids[i])));
            Some(d(0)?.min(d(1)?))
        }
        if f.v6 {
            of(&self.t6, f)
        } else {
            of(&self.t4, f)
        }
    }

    /// `pflow`: seconds between a live flow's records (0: at its end only).
    pub fn set_flow_active(&mut self, secs: u32) {
        self.t4.flows.active = secs;
        self.t6.flows.active = secs;
    }

    /// `pflow`'s seconds between a live flow's records (0: at its end only).
    pub fn flow_active(&self) -> u32 {
        self.t4.flows.active
    }

    /// Moves the flow records made since the last call (`pflow` states ended, active, or
    /// translated) into `out`; returns the records lost to a full log since the last call.
    pub fn take_flows(&mut self, out: &mut Vec<xpf_state::Flow>) -> u64 {
        let mut lost = 0;
        for f in [&mut self.t4.flows, &mut self.t6.flows] {
            out.append(&mut f.records);
            lost += std::mem::take(&mut f.dropped);
        }
        lost
    }

    /// Background work between batches: expiry and index growth, `budget` units per table.
    /// Returns the states expired.
    pub fn maintain(&mut self, now: u32, budget: u32) -> u32 {
        if let Some(f) = self.frags.as_mut() {
            let n = f.expire(now);
            self.count_dropped(n, Reason::Fragment);
        }
        let n = self.t4.maintain(now, budget) + self.t6.maintain(now, budget);
        self.release_ports(now);
        self.nat.reap(now, budget);
        n
    }

    /// Removes every state of both families (`-F states`), with sync delete events if
    /// `events` (else the caller clears the peer's copies in one message). The translation's
    /// ports all go back at once, each held as a released port is, instead of a release
    /// queued per translated state. Returns the states removed.
    pub fn remove_all_states(&mut self, events: bool, now: u32) -> u32 {
        // Releases queued before go first: none of them may meet a port given out again.
        self.release_ports(now);
        let n = self.t4.remove_all(events) + self.t6.remove_all(events);
        self.nat.release_all(now);
        n
    }

    /// Takes translated states a peer made (inserted by sync; `slots` as
    /// [`Batch::created_ids`] names them, [`V6_SLOT`] for IPv6) into this box's translation, as
    /// if its own rules had made them: the source port they use counts as a flow of that port
    /// in the allocator of the pool that holds their address (not handed out fresh while they
    /// last, given back when they go), an `endpoint-independent` pool's UDP source keeps its
    /// address and port for its next flows, and `sticky-address` and `least-states` count them.
    /// A standby that takes over then translates the sources it carried as the primary did.
    /// The pool is the first whose addresses hold the translated address (and whose port range
    /// holds the port): both boxes load one ruleset.
    pub fn adopt(&mut self, slots: &[u32]) {
        for &slot in slots {
            if slot & V6_SLOT != 0 {
                adopt(&mut self.t6, &self.policy, &mut self.nat, &mut self.aux.rng, slot & !V6_SLOT);
            } else {
                adopt(&mut self.t4, &self.policy, &mut self.nat, &mut self.aux.rng, slot);
            }
        }
    }

    /// A peer's clear emptied the tables (every state was the peer's): what
    /// [`adopt`](Self::adopt) took in goes back as `-F states` gives it back.
    pub fn peer_emptied(&mut self, now: u32) {
        self.release_ports(now);
        self.nat.release_all(now);
    }

    /// Gives the source ports of the translated states that ended back to the allocator.
    #[inline]
    fn release_ports(&mut self, now: u32) {
        if !self.t4.nat_gone.is_empty() {
            gone(&mut self.t4.nat_gone, &mut self.nat, now);
        }
        if !self.t6.nat_gone.is_empty() {
            gone(&mut self.t6.nat_gone, &mut self.nat, now);
        }
    }
}

/// [`Worker::adopt`] of state `id` of `t`.
fn adopt<K: Key, P: Policy>(t: &mut StateTable<K>, p: &P, nat: &mut nat::Nat, rng: &mut ChaCha20Rng, id: u32) {
    let s = *t.state(id);
    let Some(stack) = t.stack_key(id).filter(|_| s.flags & sf::LIVE != 0 && t.held_of(id) == 0) else { return };
    let (wire, af, proto) = (s.key, s.key.af(), s.key.proto());
    // As in `gone`: the source (original, translated) and destination (original,
    // translated), each address and port; going out the wire key holds the translated
    // source second, coming in the stack key holds it first.
    let (src, dst) = if s.flags & sf::OUT != 0 {
        (
            [(stack.addr(1), stack.port(1)), (wire.addr(1), wire.port(1))],
            [(stack.addr(0), stack.port(0)), (wire.addr(0), wire.port(0))],
        )
    } else {
        (
            [(wire.addr(0), wire.port(0)), (stack.addr(0), stack.port(0))],
            [(wire.addr(1), wire.port(1)), (stack.addr(1), stack.port(1))],
        )
    };
    let pools = p.pools();
    let inside = src[0].0;
    let counts = |nat: &nat::Nat, pl: &nat::Pool| nat.tracking() || pl.sticky || pl.method == nat::Method::LeastStates;
    let mut held = 0;
    if src[0] != src[1] {
        let to = src[1];
        if let Some((i, ranged)) = nat.pool_holding(pools, nat::Use::Source, (to.0, af), Some(to.1)) {
            let pl = &pools[i];
            // Its port from the allocator's range (not `static-port`, not one fixed port).
            if ranged && !pl.static_port && nat.adopt_port((to.0, af), proto, pl.range(), to.1, rng) {
                held |= xpf_state::held::PORT;
                if pl.endpoint_independent && proto == xpf_wire::pdesc::IPPROTO_UDP {
                    nat.map(af, src[0], to);
                }
            }
            if counts(nat, pl) {
                nat.note(nat::Use::Source, af, inside, to.0, pl.sticky, t.now());
                held |= xpf_state::held::COUNTED;
            }
        }
    }
    if dst[0].0 != dst[1].0 {
        let to = dst[1].0;
        if let Some((i, _)) = nat.pool_holding(pools, nat::Use::Destination, (to, af), None) {
            if counts(nat, &pools[i]) {
                nat.note(nat::Use::Destination, af, inside, to, pools[i].sticky, t.now());
                held |= xpf_state::held::COUNTED;
            }
        }
    }
    t.set_held(id, held);
}

#[cold]
fn gone<K: Key>(g: &mut Vec<xpf_state::NatGone<K>>, nat: &mut nat::Nat, now: u32) {
    for xpf_state::NatGone { wire, stack, flags, held } in g.drain(..) {
        // Only a state whose port the allocator gave gives one back: a synced state's or a
        // static port's may be another flow's here. The translated source is the wire key's
        // second address and port going out, the stack key's first coming in (`nat-to` on an
        // `in` rule), as below.
        if held & xpf_state::held::PORT != 0 {
            let (a, p) =
                if flags & sf::OUT != 0 { (wire.addr(1), wire.port(1)) } else { (stack.addr(0), stack.port(0)) };
            nat.put_port(a, wire.af(), wire.proto(), p, now);
        }
        if held & xpf_state::held::COUNTED != 0 && nat.tracking() {
            // Keys hold the far side first: going out, the wire key's second address is the
            // new source and its first the new destination; coming in, the stack key's.
            let (inside, src, dst) = if flags & sf::OUT != 0 {
                (stack.addr(1), [stack.addr(1), wire.addr(1)], [stack.addr(0), wire.addr(0)])
            } else {
                (wire.addr(0), [wire.addr(0), stack.addr(0)], [wire.addr(1), stack.addr(1)])
            };
            if src[0] != src[1] {
                nat.forget(nat::Use::Source, wire.af(), inside, src[1]);
            }
            if dst[0] != dst[1] {
                nat.forget(nat::Use::Destination, wire.af(), inside, dst[1]);
            }
        }
    }
}

fn flow_pd(frame: &[u8]) -> Option<PDesc> {
    let mut pd = PDesc::default();
    if parse_ether(frame, &mut pd).is_err() || pd.flags & (pdf::NOT_FIRST_FRAG | pdf::ICMP_ERROR) != 0 {
        return None;
    }
    Some(pd)
}

/// A flow's two states as the kernel fast path holds them ([`Worker::fast_flow`]): the
/// `in` state (where its packets come in) and the `out` state, each by id and insert
/// sequence (an id is reused once its state is gone; the sequence tells).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowRef {
    pub v6: bool,
    pub ids: [u32; 2],
    pub seqs: [u32; 2],
}

impl FlowRef {
    /// The other direction of the flow: its `in` state is this one's `out` state.
    pub fn reversed(&self) -> FlowRef {
        FlowRef { v6: self.v6, ids: [self.ids[1], self.ids[0]], seqs: [self.seqs[1], self.seqs[0]] }
    }
}

/// A flow the fast path may hold ([`Worker::fast_flow`]).
#[derive(Debug, Clone, Copy)]
pub struct FastFlow {
    pub states: FlowRef,
    /// The `in` state's packets in this direction.
    pub packets: u32,
    /// One of the states translates the flow.
    pub translated: bool,
}

/// State `i` (0: `in`, 1: `out`) of `f` if it is still the one `f` names.
fn held<'t, K: Key>(t: &'t StateTable<K>, f: &FlowRef, i: usize) -> Option<&'t xpf_state::State<K>> {
    let s = t.live(f.ids[i])?;
    (t.meta(f.ids[i]).seq == f.seqs[i]).then_some(s)
}

fn flow_pair<K: Key>(
    t: &StateTable<K>,
    pa: &PDesc,
    sent: &[u8],
    in_if: u16,
    out_if: u16,
    bound: bool,
) -> Option<FastFlow> {
    let find = |pd: &PDesc, dir: Dir, kif: u16| {
        let k = K::from_pdesc(pd, dir, 0);
        t.find(&k, t.hash(&k)).or_else(|| {
            let kb = K::from_pdesc(pd, dir, kif);
            if bound {
                t.find(&kb, t.hash(&kb))
            } else {
                None
            }
        })
    };
    let nat = |id: u32| t.state(id).flags & sf::NAT != 0;
    // The `in` pass sees the packet as it came; a translating `in` state matched its wire key
    // and the `out` pass then sees the packet translated (rdr-to, binat-to going in). A
    // translating `out` state matches its stack key (nat-to).
    let ra = find(pa, Dir::In, in_if)?;
    let a = ra & ID_MASK;
    if nat(a) && ra & STACK != 0 {
        return None;
    }
    let rb = if nat(a) {
        let ps = flow_pd(sent).filter(|ps| ps.af == pa.af && ps.proto == pa.proto)?;
        find(&ps, Dir::Out, out_if)?
    } else {
        find(pa, Dir::Out, out_if)?
    };
    let b = rb & ID_MASK;
    if nat(b) && (nat(a) || rb & STACK == 0) {
        return None;
    }
    let translated = nat(a) || nat(b);
    // Flows whose states have actions (scrub, tag, max-pkt-rate, log (all)) stay in xpfd:
    // every packet needs them.
    if t.actions.contains(a) || t.actions.contains(b) {
        return None;
    }
    let s = t.state(a);
    let r = FlowRef { v6: pa.af != AF_INET, ids: [a, b], seqs: [t.meta(a).seq, t.meta(b).seq] };
    let packets = s.packets[(((s.flags & sf::OUT) >> 2) ^ Dir::In as u8) as usize];
    Some(FastFlow { states: r, packets, translated })
}

/// A TCP flow the fast path may judge ([`Worker::fast_tcp`]).
#[derive(Debug, Clone, Copy)]
pub struct FastTcp {
    /// The side of the states (0: the side that created them) the `in` direction's sender is.
    pub from: usize,
    pub peers: [xpf_state::Peer; 2],
}

/// One side's window edges as the fast path left them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Win {
    pub seqlo: u32,
    pub seqhi: u32,
    pub max_win: u16,
}

fn fast_tcp_of<K: Key>(t: &StateTable<K>, f: &FlowRef) -> Option<FastTcp> {
    let est = proto::tcps::ESTABLISHED;
    let mut view: Option<(usize, [xpf_state::Peer; 2])> = None;
    for (i, dir) in [Dir::In, Dir::Out].into_iter().enumerate() {
        let s = held(t, f, i)?;
        if s.key.proto() != IPPROTO_TCP || s.peer_state != [est, est] || t.actions.contains(f.ids[i]) {
            return None;
        }
        let p = *t.peers(f.ids[i])?;
        if p[0].seqdiff != 0 || p[1].seqdiff != 0 {
            return None;
        }
        let from = (((s.flags & sf::OUT) >> 2) ^ dir as u8) as usize;
        let edges = |p: &[xpf_state::Peer; 2]| p.map(|q| (q.seqlo, q.seqhi, q.max_win, q.wscale));
        match view {
            None => view = Some((from, p)),
            Some((f, q)) if f == from && edges(&q) == edges(&p) => {}
            Some(_) => return None,
        }
    }
    let (from, peers) = view?;
    Some(FastTcp { from, peers })
}

fn merge_windows<K: Key>(t: &mut StateTable<K>, f: &FlowRef, win: &[Win; 2], push: bool) -> Option<bool> {
    for i in 0..2 {
        held(t, f, i)?;
    }
    let est = proto::tcps::ESTABLISHED;
    let mut still = true;
    for id in f.ids {
        let (s, p) = t.state_and_peers_mut(id);
        still &= s.peer_state == [est, est];
        let p = p?;
        let mut changed = false;
        for k in 0..2 {
            let w = win[k];
            if (w.seqlo.wrapping_sub(p[k].seqlo) as i32) > 0 {
                p[k].seqlo = w.seqlo;
                changed = true;
            }
            if (w.seqhi.wrapping_sub(p[k].seqhi) as i32) > 0 {
                p[k].seqhi = w.seqhi;
                changed = true;
            }
            if w.max_win > p[k].max_win {
                p[k].max_win = w.max_win;
                changed = true;
            }
        }
        if changed && t.sync_max != 0 {
            t.queue_update(id);
            t.sync_push |= push;
        }
    }
    Some(still)
}

fn account_pair<K: Key>(t: &mut StateTable<K>, f: &FlowRef, add: Option<(u32, u64)>, now: u32) -> bool {
    for i in 0..2 {
        if held(t, f, i).is_none() {
            return false;
        }
    }
    if let Some((packets, bytes)) = add {
        for (i, dir) in [Dir::In, Dir::Out].into_iter().enumerate() {
            let s = t.state_mut(f.ids[i]);
            let side = (((s.flags & sf::OUT) >> 2) ^ dir as u8) as usize;
            s.packets[side] = s.packets[side].wrapping_add(packets);
            s.bytes[side] += bytes;
            s.expire = s.expire.max(now);
        }
    }
    true
}

/// The context of a miss in one family's table, `$other` being the other family's.
macro_rules! ctx {
    ($w:ident, $other:ident, $ifidx:expr, $dir:expr, $now:expr, $tag:expr, $i:expr, $rw:expr) => {
        Ctx {
            aux: &mut $w.aux,
            nat: &mut $w.nat,
            rw: if $rw < BATCH {
                Some((&mut $w.out.rewrites, &mut $w.out.translated, $rw))
            } else if $rw == DGRAM {
                Some((&mut *$w.dgram, &mut $w.dgram_mask, 0))
            } else {
                None
            },
            local: ($i < BATCH && $w.local & (1u64 << $i) != 0) || ($rw == DGRAM && $w.dgram_local),
            tag: $tag,
            queue: &mut $w.out.queues[$i.min(BATCH + 1)],
            route: &mut $w.out.routes[$i.min(BATCH + 1)],
            ret: if $i < BATCH { Some((&mut $w.ret, &mut $w.ret_mask, $i)) } else { None },
            scrub: if $i < BATCH { Some((&mut $w.out.scrubs, &mut $w.out.scrubbed, $i)) } else { None },
            limit: $w.limit,
            other: $w.$other.len(),
            halfopen: $w.t4.halfopen() + $w.t6.halfopen() + if $dir == Dir::In { $w.syn_pending } else { 0 },
            elsewhere: &$w.$other.track,
            ifidx: $ifidx,
            dir: $dir,
            rcvif: $w.rcvif,
            now: $now,
            any_if_bound: &mut $w.any_if_bound,
            rule_passes: &mut $w.stats.rule_passes,
        }
    };
}
use ctx;

/// The worker's random numbers and the synproxy action of the packet at hand (the lane
/// loop takes it after each packet).
struct Aux {
    rng: ChaCha20Rng,
    proxy: Option<(u32, synproxy::Proxy)>,
    /// A logging rule decided the packet just handled.
    log: Option<LogMark>,
    /// `set syncookies` (boxed: the lanes' hot fields stay together).
    cookies: Box<syncookie::Cookies>,
    /// This worker's index ([`Worker::set_index`]).
    worker: u16,
}

struct Ctx<'a> {
    aux: &'a mut Aux,
    nat: &'a mut nat::Nat,
    /// Where the rewrite of frame i of the batch is noted (None: a packet no rewrite can
    /// reach, a reassembled datagram: a translated flow's is dropped as `translate`).
    rw: Option<(&'a mut [Rewrite; BATCH], &'a mut u64, usize)>,
    /// The packet is addressed to this host ([`Worker::process_tagged`]'s `local`).
    local: bool,
    /// The packet's tag: in from an earlier pass, out as the rules or the state leave it.
    tag: &'a mut u16,
    /// Where the packet's queue ids are noted (from the rules or the state).
    queue: &'a mut u32,
    /// Where the packet's routing target is noted (from the rule or the state).
    route: &'a mut u16,
    /// Where a `block return` decision for frame i of the batch is noted (None: a packet
    /// outside the batch, e.g. a reassembled datagram, which gets no answer).
    ret: Option<(&'a mut [Return; BATCH], &'a mut u64, usize)>,
    /// Where the scrub actions for frame i of the batch are noted.
    scrub: Option<(&'a mut [Scrub; BATCH], &'a mut u64, usize)>,
    limit: u32,
    other: u32,
    /// Half-open TCP states in both tables (`set syncookies adaptive`).
    halfopen: u32,
    /// The other family's limits (a rule's `max` counts its states in both).
    elsewhere: &'a xpf_state::Tracking,
    ifidx: u16,
    dir: Dir,
    /// The interface the packet came in on (`received-on`).
    rcvif: u16,
    now: u32,
    any_if_bound: &'a mut bool,
    rule_passes: &'a mut u64,
}

/// An ICMP or ICMPv6 error (`pd`, quoting `q`) met on `ifidx` going `dir` (pf's
/// `pf_test_state_icmp`): it belongs to the state of the packet it quotes, which went the
/// other way. Some(Pass) when that state exists and the error is consistent with it; a
/// `state-mismatch` drop when the state exists but the error is not addressed to the
/// quoted packet's sender (FreeBSD's CVE-2019-5598: a state must not let errors through to
/// anyone else) or quotes a TCP sequence number outside the sender's window; None when no
/// state matches (the rules decide).
#[cold]
#[inline(never)]
fn icmp_error<K: Key>(
    t: &mut StateTable<K>,
    q: &[u8],
    pd: &PDesc,
    ifidx: u16,
    dir: Dir,
    bound: bool,
    out: RwSlot<'_>,
) -> Option<Verdict> {
    let inner = xpf_wire::pdesc::parse_quoted(q, pd.af)?;
    let odir = if dir == Dir::In { Dir::Out } else { Dir::In };
    let k = K::from_pdesc(&inner, odir, 0);
    let r = t.find(&k, t.hash(&k)).or_else(|| {
        let kb = K::from_pdesc(&inner, odir, ifidx);
        if bound {
            t.find(&kb, t.hash(&kb))
        } else {
            None
        }
    })?;
    let id = r & ID_MASK;
    if pd.dst != inner.src {
        t.counters.icmp_mismatch += 1;
        return Some(Verdict::Drop(Reason::StateMismatch));
    }
    if inner.proto == IPPROTO_TCP {
        let s = *t.state(id);
        let from = (((s.flags & sf::OUT) >> 2) ^ odir as u8) as usize;
        if let Some(p) = t.peers(id) {
            if !proto::quoted_seq_ok(p, from, inner.tcp_seq) {
                t.counters.icmp_mismatch += 1;
                return Some(Verdict::Drop(Reason::StateMismatch));
            }
        }
    }
    if t.state(id).flags & sf::NAT != 0 {
        // The quoted packet becomes what it was on the state's other side, and the error's
        // addresses with it (RFC 5508 REQ-4).
        let Some(other) = other_key(t, r, dir) else { return Some(Verdict::Drop(Reason::StateMismatch)) };
        let Some((rws, mask, i)) = out else { return Some(Verdict::Drop(Reason::Translate)) };
        rws[i] = Rewrite { quoted: true, ..nat::oriented(&other, odir) };
        *mask |= 1 << i;
    }
    Some(Verdict::Pass)
}

/// The key a packet of translated state `r` (found by the wire key, or by the stack key with
/// `r & STACK`) going `dir` is rewritten to: going in it must have matched the wire key and
/// takes the stack key, going out the reverse. None for a packet on the wrong side (pf does
/// not match it to the state).
#[inline(always)]
fn other_key<K: Key>(t: &StateTable<K>, r: u32, dir: Dir) -> Option<K> {
    let id = r & ID_MASK;
    match (dir, r & STACK != 0) {
        (Dir::In, false) => t.stack_key(id),
        (Dir::Out, true) => Some(t.state(id).key),
        _ => None,
    }
}

/// [`hit`] for any state: a translated state's packet also gets its rewrite (noted in
/// `out`), or is dropped when it came on the wrong side of the state or where no rewrite can
/// reach it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn hit_nat<K: Key>(
    t: &mut StateTable<K>,
    r: u32,
    pd: &PDesc,
    dir: Dir,
    now: u32,
    aux: &mut Aux,
    out: RwSlot<'_>,
    local: bool,
) -> Option<Verdict> {
    if t.state(r & ID_MASK).flags & sf::NAT == 0 {
        if local {
            // The host's own traffic: its filtering is the host path's.
            return Some(Verdict::Host);
        }
        return hit(t, r, pd, dir, now, aux);
    }
    translated_hit(t, r, pd, dir, now, aux, out)
}

#[inline(always)]
fn translated_hit<K: Key>(
    t: &mut StateTable<K>,
    r: u32,
    pd: &PDesc,
    dir: Dir,
    now: u32,
    aux: &mut Aux,
    out: RwSlot<'_>,
) -> Option<Verdict> {
    let Some(other) = other_key(t, r, dir) else { return Some(Verdict::Drop(Reason::StateMismatch)) };
    let Some((rws, mask, i)) = out else { return Some(Verdict::Drop(Reason::Translate)) };
    let v = hit(t, r, pd, dir, now, aux)?;
    if v == Verdict::Pass {
        let (a, b) = if dir == Dir::In { (0, 1) } else { (1, 0) };
        rws[i].prepare(pd, [other.addr(a), other.addr(b)], [other.port(a), other.port(b)]);
        *mask |= 1 << i;
    }
    Some(v)
}

/// A packet of state `r`: count it, advance the peer states. As in pf, a packet with IP
/// options passes only if the state's rule had `allow-opts`. None when the state was just
/// closed for reuse (a new SYN on a closed TCP connection): the packet is then filtered as
/// if no state matched.
#[inline(always)]
fn hit<K: Key>(t: &mut StateTable<K>, r: u32, pd: &PDesc, dir: Dir, now: u32, aux: &mut Aux) -> Option<Verdict> {
    if pd.proto == IPPROTO_TCP {
        return hit_tcp(t, r & ID_MASK, pd, dir, now, aux);
    }
    let s = t.touch(r & ID_MASK, dir, pd.ip_len, now);
    let from = (((s.flags & sf::OUT) >> 2) ^ dir as u8) as usize;
    let class = proto::on_packet(pd.proto, pd.tcp_flags, from, &mut s.peer_state);
    s.set_class(class);
    if pd.flags & pdf::IP_OPTIONS != 0 && !s.allow_opts() {
        return Some(Verdict::Drop(Reason::IpOption));
    }
    Some(Verdict::Pass)
}

/// A TCP segment of state `id`: pf's window tracking ([`proto::tcp_track`]). A segment out
/// of the window is dropped (`state-mismatch`) without touching the state.
#[inline(never)]
fn hit_tcp<K: Key>(t: &mut StateTable<K>, id: u32, pd: &PDesc, dir: Dir, now: u32, aux: &mut Aux) -> Option<Verdict> {
    let sync_max = t.sync_max;
    let (s, peers) = t.state_and_peers_mut(id);
    if s.flags & sf::DEAD != 0 {
        return None;
    }
    let from = (((s.flags & sf::OUT) >> 2) ^ dir as u8) as usize;
    if s.peer_state[0] >= synproxy::PROXY_SRC {
        return Some(proxy_step(t, id, pd, dir, from, now, aux));
    }
    let st = &mut s.peer_state;
    if pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
        && st[0] >= proto::tcps::FIN_WAIT_2
        && st[1] >= proto::tcps::FIN_WAIT_2
    {
        // A new connection on the ports of a closed one (pf's "state reuse").
        t.remove(id);
        t.counters.reused += 1;
        return None;
    }
    let before = *st;
    let mut next = *st;
    let mut modulated = None;
    let mut push = false;
    let track = match peers {
        Some(p) => {
            let tr = proto::tcp_track(p, &mut next, pd, from);
            if p[0].seqdiff | p[1].seqdiff != 0 && tr != proto::Track::Bad {
                modulated = Some(modulate(p, from, pd, &mut aux.rng));
            }
            if sync_max != 0 && tr != proto::Track::Bad {
                push = sync_count(p, sync_max, pd.payload_len as u32);
            }
            tr
        }
        None => proto::Track::Pass(proto::on_packet(pd.proto, pd.tcp_flags, from, &mut next)),
    };
    *st = next;
    let (class, expire) = (s.class(), s.expire);
    t.modulated = modulated;
    if xpf_state::half_open(before) {
        settle(t, before, next);
    }
    match track {
        proto::Track::Bad => {
            t.counters.window_drops += 1;
            return Some(Verdict::Drop(Reason::StateMismatch));
        }
        proto::Track::Pass(c) => {
            let e = t.touch(id, dir, pd.ip_len, now);
            e.set_class(c);
            // A handshake completed (a RST moves both peers past ESTABLISHED too: a refused
            // connection is not one).
            if e.timeout & xpf_state::table::TO_EXTRA != 0
                && (before[0] < proto::tcps::ESTABLISHED || before[1] < proto::tcps::ESTABLISHED)
                && next[0] >= proto::tcps::ESTABLISHED
                && next[1] >= proto::tcps::ESTABLISHED
                && pd.tcp_flags & tcp::RST == 0
            {
                if let Some(v) = connection_limit(t, id, now) {
                    return Some(v);
                }
            }
        }
        proto::Track::Loose => {
            // pf does not refresh the state for loosely accepted segments.
            let e = t.touch(id, dir, pd.ip_len, now);
            e.expire = expire;
            e.set_class(class);
        }
    }
    if sync_max != 0 && (push || before != next) {
        t.queue_update(id);
        t.sync_push |= push;
    }
    if pd.flags & pdf::IP_OPTIONS != 0 && !t.state(id).allow_opts() {
        return Some(Verdict::Drop(Reason::IpOption));
    }
    Some(Verdict::Pass)
}

/// A segment of a handshake not yet completed moved its state's peers: the half-open count
/// follows (out of line: an established connection only tests its peers).
#[cold]
#[inline(never)]
fn settle<K: Key>(t: &mut StateTable<K>, before: [u8; 2], next: [u8; 2]) {
    t.protostate_changed(before, next);
}

/// Sync for a TCP state (only with sync on): true when it must be pushed (the sync side
/// sends what is queued without waiting): after `maxupdates` counts since its last update went
/// out (pf's pfsync_update_state), where a segment counts one and its payload one more per
/// 256 bytes. A change of its peer states offers it without a push; otherwise `touch` offers
/// it every few seconds, as any state.
///
/// Counting segments alone (pf) does not bound how stale the standby's windows get: 128 full
/// segments are 185 KB of sequence space, and a standby whose copy of a peer's `seqlo` is
/// more than MAXACKWINDOW (66 KB) behind drops that flow's next acknowledgements as
/// state-mismatch after a failover (the flow dies: scripts/failover.sh lost 1-2 of 8 such
/// flows). Counting the payload too, a state is pushed after 32 KB at the default 128, and
/// after 64 KB at most (255). A `sloppy` state has no windows to keep fresh: only its changes
/// are offered.
#[inline(always)]
fn sync_count(p: &mut [xpf_state::Peer; 2], max: u8, payload: u32) -> bool {
    let c = p[0].sync_upd as u32 + 1 + (payload >> 8);
    p[0].sync_upd = c.min(u8::MAX as u32) as u8;
    c >= max as u32
}

/// A segment of a handshake `synproxy state` holds (the cold path out of [`hit_tcp`]).
#[cold]
#[inline(never)]
fn proxy_step<K: Key>(
    t: &mut StateTable<K>,
    id: u32,
    pd: &PDesc,
    dir: Dir,
    from: usize,
    now: u32,
    aux: &mut Aux,
) -> Verdict {
    let (s, peers) = t.state_and_peers_mut(id);
    let Some(p) = peers else { return Verdict::Drop(Reason::Synproxy) };
    let before = s.peer_state;
    let (v, a) = synproxy::step(p, &mut s.peer_state, pd, from, &mut aux.rng);
    let after = s.peer_state;
    let established = after[0] == proto::tcps::ESTABLISHED;
    t.protostate_changed(before, after);
    if let Some(a) = a {
        aux.proxy = Some((id, a));
    }
    if v == Verdict::Pass {
        let e = t.touch(id, dir, pd.ip_len, now);
        if established {
            e.set_class(xpf_state::Timeout::TcpEstablished);
        }
        if t.sync_max != 0 {
            t.queue_update(id);
        }
    }
    v
}

/// `modulate state` on a segment from side `from`: the responder's first SYN gets its own
/// random initial number too (as pf does); returns (added to SEQ, taken from ACK).
#[cold]
#[inline(never)]
fn modulate(p: &mut [xpf_state::Peer; 2], from: usize, pd: &PDesc, rng: &mut ChaCha20Rng) -> (u32, u32) {
    if p[from].seqdiff == 0 && pd.tcp_flags & tcp::SYN != 0 {
        p[from].seqdiff = proto::new_seqdiff(rng, pd.tcp_seq);
    }
    (p[from].seqdiff, p[1 - from].seqdiff)
}

/// State `id`, made by a rule with limits, completed its handshake (pf_src_connlimit): over
/// `max-src-conn` or `max-src-conn-rate`, the state is killed and the segment dropped as
/// `src-limit`; its source goes to the `overload` table (by the daemon, between batches),
/// and with `flush` its states go too (this rule's, or every rule's with `global`).
#[cold]
#[inline(never)]
fn connection_limit<K: Key>(t: &mut StateTable<K>, id: u32, now: u32) -> Option<Verdict> {
    let over = t.track.established(id, now)?;
    if let Some(o) = over.overload.as_ref().filter(|o| o.flush) {
        // pf walks every state for this too; it happens once per overloaded source.
        let victims: Vec<u32> = t
            .iter()
            .filter(|&(i, s)| {
                let src = if s.flags & sf::OUT != 0 { s.key.addr(1) } else { s.key.addr(0) };
                i != id
                    && src == over.src
                    && (o.global || t.track.extra.get(&i).is_some_and(|x| x.limiter == over.limiter))
            })
            .map(|(i, _)| i)
            .collect();
        for v in victims {
            t.remove(v);
        }
        t.track.counters.overload_flush += 1;
    }
    t.remove(id);
    Some(Verdict::Drop(Reason::SrcLimit))
}

/// Where [`state_actions`] puts a `log (all)` state's pflog unit + 1, above the packed scrub
/// actions ([`SCRUB_BITS`]).
pub(crate) const LOG_SHIFT: u32 = 56;
pub(crate) const SCRUB_BITS: u64 = (1 << LOG_SHIFT) - 1;

/// What state `r`'s rules left it besides its verdict: the tag a packet takes from it, the
/// state's packed scrub actions with its `log (all)` pflog unit + 1 above them at
/// [`LOG_SHIFT`] (Ok(0): none); Err
/// when the packet goes over its rule's `max-pkt-rate` (counted only in the state's first
/// direction, as pf_find_state does). Only states of rules with `tag`, `scrub`,
/// `max-pkt-rate` or `log (all)` have any: without such states the map is empty, and this is
/// one test.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn state_actions<K: Key, P: Policy>(
    t: &StateTable<K>,
    p: &P,
    r: u32,
    dir: Dir,
    now: u32,
    tag: &mut u16,
    queue: &mut u32,
    route: &mut u16,
) -> Result<u64, Reason> {
    match t.actions.get(r & ID_MASK) {
        Some(a) => {
            if a.tag != 0 {
                *tag = a.tag;
            }
            *queue = a.queue;
            if a.route != 0 {
                *route = routed(p, a.route, first_direction(t.state(r & ID_MASK).flags, dir));
            }
            if a.rate != 0 && first_direction(t.state(r & ID_MASK).flags, dir) && p.rate_exceeded(a.rate, now) {
                return Err(Reason::PktRate);
            }
            Ok(a.scrub | (a.log as u64) << LOG_SHIFT)
        }
        None => Ok(0),
    }
}

/// Frame `i` hit a state with actions `a` ([`state_actions`]): its scrub actions, and for a
/// `log (all)` state its pflog mark. Out of line: the lane loop's common hit has none.
#[cold]
#[inline(never)]
fn state_marks(
    (scrubs, scrubbed, logs, logged): (&mut [Scrub; BATCH], &mut u64, &mut [LogMark; BATCH], &mut u64),
    i: usize,
    a: u64,
    rule: u32,
    dir: Dir,
) {
    if a & SCRUB_BITS != 0 {
        scrubs[i] = Scrub::unpack(a & SCRUB_BITS);
        *scrubbed |= 1 << i;
    }
    let log = (a >> LOG_SHIFT) as u8;
    if log != 0 && i < BATCH {
        logs[i] = LogMark::of(rule, log, dir);
        *logged |= 1 << i;
    }
}

/// Routing target `route` if it applies to a packet of its state going the way the state's
/// first packet went (`first`) or not: `route-to` the first way, `reply-to` the other
/// (pf_route); else 0.
#[inline]
fn routed<P: Policy>(p: &P, route: u16, first: bool) -> u16 {
    match p.route(route) {
        Some(rt) if rt.reply != first => route,
        _ => 0,
    }
}

/// The routing target of state `r`'s packet leaving (`dir` out) by interface `ifidx` when the
/// target sends it out of another: pf passes it here unfiltered (its STATE_LOOKUP) and
/// filters it leaving by the target's interface. None otherwise, and at once for a table
/// whose states have no actions.
#[inline(always)]
fn leaves_elsewhere<K: Key, P: Policy>(t: &StateTable<K>, p: &P, r: u32, dir: Dir, ifidx: u16) -> Option<u16> {
    if dir != Dir::Out || t.actions.is_empty() {
        return None;
    }
    let a = t.actions.get(r & ID_MASK).filter(|a| a.route != 0)?;
    let rt = p.route(a.route)?;
    let applies = rt.reply != first_direction(t.state(r & ID_MASK).flags, dir);
    (applies && rt.ifidx != 0 && rt.ifidx != ifidx).then_some(a.route)
}

/// Whether a packet in direction `dir` goes the way its state's first packet went.
#[inline(always)]
fn first_direction(state_flags: u8, dir: Dir) -> bool {
    ((state_flags & sf::OUT) >> 2) ^ dir as u8 == 0
}

/// Notes scrub actions `s` for the frame a miss handles.
#[inline]
fn note_scrub(at: Option<(&mut [Scrub; BATCH], &mut u64, usize)>, s: Scrub) {
    if let Some((scrubs, mask, i)) = at.filter(|_| !s.is_none()) {
        scrubs[i] = s;
        *mask |= 1 << i;
    }
}

/// A miss that found its state after all (made earlier in the batch, or if-bound): the
/// hit's verdict `v` with the state's actions.
#[inline]
fn with_actions<K: Key, P: Policy>(t: &StateTable<K>, p: &P, r: u32, c: Ctx, v: Verdict) -> Verdict {
    match state_actions(t, p, r, c.dir, c.now, c.tag, c.queue, c.route) {
        Ok(a) => {
            note_scrub(c.scrub, Scrub::unpack(a & SCRUB_BITS));
            let log = (a >> LOG_SHIFT) as u8;
            if log != 0 {
                let rule = t.meta(r & ID_MASK).rule;
                c.aux.log = Some(LogMark::of(rule, log, c.dir));
            }
            v
        }
        Err(why) => Verdict::Drop(why),
    }
}

type RwSlot<'a> = Option<(&'a mut [Rewrite; BATCH], &'a mut u64, usize)>;

/// A new flow's translation: the translated packet's key, the rewrite to it, and the source
/// port it holds (address, port) if the allocator gave one.
type Translation<K> = (K, Rewrite, Option<(xpf_wire::Addr, u16)>);

/// A context's rewrite slot ([`Ctx::rw`]), reborrowed.
fn slot<'b>(rw: &'b mut RwSlot<'_>) -> RwSlot<'b> {
    rw.as_mut().map(|(r, m, i)| (&mut **r, &mut **m, *i))
}

/// The addresses a new flow of `pd` is translated to by pools `nat` and `rdr` (index + 1, 0
/// for none; pf_get_transaddr), and a `rdr-to`'s port: the packet as the rules after a
/// translation see it. The source port is [`translate_port`]'s. Err(`translate`) when the
/// pool has no address of the family (counted in [`nat::Counters`]).
fn translate_addrs<P: Policy>(
    p: &P,
    nat: &mut nat::Nat,
    rng: &mut ChaCha20Rng,
    pd: &PDesc,
    nat_pool: u32,
    rdr_pool: u32,
) -> Result<PDesc, Reason> {
    let mut n = *pd;
    let icmp = matches!(pd.proto, xpf_wire::pdesc::IPPROTO_ICMP | xpf_wire::pdesc::IPPROTO_ICMPV6);
    if rdr_pool != 0 {
        let pool = p.pool(rdr_pool).ok_or(Reason::Translate)?;
        n.dst = choose(nat, pool, rdr_pool, nat::Use::Destination, pd, &pd.dst, rng)?;
        if nat::has_port(pd) && !icmp {
            n.dport = pool.rdr_port(pd.dport);
        }
    }
    if nat_pool != 0 {
        let pool = p.pool(nat_pool).ok_or(Reason::Translate)?;
        // `endpoint-independent`: a UDP source that has a mapping keeps its address (if the
        // pool still has it).
        let mapped = if pool.endpoint_independent { mapped_address(nat, pool, pd) } else { None };
        n.src = match mapped {
            Some(a) => a,
            None => choose(nat, pool, nat_pool, nat::Use::Source, pd, &pd.src, rng)?,
        };
    }
    Ok(n)
}

/// The address pool `i` gives `pd` for `u`, replacing `orig`: the one a `sticky-address`
/// source keeps, else by the pool's method (`least-states` compares the loads the worker
/// counts). Err(`translate`) when the pool has no address of the family (counted).
fn choose(
    nat: &mut nat::Nat,
    pool: &nat::Pool,
    i: u32,
    u: nat::Use,
    pd: &PDesc,
    orig: &xpf_wire::Addr,
    rng: &mut ChaCha20Rng,
) -> Result<xpf_wire::Addr, Reason> {
    if pool.sticky {
        if let Some(a) = nat.stuck(pd.src, pd.af, u).filter(|a| pool.contains(pd.af, a)) {
            return Ok(a);
        }
    }
    let a = if pool.method == nat::Method::LeastStates {
        let total = pool.count(pd.af);
        let cursor = nat.cursor(i as usize);
        let start = *cursor;
        *cursor = start.wrapping_add(1);
        (0..nat::LEAST_OF.min(total))
            .filter_map(|k| pool.nth(pd.af, start.wrapping_add(k)))
            .min_by_key(|a| nat.load(*a, pd.af, u))
    } else {
        pool.pick(pd.af, &pd.src, orig, rng, nat.cursor(i as usize))
    };
    a.ok_or_else(|| {
        nat.counters.no_address += 1;
        nat.refuse(i, false);
        Reason::Translate
    })
}

/// A translated state of `pd` was made (`d`'s pools, `rw` its translated addresses): counted
/// for `sticky-address` and `least-states` once such a pool is in use.
fn note_translation<P: Policy>(p: &P, nat: &mut nat::Nat, pd: &PDesc, d: &Decision, rw: &Rewrite, now: u32) {
    let pool = |i: u32| (i != 0).then(|| p.pool(i)).flatten();
    let counted = |i: u32| pool(i).is_some_and(|pl| pl.sticky || pl.method == nat::Method::LeastStates);
    if !nat.tracking() && !counted(d.nat) && !counted(d.rdr) {
        return;
    }
    let sticky = |i: u32| pool(i).is_some_and(|pl| pl.sticky);
    if d.nat != 0 {
        nat.note(nat::Use::Source, pd.af, pd.src, rw.addr[0], sticky(d.nat), now);
    }
    if d.rdr != 0 {
        nat.note(nat::Use::Destination, pd.af, pd.src, rw.addr[1], sticky(d.rdr), now);
    }
}

/// `endpoint-independent`: the address UDP source `pd` was mapped to, if the pool still has it.
#[cold]
#[inline(never)]
fn mapped_address(nat: &nat::Nat, pool: &nat::Pool, pd: &PDesc) -> Option<xpf_wire::Addr> {
    if pd.proto != xpf_wire::pdesc::IPPROTO_UDP {
        return None;
    }
    nat.mapping(pd.src, pd.af, pd.sport).map(|m| m.0).filter(|a| pool.contains(pd.af, a))
}

/// `endpoint-independent`: the address and port UDP source `pd` was mapped to, taken once
/// more, if `n` has that address and `unused(port)` (the flow's key is free).
#[cold]
#[inline(never)]
fn mapped_port(
    nat: &mut nat::Nat,
    pool: &nat::Pool,
    pd: &PDesc,
    n: &PDesc,
    unused: impl Fn(u16) -> bool,
) -> Option<(xpf_wire::Addr, u16)> {
    let to = nat.mapping(pd.src, pd.af, pd.sport).filter(|to| to.0 == n.src)?;
    (unused(to.1) && nat.reuse_mapping((pd.src, pd.sport), pd.af, to, pool.range())).then_some(to)
}

/// The source port for `n` (a new flow of `pd` with its addresses translated by
/// [`translate_addrs`]) from `nat_pool`'s range: the translated packet's key (interface
/// `kif`), the rewrite to it, and the allocated source port to give back if the state is not
/// made. Err(`translate`) when no port is left (counted).
#[allow(clippy::too_many_arguments)]
fn translate_port<K: Key, P: Policy>(
    t: &StateTable<K>,
    p: &P,
    nat: &mut nat::Nat,
    rng: &mut ChaCha20Rng,
    pd: &PDesc,
    mut n: PDesc,
    nat_pool: u32,
    dir: Dir,
    kif: u16,
    now: u32,
) -> Result<Translation<K>, Reason> {
    let icmp = matches!(pd.proto, xpf_wire::pdesc::IPPROTO_ICMP | xpf_wire::pdesc::IPPROTO_ICMPV6);
    let mut held = None;
    if let Some(pool) = (nat_pool != 0).then(|| p.pool(nat_pool)).flatten() {
        let with_port = |n: &PDesc, port: u16| {
            let mut q = *n;
            q.sport = port;
            if icmp {
                q.dport = port;
            }
            K::from_pdesc(&q, dir, kif)
        };
        let unused = |k: K| t.find(&k, t.hash(&k)).is_none();
        let ei = pool.endpoint_independent && pd.proto == xpf_wire::pdesc::IPPROTO_UDP;
        if ei && pool.ports.0 != pool.ports.1 && !pool.static_port {
            if let Some(to) = mapped_port(nat, pool, pd, &n, |q| unused(with_port(&n, q))) {
                n.sport = to.1;
                return Ok((K::from_pdesc(&n, dir, kif), nat::of_packet(&n), Some(to)));
            }
        }
        // `static-port` keeps an ICMP echo's identifier while no other flow holds it; one
        // that another host's echo to the same far end holds (two hosts' `ping`s, Windows'
        // identifier always 1) gets another, as pf_get_sport gives every echo one of 1-65535
        // whatever the rule says of ports: an identifier means nothing to the hosts but the
        // pairing of requests and replies.
        let static_echo = pool.static_port && icmp && nat::has_port(pd);
        let range = if static_echo { nat::Range::from((1, u16::MAX)) } else { pool.range() };
        // The translated key with the packet's own identifier, asked once: free, it is kept.
        let kept = static_echo && unused(K::from_pdesc(&n, dir, kif));
        let (lo, hi) = (range.lo, range.hi);
        if !kept && (static_echo || (nat::has_port(pd) && !pool.static_port && pool.ports != (0, 0))) {
            let port = if lo == hi {
                Some(lo).filter(|&q| unused(with_port(&n, q)))
            } else {
                let src = n;
                nat.take_port((src.src, pd.af), pd.proto, range, now, rng, |q| unused(with_port(&src, q)))
            };
            let Some(port) = port else {
                // The allocator counted its own refusal; a one-port range is counted here.
                if lo == hi {
                    nat.counters.exhausted += 1;
                }
                nat.refuse(nat_pool, true);
                return Err(Reason::Translate);
            };
            if lo != hi {
                held = Some((n.src, port));
                if ei {
                    nat.map(pd.af, (pd.src, pd.sport), (n.src, port));
                }
            }
            n.sport = port;
            if icmp {
                n.dport = port;
            }
        }
        if held.is_none() && !kept && !unused(K::from_pdesc(&n, dir, kif)) {
            // No port was chosen (a protocol without ports, `static-port`, the range's one
            // port) and the translated flow is another's: refused as pf_get_sport refuses
            // it, not matched to that flow's state from the wrong side.
            nat.counters.exhausted += 1;
            nat.refuse(nat_pool, true);
            return Err(Reason::Translate);
        }
    }
    Ok((K::from_pdesc(&n, dir, kif), nat::of_packet(&n), held))
}

/// What pflog records of a logged frame: the deciding rule, the pflog unit (`log (to
/// pflogN)`), and pf's action, reason and direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogMark {
    pub rule: u32,
    pub unit: u8,
    /// pf's PF_PASS (0) or PF_DROP (1).
    pub action: u8,
    /// pf's reason code (PFRES_*).
    pub reason: u8,
    /// pf's PF_IN (1) or PF_OUT (2).
    pub dir: u8,
}

impl LogMark {
    /// Rule `rule`'s mark for pflog unit `log - 1` (a rule's `log`: unit + 1) in direction
    /// `dir`; the action and reason come from the verdict after the batch.
    fn of(rule: u32, log: u8, dir: Dir) -> LogMark {
        LogMark { rule, unit: log - 1, dir: dir as u8 + 1, ..LogMark::default() }
    }
}

const PF_PASS: u8 = 0;
const PF_DROP: u8 = 1;

/// pf's reason code for a drop: pf's own reasons have its numbers (the first 17 of
/// [`Reason`], in pf's order); xpf's finer ones are pf's `normalize`.
pub fn pf_reason(r: Reason) -> u8 {
    const PF_REASONS: usize = 17;
    if (r as usize) < PF_REASONS {
        r as u8
    } else {
        4
    }
}

/// [`miss`] for a packet not keyed in a batch, keyed as `keyed` (`pd` itself, or with the
/// addresses neighbour discovery is keyed by).
fn miss_whole<K: Key, P: Policy>(t: &mut StateTable<K>, p: &P, c: Ctx, pd: &PDesc, keyed: &PDesc) -> Verdict {
    let k = K::from_pdesc(keyed, c.dir, 0);
    let h = t.hash(&k);
    miss(t, p, c, pd, k, h)
}

/// No state: ask the ruleset, and create the state if the rule keeps state.
#[inline(never)]
fn miss<K: Key, P: Policy>(t: &mut StateTable<K>, p: &P, c: Ctx, pd: &PDesc, key: K, h: u64) -> Verdict {
    let mut c = c;
    // Created by an earlier packet of this batch, or if-bound to this interface.
    if let Some(r) = t.find(&key, h) {
        if let Some(v) = hit_nat(t, r, pd, c.dir, c.now, c.aux, slot(&mut c.rw), c.local) {
            return with_actions(t, p, r, c, v);
        }
    }
    if *c.any_if_bound {
        let kb = key.on(c.ifidx);
        if let Some(r) = t.find(&kb, t.hash(&kb)) {
            if let Some(v) = hit_nat(t, r, pd, c.dir, c.now, c.aux, slot(&mut c.rw), c.local) {
                return with_actions(t, p, r, c, v);
            }
        }
    }
    // pf's PF_ICMP_MULTI_LINK: an IPv6 echo to ff02::1 is answered by every node of the link
    // from its own address; a reply no state claims is looked up again as from ff02::1,
    // where the request's state has it (`ping ff02::1%if` under `block all; pass out`).
    if pd.proto == xpf_wire::pdesc::IPPROTO_ICMPV6
        && pd.icmp_type == xpf_wire::icmp::V6_ECHO_REPLY
        && pd.flags & pdf::NOT_FIRST_FRAG == 0
    {
        let k = K::from_pdesc(&PDesc { src: xpf_wire::pdesc::ALL_NODES, ..*pd }, c.dir, key.kif());
        if let Some(r) = t.find(&k, t.hash(&k)) {
            if let Some(v) = hit_nat(t, r, pd, c.dir, c.now, c.aux, slot(&mut c.rw), c.local) {
                return with_actions(t, p, r, c, v);
            }
        }
    }
    // `set syncookies`: an ACK that proves a cookie is filtered as the SYN it answers.
    let recreated: PDesc;
    let ack = pd;
    let mut cookie_mss = None;
    let pd = if pd.proto == IPPROTO_TCP
        && !c.local
        && c.dir == Dir::In
        && pd.tcp_flags & (tcp::SYN | tcp::ACK | tcp::RST | tcp::FIN) == tcp::ACK
        && c.aux.cookies.maybe(c.now)
    {
        match c.aux.cookies.check(pd, c.now) {
            Some(mss) => {
                cookie_mss = Some(mss);
                recreated = syncookie::recreate(pd);
                &recreated
            }
            None => pd,
        }
    } else {
        pd
    };
    let rnd = if p.wants_random() { rand_core::Rng::next_u32(&mut c.aux.rng) } else { 0 };
    let at = Context { ifidx: c.ifidx, dir: c.dir, rcvif: c.rcvif, tag: *c.tag, rnd, now: c.now, worker: c.aux.worker };
    // FreeBSD's translation rules come first; the filter rules then see the packet with its
    // translated addresses (and a rdr's port), or not at all after a `pass` one.
    let mut pre = None;
    let x = match p.translation(pd, &at) {
        // Not for a packet that cannot leave its link (as the filter's translations, below).
        Some(x) if pd.link_scoped() => {
            if x.rdr != 0 && !pd.link_control() {
                return Verdict::Drop(Reason::Translate);
            }
            None
        }
        x => x,
    };
    let mut d = match x {
        None => p.evaluate_in(pd, &at),
        Some(x) => {
            let n = match translate_addrs(p, c.nat, &mut c.aux.rng, pd, x.nat, x.rdr) {
                Ok(n) => n,
                Err(why) => return Verdict::Drop(why),
            };
            pre = Some(n);
            let d = if x.pass {
                Decision { rule: x.rule, tag: x.tag, pickup: true, log: x.log, ..Decision::PASS }
            } else {
                p.evaluate_in(&n, &Context { tag: x.tag, ..at })
            };
            Decision { keep_state: d.action == Action::Pass, nat: x.nat, rdr: x.rdr, ..d }
        }
    };
    // A packet that cannot leave its link (neighbour discovery, MLD, link-local and
    // link-scoped multicast addresses) is not translated: its addresses only mean something
    // on the link, and rewritten they would break the link's protocols (a host's neighbour
    // advertisements, its MLD reports, its duplicate address detection from ::). Sent
    // elsewhere by a `rdr-to`, it would reach a host that cannot answer it: refused as
    // translate (below, after the rules' verdict and log), as a failed translation is.
    let mut refuse = false;
    if (d.nat | d.rdr) != 0 && pd.link_scoped() {
        refuse = d.rdr != 0 && !pd.link_control();
        d.nat = 0;
        if !refuse {
            d.rdr = 0;
        }
    }
    if c.local && (d.action == Action::Block || d.rdr == 0) {
        // The host's, not a translation's: the host path filters it.
        return Verdict::Host;
    }
    if d.log != 0 {
        // Taken by the caller for the frame at hand; the action and reason are the verdict's,
        // noted after the batch.
        c.aux.log = Some(LogMark::of(d.rule, d.log, c.dir));
    }
    *c.tag = d.tag;
    if d.action == Action::Block {
        t.tally.decided(d.rule, c.dir == Dir::Out, pd.ip_len as u64);
        if !d.ret.is_drop() {
            if let Some((ret, mask, i)) = c.ret {
                ret[i] = d.ret;
                *mask |= 1 << i;
            }
        }
        return Verdict::Drop(Reason::Match);
    }
    if pd.flags & pdf::IP_OPTIONS != 0 && !d.allow_opts {
        return Verdict::Drop(Reason::IpOption);
    }
    if refuse {
        return Verdict::Drop(Reason::Translate);
    }
    *c.rule_passes += 1;
    note_scrub(c.scrub, d.scrub);
    *c.queue = d.queue;
    // A new state's first packet goes its rule's way: `route-to` applies to it.
    if d.route != 0 {
        *c.route = routed(p, d.route, true);
    }
    if !d.keep_state || !proto::may_create(pd, d.pickup) {
        // pf: a proven cookie makes a state or nothing (the rule keeps no state). A translated
        // packet without a state would leave untranslated: it does not leave.
        return if cookie_mss.is_some() {
            Verdict::Drop(Reason::Synproxy)
        } else if d.nat != 0 || d.rdr != 0 {
            Verdict::Drop(Reason::Translate)
        } else {
            if d.rule != policy::NO_RULE {
                t.tally.decided(d.rule, c.dir == Dir::Out, pd.ip_len as u64);
            }
            Verdict::Pass
        };
    }
    if c.dir == Dir::In
        && cookie_mss.is_none()
        && pd.proto == IPPROTO_TCP
        && pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
    {
        c.aux.cookies.watch(c.halfopen, c.limit);
        if c.aux.cookies.active() || d.synproxy {
            // No state: the SYN|ACK carries it (built after the batch, where the SYN's MSS
            // option is at hand). `synproxy state` answers so always: its first step needs
            // no state, and a flood then fills no table (pf's fills it with PROXY:SRC states).
            c.aux.proxy = Some((NONE, synproxy::Proxy::Cookie));
            return Verdict::Drop(Reason::Synproxy);
        }
    }
    if t.len() + c.other >= c.limit {
        t.counters.limit_drops += 1;
        return Verdict::Drop(Reason::StateLimit);
    }
    let limits = if d.limits != 0 { p.limits(d.limits) } else { None };
    if let Some(l) = limits {
        match t.track.admit(l, pd.src, c.elsewhere) {
            Ok(()) => {}
            Err(Refusal::Max) => return Verdict::Drop(Reason::StateLimit),
            Err(Refusal::Src) => return Verdict::Drop(Reason::SrcLimit),
        }
    }
    let (key, h) = if d.if_bound {
        *c.any_if_bound = true;
        let kb = key.on(c.ifidx);
        (kb, t.hash(&kb))
    } else {
        (key, h)
    };
    // Translation: the packet's key is the wire key going in and the stack key going out;
    // the translated packet's is the other.
    let (mut wire, mut wire_h, mut stack, mut rewrite, mut held) = (key, h, None, None, None);
    if d.nat != 0 || d.rdr != 0 {
        if c.rw.is_none() {
            return Verdict::Drop(Reason::Translate);
        }
        let n = match pre {
            Some(n) => Ok(n),
            None => translate_addrs(p, c.nat, &mut c.aux.rng, pd, d.nat, d.rdr),
        };
        match n.and_then(|n| translate_port(t, p, c.nat, &mut c.aux.rng, pd, n, d.nat, c.dir, key.kif(), c.now)) {
            Ok((k, rw, port)) if k != key => {
                if c.dir == Dir::Out {
                    (wire, wire_h, stack) = (k, t.hash(&k), Some(key));
                } else {
                    stack = Some(k);
                }
                rewrite = Some(rw);
                held = port;
            }
            Ok(_) => {}
            Err(why) => return Verdict::Drop(why),
        }
    }
    let (timeout, src_state, dst_state, mut tcp) = proto::initial(pd);
    if d.sloppy {
        tcp = None;
    }
    let mut seqdiff = 0;
    if let Some(p) =
        tcp.as_mut().filter(|_| d.modulate && cookie_mss.is_none() && pd.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN)
    {
        seqdiff = proto::new_seqdiff(&mut c.aux.rng, pd.tcp_seq);
        p[0].seqdiff = seqdiff;
    }
    let ns = NewState {
        key: wire,
        stack,
        dir: c.dir,
        rule: d.rule,
        timeout,
        src_state,
        dst_state,
        tcp,
        nosync: d.nosync,
        allow_opts: d.allow_opts,
        sloppy: d.sloppy,
        tag: d.tag,
        scrub: d.scrub.pack(),
        rate: d.rate,
        pflow: d.pflow,
        log: if d.log_all { d.log } else { 0 },
        queue: d.queue,
        route: d.route,
        held: match (stack, held) {
            (None, _) => 0,
            (Some(_), None) => xpf_state::held::COUNTED,
            (Some(_), Some(_)) => xpf_state::held::COUNTED | xpf_state::held::PORT,
        },
    };
    let inserted = t.insert(wire_h, ns, c.now);
    if let (Err(_), Some((a, port))) = (&inserted, held) {
        c.nat.put_port(a, pd.af, pd.proto, port, c.now);
    }
    match inserted {
        Ok(id) => {
            if let Some(l) = limits {
                t.attach(id, l, pd.src, c.now);
            }
            if let (Some(rw), Some((rws, mask, i))) = (rewrite, slot(&mut c.rw)) {
                rws[i].prepare(pd, rw.addr, rw.port);
                *mask |= 1 << i;
                c.nat.counters.translated += 1;
                note_translation(p, c.nat, pd, &d, &rw, c.now);
            }
            if seqdiff != 0 {
                t.modulated = Some((seqdiff, 0));
            }
            t.touch(id, c.dir, pd.ip_len, c.now);
            t.created = Some(id);
            if let Some(mss) = cookie_mss {
                // The handshake with the client is done (the cookie proved it); the one with
                // the server goes as synproxy's: this ACK goes on as the SYN to the server.
                let (s, peers) = t.state_and_peers_mut(id);
                let Some(p) = peers else { return Verdict::Drop(Reason::Synproxy) };
                synproxy::proven(p, &mut s.peer_state, ack, mss);
                let (v, a) = synproxy::step(p, &mut s.peer_state, ack, 0, &mut c.aux.rng);
                if let Some(a) = a {
                    c.aux.proxy = Some((id, a));
                }
                return v;
            }
            // `synproxy state` answered an inbound SYN above, with no state. pf proxies inbound
            // connections only (pfctl warns of it on an outbound rule): going out, the state
            // is kept as `keep state` keeps it.
            Verdict::Pass
        }
        Err(xpf_state::InsertError::Exists(r)) => {
            let out = slot(&mut c.rw);
            hit_nat(t, r, pd, c.dir, c.now, c.aux, out, c.local).unwrap_or(Verdict::Drop(Reason::StateInsert))
        }
        Err(xpf_state::InsertError::Limit) => Verdict::Drop(Reason::StateLimit),
        Err(xpf_state::InsertError::Memory) => Verdict::Drop(Reason::Memory),
    }
}

#[cfg(test)]
mod tests;
