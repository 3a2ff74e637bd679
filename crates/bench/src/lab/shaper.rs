//! `xpf-bench lab --shaper N`: N members, each a source address (198.18.0.0 + i) with its
//! own queue under one root on f1, shaped by xpfd (pf.conf `queue`s, `set queue` by source)
//! and by the kernel (nftables sets each member's HTB class from a map, N HTB classes under
//! one: the campus's nftables mark and tc fw classifier, with the classifier's lookup folded
//! into the map, which HTB reads directly), in the same run, alternated. Members' bandwidths are 1 to 4 parts of the root's (pf's shares, HTB's rate;
//! each may borrow up to the root: HTB's ceil). The generator sends every member's flow in
//! turn, far over the root. A last member (10.10.1.2, the generator's own address) sends
//! only pings: its RTT is the idle member's while the others fill their queues.
//!
//! Two phases: the throughput at saturation (a root far above what either firewall forwards:
//! the cost of classifying and queueing every packet), then the members' rates (a root at
//! half the slower firewall's throughput, every member over its rate: each one's rate over
//! the run against its share), with the firewall core's busy time per Gbit/s.

use super::*;

const SRC0: u32 = 0xc612_0000;
/// The generator's frames: 60 bytes on the wire, as both shapers count them.
const FRAME_BITS: f64 = 480.0;
/// The idle member's class (the members' are 3 + i).
const IDLE: u32 = 2;
/// The saturation phase's root: far above what either firewall forwards.
const SATURATION: u64 = 100_000_000_000;

fn ip(a: u32) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}

/// The root's bandwidth, the idle member's (1%), and each member's: 1 to 4 parts of the rest.
fn rates(n: u32, root: u64) -> (u64, Vec<u64>) {
    let idle = (root / 100).max(1000);
    let parts: u64 = (0..n as u64).map(|i| 1 + i % 4).sum();
    let unit = (root - idle) / parts.max(1);
    (idle, (0..n as u64).map(|i| (unit * (1 + i % 4)).max(1)).collect())
}

fn pf_conf(n: u32, root: u64, limit: u64) -> String {
    let (idle, r) = rates(n, root);
    let mut s = format!(
        "set limit states {limit}\nset timeout {{ udp.first 600, udp.single 600, udp.multiple 600 }}\n\
         queue root on f1 bandwidth {root}\nqueue idle parent root bandwidth {idle} default\n"
    );
    for (i, b) in r.iter().enumerate() {
        s += &format!("queue m{i} parent root bandwidth {b}\n");
    }
    s += "pass all\npass in on f0 from 10.10.1.2 set queue idle\n";
    for i in 0..n {
        s += &format!("pass in on f0 from {} set queue m{i}\n", ip(SRC0 + i));
    }
    s
}

/// The kernel's shaper: nftables sets each member's HTB class from a map in the forward hook
/// (`meta priority`, which HTB takes as the class with no classifier at all: less work than
/// the campus's mark and fw classifier, which this kernel does not have), HTB.
fn kernel_on(n: u32, root: u64, dir: &Path) -> Result<(), String> {
    kernel_off();
    let (idle, r) = rates(n, root);
    let mut nft = format!(
        "table ip xpfshape {{\n map member {{\n  type ipv4_addr : classid\n  elements = {{ 10.10.1.2 : 1:{IDLE:x}"
    );
    for i in 0..n {
        nft += &format!(", {} : 1:{:x}", ip(SRC0 + i), 3 + i);
    }
    nft += " }\n }\n chain classes {\n  type filter hook forward priority -1; policy accept;\n  meta priority set ip saddr map @member\n }\n}\n";
    let f = dir.join("shaper.nft");
    std::fs::write(&f, nft).map_err(|e| e.to_string())?;
    ns(NS[1], &["nft", "-f", &f.to_string_lossy()])?;
    let mut tc = format!(
        "qdisc add dev f1 root handle 1: htb default {IDLE:x}\nclass add dev f1 parent 1: classid 1:1 htb rate {root}bit ceil {root}bit\n\
         class add dev f1 parent 1:1 classid 1:{IDLE:x} htb rate {idle}bit ceil {root}bit quantum 1514\n"
    );
    for (i, b) in r.iter().enumerate() {
        tc +=
            &format!("class add dev f1 parent 1:1 classid 1:{:x} htb rate {b}bit ceil {root}bit quantum 1514\n", 3 + i);
    }
    let f = dir.join("shaper.tc");
    std::fs::write(&f, tc).map_err(|e| e.to_string())?;
    // HTB's leaves queue up to the interface's txqueuelen: pf's qlimit (50), like for like.
    ns(NS[1], &["ip", "link", "set", "f1", "txqueuelen", "50"])?;
    ns(NS[1], &["tc", "-batch", &f.to_string_lossy()]).map(|_| ())
}

fn kernel_off() {
    let _ = ns(NS[1], &["nft", "delete", "table", "ip", "xpfshape"]);
    let _ = ns(NS[1], &["tc", "qdisc", "del", "dev", "f1", "root"]);
    let _ = ns(NS[1], &["ip", "link", "set", "f1", "txqueuelen", "1000"]);
}

/// Waits until what a run left queued has reached the sink (nothing more for 300 ms, at
/// most `most`): a shaper's backlog must not count in the next setup's run.
fn drain(s: &Sink, most: Duration) {
    let t = Instant::now();
    let mut last = s.count();
    while t.elapsed() < most {
        std::thread::sleep(Duration::from_millis(300));
        let c = s.count();
        if c == last {
            return;
        }
        last = c;
    }
}

/// CPU `c`'s (busy, total) jiffies from /proc/stat.
fn cpu_time(c: usize) -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = format!("cpu{c} ");
    let Some(line) = stat.lines().find(|l| l.starts_with(&name)) else { return (0, 0) };
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn per_member(s: &Sink, n: u32) -> Vec<u64> {
    let m = s.prog.map("sink_src");
    (0..n)
        .map(|i| {
            let mut v = [0u8; 8];
            let key = (SRC0 + i) & 0xffff;
            m.lookup(&key.to_ne_bytes(), &mut v).map_or(0, |_| u64::from_ne_bytes(v))
        })
        .collect()
}

#[derive(serde::Serialize, Default)]
struct Run {
    pps: f64,
    /// The firewall core's busy share over the run, per Gbit/s forwarded.
    cpu_per_gbit: f64,
    /// Each member's bits/s over the run.
    #[serde(skip)]
    members: Vec<f64>,
    rtt_ms: Vec<f64>,
}

/// One run of `secs` through xpfd (steering on) or the kernel; `ping`: the idle member pings.
/// `root`: the root's bandwidth (how long a backlog takes to reach the sink).
#[allow(clippy::too_many_arguments)]
fn shaped_run(
    o: &LabOpts,
    g: &Gen,
    s: &Sink,
    n: u32,
    root: u64,
    xpf: bool,
    ping: bool,
    secs: f64,
) -> Result<Run, String> {
    xpfctl(&o.bin, &["--steer", if xpf { "on" } else { "off" }])?;
    let pinger = ping
        .then(|| {
            let count = ((secs + 0.7) / 0.05) as u32;
            Command::new("ip")
                // Real-time priority: on two cores both busy (the generator, the firewall) a
                // ping process waits for the scheduler, and its RTTs are its own waits.
                .args([
                    "netns",
                    "exec",
                    NS[0],
                    "chrt",
                    "-f",
                    "10",
                    "ping",
                    "-n",
                    "-c",
                    &count.to_string(),
                    "-i",
                    "0.05",
                ])
                .args(["-W", "1", "10.10.2.2"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .ok()
        })
        .flatten();
    let m0 = per_member(s, n);
    let (c0, t0) = (cpu_time(FW_CPU), Instant::now());
    let pps = measure(g, s, secs)?;
    let (c1, el) = (cpu_time(FW_CPU), t0.elapsed().as_secs_f64());
    let m1 = per_member(s, n);
    // Every member's queue full (50 packets, both shapers) at the root's rate, and 2 s more.
    drain(s, Duration::from_secs_f64((n as f64 + 1.0) * 50.0 * FRAME_BITS / root.max(1) as f64 * 1.2 + 2.0));
    let members = m0.iter().zip(&m1).map(|(a, b)| (b - a) as f64 * FRAME_BITS / el).collect();
    let busy = (c1.0 - c0.0) as f64 / (c1.1 - c0.1).max(1) as f64;
    let gbit = pps * FRAME_BITS / 1e9;
    let rtt_ms: Vec<f64> = pinger
        .and_then(|p| p.wait_with_output().ok())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split("time=")
                .skip(1)
                .filter_map(|x| x.split_whitespace().next()?.parse::<f64>().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(Run { pps, cpu_per_gbit: if gbit > 0.0 { busy / gbit } else { f64::NAN }, members, rtt_ms })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

#[derive(serde::Serialize)]
struct Accuracy {
    /// Members' errors against their shares, % (median, p99, worst), and the share within 2%.
    median: f64,
    p99: f64,
    worst: f64,
    within_2: f64,
    /// Packets the median member sent over the run (one packet is 100/this % of its rate).
    packets: f64,
    rtt_p50_ms: f64,
    rtt_p99_ms: f64,
    cpu_per_gbit: f64,
    /// The members' rates together, % of what their shares add up to.
    total: f64,
}

fn accuracy(run: &Run, want: &[u64], secs: f64) -> Accuracy {
    let total = 100.0 * run.members.iter().sum::<f64>() / want.iter().sum::<u64>().max(1) as f64;
    let mut err: Vec<f64> =
        run.members.iter().zip(want).map(|(&g, &w)| 100.0 * (g - w as f64).abs() / w as f64).collect();
    let within = err.iter().filter(|&&e| e <= 2.0).count() as f64 / err.len().max(1) as f64;
    let mut pk: Vec<f64> = run.members.iter().map(|b| b * secs / FRAME_BITS).collect();
    let mut rtt = run.rtt_ms.clone();
    Accuracy {
        median: pct(&mut err, 0.5),
        p99: pct(&mut err, 0.99),
        worst: pct(&mut err, 1.0),
        within_2: 100.0 * within,
        packets: pct(&mut pk, 0.5),
        rtt_p50_ms: pct(&mut rtt, 0.5),
        rtt_p99_ms: pct(&mut rtt, 0.99),
        cpu_per_gbit: run.cpu_per_gbit,
        total,
    }
}

pub(super) fn run(o: &LabOpts, g: &Gen, s: &Sink, limit: u64, restore: &Path) -> Result<(), String> {
    let n = o.shaper;
    let dir = std::env::temp_dir().join("xpf-lab-shaper");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // The idle member's pings: to the sink's kernel and back (its XDP program passes ICMP);
    // the sink answers through a fixed neighbour (it drops ARP).
    let (f0, f1) = (mac(NS[1], "f0")?, mac(NS[1], "f1")?);
    ns(NS[0], &["ip", "route", "replace", "10.10.2.0/24", "via", "10.10.1.1"])?;
    ns(NS[0], &["ip", "neigh", "replace", "10.10.1.1", "lladdr", &fmt_mac(&f0), "dev", "g0", "nud", "permanent"])?;
    ns(NS[2], &["ip", "route", "replace", "10.10.1.0/24", "via", "10.10.2.1"])?;
    ns(NS[2], &["ip", "neigh", "replace", "10.10.2.1", "lladdr", &fmt_mac(&f1), "dev", "s0", "nud", "permanent"])?;
    g.flows(n, 1, 1);
    println!("the shaper lab: {n} members (one source each, 60-byte UDP frames, every member far over its rate) in");
    println!("queues of 1 to 4 parts of one root on f1, plus an idle member that pings; xpfd (pf.conf queues, set");
    println!("queue by source) against the kernel (nftables map to the HTB class, {n} HTB classes), alternated\n");
    let load = |root: u64| -> Result<(f64, f64), String> {
        let pf = dir.join("shaper.pf.conf");
        std::fs::write(&pf, pf_conf(n, root, limit)).map_err(|e| e.to_string())?;
        let t = Instant::now();
        xpfctl(&o.bin, &["-f", &pf.to_string_lossy()])?;
        let xpf_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        kernel_on(n, root, &dir)?;
        Ok((xpf_s, t.elapsed().as_secs_f64()))
    };
    // Saturation: a root of 100 Gbit/s binds nobody.
    let step = crate::progress::step(format!("saturation: {} runs of each", o.runs));
    let (xl, kl) = load(SATURATION)?;
    let (mut a, mut b, mut ca, mut cb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.runs {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let x = shaped_run(o, g, s, n, SATURATION, true, false, o.seconds)?;
        let k = shaped_run(o, g, s, n, SATURATION, false, false, o.seconds)?;
        a.push(x.pps);
        ca.push(x.cpu_per_gbit);
        b.push(k.pps);
        cb.push(k.cpu_per_gbit);
    }
    drop(step);
    if a.is_empty() || b.is_empty() {
        return Err("stopped".into());
    }
    let (sa, sb) = (Summary::of(&a), Summary::of(&b));
    println!("loads with {n} queues: xpfctl -f {xl:.1} s; nft -f + tc -batch {kl:.1} s");
    println!("{}", stats::header("setup", "packets/s forwarded, saturated"));
    println!("{}", stats::row("xpf", &sa));
    println!("{}", stats::row("kernel-htb", &sb));
    let cpu = |v: &mut Vec<f64>| pct(v, 0.5);
    println!(
        "  xpf/kernel {:.2}x; the firewall core's busy share per Gbit/s: xpf {:.2}, kernel {:.2}\n",
        sa.median / sb.median,
        cpu(&mut ca),
        cpu(&mut cb)
    );
    // The members' rates: a root at half the slower firewall's throughput.
    let root = (sa.median.min(sb.median) * 0.5 * FRAME_BITS) as u64;
    let secs = o.seconds.max(10.0);
    let step =
        crate::progress::step(format!("rates: root {:.1} Mbit/s, {} runs of {secs} s", root as f64 / 1e6, o.runs));
    load(root)?;
    let want = rates(n, root).1;
    let (mut xa, mut ka) = (Vec::new(), Vec::new());
    for _ in 0..o.runs {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        xa.push(accuracy(&shaped_run(o, g, s, n, root, true, true, secs)?, &want, secs));
        ka.push(accuracy(&shaped_run(o, g, s, n, root, false, true, secs)?, &want, secs));
    }
    drop(step);
    println!(
        "members' rates, root {:.1} Mbit/s ({} members over it): error against each one's share, %",
        root as f64 / 1e6,
        n
    );
    println!(
        "{:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "setup", "median", "p99", "worst", "within 2%", "packets", "rtt p50", "rtt p99", "cpu/Gbit", "total"
    );
    for (name, v) in [("xpf", &xa), ("kernel-htb", &ka)] {
        for r in v.iter() {
            println!(
                "{name:>10} {:>8.2} {:>8.2} {:>8.2} {:>9.1}% {:>10.0} {:>8.3}ms {:>8.3}ms {:>10.2} {:>7.1}%",
                r.median, r.p99, r.worst, r.within_2, r.packets, r.rtt_p50_ms, r.rtt_p99_ms, r.cpu_per_gbit, r.total
            );
        }
    }
    if o.json {
        let j = serde_json::json!({"members": n, "saturated": {"xpf": sa, "kernel": sb}, "rates": {"root": root,
            "xpf": xa, "kernel": ka}});
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    kernel_off();
    xpfctl(&o.bin, &["-f", &restore.to_string_lossy()])?;
    xpfctl(&o.bin, &["--steer", "on"])?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
