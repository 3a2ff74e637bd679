//! `xpf-bench sync`: what state sync costs and how fast it goes.
//!
//! 1. The engine's packets/s with sync off and on, interleaved run by run in one process: "on"
//!    is the daemon's worker loop (event queues on, the replica polled after every batch,
//!    frames built and handed off; the socket is left out, it is the sync thread's or the
//!    kernel's cost, not the worker's).
//! 2. The standby's apply rate: compressed updates of N states, parsed, checked and applied;
//!    then the primary's `-F states` (one clear), applied with and without a state of its own.
//! 3. A bulk update of N states (10M by default) between two endpoints over the loopback, on
//!    real raw IP protocol 240 sockets with 1480-byte frames, paced as xpfd paces it.

use crate::engines::{Engine, Xpf};
use crate::runner::shard_runs;
use crate::stats::{self, Summary};
use crate::Opts;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use xpf_io::gen::Gen;
use xpf_io::rawip::Transport;
use xpf_state::{Config as TConfig, Dir, Key4, Key6, Peer, Seed, StateTable};
use xpf_sync::replica::{FloatingOnly, BULK_PER_MS, MAX_UPDATES};
use xpf_sync::wire::{self, Msg};
use xpf_sync::{BulkIn, Config, Endpoint, Replica, Tables};

/// xpf's worker with sync on, as xpfd runs it.
struct XpfSync {
    x: Xpf,
    rep: Replica,
    start: Instant,
    frames: u64,
}

impl XpfSync {
    fn new(limit: u64) -> XpfSync {
        let mut x = Xpf::with_events(limit, None, 1 << 20);
        x.w.t4.sync_max = MAX_UPDATES;
        x.w.t6.sync_max = MAX_UPDATES;
        XpfSync { x, rep: Replica::new(&Config::new(0x5eed), 0), start: Instant::now(), frames: 0 }
    }
}

impl Engine for XpfSync {
    #[inline]
    fn process(&mut self, frames: &[&[u8]], now: u32) -> usize {
        let n = self.x.process(frames, now);
        let ms = self.start.elapsed().as_millis() as u64;
        let mut t = Tables { t4: &mut self.x.w.t4, t6: &mut self.x.w.t6 };
        self.rep.poll(&mut t, now, ms, &FloatingOnly);
        self.frames += self.rep.ready.len() as u64;
        self.rep.ready.clear();
        n
    }
    fn states(&self) -> u64 {
        self.x.states()
    }
    fn inserts(&self) -> u64 {
        self.x.inserts()
    }
    fn maintain(&mut self, now: u32) {
        self.x.maintain(now);
    }
}

fn table<K: xpf_state::Key>(limit: u32, events: usize) -> StateTable<K> {
    // Memory committed up front, as xpfd's tables are (a page fault per new entry would slow
    // the standby's import below the bulk's pace).
    StateTable::new(TConfig {
        limit,
        rows: None,
        seed: Seed::random(),
        events,
        now: 1,
        prefault: true,
        grow_from: None,
    })
    .expect("state table memory")
}

/// `n` established TCP states, as a firewall in front of many clients holds them.
fn fill(t: &mut StateTable<Key4>, n: u32) {
    for i in 0..n {
        let key = Key4 {
            addr: [[10, (i >> 16) as u8, (i >> 8) as u8, i as u8], [192, 0, 2, 1]],
            port: [1024 + (i % 60000) as u16, 443],
            proto: 6,
            _pad: 0,
            kif: 0,
        };
        let p = Peer { seqlo: i, seqhi: i + 65535, max_win: 65535, mss: 1460, wscale: 0x87, ..Default::default() };
        let s = xpf_state::fixtures::established_tcp(key, [p, p]);
        let h = t.hash(&key);
        t.insert(h, s, 1).expect("insert");
    }
}

struct Side {
    t4: StateTable<Key4>,
    t6: StateTable<Key6>,
    rep: Replica,
    ep: Endpoint,
}

impl Side {
    fn new(creator: u32, limit: u32, events: usize) -> Side {
        let c = Config::new(creator);
        Side { t4: table(limit, events), t6: table(1024, events), rep: Replica::new(&c, 0), ep: Endpoint::new(c) }
    }
    /// Receives `frames`, applies them; records applied.
    fn take(&mut self, frames: &[Vec<u8>]) -> u64 {
        let mut msgs = Vec::new();
        let mut n = 0;
        for f in frames {
            msgs.clear();
            self.ep.receive(0, f, wire::TTL, &mut msgs).expect("a frame of ours");
            let mut t = Tables { t4: &mut self.t4, t6: &mut self.t6 };
            for m in &msgs {
                self.rep.apply(&mut t, m, 2, &FloatingOnly);
            }
            n += msgs.len() as u64;
        }
        n
    }
}

pub fn run(o: &Opts) -> Result<(), String> {
    let points = o.points.clone().unwrap_or_else(|| vec![9_800, 1_000_000]);
    let runs = o.runs;
    // A run must span the 1-second flushes it measures: shorter runs see one flush or none.
    let secs = o.seconds.max(1.0);
    println!(
        "xpf-bench sync: engine with sync off and on ({} flows, {} runs interleaved, >= {} s each), standby apply rate, bulk update over loopback",
        if o.tcp { "TCP" } else { "UDP" },
        runs,
        secs
    );
    // 1. The per-packet cost.
    println!("engine packets/s, one worker:");
    println!("{}", stats::header("states/sync", "packets/s"));
    let mut ratios = Vec::new();
    for &n in &points {
        let g = if o.tcp { Gen::for_flows(n).tcp() } else { Gen::for_flows(n) };
        let (mut off, mut on) = (Vec::new(), Vec::new());
        let mut frames = 0.0;
        for _ in 0..runs {
            off.extend(shard_runs(&g, 1, 1, secs, o.batch, o.shuffle, |l| Xpf::new(l, None), |_| Vec::new()).runs);
            let m = shard_runs(&g, 1, 1, secs, o.batch, o.shuffle, XpfSync::new, |e: &XpfSync| {
                vec![("frames".into(), e.frames as f64)]
            });
            on.extend(m.runs);
            frames += m.extra.first().map_or(0.0, |x| x.1);
        }
        let (so, sn) = (Summary::of(&off), Summary::of(&on));
        println!("{}", stats::row(&format!("{n} off"), &so));
        println!("{}", stats::row(&format!("{n} on"), &sn));
        let r = sn.median / so.median;
        println!("  {n} states: sync on / off = {r:.3} (target >= 0.90); frames built while warming: {frames:.0}");
        ratios.push((n, r));
    }

    // 2. The standby's apply rate.
    let n = if o.quick { 200_000 } else { 1_000_000 };
    let mut a = Side::new(0xa, n + 1024, 1 << 21);
    let mut b = Side::new(0xb, n + 1024, 0);
    b.rep.reserve(n as usize + 1024);
    fill(&mut a.t4, n);
    // The standby learns every state (bulk), then takes rounds of compressed updates.
    a.rep.bulk_start();
    {
        let mut t = Tables { t4: &mut a.t4, t6: &mut a.t6 };
        while !a.rep.bulk_step(&mut t, 2, 1 << 16, &FloatingOnly) {}
    }
    let bulk_frames = std::mem::take(&mut a.rep.ready);
    {
        // The inserts' events: not needed, the bulk carried the states.
        let mut t = Tables { t4: &mut a.t4, t6: &mut a.t6 };
        a.rep.drain(&mut t, 2, &FloatingOnly);
    }
    a.rep.ready.clear();
    let t0 = Instant::now();
    let got = b.take(&bulk_frames);
    let bulk_rate = got as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(b.t4.len(), n, "the standby must hold every state");
    let mut rates = Vec::new();
    for round in 0..runs.max(3) as u32 {
        for id in 0..n {
            let p = a.t4.peers_mut(id).unwrap();
            p[0].seqlo = p[0].seqlo.wrapping_add(1448 * (round + 1));
            a.t4.touch(id, Dir::In, 1500, 3);
            a.t4.queue_update(id);
        }
        let mut t = Tables { t4: &mut a.t4, t6: &mut a.t6 };
        a.rep.drain(&mut t, 3, &FloatingOnly);
        a.rep.flush();
        let frames = std::mem::take(&mut a.rep.ready);
        let t0 = Instant::now();
        let before = b.rep.stats.updated;
        let got = b.take(&frames);
        rates.push(got as f64 / t0.elapsed().as_secs_f64());
        assert!(b.rep.stats.updated - before >= n as u64, "every update applied");
    }
    assert_eq!(b.rep.stats.unknown + b.rep.stats.badstate, 0);
    let s = Summary::of(&rates);
    println!("standby, {n} states: full states imported at {:.2} M/s; compressed updates applied:", bulk_rate / 1e6);
    println!("{}", stats::header("states", "updates/s"));
    println!("{}", stats::row(&n.to_string(), &s));
    println!("  standby applies {:.2} M updates/s (target >= 1 M/s)", s.median / 1e6);
    // The primary's `-F states`: one clear, applied by a standby that holds only the
    // primary's states (its tables emptied at once), then by one that holds a state of its
    // own besides (the primary's states taken out one by one through the id map).
    let _ = a.t4.remove_all(false);
    a.rep.cleared();
    let clear = std::mem::take(&mut a.rep.ready);
    let mut clear_ms = Vec::new();
    for own in [false, true] {
        if b.t4.is_empty() {
            b.take(&bulk_frames);
        }
        if own {
            let key = Key4 { addr: [[10, 255, 0, 1], [192, 0, 2, 1]], port: [999, 443], proto: 6, _pad: 0, kif: 0 };
            let st = xpf_state::fixtures::established_tcp(key, [Peer::default(); 2]);
            let h = b.t4.hash(&key);
            b.t4.insert(h, st, 2).expect("insert");
        }
        let before = b.rep.stats.cleared;
        let t0 = Instant::now();
        b.take(&clear);
        clear_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        assert_eq!(b.rep.stats.cleared - before, n as u64, "the clear removes every state of the primary");
        assert_eq!(b.t4.len(), own as u32);
    }
    println!(
        "  the primary's -F states (one clear): applied in {:.1} ms by a standby holding only its {n} states, {:.1} ms with one of its own besides (state by state)",
        clear_ms[0], clear_ms[1]
    );
    drop((a, b));

    // 3. The bulk update over loopback.
    let n = o.states.unwrap_or(if o.quick { 1_000_000 } else { 10_000_000 }) as u32;
    bulk(n)?;
    if o.json {
        let v = serde_json::json!({
            "ratios": ratios.iter().map(|(n, r)| serde_json::json!({"states": n, "on_over_off": r})).collect::<Vec<_>>(),
            "standby_updates_per_sec": s.median,
        });
        println!("{v}");
    }
    Ok(())
}

/// A bulk update of `n` states from endpoint A (127.0.0.1) to B (127.0.0.2) over raw IP 240.
fn bulk(n: u32) -> Result<(), String> {
    let ifindex = xpf_xdp::netlink::ifindex("lo").map_err(|e| format!("lo: {e}"))?;
    let open = |local: [u8; 4], peer: [u8; 4]| -> Result<Transport, String> {
        let t = Transport::open("lo", ifindex, wire::PROTO, Some(Ipv4Addr::from(peer)), wire::GROUP, wire::TTL)?;
        t.bind(Ipv4Addr::from(local)).map_err(|e| format!("bind: {e}"))?;
        Ok(t)
    };
    let (ta, tb) = (open([127, 0, 0, 1], [127, 0, 0, 2])?, open([127, 0, 0, 2], [127, 0, 0, 1])?);
    eprintln!("  bulk: filling {n} states on the sender ...");
    let mut a = Side::new(0xa, n + 1024, 0);
    fill(&mut a.t4, n);
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (done2, sent2) = (done.clone(), sent.clone());
    // The sender: waits for the request, then START, the states (paced), END.
    let sender = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let start = Instant::now();
        let mut msgs = Vec::new();
        while !done2.load(Ordering::Relaxed) {
            ta.wait(5);
            while let Some(len) = ta.recv(&mut buf) {
                let ihl = ((buf[0] & 15) as usize) * 4;
                let _ = a.ep.receive(start.elapsed().as_millis() as u64, &buf[ihl..len], buf[8], &mut msgs);
            }
            if a.ep.bulk_wanted {
                break;
            }
        }
        let t0 = Instant::now();
        a.ep.bulk_started(0);
        for f in a.ep.transmit() {
            ta.send(&f);
        }
        a.rep.bulk_start();
        let mut last = 0u64;
        loop {
            let ms = t0.elapsed().as_millis() as u64;
            let budget = ((ms.saturating_sub(last)) * BULK_PER_MS).min(4 * BULK_PER_MS) as u32;
            last = ms;
            let mut t = Tables { t4: &mut a.t4, t6: &mut a.t6 };
            let fin = a.rep.bulk_step(&mut t, 2, budget.max(1), &FloatingOnly);
            for f in a.rep.ready.drain(..) {
                ta.send(&f);
            }
            if fin {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        sent2.store(a.rep.bulk_sent, Ordering::Relaxed);
        a.ep.bulk_done(t0.elapsed().as_millis() as u64, a.rep.bulk_sent);
        for f in a.ep.transmit() {
            ta.send(&f);
        }
        t0.elapsed().as_secs_f64()
    });
    let mut b = Side::new(0xb, n + 1024, 0);
    b.rep.reserve(n as usize + 1024);
    let mut buf = vec![0u8; 65536];
    let mut msgs = Vec::new();
    let start = Instant::now();
    b.ep.request_bulk(0);
    for f in b.ep.transmit() {
        tb.send(&f);
    }
    let mut last_print = 0;
    loop {
        tb.wait(5);
        let ms = start.elapsed().as_millis() as u64;
        while let Some(len) = tb.recv(&mut buf) {
            msgs.clear();
            let ihl = ((buf[0] & 15) as usize) * 4;
            if b.ep.receive(ms, &buf[ihl..len], buf[8], &mut msgs).is_err() {
                continue;
            }
            let mut t = Tables { t4: &mut b.t4, t6: &mut b.t6 };
            for m in &msgs {
                if matches!(m, Msg::Insert(_) | Msg::Update(_)) {
                    b.rep.apply(&mut t, m, 2, &FloatingOnly);
                }
            }
        }
        b.ep.poll(ms);
        for f in b.ep.transmit() {
            tb.send(&f);
        }
        if ms >= last_print + 5000 {
            last_print = ms;
            eprintln!("  bulk: standby {} ({} states held)", bulk_text(&b.ep.bulk_in), b.t4.len());
        }
        if matches!(b.ep.bulk_in, BulkIn::Done { .. } | BulkIn::Failed) || ms > 300_000 {
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let secs = sender.join().map_err(|_| "sender thread failed")?;
    let total = start.elapsed().as_secs_f64();
    let held = b.t4.len();
    println!(
        "bulk update over loopback: {n} states, 1480-byte frames, paced at {} states/ms: sender {secs:.1} s, standby {} (total {total:.1} s); held {held}, lost {} (target <= 60 s, 0 lost); sent {}",
        BULK_PER_MS,
        bulk_text(&b.ep.bulk_in),
        n - held,
        sent.load(Ordering::Relaxed)
    );
    Ok(())
}

fn bulk_text(b: &BulkIn) -> String {
    match b {
        BulkIn::Done { states, ms, .. } => format!("done: {states} states in {:.1} s", *ms as f64 / 1000.0),
        x => format!("{x:?}"),
    }
}
