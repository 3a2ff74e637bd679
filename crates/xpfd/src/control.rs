//! The control socket: a Unix stream socket (mode 0600, root only; the peer's credentials are
//! checked too), one JSON request per connection, one JSON answer: `{"ok": true, "text":
//! "...", "data": {...}}` or `{"ok": false, "error": "..."}`. The daemon renders pfctl's text
//! itself, so that xpfctl stays a thin client and `--json` gets the same facts.
//!
//! Requests: `{"op":"show","what":"info|states|Sources|memory|rules|timeouts|Tables|all","verbose":N}`,
//! `{"op":"load","file":PATH,"noaction":bool}`, `{"op":"kill","hosts":[..]}` or
//! `{"op":"kill","label":L}`, `{"op":"killsrc","hosts":[NET]}`, `{"op":"flush","what":"states|rules|all"}`,
//! `{"op":"table","name":T,"cmd":"add|delete|replace|show|test|flush|zero","addrs":[..]}`.

use crate::dataplane::{Cmd, IoStats, RuleSums, Select, Snapshot, StateRow};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpf_conf::compile::RuleList;
use xpf_conf::compile::{add_counts, EntrySums, Table, ENTRY_COUNTER_ROWS};
use xpf_conf::parse::Parsed;
use xpf_conf::reload::Slot;
use xpf_conf::Ruleset;
use xpf_engine::info::Info;
use xpf_state::{Timeout, Timeouts};
use xpf_xdp::steer::Steer;

/// pf's default hard limits, as `pfctl -sm` lists them.
const LIMITS: [(&str, u32); 5] =
    [("states", 100_000), ("src-nodes", 10_000), ("frags", 65_536), ("tables", 1_000), ("table-entries", 200_000)];

/// A parsed and compiled pf.conf.
pub struct Loaded {
    pub parsed: Parsed,
    ruleset: Option<Ruleset>,
    /// What loads with a caveat (xpf_conf::support), said on every load.
    pub warnings: Vec<String>,
    /// The links and groups as the compile saw them (read before it).
    links: Option<xpf_conf::ifgroup::Links>,
    /// How long each step of this load took (read, parse, check, compile), for the log.
    pub took: Vec<(&'static str, Duration)>,
    /// The interface names the ruleset uses, each once, and whether it tests routes: xpfd's
    /// watch asks both once a second, and a walk of a 1.6M-rule ruleset's names with their
    /// sort took 16% of a core (the control thread's, idle).
    names: Vec<String>,
    routes: bool,
}

pub(crate) fn ifindex_of(name: &str) -> Option<u16> {
    xpf_xdp::netlink::ifindex(name).ok().and_then(|i| u16::try_from(i).ok())
}

impl Loaded {
    /// Parses and compiles; errors as `FILE:LINE: message`.
    pub fn build(text: &str, file: &str, defines: &[(String, String)]) -> Result<Loaded, Vec<String>> {
        let base = std::path::Path::new(file).parent().map(|d| d.to_path_buf());
        let t = Instant::now();
        let parsed = xpf_conf::parse::parse_in(text, file, defines, base.as_deref());
        if !parsed.errors.is_empty() {
            return Err(parsed.errors.iter().map(|e| e.to_string()).collect());
        }
        let parse = t.elapsed();
        // A line that loads is enforced: what xpf cannot enforce is refused here.
        let (refused, warnings) = xpf_conf::support::refusals(&parsed);
        if !refused.is_empty() {
            return Err(refused.iter().map(|e| e.to_string()).collect());
        }
        let check = t.elapsed() - parse;
        let mut l = Self::compile(parsed, file)?;
        l.took = vec![("parse", parse), ("check", check), ("compile", t.elapsed() - parse - check)];
        l.warnings = warnings;
        if let Some(links) = &l.links {
            l.warnings.extend(xpf_conf::ifgroup::interface_warnings(&l.parsed, links));
        }
        Ok(l)
    }

    fn compile(parsed: Parsed, file: &str) -> Result<Loaded, Vec<String>> {
        // The links first: a change after this snapshot is seen as one (xpfd compiles again).
        let links = xpf_conf::ifgroup::Links::now().ok();
        let r = Ruleset::compile_on(&parsed, &ifindex_of, links.as_ref())
            .map_err(|e| vec![format!("{file}:{}: {}", e.line, e.msg)])?;
        if let Some((n, _)) = parsed.limits.iter().find(|(n, _)| !LIMITS.iter().any(|l| l.0 == n)) {
            return Err(vec![format!("{file}: set limit {n}: not a limit xpf knows")]);
        }
        table_limits(&parsed, &r, file).map_err(|e| vec![e])?;
        let mut names: Vec<String> = parsed
            .interface_names()
            .collect::<std::collections::HashSet<&str>>()
            .into_iter()
            .map(String::from)
            .collect();
        names.sort_unstable();
        let routes = Ruleset::uses_routes(&parsed);
        Ok(Loaded { parsed, ruleset: Some(r), warnings: Vec::new(), links, took: Vec::new(), names, routes })
    }

    pub fn limit(&self, name: &str) -> u32 {
        limit_of(&self.parsed, name)
    }

    /// Each of `workers`' share of `set limit NAME` (at least 1).
    pub fn share(&self, name: &str, workers: usize) -> u32 {
        (self.limit(name) / workers.max(1) as u32).max(1)
    }

    pub fn state_limit(&self) -> u32 {
        self.limit("states").max(1)
    }

    /// Reassembly on or off (`set reassemble`, pf's default yes) and each of `workers`'
    /// share of `set limit frags`.
    pub fn frags(&self, workers: usize) -> (bool, u32) {
        (self.parsed.reassemble != Some(false), self.share("frags", workers))
    }

    pub fn timeouts(&self) -> Timeouts {
        let mut t = Timeouts::default();
        for &(k, v) in &self.parsed.timeouts {
            t.set(k, v);
        }
        t
    }

    pub fn take_ruleset(mut self) -> (Ruleset, Loaded) {
        let r = self.ruleset.take().expect("compiled");
        (r, self)
    }
}

/// `set limit NAME` as the ruleset gives it, else pf's default.
fn limit_of(p: &Parsed, name: &str) -> u32 {
    let d = LIMITS.iter().find(|l| l.0 == name).map(|l| l.1).unwrap_or(0);
    p.limits.iter().rev().find(|(n, _)| n == name).map(|l| l.1).unwrap_or(d)
}

/// The tables `set limit tables` and `table-entries` count: those pf.conf declares or its
/// rules name, and pfctl's for address lists (`__automatic_N`); not xpf's own (`self`,
/// `(if)`, the routes').
fn counted_tables(r: &Ruleset) -> impl Iterator<Item = &(String, Arc<xpf_conf::compile::Table>)> {
    r.tables.iter().filter(|(n, _)| !n.starts_with("__") || n.starts_with("__automatic"))
}

/// pf refuses a ruleset whose tables pass `set limit tables` or whose addresses pass `set
/// limit table-entries`: the table that passes it, with where it is declared.
fn table_limits(p: &Parsed, r: &Ruleset, file: &str) -> Result<(), String> {
    let (most, most_entries) = (limit_of(p, "tables") as usize, limit_of(p, "table-entries") as usize);
    let at = |n: &str| match p.tables.iter().find(|t| t.name == n && t.line != 0) {
        Some(t) => format!("{}:{}: table <{n}>", t.file, t.line),
        None => format!("{file}: table <{n}>"),
    };
    let mut entries = 0;
    for (k, (n, t)) in counted_tables(r).enumerate() {
        if k + 1 > most {
            return Err(format!("{}: table {} of the ruleset, over set limit tables {most}", at(n), k + 1));
        }
        entries += t.len();
        if entries > most_entries {
            return Err(format!(
                "{}: {} addresses, {entries} in the tables so far, over set limit table-entries {most_entries}",
                at(n),
                t.len()
            ));
        }
    }
    Ok(())
}

/// Refuses translation rules where xpfd cannot keep them yet: with several workers (a
/// translated flow's replies would reach a worker without its state) and in packet mode
/// without its tcx program (`divert` false: replies to the host's own addresses stay with
/// the kernel). Names the first such rule.
pub fn translation_fits(l: &Loaded, workers: usize, divert: bool) -> Result<(), String> {
    use xpf_conf::ast::{HostKind, PoolKind};
    use xpf_conf::compile::{NatBare, NatFront, NatHosts, NatMap, NatPorts};
    for r in l.parsed.rules.iter().chain(&l.parsed.xrules).filter(|r| r.nat.is_some() || r.rdr.is_some()) {
        let why = if !divert {
            "translation (nat-to, rdr-to, binat-to) needs xpfd's XDP or tcx program; packet mode without it (no ifb devices here) cannot take replies to this host's addresses"
        } else if workers > 1
            && NatMap::of(r).is_none()
            && r.nat.as_ref().is_some_and(|p| p.port.is_some_and(|(a, b)| a == b))
        {
            // The replies' port names the worker that holds the state: the port must be one
            // the worker chose, or the address must map back to one inside address (binat-to).
            "nat-to with one port from many hosts runs on one worker for now (binat-to, and static-port from a network onto one as long, map host by host and run on several): start xpfd with --workers 1"
        } else if workers > 1
            && NatMap::of(r).is_none()
            && r.nat.as_ref().is_some_and(|p| p.static_port)
            && NatPorts::of(r).is_none()
        {
            // A kept port names the worker only if the flow was owned by it from the start:
            // the hand-off must know the hosts (NatPorts).
            "static-port from many hosts onto fewer addresses with several workers needs the rule's source written as an address or network (from NET; not any, a table, (if) or negated) and neither endpoint-independent nor sticky-address: each host's flows are owned by their port"
        } else if workers > 1 && r.nat.as_ref().is_some_and(|p| p.mape.is_some()) {
            // The workers share a range out by residue; a port set is not shared out yet.
            "map-e-portset runs on one worker for now: start xpfd with --workers 1"
        } else if workers > 1 && NatHosts::needed(r) && NatHosts::of(r).is_none() {
            // What is remembered per inside host is one worker's: every flow of the host must
            // meet it, so the hand-off must know the hosts (NatHosts).
            "endpoint-independent and sticky-address with several workers need the rule's source written as an address or network (from NET; not any, a table, (if) or negated): each host's flows are kept on one worker"
        } else if workers > 1
            && NatBare::of(r, None).is_some()
            && !r.on.as_ref().is_some_and(|i| !i.neg && i.name != "any")
        {
            // A flow without ports is owned by its far end: the end on the other side of the
            // interface the translation is on.
            "nat-to onto fewer addresses of protocols without ports (GRE, ESP, ...) with several workers needs the rule on an interface (on IF, or a group), or proto tcp, udp or icmp: each such flow is owned by the end beyond that interface"
        } else if workers > 1 && NatBare::of(r, None).is_some_and(|b| b.sticky) {
            // Its far end's worker, not its host's, chooses the address of such a flow.
            "sticky-address with several workers needs proto tcp, udp or icmp: a flow of a protocol without ports (GRE, ESP, ...) is owned by its far end, not by its inside host"
        } else if workers > 1
            && NatFront::shape(r).is_none()
            && r.rdr.as_ref().is_some_and(|p| {
                p.list.is_some()
                    || !matches!(p.host.kind, HostKind::Net(a, l)
                        if l == if a.is_ipv4() { 32 } else { 128 } || matches!(p.kind, PoolKind::None | PoolKind::Bitmask))
            })
        {
            // A target chosen per flow: its replies are owned by the public address, which
            // must be one, with TCP or UDP and a port or range (NatFront).
            "rdr-to over addresses chosen per flow (a list, a table, round-robin, random, ...) runs on several workers from one public address written in the rule, TCP or UDP, to a port or range; this one on one worker for now: start xpfd with --workers 1"
        } else {
            continue;
        };
        return Err(format!("{}:{}: {why}", r.file, r.line));
    }
    if workers > 1 {
        if let Some(rs) = &l.ruleset {
            maps_fit(rs)?;
            ports_fit(rs)?;
        }
    }
    Ok(())
}

/// Whether two networks overlap: the shorter one holds the other's address.
fn overlap((a, l): (std::net::IpAddr, u8), (b, m): (std::net::IpAddr, u8)) -> bool {
    let (net, len, x) = if l <= m { (a, l, b) } else { (b, m, a) };
    crate::handoff::Prefix::of(net, len).covers(x.is_ipv4(), &xpf_wire::Addr::from_ip(x).0)
}

/// With several workers, the hosts of a network translated keeping its ports (`NatPorts`)
/// have their flows owned by port; a map or a forwarding to one of them (owned by the flow's
/// two addresses) or a translation remembering per host (owned by the host) would need them
/// owned otherwise. Refused, naming the rule that keeps the ports.
fn ports_fit(rs: &Ruleset) -> Result<(), String> {
    use xpf_conf::compile::By;
    for p in &rs.nat_ports {
        let other = rs
            .nat_maps
            .iter()
            .find(|m| overlap(m.to, p.net))
            .map(|m| format!("a map's ({})", m.at))
            .or_else(|| {
                rs.nat_hosts
                    .iter()
                    .find(|h| overlap(h.net, p.net))
                    .map(|h| format!("a translation remembering per host's ({})", h.at))
            })
            .or_else(|| {
                rs.nat_owners
                    .iter()
                    .any(|t| matches!(t.by, By::Rdr(Some(to)) if overlap(to, p.net)))
                    .then(|| "a forwarding's target".to_string())
            });
        if let Some(other) = other {
            return Err(format!(
                "{}: with several workers, the hosts of {}/{} whose flows static-port keeps on their port's worker cannot also be {other}: start xpfd with --workers 1",
                p.at, p.net.0, p.net.1
            ));
        }
    }
    Ok(())
}

/// With several workers, a packet to an address a translation maps host by host (binat-to)
/// is owned by the flow it maps back to; another translation to the same addresses (a
/// `nat-to` pool, a port forwarding elsewhere, another map) would need its packets owned
/// otherwise. Refused, naming the map's line.
fn maps_fit(rs: &Ruleset) -> Result<(), String> {
    use xpf_conf::compile::By;
    for (i, m) in rs.nat_maps.iter().enumerate() {
        let clash = rs.nat_maps[..i].iter().find(|o| overlap(o.from, m.from) && o.to != m.to).map(|o| o.at.clone());
        let other = rs.nat_owners.iter().find(|t| {
            let net = t.net.unwrap_or(if t.af == xpf_wire::pdesc::AF_INET {
                (std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED.into(), 0)
            });
            overlap(net, m.from)
                && match t.by {
                    By::Map => false,
                    // binat-to's in half: the map's own way back.
                    By::Rdr(Some(to)) => to != m.to,
                    By::Nat | By::Rdr(None) => true,
                }
        });
        if clash.is_some() || other.is_some() {
            return Err(format!(
                "{}: with several workers, the addresses {}/{} this maps host by host cannot also be another translation's{}: start xpfd with --workers 1",
                m.at,
                m.from.0,
                m.from.1,
                clash.map_or(String::new(), |at| format!(" ({at})"))
            ));
        }
    }
    Ok(())
}

/// Refuses queues on an interface xpfd does not forward on (nothing would leave through
/// them), naming the queue's line.
pub fn queues_fit(p: &Parsed, ifaces: &[String]) -> Result<(), String> {
    for q in p.queues.iter().filter(|q| q.parent.is_none()) {
        if let Some(on) = q.on.as_deref().filter(|on| !ifaces.iter().any(|i| i == on)) {
            return Err(format!(
                "{}:{}: queue {} on {on}: xpfd forwards on {} only",
                q.file,
                q.line,
                q.name,
                ifaces.join(", ")
            ));
        }
    }
    Ok(())
}

/// Queue counters by (interface, queue), summed over the workers.
type QueueSums = std::collections::HashMap<(String, String), xpf_shape::QueueStats>;

/// A rate in bits per second as pfctl shows one (`12.34Mb`).
fn rate_text(bps: f64) -> String {
    for (m, u) in [(1e9, "Gb"), (1e6, "Mb"), (1e3, "Kb")] {
        if bps >= m {
            return format!("{:.2}{u}", bps / m);
        }
    }
    format!("{bps:.2}b")
}

/// Rows of (key, text, value) as a JSON object by key.
fn by_key(rows: &[(&str, &str, u64)]) -> serde_json::Map<String, Value> {
    rows.iter().map(|(k, _, v)| (k.to_string(), json!(v))).collect()
}

/// Refuses `pflow` (a rule's, or `set state-defaults pflow`) when no collector takes the
/// flows: xpfd was started without --pflow.
pub fn pflow_fits(p: &Parsed, exporting: bool) -> Result<(), String> {
    if exporting {
        return Ok(());
    }
    let why = "pflow: xpfd exports flows only to a collector: start it with --pflow HOST:PORT";
    if let Some(r) = p.rules.iter().find(|r| r.state_opts.pflow) {
        return Err(format!("{}:{}: {why}", r.file, r.line));
    }
    if p.state_defaults.pflow {
        let (file, line) = p
            .settings
            .iter()
            .find(|s| s.0.starts_with("set state-defaults"))
            .map_or((Arc::from("?"), 0), |s| (s.1.clone(), s.2));
        return Err(format!("{file}:{line}: {why}"));
    }
    Ok(())
}

/// One line of what a load changed: rules (and how many came and went, by their text),
/// translation rules, tables (and their entries), set options.
/// Rulesets up to this many rules get "+added -removed" in the load's log line.
const DIFF_UP_TO: usize = 100_000;

/// A load's steps as the log says them: ` in 7.1 s (read 0.1, parse 3.2, ...)`; empty for a
/// compile of the ruleset in force (nothing was read).
fn took(steps: &[(&str, Duration)], install: Duration) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let total: Duration = steps.iter().map(|s| s.1).sum::<Duration>() + install;
    let each: Vec<String> =
        steps.iter().chain([&("install", install)]).map(|(n, d)| format!("{n} {:.2}", d.as_secs_f64())).collect();
    format!(" in {:.2} s ({})", total.as_secs_f64(), each.join(", "))
}

fn change_summary(old: &Parsed, old_r: &Ruleset, new: &Parsed, new_r: &Ruleset) -> String {
    use std::collections::HashMap;
    let count = |rs: &[xpf_conf::ast::Rule]| {
        let mut m: HashMap<String, i64> = HashMap::new();
        for r in rs {
            *m.entry(xpf_conf::print::rule(r)).or_default() += 1;
        }
        m
    };
    let diff = |a: &[xpf_conf::ast::Rule], b: &[xpf_conf::ast::Rule]| {
        // Comparing by printed text costs about 1.7 us a rule (5.4 s for two 1.6M-rule
        // rulesets, as long as the load itself): large rulesets get their counts only.
        if a.len().max(b.len()) > DIFF_UP_TO {
            return format!("{} (was {})", b.len(), a.len());
        }
        let (ma, mb) = (count(a), count(b));
        let gone: i64 = ma.iter().map(|(k, n)| (n - mb.get(k).copied().unwrap_or(0)).max(0)).sum();
        let came: i64 = mb.iter().map(|(k, n)| (n - ma.get(k).copied().unwrap_or(0)).max(0)).sum();
        format!("{} (+{came} -{gone})", b.len())
    };
    let tables = |r: &Ruleset| -> Vec<(String, usize)> {
        r.tables.iter().filter(|(n, _)| !n.starts_with("__")).map(|(n, t)| (n.clone(), t.len())).collect()
    };
    let (ta, tb) = (tables(old_r), tables(new_r));
    let mut changed: Vec<String> = Vec::new();
    for (n, len) in &tb {
        match ta.iter().find(|(m, _)| m == n) {
            None => changed.push(format!("<{n}> new, {len} entries")),
            Some((_, was)) if was != len => changed.push(format!("<{n}> {was} -> {len} entries")),
            _ => {}
        }
    }
    for (n, _) in ta.iter().filter(|(n, _)| !tb.iter().any(|(m, _)| m == n)) {
        changed.push(format!("<{n}> gone"));
    }
    let sets = old.header.iter().filter(|h| h.starts_with("set ")).collect::<Vec<_>>()
        != new.header.iter().filter(|h| h.starts_with("set ")).collect::<Vec<_>>();
    // How first packets find their rules, and what the classifier holds.
    let lookup = match new_r.classifier_stats(xpf_wire::pdesc::AF_INET) {
        Some((shapes, bytes, _)) => format!(", classifier {shapes} shapes {} KiB", bytes >> 10),
        None => String::new(),
    };
    format!(
        "rules {}{lookup}, translation rules {}, tables {}{}{}",
        diff(&old.rules, &new.rules),
        diff(&old.xrules, &new.xrules),
        tb.len(),
        if changed.is_empty() { String::new() } else { format!(" ({})", changed.join(", ")) },
        if sets { ", set options changed" } else { "" }
    )
}

/// Tells the steering programs which of this host's addresses and ports translated traffic
/// goes to (their shared map natdst).
pub fn write_nat_targets(r: &Ruleset, steers: &[(String, Steer)], skb: Option<&NatMaps>) -> Result<(), String> {
    let ts: Vec<xpf_xdp::steer::NatTarget> = r
        .nat_targets
        .iter()
        .map(|t| {
            let (addr, len) = t.net.map_or(([0u8; 16], 0), |(a, l)| (xpf_wire::Addr::from_ip(a).0, l));
            let family = if t.af == xpf_wire::pdesc::AF_INET { libc::AF_INET } else { libc::AF_INET6 } as u8;
            xpf_xdp::steer::NatTarget { family, proto: t.proto, addr, len, port: t.port, lo: t.lo, hi: t.hi }
        })
        .collect();
    let e = |e: std::io::Error| format!("translation targets: {e}");
    if let Some((_, s)) = steers.first() {
        s.set_nat_targets(&ts).map_err(e)?;
    }
    if let Some((net, port)) = skb {
        xpf_xdp::steer::set_nat_targets(net, port, &ts).map_err(e)?;
    }
    Ok(())
}

/// Packet mode's maps of translation targets (`natnet`, `natport` of its tcx program).
pub type NatMaps = (xpf_xdp::bpf::Map, xpf_xdp::bpf::Map);

pub struct Daemon {
    file: String,
    defines: Vec<(String, String)>,
    /// Anchors loaded at run time (`xpfctl -a`).
    pub(crate) anchors: crate::anchors::Anchors,
    pub(crate) loaded: Loaded,
    pub(crate) slot: Arc<Slot>,
    workers: Vec<Sender<Cmd>>,
    pub(crate) steers: Arc<Mutex<Vec<(String, Steer)>>>,
    /// The interfaces xpfd filters (queues go on these only).
    pub ifaces: Vec<String>,
    /// The queues' counters at the last `-s queue` (what -v measures against).
    queues_seen: Option<(Instant, QueueSums)>,
    pub(crate) start: Instant,
    /// pf's status (`-e`, `-d`), shared with the workers' policies.
    pub status: Arc<crate::policy::Status>,
    /// State sync's counters, when --sync-dev is on.
    pub sync: Option<Arc<crate::sync::Shared>>,
    /// Which interfaces take the fast path's redirected frames (fast path on).
    pub egresses: Option<Arc<crate::fastpath::Egresses>>,
    /// Packet mode's fast path: its programs' counters (`skb_stats`).
    pub skb_stats: Option<xpf_xdp::bpf::Map>,
    /// Packet mode's translation targets, written at each load.
    pub skb_nat: Option<NatMaps>,
    /// pflog's counters.
    pub pflog: Option<Arc<crate::pflog::Shared>>,
    /// pflow's counters, when --pflow is on (rules with `pflow` are refused without it).
    pub pflow: Option<Arc<crate::pflow::Shared>>,
    /// What the interface names of the ruleset in force stood for when it was installed
    /// ([`Daemon::interface_resolution`]): xpfd compiles again when this changes.
    pub(crate) resolved: Option<u64>,
    /// The rules' packets and bytes at the last `-z`, per list of rules
    /// ([`xpf_conf::Ruleset::rule_lists`]): what the readers subtract while the list is in force.
    rules_zeroed: std::collections::HashMap<usize, RuleSums>,
    /// Who loaded each list of rules in force (pf's `cpid`): the pid of the `xpfctl` whose
    /// request loaded it, or xpfd's own for what it loaded itself (at start, on SIGHUP).
    pub(crate) inserted: std::collections::HashMap<usize, u32>,
    /// The pid of the client whose request is being answered (xpfd's own between requests).
    caller: u32,
}

fn ask<T>(workers: &[Sender<Cmd>], mk: impl Fn(Sender<T>) -> Cmd) -> Result<Vec<T>, String> {
    let mut rxs = Vec::new();
    for w in workers {
        let (tx, rx) = mpsc::channel();
        w.send(mk(tx)).map_err(|_| "a worker has stopped".to_string())?;
        rxs.push(rx);
    }
    rxs.into_iter()
        .map(|rx| rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "a worker did not answer in 10 s".to_string()))
        .collect()
}

fn parse_host(s: &str) -> Result<(IpAddr, u8), String> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().map_err(|_| format!("{s}: bad prefix length"))?)),
        None => (s, None),
    };
    let ip: IpAddr =
        a.parse().map_err(|_| format!("{s}: not an IPv4 or IPv6 address (host names are not resolved)"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let l = l.unwrap_or(max);
    if l > max {
        return Err(format!("{s}: prefix longer than {max}"));
    }
    Ok((ip, l))
}

fn hms(s: u32) -> String {
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// A time in seconds since the epoch as pfctl prints one (ctime's form, local time).
fn clock_time(secs: u64) -> String {
    let t = secs as libc::time_t;
    // SAFETY: localtime_r fills the tm we own; strftime writes at most buf.len() bytes.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return secs.to_string();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c"%a %b %e %H:%M:%S %Y".as_ptr(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// A protocol as pfctl names it in a state (OpenBSD's /etc/protocols: `gre`, `esp`), else
/// its number.
fn proto_name(p: u8) -> String {
    xpf_conf::names::proto_name(p).map_or_else(|| p.to_string(), str::to_string)
}

/// One `pfctl -ss` line (and with `verbose`, pfctl -v's second line).
pub fn state_text(r: &StateRow, verbose: u8) -> String {
    // pfctl shows the peers from the point of view of the state's direction.
    let (a, b) = if r.out { (r.src_state, r.dst_state) } else { (r.dst_state, r.src_state) };
    let names = |x: u8| -> &'static str {
        if r.proto == 6 {
            xpf_engine::proto::tcps::NAMES.get(x as usize).copied().unwrap_or("?")
        } else {
            ["NO_TRAFFIC", "SINGLE", "MULTIPLE"].get(x as usize).copied().unwrap_or("?")
        }
    };
    let proxy = r.proto == 6 && r.src_state.max(r.dst_state) >= xpf_engine::synproxy::PROXY_SRC;
    let peers = if r.proto == 1 || r.proto == 58 {
        format!("{}:{}", a, b)
    } else if proxy {
        // A handshake synproxy holds: pfctl names the stage alone.
        names(r.src_state.max(r.dst_state)).to_string()
    } else {
        format!("{}:{}", names(a), names(b))
    };
    let mut s = format!(
        "{} {} {} {} {}       {}",
        r.ifname,
        proto_name(r.proto),
        r.left,
        if r.out { "->" } else { "<-" },
        r.right,
        peers
    );
    if verbose > 0 {
        let _ = write!(
            s,
            "\n   age {}, expires in {}, {}:{} pkts, {}:{} bytes",
            hms(r.age),
            hms(r.expires_in),
            r.packets[0],
            r.packets[1],
            r.bytes[0],
            r.bytes[1],
        );
        // pfctl leaves out the rule of a state that has none (a `nat pass` one's).
        if r.rule != u32::MAX {
            let _ = write!(s, ", rule {}", r.rule);
        }
    }
    // pfctl -vv names the state's next hop (on its id line, which xpf does not print).
    if let Some(rt) = r.route.as_ref().filter(|_| verbose > 1) {
        let _ = write!(s, "\n   {rt}");
    }
    s
}

impl Daemon {
    pub fn new(
        file: String,
        defines: Vec<(String, String)>,
        loaded: Loaded,
        slot: Arc<Slot>,
        workers: Vec<Sender<Cmd>>,
        steers: Arc<Mutex<Vec<(String, Steer)>>>,
    ) -> Daemon {
        Daemon {
            file,
            defines,
            anchors: Default::default(),
            loaded,
            slot,
            workers,
            steers,
            ifaces: Vec::new(),
            queues_seen: None,
            start: Instant::now(),
            status: Default::default(),
            sync: None,
            egresses: None,
            resolved: None,
            skb_stats: None,
            skb_nat: None,
            pflog: None,
            pflow: None,
            rules_zeroed: Default::default(),
            inserted: Default::default(),
            caller: std::process::id(),
        }
    }

    /// Whether the ruleset in force (its anchors loaded with -a included) names `self` or
    /// `(if)` addresses, which follow the interfaces' addresses: as rule addresses, in
    /// translation and routing pools, in translation rules.
    pub fn follows_addresses(&self) -> bool {
        // The anchors loaded with -a too: a recompile compiles them again.
        self.loaded.parsed.follows_addresses() || self.anchors.loads.values().any(|a| a.parsed.follows_addresses())
    }

    /// What the interface names of the main ruleset in force stand for in `links`, hashed
    /// (xpf_conf::ifgroup::Links::resolution): it is compiled again when this changes (an
    /// interface it names appears or comes back, a group's members change). Anchors loaded
    /// with -a name neither groups nor absent interfaces (refused at their line) and are
    /// left out: their loads do not move what the main ruleset was compiled against.
    pub fn interface_resolution(&self, links: &xpf_conf::ifgroup::Links) -> u64 {
        links.resolution(self.loaded.names.iter().map(String::as_str))
    }

    /// The links as the compile of the ruleset in force saw them.
    pub(crate) fn loaded_links(&self) -> Option<xpf_conf::ifgroup::Links> {
        self.loaded.links.clone()
    }

    /// Notes what the names of the ruleset just installed stood for in `links`, the snapshot
    /// read before it was compiled.
    pub(crate) fn note_resolution(&mut self, links: Option<&xpf_conf::ifgroup::Links>) {
        self.resolved = links.map(|l| self.interface_resolution(l));
    }

    /// Whether the ruleset in force tests routes (`no-route`, `urpf-failed`).
    pub fn follows_routes(&self) -> bool {
        self.loaded.routes
    }

    /// Compiles the ruleset in force again (its tables as they are now) for the interfaces'
    /// current addresses.
    pub fn recompile(&mut self) -> Result<u64, Vec<String>> {
        let mut l = Loaded::compile(self.loaded.parsed.clone(), &self.file)?;
        if let Some(r) = l.ruleset.as_mut() {
            r.keep_runtime(&self.slot.current().1);
        }
        self.install(l)
    }

    /// Loads the daemon's own file again (SIGHUP).
    pub fn reload_file(&mut self) -> Result<u64, Vec<String>> {
        let f = self.file.clone();
        self.load(&f, false, &[])
    }

    /// Parses, compiles and installs `file`; on any error nothing changes.
    /// `defines`: xpfctl's -D for this load, over xpfd's own.
    pub fn load(&mut self, file: &str, noaction: bool, defines: &[(String, String)]) -> Result<u64, Vec<String>> {
        let t = Instant::now();
        let text = std::fs::read_to_string(file).map_err(|e| vec![format!("{file}: {e}")])?;
        let read = t.elapsed();
        let mut l = Loaded::build(&text, file, &self.defines_with(defines))?;
        drop(text);
        l.took.insert(0, ("read", read));
        for w in &l.warnings {
            log::warn!("{w}");
        }
        if noaction {
            return Ok(self.slot.generation());
        }
        self.install(l)
    }

    /// xpfd's -D macros with `extra` over them (a name in both takes `extra`'s value).
    pub(crate) fn defines_with(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
        let mut d: Vec<(String, String)> =
            self.defines.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).cloned().collect();
        d.extend(extra.iter().cloned());
        d
    }

    fn install(&mut self, l: Loaded) -> Result<u64, Vec<String>> {
        let t0 = Instant::now();
        // What xpfd cannot keep is refused before anything changes.
        pflow_fits(&l.parsed, self.pflow.is_some()).map_err(|e| vec![e])?;
        let divert = !self.steers.lock().unwrap().is_empty() || self.skb_nat.is_some();
        translation_fits(&l, self.workers.len(), divert).map_err(|e| vec![e])?;
        queues_fit(&l.parsed, &self.ifaces).map_err(|e| vec![e])?;
        let per = (l.state_limit() / self.workers.len() as u32).max(1);
        let t = l.timeouts();
        let frags = l.frags(self.workers.len());
        let cookies = l.parsed.syncookies.unwrap_or_default();
        let src_nodes = l.share("src-nodes", self.workers.len());
        let results = ask(&self.workers, |done| Cmd::Limits {
            states: per,
            timeouts: t.clone(),
            frags,
            cookies,
            src_nodes,
            done,
        })
        .map_err(|e| vec![e])?;
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(vec![format!("{}: {e}", self.file)]);
        }
        let (r, l) = l.take_ruleset();
        let (r, dropped) = self.anchors.apply(r)?;
        write_nat_targets(&r, &self.steers.lock().unwrap(), self.skb_nat.as_ref()).map_err(|e| vec![e])?;
        let summary = change_summary(&self.loaded.parsed, &self.slot.current().1, &l.parsed, &r);
        if let Some(level) = l.parsed.debug.as_deref().and_then(crate::logging::level_of) {
            log::set_max_level(level);
        }
        let links = l.links.clone();
        let steps = took(&l.took, t0.elapsed());
        // The parse tree replaced goes with the ruleset replaced, freed off the reply's time.
        let old = std::mem::replace(&mut self.loaded, l);
        let g = self.put(r, Some(Box::new(old)));
        log::info!("ruleset generation {g}: {summary}{steps}");
        self.anchors.forget(&dropped);
        self.note_resolution(links.as_ref());
        Ok(g)
    }

    pub(crate) fn snapshot(&self) -> Result<Snapshot, String> {
        let parts = ask(&self.workers, Cmd::Snapshot)?;
        let mut info = Info::default();
        let mut io = IoStats::default();
        let mut xs = Vec::new();
        let mut pc: Vec<(u32, [u64; 8])> = Vec::new();
        for (i, o, x, c) in parts {
            info.add(&i);
            io.add(&o);
            xs.extend(x);
            for (ifindex, c) in c {
                match pc.iter_mut().find(|e| e.0 == ifindex) {
                    Some(e) => e.1.iter_mut().zip(c).for_each(|(a, b)| *a += b),
                    None => pc.push((ifindex, c)),
                }
            }
        }
        Ok((info, io, xs, pc))
    }

    /// Per rule, its packets and bytes in and out since its load or the last `-z`, its states
    /// now and the states it made (pf's rule counters), summed over the workers: each walks
    /// its state tables a slice a round, without making rows, and adds its tallies of the
    /// states that ended and the packets decided without a state.
    pub(crate) fn rule_sums(&self) -> Result<RuleSums, String> {
        let mut all = self.rule_counts()?;
        if !self.rules_zeroed.is_empty() {
            let lists = self.slot.current().1.rule_lists();
            for (nr, c) in all.iter_mut() {
                let base = RuleList::find(&lists, *nr).and_then(|l| self.rules_zeroed.get(&l.id)?.get(nr));
                if let Some(b) = base {
                    *c = c.since(b);
                }
            }
        }
        Ok(all)
    }

    /// Installs `r` (the ruleset `with` goes with the one it replaces) and notes who loaded
    /// the lists of rules it brings.
    pub(crate) fn put(&mut self, r: Ruleset, with: Option<Box<dyn Send>>) -> u64 {
        let g = crate::retire::install(&self.slot, r, with);
        // A list's identity is its address: what the lists gone had goes now, before an
        // address freed may be a later list's.
        let lists = self.slot.current().1.rule_lists();
        self.inserted.retain(|id, _| lists.iter().any(|l| l.id == *id));
        self.rules_zeroed.retain(|id, _| lists.iter().any(|l| l.id == *id));
        for l in lists {
            self.inserted.entry(l.id).or_insert(self.caller);
        }
        g
    }

    /// [`Daemon::rule_sums`] since the load.
    fn rule_counts(&self) -> Result<RuleSums, String> {
        let mut all = RuleSums::default();
        for m in ask(&self.workers, Cmd::RuleSums)? {
            for (rule, v) in m {
                all.entry(rule).or_default().merge(&v);
            }
        }
        Ok(all)
    }

    /// `pfctl -z`: the rules' evaluations, packets and bytes read 0 from now on (their states
    /// and state creations stay, as pf's).
    fn zero_rules(&mut self) -> Result<(), String> {
        let (_, cur) = self.slot.current();
        cur.zero_evaluations();
        let lists = cur.rule_lists();
        self.rules_zeroed.clear();
        for (nr, c) in self.rule_counts()? {
            if let Some(l) = RuleList::find(&lists, nr) {
                self.rules_zeroed.entry(l.id).or_default().insert(nr, c);
            }
        }
        Ok(())
    }

    /// Translation's port use per (address, protocol class), summed over the workers.
    pub(crate) fn nat_ports(&self) -> Result<Vec<(IpAddr, u8, u64, u64)>, String> {
        let mut all: Vec<(IpAddr, u8, u64, u64)> = Vec::new();
        for v in ask(&self.workers, Cmd::NatPorts)? {
            for (a, c, u, n) in v {
                match all.iter_mut().find(|e| (e.0, e.1) == (a, c)) {
                    Some(e) => (e.2, e.3) = (e.2 + u, e.3 + n),
                    None => all.push((a, c, u, n)),
                }
            }
        }
        all.sort();
        Ok(all)
    }

    fn states(&self) -> Result<Vec<StateRow>, String> {
        let mut names = std::collections::HashMap::new();
        let routes = self.slot.current().1.routes.clone();
        Ok(ask(&self.workers, Cmd::States)?.into_iter().flatten().map(|r| r.row(&mut names, &routes)).collect())
    }

    pub fn handle(&mut self, req: &Value) -> Result<(String, Value), String> {
        let op = req["op"].as_str().unwrap_or("");
        let verbose = req["verbose"].as_u64().unwrap_or(0) as u8;
        log::debug!("control: {op} {}", req["what"].as_str().or(req["file"].as_str()).unwrap_or(""));
        match op {
            "debug" => {
                // pfctl -x LEVEL: the level of xpfd's own messages until the next load that
                // says `set debug`.
                let v = req["level"].as_str().unwrap_or("");
                let l = crate::logging::level_of(v)
                    .ok_or_else(|| format!("-x {v}: emerg, alert, crit, err, warning, notice, info or debug"))?;
                log::set_max_level(l);
                log::info!("debug level {} (xpfctl -x)", crate::logging::level_name());
                Ok((String::new(), json!({"level": crate::logging::level_name()})))
            }
            "zero" => {
                self.zero_rules()?;
                Ok(("rule statistics cleared\n".into(), json!({"zeroed": true})))
            }
            "show" => {
                // What the client prints: a million states' JSON costs seconds to build and
                // to read back when only their text is wanted, and the other way round.
                let want = match req["want"].as_str() {
                    Some("text") => Want::Text,
                    Some("data") => Want::Data,
                    _ => Want::Both,
                };
                let what = req["what"].as_str().unwrap_or("");
                if what == "rules" {
                    return self.show_rules(req["anchor"].as_str(), verbose);
                }
                if what == "Anchors" {
                    return self.show_anchors(req["anchor"].as_str(), verbose);
                }
                if req["anchor"].is_string() {
                    return Err(format!("-a with -s {what}: only -s rules and -s Anchors take an anchor"));
                }
                self.show(what, verbose, want)
            }
            "load" => {
                let file = req["file"].as_str().ok_or("load: no file")?;
                let noaction = req["noaction"].as_bool().unwrap_or(false);
                // xpfctl's -D: [[name, value], ...].
                let defines: Vec<(String, String)> = req["defines"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| Some((d[0].as_str()?.to_string(), d[1].as_str()?.to_string())))
                    .collect();
                if let Some(a) = req["anchor"].as_str() {
                    return self.load_anchor(a, file, noaction, &defines);
                }
                match self.load(file, noaction, &defines) {
                    Ok(g) if noaction => Ok((String::new(), json!({"generation": g, "loaded": false}))),
                    Ok(g) => {
                        if file != self.file {
                            log::info!("loaded {file} (generation {g})");
                        }
                        Ok((String::new(), json!({"generation": g, "loaded": true, "warnings": self.loaded.warnings})))
                    }
                    Err(e) => Err(e.join("\n")),
                }
            }
            "kill" => {
                let mut sel = Select::default();
                if let Some(label) = req["label"].as_str() {
                    let (_, cur) = self.slot.current();
                    let rules: Vec<u32> =
                        self.labelled(&cur).into_iter().filter(|(_, l, _)| l == label).map(|(nr, _, _)| nr).collect();
                    if rules.is_empty() {
                        return Err(format!("no rule has label \"{label}\""));
                    }
                    let mut n = 0;
                    for r in rules {
                        sel.rule = Some(r);
                        n += ask(&self.workers, |tx| Cmd::Kill(sel.clone(), tx))?.iter().sum::<u32>();
                    }
                    return Ok((format!("killed {n} states\n"), json!({"killed": n})));
                }
                let hosts: Vec<&str> =
                    req["hosts"].as_array().map(|a| a.iter().filter_map(|h| h.as_str()).collect()).unwrap_or_default();
                if hosts.is_empty() || hosts.len() > 2 {
                    return Err("kill: one or two hosts (-k src [-k dst]), or a label".into());
                }
                sel.src = Some(parse_host(hosts[0])?);
                if let Some(d) = hosts.get(1) {
                    sel.dst = Some(parse_host(d)?);
                }
                let n: u32 = ask(&self.workers, |tx| Cmd::Kill(sel.clone(), tx))?.iter().sum();
                let what = hosts.join(" -> ");
                Ok((format!("killed {n} states from host {what}\n"), json!({"killed": n})))
            }
            "killsrc" => {
                // pfctl -K host|network [-K host|network]: the source nodes of those sources
                // go (with a second, those of `sticky-address` whose address is in it); their
                // states stay, no longer counted to a node.
                let hosts: Vec<&str> =
                    req["hosts"].as_array().map(|a| a.iter().filter_map(|h| h.as_str()).collect()).unwrap_or_default();
                let (src, dst) = match hosts[..] {
                    [h] => (parse_host(h)?, None),
                    [h, d] => (parse_host(h)?, Some(parse_host(d)?)),
                    _ => return Err("-K: one or two hosts or networks (source, then translation address)".into()),
                };
                let n: u32 = ask(&self.workers, |tx| Cmd::KillSources(Some(src), dst, tx))?.iter().sum();
                Ok((
                    format!("killed {n} src nodes from 1 sources and {} destinations\n", dst.is_some() as u8),
                    json!({"killed": n}),
                ))
            }
            "flush" => {
                let what = req["what"].as_str().unwrap_or("");
                if let Some(a) = req["anchor"].as_str() {
                    if what != "rules" {
                        return Err(format!("-a {a} -F {what}: an anchor's rules only (-F rules)"));
                    }
                    return self.flush_anchor(a);
                }
                let mut text = String::new();
                let mut data = json!({});
                if matches!(what, "rules" | "all") {
                    let p = xpf_conf::parse::parse("", &self.file, &[]);
                    let l = Loaded::compile(p, &self.file).map_err(|e| e.join("\n"))?;
                    // Keep the limits and timeouts: pfctl -F rules empties the rules only.
                    let mut l = l;
                    l.parsed.limits = self.loaded.parsed.limits.clone();
                    l.parsed.timeouts = self.loaded.parsed.timeouts.clone();
                    self.install(l).map_err(|e| e.join("\n"))?;
                    text.push_str("rules cleared\n");
                }
                if matches!(what, "states" | "all") {
                    let n: u32 = ask(&self.workers, Cmd::Flush)?.iter().sum();
                    let _ = writeln!(text, "{n} states cleared");
                    data = json!({"states_cleared": n});
                }
                if matches!(what, "Sources" | "all") {
                    // pfctl -F Sources: every source node, `sticky-address`'s too.
                    let n: u32 = ask(&self.workers, |tx| Cmd::KillSources(None, None, tx))?.iter().sum();
                    text.push_str("source tracking entries cleared\n");
                    data["sources_cleared"] = json!(n);
                }
                if text.is_empty() {
                    return Err(format!("flush {what}: states, Sources, rules or all"));
                }
                Ok((text, data))
            }
            "table" => self.table(req),
            "status" => {
                // pfctl -e, -d: the workers read it before each batch (Live::skip).
                let on = req["enabled"].as_bool().ok_or("status: enabled true|false")?;
                if !self.status.set(on) {
                    return Err(if on { "pf already enabled" } else { "pf not enabled" }.into());
                }
                log::info!(
                    "pf {}",
                    if on {
                        "enabled"
                    } else {
                        "disabled: every packet passes unfiltered, without states or translation"
                    }
                );
                Ok((String::new(), json!({"enabled": on})))
            }
            "steer" => {
                // Maintenance and the lab: take the steering programs off (the kernel forwards
                // unfiltered, by its own rules) or put them back.
                let on = req["on"].as_bool().ok_or("steer: on true|false")?;
                let bare = req["bare"].as_bool().unwrap_or(false);
                let mut st = self.steers.lock().unwrap();
                if st.is_empty() {
                    return Err("steer: xpfd runs in packet mode (no steering program to switch)".into());
                }
                for (name, s) in st.iter_mut() {
                    s.set_bare(on && bare).map_err(|e| format!("{name}: {e}"))?;
                    if on {
                        let idx = xpf_xdp::netlink::ifindex(name).map_err(|e| e.to_string())?;
                        s.attach(idx).map_err(|e| format!("{name}: {e}"))?;
                    } else {
                        s.detach_all();
                    }
                }
                xpf_xdp::nfqueue::HostRules::forward_guard(on).map_err(|e| format!("steer: {e}"))?;
                log::info!(
                    "steering {}",
                    match (on, bare) {
                        (true, false) => "on",
                        (true, true) => "bare: XDP forwards everything routable, unfiltered (measurement)",
                        _ => "off: the kernel forwards unfiltered",
                    }
                );
                Ok((String::new(), json!({"steering": on})))
            }
            _ => Err(format!("unknown request '{op}'")),
        }
    }

    /// Adds hosts to a table as `-T add` does (the `overload` action).
    pub fn table_add(&mut self, name: &str, addrs: &[IpAddr]) -> Result<u64, String> {
        let hosts: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let (_, v) = self.table(&json!({"name": name, "cmd": "add", "addrs": hosts}))?;
        Ok(v["changed"].as_u64().unwrap_or(0))
    }

    fn table(&mut self, req: &Value) -> Result<(String, Value), String> {
        let name = req["name"].as_str().ok_or("table: no name")?.to_string();
        let cmd = req["cmd"].as_str().unwrap_or("show");
        let addrs: Vec<(IpAddr, u8)> = req["addrs"]
            .as_array()
            .map(|a| a.iter().filter_map(|h| h.as_str()).map(parse_host).collect::<Result<_, _>>())
            .transpose()?
            .unwrap_or_default();
        let (_, cur) = self.slot.current();
        let Some((_, t)) = cur.tables.iter().find(|t| t.0 == name) else {
            return Err(format!("table <{name}> does not exist (declare it in pf.conf)"));
        };
        let norm = |(a, l): (IpAddr, u8)| (crate::dataplane::masked(a, l), l);
        let fmt = |a: IpAddr, l: u8, neg: bool| {
            let full = if a.is_ipv4() { 32 } else { 128 };
            format!("{}{a}{}", if neg { "!" } else { "" }, if l == full { String::new() } else { format!("/{l}") })
        };
        match cmd {
            "show" => {
                let mut entries = t.entries();
                let verbose = req["verbose"].as_u64().unwrap_or(0) > 0;
                // A `counters` table: its entries' packets decided without a state, and its
                // rules' states now (a walk of the state tables).
                if verbose && t.counted() {
                    let mut sums = EntrySums::new();
                    for m in ask(&self.workers, Cmd::TableSums)? {
                        for (k, v) in m {
                            add_counts(sums.entry(k).or_default(), &v);
                        }
                    }
                    for e in &mut entries {
                        if let (Some(c), Some(v)) = (&mut e.counts, sums.get(&(name.clone(), e.addr, e.len))) {
                            add_counts(c, v);
                        }
                    }
                }
                let mut text = String::new();
                for e in &entries {
                    let _ = writeln!(text, "   {}", fmt(e.addr, e.len, e.neg));
                    if verbose {
                        let _ = writeln!(text, "\tCleared:     {}", clock_time(e.cleared));
                        for ((row, _), [p, b]) in e.counts.iter().flat_map(|c| ENTRY_COUNTER_ROWS.iter().zip(*c)) {
                            let _ = writeln!(text, "\t{row:<12} [ Packets: {p:<18} Bytes: {b:<18} ]");
                        }
                        let _ = writeln!(text, "\tMatches: {}", e.matches);
                    }
                }
                let data: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let mut v = json!({"addr": e.addr.to_string(), "prefix": e.len, "negated": e.neg,
                            "matches": e.matches, "cleared": e.cleared});
                        if let Some(c) = e.counts {
                            v["counters"] = ENTRY_COUNTER_ROWS
                                .iter()
                                .zip(c)
                                .map(|((_, k), [p, b])| (k.to_string(), json!({"packets": p, "bytes": b})))
                                .collect();
                        }
                        v
                    })
                    .collect();
                Ok((text, json!({"table": name, "counters": t.counted(), "entries": data})))
            }
            "test" => {
                let mut text = String::new();
                let mut hits = 0;
                for &(a, _) in &addrs {
                    let x = match a {
                        IpAddr::V4(v) => xpf_wire::Addr::v4(v.octets()),
                        IpAddr::V6(v) => xpf_wire::Addr(v.octets()),
                    };
                    let af = if a.is_ipv4() { xpf_wire::pdesc::AF_INET } else { xpf_wire::pdesc::AF_INET6 };
                    if t.holds(&x, af) {
                        hits += 1;
                        let _ = writeln!(text, "{a}");
                    }
                }
                let _ = writeln!(text, "{hits}/{} addresses match.", addrs.len());
                if hits < addrs.len() {
                    return Err(text.trim_end().to_string());
                }
                Ok((text, json!({"matched": hits, "tested": addrs.len()})))
            }
            "add" | "delete" | "replace" | "flush" | "zero" | "expire"
                if self.loaded.parsed.tables.iter().any(|t| t.name == name && t.konst) && cmd != "zero" =>
            {
                Err(format!("-T {cmd}: table <{name}> is const"))
            }
            _ if !self.loaded.parsed.tables.iter().any(|t| t.name == name) => {
                Err(format!("table <{name}> was made by a rule; declare it in pf.conf to change it"))
            }
            "add" | "delete" | "replace" | "flush" | "zero" | "expire" => {
                // The changed copy replaces the table in force; rules, counters and states
                // stay, and the workers take it at their next batch (no recompile).
                let now = xpf_conf::compile::unix_now();
                let before = t.len();
                let (tb, verb, changed) = match cmd {
                    "add" => {
                        let mut tb = (**t).clone();
                        let n = addrs.iter().map(|&a| norm(a)).filter(|&(a, l)| tb.add(a, l, now)).count();
                        (tb, format!("{n}/{} addresses added.", addrs.len()), n)
                    }
                    "delete" => {
                        let mut tb = (**t).clone();
                        let n = tb.remove(addrs.iter().map(|&a| norm(a)));
                        (tb, format!("{n}/{} addresses deleted.", addrs.len()), n)
                    }
                    "replace" => {
                        let set: Vec<(IpAddr, u8)> = addrs.iter().map(|&a| norm(a)).collect();
                        let tb = t.replaced(&set, now);
                        let n = tb.len();
                        (tb, format!("{n} addresses replaced ({before} before)."), n.max(before))
                    }
                    "flush" => (Table::counting(t.counted()), format!("{before} addresses deleted."), before),
                    "zero" => {
                        let mut tb = (**t).clone();
                        tb.zero(now);
                        (tb, format!("{before} addresses zeroed."), before)
                    }
                    _ => {
                        let secs = req["seconds"].as_u64().ok_or("-T expire: no number of seconds")?;
                        let mut tb = (**t).clone();
                        let n = tb.expire(now.saturating_sub(secs));
                        (tb, format!("{n}/{before} addresses expired."), n)
                    }
                };
                let entries = tb.len();
                // `set limit table-entries` holds at run time too (pf: "Cannot allocate
                // memory"); a change that adds nothing always goes through.
                let most = self.loaded.limit("table-entries") as usize;
                let all = counted_tables(&cur).map(|(n, x)| if *n == name { entries } else { x.len() }).sum::<usize>();
                if entries > before && all > most {
                    return Err(format!(
                        "-T {cmd}: table <{name}>: {all} addresses in the tables, over set limit table-entries {most}"
                    ));
                }
                let r = cur.with_table(&name, tb).ok_or_else(|| format!("table <{name}> does not exist"))?;
                write_nat_targets(&r, &self.steers.lock().unwrap(), self.skb_nat.as_ref())?;
                self.put(r, None);
                Ok((format!("{verb}\n"), json!({"changed": changed, "entries": entries})))
            }
            _ => Err(format!("-T {cmd}: add, delete, replace, show, test, flush, zero or expire")),
        }
    }

    /// pfctl -s queue: each queue as pfctl prints it; with -v its counters (pkts, bytes,
    /// drops, queue length) and what it measured since the last look.
    fn show_queues(&mut self, verbose: u8) -> Result<(String, Value), String> {
        use std::collections::HashMap;
        let mut sums = QueueSums::new();
        for v in ask(&self.workers, Cmd::Queues)? {
            for (i, n, s) in v {
                sums.entry((i, n)).or_default().add(&s);
            }
        }
        let (_, cur) = self.slot.current();
        let now = Instant::now();
        let before = self.queues_seen.take();
        let mut text = String::new();
        let mut data = Vec::new();
        let parsed = &self.loaded.parsed.queues;
        for t in &cur.queues.trees {
            for c in &t.classes {
                let Some(q) = parsed.iter().find(|q| q.name == c.name) else { continue };
                let st = sums.get(&(t.ifname.clone(), c.name.clone())).copied().unwrap_or_default();
                let mut line = xpf_conf::print::queue(q);
                if q.parent.is_some() && q.on.is_none() {
                    // pfctl names the interface of every queue.
                    line =
                        line.replacen(&format!("queue {} ", q.name), &format!("queue {} on {} ", q.name, t.ifname), 1);
                }
                let _ = writeln!(text, "{line}");
                let qlimit = match c.qlimit {
                    0 if c.flows > 0 => xpf_shape::DEFAULT_FQ_QLIMIT,
                    0 => xpf_shape::DEFAULT_QLIMIT,
                    n => n,
                };
                let measured = before.as_ref().and_then(
                    |(t0, old): &(Instant, HashMap<(String, String), xpf_shape::QueueStats>)| {
                        let dt = now.duration_since(*t0).as_secs_f64();
                        let o = old.get(&(t.ifname.clone(), c.name.clone()))?;
                        (dt >= 0.2).then(|| {
                            (
                                (st.pkts.saturating_sub(o.pkts)) as f64 / dt,
                                (st.bytes.saturating_sub(o.bytes)) as f64 * 8.0 / dt,
                            )
                        })
                    },
                );
                if verbose > 0 {
                    let _ = writeln!(
                        text,
                        "  [ pkts: {:>10}  bytes: {:>10}  dropped pkts: {:>6} bytes: {:>6} ]",
                        st.pkts, st.bytes, st.drop_pkts, st.drop_bytes
                    );
                    let _ = writeln!(text, "  [ qlength: {:>3}/{:>3} ]", st.qlen, qlimit);
                    if let Some((pps, bps)) = measured {
                        let _ = writeln!(text, "  [ measured: {pps:>9.1} packets/s, {}/s ]", rate_text(bps));
                    }
                }
                data.push(json!({"interface": t.ifname, "queue": c.name, "parent": c.parent.map(|p| t.classes[p].name.clone()),
                    "bandwidth": c.bandwidth, "min": c.min, "max": c.max, "qlimit": qlimit, "flows": c.flows,
                    "default": c.default, "packets": st.pkts, "bytes": st.bytes, "dropped_packets": st.drop_pkts,
                    "dropped_bytes": st.drop_bytes, "qlength": st.qlen, "wait_max_us": st.wait_max / 1000,
                    "measured_pps": measured.map(|m| m.0), "measured_bps": measured.map(|m| m.1)}));
            }
        }
        self.queues_seen = Some((now, sums));
        Ok((text, json!(data)))
    }

    fn show(&mut self, what: &str, verbose: u8, want: Want) -> Result<(String, Value), String> {
        let uptime = self.start.elapsed().as_secs();
        match what {
            "info" => {
                let (info, io, xs, pc) = self.snapshot()?;
                let mut text = info.render_status(uptime, self.status.now(), crate::logging::level_name());
                let steer: Vec<(String, [u64; xpf_xdp::steer::COUNTERS.len()])> =
                    self.steers.lock().unwrap().iter().map(|(n, s)| (n.clone(), s.counters())).collect();
                let (_, cur) = self.slot.current();
                if let Some(name) = self.loaded.parsed.loginterface.as_deref() {
                    // pfctl -si's block for `set loginterface`.
                    let l = &io.loginterface;
                    let _ =
                        writeln!(text, "{:<34}{:>16} {:>16}", format!("Interface Stats for {name}"), "IPv4", "IPv6");
                    if cur.loginterface.is_empty() {
                        let _ = writeln!(text, "  (not present when the ruleset was compiled)");
                    }
                    let row = |text: &mut String, k: &str, v: [u64; 2]| {
                        let _ = writeln!(text, "  {k:<32}{:>16} {:>16}", v[0], v[1]);
                    };
                    row(&mut text, "Bytes In", [l.bytes[0][0], l.bytes[1][0]]);
                    row(&mut text, "Bytes Out", [l.bytes[0][1], l.bytes[1][1]]);
                    for (d, what) in [(0, "Packets In"), (1, "Packets Out")] {
                        let _ = writeln!(text, "  {what}");
                        row(&mut text, "  Passed", [l.passed[0][d], l.passed[1][d]]);
                        row(&mut text, "  Blocked", [l.blocked[0][d], l.blocked[1][d]]);
                    }
                }
                let _ = writeln!(text, "Forwarding");
                let f = &io.fast;
                let mut rows = vec![
                    ("forwarded", io.forwarded),
                    ("checksum offload asked", io.csum_offloaded),
                    ("checksum finished here", io.csum_finished),
                    ("queued (queue trees)", io.shaped),
                    ("no-neighbour (waited for it)", io.no_neighbour),
                    ("  sent once resolved", io.neighbour_sent),
                    ("  dropped unresolved", io.neighbour_dropped),
                    ("egress-not-filtered", io.egress_not_filtered),
                    ("tx-ring-full", io.tx_full),
                    ("answers shed (tx ring busy)", io.answers_shed),
                    ("bad-metadata", io.bad_meta),
                    ("receive batches", io.rx_batches),
                    ("worker waits for a frame", io.waits),
                    ("worker naps (busy)", io.naps),
                    ("worker real-time spells (SYN floods)", io.rt_spells),
                    ("  ms in the real-time class", io.rt_ms),
                ];
                if io.nat_to_host + io.nat_local + io.nat_no_route + io.nat_to_host_shed > 0 {
                    rows.extend([
                        ("translation: host's, back", io.nat_to_host),
                        ("translation: host's, shed", io.nat_to_host_shed),
                        ("translated to this host", io.nat_local),
                        ("translated, no route", io.nat_no_route),
                    ]);
                }
                if io.routed + io.route_failed > 0 {
                    rows.extend([
                        ("route-to/reply-to: to the next hop", io.routed),
                        ("route-to/reply-to: no way there", io.route_failed),
                    ]);
                }
                if io.handed_off + io.handed_in + io.handoff_full > 0 {
                    rows.extend([
                        ("to the flow's worker", io.handed_off),
                        ("from other workers", io.handed_in),
                        ("hand-off queue full", io.handoff_full),
                    ]);
                }
                if f.installed > 0 {
                    rows.extend([
                        ("fast-path flows", f.flows),
                        ("fast-path TCP flows", f.tcp),
                        ("fast-path translated", f.translated),
                        ("fast-path installed", f.installed),
                        ("fast-path removed", f.removed),
                        ("fast-path refused (full)", f.refused),
                        ("fast-path TCP judged here", f.judged),
                        ("fast-path TCP taken back", f.taken_back),
                        ("fast-path packets", f.packets),
                        ("fast-path read-back us", f.last_pass_us),
                    ]);
                }
                for (k, v) in rows {
                    let _ = writeln!(text, "  {:<25} {:>14}", k, v);
                }
                let h = &io.host;
                let _ = writeln!(text, "Host traffic (the firewall's own)");
                for (k, v) in [
                    ("to the host", h.to_host),
                    ("from the host", h.from_host),
                    ("dropped", h.dropped),
                    ("answers sent", h.answers),
                    ("answers not sent", h.answer_errors),
                ] {
                    let _ = writeln!(text, "  {:<25} {:>14}", k, v);
                }
                if io.filtered > 0 {
                    let per = io.filter_ns as f64 / io.filtered as f64;
                    let _ = writeln!(text, "  {:<25} {:>11.0} ns", "filter time per packet", per);
                }
                // Whether each interface takes redirected frames (probed): the fast path's,
                // and xpfd's own sent through XDP.
                let fast_out = |name: &str| {
                    let e = self.egresses.as_ref()?;
                    Some(e.ok(xpf_xdp::netlink::ifindex(name).ok()?))
                };
                for (name, c) in &steer {
                    let _ = writeln!(text, "Interface {name} (XDP steering)");
                    if let Some(ok) = fast_out(name) {
                        let _ = writeln!(
                            text,
                            "  {:<38} {:>14}",
                            "takes redirected frames (probed)",
                            if ok { "yes" } else { "no" }
                        );
                    }
                    for (i, (_, label)) in xpf_xdp::steer::COUNTERS.iter().enumerate() {
                        let _ = writeln!(text, "  {:<38} {:>14}", label, c[i]);
                    }
                }
                for (ifindex, c) in &pc {
                    let name = xpf_xdp::netlink::ifname(*ifindex).unwrap_or_else(|| format!("if{ifindex}"));
                    let _ = writeln!(text, "Interface {name} (AF_PACKET)");
                    for (i, (_, label)) in xpf_xdp::packet::PACKET_COUNTERS.iter().enumerate() {
                        let _ = writeln!(text, "  {:<42} {:>14}", label, c[i]);
                    }
                }
                let skb: Option<Vec<u64>> = self.skb_stats.as_ref().map(|m| {
                    (0..xpf_xdp::skbpath::SKB_COUNTERS.len() as u32).map(|i| m.percpu_sum(i).unwrap_or(0)).collect()
                });
                if let Some(c) = &skb {
                    let _ = writeln!(text, "Fast path in the kernel (socket buffers)");
                    for ((_, label), v) in xpf_xdp::skbpath::SKB_COUNTERS.iter().zip(c) {
                        let _ = writeln!(text, "  {label:<58} {v:>14}");
                    }
                }
                let sync = self.sync.as_ref().map(|s| crate::sync::render(s));
                if let Some((t, _)) = &sync {
                    text.push_str(t);
                }
                let pflog = self.pflog.as_ref().map(|p| p.rows());
                let pflow = self.pflow.as_ref().map(|p| p.rows());
                for (title, rows) in
                    [("Pflow", pflow.as_ref().map(|r| &r[..])), ("Pflog", pflog.as_ref().map(|r| &r[..]))]
                {
                    if let Some(rows) = rows {
                        let _ = writeln!(text, "{title}");
                        for (_, k, v) in rows {
                            let _ = writeln!(text, "  {:<25} {:>14}", k, v);
                        }
                    }
                }
                let rx_dropped: u64 = xs.iter().map(|x| x.rx_drops()).sum();
                let syn_rx: u64 = xs.iter().map(|x| x.syn_rx).sum();
                let syn_dropped: u64 = xs.iter().map(|x| x.syn_dropped).sum();
                let kind = if pc.is_empty() { "AF_XDP" } else { "AF_PACKET" };
                let _ = writeln!(text, "{kind} sockets: {} (kernel-side drops {rx_dropped})", xs.len());
                let _ = writeln!(
                    text,
                    "  {:<12} {:>5} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}",
                    "interface",
                    "queue",
                    "received",
                    "sent",
                    "sent by XDP",
                    "tx full",
                    "rx drops",
                    "SYN queue",
                    "SYN drops"
                );
                for x in &xs {
                    let name = xpf_xdp::netlink::ifname(x.ifindex).unwrap_or_else(|| format!("if{}", x.ifindex));
                    let _ = writeln!(
                        text,
                        "  {:<12} {:>5} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}",
                        name,
                        x.queue,
                        x.rx,
                        x.tx,
                        x.tx_xdp,
                        x.tx_full,
                        x.rx_drops(),
                        x.syn_rx,
                        x.syn_dropped
                    );
                }
                let reasons: serde_json::Map<String, Value> =
                    xpf_wire::Reason::ALL.iter().map(|&r| (r.name().to_string(), json!(info.counter(r)))).collect();
                let keyed = |names: &[(&str, &str)], c: &[u64]| -> serde_json::Map<String, Value> {
                    names.iter().zip(c).map(|((k, _), v)| (k.to_string(), json!(v))).collect()
                };
                let (enabled, status_secs) = self.status.now();
                let mut data = json!({
                    "uptime": uptime,
                    "enabled": enabled, "status_secs": status_secs, "debug": crate::logging::level_name(),
                    "states": info.states, "limit": info.limit,
                    "searches": info.searches, "inserts": info.inserts, "removals": info.removals,
                    "packets": info.stats.packets, "bytes": info.stats.bytes,
                    "passed": info.stats.passed, "dropped": info.stats.dropped,
                    "block_return": {"answers_sent": info.stats.returned, "rate_limited": info.stats.return_limited},
                    "synproxy": {"segments_sent": info.stats.proxied},
                    "counters": reasons,
                    "forwarding": io,
                    "syn_queue": {"received": syn_rx, "dropped": syn_dropped},
                    "sync": sync.map(|(_, v)| v),
                    "pflog": pflog.map(|rows| by_key(&rows)),
                    "pflow": pflow.map(|rows| by_key(&rows)),
                    "steering": steer.iter().map(|(n, c)| json!({"interface": n, "counters": keyed(&xpf_xdp::steer::COUNTERS, c), "fast_path_out": fast_out(n)})).collect::<Vec<_>>(),
                    "skb_fast_path": skb.as_ref().map(|c| keyed(&xpf_xdp::skbpath::SKB_COUNTERS, c)),
                    "packet_mode": pc.iter().map(|(i, c)| json!({"ifindex": i, "counters": keyed(&xpf_xdp::packet::PACKET_COUNTERS, c)})).collect::<Vec<_>>(),
                    "sockets": xs.iter().map(|x| json!({"ifindex": x.ifindex, "queue": x.queue, "rx": x.rx, "tx": x.tx, "tx_xdp": x.tx_xdp, "tx_xdp_runs": x.tx_xdp_runs, "tx_xdp_errors": x.tx_xdp_errors,
                        "tx_full": x.tx_full, "kicks": x.kicks, "rx_dropped": x.rx_dropped, "rx_ring_full": x.rx_ring_full,
                        "fill_empty": x.fill_empty, "syn_rx": x.syn_rx, "syn_dropped": x.syn_dropped})).collect::<Vec<_>>(),
                });
                // The engine's named groups, by key (syncookies' counters beside its mode).
                for (group, _, names, values) in info.groups() {
                    let m: serde_json::Map<String, Value> =
                        names.iter().zip(values).map(|(n, v)| (n.key.to_string(), json!(v))).collect();
                    data[group] = Value::Object(m);
                }
                let cookies = std::mem::take(&mut data["syncookies"]);
                data["syncookies"] = json!({"mode": info.syncookies.0.name(), "active": info.syncookies.1,
                    "halfopen_states": info.syncookies.2, "counters": cookies});
                Ok((text, data))
            }
            "states" => {
                let rows = self.states()?;
                let mut text = String::new();
                if want != Want::Data {
                    text.reserve(rows.len() * 80);
                    for r in &rows {
                        text.push_str(&state_text(r, verbose));
                        text.push('\n');
                    }
                }
                Ok((text, if want == Want::Text { Value::Null } else { json!(rows) }))
            }
            "memory" => {
                let mut text = String::new();
                let mut data = serde_json::Map::new();
                for (n, _) in LIMITS {
                    let v = self.loaded.limit(n);
                    let _ = writeln!(text, "{:<13} hard limit {:>8}", n, v);
                    data.insert(n.to_string(), json!(v));
                }
                Ok((text, Value::Object(data)))
            }
            "timeouts" => {
                let t = self.loaded.timeouts();
                let limit = self.loaded.state_limit();
                let (astart, aend) = t.adaptive(limit);
                let mut text = String::new();
                let mut data = serde_json::Map::new();
                for &k in Timeout::ALL {
                    let v = match k {
                        Timeout::AdaptiveStart => astart,
                        Timeout::AdaptiveEnd => aend,
                        _ => t.get(k),
                    };
                    let unit = if matches!(k, Timeout::AdaptiveStart | Timeout::AdaptiveEnd) { " states" } else { "s" };
                    let _ = writeln!(text, "{:<20} {:>10}{unit}", k.name(), v);
                    data.insert(k.name().to_string(), json!(v));
                }
                Ok((text, Value::Object(data)))
            }
            "nat" => {
                // FreeBSD's `pfctl -s nat`: the translation rules, each with its evaluations.
                let (_, cur) = self.slot.current();
                let mut text = String::new();
                let mut data = Vec::new();
                for (i, r) in self.loaded.parsed.xrules.iter().enumerate() {
                    let line = xpf_conf::print::rule(r);
                    let evals = cur.xlate_evaluations(i);
                    if verbose > 1 {
                        let _ = writeln!(text, "@{i} {line}");
                    } else {
                        let _ = writeln!(text, "{line}");
                    }
                    if verbose > 0 {
                        let _ = writeln!(text, "  [ Evaluations: {evals:<8} ]");
                    }
                    data.push(json!({"nr": i, "rule": line, "evaluations": evals}));
                }
                Ok((text, json!(data)))
            }
            "rules" => self.show_rules(None, verbose),
            "labels" => {
                // pfctl -s labels: per rule with a label, "label evaluations packets bytes
                // in-packets in-bytes out-packets out-bytes state-creations" (since its load
                // or the last -z, in and out as the interface sees them).
                let (_, cur) = self.slot.current();
                let per = self.rule_sums()?;
                let mut text = String::new();
                let mut data = Vec::new();
                for (i, label, evals) in self.labelled(&cur) {
                    let c = per.get(&i).copied().unwrap_or_default();
                    let ([p0, p1], [b0, b1]) = (c.packets, c.bytes);
                    let _ = writeln!(text, "{label} {evals} {} {} {p0} {b0} {p1} {b1} {}", p0 + p1, b0 + b1, c.created);
                    data.push(json!({"label": label, "nr": i, "evaluations": evals, "packets": p0 + p1,
                        "bytes": b0 + b1, "packets_in": p0, "bytes_in": b0, "packets_out": p1, "bytes_out": b1,
                        "states": c.states, "state_creations": c.created}));
                }
                Ok((text, json!(data)))
            }
            "queue" | "queues" => self.show_queues(verbose),
            "Sources" => {
                // pfctl -s Sources: one line a source node (a `sticky-address` source's with
                // the address it keeps, as OpenBSD's pfctl prints it); with -v its age, when
                // a node without states goes, and the rule that made it. Each worker counts
                // the sources of its own flows: a source is one line, its counts summed.
                type Key = (IpAddr, Option<(&'static str, IpAddr)>);
                let mut by: std::collections::BTreeMap<Key, crate::dataplane::SrcRow> = Default::default();
                for r in ask(&self.workers, Cmd::Sources)?.into_iter().flatten() {
                    match by.entry((r.addr, r.to)) {
                        std::collections::btree_map::Entry::Occupied(mut e) => {
                            let m = e.get_mut();
                            m.states += r.states;
                            m.conn += r.conn;
                            m.rate.0 += r.rate.0;
                            m.age = m.age.max(r.age);
                            m.expires = if m.states > 0 { None } else { m.expires.max(r.expires) };
                        }
                        std::collections::btree_map::Entry::Vacant(e) => {
                            e.insert(r);
                        }
                    }
                }
                let mut text = String::new();
                let mut data = Vec::new();
                for ((a, to), r) in &by {
                    let (count, secs) = r.rate;
                    let kept = to.map(|(kind, t)| format!(" {kind} {t}")).unwrap_or_default();
                    let _ = writeln!(
                        text,
                        "{a}{kept} ( states {}, connections {}, rate {}.{}/{secs}s )",
                        r.states,
                        r.conn,
                        count / 1000,
                        count % 1000 / 100
                    );
                    if verbose > 0 {
                        let expires = r.expires.map(|e| format!(", expires in {}", hms(e))).unwrap_or_default();
                        // A sticky source's rule is not kept (its pool's rule decides anew
                        // at each new flow).
                        let rule = if to.is_none() { format!(", rule {}", r.rule) } else { String::new() };
                        let _ = writeln!(text, "   age {}{expires}{rule}", hms(r.age));
                    }
                    let mut row = json!({"address": a.to_string(), "states": r.states, "connections": r.conn,
                        "rate": count as f64 / 1000.0, "rate_seconds": secs, "age": r.age, "expires": r.expires,
                        "rule": r.rule});
                    if let Some((kind, t)) = to {
                        row["translation"] = json!(kind);
                        row["translated_to"] = json!(t.to_string());
                    }
                    data.push(row);
                }
                Ok((text, json!(data)))
            }
            "Interfaces" | "interfaces" => {
                // pfctl -s Interfaces: the interfaces xpfd filters (and `all`, and the groups
                // and absent interfaces the ruleset names); with -v, what xpf knows of each: the states bound to it, the rules that name it, its
                // sockets' frames and the steering program's counts.
                let (_, _, xs, _) = self.snapshot()?;
                let by_if: std::collections::HashMap<u16, u64> = if verbose > 0 {
                    let mut all = std::collections::HashMap::new();
                    for m in ask(&self.workers, Cmd::StatesByIf)? {
                        for (k, v) in m {
                            *all.entry(k).or_insert(0u64) += v;
                        }
                    }
                    all
                } else {
                    Default::default()
                };
                let steer: Vec<(String, [u64; xpf_xdp::steer::COUNTERS.len()])> =
                    self.steers.lock().unwrap().iter().map(|(n, s)| (n.clone(), s.counters())).collect();
                let mut names: Vec<String> = steer.iter().map(|(n, _)| n.clone()).collect();
                for x in &xs {
                    let n = xpf_xdp::netlink::ifname(x.ifindex).unwrap_or_else(|| format!("if{}", x.ifindex));
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
                let rules_naming = |n: &str| {
                    self.loaded
                        .parsed
                        .rules
                        .iter()
                        .filter(|r| r.on.as_ref().is_some_and(|i| i.name == n && !i.neg))
                        .count()
                };
                let mut text = String::new();
                let mut data = Vec::new();
                let floating = by_if.get(&0).copied().unwrap_or(0);
                let _ = writeln!(text, "all");
                if verbose > 0 {
                    let _ = writeln!(
                        text,
                        "  References:  [ States:  {floating:<18} Rules: {:<18} ]",
                        self.loaded.parsed.rules.iter().filter(|r| r.on.is_none()).count()
                    );
                }
                data.push(json!({"name": "all", "states": floating}));
                for n in &names {
                    let idx = xpf_xdp::netlink::ifindex(n).ok();
                    let states = idx.and_then(|i| by_if.get(&(i as u16))).copied().unwrap_or(0);
                    let mine: Vec<_> = xs.iter().filter(|x| Some(x.ifindex) == idx).collect();
                    let (rx, tx) = (mine.iter().map(|x| x.rx).sum::<u64>(), mine.iter().map(|x| x.tx).sum::<u64>());
                    let st = steer.iter().find(|(m, _)| m == n).map(|(_, c)| c);
                    let _ = writeln!(text, "{n}");
                    if verbose > 0 {
                        let _ =
                            writeln!(text, "  References:  [ States:  {states:<18} Rules: {:<18} ]", rules_naming(n));
                        let _ = writeln!(text, "  Frames:      [ Received: {rx:<16} Sent: {tx:<18} ]");
                        if let Some(c) = st {
                            let _ = writeln!(
                                text,
                                "  Steering:    [ To xpfd: {:<16} Fast path: {:<13} To the kernel: {} ]",
                                c[5],
                                c[8],
                                c[0] + c[1] + c[2] + c[3] + c[4] + c[7] + c[9]
                            );
                        }
                    }
                    data.push(json!({"name": n, "ifindex": idx, "states": states, "rules": rules_naming(n),
                        "received": rx, "sent": tx, "queues": mine.len(),
                        "steering": st.map(|c| xpf_xdp::steer::COUNTERS.iter().zip(c).map(|((k, _), v)| (k.to_string(), json!(v))).collect::<serde_json::Map<String, Value>>())}));
                }
                // The groups the ruleset names and the interfaces it names that are not here
                // (pf lists its groups, and the interfaces its rules wait for, beside the
                // others); with -v a group's members.
                if let Ok(links) = xpf_conf::ifgroup::Links::now() {
                    let mut named: Vec<&str> = self
                        .loaded
                        .parsed
                        .interface_names()
                        .filter(|n| *n != "any" && (links.is_group(n) || links.interfaces(n).is_none()))
                        .collect();
                    named.sort_unstable();
                    named.dedup();
                    for n in named {
                        let members = links.interfaces(n);
                        let _ = writeln!(text, "{n}");
                        if verbose > 0 {
                            let _ = writeln!(text, "  References:  [ Rules: {:<18} ]", rules_naming(n));
                            let _ = match &members {
                                Some(m) => writeln!(text, "  Group:       [ Members: {} ]", m.join(" ")),
                                None => writeln!(text, "  (not present: its rules wait for it)"),
                            };
                        }
                        data.push(json!({"name": n, "group": members.is_some(), "members": members,
                            "rules": rules_naming(n)}));
                    }
                }
                Ok((text, json!(data)))
            }
            "Tables" | "tables" => {
                let (_, cur) = self.slot.current();
                let mut text = String::new();
                let mut data = Vec::new();
                // pf's REFERENCED: a rule's source, destination or pool names the table. One
                // pass over the rules, whatever the number of tables.
                let referenced: std::collections::HashSet<&str> = self
                    .loaded
                    .parsed
                    .rules
                    .iter()
                    .flat_map(|r| {
                        let pools = [&r.nat, &r.rdr, &r.binat].into_iter().flatten().map(|p| &p.host);
                        [&r.src, &r.dst].into_iter().chain(pools).chain(r.route.iter().map(|b| &b.1.host))
                    })
                    .filter_map(|h| match &h.kind {
                        xpf_conf::ast::HostKind::Table(x) => Some(x.as_str()),
                        _ => None,
                    })
                    .collect();
                for (n, t) in &cur.tables {
                    // pfctl's address-list tables and xpf's own (`self`, `(if)`, routes).
                    if n.starts_with("__") {
                        continue;
                    }
                    let def = self.loaded.parsed.tables.iter().find(|d| &d.name == n);
                    let (konst, persist) = def.map_or((false, false), |d| (d.konst, d.persist));
                    let refd = referenced.contains(n.as_str());
                    if verbose > 0 {
                        // pfctl -sT -v: const, persist, active, inactive, referenced, referenced
                        // by an anchor, counters.
                        let f = |on: bool, c: char| if on { c } else { '-' };
                        let flags: String =
                            [f(konst, 'c'), f(persist, 'p'), 'a', '-', f(refd, 'r'), '-', f(t.counted(), 'C')].iter().collect();
                        let _ = writeln!(text, "{flags}\t{n}");
                    } else {
                        let _ = writeln!(text, "{n}");
                    }
                    data.push(json!({"name": n, "entries": t.len(), "const": konst, "persist": persist,
                        "referenced": refd, "counters": t.counted()}));
                }
                Ok((text, json!(data)))
            }
            "all" => {
                let mut text = String::new();
                let mut data = serde_json::Map::new();
                for (title, w) in [
                    ("TRANSLATION RULES", "nat"),
                    ("RULES", "rules"),
                    ("STATES", "states"),
                    ("SOURCE TRACKING NODES", "Sources"),
                    ("INFO", "info"),
                    ("TIMEOUTS", "timeouts"),
                    ("LIMITS", "memory"),
                    ("TABLES", "Tables"),
                ] {
                    let (t, d) = self.show(w, verbose, want)?;
                    // pfctl names the source nodes only when there are some.
                    if !(w == "Sources" && t.is_empty()) {
                        let _ = writeln!(text, "{title}:\n{t}");
                    }
                    data.insert(w.to_lowercase(), d);
                }
                Ok((text, Value::Object(data)))
            }
            _ => {
                Err(format!(
                    "-s {what}: info, states, Sources, memory, rules, nat, labels, queue, timeouts, Tables, Interfaces or all"
                ))
            }
        }
    }
}

/// Binds the control socket, mode 0600.
pub fn listen(path: &str) -> std::io::Result<UnixListener> {
    if let Ok(s) = UnixStream::connect(path) {
        drop(s);
        return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another xpfd answers on it"));
    }
    let _ = std::fs::remove_file(path);
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(path);
    // SAFETY: restoring the process umask.
    unsafe { libc::umask(old) };
    let l = l?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The client's uid and pid.
fn peer_cred(s: &UnixStream) -> Option<(u32, u32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: getsockopt SO_PEERCRED into a ucred of the size passed.
    unsafe {
        let mut c: libc::ucred = std::mem::zeroed();
        let mut l = std::mem::size_of::<libc::ucred>() as u32;
        let r = libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut l,
        );
        (r == 0).then_some((c.uid, c.pid as u32))
    }
}

/// What a `show` request's client prints: the text, the JSON data (`-j`), or (an older
/// client, or none said) both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Text,
    Data,
    Both,
}

/// Waits up to `ms` for one client (or scrapes, with --metrics) and answers it.
pub fn serve_once(
    l: &UnixListener,
    scrapes: Option<&crate::metrics::Scrapes>,
    overloads: &crate::dataplane::Wake,
    d: &mut Daemon,
    ms: i32,
) {
    use std::os::fd::AsRawFd;
    let mut p = [
        libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: scrapes.map_or(-1, |s| s.wake.as_raw_fd()), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: overloads.fd(), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: three pollfds (a negative fd is ignored).
    if unsafe { libc::poll(p.as_mut_ptr(), 3, ms) } <= 0 {
        return;
    }
    if p[2].revents != 0 {
        // Sources over their limits wait in the channel: the caller's loop takes them now.
        overloads.clear();
        return;
    }
    if let Some(s) = scrapes.filter(|_| p[1].revents != 0) {
        s.answer(d);
    }
    if p[0].revents == 0 {
        return;
    }
    let Ok((s, _)) = l.accept() else { return };
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let cred = peer_cred(&s);
    let reply = if cred.map(|c| c.0) != Some(0) {
        json!({"ok": false, "error": "xpfd answers root only"})
    } else {
        d.caller = cred.map_or(0, |c| c.1);
        let mut line = String::new();
        let reply = match BufReader::new(&s).read_line(&mut line) {
            Ok(_) => match serde_json::from_str::<Value>(&line) {
                Ok(req) => match d.handle(&req) {
                    Ok((text, data)) => json!({"ok": true, "text": text, "data": data}),
                    Err(e) => json!({"ok": false, "error": e}),
                },
                Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
            },
            Err(e) => json!({"ok": false, "error": format!("reading the request: {e}")}),
        };
        d.caller = std::process::id();
        reply
    };
    // One write: Display would hand the socket the JSON in pieces, a syscall each.
    let mut out = reply.to_string();
    out.push('\n');
    let _ = (&s).write_all(out.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> (Parsed, Ruleset) {
        let p = xpf_conf::parse(text, "t", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors.first());
        let r = Ruleset::compile(&p, &|_| None).unwrap();
        (p, r)
    }

    /// With several workers, addresses a translation maps host by host cannot be another
    /// translation's too; binat-to's own way back, and translations elsewhere, can.
    #[test]
    fn a_host_by_host_map_shares_its_addresses_with_no_other_translation() {
        let binat = "match on em0 inet from 10.0.1.0/26 to any binat-to 192.0.2.64/26\n";
        for ok in [
            String::new(),
            "match out on em0 inet from 10.0.2.0/24 nat-to 192.0.2.1\n".into(),
            "pass in on em0 proto tcp to 192.0.2.1 port 22 rdr-to 10.0.5.5\n".into(),
            "match on em0 inet from 10.0.3.0/26 to any binat-to 192.0.2.128/26\n".into(),
        ] {
            assert_eq!(maps_fit(&load(&format!("{binat}{ok}")).1), Ok(()), "{ok}");
        }
        for clash in [
            "match out on em0 inet from 10.0.2.0/24 nat-to 192.0.2.70\n",
            "pass in on em0 proto tcp to 192.0.2.70 port 22 rdr-to 10.0.5.5\n",
            "match on em0 inet from 10.0.3.0/27 to any binat-to 192.0.2.96/27\n",
        ] {
            let e = maps_fit(&load(&format!("{binat}{clash}")).1).unwrap_err();
            assert!(e.starts_with("t:1: with several workers, the addresses 192.0.2.64/26"), "{clash}: {e}");
        }
    }

    /// Whether pf.conf `text` (file "t") fits `workers` workers.
    fn fits(text: &str, workers: usize) -> Result<(), String> {
        let l = Loaded::build(text, "t", &[]).map_err(|e| e.join("\n"))?;
        translation_fits(&l, workers, true)
    }

    /// Each (ruleset, what its refusal starts with) is refused so with two workers and
    /// loads with one.
    fn refused_with_several_workers(cases: &[(&str, &str)]) {
        for (refused, why) in cases {
            let e = fits(refused, 2).unwrap_err();
            assert!(e.starts_with(why), "{refused}: {e}");
            assert_eq!(fits(refused, 1), Ok(()), "{refused}: one worker keeps them");
        }
    }

    /// A translation that remembers per inside host (`endpoint-independent`,
    /// `sticky-address`) loads with several workers when its source names the hosts, and is
    /// refused at its line when it does not; a sticky forwarding through one public address
    /// loads, one of another shape does not.
    #[test]
    fn a_translation_remembering_per_host_names_its_hosts_with_several_workers() {
        for ok in [
            "match out on lo inet proto udp from 10.0.1.0/24 nat-to 192.0.2.1 endpoint-independent\n",
            "match out on lo inet proto tcp from 10.0.1.0/24 nat-to { 192.0.2.1, 192.0.2.2 } round-robin sticky-address\n",
            "nat on lo inet proto udp from 10.0.1.0/24 to any -> 192.0.2.1 endpoint-independent\n",
            "match out on lo inet from { 10.0.1.0/24, 10.0.3.7 } nat-to 192.0.2.1 endpoint-independent\n",
            "pass in on lo inet proto tcp to 192.0.2.1 port 80 rdr-to { 10.0.1.5, 10.0.1.6 } round-robin sticky-address\n",
        ] {
            assert_eq!(fits(ok, 2), Ok(()), "{ok}");
            let l = Loaded::build(ok, "t", &[]).unwrap();
            let hosts = &l.ruleset.as_ref().unwrap().nat_hosts;
            assert_eq!(hosts.is_empty(), ok.contains("rdr-to"), "{ok}: {hosts:?}");
        }
        for refused in [
            "match out on lo inet proto udp nat-to 192.0.2.1 endpoint-independent\n",
            "table <in> { 10.0.1.0/24 }\nmatch out on lo inet from <in> nat-to 192.0.2.1 sticky-address\n",
            "match out on lo inet from ! 10.0.1.0/24 nat-to 192.0.2.1 endpoint-independent\n",
            "match out on lo inet from (lo) nat-to 192.0.2.1 endpoint-independent\n",
        ] {
            let e = fits(refused, 2).unwrap_err();
            let line = refused.lines().count();
            assert!(
                e.starts_with(&format!("t:{line}: endpoint-independent and sticky-address with several workers")),
                "{refused}: {e}"
            );
            assert_eq!(fits(refused, 1), Ok(()), "{refused}: one worker keeps them");
        }
        let e = fits("pass in on lo inet to 192.0.2.1 rdr-to { 10.0.1.5, 10.0.1.6 } round-robin sticky-address\n", 2);
        assert!(e.unwrap_err().starts_with("t:1: rdr-to over addresses chosen per flow"));
    }

    /// A many-to-one translation that may take protocols without ports loads with several
    /// workers on an interface or group (its flows owned by their far end), and is refused at
    /// its line on every interface or with `sticky-address`; a map, or a rule of TCP, UDP or
    /// ICMP alone, needs neither.
    #[test]
    fn protocols_without_ports_are_translated_on_an_interface_with_several_workers() {
        for ok in [
            "match out on lo inet from 10.0.1.0/24 nat-to 192.0.2.1\n",
            "match out on lo inet proto gre nat-to 192.0.2.1\n",
            "match out on lo nat-to (lo)\n",
            "nat on lo inet from any to any -> 192.0.2.1\n",
            "match out inet proto { tcp, udp, icmp } nat-to 192.0.2.1\n",
            "match out inet from 10.0.1.0/24 nat-to 192.0.2.0/24 static-port\n",
            "match out on lo inet from 10.0.1.0/24 nat-to { 192.0.2.1, 192.0.2.2 } round-robin\n",
        ] {
            assert_eq!(fits(ok, 2), Ok(()), "{ok}");
        }
        let l = Loaded::build("match out on lo inet proto esp nat-to 192.0.2.1\n", "t", &[]).unwrap();
        let bare = &l.ruleset.as_ref().unwrap().nat_bare;
        assert_eq!(bare.len(), 1);
        assert_eq!(bare[0].on.as_ref().map(Vec::len), Some(1), "lo's index: {bare:?}");
        refused_with_several_workers(&[
            ("match out inet nat-to 192.0.2.1\n", "t:1: nat-to onto fewer addresses of protocols without ports"),
            (
                "match out on ! lo inet proto gre nat-to 192.0.2.1\n",
                "t:1: nat-to onto fewer addresses of protocols without ports",
            ),
            ("nat inet from any to any -> 192.0.2.1\n", "t:1: nat-to onto fewer addresses of protocols without ports"),
            (
                "match out on lo inet from 10.0.1.0/24 nat-to { 192.0.2.1, 192.0.2.2 } round-robin sticky-address\n",
                "t:1: sticky-address with several workers needs proto",
            ),
        ]);
    }

    /// `static-port` from many hosts onto fewer addresses loads with several workers from a
    /// source written as an address or network, each host's flows owned by their port; from
    /// a source the hand-off cannot know, with a translation remembering per host, or with
    /// those hosts also a map's or a forwarding's, it is refused at its line.
    #[test]
    fn static_port_names_its_hosts_with_several_workers() {
        for ok in [
            "match out on lo inet from 10.0.1.0/24 nat-to 192.0.2.1 static-port\n",
            "nat on lo inet proto udp from 10.0.1.0/24 port 500 to any -> 192.0.2.1 static-port\n",
            "match out on lo inet from { 10.0.1.0/24, 10.0.3.7 } nat-to { 192.0.2.1, 192.0.2.2 } round-robin static-port\n",
        ] {
            assert_eq!(fits(ok, 2), Ok(()), "{ok}");
            assert!(!Loaded::build(ok, "t", &[]).unwrap().ruleset.as_ref().unwrap().nat_ports.is_empty());
        }
        refused_with_several_workers(&[
            ("match out on lo inet nat-to 192.0.2.1 static-port\n", "t:1: static-port from many hosts"),
            ("table <in> { 10.0.1.0/24 }\nmatch out on lo inet from <in> nat-to 192.0.2.1 static-port\n", "t:2: static-port from many hosts"),
            ("match out on lo inet from 10.0.1.0/24 nat-to { 192.0.2.1, 192.0.2.2 } round-robin sticky-address static-port\n", "t:1: static-port from many hosts"),
            ("match out on lo inet from 10.0.1.0/24 nat-to 192.0.2.1 port 5000\n", "t:1: nat-to with one port from many hosts"),
            (
                "match out on lo inet from 10.0.1.0/24 nat-to 192.0.2.1 static-port\nmatch on lo inet from 10.0.1.128/26 to any binat-to 192.0.2.128/26\n",
                "t:1: with several workers, the hosts of 10.0.1.0/24 whose flows static-port keeps on their port's worker cannot also be a map's (t:2)",
            ),
            (
                "match out on lo inet from 10.0.1.0/24 nat-to 192.0.2.1 static-port\npass in on lo inet proto tcp to 192.0.2.1 port 80 rdr-to 10.0.1.80\n",
                "t:1: with several workers, the hosts of 10.0.1.0/24 whose flows static-port keeps on their port's worker cannot also be a forwarding's target",
            ),
        ]);
    }

    /// The load's log line: added and removed rules for a usual ruleset, the counts only for
    /// one past the diff's bound (its comparison would cost as much as the load).
    #[test]
    fn change_summary_diffs_small_rulesets_and_counts_large_ones() {
        let (p0, r0) = load("block all\npass proto tcp to port 22\n");
        let (p1, r1) = load("block all\npass proto tcp to port 80\npass proto udp\n");
        let s = change_summary(&p0, &r0, &p1, &r1);
        assert!(s.starts_with("rules 3 (+2 -1), translation rules 0 (+0 -0)"), "{s}");
        let big: String = (0..=DIFF_UP_TO).map(|i| format!("pass proto tcp to port {}\n", i % 60000 + 1)).collect();
        let (p2, r2) = load(&big);
        let s = change_summary(&p1, &r1, &p2, &r2);
        assert!(s.starts_with(&format!("rules {} (was 3), classifier ", DIFF_UP_TO + 1)), "{s}");
    }

    /// `set limit tables` and `table-entries`: a ruleset past them is refused at the table
    /// that passes, with its file and line; pfctl's list tables count, xpf's own do not.
    #[test]
    fn a_ruleset_past_its_table_limits_is_refused_at_the_table() {
        let two =
            "table <a> { 10.0.0.1 10.0.0.2 }\ntable <b> { 10.0.0.3 10.0.0.4 }\npass from <a>\npass from <b> to self\n";
        assert!(Loaded::build(two, "t", &[]).is_ok());
        let e = Loaded::build(&format!("set limit table-entries 3\n{two}"), "t", &[]).err().unwrap().join("\n");
        assert!(
            e.contains("t:3: table <b>: 2 addresses, 4 in the tables so far, over set limit table-entries 3"),
            "{e}"
        );
        assert!(Loaded::build(&format!("set limit table-entries 4\n{two}"), "t", &[]).is_ok());
        let e = Loaded::build(&format!("set limit tables 1\n{two}"), "t", &[]).err().unwrap().join("\n");
        assert!(e.contains("t:3: table <b>: table 2 of the ruleset, over set limit tables 1"), "{e}");
        let list = "set limit tables 2\ntable <a> { 10.0.0.1 }\npass from <a>\npass in to 10.0.0.5 rdr-to { 10.0.0.7 10.0.0.8 }\n";
        assert!(Loaded::build(list, "t", &[]).is_ok(), "a list's table is the second");
        let e = Loaded::build(&list.replace("tables 2", "tables 1"), "t", &[]).err().unwrap().join("\n");
        assert!(e.contains("table <__automatic_0>: table 2 of the ruleset, over set limit tables 1"), "{e}");
    }

    /// What the once-a-second watch asks of the ruleset is found at its load: the interface
    /// names once each, whether it tests routes.
    #[test]
    fn a_load_notes_its_interface_names_once_each_and_its_routes() {
        let mut text: String = (1..=1000).map(|p| format!("pass in on lo proto tcp to port {p}\n")).collect();
        text.push_str("pass out on lo to (lo)\nset skip on lo\npass in on lo from no-route\n");
        let l = Loaded::compile(xpf_conf::parse(&text, "t", &[]), "t").unwrap();
        assert_eq!(l.names, ["lo"]);
        assert!(l.routes);
        let l = Loaded::compile(xpf_conf::parse("block all\npass on lo\n", "t", &[]), "t").unwrap();
        assert_eq!(l.names, ["lo"]);
        assert!(!l.routes);
    }
}
