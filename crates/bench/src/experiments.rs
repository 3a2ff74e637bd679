//! The experiments: what they run, what they print, what they write.

use crate::engines::{HashMapBaseline, Xpf, XpfOut};
use crate::plot::{self, Series};
use crate::runner::{insert_runs, shard_runs, Measured};
use crate::stats::{self, Summary};
use crate::Opts;
use serde::Serialize;
use xpf_io::gen::Gen;
use xpf_state::auto_rows;

#[derive(Serialize)]
struct Env {
    commit: String,
    cpu: String,
    cpus: usize,
    thp: String,
    workers: usize,
    mode: &'static str,
    batch: usize,
    runs: usize,
    seconds_per_run: f64,
    quick: bool,
}

fn env(o: &Opts) -> Env {
    Env {
        commit: xpf_version::COMMIT.to_string(),
        cpu: crate::sys::cpu_model(),
        cpus: crate::sys::cpus(),
        thp: crate::sys::thp(),
        workers: o.workers,
        mode: if o.shared { "shared" } else { "shard" },
        batch: o.batch,
        runs: o.runs,
        seconds_per_run: o.seconds,
        quick: o.quick,
    }
}

#[derive(Serialize)]
struct StatesPoint {
    states: u64,
    rows: u64,
    xpf_pps: Summary,
    xpf_runs: Vec<f64>,
    hashmap_pps: Option<Summary>,
    hashmap_runs: Vec<f64>,
    /// xpf median / HashMap median.
    ratio: Option<f64>,
    /// Resident memory added per state, all-in (entries, index, wheel, anything else).
    bytes_per_state: f64,
    /// The table's own accounting per state.
    table_bytes_per_state: f64,
    hashmap_bytes_per_state: Option<f64>,
    warm_inserts_per_sec: f64,
}

#[derive(Serialize)]
struct Report<P: Serialize> {
    bench: String,
    env: Env,
    points: Vec<P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hashmap_reference: Option<Summary>,
}

fn say(o: &Opts, s: String) {
    if o.json {
        eprintln!("{s}");
    } else {
        println!("{s}");
    }
}

fn xpf_measure(o: &Opts, g: &Gen, rows: Option<u32>) -> Measured {
    if o.shared {
        crate::shared::shared_runs(g, o.workers, o.runs, o.seconds, o.batch)
    } else {
        shard_runs(
            g,
            o.workers,
            o.runs,
            o.seconds,
            o.batch,
            o.shuffle,
            move |lim| Xpf::new(lim, rows),
            |e: &Xpf| {
                let m = e.w.t4.memory();
                let n = e.w.states().max(1) as f64;
                vec![
                    ("table_bytes_per_state".into(), (m.total() + e.w.t6.memory().total()) as f64 / n),
                    ("rows".into(), e.w.t4.rows() as f64),
                    ("overflow_buckets".into(), e.w.t4.overflow_buckets() as f64),
                ]
            },
        )
    }
}

fn extra(m: &Measured, k: &str) -> f64 {
    m.extra.iter().find(|(n, _)| n == k).map_or(0.0, |x| x.1)
}

fn finish<P: Serialize>(
    o: &Opts,
    report: &Report<P>,
    series: &[Series],
    title: &str,
    xlabel: &str,
) -> Result<(), String> {
    let io = |e: std::io::Error| format!("writing {}: {e}", o.out.display());
    std::fs::create_dir_all(&o.out).map_err(io)?;
    let json = serde_json::to_string_pretty(report).unwrap();
    std::fs::write(o.out.join(format!("{}.json", o.bench)), &json).map_err(io)?;
    let png = plot::write(&o.out, &o.bench, title, xlabel, "packets per second", true, series).map_err(io)?;
    match png {
        Ok(p) => say(o, format!("plot: {p}  data: {}", o.out.join("gnuplot.data").display())),
        Err(why) => say(o, format!("no plot: {why}")),
    }
    if o.json {
        println!("{json}");
    }
    Ok(())
}

pub fn states(o: &Opts) -> Result<(), String> {
    let points = o.points.clone().unwrap_or_else(|| {
        let mut v: Vec<u64> = if o.quick {
            vec![128, 9_800, 100_000, 1_000_000, 10_000_000]
        } else {
            vec![128, 512, 2048, 9_800, 100_000, 1_000_000, 2_000_000, 4_000_000, 6_000_000, 10_000_000]
        };
        if o.big {
            v.extend([40_000_000, 100_000_000]);
        }
        v
    });
    let e = env(o);
    say(o, format!(
        "xpf-bench states: established {}{}, 60-byte frames, {} worker(s) ({}), batch {}, {} runs of >= {} s per point; commit {}; {}; THP {}",
        if o.tcp { "TCP" } else { "UDP" },
        if o.shuffle { " (flows in scattered order)" } else { "" },
        o.workers, e.mode, o.batch, o.runs, o.seconds, e.commit, e.cpu, e.thp
    ));
    let mut out = Vec::new();
    for &n in &points {
        let g = if o.tcp { Gen::for_flows(n).tcp() } else { Gen::for_flows(n) };
        let x = {
            let _s = crate::progress::step(format!("{n} states: xpf"));
            xpf_measure(o, &g, None)
        };
        let hm = o.baseline.then(|| {
            let _s = crate::progress::step(format!("{n} states: HashMap"));
            shard_runs(&g, o.workers, o.runs, o.seconds, o.batch, o.shuffle, HashMapBaseline::new, |_| Vec::new())
        });
        let xs = Summary::of(&x.runs);
        let hs = hm.as_ref().map(|h| Summary::of(&h.runs));
        out.push(StatesPoint {
            states: n,
            rows: extra(&x, "rows") as u64,
            ratio: hs.as_ref().map(|h| xs.median / h.median),
            xpf_pps: xs,
            xpf_runs: x.runs.clone(),
            hashmap_pps: hs,
            hashmap_runs: hm.as_ref().map(|h| h.runs.clone()).unwrap_or_default(),
            bytes_per_state: x.rss_per_state,
            table_bytes_per_state: extra(&x, "table_bytes_per_state"),
            hashmap_bytes_per_state: hm.as_ref().map(|h| h.rss_per_state),
            warm_inserts_per_sec: x.warm_rate,
        });
    }
    {
        say(o, "xpf, packets/s:".into());
        say(o, stats::header("states", "packets/s"));
        for p in &out {
            say(o, stats::row(&p.states.to_string(), &p.xpf_pps));
        }
        if o.baseline {
            say(o, "HashMap (hashbrown + foldhash, one packet at a time), packets/s:".into());
            say(o, stats::header("states", "packets/s"));
            for p in &out {
                say(o, stats::row(&p.states.to_string(), p.hashmap_pps.as_ref().unwrap()));
            }
        }
        say(
            o,
            format!(
                "{:>10} {:>12} {:>14} {:>14} {:>14} {:>16}",
                "states", "xpf/HashMap", "B/state(rss)", "B/state(table)", "HashMap B/st", "warm inserts/s"
            ),
        );
        for p in &out {
            say(
                o,
                format!(
                    "{:>10} {:>12} {:>14.1} {:>14.1} {:>14} {:>16.0}",
                    p.states,
                    p.ratio.map_or("-".into(), |r| format!("{r:.2}x")),
                    p.bytes_per_state,
                    p.table_bytes_per_state,
                    p.hashmap_bytes_per_state.map_or("-".into(), |b| format!("{b:.1}")),
                    p.warm_inserts_per_sec
                ),
            );
        }
    }
    let mut series = vec![Series {
        title: "xpf",
        points: out.iter().map(|p| (p.states as f64, p.xpf_pps.median, p.xpf_pps.min, p.xpf_pps.max)).collect(),
    }];
    if o.baseline {
        series.push(Series {
            title: "HashMap (hashbrown+foldhash)",
            points: out
                .iter()
                .map(|p| {
                    let h = p.hashmap_pps.as_ref().unwrap();
                    (p.states as f64, h.median, h.min, h.max)
                })
                .collect(),
        });
    }
    let report = Report { bench: o.bench.clone(), env: e, points: out, hashmap_reference: None };
    finish(o, &report, &series, "established UDP: packets per second against number of states", "states")
}

#[derive(Serialize)]
struct HashPoint {
    rows: u64,
    automatic: bool,
    states_per_row: f64,
    xpf_pps: Summary,
    xpf_runs: Vec<f64>,
    overflow_buckets: u64,
    bytes_per_state: f64,
    warm_inserts_per_sec: f64,
}

pub fn hashsize(o: &Opts) -> Result<(), String> {
    let n = o.states.unwrap_or(4_000_000);
    let auto = auto_rows(n as u32);
    let mut rows: Vec<u32> = o.rows.clone().unwrap_or_else(|| {
        let exps: Vec<u32> = if o.quick { vec![15, 17, 19, 21, 23, 25] } else { (15..=25).collect() };
        exps.into_iter().map(|e| 1u32 << e).collect()
    });
    if !rows.contains(&auto) {
        rows.push(auto);
    }
    rows.sort();
    let e = env(o);
    say(o, format!(
        "xpf-bench hashsize: {n} established UDP states, index rows swept (automatic: {auto}), {} worker(s), batch {}, {} runs; commit {}",
        o.workers, o.batch, o.runs, e.commit
    ));
    let mut out = Vec::new();
    for &r in &rows {
        let step = crate::progress::step(format!("{r} rows"));
        let g = Gen::for_flows(n);
        let x = xpf_measure(&Opts { shared: false, ..o.clone() }, &g, Some(r));
        drop(step);
        out.push(HashPoint {
            rows: r as u64,
            automatic: r == auto,
            states_per_row: n as f64 / r as f64,
            xpf_pps: Summary::of(&x.runs),
            xpf_runs: x.runs.clone(),
            overflow_buckets: extra(&x, "overflow_buckets") as u64,
            bytes_per_state: x.rss_per_state,
            warm_inserts_per_sec: x.warm_rate,
        });
    }
    let reference = o.baseline.then(|| {
        let _s = crate::progress::step("HashMap reference");
        let g = Gen::for_flows(n);
        Summary::of(
            &shard_runs(&g, o.workers, o.runs, o.seconds, o.batch, o.shuffle, HashMapBaseline::new, |_| Vec::new())
                .runs,
        )
    });
    {
        say(o, stats::header("rows", "packets/s"));
        for p in &out {
            say(o, stats::row(&p.rows.to_string(), &p.xpf_pps));
        }
        say(
            o,
            format!(
                "{:>10} {:>12} {:>10} {:>12} {:>16}",
                "rows", "states/row", "overflow", "B/state", "warm inserts/s"
            ),
        );
        for p in &out {
            say(
                o,
                format!(
                    "{:>10} {:>12.2} {:>10} {:>12.1} {:>16.0}{}",
                    p.rows,
                    p.states_per_row,
                    p.overflow_buckets,
                    p.bytes_per_state,
                    p.warm_inserts_per_sec,
                    if p.automatic { "   <- automatic" } else { "" }
                ),
            );
        }
        if let Some(h) = &reference {
            say(o, format!("HashMap (hashbrown + foldhash) at {n} states: median {:.0} packets/s", h.median));
        }
    }
    let series = vec![Series {
        title: "xpf",
        points: out.iter().map(|p| (p.rows as f64, p.xpf_pps.median, p.xpf_pps.min, p.xpf_pps.max)).collect(),
    }];
    let report = Report { bench: o.bench.clone(), env: e, points: out, hashmap_reference: reference };
    finish(
        o,
        &report,
        &series,
        &format!("{n} established UDP states: packets per second against index rows"),
        "index rows",
    )
}

#[derive(Serialize)]
struct InsertPoint {
    states: u64,
    xpf_inserts_per_sec: Summary,
    xpf_runs: Vec<f64>,
    hashmap_inserts_per_sec: Option<Summary>,
    hashmap_runs: Vec<f64>,
    ratio: Option<f64>,
}

pub fn insert(o: &Opts) -> Result<(), String> {
    let n = o.states.unwrap_or(if o.quick { 1_000_000 } else { 10_000_000 });
    let e = env(o);
    say(
        o,
        format!(
            "xpf-bench insert: {n} new UDP flows per run (each packet creates a state), batch {}, {} runs; commit {}",
            o.batch, o.runs, e.commit
        ),
    );
    let g = Gen::for_flows(n);
    let x = insert_runs(&g, o.runs, o.batch, |lim| Xpf::new(lim, None));
    let h = o.baseline.then(|| insert_runs(&g, o.runs, o.batch, HashMapBaseline::new));
    let xs = Summary::of(&x);
    let hs = h.as_ref().map(|v| Summary::of(v));
    // The same packets under `block all`: each decided by the rule, dropped and counted on it.
    let b = Summary::of(&crate::runner::blocked_runs(&g, o.runs, o.batch, crate::engines::XpfBlock::blocking));
    {
        say(o, stats::header("engine", "new states/s"));
        say(o, stats::row("xpf", &xs));
        if let Some(hs) = &hs {
            say(o, stats::row("HashMap", hs));
            say(o, format!("xpf/HashMap: {:.2}x", xs.median / hs.median));
        }
        say(o, stats::header("engine", "packets/s a block rule drops"));
        say(o, stats::row("xpf block", &b));
    }
    // `-F states` on the full table: the worker forwards nothing meanwhile.
    let flush = |whole: bool| {
        let mut feed = crate::runner::Feed::new(g.clone(), 0, 1);
        let mut e = Xpf::new(feed.count, None);
        let count = feed.count;
        crate::runner::pump(&mut e, &mut feed, count, 0.0, o.batch, 1);
        let t = std::time::Instant::now();
        if whole {
            e.w.t4.remove_all(true);
        } else {
            let ids: Vec<u32> = e.w.t4.iter().map(|(id, _)| id).collect();
            for id in ids {
                e.w.t4.remove(id);
            }
        }
        t.elapsed().as_secs_f64() * 1e3
    };
    let (whole, each) = (flush(true), flush(false));
    say(o, format!("-F states of {n}: {whole:.1} ms (each state taken out of the index instead: {each:.1} ms)"));
    let p = InsertPoint {
        states: n,
        ratio: hs.as_ref().map(|h| xs.median / h.median),
        xpf_inserts_per_sec: xs,
        xpf_runs: x,
        hashmap_inserts_per_sec: hs,
        hashmap_runs: h.unwrap_or_default(),
    };
    let mut series = vec![Series {
        title: "xpf",
        points: vec![(n as f64, p.xpf_inserts_per_sec.median, p.xpf_inserts_per_sec.min, p.xpf_inserts_per_sec.max)],
    }];
    if let Some(hs) = &p.hashmap_inserts_per_sec {
        series.push(Series { title: "HashMap", points: vec![(n as f64, hs.median, hs.min, hs.max)] });
    }
    let report = Report { bench: o.bench.clone(), env: e, points: vec![p], hashmap_reference: None };
    finish(o, &report, &series, "new states per second", "states")
}

#[derive(Serialize)]
struct ResizeReport {
    states: u64,
    rows_before: u64,
    rows_after: u64,
    pps_before: f64,
    pps_during: f64,
    pps_after: f64,
    resize_seconds: f64,
    packets_during: u64,
    /// Longest time one chunk of 4,096 packets took, before and during the resize.
    worst_chunk_us_before: f64,
    worst_chunk_us_during: f64,
}

/// Raises `set limit states` from N to 2N under established traffic and measures what the
/// online resize costs: packets/s before, during and after, how long it takes, and the worst
/// chunk latency. Every packet must pass and no state may be lost or created.
pub fn resize(o: &Opts) -> Result<(), String> {
    use crate::runner::{pump, Feed, CHUNK};
    let n = o.states.unwrap_or(if o.quick { 1_000_000 } else { 10_000_000 });
    let e = env(o);
    say(
        o,
        format!(
            "xpf-bench resize: {n} established UDP states, limit raised to {} under traffic, batch {}; commit {}",
            2 * n,
            o.batch,
            e.commit
        ),
    );
    let g = Gen::for_flows(n);
    let mut feed = Feed::new(g, 0, 1);
    let mut x = Xpf::new(n, None);
    crate::sys::pin(0);
    let warm = pump(&mut x, &mut feed, n, 0.0, o.batch, 1);
    let inserts = x.w.t4.counters.inserts;
    let rows_before = x.w.t4.rows() as u64;
    // One chunk at a time, timing each.
    let mut chunk = |x: &mut Xpf, feed: &mut Feed| -> f64 {
        let p = pump(x, feed, CHUNK as u64, 0.0, o.batch, 2);
        assert_eq!(p.passed, p.packets, "every established packet must pass");
        p.secs
    };
    let measure = |x: &mut Xpf, feed: &mut Feed, secs: f64, chunk: &mut dyn FnMut(&mut Xpf, &mut Feed) -> f64| {
        let (mut t, mut worst, mut k) = (0.0, 0.0f64, 0u64);
        while t < secs {
            let c = chunk(x, feed);
            t += c;
            worst = worst.max(c);
            k += 1;
        }
        (k * CHUNK as u64, t, worst)
    };
    let (pb, tb, wb) = measure(&mut x, &mut feed, o.seconds, &mut chunk);
    x.w.set_limit((2 * n) as u32).map_err(|e| e.to_string())?;
    let (mut pd, mut td, mut wd) = (0u64, 0.0, 0.0f64);
    while x.w.t4.resizing() {
        let c = chunk(&mut x, &mut feed);
        pd += CHUNK as u64;
        td += c;
        wd = wd.max(c);
    }
    let (pa, ta, _) = measure(&mut x, &mut feed, o.seconds, &mut chunk);
    assert_eq!(x.w.t4.counters.inserts, inserts, "no state may be created");
    assert_eq!(x.w.states() as u64, n, "no state may be lost");
    let r = ResizeReport {
        states: n,
        rows_before,
        rows_after: x.w.t4.rows() as u64,
        pps_before: pb as f64 / tb,
        pps_during: pd as f64 / td,
        pps_after: pa as f64 / ta,
        resize_seconds: td,
        packets_during: pd,
        worst_chunk_us_before: wb * 1e6,
        worst_chunk_us_during: wd * 1e6,
    };
    say(o, format!("  warm-up: {:.0} new states/s", warm.packets as f64 / warm.secs));
    say(
        o,
        format!(
            "  index rows {} -> {} in {:.2} s of engine time, {} packets served meanwhile",
            r.rows_before, r.rows_after, r.resize_seconds, r.packets_during
        ),
    );
    say(o, format!("  packets/s  before {:.0}   during {:.0}   after {:.0}", r.pps_before, r.pps_during, r.pps_after));
    say(
        o,
        format!(
            "  worst 4,096-packet chunk  before {:.0} us   during {:.0} us",
            r.worst_chunk_us_before, r.worst_chunk_us_during
        ),
    );
    let io = |e: std::io::Error| format!("writing {}: {e}", o.out.display());
    std::fs::create_dir_all(&o.out).map_err(io)?;
    let json = serde_json::to_string_pretty(&Report {
        bench: o.bench.clone(),
        env: e,
        points: vec![r],
        hashmap_reference: None,
    })
    .unwrap();
    std::fs::write(o.out.join("resize.json"), &json).map_err(io)?;
    if o.json {
        println!("{json}");
    }
    Ok(())
}

#[derive(Serialize)]
struct RulesPoint {
    set: &'static str,
    rules: usize,
    parse_compile_seconds: f64,
    parse_seconds: f64,
    /// Resident memory the compiled ruleset added (the parse tree freed).
    rss_bytes: u64,
    /// The classifier's shapes an IPv4 packet probes, its bytes, its longest list.
    shapes: usize,
    classifier_bytes: usize,
    longest_list: usize,
    walk_per_sec: Summary,
    classify_per_sec: Summary,
    /// `xpfctl -a`'s work for a 1,000-rule member anchor (campus only): its parse, compile
    /// and the ruleset's new generation beside the rest, microseconds.
    anchor_replace_us: Option<Summary>,
}

/// A member's anchor of the campus (`campus/in/44.0.0`, the first /24's inbound one) as a
/// generator would write it anew: `n` quick passes to its hosts' services.
fn member_anchor(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let _ = std::fmt::Write::write_fmt(
            &mut s,
            format_args!("pass in quick proto tcp to 44.0.0.{} port {}\n", 1 + i % 250, 1000 + i / 250),
        );
    }
    s
}

/// First packets for the random set: half from a rule (a host inside its prefixes, a port
/// it names), half from the networks the rules are drawn from, as ClassBench's traces.
fn random_probes(p: &xpf_conf::Parsed, n: usize, seed: u64) -> Vec<xpf_wire::PDesc> {
    use xpf_conf::ast::{HostKind, PortOp};
    let mut g = xpf_bench::rulegen::Rng::new(seed);
    let pick = |h: &HostKind, g: &mut xpf_bench::rulegen::Rng| match h {
        HostKind::Net(std::net::IpAddr::V4(a), l) => {
            let host = if *l >= 32 { 0 } else { (g.bits() as u32) & (u32::MAX >> l) };
            u32::from(*a) | host
        }
        _ => g.bits() as u32,
    };
    let port = |o: &Option<PortOp>, g: &mut xpf_bench::rulegen::Rng| match o {
        Some(PortOp::Eq(p)) => *p,
        Some(PortOp::Range(a, b)) => *a + (g.below((*b - *a) as u64 + 1) as u16),
        _ => g.below(65535) as u16 + 1,
    };
    (0..n)
        .map(|i| {
            let r = &p.rules[1 + g.below(p.rules.len() as u64 - 1) as usize];
            let own = i % 2 == 0;
            let (src, dst) = if own {
                (pick(&r.src.kind, &mut g), pick(&r.dst.kind, &mut g))
            } else {
                (g.bits() as u32, g.bits() as u32)
            };
            let proto = r.proto.unwrap_or(if g.chance(50) { 6 } else { 17 });
            xpf_wire::PDesc {
                src: xpf_wire::Addr::v4(src.to_be_bytes()),
                dst: xpf_wire::Addr::v4(dst.to_be_bytes()),
                sport: port(&r.src_port, &mut g),
                dport: port(&r.dst_port, &mut g),
                af: 4,
                proto,
                tcp_flags: if proto == 6 { xpf_wire::tcp::SYN } else { 0 },
                flags: xpf_wire::pdesc::pdf::HAS_PORTS,
                ..Default::default()
            }
        })
        .collect()
}

/// Evaluations per second of `r` over `pkts` (direction of each given), `runs` times; with
/// `--workers N`, N threads pinned one per CPU evaluate at once, each as its own worker (as
/// xpfd's workers share one ruleset), and the figure is their sum.
fn eval_rate(o: &Opts, r: &xpf_conf::Ruleset, pkts: &[(xpf_wire::PDesc, xpf_state::Dir)]) -> Vec<f64> {
    use std::time::Instant;
    use xpf_engine::{Context, Policy};
    let one = |worker: usize| {
        let (mut k, t) = (0usize, Instant::now());
        let from = worker * pkts.len() / o.workers;
        while t.elapsed().as_secs_f64() < o.seconds || k < 16 {
            for (pd, dir) in pkts.iter().cycle().skip((from + k) % pkts.len()).take(16) {
                let at = Context { worker: worker as u16, ..Context::new(1, *dir) };
                std::hint::black_box(r.evaluate_in(pd, &at));
            }
            k += 16;
        }
        k as f64 / t.elapsed().as_secs_f64()
    };
    (0..o.runs)
        .map(|_| {
            if o.workers == 1 {
                return one(0);
            }
            std::thread::scope(|s| {
                let all: Vec<_> = (0..o.workers)
                    .map(|w| {
                        s.spawn(move || {
                            crate::sys::pin(w);
                            one(w)
                        })
                    })
                    .collect();
                all.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
            })
        })
        .collect()
}

/// Writes the generated rulesets (`--campus N`: pf.conf and the two nftables forms;
/// `--random N`: pf.conf) to `--out`.
fn write_rulesets(o: &Opts) -> Result<(), String> {
    let io = |e: std::io::Error| format!("writing {}: {e}", o.out.display());
    std::fs::create_dir_all(&o.out).map_err(io)?;
    if let Some(n) = o.campus {
        let pol = xpf_bench::rulegen::campus(n, 1);
        for (f, text) in [("pf.conf", &pol.pf), ("expert.nft", &pol.nft_expert), ("naive.nft", &pol.nft_naive)] {
            let path = o.out.join(format!("campus-{n}.{f}"));
            std::fs::write(&path, text).map_err(io)?;
            say(o, format!("{} ({} bytes)", path.display(), text.len()));
        }
        say(o, format!("campus: {} members, {} rules as pf compiles them", pol.members, pol.compiled));
    }
    if let Some(n) = o.random {
        let path = o.out.join(format!("random-{n}.pf.conf"));
        let text = xpf_bench::rulegen::random(n, 1);
        std::fs::write(&path, &text).map_err(io)?;
        say(o, format!("{} ({} bytes)", path.display(), text.len()));
    }
    Ok(())
}

/// First-packet rule evaluations per second at 10 to 1.6M rules, for the campus set and
/// the random set, walked with skip steps and through the classifier, on the same packets.
pub fn rules(o: &Opts) -> Result<(), String> {
    use std::time::Instant;
    if o.campus.is_some() || o.random.is_some() {
        return write_rulesets(o);
    }
    let sizes: Vec<usize> = o
        .points
        .clone()
        .map(|v| v.into_iter().map(|x| x as usize).collect())
        .unwrap_or(if o.quick { vec![10, 1_000, 100_000] } else { vec![10, 1_000, 100_000, 1_000_000, 1_600_000] });
    let e = env(o);
    say(o, format!("xpf-bench rules: first-packet evaluations/s, skip-step walk and classifier, campus and random sets, {} runs, {} worker{}; commit {}", o.runs, o.workers, if o.workers == 1 { "" } else { "s together" }, e.commit));
    let ifindex = |n: &str| match n {
        "em0" => Some(1),
        "em1" => Some(2),
        _ => None,
    };
    let mut out = Vec::new();
    for &n in &sizes {
        for set in ["campus", "random"] {
            // The text and the packets first; the clock and the memory count from the parse.
            let campus = (set == "campus").then(|| xpf_bench::rulegen::campus(n, 1));
            let random = if campus.is_none() { xpf_bench::rulegen::random(n, 1) } else { String::new() };
            let text = campus.as_ref().map_or(&random, |pol| &pol.pf);
            let rss0 = crate::sys::rss();
            let t = Instant::now();
            let p = xpf_conf::parse(text, set, &[]);
            let parse_s = t.elapsed().as_secs_f64();
            if let Some(err) = p.errors.first() {
                return Err(format!("generated ruleset refused: {err}"));
            }
            let pkts: Vec<(xpf_wire::PDesc, xpf_state::Dir)> = match &campus {
                Some(pol) => pol
                    .probes(4096, 2)
                    .iter()
                    .map(|pr| (pr.pdesc(), if pr.inbound { xpf_state::Dir::In } else { xpf_state::Dir::Out }))
                    .collect(),
                None => random_probes(&p, 4096, 2)
                    .into_iter()
                    .enumerate()
                    .map(|(i, pd)| (pd, if i % 2 == 0 { xpf_state::Dir::In } else { xpf_state::Dir::Out }))
                    .collect(),
            };
            let t = Instant::now();
            let mut r = xpf_conf::Ruleset::compile(&p, &ifindex).map_err(|e| e.msg)?;
            drop(p);
            let pc = parse_s + t.elapsed().as_secs_f64();
            let rss = crate::sys::rss().saturating_sub(rss0);
            r.set_lookup(xpf_conf::compile::Lookup::Classify);
            let (shapes, cbytes, longest) = r.classifier_stats(4).unwrap_or((0, 0, 0));
            let classify = eval_rate(o, &r, &pkts);
            r.set_lookup(xpf_conf::compile::Lookup::Walk);
            let walk = eval_rate(o, &r, &pkts);
            r.set_lookup(xpf_conf::compile::Lookup::Auto);
            // One member's anchor replaced at run time, as `xpfctl -a` does it.
            let anchor_replace_us = (set == "campus").then(|| {
                let text = member_anchor(1000);
                let us: Vec<f64> = (0..o.runs.max(3))
                    .map(|k| {
                        let t = Instant::now();
                        let a = xpf_conf::parse(&text, "member", &[]);
                        let next = r.with_anchor("campus/in/44.0.0", &a, (1 << 31) + k as u32 * 1000, &ifindex);
                        let us = t.elapsed().as_secs_f64() * 1e6;
                        drop(next.expect("the member's anchor compiles"));
                        us
                    })
                    .collect();
                Summary::of(&us)
            });
            say(
                o,
                format!(
                    "  {set} {} rules: parsed and compiled in {pc:.2} s (parse {parse_s:.2} s), +{} MiB; classifier {shapes} shapes, {} MiB, longest list {longest}",
                    r.len(),
                    rss >> 20,
                    cbytes >> 20
                ),
            );
            out.push(RulesPoint {
                set,
                rules: r.len(),
                parse_compile_seconds: pc,
                parse_seconds: parse_s,
                rss_bytes: rss,
                shapes,
                classifier_bytes: cbytes,
                longest_list: longest,
                walk_per_sec: Summary::of(&walk),
                classify_per_sec: Summary::of(&classify),
                anchor_replace_us,
            });
        }
    }
    say(o, stats::header("set / rules", "walk evaluations/s"));
    for p in &out {
        say(o, stats::row(&format!("{} {}", p.set, p.rules), &p.walk_per_sec));
    }
    say(o, stats::header("set / rules", "classifier evaluations/s"));
    for p in &out {
        say(o, stats::row(&format!("{} {}", p.set, p.rules), &p.classify_per_sec));
    }
    say(o, stats::header("set / rules", "us to replace a 1,000-rule anchor (xpfctl -a)"));
    for p in &out {
        if let Some(us) = &p.anchor_replace_us {
            say(o, stats::row(&format!("{} {}", p.set, p.rules), us));
        }
    }
    let line = |set: &str, classify: bool| -> Vec<(f64, f64, f64, f64)> {
        out.iter()
            .filter(|p| p.set == set)
            .map(|p| {
                let s = if classify { &p.classify_per_sec } else { &p.walk_per_sec };
                (p.rules as f64, s.median, s.min, s.max)
            })
            .collect()
    };
    let series = vec![
        Series { title: "campus, classifier", points: line("campus", true) },
        Series { title: "campus, skip-step walk", points: line("campus", false) },
        Series { title: "random, classifier", points: line("random", true) },
        Series { title: "random, skip-step walk", points: line("random", false) },
    ];
    let report = Report { bench: o.bench.clone(), env: e, points: out, hashmap_reference: None };
    finish(o, &report, &series, "first-packet rule evaluations per second", "rules")
}

#[derive(Serialize)]
struct NatPoint {
    states: u64,
    plain_pps: Summary,
    nat_pps: Summary,
    /// NAT's established pps as a share of the same flows' without it.
    nat_over_plain: f64,
    plain_new_per_sec: Summary,
    nat_new_per_sec: Summary,
    plain_table_bytes_per_state: f64,
    nat_table_bytes_per_state: f64,
    nat_rss_bytes_per_state: f64,
    /// `-F states` of every translated state (the engine's `remove_all_states`, then the
    /// maintenance that gives queued ports back), milliseconds.
    nat_flush_ms: f64,
}

#[derive(Serialize)]
struct AllocPoint {
    occupancy: f64,
    ns_per_port: Summary,
}

#[derive(Serialize)]
struct NatReport {
    bench: String,
    env: Env,
    pool: String,
    points: Vec<NatPoint>,
    allocation: Vec<AllocPoint>,
}

/// The translation pool of the bench: `nat-to 198.51.0.0/16 round-robin` (pf's default ports,
/// 50001-65535): a campus's public range.
fn bench_pool() -> xpf_engine::nat::Pool {
    use xpf_engine::nat::{Method, Net, Pool};
    Pool {
        nets: vec![Net { addr: xpf_wire::Addr::v4([198, 51, 0, 0]), af: 4, len: 16 }],
        method: Method::RoundRobin,
        ports: (50001, 65535),
        static_port: false,
        dst_base: 0,
        endpoint_independent: false,
        sticky: false,
        portset: None,
    }
}

/// Translation in the engine: established packets per second and new states per second of the
/// same flows filtered `out` with and without `nat-to` (each translated frame rewritten in
/// place after its batch, as a zero-copy transmit does), bytes per
/// state; and the port allocator's cost per new flow at 0%, 90% and 99.9% of one address's
/// ports in use.
pub fn nat(o: &Opts) -> Result<(), String> {
    let points = o.points.clone().unwrap_or_else(|| {
        if o.quick {
            vec![10_000, 1_000_000]
        } else {
            vec![10_000, 1_000_000, 10_000_000]
        }
    });
    let e = env(o);
    let pool = "nat-to 198.51.0.0/16 round-robin, ports 50001:65535";
    say(
        o,
        format!(
            "xpf-bench nat: established UDP out, 60-byte frames, {pool} (rewritten in place), 1 worker, batch {}, {} runs of >= {} s; commit {}; {}",
            o.batch, o.runs, o.seconds, e.commit, e.cpu
        ),
    );
    let mut out = Vec::new();
    for &n in &points {
        let g = Gen::for_flows(n);
        let table = |e: &XpfOut| {
            let m = e.w.t4.memory().total() + e.w.t6.memory().total();
            vec![("table_bytes_per_state".to_string(), m as f64 / e.w.states().max(1) as f64)]
        };
        // Both tables held at once and measured in turn (ABBA): the ratio is of one stretch
        // of time on this VM, whose speed drifts from one minute to the next.
        let step = crate::progress::step(format!("{n} states: plain and nat-to, alternated"));
        let (plain, nat) = crate::runner::paired_runs(
            &g,
            o.runs,
            o.seconds,
            o.batch,
            o.shuffle,
            |lim| XpfOut::new(lim, None),
            |lim| XpfOut::new(lim, Some(bench_pool())),
            table,
            table,
        );
        drop(step);
        let _s = crate::progress::step(format!("{n} states: new states"));
        let runs = o.runs.min(3);
        let plain_new = insert_runs(&g, runs, o.batch, |lim| XpfOut::new(lim, None));
        let nat_new = insert_runs(&g, runs, o.batch, |lim| XpfOut::new(lim, Some(bench_pool())));
        let nat_flush_ms = {
            let mut feed = crate::runner::Feed::new(g.clone(), 0, 1);
            let count = feed.count;
            let mut e = XpfOut::new(count, Some(bench_pool()));
            crate::runner::pump(&mut e, &mut feed, count, 0.0, o.batch, 1);
            let t = std::time::Instant::now();
            let gone = e.w.remove_all_states(false, 2);
            e.w.maintain(2, u32::MAX);
            assert_eq!((gone as u64, e.w.nat.ports_used().0), (count, 0));
            t.elapsed().as_secs_f64() * 1e3
        };
        let (ps, ns) = (Summary::of(&plain.runs), Summary::of(&nat.runs));
        out.push(NatPoint {
            states: n,
            nat_over_plain: ns.median / ps.median,
            plain_pps: ps,
            nat_pps: ns,
            plain_new_per_sec: Summary::of(&plain_new),
            nat_new_per_sec: Summary::of(&nat_new),
            plain_table_bytes_per_state: extra(&plain, "table_bytes_per_state"),
            nat_table_bytes_per_state: extra(&nat, "table_bytes_per_state"),
            nat_rss_bytes_per_state: nat.rss_per_state,
            nat_flush_ms,
        });
    }
    // The allocator alone: one address's 15,535 ports, `occupancy` of them held by flows; the
    // time to take a port for a new flow and give it back (its key checked free each try).
    let mut allocation = Vec::new();
    for occupancy in [0.0, 0.9, 0.999] {
        use rand_core::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::from_seed([5; 32]);
        let mut a = xpf_engine::nat::Nat::default();
        let addr = xpf_wire::Addr::v4([198, 51, 0, 1]);
        let range = (50001u16, 65535u16);
        let held = ((range.1 - range.0 + 1) as f64 * occupancy) as usize;
        let mut used = std::collections::HashSet::new();
        for _ in 0..held {
            let p = a.take_port((addr, 4), 17, range, 0, &mut rng, |p| !used.contains(&p)).expect("free port");
            used.insert(p);
        }
        let mut runs = Vec::new();
        for r in 0..o.runs {
            let n = 200_000u32;
            // Released ports are past their hold: each run is a second 1,000 s later.
            let now = 1000 * (r as u32 + 1);
            let t = std::time::Instant::now();
            for _ in 0..n {
                let p = a.take_port((addr, 4), 17, range, now, &mut rng, |p| !used.contains(&p)).expect("a port");
                a.put_port(addr, 4, 17, p, now - xpf_engine::nat::HOLD);
            }
            runs.push(t.elapsed().as_nanos() as f64 / n as f64);
        }
        allocation.push(AllocPoint { occupancy, ns_per_port: Summary::of(&runs) });
    }
    say(
        o,
        format!(
            "{:>10} {:>14} {:>14} {:>9} {:>14} {:>14} {:>10} {:>10}",
            "states", "plain pps", "nat-to pps", "nat/plain", "plain new/s", "nat-to new/s", "B/st", "B/st nat"
        ),
    );
    for p in &out {
        say(
            o,
            format!(
                "{:>10} {:>14.0} {:>14.0} {:>9.3} {:>14.0} {:>14.0} {:>10.1} {:>10.1}",
                p.states,
                p.plain_pps.median,
                p.nat_pps.median,
                p.nat_over_plain,
                p.plain_new_per_sec.median,
                p.nat_new_per_sec.median,
                p.plain_table_bytes_per_state,
                p.nat_table_bytes_per_state
            ),
        );
    }
    for p in &out {
        say(o, format!("-F states of {} translated states: {:.1} ms", p.states, p.nat_flush_ms));
    }
    say(o, "port allocation, ns per new flow (take and give back), by occupancy of one address's ports:".into());
    for a in &allocation {
        say(
            o,
            format!(
                "  {:>6.1}%  {:>8.1} ns (min {:.1}, max {:.1})",
                a.occupancy * 100.0,
                a.ns_per_port.median,
                a.ns_per_port.min,
                a.ns_per_port.max
            ),
        );
    }
    let series = vec![
        Series {
            title: "without nat",
            points: out
                .iter()
                .map(|p| (p.states as f64, p.plain_pps.median, p.plain_pps.min, p.plain_pps.max))
                .collect(),
        },
        Series {
            title: "nat-to",
            points: out.iter().map(|p| (p.states as f64, p.nat_pps.median, p.nat_pps.min, p.nat_pps.max)).collect(),
        },
    ];
    let report = NatReport { bench: o.bench.clone(), env: e, pool: pool.into(), points: out, allocation };
    let io = |err: std::io::Error| format!("writing {}: {err}", o.out.display());
    std::fs::create_dir_all(&o.out).map_err(io)?;
    let json = serde_json::to_string_pretty(&report).unwrap();
    std::fs::write(o.out.join("nat.json"), &json).map_err(io)?;
    if let Ok(Ok(png)) = plot::write(
        &o.out,
        "nat",
        "established UDP out, with and without nat-to",
        "states",
        "packets per second",
        true,
        &series,
    ) {
        say(o, format!("plot: {png}"));
    }
    if o.json {
        println!("{json}");
    }
    Ok(())
}
