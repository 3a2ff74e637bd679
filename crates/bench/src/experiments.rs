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
        commit: crate::sys::commit(),
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
    {
        say(o, stats::header("engine", "new states/s"));
        say(o, stats::row("xpf", &xs));
        if let Some(hs) = &hs {
            say(o, stats::row("HashMap", hs));
            say(o, format!("xpf/HashMap: {:.2}x", xs.median / hs.median));
        }
    }
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

/// A campus-like ruleset of about `n` rules: per network a chain (block the network's inbound
/// traffic, pass its web and mail servers, pass its users' outbound traffic with state), and
/// per user a rule, in the style of the 1.6M-rule campus NAT that motivates xpf.
pub fn campus_ruleset(n: usize) -> String {
    let mut s = String::with_capacity(n * 64);
    s.push_str("block all\n");
    let per_net = 10;
    let nets = n.div_ceil(per_net).max(1);
    for k in 0..nets {
        let (a, b) = ((k >> 8) & 0xff, k & 0xff);
        let net = format!("10.{a}.{b}.0/24");
        s.push_str(&format!("block in quick on em0 proto tcp from any to {net} port 23\n"));
        s.push_str(&format!("pass in on em0 proto tcp from any to 10.{a}.{b}.10 port {{ 80 443 }}\n"));
        s.push_str(&format!("pass in on em0 proto tcp from any to 10.{a}.{b}.25 port 25\n"));
        // 1 block + 2 (web: two ports) + 1 mail + users + 1 network rule = per_net rules.
        for u in 0..(per_net - 5) {
            s.push_str(&format!("pass out on em0 proto tcp from 10.{a}.{b}.{} to any\n", 100 + u * 3));
        }
        s.push_str(&format!("pass out on em0 inet from {net} to any\n"));
    }
    s
}

#[derive(Serialize)]
struct RulesPoint {
    rules: usize,
    parse_compile_seconds: f64,
    evaluations_per_sec: Summary,
    runs: Vec<f64>,
}

/// First-packet rule evaluations per second for rulesets of 10, 1k, 100k and 1M rules.
pub fn rules(o: &Opts) -> Result<(), String> {
    use std::time::Instant;
    use xpf_engine::Policy;
    let sizes: Vec<usize> = o
        .points
        .clone()
        .map(|v| v.into_iter().map(|x| x as usize).collect())
        .unwrap_or(if o.quick { vec![10, 1_000, 100_000] } else { vec![10, 1_000, 100_000, 1_000_000] });
    let e = env(o);
    say(o, format!("xpf-bench rules: first-packet evaluations/s on campus-like rulesets (linear with skip steps), {} runs; commit {}", o.runs, e.commit));
    let mut out = Vec::new();
    for &n in &sizes {
        let text = campus_ruleset(n);
        let t = Instant::now();
        let p = xpf_conf::parse(&text, "campus", &[]);
        if let Some(err) = p.errors.first() {
            return Err(format!("generated ruleset refused: {err}"));
        }
        let r = xpf_conf::Ruleset::compile(&p, &|n| (n == "em0").then_some(1)).map_err(|e| e.msg)?;
        let pc = t.elapsed().as_secs_f64();
        // Packets of new flows towards random hosts of the campus networks.
        let nets = n.div_ceil(10).max(1) as u64;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let pkts: Vec<xpf_wire::PDesc> = (0..4096)
            .map(|_| {
                let k = next() % nets;
                let (a, b) = (((k >> 8) & 0xff) as u8, (k & 0xff) as u8);
                let out = next() % 2 == 0;
                let host = [10, a, b, (next() % 254 + 1) as u8];
                let peer = [198, 51, 100, (next() % 254 + 1) as u8];
                let (s, d) = if out { (host, peer) } else { (peer, host) };
                xpf_wire::PDesc {
                    src: xpf_wire::Addr::v4(s),
                    dst: xpf_wire::Addr::v4(d),
                    sport: 40000,
                    dport: [22, 25, 80, 443][(next() % 4) as usize],
                    af: 4,
                    proto: 6,
                    tcp_flags: xpf_wire::tcp::SYN,
                    flags: xpf_wire::pdesc::pdf::HAS_PORTS,
                    ..Default::default()
                }
            })
            .collect();
        let mut runs = Vec::new();
        for _ in 0..o.runs {
            let (mut k, t) = (0usize, Instant::now());
            while t.elapsed().as_secs_f64() < o.seconds || k < 64 {
                for pd in pkts.iter().cycle().skip(k % pkts.len()).take(64) {
                    let dir = if pd.src.0[0] == 10 { xpf_state::Dir::Out } else { xpf_state::Dir::In };
                    std::hint::black_box(r.evaluate(pd, 1, dir));
                }
                k += 64;
            }
            runs.push(k as f64 / t.elapsed().as_secs_f64());
        }
        say(o, format!("  {} rules: parsed and compiled in {pc:.2} s", r.len()));
        out.push(RulesPoint {
            rules: r.len(),
            parse_compile_seconds: pc,
            evaluations_per_sec: Summary::of(&runs),
            runs,
        });
    }
    say(o, stats::header("rules", "evaluations/s"));
    for p in &out {
        say(o, stats::row(&p.rules.to_string(), &p.evaluations_per_sec));
    }
    let series = vec![Series {
        title: "xpf (linear, skip steps)",
        points: out
            .iter()
            .map(|p| {
                (p.rules as f64, p.evaluations_per_sec.median, p.evaluations_per_sec.min, p.evaluations_per_sec.max)
            })
            .collect(),
    }];
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
    }
}

/// Translation in the engine: established packets per second and new states per second of the
/// same flows filtered `out` with and without `nat-to` (the rewrite included), bytes per
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
            "xpf-bench nat: established UDP out, 60-byte frames, {pool}, 1 worker, batch {}, {} runs of >= {} s; commit {}; {}",
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
        let step = crate::progress::step(format!("{n} states: plain"));
        let plain = shard_runs(&g, 1, o.runs, o.seconds, o.batch, o.shuffle, |lim| XpfOut::new(lim, None), table);
        drop(step);
        let _s = crate::progress::step(format!("{n} states: nat-to"));
        let nat =
            shard_runs(&g, 1, o.runs, o.seconds, o.batch, o.shuffle, |lim| XpfOut::new(lim, Some(bench_pool())), table);
        let runs = o.runs.min(3);
        let plain_new = insert_runs(&g, runs, o.batch, |lim| XpfOut::new(lim, None));
        let nat_new = insert_runs(&g, runs, o.batch, |lim| XpfOut::new(lim, Some(bench_pool())));
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
            let p = a.take_port(addr, 17, range, 0, &mut rng, |p| !used.contains(&p)).expect("free port");
            used.insert(p);
        }
        let mut runs = Vec::new();
        for r in 0..o.runs {
            let n = 200_000u32;
            // Released ports are past their hold: each run is a second 1,000 s later.
            let now = 1000 * (r as u32 + 1);
            let t = std::time::Instant::now();
            for _ in 0..n {
                let p = a.take_port(addr, 17, range, now, &mut rng, |p| !used.contains(&p)).expect("a port");
                a.put_port(addr, 17, p, now - xpf_engine::nat::HOLD);
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
