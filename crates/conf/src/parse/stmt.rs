//! The other statements: `set`, `table`, `queue` (and the queue tree checks), `include`.

use super::*;

pub(super) fn set_option(p: &mut P, out: &mut Parsed) -> R<()> {
    let num = |p: &mut P| -> R<u32> {
        let s = p.string()?;
        let v = if let Some(h) = s.strip_prefix("0x") { u32::from_str_radix(h, 16) } else { s.parse() };
        v.map_err(|_| "syntax error".to_string())
    };
    match p.string()?.as_str() {
        "block-policy" => {
            let v = p.string()?;
            out.block_return = match v.as_str() {
                "drop" => false,
                "return" => true,
                _ => return Err("syntax error".into()),
            };
            out.header.push(format!("set block-policy {v}"));
        }
        "optimization" => {
            let v = p.string()?;
            if !["default", "normal", "high-latency", "satellite", "aggressive", "conservative"].contains(&v.as_str()) {
                return Err(format!("unknown optimization {v}"));
            }
            out.header.push(format!("set optimization {v}"));
        }
        "timeout" => {
            let items = p.list(|p| {
                let name = p.string()?;
                let t = xpf_state::Timeout::from_name(&name).ok_or_else(|| format!("unknown timeout {name}"))?;
                Ok((t, num(p)?))
            })?;
            for (t, v) in items {
                out.header.push(format!("set timeout {} {v}", t.name()));
                out.timeouts.push((t, v));
            }
        }
        "limit" => {
            let items = p.list(|p| {
                let name = p.string()?;
                if !["states", "frags", "src-nodes", "tables", "table-entries", "pktdelay-pkts", "anchors"]
                    .contains(&name.as_str())
                {
                    return Err(format!("unknown limit {name}"));
                }
                Ok((name, num(p)?))
            })?;
            for (n, v) in items {
                out.header.push(format!("set limit {n} {v}"));
                out.limits.push((n, v));
            }
        }
        "loginterface" => {
            let v = p.string()?;
            out.header.push(format!("set loginterface {v}"));
            out.loginterface = (v != "none").then_some(v);
        }
        "hostid" => {
            let v = num(p)?;
            if v == 0 {
                return Err("hostid must be non-zero".into());
            }
            out.header.push(format!("set hostid 0x{v:08x}"));
            out.hostid = Some(v);
        }
        "reassemble" => {
            let v = p.string()?;
            if v != "yes" && v != "no" {
                return Err("syntax error".into());
            }
            let nodf = p.eat("no-df");
            if v == "no" && !out.scrubs.is_empty() {
                return Err("`set reassemble no` turns off the reassembly the scrub rules before it ask for".into());
            }
            out.header.push(format!("set reassemble {v} {}", if nodf { "no-df" } else { "" }));
            out.reassemble = Some(v == "yes");
            out.reassemble_no_df = nodf;
        }
        "state-policy" => {
            let v = p.string()?;
            if v != "if-bound" && v != "floating" {
                return Err("syntax error".into());
            }
            out.header.push(format!("set state-policy {v}"));
            out.if_bound = v == "if-bound";
        }
        "debug" => {
            // OpenBSD's syslog names, and FreeBSD's older four.
            let v = p.string()?;
            const LEVELS: [&str; 12] = [
                "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug", "none", "urgent", "misc", "loud",
            ];
            if !LEVELS.contains(&v.as_str()) {
                return Err(format!("unknown debug level \"{v}\""));
            }
            out.header.push(format!("set debug {v}"));
            out.debug = Some(v);
        }
        "skip" => {
            if !p.eat("on") {
                return Err("syntax error".into());
            }
            let ifs = p.list(|p| p.string())?;
            for i in &ifs {
                out.header.push(format!("set skip on {i}"));
            }
            out.skip.extend(ifs);
        }
        "ruleset-optimization" => {
            let v = p.string()?;
            if !["none", "basic", "profile"].contains(&v.as_str()) {
                return Err(format!("unknown ruleset-optimization {v}"));
            }
            out.header.push(format!("set ruleset-optimization {v}"));
        }
        "syncookies" => {
            use xpf_engine::syncookie::Mode;
            let v = p.string()?;
            let mut mode = match v.as_str() {
                "never" => Mode::Never,
                "always" => Mode::Always,
                "adaptive" => Mode::Adaptive { start: 25, end: 12 },
                _ => return Err("illegal value for syncookies".into()),
            };
            let mut text = format!("set syncookies {v}");
            if p.eat_punct("(") {
                // pfctl: `start N%`, `end M%` (a percentage of the state limit, 0 < x <= 100;
                // end defaults to half of start); only for adaptive.
                let (mut hi, mut lo) = (0u32, 0u32);
                loop {
                    let which = p.string()?;
                    let val = p.string()?;
                    let pct = val
                        .strip_suffix('%')
                        .and_then(|x| x.parse::<f64>().ok())
                        .ok_or_else(|| "syntax error".to_string())?;
                    if !(pct > 0.0 && pct <= 100.0) {
                        return Err("illegal percentage value".into());
                    }
                    match which.as_str() {
                        "start" => hi = pct as u32,
                        "end" => lo = pct as u32,
                        _ => return Err("illegal syncookie option".into()),
                    }
                    if p.eat_punct(")") {
                        break;
                    }
                    p.eat_punct(",");
                }
                if !matches!(mode, Mode::Adaptive { .. }) {
                    return Err("error setting syncookies: start/end only apply to adaptive".into());
                }
                if hi == 0 {
                    hi = 25;
                }
                if lo == 0 {
                    lo = hi / 2;
                }
                if lo >= hi {
                    return Err("error setting syncookies: start must be higher than end".into());
                }
                mode = Mode::Adaptive { start: hi as u8, end: lo as u8 };
                text = format!("set syncookies adaptive (start {hi}%, end {lo}%)");
            }
            out.header.push(text);
            out.syncookies = Some(mode);
        }
        "state-defaults" => {
            // pf applies these to every rule that keeps state; xpf takes the two options that
            // need nothing of the rule (the others are refused by name).
            let mut words = Vec::new();
            loop {
                let w = p.string()?;
                match w.as_str() {
                    "pflow" => out.state_defaults.pflow = true,
                    "no-sync" => out.state_defaults.no_sync = true,
                    _ => return Err(unsupported(&format!("set state-defaults {w}"))),
                }
                words.push(w);
                if !p.eat_punct(",") {
                    break;
                }
            }
            out.header.push(format!("set state-defaults {}", words.join(", ")));
        }
        w @ ("fingerprints" | "require-order" | "prio") => return Err(unsupported(&format!("set {w}"))),
        _ => return Err("syntax error".into()),
    }
    if p.done() {
        Ok(())
    } else {
        Err("syntax error".into())
    }
}

pub(super) fn tos_value(s: &str) -> R<u8> {
    match s {
        "lowdelay" => return Ok(0x10),
        "throughput" => return Ok(0x08),
        "reliability" => return Ok(0x04),
        _ => {}
    }
    let v = if let Some(h) = s.strip_prefix("0x") { u8::from_str_radix(h, 16) } else { s.parse() };
    v.map_err(|_| format!("illegal tos value {s}"))
}

pub(super) fn bandwidth(p: &mut P) -> R<Bandwidth> {
    let s = p.string()?;
    // pfctl's: a number, fractions too (strtod), then b, K, M, G or %; after K, M or G, one of
    // b, bit, B or Bit changes nothing ("1.5Mb" is 1,500,000 bits/s, kept as whole bits). A bare
    // number is bits only when it is a whole one (its lexer's NUMBER): "1.5" has no unit, and a
    // percentage is 0 to 100, its fraction dropped.
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if unit == "%" {
        return match num.parse::<f64>() {
            Ok(n) if (0.0..=100.0).contains(&n) => Ok(Bandwidth::Percent(n as u32)),
            Ok(_) => Err("bandwidth spec out of range".into()),
            Err(_) => Err(format!("invalid bandwidth {s}")),
        };
    }
    let unit = match unit.get(1..) {
        Some("b" | "bit" | "B" | "Bit") => &unit[..1],
        _ => unit,
    };
    let mul = match unit {
        "" if !num.contains('.') => 1.0,
        "b" => 1.0,
        "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        _ => return Err(format!("unknown unit {unit}")),
    };
    match num.parse::<f64>() {
        Ok(n) if n.is_finite() => Ok(Bandwidth::Bits((n * mul) as u64)),
        _ => Err(format!("invalid bandwidth {s}")),
    }
}

/// A rate's `burst M for Tms`, if it follows.
fn burst(p: &mut P) -> R<Option<(Bandwidth, u32)>> {
    if !p.eat("burst") {
        return Ok(None);
    }
    let m = bandwidth(p)?;
    if !p.eat("for") {
        return Err("syntax error".into());
    }
    let t = p.string()?;
    match t.strip_suffix("ms").and_then(|n| n.parse::<u32>().ok()) {
        Some(ms) => Ok(Some((m, ms))),
        None => Err("time in scspec must be in ms".into()),
    }
}

pub(super) fn queue(p: &mut P, line: u32) -> R<Queue> {
    let mut q = Queue { name: p.string()?, line, ..Queue::default() };
    // pfctl's ranges and words: a number over the range is refused, not cut (a queue of
    // 4 billion flows would be allocated whole).
    let num = |p: &mut P, lo: u64, max: u64, what: &str| -> R<u32> {
        let n: u64 = p.string()?.parse().map_err(|_| "syntax error".to_string())?;
        if n < lo || n > max {
            return Err(format!("{what} out of range: max {max}"));
        }
        Ok(n as u32)
    };
    let once = |set: bool, what: &str| if set { Err(format!("{what} cannot be respecified")) } else { Ok(()) };
    while !p.done() {
        if p.eat_punct("{") {
            return Err(altq("{ child, ... }"));
        }
        let w = p.string()?;
        match w.as_str() {
            "priority" | "cbq" | "priq" | "hfsc" | "fairq" | "codel" => return Err(altq(&w)),
            "on" => q.on = Some(p.string()?),
            "parent" => {
                once(q.parent.is_some(), "parent")?;
                q.parent = Some(p.string()?)
            }
            "bandwidth" => {
                once(q.bandwidth.is_some(), "bandwidth")?;
                (q.bandwidth, q.burst[1]) = (Some(bandwidth(p)?), burst(p)?)
            }
            // pfctl's grammar takes one of each after the bandwidth (a second is its syntax
            // error); named here.
            "min" => {
                once(q.min.is_some(), "min")?;
                (q.min, q.burst[0]) = (Some(bandwidth(p)?), burst(p)?)
            }
            "max" => {
                once(q.max.is_some(), "max")?;
                (q.max, q.burst[2]) = (Some(bandwidth(p)?), burst(p)?)
            }
            "flows" => {
                once(q.flows.is_some(), "number of flows")?;
                q.flows = Some(num(p, 1, 32767, "number of flows")?)
            }
            "quantum" => {
                once(q.quantum.is_some(), "quantum")?;
                q.quantum = Some(num(p, 1, 65535, "quantum")?)
            }
            "qlimit" => {
                once(q.qlimit.is_some(), "qlimit")?;
                q.qlimit = Some(num(p, 0, 65535, "qlimit")?)
            }
            "default" => {
                once(q.default, "default")?;
                q.default = true
            }
            _ => return Err("syntax error".into()),
        }
        p.eat_punct(",");
    }
    if q.bandwidth.is_none() && q.flows.is_none() {
        return Err("no bandwidth or flow specification".into());
    }
    Ok(q)
}

/// The refusal of FreeBSD's ALTQ (`altq on`, its queues' schedulers, priorities and child
/// lists, and its rules' `queue` option): xpf's queues are OpenBSD's.
pub(super) fn altq(what: &str) -> String {
    format!("xpf does not support ALTQ's '{what}' yet (its queues are OpenBSD's: queue NAME parent P bandwidth B ..., set queue NAME)")
}

/// pfctl's checks of the queue tree, after the whole file is read (bare `pfctl:` messages).
pub(super) fn check_queues(out: &mut Parsed, file: &str) {
    let qs = out.queues.clone();
    if qs.is_empty() {
        return;
    }
    let has_children = |n: &str| qs.iter().any(|q| q.parent.as_deref() == Some(n));
    let mut msgs = Vec::new();
    for q in &qs {
        if q.default && has_children(&q.name) {
            msgs.push(format!("pfctl: default queue {} is not a leaf queue", q.name));
        }
        if q.flows.is_some() && has_children(&q.name) {
            msgs.push(format!("pfctl: flow queue {} is not a leaf queue", q.name));
        }
    }
    let hfsc = qs.iter().any(|q| q.bandwidth.is_some());
    if !out.errors.is_empty() {
        // The tree is checked when the file parsed; the reference is checked as it is read.
        msgs.clear();
    } else if msgs.is_empty() && hfsc {
        for q in &qs {
            if q.bandwidth.is_none() {
                msgs.push(format!("pfctl: queue {}: no bandwidth was specified", q.name));
            }
        }
        if msgs.is_empty() && !qs.iter().any(|q| q.default) {
            msgs.push("pfctl: no default queue specified".into());
        }
    }
    for r in &out.rules {
        if let Some((a, b)) = r.set_queue.as_deref() {
            for n in std::iter::once(a).chain(b.iter()) {
                if !qs.iter().any(|q| &q.name == n) {
                    out.errors.push(ConfError {
                        file: file.into(),
                        line: r.line,
                        msg: format!("queue {n} is not defined"),
                        bare: false,
                    });
                }
            }
        }
    }
    // pfctl stops at the first problem of the tree.
    out.errors.extend(msgs.into_iter().take(1).map(|m| ConfError { file: file.into(), line: 0, msg: m, bare: true }));
}

/// A table's name as written in `<...>`: at most 31 bytes, and one word, so that it prints
/// back as a name that reads again (an empty or spaced name was found by the pfconf fuzz
/// target: `<"">` printed as `<>`).
pub(super) fn table_name(name: String) -> R<String> {
    if name.len() > 31 {
        return Err("table name too long, max 31 chars".to_string());
    }
    if name.is_empty() || !crate::lex::is_word(&name) {
        return Err(format!("invalid table name '{name}'"));
    }
    Ok(name)
}

pub(super) fn table(p: &mut P) -> R<Table> {
    p.expect_punct("<")?;
    let name = table_name(p.string()?)?;
    p.expect_punct(">")?;
    let mut t =
        Table { name, konst: false, persist: false, counters: false, parts: Vec::new(), line: 0, file: "".into() };
    while !p.done() {
        if p.eat("const") {
            t.konst = true;
        } else if p.eat("persist") {
            t.persist = true;
        } else if p.eat("counters") {
            t.counters = true;
        } else if p.eat("file") {
            let f = p.string()?;
            if let Err(e) = std::fs::metadata(&f) {
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    "No such file or directory".to_string()
                } else {
                    e.to_string()
                };
                return Err(format!("cannot load \"{f}\": {why}"));
            }
            t.parts.push(TablePart::File(f));
        } else if p.punct("{") {
            let hs: Vec<Host> = p.list(hosts)?.into_iter().flatten().collect();
            for h in &hs {
                match &h.kind {
                    HostKind::Table(_) => return Err("tables cannot contain tables".into()),
                    HostKind::Dynamic { .. } => return Err("dynamic addresses are not permitted inside tables".into()),
                    HostKind::NoRoute => return Err("\"no-route\" is not permitted inside tables".into()),
                    HostKind::UrpfFailed => return Err("\"urpf-failed\" is not permitted inside tables".into()),
                    HostKind::SelfAddr => return Err("\"self\" is not permitted inside tables".into()),
                    _ => {}
                }
            }
            match t.parts.last_mut() {
                Some(TablePart::Hosts(v)) => v.extend(hs),
                _ => t.parts.push(TablePart::Hosts(hs)),
            }
        } else {
            return Err("syntax error".into());
        }
    }
    Ok(t)
}

/// `include "file"`: its statements are read in place, errors naming it.
pub(super) fn include(
    p: &mut P,
    file: &str,
    base: Option<&std::path::Path>,
    out: &mut Parsed,
    st: &mut ParseState,
) -> R<()> {
    let path = p.string()?;
    if !p.done() {
        return Err("syntax error".into());
    }
    if st.includes >= MAX_INCLUDE_DEPTH {
        return Err(format!("include nesting too deep at {path}"));
    }
    let mut tries = vec![std::path::PathBuf::from(&path)];
    if let Some(b) = base {
        tries.push(b.join(&path));
    }
    if let Some(d) = std::path::Path::new(file).parent() {
        tries.push(d.join(&path));
    }
    let Some((found, text)) = tries.iter().find_map(|t| std::fs::read_to_string(t).ok().map(|s| (t.clone(), s))) else {
        return Err(format!("cannot open the include file {path}"));
    };
    st.includes += 1;
    let inner_base = found.parent().map(|d| d.to_path_buf());
    parse_source(&text, &path, inner_base.as_deref().or(base), out, st);
    st.includes -= 1;
    Ok(())
}
