//! Replays a capture through the engine (the daemon's code path) and reports what happened to
//! every packet: passed, dropped with which reason, handed to the host, or not readable.

use std::path::Path;
use xpf_engine::{Policy, Verdict, Worker, WorkerConfig, BATCH};
use xpf_io::{pcap, replay};
use xpf_state::{Dir, Seed};
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
    pub states: u32,
}

impl Report {
    pub fn dropped(&self, r: Reason) -> u64 {
        self.dropped.iter().find(|(x, _)| *x == r).map_or(0, |x| x.1)
    }
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|x| x.1).sum()
    }
}

/// Runs every record of `path` through a worker with `policy`, all as inbound on interface 1,
/// with the capture's own clock as the engine's clock.
pub fn replay_file<P: Policy>(path: &Path, policy: P) -> Result<Report, String> {
    let buf = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let recs = pcap::read(&buf).map_err(|e| format!("{}: {e}", path.display()))?;
    let t0 = recs.first().map_or(0, |r| r.ts_ns);
    let cfg = WorkerConfig { limit: 100_000, rows: None, seed: Seed::random(), events: 0, now: 0, prefault: false };
    let mut w = Worker::new(cfg, policy).map_err(|e| e.to_string())?;
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
        w.process(&[&frame[..]], 1, Dir::In, now, &mut v);
    }
    rep.passed = w.stats.passed;
    rep.to_host = w.stats.to_host;
    rep.dropped = Reason::ALL.iter().map(|r| (*r, w.stats.reasons[*r as usize])).filter(|x| x.1 > 0).collect();
    rep.states = w.states();
    Ok(rep)
}
