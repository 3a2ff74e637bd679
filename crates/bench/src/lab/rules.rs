//! `xpf-bench lab --rules N,N`: new connections per second through a campus ruleset of N
//! rules (`rulegen::campus`), xpfd's pf.conf against the kernel with the same policy as
//! nftables in both forms (an expert's sets and concatenations; rule by rule), in the same
//! run. Every packet is a SYN from a new source (the generator's SYN flood) to a member's
//! service that the policy passes, so every packet is a first packet: rules looked up, a state
//! (a conntrack entry) made. Outside is f0 (the campus's em0), the campus f1 (its em1).

use super::*;
use xpf_bench::rulegen;

/// Where the SYNs come from: 2^17 sources from 198.18.0.0 (none a bogon of the campus).
const SRC0: u32 = 0xc612_0000;
const SRCS: u32 = 1 << 17;

/// The campus names its outside em0 and its inside em1; the lab's are f0 and f1.
fn lab_ifs(text: &str) -> String {
    text.replace("em0", "f0").replace("em1", "f1")
}

/// A member's service the policy passes from every source the SYNs come from (the model's
/// first match on a sample of them): (address, port). A member halfway through the ruleset:
/// the rule-by-rule form's cost depends on where its rule stands (xpf's does not).
fn target(pol: &rulegen::Policy) -> Result<(u32, u16), String> {
    let passes = |dst: u32, port: u16| {
        (0..32u32).all(|k| {
            pol.first_match(&rulegen::Probe {
                inbound: true,
                proto: 6,
                src: SRC0 + k * (SRCS / 32) + k,
                dst,
                dport: port,
            })
        })
    };
    let services: Vec<(u32, u16)> = pol
        .rules
        .iter()
        .filter(|r| r.pass && r.quick && r.inbound && r.proto == 6 && r.anchor.is_some())
        .filter_map(|r| match (r.dst, r.dport) {
            (rulegen::A::Net(a, 32), Some(p)) => Some((a, p)),
            _ => None,
        })
        .collect();
    services[services.len() / 2..]
        .iter()
        .take(64)
        .copied()
        .find(|&(a, p)| passes(a, p))
        .ok_or_else(|| "no member service the campus passes from the generator's sources".to_string())
}

#[derive(serde::Serialize)]
struct RulesPoint {
    rules: usize,
    xpf: Summary,
    kernel_expert: Summary,
    kernel_naive: Option<Summary>,
    xpf_load_s: f64,
    expert_load_s: f64,
    naive_load_s: Option<f64>,
    /// Over xpfd's runs: SYNs its new-connection queue received, and dropped (ring full).
    syn_received: u64,
    syn_dropped: u64,
    /// Its pf.conf and the member service its SYNs go to, for the turns after the points.
    #[serde(skip)]
    pf: std::path::PathBuf,
    #[serde(skip)]
    target: (u32, u16),
}

/// xpfd's new-connection queue so far: (received, dropped because its ring was full).
fn syn_queue(o: &LabOpts) -> Result<(u64, u64), String> {
    let v: serde_json::Value = info_json(&o.bin)?;
    let q = &v["syn_queue"];
    Ok((q["received"].as_u64().unwrap_or(0), q["dropped"].as_u64().unwrap_or(0)))
}

/// One run: both tables emptied, then SYNs for `secs` (after the settling), counted at the sink.
fn syn_run(o: &LabOpts, g: &Gen, s: &Sink, xpf: bool) -> Result<f64, String> {
    xpfctl(&o.bin, &["-F", "states"])?;
    let _ = ns(NS[1], &["conntrack", "-F"]);
    xpfctl(&o.bin, &["--steer", if xpf { "on" } else { "off" }])?;
    let r = measure(g, s, o.seconds.min(2.0));
    xpfctl(&o.bin, &["--steer", "off"])?;
    r
}

/// xpfd's smallest and largest rulesets measured in turns, a reload before each run, so that
/// their ratio compares runs seconds apart (this VM's speed moves between points minutes
/// apart by more than the ratio's target allows).
#[derive(serde::Serialize)]
struct Alternated {
    small_rules: usize,
    large_rules: usize,
    small: Summary,
    large: Summary,
    /// Each pair's large / small.
    pair_ratios: Vec<f64>,
    /// The medians' ratio.
    ratio: f64,
}

fn alternate(o: &LabOpts, g: &Gen, s: &Sink, small: &RulesPoint, large: &RulesPoint) -> Result<Alternated, String> {
    let step = crate::progress::step(format!(
        "xpfd alone: campus {} and {} rules in turns, a reload before each, {} pairs",
        small.rules, large.rules, o.runs
    ));
    let one = |p: &RulesPoint| -> Result<f64, String> {
        xpfctl(&o.bin, &["-f", &p.pf.to_string_lossy()])?;
        let (dst, port) = p.target;
        gen_config(&g.prog, [SRC0, dst, SRCS, 1, 1, 1024], g.dmac, g.smac, 6, port as u32);
        syn_run(o, g, s, true)
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for k in 0..o.runs {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        // Which goes first changes each pair (ABBA), so a drift weighs on both alike.
        if k % 2 == 0 {
            a.push(one(small)?);
            b.push(one(large)?);
        } else {
            b.push(one(large)?);
            a.push(one(small)?);
        }
    }
    drop(step);
    if a.is_empty() || a.len() != b.len() {
        return Err("the alternated runs were interrupted".to_string());
    }
    let (sa, sb) = (Summary::of(&a), Summary::of(&b));
    let pair_ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| if *x > 0.0 { y / x } else { 0.0 }).collect();
    let ratio = if sa.median > 0.0 { sb.median / sa.median } else { 0.0 };
    println!("xpfd alone, campus {} and {} rules in turns (a reload before each run):", small.rules, large.rules);
    println!("{}", stats::header("rules", "new connections/s forwarded"));
    println!("{}", stats::row(&small.rules.to_string(), &sa));
    println!("{}", stats::row(&large.rules.to_string(), &sb));
    let pairs: Vec<String> = pair_ratios.iter().map(|r| format!("{:.0}%", 100.0 * r)).collect();
    println!(
        "  xpf at {} rules: {:.0}% of its figure at {} rules in the same runs (each pair: {})\n",
        large.rules,
        100.0 * ratio,
        small.rules,
        pairs.join(" / ")
    );
    Ok(Alternated { small_rules: small.rules, large_rules: large.rules, small: sa, large: sb, pair_ratios, ratio })
}

fn nft_load(file: &Path) -> Result<f64, String> {
    let t = Instant::now();
    ns(NS[1], &["nft", "-f", &file.to_string_lossy()])?;
    Ok(t.elapsed().as_secs_f64())
}

/// The points; `limit`: xpfd's state limit. The lab's own nftables table is set aside
/// meanwhile and restored, as is xpfd's ruleset `restore`.
pub(super) fn run(o: &LabOpts, g: &Gen, s: &Sink, limit: u64, restore: &Path) -> Result<(), String> {
    nft(false, false)?;
    ns(NS[1], &["ip", "route", "replace", "44.0.0.0/11", "via", "10.10.2.2"])?;
    let dir = std::env::temp_dir().join("xpf-lab-rules");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    println!("new connections per second through a campus ruleset: every packet a SYN from a new source to a");
    println!("member's service the policy passes; xpfd (pf.conf) against the kernel (nftables + conntrack), the");
    println!("expert form alternated with xpfd in each run, the rule-by-rule form after them\n");
    let mut points = Vec::new();
    for &n in &o.rules {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let step = crate::progress::step(format!("campus {n} rules: generate, load, {} runs", o.runs));
        let pol = rulegen::campus(n, 1);
        let (dst, port) = target(&pol)?;
        let pf = dir.join(format!("campus-{n}.pf.conf"));
        // The lab's state limit, as the kernel's conntrack has it (the campus file's own, 1M,
        // filled within a run at the kernel's rate, and xpfd then refused new states as
        // state-limit while conntrack took them).
        let campus: String = lab_ifs(&pol.pf)
            .lines()
            .filter(|l| !l.starts_with("set limit states"))
            .map(|l| l.to_string() + "\n")
            .collect();
        let text = format!("set limit states {limit}\n{campus}");
        std::fs::write(&pf, &text).map_err(|e| e.to_string())?;
        let (expert, naive) = (dir.join("campus.expert.nft"), dir.join("campus.naive.nft"));
        std::fs::write(&expert, lab_ifs(&pol.nft_expert)).map_err(|e| e.to_string())?;
        std::fs::write(&naive, lab_ifs(&pol.nft_naive)).map_err(|e| e.to_string())?;
        let rules = pol.compiled;
        drop(pol);
        let t = Instant::now();
        xpfctl(&o.bin, &["-f", &pf.to_string_lossy()])?;
        let xpf_load_s = t.elapsed().as_secs_f64();
        let expert_load_s = nft_load(&expert)?;
        gen_config(&g.prog, [SRC0, dst, SRCS, 1, 1, 1024], g.dmac, g.smac, 6, port as u32);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let syn0 = syn_queue(o)?;
        for _ in 0..o.runs {
            if STOP.load(Ordering::Relaxed) {
                break;
            }
            a.push(syn_run(o, g, s, true)?);
            b.push(syn_run(o, g, s, false)?);
        }
        // What reached xpfd's queue for new connections, and what the kernel dropped there
        // because the worker had not yet read it: a saturated worker drops.
        let syn1 = syn_queue(o)?;
        let (syn_received, syn_dropped) = (syn1.0 - syn0.0, syn1.1 - syn0.1);
        ns(NS[1], &["nft", "delete", "table", "inet", "xpfcampus"])?;
        // Rule by rule, the kernel walks its chain for every new connection: measured once
        // the expert form is gone (loading it can take long; a point is skipped when it fails).
        let (mut c, mut naive_load_s) = (Vec::new(), None);
        if !STOP.load(Ordering::Relaxed) {
            match nft_load(&naive) {
                Ok(secs) => {
                    naive_load_s = Some(secs);
                    for _ in 0..o.runs.min(3) {
                        c.push(syn_run(o, g, s, false)?);
                    }
                    ns(NS[1], &["nft", "delete", "table", "inet", "xpfcampus"])?;
                }
                Err(e) => println!("  the rule-by-rule nftables form did not load: {e}"),
            }
        }
        drop(step);
        if a.is_empty() || b.is_empty() {
            break;
        }
        let p = RulesPoint {
            rules,
            xpf: Summary::of(&a),
            kernel_expert: Summary::of(&b),
            kernel_naive: (!c.is_empty()).then(|| Summary::of(&c)),
            xpf_load_s,
            expert_load_s,
            naive_load_s,
            syn_received,
            syn_dropped,
            pf,
            target: (dst, port),
        };
        for (name, s) in [("xpfd", &p.xpf), ("the kernel (expert)", &p.kernel_expert)] {
            if s.median <= 0.0 {
                return Err(format!("campus {n}: {name} forwarded nothing to the sink: the lab is broken"));
            }
        }
        println!(
            "campus {} rules (target {}:{port}; loads: xpfctl -f {:.1} s, nft -f expert {:.1} s{}):",
            p.rules,
            rulegen::ip(dst),
            p.xpf_load_s,
            p.expert_load_s,
            p.naive_load_s.map_or(String::new(), |x| format!(", rule by rule {x:.1} s"))
        );
        println!("{}", stats::header("setup", "new connections/s forwarded"));
        println!("{}", stats::row("xpf", &p.xpf));
        println!("{}", stats::row("kernel-expert", &p.kernel_expert));
        if let Some(c) = &p.kernel_naive {
            println!("{}", stats::row("kernel-naive", c));
        }
        println!(
            "  xpf/kernel (expert) {:.2}x; xpfd's new-connection queue received {} SYNs, dropped {} (ring full)\n",
            p.xpf.median / p.kernel_expert.median,
            p.syn_received,
            p.syn_dropped
        );
        points.push(p);
    }
    if let (Some(first), Some(last)) = (points.first(), points.last()) {
        if points.len() > 1 {
            println!(
                "xpf at {} rules: {:.0}% of its figure at {} rules (the points measured minutes apart)",
                last.rules,
                100.0 * last.xpf.median / first.xpf.median,
                first.rules
            );
        }
    }
    // A failure here costs the ratio, not the points measured, nor the restore below.
    let alternated = match (points.first(), points.last()) {
        (Some(a), Some(b)) if points.len() > 1 && !STOP.load(Ordering::Relaxed) => {
            alternate(o, g, s, a, b).map_err(|e| println!("  the rulesets in turns: {e}")).ok()
        }
        _ => None,
    };
    if o.json {
        let v = serde_json::json!({"rules": points, "alternated": alternated});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    xpfctl(&o.bin, &["-f", &restore.to_string_lossy()])?;
    nft(true, false)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
