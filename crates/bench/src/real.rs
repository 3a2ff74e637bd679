//! `xpf-bench real`: what real clients see through xpfd and through the kernel's firewall
//! (nftables + conntrack) with the same policy, on the hosts' default settings, alternated
//! (kernel, xpfd, kernel, xpfd ...) in one run, between the scenario's namespaces
//! (scripts/topo.sh):
//!
//! ```text
//! client 10.0.1.2 -- [fc] firewall [fs] -- server 10.0.2.2
//! ```
//! Per round and setup: iperf3 TCP 1 and 4 streams (Gbit/s received), iperf3 UDP with 64-byte
//! payloads (datagrams/s received), ping RTT p50/p99 (every 10 ms) while 4 TCP streams run.
//! Prints a row per run, ministat rows per measure, the medians with xpf/kernel ratios, and
//! draws the ratios (median, min and max over the runs) in a PNG.
//!
//! With `--fastpath`, xpfd runs with its fast path. A veth takes redirected XDP frames only
//! when its peer runs NAPI (GRO on, or an XDP program): a setting of the end hosts, which the
//! bench then turns on at the client's and the server's veth for both setups (said in the
//! output), so that the two sides stay like for like. With `--io packet` xpfd reads frames
//! through AF_PACKET and its fast path forwards socket buffers, which any interface takes:
//! the end hosts keep their defaults.
//!
//! With `--nat`, both translate the client to the firewall's address on the server's side
//! (xpfd `match out on fs inet nat-to 10.0.2.1`, nftables `snat ip to 10.0.2.1`).

use crate::stats::{header, Summary};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RealOpts {
    pub rounds: usize,
    pub seconds: u32,
    pub out: PathBuf,
    pub bin: PathBuf,
    pub json: bool,
    pub fastpath: bool,
    /// xpfd's `--io` (None: its default).
    pub io: Option<String>,
    /// Both firewalls translate the client's address to the firewall's (xpfd `nat-to`,
    /// nftables `snat`).
    pub nat: bool,
    /// xpfd's workers, and the veths' queues a side (topo.sh's QUEUES).
    pub workers: usize,
    pub queues: usize,
}

const P: &str = "xr-";
const SOCK: &str = "/run/xpf-real.sock";
const PF: &str = "block all
pass in on fc inet proto tcp to 10.0.2.2 port 5201
pass in on fc inet proto udp to 10.0.2.2 port 5201
pass in on fc inet proto icmp icmp-type echoreq
pass out on fs
";
const NFT: &str = "table inet real {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname \"fc\" ip daddr 10.0.2.2 tcp dport 5201 ct state new accept
        iifname \"fc\" ip daddr 10.0.2.2 udp dport 5201 ct state new accept
        iifname \"fc\" icmp type echo-request ct state new accept
    }
}
";
/// `--nat`: the same source translation on both.
const PF_NAT: &str = "match out on fs inet nat-to 10.0.2.1\n";
const NFT_NAT: &str = "table inet real {
    chain post {
        type nat hook postrouting priority srcnat;
        oifname \"fs\" snat ip to 10.0.2.1
    }
}
";

/// The measures, in row order: name, unit, whether lower is better.
const MEASURES: [(&str, &str, bool); 5] = [
    ("TCP 1 stream", "Gbit/s", false),
    ("TCP 4 streams", "Gbit/s", false),
    ("UDP 64 B received", "datagrams/s", false),
    ("ping under load p50", "ms", true),
    ("ping under load p99", "ms", true),
];

fn ns(n: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &format!("{P}{n}")]).args(args);
    c
}

fn run(mut c: Command) -> Result<String, String> {
    let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{c:?}: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The namespaces and what runs in them; all taken down on drop (also on an error).
struct Lab {
    dir: PathBuf,
    xpfd: Option<Child>,
}

impl Lab {
    fn up(fastpath: bool, nat: bool, queues: usize) -> Result<Lab, String> {
        let dir = std::env::temp_dir().join(format!("xpf-real.{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let lab = Lab { dir, xpfd: None };
        run({
            let mut c = Command::new("scripts/topo.sh");
            c.args(["up", P]).env("QUEUES", queues.to_string());
            c
        })?;
        let (pf, nft) =
            if nat { (format!("{PF}{PF_NAT}"), format!("{NFT}{NFT_NAT}")) } else { (PF.into(), NFT.into()) };
        std::fs::write(lab.dir.join("pf.conf"), pf).map_err(|e| e.to_string())?;
        std::fs::write(lab.dir.join("nft.conf"), nft).map_err(|e| e.to_string())?;
        if fastpath {
            run(ns("client", &["ethtool", "-K", "c0", "gro", "on"]))?;
            run(ns("server", &["ethtool", "-K", "s0", "gro", "on"]))?;
        }
        run(ns("server", &["iperf3", "-s", "-D", "--bind", "10.0.2.2"]))?;
        Ok(lab)
    }

    fn kernel(&self, on: bool) -> Result<(), String> {
        if on {
            run(ns("fw", &["nft", "-f", &self.dir.join("nft.conf").to_string_lossy()])).map(|_| ())
        } else {
            run(ns("fw", &["nft", "delete", "table", "inet", "real"])).map(|_| ())
        }
    }

    fn xpfd_on(&mut self, bin: &Path, fastpath: bool, io: Option<&str>, workers: usize) -> Result<(), String> {
        let conf = self.dir.join("pf.conf");
        let log = std::fs::File::create(self.dir.join("xpfd.log")).map_err(|e| e.to_string())?;
        let mut c =
            ns("fw", &[&bin.join("xpfd").to_string_lossy(), "-f", &conf.to_string_lossy(), "-i", "fc", "-i", "fs"]);
        c.args(["--socket", SOCK, "--workers", &workers.to_string()]);
        c.arg(if fastpath { "--fastpath" } else { "--no-fastpath" });
        if let Some(io) = io {
            c.args(["--io", io]);
        }
        self.xpfd = Some(c.stdout(Stdio::null()).stderr(log).spawn().map_err(|e| format!("xpfd: {e}"))?);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let ok = Command::new(bin.join("xpfctl"))
                .args(["--socket", SOCK, "-s", "memory"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("xpfd did not start: {}", std::fs::read_to_string(self.dir.join("xpfd.log")).unwrap_or_default()))
    }

    fn xpfd_off(&mut self) {
        if let Some(mut c) = self.xpfd.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && !matches!(c.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.xpfd_off();
        for n in ["client", "server", "far"] {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", &format!("{P}{n}")]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        // SAFETY: a plain signal to a process in our bench's namespace.
                        unsafe { libc::kill(p, libc::SIGTERM) };
                    }
                }
            }
        }
        let _ = Command::new("scripts/topo.sh").args(["down", P]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(SOCK);
    }
}

fn iperf(secs: u32, extra: &[&str]) -> Result<serde_json::Value, String> {
    let t = secs.to_string();
    let mut args = vec!["iperf3", "-c", "10.0.2.2", "-t", &t, "--json"];
    args.extend_from_slice(extra);
    let out = ns("client", &args).output().map_err(|e| format!("iperf3: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3 {extra:?}: no JSON ({e})"))?;
    if let Some(e) = v.get("error") {
        return Err(format!("iperf3 {extra:?}: {e}"));
    }
    Ok(v)
}

/// One run of every measure: [tcp1, tcp4, udp, p50, p99].
fn measure(secs: u32) -> Result<[f64; 5], String> {
    let _ = ns("client", &["ping", "-c", "2", "-i", "0.2", "-W", "1", "10.0.2.2"]).output();
    let gbits = |v: &serde_json::Value| v["end"]["sum_received"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9;
    let t1 = gbits(&iperf(secs, &[])?);
    let t4 = gbits(&iperf(secs, &["-P", "4"])?);
    let u = iperf(secs, &["-u", "-b", "0", "-l", "64"])?;
    let s = &u["end"]["sum"];
    let udp = (s["packets"].as_f64().unwrap_or(0.0) - s["lost_packets"].as_f64().unwrap_or(0.0))
        / s["seconds"].as_f64().unwrap_or(1.0).max(0.001);
    // RTT while 4 TCP streams run.
    let mut bulk = ns("client", &["iperf3", "-c", "10.0.2.2", "-t", &secs.to_string(), "-P", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let count = (secs * 80).to_string();
    let ping = ns("client", &["ping", "-i", "0.01", "-c", &count, "-W", "1", "10.0.2.2"])
        .output()
        .map_err(|e| format!("ping: {e}"))?;
    let _ = bulk.wait();
    let mut rtt: Vec<f64> = String::from_utf8_lossy(&ping.stdout)
        .split("time=")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .collect();
    rtt.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = if rtt.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (rtt[rtt.len() / 2], rtt[(rtt.len() * 99 / 100).min(rtt.len() - 1)])
    };
    Ok([t1, t4, udp, p50, p99])
}

pub fn run_bench(o: &RealOpts) -> Result<(), String> {
    for t in ["ip", "iperf3", "ping", "nft", "ethtool"] {
        if Command::new("sh").args(["-c", &format!("command -v {t}")]).output().map_or(true, |r| !r.status.success()) {
            return Err(format!("real: '{t}' is missing (scripts/deps.sh installs it)"));
        }
    }
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=8"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!(
        "real: {} rounds, {} s per measure, commit {commit}; veth with {} queue(s) a side, xpfd with {} worker(s){}",
        o.rounds,
        o.seconds,
        o.queues,
        o.workers,
        match (o.fastpath, o.io.as_deref()) {
            (true, Some("xdp")) =>
                "; xpfd --io xdp --fastpath, GRO on at the client's and server's veth for both setups".to_string(),
            (true, io) => format!(
                "; xpfd{} --fastpath (packet mode's socket buffers), the end hosts' defaults",
                io.map(|i| format!(" --io {i}")).unwrap_or_default()
            ),
            (false, Some(io)) => format!("; xpfd --io {io}"),
            (false, None) => String::new(),
        }
    );
    if o.nat {
        eprintln!("real: both translate the client to 10.0.2.1 (xpfd nat-to, nftables snat)");
    }
    // Without --io xpfd chooses packet mode on these veths; XDP's fast path needs GRO at the
    // end hosts (a veth takes redirected XDP frames only then), set for both setups alike.
    let xdp_fast = o.fastpath && o.io.as_deref() == Some("xdp");
    let mut lab = Lab::up(xdp_fast, o.nat, o.queues)?;
    let mut rows: [Vec<[f64; 5]>; 2] = [Vec::new(), Vec::new()];
    println!("{:>7} {:>9} {:>9} {:>11} {:>9} {:>9}", "setup", "tcp1", "tcp4", "udp64", "p50 ms", "p99 ms");
    for round in 0..o.rounds {
        let step = crate::progress::step(format!("round {} of {}: the kernel, then xpfd", round + 1, o.rounds));
        for (i, name) in ["kernel", "xpfd"].into_iter().enumerate() {
            if i == 0 {
                lab.kernel(true)?;
            } else {
                lab.xpfd_on(&o.bin, o.fastpath, o.io.as_deref(), o.workers)?;
            }
            let r = measure(o.seconds);
            if i == 0 {
                lab.kernel(false)?;
            } else {
                lab.xpfd_off();
            }
            let r = r?;
            step.println(format!("{name:>7} {:>9.2} {:>9.2} {:>11.0} {:>9.3} {:>9.3}", r[0], r[1], r[2], r[3], r[4]));
            rows[i].push(r);
        }
    }
    drop(lab);
    let sum = |s: usize, m: usize| Summary::of(&rows[s].iter().map(|r| r[m]).collect::<Vec<_>>());
    for (m, (name, unit, _)) in MEASURES.iter().enumerate() {
        println!("\n{name}\n{}", header("setup", unit));
        for (s, label) in ["kernel", "xpfd"].iter().enumerate() {
            let x = sum(s, m);
            let d = if x.median >= 1000.0 { 0 } else { 3 };
            println!(
                "{:>10} {:>4} {:>12.d$} {:>12.d$} {:>12.d$} {:>12.d$} {:>10.d$}",
                label, x.n, x.min, x.max, x.median, x.avg, x.stddev
            );
        }
    }
    println!(
        "\n| medians | kernel nft+conntrack{} | xpfd{}{}{} | xpf/kernel |",
        if o.nat { " snat" } else { "" },
        o.io.as_ref().map(|i| format!(" --io {i}")).unwrap_or_default(),
        if o.fastpath { " --fastpath" } else { "" },
        if o.nat { " nat-to" } else { "" }
    );
    println!("|---|---|---|---|");
    let mut bars = Vec::new();
    for (m, (name, unit, lower)) in MEASURES.iter().enumerate() {
        let (k, x) = (sum(0, m), sum(1, m));
        let ratio = x.median / k.median;
        println!(
            "| {name}, {unit} | {} | {} | {ratio:.2}x{} |",
            fmt(k.median),
            fmt(x.median),
            if *lower { " (lower is better)" } else { "" }
        );
        // xpf over the kernel's median: each xpfd run's ratio, median and extremes.
        let rs: Vec<f64> = rows[1].iter().map(|r| r[m] / k.median).collect();
        let s = Summary::of(&rs);
        bars.push((name.to_string(), s.median, s.min, s.max));
    }
    match crate::plot::bars(
        &o.out,
        "real",
        &format!("xpfd / kernel, real clients (commit {commit}; RTT: lower is better)"),
        "xpfd / kernel (median run, bars: min-max)",
        &bars,
    ) {
        Ok(Ok(png)) => println!("\nplot: {png}"),
        Ok(Err(why)) => println!("\nplot: {why}"),
        Err(e) => println!("\nplot: {e}"),
    }
    if o.json {
        let j = serde_json::json!({
            "commit": commit,
            "fastpath": o.fastpath,
            "io": o.io,
            "nat": o.nat,
            "measures": MEASURES.iter().map(|m| m.0).collect::<Vec<_>>(),
            "kernel": rows[0],
            "xpfd": rows[1],
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    Ok(())
}

fn fmt(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
