//! xpf-bench: pf's classic experiments on xpf, each run beside a baseline measured in the same
//! run. `states`: packets per second against the number of states; `hashsize`: against the
//! index size at 4M states; `insert`: new states per second. See docs/bench.md.

mod engines;
mod experiments;
mod lab;
mod plot;
mod progress;
mod real;
mod runner;
mod shaperbench;
mod shared;
mod stats;
mod syncbench;
mod sys;

use std::path::PathBuf;
use std::process::ExitCode;

/// Every flag, once: name, value placeholder, help.
const FLAGS: &[(&str, &str, &str)] = &[
    ("--workers", "N", "worker threads, one per CPU, pinned (default 1); rules: threads evaluating the ruleset at once"),
    ("--mode", "shard|shared", "per-worker tables with flow steering (default), or one shared striped table"),
    ("--runs", "N", "measured runs per point (default 5; 3 with --quick)"),
    ("--seconds", "S", "minimum engine time per run (default 1.0; 0.25 with --quick)"),
    ("--batch", "N", "frames per batch handed to the worker, 1-64 (default 64)"),
    ("--quick", "", "the CI-sized version: fewer points and runs, under a minute"),
    ("--big", "", "states: add 40M and 100M states"),
    ("--points", "N,N,..", "states: these numbers of states instead of the default list"),
    (
        "--states",
        "N",
        "hashsize, insert, resize, sync (bulk): the number of states (default 4M / 10M / 10M / 10M; 1M with --quick)",
    ),
    ("--rows", "R,R,..", "hashsize: these index sizes instead of the sweep"),
    (
        "--tcp",
        "",
        "states: TCP flows (SYN makes the state, ACKs are measured) instead of UDP; lab: TCP connections (a handshake each, then data segments)",
    ),
    ("--shuffle", "", "measure flows in a scattered order instead of pkt-gen's (states met out of creation order)"),
    ("--no-baseline", "", "skip the HashMap baseline"),
    ("--json", "", "print the report as JSON on stdout (progress goes to stderr)"),
    ("--info", "", "replay: print pfctl -si's view of the counters after each capture"),
    (
        "--conf",
        "FILE",
        "replay: filter with this pf.conf (interface names map to the capture's interface 1) instead of pass all",
    ),
    ("--busy-poll", "", "lab: start xpfd with --busy-poll (its sockets busy-poll instead of sleeping)"),
    ("--no-xdp-tx", "", "lab: start xpfd with --no-xdp-tx (frames leave through AF_XDP only)"),
    ("--worker-rt", "MODE", "lab: start xpfd with --worker-rt MODE (auto, its default: real-time in a SYN flood; off; or a priority: always)"),
    ("--cpu", "", "lab: print each measurement's CPU split per core (busy, softirq, idle, steal, NET_RX softirqs)"),
    ("--sink-thread", "", "lab: the sink's NAPI as a thread on the generator's core, off the firewall core"),
    ("--fastpath", "", "lab, real: start xpfd with --fastpath (established flows forwarded in the kernel)"),
    ("--io", "MODE", "real: start xpfd with --io MODE (xdp, packet; default: xpfd's own choice, packet mode on veth)"),
    ("--nat", "", "lab, real: both firewalls translate the sources (xpfd nat-to, nftables snat)"),
    ("--log", "", "lab: xpfd's rule is `pass log (all) all` (every packet to pflog): logging's cost on a busy rule"),
    ("--rounds", "N", "real: kernel/xpfd rounds, alternated (default 3; 1 with --quick)"),
    ("--queues", "N", "real: queues a side on the veths (default: --workers)"),
    (
        "--campus",
        "N",
        "rules: write a campus ruleset of N rules (pf.conf, nftables expert and rule-by-rule forms) to --out",
    ),
    ("--random", "N", "rules: write a ClassBench-style random ruleset of N rules (pf.conf) to --out"),
    (
        "--rules",
        "N,N,..",
        "lab: new connections/s through campus rulesets of these sizes, xpfd against nftables (both forms)",
    ),
    (
        "--shaper",
        "N",
        "lab: N member queues under one root, xpfd's queues against tc HTB (nftables sets each member's class); shaper: N member queues (default 24,000)",
    ),
    ("--out", "DIR", "where gnuplot data, the plot and the JSON go (default bench-results/out/<bench>)"),
];

#[derive(Debug, Clone)]
pub struct Opts {
    pub bench: String,
    pub workers: usize,
    pub shared: bool,
    pub runs: usize,
    pub seconds: f64,
    pub batch: usize,
    pub quick: bool,
    pub big: bool,
    pub points: Option<Vec<u64>>,
    pub rules: Vec<usize>,
    /// lab: member queues of the shaper lab (0: not that lab).
    pub shaper: u32,
    pub states: Option<u64>,
    pub rows: Option<Vec<u32>>,
    pub baseline: bool,
    pub tcp: bool,
    pub shuffle: bool,
    pub json: bool,
    pub info: bool,
    pub busy_poll: bool,
    pub no_xdp_tx: bool,
    pub worker_rt: Option<String>,
    pub cpu: bool,
    pub sink_thread: bool,
    pub fastpath: bool,
    /// real: xpfd's --io.
    pub io: Option<String>,
    /// lab: translation on both sides.
    pub nat: bool,
    /// lab: xpfd's rule logs every packet (`pass log (all) all`) to pflog.
    pub log: bool,
    pub rounds: Option<usize>,
    pub queues: Option<usize>,
    pub out: PathBuf,
    /// replay: the ruleset.
    pub conf: Option<PathBuf>,
    /// replay: capture files.
    pub files: Vec<PathBuf>,
    /// rules: write the generated rulesets instead of measuring.
    pub campus: Option<usize>,
    pub random: Option<usize>,
}

fn usage() -> String {
    let mut s = String::from(
        "usage: xpf-bench states|hashsize|insert|resize|rules|nat|lab|real|sync|shaper [options]\n       xpf-bench replay FILE.pcap...\n       xpf-bench flood [--seconds S] NETNS DEV NEXTHOP-MAC DST PORT   (a SYN flood, every packet a new source)\n\noptions:\n",
    );
    for (f, v, h) in FLAGS {
        s.push_str(&format!("  {:<24} {h}\n", format!("{f} {v}")));
    }
    s
}

fn parse_num(flag: &str, v: &str) -> Result<u64, String> {
    let v = v.trim();
    let (digits, mul) = match v.chars().last() {
        Some('k' | 'K') => (&v[..v.len() - 1], 1_000),
        Some('M') => (&v[..v.len() - 1], 1_000_000),
        Some('G') => (&v[..v.len() - 1], 1_000_000_000),
        Some('i') if v.ends_with("Ki") => (&v[..v.len() - 2], 1 << 10),
        Some('i') if v.ends_with("Mi") => (&v[..v.len() - 2], 1 << 20),
        _ => (v, 1),
    };
    digits
        .replace('_', "")
        .parse::<u64>()
        .map(|x| x * mul)
        .map_err(|_| format!("{flag}: '{v}' is not a number (forms: 4000000, 4M, 32Ki)"))
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let bench = args.first().ok_or_else(usage)?.clone();
    if !["states", "hashsize", "insert", "resize", "rules", "nat", "replay", "lab", "real", "sync", "flood", "shaper"]
        .contains(&bench.as_str())
    {
        return Err(format!("unknown bench '{bench}'\n\n{}", usage()));
    }
    let mut o = Opts {
        out: PathBuf::from("bench-results/out").join(&bench),
        bench,
        workers: 1,
        shared: false,
        runs: 0,
        seconds: 0.0,
        batch: 64,
        quick: false,
        big: false,
        points: None,
        rules: Vec::new(),
        shaper: 0,
        states: None,
        rows: None,
        baseline: true,
        tcp: false,
        shuffle: false,
        json: false,
        info: false,
        busy_poll: false,
        no_xdp_tx: false,
        worker_rt: None,
        cpu: false,
        sink_thread: false,
        fastpath: false,
        io: None,
        nat: false,
        log: false,
        rounds: None,
        queues: None,
        conf: None,
        files: Vec::new(),
        campus: None,
        random: None,
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        if (o.bench == "replay" || o.bench == "flood") && !a.starts_with("--") {
            o.files.push(PathBuf::from(a));
            continue;
        }
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--workers" => o.workers = parse_num(a, &val()?)?.clamp(1, 256) as usize,
            "--mode" => {
                o.shared = match val()?.as_str() {
                    "shard" => false,
                    "shared" => true,
                    v => return Err(format!("--mode: '{v}' is neither shard nor shared")),
                }
            }
            "--runs" => o.runs = parse_num(a, &val()?)?.max(1) as usize,
            "--seconds" => o.seconds = val()?.parse::<f64>().map_err(|_| "--seconds takes a number".to_string())?,
            "--batch" => o.batch = parse_num(a, &val()?)?.clamp(1, 64) as usize,
            "--quick" => o.quick = true,
            "--conf" => o.conf = Some(PathBuf::from(val()?)),
            "--big" => o.big = true,
            "--points" => o.points = Some(val()?.split(',').map(|x| parse_num(a, x)).collect::<Result<_, _>>()?),
            "--rules" => {
                o.rules = val()?.split(',').map(|x| parse_num(a, x).map(|n| n as usize)).collect::<Result<_, _>>()?
            }
            "--shaper" => o.shaper = parse_num(a, &val()?)?.min(60_000) as u32,
            "--states" => o.states = Some(parse_num(a, &val()?)?),
            "--rows" => {
                o.rows = Some(val()?.split(',').map(|x| parse_num(a, x).map(|v| v as u32)).collect::<Result<_, _>>()?)
            }
            "--no-baseline" => o.baseline = false,
            "--tcp" => o.tcp = true,
            "--shuffle" => o.shuffle = true,
            "--json" => o.json = true,
            "--info" => o.info = true,
            "--busy-poll" => o.busy_poll = true,
            "--no-xdp-tx" => o.no_xdp_tx = true,
            "--worker-rt" => o.worker_rt = Some(val()?),
            "--cpu" => o.cpu = true,
            "--sink-thread" => o.sink_thread = true,
            "--fastpath" => o.fastpath = true,
            "--io" => o.io = Some(val()?),
            "--nat" => o.nat = true,
            "--log" => o.log = true,
            "--rounds" => o.rounds = Some(parse_num(a, &val()?)?.max(1) as usize),
            "--queues" => o.queues = Some(parse_num(a, &val()?)?.clamp(1, 64) as usize),
            "--out" => o.out = PathBuf::from(val()?),
            "--campus" => o.campus = Some(parse_num(a, &val()?)? as usize),
            "--random" => o.random = Some(parse_num(a, &val()?)? as usize),
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown option '{other}'\n\n{}", usage())),
        }
    }
    if o.runs == 0 {
        o.runs = if o.quick { 3 } else { 5 };
    }
    if o.seconds == 0.0 {
        o.seconds = if o.quick { 0.25 } else { 1.0 };
    }
    Ok(o)
}

/// Replays captures through the engine with `--conf`'s ruleset (or `pass all`) and prints
/// what became of each packet.
fn replay(o: &Opts) -> Result<(), String> {
    if o.files.is_empty() {
        return Err("replay needs at least one capture file".into());
    }
    let conf = match &o.conf {
        Some(path) => Some(xpf_bench::replay::Conf::load(path)?),
        None => None,
    };
    let mut failed = false;
    for f in &o.files {
        let r = match &conf {
            Some(c) => xpf_bench::replay::replay_file(f, c.ruleset()?, c.reassemble),
            None => xpf_bench::replay::replay_file(f, xpf_engine::PassAll, true),
        };
        match r {
            Ok(r) => {
                let drops: Vec<String> = r.dropped.iter().map(|(k, n)| format!("{}={n}", k.name())).collect();
                println!(
                    "{}: {} records, {} passed, {} dropped [{}], {} to host, {} skipped, {} held, {} states",
                    f.display(),
                    r.records,
                    r.passed,
                    r.dropped_total(),
                    drops.join(" "),
                    r.to_host,
                    r.skipped,
                    r.held,
                    r.states
                );
                if o.info {
                    println!("{}", r.info);
                }
            }
            Err(e) => {
                eprintln!("xpf-bench replay: {e}");
                failed = true;
            }
        }
    }
    if failed {
        Err("some captures could not be read".into())
    } else {
        Ok(())
    }
}

/// The netns lab against the kernel (xpf_bench::lab).
fn lab(o: &Opts) -> Result<(), String> {
    let points = o.points.clone().unwrap_or_else(|| {
        if o.quick {
            vec![128, 9_800, 100_000]
        } else {
            vec![128, 9_800, 100_000, 1_000_000, 2_000_000]
        }
    });
    let bin = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default();
    lab::run(&lab::LabOpts {
        points,
        runs: o.runs,
        seconds: if o.quick { o.seconds.max(1.0) } else { o.seconds.max(5.0) },
        out: o.out.clone(),
        bin,
        json: o.json,
        busy_poll: o.busy_poll,
        no_xdp_tx: o.no_xdp_tx,
        worker_rt: o.worker_rt.clone(),
        cpu: o.cpu,
        sink_thread: o.sink_thread,
        fastpath: o.fastpath,
        nat: o.nat,
        log: o.log,
        rules: o.rules.clone(),
        shaper: o.shaper,
        tcp: o.tcp,
    })
}

/// `xpf-bench real`: real clients (iperf3, ping) through xpfd and the kernel's firewall.
fn real(o: &Opts) -> Result<(), String> {
    let bin = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default();
    real::run_bench(&real::RealOpts {
        rounds: o.rounds.unwrap_or(if o.quick { 1 } else { 3 }),
        // --seconds when given above the engine benches' default of 1, else 4.
        seconds: if o.quick {
            2
        } else if o.seconds > 1.0 {
            o.seconds as u32
        } else {
            4
        },
        out: o.out.clone(),
        bin,
        json: o.json,
        fastpath: o.fastpath,
        io: o.io.clone(),
        nat: o.nat,
        workers: o.workers,
        queues: o.queues.unwrap_or(o.workers),
    })
}

/// `xpf-bench flood`: SYNs at the generator's full rate out of DEV in NETNS, to DST:PORT by
/// way of NEXTHOP-MAC, each from a new source in 198.18.0.0/15; prints what was sent.
fn flood(o: &Opts) -> Result<(), String> {
    let a: Vec<String> = o.files.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let [netns, dev, mac, dst, port] = &a[..] else {
        return Err(format!("needs NETNS DEV NEXTHOP-MAC DST PORT\n\n{}", usage()));
    };
    let mac = lab::parse_mac(mac).ok_or_else(|| format!("'{mac}' is not a MAC address"))?;
    let dst: std::net::Ipv4Addr = dst.parse().map_err(|_| format!("'{dst}' is not an IPv4 address"))?;
    let port: u16 = port.parse().map_err(|_| format!("'{port}' is not a port"))?;
    let (sent, secs) = lab::syn_flood(netns, dev, mac, dst, port, o.seconds)?;
    println!("flood: {sent} SYNs in {secs:.2} s ({:.0}/s)", sent as f64 / secs);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xpf-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match o.bench.as_str() {
        "states" => experiments::states(&o),
        "nat" => experiments::nat(&o),
        "hashsize" => experiments::hashsize(&o),
        "replay" => replay(&o),
        "resize" => experiments::resize(&o),
        "rules" => experiments::rules(&o),
        "lab" => lab(&o),
        "real" => real(&o),
        "flood" => flood(&o),
        "sync" => syncbench::run(&o),
        "shaper" => shaperbench::bench(&o),
        _ => experiments::insert(&o),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xpf-bench {}: {e}", o.bench);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Opts, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn flags() {
        let o = p("states --quick --workers 2 --points 128,4M --json").unwrap();
        assert_eq!((o.workers, o.runs, o.seconds, o.json), (2, 3, 0.25, true));
        assert_eq!(o.points, Some(vec![128, 4_000_000]));
        assert_eq!(p("hashsize --rows 32Ki,1Mi").unwrap().rows, Some(vec![32768, 1 << 20]));
        assert!(p("states --mode both").unwrap_err().contains("both"));
        assert!(p("states --runs x").unwrap_err().contains("'x'"));
        assert!(p("nope").unwrap_err().contains("unknown bench"));
        assert!(p("states --bogus").unwrap_err().contains("--bogus"));
    }
}
