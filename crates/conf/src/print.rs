//! Rules in pfctl's canonical form (`pfctl -nv`), field by field in the order of pfctl's
//! print_rule, so that the output parses back to itself.

use crate::ast::*;
use crate::names;
use std::fmt::Write;

const FLAG_CHARS: &[u8] = b"FSRPAUEW";

/// A name as pfctl prints it (bare), quoted only when it would not lex back as one word.
fn word(w: &str) -> String {
    let bare =
        !w.is_empty() && w.chars().all(|c| !(c.is_whitespace() || c.is_control() || "(){}<>!=/#,\"$\\".contains(c)));
    if bare {
        w.to_string()
    } else {
        quoted(w)
    }
}

/// A double-quoted string, with `"` escaped as the lexer reads it back.
fn quoted(w: &str) -> String {
    format!("\"{}\"", w.replace('"', "\\\""))
}

fn flags(b: u8) -> String {
    (0..8).filter(|i| b & (1 << i) != 0).map(|i| FLAG_CHARS[i] as char).collect()
}

/// An address as pfctl prints it (also what `$srcaddr` in a label becomes).
pub fn host_label(h: &Host) -> String {
    match &h.kind {
        HostKind::Any => "any".into(),
        HostKind::NoRoute => "no-route".into(),
        HostKind::UrpfFailed => "urpf-failed".into(),
        HostKind::RouteLabel(l) => format!("route {}", quoted(l)),
        HostKind::SelfAddr => "self".into(),
        HostKind::Net(a, l) => {
            let full = if a.is_ipv4() { 32 } else { 128 };
            if *l == 0 && a.is_unspecified() {
                "any".into()
            } else if *l == full {
                a.to_string()
            } else {
                format!("{a}/{l}")
            }
        }
        HostKind::Range(a, b) => format!("{a} - {b}"),
        HostKind::Table(t) => format!("<{t}>"),
        HostKind::Dynamic { ifname, modifier, prefix } => {
            let mut s = format!("({ifname}");
            if let Some(m) = modifier {
                s.push(':');
                s.push_str(m);
            }
            s.push(')');
            if let Some(p) = prefix {
                let _ = write!(s, "/{p}");
            }
            s
        }
    }
}

pub fn port_label(p: PortOp) -> String {
    match p {
        PortOp::Eq(a) => a.to_string(),
        PortOp::Ne(a) => format!("!={a}"),
        PortOp::Lt(a) => format!("<{a}"),
        PortOp::Le(a) => format!("<={a}"),
        PortOp::Gt(a) => format!(">{a}"),
        PortOp::Ge(a) => format!(">={a}"),
        // pfctl's label expansion has no form for an a:b range: it is left empty.
        PortOp::Range(..) => String::new(),
        PortOp::Inside(a, b) => format!("{a}><{b}"),
        PortOp::Outside(a, b) => format!("{a}<>{b}"),
    }
}

fn port(p: PortOp) -> String {
    match p {
        PortOp::Eq(a) => format!(" port = {a}"),
        PortOp::Ne(a) => format!(" port != {a}"),
        PortOp::Lt(a) => format!(" port < {a}"),
        PortOp::Le(a) => format!(" port <= {a}"),
        PortOp::Gt(a) => format!(" port > {a}"),
        PortOp::Ge(a) => format!(" port >= {a}"),
        PortOp::Range(a, b) => format!(" port {a}:{b}"),
        PortOp::Inside(a, b) => format!(" port {a} >< {b}"),
        PortOp::Outside(a, b) => format!(" port {a} <> {b}"),
    }
}

fn is_any(h: &Host) -> bool {
    !h.neg && (h.kind == HostKind::Any || matches!(h.kind, HostKind::Net(a, 0) if a.is_unspecified()))
}

/// One rule as pfctl prints it (without the trailing newline).
pub fn rule(r: &Rule) -> String {
    let mut s = String::new();
    match (&r.anchor, r.xlate) {
        // FreeBSD's translation rules and their anchors (pfctl's print_rule).
        (Some(n), Some(x)) => {
            let _ = write!(s, "{}-anchor \"{n}\"", x.kind.word());
        }
        (None, Some(x)) => {
            let _ =
                write!(s, "{}{}{}", if x.no { "no " } else { "" }, x.kind.word(), if x.pass { " pass" } else { "" });
        }
        (Some(n), None) if !n.is_empty() => {
            let _ = write!(s, "anchor \"{n}\"");
        }
        (Some(_), None) => s.push_str("anchor"),
        (None, None) => s.push_str(match r.action {
            Action::Pass => "pass",
            Action::Block => "block",
            Action::Match => "match",
        }),
    }
    if r.action == Action::Block && r.anchor.is_none() {
        match &r.ret {
            Return::Drop => s.push_str(" drop"),
            Return::Return => s.push_str(" return"),
            Return::Rst { ttl: None } => s.push_str(" return-rst"),
            Return::Rst { ttl: Some(t) } => {
                let _ = write!(s, " return-rst(ttl {t})");
            }
            Return::Icmp { v4, v6 } => {
                let c4 = v4.unwrap_or(3);
                let c6 = v6.unwrap_or(4);
                let n4 = names::icmp_code_name(3, c4, false).map_or(c4.to_string(), str::to_string);
                let n6 = names::icmp_code_name(1, c6, true).map_or(c6.to_string(), str::to_string);
                match r.af {
                    Af::Inet => {
                        let _ = write!(s, " return-icmp({n4})");
                    }
                    Af::Inet6 => {
                        let _ = write!(s, " return-icmp6({n6})");
                    }
                    Af::Any => {
                        let _ = write!(s, " return-icmp({n4}, {n6})");
                    }
                }
            }
        }
    }
    match r.dir {
        Dir::In => s.push_str(" in"),
        Dir::Out => s.push_str(" out"),
        Dir::Both => {}
    }
    if let Some(l) = &r.log {
        s.push_str(" log");
        let mut opts = Vec::new();
        if l.all {
            opts.push("all".to_string());
        }
        if l.matches {
            opts.push("matches".into());
        }
        if l.user {
            opts.push("user".into());
        }
        if let Some(t) = &l.to {
            opts.push(format!("to {t}"));
        }
        if !opts.is_empty() {
            let _ = write!(s, " ({})", opts.join(", "));
        }
    }
    if r.quick {
        s.push_str(" quick");
    }
    if let Some(i) = &r.on {
        let _ = write!(s, " on {}{}", if i.neg { "! " } else { "" }, i.name);
    }
    match r.af {
        Af::Inet => s.push_str(" inet"),
        Af::Inet6 => s.push_str(" inet6"),
        Af::Any => {}
    }
    if let Some(p) = r.proto {
        match names::proto_name(p) {
            Some(n) => {
                let _ = write!(s, " proto {n}");
            }
            None => {
                let _ = write!(s, " proto {p}");
            }
        }
    }
    if is_any(&r.src) && is_any(&r.dst) && r.src_port.is_none() && r.dst_port.is_none() {
        s.push_str(" all");
    } else {
        let _ = write!(s, " from {}{}", if r.src.neg { "! " } else { "" }, host_label(&r.src));
        if let Some(p) = r.src_port {
            s.push_str(&port(p));
        }
        let _ = write!(s, " to {}{}", if r.dst.neg { "! " } else { "" }, host_label(&r.dst));
        if let Some(p) = r.dst_port {
            s.push_str(&port(p));
        }
    }
    if let Some(i) = &r.received_on {
        let _ = write!(s, " {}received-on {}", if i.neg { "!" } else { "" }, i.name);
    }
    for (name, u) in [("user", r.user), ("group", r.group)] {
        if let Some(op) = u {
            s.push_str(&port(op).replacen(" port", &format!(" {name}"), 1));
        }
    }
    match r.flags {
        Some(Flags::Set { bits, mask }) => {
            let _ =
                write!(s, " flags {}/{}", flags(bits), if mask == 0xff { "FSRPAUEW".to_string() } else { flags(mask) });
        }
        Some(Flags::Any)
            if r.action != Action::Block && matches!(r.proto, None | Some(6)) && r.state != StateKind::No =>
        {
            s.push_str(" flags any");
        }
        _ => {}
    }
    if let Some((t, code)) = r.icmp {
        let v6 = r.icmp6 || r.af == Af::Inet6;
        let _ = write!(
            s,
            " {} {}",
            if v6 { "icmp6-type" } else { "icmp-type" },
            names::icmp_type_name(t, v6).map_or(t.to_string(), str::to_string)
        );
        if let Some(c) = code {
            let _ = write!(s, " code {}", names::icmp_code_name(t, c, v6).map_or(c.to_string(), str::to_string));
        }
    }
    if let Some(t) = r.tos {
        let _ = write!(s, " tos 0x{t:02x}");
    }
    if let Some((n, secs)) = r.max_pkt_rate {
        let _ = write!(s, " max-pkt-rate {n}/{secs}");
    }
    if r.set_prio.is_some() || r.set_queue.is_some() || r.set_tos.is_some() {
        let mut v: Vec<String> = Vec::new();
        match r.set_prio {
            Some((a, b)) if a == b => v.push(format!("prio {a}")),
            Some((a, b)) => v.push(format!("prio({a}, {b})")),
            None => {}
        }
        match r.set_queue.as_deref() {
            Some((a, Some(b))) => v.push(format!("queue({a}, {b})")),
            Some((a, None)) => v.push(format!("queue {a}")),
            None => {}
        }
        if let Some(t) = r.set_tos {
            v.push(format!("tos 0x{t:02x}"));
        }
        let _ = write!(s, " set ({})", v.join(", "));
    }
    let o = &r.state_opts;
    match r.state {
        StateKind::No if r.action == Action::Pass && r.anchor.is_none() && r.xlate.is_none() => s.push_str(" no state"),
        StateKind::Keep if !o.is_empty() => s.push_str(" keep state"),
        StateKind::Modulate => s.push_str(" modulate state"),
        StateKind::Synproxy => s.push_str(" synproxy state"),
        _ => {}
    }
    if !o.is_empty() && r.state != StateKind::No {
        let mut v: Vec<String> = Vec::new();
        if let Some(m) = o.max {
            v.push(format!("max {m}"));
        }
        if o.no_sync {
            v.push("no-sync".into());
        }
        if o.pflow {
            v.push("pflow".into());
        }
        if let Some(rule) = o.source_track {
            v.push(format!("source-track {}", if rule { "rule" } else { "global" }));
        }
        if let Some(m) = o.max_src_states {
            v.push(format!("max-src-states {m}"));
        }
        if let Some(m) = o.max_src_conn {
            v.push(format!("max-src-conn {m}"));
        }
        if let Some((a, b)) = o.max_src_conn_rate {
            v.push(format!("max-src-conn-rate {a}/{b}"));
        }
        if let Some(m) = o.max_src_nodes {
            v.push(format!("max-src-nodes {m}"));
        }
        if let Some((t, flush, global)) = &o.overload {
            v.push(format!(
                "overload <{t}>{}{}",
                if *flush { " flush" } else { "" },
                if *global { " global" } else { "" }
            ));
        }
        if o.if_bound {
            v.push("if-bound".into());
        }
        if o.floating {
            v.push("floating".into());
        }
        if o.sloppy {
            v.push("sloppy".into());
        }
        let mut ts = o.timeouts.clone();
        ts.sort_by_key(|t| t.0 as u8);
        for (t, n) in ts {
            v.push(format!("{} {n}", t.name()));
        }
        let _ = write!(s, " ({})", v.join(", "));
    }
    if let Some(p) = r.probability {
        // pfctl stores a 32-bit fraction and prints it back with %g.
        let frac = (p / 100.0 * u32::MAX as f64).round() / u32::MAX as f64 * 100.0;
        let digits = 6usize.saturating_sub(frac.abs().log10().floor().max(0.0) as usize + 1);
        let mut t = format!("{:.*}", digits, frac);
        if t.contains('.') {
            t = t.trim_end_matches('0').trim_end_matches('.').to_string();
        }
        let _ = write!(s, " probability {t}%");
    }
    if r.fragment {
        s.push_str(" fragment");
    }
    if let Some(sc) = &r.scrub {
        let mut v: Vec<String> = Vec::new();
        if sc.no_df {
            v.push("no-df".into());
        }
        if sc.random_id {
            v.push("random-id".into());
        }
        if let Some(t) = sc.min_ttl {
            v.push(format!("min-ttl {t}"));
        }
        if let Some(t) = sc.set_tos {
            v.push(format!("set-tos 0x{t:02x}"));
        }
        if sc.reassemble_tcp {
            v.push("reassemble tcp".into());
        }
        if let Some(m) = sc.max_mss {
            v.push(format!("max-mss {m}"));
        }
        let _ = write!(s, " scrub ({})", v.join(" "));
    }
    if r.allow_opts {
        s.push_str(" allow-opts");
    }
    if let Some(t) = r.rtable {
        let _ = write!(s, " rtable {t}");
    }
    if let Some(l) = &r.label {
        if !l.is_empty() {
            let _ = write!(s, " label {}", quoted(l));
        }
    }
    if r.once {
        s.push_str(" once");
    }
    if let Some(t) = &r.tag {
        let _ = write!(s, " tag {}", word(t));
    }
    if let Some((neg, t)) = &r.tagged {
        let _ = write!(s, "{} tagged {}", if *neg { " !" } else { "" }, word(t));
    }
    if let Some((k, p)) = r.route.as_deref() {
        let w = match k {
            RouteKind::RouteTo => "route-to",
            RouteKind::ReplyTo => "reply-to",
            RouteKind::DupTo => "dup-to",
        };
        // FreeBSD's `(IF ADDR)`, or a list of them.
        let hop = |(ifname, h): &(String, Host)| format!("({ifname} {})", host_label(h));
        match &p.hops[..] {
            [] => pool(&mut s, w, p, false),
            [one] => {
                let _ = write!(s, " {w} {}", hop(one));
                pool_opts(&mut s, p, false);
            }
            several => {
                let _ = write!(s, " {w} {{ {} }}", several.iter().map(hop).collect::<Vec<_>>().join(", "));
                pool_opts(&mut s, p, false);
            }
        }
    }
    if let Some((af, from, to)) = r.af_to.as_deref() {
        let _ = write!(s, " af-to {} from {}", if *af == Af::Inet { "inet" } else { "inet6" }, host_label(from));
        if let Some(t) = to {
            let _ = write!(s, " to {}", host_label(t));
        }
    }
    match r.xlate.map(|x| x.kind) {
        None => {
            if let Some(p) = &r.nat {
                pool(&mut s, "nat-to", p, true);
            }
            if let Some(p) = &r.rdr {
                pool(&mut s, "rdr-to", p, false);
            }
            if let Some(p) = &r.binat {
                pool(&mut s, "binat-to", p, false);
            }
        }
        // FreeBSD's `-> pool` at the end (a binat's out half is its own business).
        Some(k) => {
            let p = match k {
                XlateKind::Nat => r.nat.as_ref(),
                XlateKind::Rdr => r.rdr.as_ref(),
                XlateKind::Binat => r.binat.as_ref(),
            };
            if let Some(p) = p {
                pool(&mut s, "->", p, k == XlateKind::Nat);
            }
        }
    }
    match &r.divert {
        Some(Divert::To(a, port)) => {
            let _ = write!(s, " divert-to {a} port {port}");
        }
        Some(Divert::Reply) => s.push_str(" divert-reply"),
        Some(Divert::Packet(port)) => {
            let _ = write!(s, " divert-packet port {port}");
        }
        None => {}
    }
    s
}

/// pfctl's print_pool.
fn pool(s: &mut String, what: &str, p: &Pool, nat: bool) {
    let _ = write!(s, " {what} {}{}", if p.host.neg { "! " } else { "" }, host_label(&p.host));
    pool_opts(s, p, nat);
}

/// A pool's port and options, after its targets.
fn pool_opts(s: &mut String, p: &Pool, nat: bool) {
    match (p.port, nat) {
        (Some((a, b)), _) if a == b => {
            let _ = write!(s, " port {a}");
        }
        (Some((a, b)), _) if b != 0 => {
            let _ = write!(s, " port {a}:{b}");
        }
        (Some((a, _)), _) => {
            let _ = write!(s, " port {a}");
        }
        _ => {}
    }
    match &p.kind {
        PoolKind::None => {}
        PoolKind::Bitmask => s.push_str(" bitmask"),
        PoolKind::Random => s.push_str(" random"),
        PoolKind::RoundRobin => s.push_str(" round-robin"),
        PoolKind::LeastStates => s.push_str(" least-states"),
        PoolKind::SourceHash(k) => {
            let _ = write!(s, " source-hash {}", k.as_deref().unwrap_or("0x00000000000000000000000000000000"));
        }
    }
    if p.sticky {
        s.push_str(" sticky-address");
    }
    if p.static_port {
        s.push_str(" static-port");
    }
    if p.endpoint_independent {
        s.push_str(" endpoint-independent");
    }
    if let Some((offset, len, psid)) = p.mape {
        let _ = write!(s, " map-e-portset {offset}/{len}/{psid}");
    }
}

/// The ruleset as `pfctl -nv` prints it: what parsing printed (macros, options), then the rules.
pub fn parsed(p: &crate::Parsed) -> String {
    let mut s = String::new();
    for h in &p.header {
        s.push_str(h);
        s.push('\n');
    }
    // Queues are printed as they are loaded, before the rules.
    for q in &p.queues {
        s.push_str(&queue(q));
        s.push('\n');
    }
    // Translation rules first, as pfctl (FreeBSD) requires them to stand.
    s.push_str(&ruleset(&p.xrules));
    s.push_str(&ruleset(&p.rules));
    s
}

/// A FreeBSD scrub rule, held as the `match` rule selecting its packets, as pfctl prints it:
/// `scrub in on em0 all fragment reassemble`.
pub fn scrub(r: &Rule) -> String {
    // The match rule's printing without its `scrub (...)`: a scrub rule's options follow its
    // addresses bare, in pfctl's order (print_rule), before `fragment reassemble`.
    let m = rule(&Rule { scrub: None, ..r.clone() });
    let mut s = format!("scrub{}", m.strip_prefix("match").unwrap_or(&m));
    if let Some(o) = &r.scrub {
        if o.no_df {
            s.push_str(" no-df");
        }
        if o.random_id {
            s.push_str(" random-id");
        }
        if let Some(t) = o.min_ttl {
            let _ = write!(s, " min-ttl {t}");
        }
        if let Some(m) = o.max_mss {
            let _ = write!(s, " max-mss {m}");
        }
        if let Some(t) = o.set_tos {
            let _ = write!(s, " set-tos 0x{t:02x}");
        }
    }
    s + " fragment reassemble"
}

/// The rules as `pfctl -nv` prints them, inline anchors' bodies indented inside braces.
pub fn ruleset(rules: &[Rule]) -> String {
    ruleset_numbered(rules, false)
}

/// As [`ruleset`]; with `numbered`, each rule starts with `@N ` as `pfctl -nvv` prints it, N
/// counting from 0 in each ruleset (an anchor's body has its own count).
pub fn ruleset_numbered(rules: &[Rule], numbered: bool) -> String {
    let mut s = String::new();
    let mut counts = vec![0u32];
    let mut depth = 0u8;
    let close = |s: &mut String, depth: &mut u8, to: u8| {
        while *depth > to {
            *depth -= 1;
            let _ = writeln!(s, "{}}}", "  ".repeat(*depth as usize));
        }
    };
    for r in rules {
        close(&mut s, &mut depth, r.depth);
        counts.truncate(r.depth as usize + 1);
        s.push_str(&"  ".repeat(r.depth as usize));
        if numbered {
            let _ = write!(s, "@{} ", counts[r.depth as usize]);
            counts[r.depth as usize] += 1;
        }
        s.push_str(&rule(r));
        if r.opens {
            s.push_str(" {");
            depth = r.depth + 1;
            counts.push(0);
        }
        s.push('\n');
    }
    close(&mut s, &mut depth, 0);
    s
}

/// A table definition as pfctl prints it (print_tabledef).
pub fn table(t: &crate::parse::Table) -> String {
    let mut s = format!("table <{}>", t.name);
    if t.konst {
        s.push_str(" const");
    }
    if t.persist {
        s.push_str(" persist");
    }
    if t.counters {
        s.push_str(" counters");
    }
    for part in &t.parts {
        match part {
            crate::parse::TablePart::File(f) => {
                let _ = write!(s, " file \"{f}\"");
            }
            crate::parse::TablePart::Hosts(hs) => {
                s.push_str(" {");
                for h in hs {
                    let _ = write!(s, " {}{}", if h.neg { "!" } else { "" }, host_label(h));
                }
                s.push_str(" }");
            }
        }
    }
    s
}

pub(crate) fn bandwidth(b: Bandwidth) -> String {
    match b {
        Bandwidth::Percent(p) => format!("{p}%"),
        Bandwidth::Bits(n) => {
            for (m, u) in [(1_000_000_000u64, "G"), (1_000_000, "M"), (1_000, "K")] {
                if n >= m && n % m == 0 {
                    return format!("{}{u}", n / m);
                }
            }
            n.to_string()
        }
    }
}

/// A queue as pfctl prints it (print_queuespec).
pub fn queue(q: &Queue) -> String {
    let mut s = format!("queue {}", q.name);
    match (&q.parent, &q.on) {
        (Some(p), _) => {
            let _ = write!(s, " parent {p}");
        }
        (None, Some(i)) => {
            let _ = write!(s, " on {i}");
        }
        _ => {}
    }
    if let Some(f) = q.flows {
        let _ = write!(s, " flows {f}");
        if let Some(qt) = q.quantum {
            let _ = write!(s, " quantum {qt}");
        }
    }
    // A rate and its burst (print_scspec).
    let rate = |s: &mut String, prefix: &str, b: Bandwidth, burst: Option<(Bandwidth, u32)>| {
        let _ = write!(s, "{prefix}{}", bandwidth(b));
        if let Some((m, ms)) = burst {
            let _ = write!(s, " burst {} for {ms}ms", bandwidth(m));
        }
    };
    if let Some(b) = q.bandwidth {
        rate(&mut s, " bandwidth ", b, q.burst[1]);
        if let Some(m) = q.min {
            rate(&mut s, ", min ", m, q.burst[0]);
        }
        if let Some(m) = q.max {
            rate(&mut s, ", max ", m, q.burst[2]);
        }
    }
    if q.default {
        s.push_str(" default");
    }
    if let Some(l) = q.qlimit {
        let _ = write!(s, " qlimit {l}");
    }
    s
}
