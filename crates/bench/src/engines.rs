//! The engines a bench drives with the same frames: xpf's own worker (the daemon's code), and
//! the baseline the issue asks for beside it, a plain `HashMap<FlowKey, State>` (hashbrown with
//! foldhash) doing the same parse, key, lookup-or-insert and counter update, one packet at a time.

use hashbrown::HashMap;
use xpf_engine::{BlockAll, PassAll, Verdict, Worker, WorkerConfig, BATCH};
use xpf_io::gen::FRAME_LEN;
use xpf_state::{Dir, Key, Key4, Seed};
use xpf_wire::{parse_ether, PDesc};

pub trait Engine: Send {
    /// Filters frames (at most BATCH); returns how many passed.
    fn process(&mut self, frames: &[&[u8]], now: u32) -> usize;
    fn states(&self) -> u64;
    fn inserts(&self) -> u64;
    /// The caller's transmit stage after `process`: writes what the batch's rewrites say into
    /// its frames, in place, as a zero-copy transmit does (nothing without translation).
    fn transmit(&mut self, _frames: &mut [[u8; FRAME_LEN]]) {}
    /// Background work between chunks (expiry; nothing for the baseline).
    fn maintain(&mut self, _now: u32) {}
    /// After the warm-up: runs any index resize the warm-up started to its end, so that the
    /// runs measure the table as a daemon has it once its background work is done.
    fn settle(&mut self) {}
}

pub struct Xpf<P: xpf_engine::Policy = PassAll> {
    pub w: Worker<P>,
    verdicts: [Verdict; BATCH],
}

/// A bench worker's configuration: a table for `limit` states (prefaulted), `rows` index
/// rows (None: sized from the limit), sync's event queues of `events` entries (0: off).
fn config(limit: u64, rows: Option<u32>, events: usize) -> WorkerConfig {
    WorkerConfig {
        limit: limit as u32,
        rows,
        seed: Seed::random(),
        events,
        now: 1,
        prefault: true,
        secret: xpf_state::os_random(),
    }
}

impl Xpf {
    pub fn new(limit: u64, rows: Option<u32>) -> Xpf {
        Xpf::with_events(limit, rows, 0)
    }
    /// With sync's event queues of `events` entries (0: off).
    pub fn with_events(limit: u64, rows: Option<u32>, events: usize) -> Xpf {
        Xpf::with_policy(config(limit, rows, events), PassAll)
    }
}

/// xpf's worker under `block all`: every packet a first packet, decided by the rule and
/// dropped (and counted on it), no state made: what a flood against a blocked port costs.
pub type XpfBlock = Xpf<BlockAll>;

impl XpfBlock {
    pub fn blocking(limit: u64) -> XpfBlock {
        Xpf::with_policy(config(limit, None, 0), BlockAll)
    }
}

impl<P: xpf_engine::Policy> Xpf<P> {
    fn with_policy(cfg: WorkerConfig, p: P) -> Xpf<P> {
        Xpf { w: Worker::new(cfg, p).expect("state table memory"), verdicts: [Verdict::Pass; BATCH] }
    }
}

impl<P: xpf_engine::Policy + Send> Engine for Xpf<P> {
    #[inline]
    fn process(&mut self, frames: &[&[u8]], now: u32) -> usize {
        self.w.process(frames, 1, Dir::In, now, &mut self.verdicts);
        self.verdicts[..frames.len()].iter().filter(|v| **v == Verdict::Pass).count()
    }
    fn states(&self) -> u64 {
        self.w.states() as u64
    }
    fn inserts(&self) -> u64 {
        self.w.t4.counters.inserts + self.w.t6.counters.inserts
    }
    fn maintain(&mut self, now: u32) {
        self.w.maintain(now, 64);
    }
    fn settle(&mut self) {
        self.w.t4.finish_resize();
        self.w.t6.finish_resize();
    }
}

/// The policy of the translation bench: pass, keep state, and (with a pool) `nat-to` it.
pub struct NatPolicy(pub Option<xpf_engine::nat::Pool>);

impl xpf_engine::Policy for NatPolicy {
    fn evaluate(&self, _: &PDesc, _: u16, _: Dir) -> xpf_engine::Decision {
        xpf_engine::Decision { nat: self.0.is_some() as u32, ..xpf_engine::Decision::PASS }
    }
    fn pool(&self, _: u32) -> Option<&xpf_engine::nat::Pool> {
        self.0.as_ref()
    }
}

/// xpf's worker filtering `out` (where `nat-to` translates) under [`NatPolicy`]: the frames a
/// translation rewrites are rewritten in place by [`Engine::transmit`]
/// ([`xpf_wire::translate::apply`], incremental checksums), as a zero-copy transmit does (in
/// copy mode xpfd applies it to the transmit copy every forwarded frame gets, translated or
/// not), so the figure holds the rewrite and not a copy only translated frames would pay.
pub struct XpfOut {
    pub w: Worker<NatPolicy>,
    verdicts: [Verdict; BATCH],
}

impl XpfOut {
    /// Flows from the generator's sources, translated to `pool` (None: not translated).
    pub fn new(limit: u64, pool: Option<xpf_engine::nat::Pool>) -> XpfOut {
        let cfg = config(limit, None, 0);
        XpfOut { w: Worker::new(cfg, NatPolicy(pool)).expect("state table memory"), verdicts: [Verdict::Pass; BATCH] }
    }
}

impl Engine for XpfOut {
    #[inline]
    fn process(&mut self, frames: &[&[u8]], now: u32) -> usize {
        self.w.process(frames, 1, Dir::Out, now, &mut self.verdicts);
        self.verdicts[..frames.len()].iter().filter(|v| **v == Verdict::Pass).count()
    }
    #[inline]
    fn transmit(&mut self, frames: &mut [[u8; FRAME_LEN]]) {
        let b = self.w.batch();
        let mut m = b.translated;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            xpf_wire::translate::apply(&mut frames[i], &b.rewrites[i]);
        }
    }
    fn states(&self) -> u64 {
        self.w.states() as u64
    }
    fn inserts(&self) -> u64 {
        self.w.t4.counters.inserts + self.w.t6.counters.inserts
    }
    fn maintain(&mut self, now: u32) {
        self.w.maintain(now, 64);
    }
    fn settle(&mut self) {
        self.w.t4.finish_resize();
        self.w.t6.finish_resize();
    }
}

/// The baseline's state: the same data an xpf entry holds, without the key.
#[derive(Clone, Copy)]
#[allow(dead_code)]
pub struct BaseState {
    expire: u32,
    creation: u32,
    rule: u32,
    timeout: u8,
    src_state: u8,
    dst_state: u8,
    flags: u8,
    packets: [u32; 2],
    bytes: [u64; 2],
}

pub struct HashMapBaseline {
    map: HashMap<Key4, BaseState, foldhash::fast::RandomState>,
    inserts: u64,
}

impl HashMapBaseline {
    pub fn new(limit: u64) -> Self {
        HashMapBaseline {
            map: HashMap::with_capacity_and_hasher(limit as usize, foldhash::fast::RandomState::default()),
            inserts: 0,
        }
    }
}

impl Engine for HashMapBaseline {
    #[inline]
    fn process(&mut self, frames: &[&[u8]], now: u32) -> usize {
        let mut passed = 0;
        for f in frames {
            let mut pd = PDesc::default();
            if parse_ether(f, &mut pd).is_err() {
                continue;
            }
            let k = Key4::from_pdesc(&pd, Dir::In, 0);
            match self.map.get_mut(&k) {
                Some(s) => {
                    s.packets[0] = s.packets[0].wrapping_add(1);
                    s.bytes[0] += pd.ip_len as u64;
                    s.expire = now;
                }
                None => {
                    self.map.insert(
                        k,
                        BaseState {
                            expire: now,
                            creation: now,
                            rule: 0,
                            timeout: 0,
                            src_state: 1,
                            dst_state: 0,
                            flags: 0,
                            packets: [1, 0],
                            bytes: [pd.ip_len as u64, 0],
                        },
                    );
                    self.inserts += 1;
                }
            }
            passed += 1;
        }
        passed
    }
    fn states(&self) -> u64 {
        self.map.len() as u64
    }
    fn inserts(&self) -> u64 {
        self.inserts
    }
}
