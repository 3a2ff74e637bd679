//! `xpf-bench lab --shaper N`: N members, each a source address (198.18.0.0 + i) with its
//! own queue under one root on f1, shaped by xpfd (pf.conf `queue`s, `set queue` by source)
//! and by the kernel (nftables sets each member's HTB class from a map, N HTB classes under
//! one: the campus's nftables mark and tc fw classifier, with the classifier's lookup folded
//! into the map, which HTB reads directly), in the same run, alternated. Members' bandwidths are 1 to 4 parts of the root's (pf's shares, HTB's rate;
//! each may borrow up to the root: HTB's ceil). The generator sends every member's flow in
//! turn, far over the root. A last member (10.10.1.2, the generator's own address) sends
//! only pings: its RTT is the idle member's while the others fill their queues.
//!
//! Three phases: the throughput at saturation (a root far above what either firewall
//! forwards, the generator at its full rate: the cost of classifying and queueing every
//! packet); the members' shares (1 to 4 parts, a root at 0.4 of the slower firewall's
//! throughput, the generator paced at twice the root: every member over its share, both
//! firewalls with room to spare, so that what the idle member's ping meets is the shaper and
//! not a receive ring the generator overran); and every member within its rate at scale
//! (equal shares, a root at half xpfd's throughput, enough packets a member over 10 s for 2%
//! to be one packet or less, paced at 1.5 times the root). Each run counts what each member
//! got over a window after the queues filled, with the firewall core's busy time per Gbit/s.

use super::*;

const SRC0: u32 = 0xc612_0000;
/// The generator's frames: 60 bytes on the wire, as both shapers count them.
const FRAME_BITS: f64 = 480.0;
/// The idle member's bandwidth, bit/s.
const IDLE_RATE: u64 = 100_000;
/// The idle member's class (the members' are 3 + i).
const IDLE: u32 = 2;
/// The saturation phase's root: far above what either firewall forwards.
const SATURATION: u64 = 100_000_000_000;

fn ip(a: u32) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}

/// A queue tree: the root's bandwidth, the idle member's (100 kbit/s, six times its pings:
/// what it leaves unused, others borrow), and each member's share of the rest (1 to 4 parts,
/// or equal).
struct Plan {
    root: u64,
    idle: u64,
    members: Vec<u64>,
}

fn plan(n: u32, root: u64, equal: bool) -> Plan {
    let idle = IDLE_RATE.min(root / 100);
    let part = |i: u64| if equal { 1 } else { 1 + i % 4 };
    let parts: u64 = (0..n as u64).map(part).sum();
    let unit = (root - idle) / parts.max(1);
    Plan { root, idle, members: (0..n as u64).map(|i| (unit * part(i)).max(1)).collect() }
}

fn pf_conf(p: &Plan, limit: u64) -> String {
    let (n, root, idle, r) = (p.members.len() as u32, p.root, p.idle, &p.members);
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
fn kernel_on(p: &Plan, dir: &Path) -> Result<(), String> {
    kernel_off();
    let (n, root, idle, r) = (p.members.len() as u32, p.root, p.idle, &p.members);
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

/// Packets still queued in either shaper: the kernel's (HTB's root backlog on f1) and
/// xpfd's (its queues' lengths).
fn queued(o: &LabOpts) -> u64 {
    let tc = ns(NS[1], &["tc", "-s", "qdisc", "show", "dev", "f1", "root"]).unwrap_or_default();
    let htb = tc
        .split("backlog ")
        .nth(1)
        .and_then(|r| r.split_whitespace().nth(1))
        .and_then(|p| p.trim_end_matches('p').parse::<u64>().ok())
        .unwrap_or(0);
    let xpf = xpfctl(&o.bin, &["-s", "queue", "--json"])
        .ok()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
        .and_then(|v| v.as_array().map(|a| a.iter().filter_map(|q| q["qlength"].as_u64()).sum::<u64>()))
        .unwrap_or(0);
    htb + xpf
}

/// Waits until what a run left queued has reached the sink (both shapers empty and nothing
/// more for 300 ms, at most `most`): a shaper's backlog must not count in the next setup's
/// run (the kernel's qdisc drains beside xpfd's transmits, which do not pass through it).
fn drain(o: &LabOpts, s: &Sink, most: Duration) {
    let t = Instant::now();
    let mut last = s.count();
    while t.elapsed() < most {
        std::thread::sleep(Duration::from_millis(300));
        let c = s.count();
        if c == last && queued(o) == 0 {
            return;
        }
        last = c;
    }
    eprintln!("warning: the shapers still held {} packets after {:.0} s", queued(o), most.as_secs_f64());
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

#[derive(serde::Serialize, Default)]
struct Run {
    pps: f64,
    /// The firewall core's busy share over the run, per Gbit/s forwarded.
    cpu_per_gbit: f64,
    /// Each member's bits/s over the run.
    #[serde(skip)]
    members: Vec<f64>,
    rtt_ms: Vec<f64>,
    /// The idle member's pings in the window that had no answer, %.
    ping_lost: f64,
}

/// What the generator offers in the shares phase and the scale phase, times the root.
const SHARES_OFFERED: f64 = 2.0;
const SCALE_OFFERED: f64 = 1.5;

/// How long the generator runs before a window opens: every member's queue has packets.
const SETTLE: Duration = Duration::from_millis(1500);

/// One window of `secs` through xpfd (steering on) or the kernel, after [`SETTLE`]; `ping`:
/// the idle member pings; `pace`: the generator's frames per second (None: full rate);
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
    pace: Option<f64>,
) -> Result<Run, String> {
    xpfctl(&o.bin, &["--steer", if xpf { "on" } else { "off" }])?;
    // Pings, one per 50 ms from before the settling time to the window's end; icmp_seq counts
    // from 1, and the window's first is `first`.
    let count = ((secs + SETTLE.as_secs_f64()) / 0.05) as u32;
    let first = (SETTLE.as_secs_f64() / 0.05) as u32 + 1;
    let pinger = ping
        .then(|| {
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
    g.pace(pace);
    let (tx, rx) = std::sync::mpsc::channel();
    let sent = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(SETTLE);
            // The members' counters, read from the sink's mapped array at one instant each
            // end of the window.
            let (m0, a) = (s.by_source(SRC0, n), Instant::now());
            let (c0, k0, t0) = (cpu_time(FW_CPU), s.count(), Instant::now());
            std::thread::sleep(Duration::from_secs_f64(secs));
            let (c1, k1, el) = (cpu_time(FW_CPU), s.count(), t0.elapsed().as_secs_f64());
            let (m1, span) = (s.by_source(SRC0, n), a.elapsed().as_secs_f64());
            let _ = tx.send((m0, m1, c0, c1, k1 - k0, el, span));
        });
        g.run(SETTLE + Duration::from_secs_f64(secs) + Duration::from_millis(500))
    });
    g.pace(None);
    sent?;
    let (m0, m1, c0, c1, got, el, span) = rx.recv().map_err(|_| "measuring thread".to_string())?;
    let pps = got as f64 / el;
    // Every member's queue full (50 packets, both shapers) at the root's rate, and 2 s more.
    drain(o, s, Duration::from_secs_f64((n as f64 + 1.0) * 50.0 * FRAME_BITS / root.max(1) as f64 * 2.0 + 5.0));
    let members = m0.iter().zip(&m1).map(|(a, b)| (b - a) as f64 * FRAME_BITS / span).collect();
    let busy = (c1.0 - c0.0) as f64 / (c1.1 - c0.1).max(1) as f64;
    let gbit = pps * FRAME_BITS / 1e9;
    let rtt_ms: Vec<f64> = pinger
        .and_then(|p| p.wait_with_output().ok())
        .map(|out| {
            // Only the replies to pings sent in the window.
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let seq: u32 = l.split("icmp_seq=").nth(1)?.split_whitespace().next()?.parse().ok()?;
                    let t: f64 = l.split("time=").nth(1)?.split_whitespace().next()?.parse().ok()?;
                    (seq >= first).then_some(t)
                })
                .collect()
        })
        .unwrap_or_default();
    let window = count.saturating_sub(first) + 1;
    let ping_lost = if ping { 100.0 * window.saturating_sub(rtt_ms.len() as u32) as f64 / window as f64 } else { 0.0 };
    Ok(Run { pps, cpu_per_gbit: if gbit > 0.0 { busy / gbit } else { f64::NAN }, members, rtt_ms, ping_lost })
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
    /// The members more than 2% under their rate, and more than 2% over it, % of all.
    under_2: f64,
    over_2: f64,
    /// The members within 2% or one packet of their rate, % of all: a member sending 20
    /// packets in the window has 5% a packet, and its count, a whole number, is more than 2%
    /// off the rate's (a fraction) however exact the shaper.
    within_packet: f64,
    /// Packets the median member sent over the run (one packet is 100/this % of its rate).
    packets: f64,
    rtt_p50_ms: f64,
    rtt_p99_ms: f64,
    ping_lost: f64,
    cpu_per_gbit: f64,
    /// The members' rates together, % of what their shares add up to.
    total: f64,
}

fn accuracy(run: &Run, want: &[u64], secs: f64) -> Accuracy {
    let total = 100.0 * run.members.iter().sum::<f64>() / want.iter().sum::<u64>().max(1) as f64;
    let signed: Vec<f64> = run.members.iter().zip(want).map(|(&g, &w)| 100.0 * (g - w as f64) / w as f64).collect();
    let share =
        |f: &dyn Fn(f64) -> bool| 100.0 * signed.iter().filter(|&&e| f(e)).count() as f64 / signed.len().max(1) as f64;
    let (under_2, over_2) = (share(&|e| e < -2.0), share(&|e| e > 2.0));
    // One packet in the window, % of each member's rate.
    let packet = FRAME_BITS / secs * 100.0;
    let within_packet = 100.0
        * signed.iter().zip(want).filter(|&(e, &w)| e.abs() <= 2f64.max(packet / w as f64)).count() as f64
        / want.len().max(1) as f64;
    let mut err: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
    let within = err.iter().filter(|&&e| e <= 2.0).count() as f64 / err.len().max(1) as f64;
    let mut pk: Vec<f64> = run.members.iter().map(|b| b * secs / FRAME_BITS).collect();
    let mut rtt = run.rtt_ms.clone();
    Accuracy {
        median: pct(&mut err, 0.5),
        p99: pct(&mut err, 0.99),
        worst: pct(&mut err, 1.0),
        within_2: 100.0 * within,
        under_2,
        over_2,
        within_packet,
        packets: pct(&mut pk, 0.5),
        rtt_p50_ms: pct(&mut rtt, 0.5),
        rtt_p99_ms: pct(&mut rtt, 0.99),
        ping_lost: run.ping_lost,
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
    println!("the shaper lab: {n} members (one source each, 60-byte UDP frames, every member over its rate) in");
    println!("queues under one root on f1, plus an idle member that pings; xpfd (pf.conf queues, set queue by");
    println!("source) against the kernel (nftables map to the HTB class, {n} HTB classes), alternated\n");
    let load = |p: &Plan| -> Result<(f64, f64), String> {
        let pf = dir.join("shaper.pf.conf");
        std::fs::write(&pf, pf_conf(p, limit)).map_err(|e| e.to_string())?;
        let t = Instant::now();
        xpfctl(&o.bin, &["-f", &pf.to_string_lossy()])?;
        let xpf_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        kernel_on(p, &dir)?;
        Ok((xpf_s, t.elapsed().as_secs_f64()))
    };
    // Saturation: a root of 100 Gbit/s binds nobody.
    let step = crate::progress::step(format!("saturation: {} runs of each", o.runs));
    let (xl, kl) = load(&plan(n, SATURATION, false))?;
    let (mut a, mut b, mut ca, mut cb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.runs {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let x = shaped_run(o, g, s, n, SATURATION, true, false, o.seconds, None)?;
        let k = shaped_run(o, g, s, n, SATURATION, false, false, o.seconds, None)?;
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
    // The members' shares: a root at 0.4 of the slower firewall's throughput, offered twice
    // the root (every member over its share: the largest share is 1.6 times the mean).
    let slower = sa.median.min(sb.median);
    let shares = plan(n, (slower * 0.4 * FRAME_BITS) as u64, false);
    let secs = o.seconds.max(10.0);
    let xa_ka = phase(o, g, s, n, &shares, secs, SHARES_OFFERED, &load)?;
    // Every member within its rate at scale: equal shares, a root at half xpfd's throughput
    // (the kernel's HTB gets the same root, whether or not it can carry it), 10 s windows.
    let scale = plan(n, (sa.median * 0.5 * FRAME_BITS) as u64, true);
    let xb_kb = phase(o, g, s, n, &scale, 10.0, SCALE_OFFERED, &load)?;
    for (title, p, v, w, offered) in [
        ("members' shares (1 to 4 parts)", &shares, &xa_ka, secs, SHARES_OFFERED),
        ("every member at the same rate, 10-s windows", &scale, &xb_kb, 10.0, SCALE_OFFERED),
    ] {
        println!(
            "{title}: root {:.1} Mbit/s ({:.0} packets/s), offered {:.1}x it; error against each one's rate over {w} s, %",
            p.root as f64 / 1e6,
            p.root as f64 / FRAME_BITS,
            offered,
        );
        println!(
            "{:>10} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8}",
            "setup",
            "median",
            "p99",
            "worst",
            "within 2%",
            "under",
            "over",
            "2%|1 pkt",
            "packets",
            "rtt p50",
            "rtt p99",
            "ping lost",
            "cpu/Gbit",
            "total"
        );
        for (name, runs) in [("xpf", &v.0), ("kernel-htb", &v.1)] {
            for r in runs.iter() {
                println!(
                    "{name:>10} {:>8.2} {:>8.2} {:>8.2} {:>9.1}% {:>7.1}% {:>7.1}% {:>9.1}% {:>10.0} {:>8.3}ms {:>8.3}ms {:>8.1}% {:>10.2} {:>7.1}%",
                    r.median,
                    r.p99,
                    r.worst,
                    r.within_2,
                    r.under_2,
                    r.over_2,
                    r.within_packet,
                    r.packets,
                    r.rtt_p50_ms,
                    r.rtt_p99_ms,
                    r.ping_lost,
                    r.cpu_per_gbit,
                    r.total
                );
            }
        }
        println!();
    }
    if o.json {
        let j = serde_json::json!({"members": n, "saturated": {"xpf": sa, "kernel": sb},
            "shares": {"root": shares.root, "xpf": xa_ka.0, "kernel": xa_ka.1},
            "scale": {"root": scale.root, "xpf": xb_kb.0, "kernel": xb_kb.1}});
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    kernel_off();
    xpfctl(&o.bin, &["-f", &restore.to_string_lossy()])?;
    xpfctl(&o.bin, &["--steer", "on"])?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Runs of tree `p` through both firewalls, alternated, each a window of `secs` with the
/// generator paced at `offered` times the root and the idle member pinging.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn phase(
    o: &LabOpts,
    g: &Gen,
    s: &Sink,
    n: u32,
    p: &Plan,
    secs: f64,
    offered: f64,
    load: &dyn Fn(&Plan) -> Result<(f64, f64), String>,
) -> Result<(Vec<Accuracy>, Vec<Accuracy>), String> {
    let pace = p.root as f64 / FRAME_BITS * offered;
    let _step = crate::progress::step(format!(
        "root {:.1} Mbit/s, offered {pace:.0} packets/s: {} runs of {secs} s",
        p.root as f64 / 1e6,
        o.runs
    ));
    load(p)?;
    let (mut x, mut k) = (Vec::new(), Vec::new());
    for _ in 0..o.runs {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        x.push(accuracy(&shaped_run(o, g, s, n, p.root, true, true, secs, Some(pace))?, &p.members, secs));
        k.push(accuracy(&shaped_run(o, g, s, n, p.root, false, true, secs, Some(pace))?, &p.members, secs));
    }
    Ok((x, k))
}
