//! Replays a capture through the engine (the daemon's code path) and reports what happened to
//! every packet: passed, dropped with which reason, handed to the host, or not readable.

use std::path::Path;
use xpf_engine::{Policy, Verdict, Worker, WorkerConfig, BATCH};
use xpf_io::{pcap, replay};
use xpf_state::{Dir, Key, Key4, Key6, Seed};
use xpf_wire::Reason;

#[derive(Debug, Default, Clone)]
pub struct Report {
    pub records: u64,
    pub passed: u64,
    pub to_host: u64,
    /// (reason, count), in pf's order, only reasons seen.
    pub dropped: Vec<(Reason, u64)>,
    /// Records not turned into frames (link type, short link header, not IP).
    pub skipped: u64,
    /// Fragments still held for reassembly at the end (their datagram never completed).
    pub held: u64,
    pub states: u32,
    /// `pfctl -si` after the replay, the capture's duration as uptime.
    pub info: String,
}

impl Report {
    pub fn dropped(&self, r: Reason) -> u64 {
        self.dropped.iter().find(|(x, _)| *x == r).map_or(0, |x| x.1)
    }
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|x| x.1).sum()
    }
}

/// Runs every record of `path` through a worker with `policy`, with the capture's own clock as
/// the engine's clock, as if the capture had been taken on the firewall's interface 1: a
/// packet whose reverse flow has a state is a reply and goes `out`, every other goes `in`.
/// With `reassemble` (pf's default), fragments are reassembled and filtered as datagrams.
pub fn replay_file<P: Policy>(path: &Path, policy: P, reassemble: bool) -> Result<Report, String> {
    let buf = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let recs = pcap::read(&buf).map_err(|e| format!("{}: {e}", path.display()))?;
    let t0 = recs.first().map_or(0, |r| r.ts_ns);
    let cfg = WorkerConfig {
        limit: 100_000,
        rows: None,
        seed: Seed::random(),
        events: 0,
        now: 0,
        prefault: false,
        secret: xpf_state::os_random(),
    };
    let mut w = Worker::new(cfg, policy).map_err(|e| e.to_string())?;
    w.set_reassemble(reassemble, 65_536, xpf_state::Timeout::Frag.default_secs());
    let mut rep = Report { records: recs.len() as u64, ..Default::default() };
    let mut frame = Vec::new();
    let mut v = [Verdict::Pass; BATCH];
    for r in &recs {
        if replay::to_ether(r, &mut frame).is_err() {
            rep.skipped += 1;
            continue;
        }
        let now = (r.ts_ns.saturating_sub(t0) / 1_000_000_000) as u32;
        w.maintain(now, 1024);
        let dir = if is_reply(&w, &frame) { Dir::Out } else { Dir::In };
        w.process(&[&frame[..]], 1, dir, now, &mut v);
    }
    rep.passed = w.stats.passed;
    rep.to_host = w.stats.to_host;
    rep.dropped = Reason::ALL.iter().map(|r| (*r, w.stats.reasons[*r as usize])).filter(|x| x.1 > 0).collect();
    rep.states = w.states();
    rep.held = w.frags.as_ref().map_or(0, |f| f.counters.held);
    let span = recs.last().map_or(0, |r| r.ts_ns.saturating_sub(t0) / 1_000_000_000) as u64;
    rep.info = xpf_engine::info::Info::of(&w).render(span.max(1));
    Ok(rep)
}

/// Whether `frame`, seen leaving, belongs to a state: the reply of a flow seen coming in.
fn is_reply<P: Policy>(w: &Worker<P>, frame: &[u8]) -> bool {
    let mut pd = xpf_wire::PDesc::default();
    if xpf_wire::parse_ether(frame, &mut pd).is_err() {
        return false;
    }
    if pd.af == xpf_wire::pdesc::AF_INET {
        let k = Key4::from_pdesc(&pd, Dir::Out, 0);
        w.t4.find(&k, w.t4.hash(&k)).is_some()
    } else {
        let k = Key6::from_pdesc(&pd, Dir::Out, 0);
        w.t6.find(&k, w.t6.hash(&k)).is_some()
    }
}

/// A pf.conf for replays: its rules compiled with every interface name as the capture's
/// interface 1, and its `set reassemble`.
pub struct Conf {
    parsed: xpf_conf::parse::Parsed,
    path: String,
    pub reassemble: bool,
}

impl Conf {
    pub fn load(path: &Path) -> Result<Conf, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.display().to_string();
        let parsed = xpf_conf::parse(&text, &name, &[]);
        if let Some(e) = parsed.errors.first() {
            return Err(format!("{e}"));
        }
        let reassemble = parsed.reassemble != Some(false);
        Ok(Conf { parsed, path: name, reassemble })
    }

    pub fn ruleset(&self) -> Result<xpf_conf::Ruleset, String> {
        xpf_conf::Ruleset::compile(&self.parsed, &|_| Some(1))
            .map_err(|e| format!("{}:{}: {}", self.path, e.line, e.msg))
    }
}
