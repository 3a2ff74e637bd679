//! `pfctl -si`: the status a worker (or the sum of workers) reports, in pfctl's layout.

use crate::{Policy, Stats, Worker};
use std::fmt::Write;
use xpf_wire::Reason;

/// A snapshot of the counters `pfctl -si` prints, summed over workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    pub states: u64,
    pub limit: u64,
    pub searches: u64,
    pub inserts: u64,
    pub removals: u64,
    pub stats: Stats,
    /// pf's "Limit Counters", in [`LIMIT_NAMES`] order.
    pub limits: [u64; LIMIT_NAMES.len()],
    /// What state tracking refused or did, in [`TRACKING_NAMES`] order.
    pub tracking: [u64; TRACKING_NAMES.len()],
    /// Reassembly, in [`FRAG_NAMES`] order.
    pub fragments: [u64; FRAG_NAMES.len()],
    /// `set syncookies`: the mode, whether on (in any worker), the half-open TCP states, and
    /// the counters in [`COOKIE_NAMES`] order.
    pub syncookies: (crate::syncookie::Mode, bool, u64, [u64; COOKIE_NAMES.len()]),
    /// Translation, in [`NAT_NAMES`] order.
    pub nat: [u64; NAT_NAMES.len()],
}

/// One counter's names, declared once: `key` for JSON and metrics (stable: snake case, not
/// derived from the text), `text` as the pfctl-style listing shows it, and whether it is a
/// level (a gauge: a count of things now) rather than a count of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name {
    pub key: &'static str,
    pub text: &'static str,
    pub level: bool,
}

const fn ev(key: &'static str, text: &'static str) -> Name {
    Name { key, text, level: false }
}

const fn lv(key: &'static str, text: &'static str) -> Name {
    Name { key, text, level: true }
}

/// Translation counters (`nat-to`, `rdr-to`, `binat-to`; crate::nat).
pub const NAT_NAMES: [Name; 10] = [
    ev("translated_states", "translated states"),
    lv("source_ports_in_use", "source ports in use"),
    lv("source_ports_in_pools", "source ports in pools"),
    ev("ports_shared", "ports shared"),
    ev("ports_before_hold", "ports before their hold"),
    ev("port_collisions", "port collisions"),
    ev("no_port_left", "no port left"),
    ev("no_pool_address", "no pool address"),
    ev("endpoint_independent_reuses", "endpoint-independent reuses"),
    lv("sticky_sources", "sticky-address sources"),
];

/// Syncookie counters (pfctl -si's "synfloods detected", "syncookies sent", "syncookies
/// validated", and the ACKs that failed).
pub const COOKIE_NAMES: [Name; 4] = [
    ev("synfloods_detected", "synfloods detected"),
    ev("sent", "syncookies sent"),
    ev("validated", "syncookies validated"),
    ev("invalid", "syncookies invalid"),
];

/// Reassembly counters (`set reassemble yes`).
pub const FRAG_NAMES: [Name; 8] = [
    lv("held", "held now"),
    ev("reassembled", "reassembled"),
    ev("overlapping", "overlapping (teardrop)"),
    ev("oversized", "oversized"),
    ev("bad_length", "bad length"),
    ev("after_drop", "after a drop"),
    ev("timed_out", "timed out"),
    ev("flushed", "flushed (limit frags)"),
];

/// pfctl -si -v's limit counters that xpf keeps.
pub const LIMIT_NAMES: [Name; 8] = [
    ev("max_states", "max states per rule"),
    ev("max_src_states", "max-src-states"),
    ev("max_src_nodes", "max-src-nodes"),
    ev("max_src_conn", "max-src-conn"),
    ev("max_src_conn_rate", "max-src-conn-rate"),
    ev("overload_table_insertion", "overload table insertion"),
    ev("overload_flush_states", "overload flush states"),
    ev("src_nodes_limit", "src-nodes limit"),
];

/// xpf's detail behind pf's state-mismatch counter, and state reuse.
pub const TRACKING_NAMES: [Name; 3] = [
    ev("tcp_out_of_window", "tcp out of window"),
    ev("icmp_error_mismatch", "icmp error mismatch"),
    ev("tcp_state_reused", "tcp state reused"),
];

fn add_all(a: &mut [u64], b: &[u64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

fn limit_values(c: &xpf_state::LimitCounters) -> [u64; LIMIT_NAMES.len()] {
    [
        c.states,
        c.src_states,
        c.src_nodes,
        c.src_conn,
        c.src_conn_rate,
        c.overload_table,
        c.overload_flush,
        c.src_nodes_limit,
    ]
}

impl Info {
    pub fn of<P: Policy>(w: &Worker<P>) -> Info {
        let (a, b) = (&w.t4.counters, &w.t6.counters);
        Info {
            states: w.states() as u64,
            limit: w.limit() as u64,
            searches: a.searches + b.searches,
            inserts: a.inserts + b.inserts,
            removals: a.removals + b.removals,
            stats: w.stats,
            limits: {
                let (x, y) = (limit_values(&w.t4.track.counters), limit_values(&w.t6.track.counters));
                std::array::from_fn(|i| x[i] + y[i])
            },
            tracking: [a.window_drops + b.window_drops, a.icmp_mismatch + b.icmp_mismatch, a.reused + b.reused],
            syncookies: {
                let (mode, on, c) = w.syncookies();
                (mode, on, w.halfopen() as u64, [c.floods, c.sent, c.valid, c.invalid])
            },
            nat: {
                let c = &w.nat.counters;
                let (used, all) = w.nat.ports_used();
                [
                    c.translated,
                    used,
                    all,
                    c.shared,
                    c.early,
                    c.collisions,
                    c.exhausted,
                    c.no_address,
                    c.mapped,
                    w.nat.sticky_sources(),
                ]
            },
            fragments: w.frags.as_ref().map_or([0; FRAG_NAMES.len()], |f| {
                let c = f.counters;
                [c.held, c.reassembled, c.overlaps, c.oversized, c.bad, c.after_drop, c.timeouts, c.flushed]
            }),
        }
    }

    /// Adds another worker's counters (the limit is per worker).
    pub fn add(&mut self, o: &Info) {
        self.states += o.states;
        self.limit += o.limit;
        self.searches += o.searches;
        self.inserts += o.inserts;
        self.removals += o.removals;
        let (s, t) = (&mut self.stats, &o.stats);
        s.packets += t.packets;
        s.bytes += t.bytes;
        s.passed += t.passed;
        s.dropped += t.dropped;
        s.to_host += t.to_host;
        s.rule_passes += t.rule_passes;
        s.returned += t.returned;
        s.return_limited += t.return_limited;
        s.proxied += t.proxied;
        add_all(&mut s.reasons, &t.reasons);
        add_all(&mut self.limits, &o.limits);
        add_all(&mut self.tracking, &o.tracking);
        add_all(&mut self.fragments, &o.fragments);
        add_all(&mut self.nat, &o.nat);
        self.syncookies.0 = o.syncookies.0;
        self.syncookies.1 |= o.syncookies.1;
        self.syncookies.2 += o.syncookies.2;
        add_all(&mut self.syncookies.3, &o.syncookies.3);
    }

    /// The named counter groups, for JSON and metrics: (key, what they count, names, values).
    pub fn groups(&self) -> [(&'static str, &'static str, &'static [Name], &[u64]); 5] {
        [
            (
                "limit_counters",
                "States refused or removed by a rule's limits (pfctl -si -v's Limit Counters).",
                &LIMIT_NAMES,
                &self.limits,
            ),
            (
                "tracking",
                "State tracking's refusals behind pf's state-mismatch, and states reused.",
                &TRACKING_NAMES,
                &self.tracking,
            ),
            ("fragments", "IP reassembly (set reassemble).", &FRAG_NAMES, &self.fragments),
            ("syncookies", "SYN cookies (set syncookies).", &COOKIE_NAMES, &self.syncookies.3),
            ("nat", "Translation (nat-to, rdr-to, binat-to) and its port allocator.", &NAT_NAMES, &self.nat),
        ]
    }

    /// pf's counter for `r`: `match` counts every packet a rule decided, passed or blocked.
    pub fn counter(&self, r: Reason) -> u64 {
        let n = self.stats.reasons[r as usize];
        if r == Reason::Match {
            n + self.stats.rule_passes
        } else {
            n
        }
    }

    /// The text of `pfctl -si` after `uptime_secs` seconds, enabled all along, rates being
    /// totals over uptime. xpf's finer drop reasons follow pf's seventeen.
    pub fn render(&self, uptime_secs: u64) -> String {
        self.render_status(uptime_secs, (true, uptime_secs), "err")
    }

    /// [`Info::render`] with pf's status: enabled or not, for how many seconds (the counters'
    /// rates stay over the whole uptime: they count since then), and the debug level's name.
    pub fn render_status(&self, uptime_secs: u64, (enabled, for_secs): (bool, u64), debug: &str) -> String {
        let mut o = String::new();
        let t = for_secs;
        let (d, h, m, s) = (t / 86400, t / 3600 % 24, t / 60 % 60, t % 60);
        let what = if enabled { "Enabled" } else { "Disabled" };
        let _ = writeln!(
            o,
            "{:<44}{:>15}\n",
            format!("Status: {what} for {d} days {h:02}:{m:02}:{s:02}"),
            format!("Debug: {debug}")
        );
        let rate = |x: u64| {
            if uptime_secs > 0 {
                format!("{:>14.1}/s", x as f64 / uptime_secs as f64)
            } else {
                format!("{:>16}", "")
            }
        };
        let _ = writeln!(o, "{:<27} {:>14} {:>16}", "State Table", "Total", "Rate");
        let _ = writeln!(o, "  {:<25} {:>14}", "current entries", self.states);
        for (name, v) in [("searches", self.searches), ("inserts", self.inserts), ("removals", self.removals)] {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name, v, rate(v));
        }
        let _ = writeln!(o, "Counters");
        for r in Reason::ALL {
            let v = self.counter(*r);
            let _ = writeln!(o, "  {:<25} {:>14} {}", r.name(), v, rate(v));
        }
        let _ = writeln!(o, "Sent by the filter");
        for (name, v) in [
            ("block return answers", self.stats.returned),
            ("block return rate-limited", self.stats.return_limited),
            ("synproxy segments sent", self.stats.proxied),
        ] {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name, v, rate(v));
        }
        let _ = writeln!(o, "Limit Counters");
        for (name, v) in LIMIT_NAMES.iter().zip(self.limits) {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name.text, v, rate(v));
        }
        let _ = writeln!(o, "State Tracking");
        for (name, v) in TRACKING_NAMES.iter().zip(self.tracking) {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name.text, v, rate(v));
        }
        let (mode, on, halfopen, c) = &self.syncookies;
        let _ = writeln!(o, "Syncookies");
        let _ = writeln!(o, "  {:<25} {:>14}", "mode", mode.name());
        let _ = writeln!(o, "  {:<25} {:>14}", "active", if *on { "active" } else { "inactive" });
        let _ = writeln!(o, "  {:<25} {:>14}", "half-open states", halfopen);
        for (name, v) in COOKIE_NAMES.iter().zip(c) {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name.text, v, rate(*v));
        }
        let _ = writeln!(o, "Fragments");
        for (name, v) in FRAG_NAMES.iter().zip(self.fragments) {
            let _ = writeln!(o, "  {:<25} {:>14} {}", name.text, v, rate(v));
        }
        let _ = writeln!(o, "Translation");
        for (name, v) in NAT_NAMES.iter().zip(self.nat) {
            // Levels (ports in use, in pools) have no rate.
            if name.level {
                let _ = writeln!(o, "  {:<25} {:>14}", name.text, v);
            } else {
                let _ = writeln!(o, "  {:<25} {:>14} {}", name.text, v, rate(v));
            }
        }
        o
    }
}
