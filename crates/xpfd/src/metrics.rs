//! `--metrics ADDR:PORT`: the daemon's counters for Prometheus, in its text exposition format
//! (version 0.0.4, what `promtool check metrics` reads and every scraper accepts).
//!
//! A thread of its own accepts scrapes and reads their requests, bounded in size and time, so
//! that a slow or hostile client costs that thread only. The page itself is made by the
//! control loop, which owns the daemon's view (workers, ruleset, sync, pflog): the thread
//! hands it a reply channel and wakes it through a socket pair the loop polls beside the
//! control socket.
//!
//! Written here rather than with a client crate: prometheus-client writes OpenMetrics (whose
//! `_total` samples under a `# TYPE x counter` line `promtool check metrics` rejects), and the
//! page is a snapshot of counters kept elsewhere, not instruments to register; the format is
//! four line shapes and one escaping rule.

use crate::control::Daemon;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

/// A metric's type line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// A page being written: one family at a time, its samples together.
#[derive(Default)]
pub struct Page {
    pub out: String,
}

fn escape_label(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

impl Page {
    /// Starts family `name` (counters end in `_total`, by the convention promtool checks).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert_eq!(kind == Kind::Counter, name.ends_with("_total"), "{name}");
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let kind = if kind == Kind::Counter { "counter" } else { "gauge" };
        let _ = write!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.out, " {v}");
    }

    pub fn sample_f(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.labels(name, labels);
        let _ = writeln!(self.out, " {v}");
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_label(v, &mut self.out);
                self.out.push('"');
            }
            self.out.push('}');
        }
    }

    /// A family of one unlabelled sample.
    pub fn one(&mut self, name: &str, kind: Kind, help: &str, v: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }

    /// A family with one sample per (label value, value).
    pub fn each<S: AsRef<str>>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (S, u64)>,
    ) {
        self.family(name, kind, help);
        for (k, v) in rows {
            self.sample(name, &[(label, k.as_ref())], v);
        }
    }
}

/// The control loop's end: scrapes waiting for a page, and the socket that wakes the loop.
pub struct Scrapes {
    pub waiting: Receiver<Sender<String>>,
    pub wake: UnixStream,
}

impl Scrapes {
    /// Answers every scrape waiting (called when `wake` is readable).
    pub fn answer(&self, d: &mut Daemon) {
        let mut b = [0u8; 64];
        while matches!((&self.wake).read(&mut b), Ok(n) if n > 0) {}
        for reply in self.waiting.try_iter() {
            let page = d.metrics().unwrap_or_else(|e| format!("# xpfd: {e}\n"));
            let _ = reply.send(page);
        }
    }
}

/// Binds `addr` and starts the thread that takes scrapes.
pub fn start(addr: &str) -> Result<Scrapes, String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    let (wake_tx, wake) = UnixStream::pair().map_err(|e| e.to_string())?;
    wake.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (tx, waiting) = mpsc::channel();
    std::thread::Builder::new()
        .name("xpf-metrics".into())
        .spawn(move || {
            for s in l.incoming().flatten() {
                let _ = serve(s, &tx, &wake_tx);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(Scrapes { waiting, wake })
}

/// The most of a request read: its line and headers (a scrape sends a few hundred bytes).
const MAX_REQUEST: usize = 8192;

fn serve(mut s: TcpStream, tx: &Sender<Sender<String>>, wake: &UnixStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::with_capacity(512);
    let mut b = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut b)?;
        if n == 0 || req.len() + n > MAX_REQUEST {
            return respond(&mut s, "400 Bad Request", "text/plain", "bad request\n", false);
        }
        req.extend_from_slice(&b[..n]);
    }
    let line = String::from_utf8_lossy(req.split(|&c| c == b'\n').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head = method == "HEAD";
    if method != "GET" && !head {
        return respond(&mut s, "405 Method Not Allowed", "text/plain", "GET /metrics\n", false);
    }
    match path {
        "/metrics" => {
            let (reply, page) = mpsc::channel();
            if tx.send(reply).is_err() {
                return respond(&mut s, "503 Service Unavailable", "text/plain", "xpfd is stopping\n", head);
            }
            let _ = (&*wake).write(&[1]);
            match page.recv_timeout(Duration::from_secs(10)) {
                Ok(p) => respond(&mut s, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &p, head),
                Err(_) => respond(&mut s, "503 Service Unavailable", "text/plain", "xpfd did not answer\n", head),
            }
        }
        "/" => respond(&mut s, "200 OK", "text/plain", "xpfd: metrics at /metrics\n", head),
        _ => respond(&mut s, "404 Not Found", "text/plain", "not found: GET /metrics\n", head),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str, head: bool) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head {
        out.push_str(body);
    }
    s.write_all(out.as_bytes())
}

impl Daemon {
    /// The page: what `xpfctl -s info` shows, per rule, table, interface, socket, sync and
    /// pflog, and translation's port use per pool address.
    pub fn metrics(&mut self) -> Result<String, String> {
        use Kind::{Counter, Gauge};
        let (info, io, xs, pc) = self.snapshot()?;
        let mut p = Page::default();
        p.family("xpf_build_info", Gauge, "The build of xpfd running: its version and commit, in labels.");
        p.sample("xpf_build_info", &[("version", xpf_version::VERSION), ("commit", xpf_version::COMMIT)], 1);
        p.one("xpf_uptime_seconds", Gauge, "Seconds since xpfd started.", self.start.elapsed().as_secs());
        p.one("xpf_ruleset_generation", Gauge, "The ruleset in force: bumped by every load.", self.slot.generation());
        p.one("xpf_states", Gauge, "States in the table (pfctl -si's current entries).", info.states);
        p.one("xpf_states_limit", Gauge, "set limit states.", info.limit);
        p.one("xpf_state_searches_total", Counter, "State table searches.", info.searches);
        p.one("xpf_state_inserts_total", Counter, "States inserted.", info.inserts);
        p.one("xpf_state_removals_total", Counter, "States removed.", info.removals);
        p.one("xpf_packets_total", Counter, "Packets through the filter.", info.stats.packets);
        p.one("xpf_bytes_total", Counter, "Bytes through the filter.", info.stats.bytes);
        p.one("xpf_passed_packets_total", Counter, "Packets passed.", info.stats.passed);
        p.one("xpf_dropped_packets_total", Counter, "Packets dropped.", info.stats.dropped);
        p.each(
            "xpf_counters_total",
            Counter,
            "pfctl -si's Counters: why packets were decided or dropped, by pf's names.",
            "counter",
            xpf_wire::Reason::ALL.iter().map(|&r| (r.name(), info.counter(r))),
        );
        p.one(
            "xpf_block_return_answers_total",
            Counter,
            "RSTs and ICMP errors sent for block return.",
            info.stats.returned,
        );
        p.one(
            "xpf_block_return_rate_limited_total",
            Counter,
            "block return answers not sent (rate limit).",
            info.stats.return_limited,
        );
        p.one("xpf_synproxy_segments_sent_total", Counter, "Segments synproxy sent.", info.stats.proxied);
        for (group, help, names, values) in info.groups() {
            for level in [false, true] {
                let rows: Vec<_> = names.iter().zip(values).filter(|(n, _)| n.level == level).collect();
                if rows.is_empty() {
                    continue;
                }
                let (name, kind) =
                    if level { (format!("xpf_{group}"), Gauge) } else { (format!("xpf_{group}_total"), Counter) };
                p.each(&name, kind, help, "counter", rows.into_iter().map(|(n, v)| (n.key, *v)));
            }
        }
        p.one("xpf_syncookies_active", Gauge, "1 while SYN cookies are on.", info.syncookies.1 as u64);
        p.one("xpf_halfopen_states", Gauge, "Half-open TCP states.", info.syncookies.2);

        // Per rule: evaluations since load; the states in the table now and what they carried.
        let (_, cur) = self.slot.current();
        let sums = self.rule_sums()?;
        // The main ruleset's rules and those loaded into anchors at run time.
        let every = self.every_rule(&cur);
        let labels: Vec<(u32, String, &str)> =
            every.iter().map(|(i, r, _)| (*i, i.to_string(), r.label.as_deref().unwrap_or(""))).collect();
        p.family("xpf_rule_evaluations_total", Counter, "Times each rule was evaluated, since the ruleset loaded.");
        for ((_, nr, label), (_, _, ev)) in labels.iter().zip(&every) {
            p.sample("xpf_rule_evaluations_total", &[("rule", nr), ("label", label)], *ev);
        }
        let count = |i: &u32| sums.get(i).copied().unwrap_or_default();
        p.family("xpf_rule_states", Gauge, "States each rule made, in the table now.");
        for (i, nr, label) in &labels {
            p.sample("xpf_rule_states", &[("rule", nr), ("label", label)], count(i).states);
        }
        p.family("xpf_rule_state_creations_total", Counter, "States each rule made, since the ruleset loaded.");
        for (i, nr, label) in &labels {
            p.sample("xpf_rule_state_creations_total", &[("rule", nr), ("label", label)], count(i).created);
        }
        for (name, what) in [("xpf_rule_packets_total", "Packets"), ("xpf_rule_bytes_total", "Bytes")] {
            p.family(
                name,
                Counter,
                &format!(
                    "{what} each rule passed (by its states) or blocked, in and out, since the ruleset loaded or -z."
                ),
            );
            for (i, nr, label) in &labels {
                let c = count(i);
                let v = if what == "Packets" { c.packets } else { c.bytes };
                p.sample(name, &[("rule", nr), ("label", label), ("direction", "in")], v[0]);
                p.sample(name, &[("rule", nr), ("label", label), ("direction", "out")], v[1]);
            }
        }
        if !self.loaded.parsed.xrules.is_empty() {
            p.family(
                "xpf_translation_rule_evaluations_total",
                Counter,
                "Times each translation rule (nat, rdr, binat) was evaluated, since the ruleset loaded.",
            );
            for i in 0..self.loaded.parsed.xrules.len() {
                p.sample(
                    "xpf_translation_rule_evaluations_total",
                    &[("rule", &i.to_string())],
                    cur.xlate_evaluations(i),
                );
            }
        }
        p.family("xpf_table_entries", Gauge, "Addresses in each table.");
        for (n, t) in cur.tables.iter().filter(|(n, _)| !n.starts_with("__")) {
            p.sample("xpf_table_entries", &[("table", n)], t.len() as u64);
        }
        p.family(
            "xpf_table_matches_total",
            Counter,
            "Packets that matched an entry of each table (the entries' counters: -T zero resets them).",
        );
        for (n, t) in cur.tables.iter().filter(|(n, _)| !n.starts_with("__")) {
            p.sample("xpf_table_matches_total", &[("table", n)], t.matches());
        }
        let ports = self.nat_ports()?;
        if !ports.is_empty() {
            let proto = |c: u8| match c {
                1 => "icmp".to_string(),
                6 => "tcp".to_string(),
                17 => "udp".to_string(),
                n => n.to_string(),
            };
            for (name, help, pick) in [
                ("xpf_nat_address_ports_used", "Translation: source ports in use per pool address and protocol.", 0),
                ("xpf_nat_address_ports", "Translation: source ports in the ranges drawn from each pool address.", 1),
            ] {
                p.family(name, Gauge, help);
                for (a, c, used, all) in &ports {
                    let v = if pick == 0 { *used } else { *all };
                    p.sample(name, &[("address", &a.to_string()), ("proto", &proto(*c))], v);
                }
            }
        }

        // The I/O around the engine, by the fields' names.
        let mut fwd = serde_json::to_value(io).unwrap_or_default();
        let fast = fwd.as_object_mut().and_then(|m| m.remove("fast")).unwrap_or_default();
        let host = fwd.as_object_mut().and_then(|m| m.remove("host")).unwrap_or_default();
        let numbers = |v: &serde_json::Value| -> Vec<(String, u64)> {
            v.as_object().map_or(Vec::new(), |m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect())
        };
        if let Some(name) = self.loaded.parsed.loginterface.as_deref() {
            let l = &io.loginterface;
            let fams = [(0, "inet"), (1, "inet6")];
            let dirs = [(0, "in"), (1, "out")];
            p.family("xpf_loginterface_bytes_total", Counter, "set loginterface: bytes by family and direction.");
            for (f, af) in fams {
                for (d, dir) in dirs {
                    p.sample(
                        "xpf_loginterface_bytes_total",
                        &[("interface", name), ("af", af), ("direction", dir)],
                        l.bytes[f][d],
                    );
                }
            }
            p.family(
                "xpf_loginterface_packets_total",
                Counter,
                "set loginterface: packets by family, direction and action.",
            );
            for (f, af) in fams {
                for (d, dir) in dirs {
                    for (action, v) in [("pass", l.passed[f][d]), ("block", l.blocked[f][d])] {
                        let labels = [("interface", name), ("af", af), ("direction", dir), ("action", action)];
                        p.sample("xpf_loginterface_packets_total", &labels, v);
                    }
                }
            }
        }
        p.each(
            "xpf_forwarding_total",
            Counter,
            "The I/O layer around the filter: forwarded, checksums finished, drops and hand-offs.",
            "counter",
            numbers(&fwd),
        );
        p.each("xpf_host_total", Counter, "The firewall's own traffic through the rules.", "counter", numbers(&host));
        let fast = numbers(&fast);
        let is_level = |k: &str| matches!(k, "flows" | "tcp" | "translated" | "last_pass_us" | "last_pass_entries");
        p.each(
            "xpf_fastpath",
            Gauge,
            "The fast path now: flow directions in its tables (TCP and translated among them), its last read-back pass.",
            "counter",
            fast.iter().filter(|(k, _)| is_level(k)).map(|(k, v)| (k, *v)),
        );
        p.each(
            "xpf_fastpath_total",
            Counter,
            "The fast path: flows installed, removed, refused, TCP judged by xpfd, packets and bytes it forwarded.",
            "counter",
            fast.iter().filter(|(k, _)| !is_level(k)).map(|(k, v)| (k, *v)),
        );
        let ifname = |i: u32| xpf_xdp::netlink::ifname(i).unwrap_or_else(|| format!("if{i}"));
        type Field = fn(&xpf_xdp::xsk::XskStats) -> u64;
        let socket: [(&str, &str, Field); 9] = [
            ("xpf_socket_received_packets_total", "Frames received by each socket (interface, queue).", |x| x.rx),
            ("xpf_socket_sent_packets_total", "Frames sent by each socket.", |x| x.tx),
            (
                "xpf_socket_sent_xdp_packets_total",
                "Of the frames sent, those sent through XDP (batches by XDP redirect).",
                |x| x.tx_xdp,
            ),
            ("xpf_socket_tx_full_total", "Frames not sent: the transmit ring or its free frames were full.", |x| {
                x.tx_full
            }),
            ("xpf_socket_rx_dropped_total", "Frames the kernel dropped before the socket (all causes).", |x| {
                x.rx_drops()
            }),
            ("xpf_socket_rx_ring_full_total", "Frames the kernel dropped: the receive ring was full.", |x| {
                x.rx_ring_full
            }),
            ("xpf_socket_fill_empty_total", "Times the kernel found the fill ring empty.", |x| x.fill_empty),
            ("xpf_socket_syn_received_total", "New TCP connections received on the SYN socket.", |x| x.syn_rx),
            ("xpf_socket_syn_dropped_total", "New TCP connections the kernel dropped: the SYN ring was full.", |x| {
                x.syn_dropped
            }),
        ];
        for (name, help, f) in socket {
            p.family(name, Counter, help);
            for x in &xs {
                p.sample(name, &[("interface", &ifname(x.ifindex)), ("queue", &x.queue.to_string())], f(x));
            }
        }
        let steer: Vec<(String, [u64; xpf_xdp::steer::COUNTERS.len()])> =
            self.steers.lock().unwrap().iter().map(|(n, s)| (n.clone(), s.counters())).collect();
        if !steer.is_empty() {
            p.family("xpf_steering_total", Counter, "The XDP steering program's decisions, per interface.");
            for (n, c) in &steer {
                for ((k, _), v) in xpf_xdp::steer::COUNTERS.iter().zip(c) {
                    p.sample("xpf_steering_total", &[("interface", n), ("counter", k)], *v);
                }
            }
        }
        if let Some(m) = &self.skb_stats {
            p.family(
                "xpf_skb_fastpath_total",
                Counter,
                "Packet mode's fast path (socket filter and tcx program): frames by what became of them.",
            );
            for (i, (k, _)) in xpf_xdp::skbpath::SKB_COUNTERS.iter().enumerate() {
                p.sample("xpf_skb_fastpath_total", &[("counter", k)], m.percpu_sum(i as u32).unwrap_or(0));
            }
        }
        if let Some(e) = &self.egresses {
            p.family("xpf_fastpath_egress_able", Gauge, "1 when an interface takes the fast path's frames (probed).");
            for (n, _) in &steer {
                let ok = xpf_xdp::netlink::ifindex(n).is_ok_and(|i| e.ok(i));
                p.sample("xpf_fastpath_egress_able", &[("interface", n)], ok as u64);
            }
        }
        if !pc.is_empty() {
            p.family(
                "xpf_packet_mode_total",
                Counter,
                "Packet mode (AF_PACKET): received frames by what became of them.",
            );
            for (i, c) in &pc {
                for ((k, _), v) in xpf_xdp::packet::PACKET_COUNTERS.iter().zip(c) {
                    p.sample("xpf_packet_mode_total", &[("interface", &ifname(*i)), ("counter", k)], *v);
                }
            }
        }
        if let Some(s) = &self.sync {
            let (_, v) = crate::sync::render(s);
            let m = numbers(&v);
            p.each(
                "xpf_sync_total",
                Counter,
                "State sync (pfsync): messages, refusals and states applied.",
                "counter",
                m,
            );
            let d = &v["defer"]["stats"];
            let waiting = d["waiting"].as_u64().unwrap_or(0);
            p.one("xpf_sync_deferred_waiting", Gauge, "Packets held for the peer's insert ack now (defer).", waiting);
            p.family("xpf_sync_ack_max_seconds", Gauge, "The longest a deferred packet waited for the peer's ack.");
            p.sample_f("xpf_sync_ack_max_seconds", &[], d["ack_us_max"].as_u64().unwrap_or(0) as f64 / 1e6);
        }
        if let Some(l) = &self.pflog {
            let rows = l.rows();
            let (levels, events): (Vec<_>, Vec<_>) = rows.iter().partition(|(k, _, _)| *k == "readers");
            p.each(
                "xpf_pflog_total",
                Counter,
                "pflog: packets logged, lost, bytes written.",
                "counter",
                events.iter().map(|(k, _, v)| (*k, *v)),
            );
            p.each(
                "xpf_pflog",
                Gauge,
                "pflog: live readers now (xpfctl log).",
                "counter",
                levels.iter().map(|(k, _, v)| (*k, *v)),
            );
        }
        if let Some(f) = &self.pflow {
            let rows = f.rows();
            p.each(
                "xpf_pflow_total",
                Counter,
                "pflow: flow records and NAT events sent, messages, bytes, losses.",
                "counter",
                rows.iter().map(|(k, _, v)| (*k, *v)),
            );
        }
        Ok(p.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_label_values_and_name_their_type() {
        let mut p = Page::default();
        p.family("xpf_rule_evaluations_total", Kind::Counter, "Evaluations.\nSince load.");
        p.sample("xpf_rule_evaluations_total", &[("rule", "0"), ("label", "a\"b\\c\nd")], 7);
        assert_eq!(
            p.out,
            "# HELP xpf_rule_evaluations_total Evaluations.\\nSince load.\n# TYPE xpf_rule_evaluations_total counter\n\
             xpf_rule_evaluations_total{rule=\"0\",label=\"a\\\"b\\\\c\\nd\"} 7\n"
        );
    }

    #[test]
    fn a_scrape_is_answered_by_the_loop_and_others_are_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, waiting) = mpsc::channel::<Sender<String>>();
        let (wake_tx, wake) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let _ = serve(s, &tx, &wake_tx);
            }
        });
        // The loop's side: answer what comes.
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while (&wake).read(&mut b).is_ok_and(|n| n > 0) {
                for r in waiting.try_iter() {
                    let _ = r.send("xpf_states 3\n".into());
                }
            }
        });
        let get = |req: &[u8]| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(req).unwrap();
            let mut s = String::new();
            c.read_to_string(&mut s).unwrap();
            s
        };
        let ok = get(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nxpf_states 3\n"), "{ok}");
        assert!(ok.contains("version=0.0.4"));
        assert!(get(b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let big = vec![b'a'; MAX_REQUEST + 10];
        assert!(get(&big).starts_with("HTTP/1.1 400"));
    }
}
