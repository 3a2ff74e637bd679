//! Per-rule state limits and source tracking: pf's `max`, `max-src-states`, `max-src-nodes`,
//! `max-src-conn`, `max-src-conn-rate` and per-rule timeouts.
//!
//! Only states made by a rule with such options carry an [`Extra`] (flag `TO_EXTRA` in the
//! state); the others pay nothing. A rule is known here by a limiter id that its compiled
//! form draws once (a reload draws new ones), so, as in pf, the states of a replaced rule
//! count against that rule and the new rule starts from zero. Source nodes (pf's
//! `pf_src_node`) are keyed by source address and, with `source-track rule`, the limiter id
//! (0: `source-track global`, shared by every rule). The engine decides; this module keeps
//! the counts and releases them when a state goes, whatever removes it.

use crate::timeout::{Timeout, Timeouts};
use std::collections::HashMap;
use xpf_wire::Addr;

/// pf's PF_THRESHOLD_MULT: the rate counter's fixed point.
const MULT: u64 = 1000;

/// pf's `pf_threshold`: a connection-rate estimate that decays linearly over `seconds`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Threshold {
    /// Connections allowed in `seconds`, times MULT (0: no limit).
    pub limit: u64,
    pub seconds: u32,
    pub count: u64,
    pub last: u32,
}

impl Threshold {
    pub fn new(conns: u32, seconds: u32) -> Threshold {
        Threshold { limit: conns as u64 * MULT, seconds, count: 0, last: 0 }
    }
    /// One more connection at `now` (pf_add_threshold).
    pub fn add(&mut self, now: u32) {
        let diff = now.saturating_sub(self.last);
        if diff >= self.seconds {
            self.count = 0;
        } else {
            self.count -= self.count * diff as u64 / self.seconds as u64;
        }
        self.count += MULT;
        self.last = now;
    }
    pub fn exceeded(&self) -> bool {
        self.limit != 0 && self.count > self.limit
    }
    /// The rate as pfctl -sS prints it: connections per `seconds`.
    pub fn rate(&self) -> u64 {
        self.count / MULT
    }
}

/// What a state made by a limited rule holds.
#[derive(Debug, Clone, Copy)]
pub struct Extra {
    pub limiter: u32,
    /// Its source node, if the rule tracks sources.
    pub node: Option<(Addr, u32)>,
    /// Counted as an established connection of its source node (`max-src-conn`).
    pub conn: bool,
}

/// A source node (pf's `pf_src_node`; pfctl -sS).
#[derive(Debug, Clone, Copy)]
pub struct SrcNode {
    pub states: u32,
    pub conn: u32,
    pub rate: Threshold,
    pub creation: u32,
    /// When the last state went (the node lives on for the `src.track` timeout).
    pub expire: u32,
    /// The limiter that made it (counted in its `max-src-nodes`).
    pub limiter: u32,
    pub rule: u32,
}

/// What pf.conf says of a rule's states (`keep state (max 10, source-track rule, ...)`): the
/// compiled ruleset holds one per limited rule; 0 means no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleLimits {
    /// Drawn once per compiled rule (never 0).
    pub limiter: u32,
    pub max: u32,
    pub max_src_states: u32,
    pub max_src_nodes: u32,
    pub max_src_conn: u32,
    /// (connections, seconds)
    pub max_src_conn_rate: (u32, u32),
    /// Sources are tracked (any max-src-* or source-track).
    pub track_src: bool,
    /// `source-track rule`: this rule's own source nodes, not the shared ones.
    pub per_rule_nodes: bool,
    pub overload: Option<Overload>,
    /// `keep state (... udp.multiple 5 ...)` overrides.
    pub timeouts: Vec<(Timeout, u32)>,
}

/// `overload <table> [flush [global]]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overload {
    pub table: String,
    pub flush: bool,
    pub global: bool,
}

/// A limited rule's counts, while it has states or nodes, and its limits.
#[derive(Debug, Clone, Default)]
pub struct RuleCount {
    pub states: u32,
    pub nodes: u32,
    pub limits: RuleLimits,
}

/// pf's "Limit Counters" (pfctl -si -v).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounters {
    /// "max states per rule"
    pub states: u64,
    /// "max-src-states"
    pub src_states: u64,
    /// "max-src-nodes"
    pub src_nodes: u64,
    /// "max-src-conn"
    pub src_conn: u64,
    /// "max-src-conn-rate"
    pub src_conn_rate: u64,
    /// "overload table insertion"
    pub overload_table: u64,
    /// "overload flush states"
    pub overload_flush: u64,
    /// A new source node refused at `set limit src-nodes` (pf's src-limit reason; pf
    /// keeps no limit counter of its own for it).
    pub src_nodes_limit: u64,
}

/// A source that went over `max-src-conn` or `max-src-conn-rate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overloaded {
    pub src: Addr,
    pub limiter: u32,
    pub overload: Option<Overload>,
}

/// Why a new state may not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max`: pf's state-limit reason.
    Max,
    /// `max-src-states`, `max-src-nodes`: pf's src-limit.
    Src,
}

#[derive(Debug, Default)]
pub struct Tracking {
    pub extra: HashMap<u32, Extra>,
    pub rules: HashMap<u32, RuleCount>,
    pub nodes: HashMap<(Addr, u32), SrcNode>,
    pub counters: LimitCounters,
    /// Sources to add to their overload table: the daemon takes them between batches.
    pub overloads: Vec<(String, Addr)>,
    pub next_purge: u32,
    /// `set limit src-nodes`: the source nodes this table and the other family's may hold
    /// together (this worker's share; 0: no limit).
    pub node_limit: u32,
}

impl Tracking {
    pub fn rule_states(&self, limiter: u32) -> u32 {
        self.rules.get(&limiter).map_or(0, |r| r.states)
    }

    fn node_key(l: &RuleLimits, src: Addr) -> (Addr, u32) {
        (src, if l.per_rule_nodes { l.limiter } else { 0 })
    }

    /// Whether a state from `src` may be made under `l`, with the other family's table's
    /// tracking `elsewhere` (a rule's `max` and `set limit src-nodes` count both; pf_test_rule's
    /// and pf_insert_src_node's checks).
    pub fn admit(&mut self, l: &RuleLimits, src: Addr, elsewhere: &Tracking) -> Result<(), Refusal> {
        if l.max != 0 && self.rule_states(l.limiter) + elsewhere.rule_states(l.limiter) >= l.max {
            self.counters.states += 1;
            return Err(Refusal::Max);
        }
        if !l.track_src {
            return Ok(());
        }
        match self.nodes.get(&Self::node_key(l, src)) {
            Some(n) if l.max_src_states != 0 && n.states >= l.max_src_states => {
                self.counters.src_states += 1;
                Err(Refusal::Src)
            }
            Some(_) => Ok(()),
            None if l.max_src_nodes != 0 && self.rules.get(&l.limiter).is_some_and(|r| r.nodes >= l.max_src_nodes) => {
                self.counters.src_nodes += 1;
                Err(Refusal::Src)
            }
            None if self.node_limit != 0 && self.nodes.len() + elsewhere.nodes.len() >= self.node_limit as usize => {
                self.counters.src_nodes_limit += 1;
                Err(Refusal::Src)
            }
            None => Ok(()),
        }
    }

    /// Accounts a new state `id` from `src`, made by rule number `rule`, to its limits and
    /// source node (made if needed).
    pub fn attach(&mut self, id: u32, l: &RuleLimits, src: Addr, rule: u32, now: u32) {
        let r = self.rules.entry(l.limiter).or_insert_with(|| RuleCount { limits: l.clone(), ..Default::default() });
        r.states += 1;
        let node = l.track_src.then(|| {
            let k = Self::node_key(l, src);
            let n = self.nodes.entry(k).or_insert_with(|| {
                r.nodes += 1;
                let (c, s) = l.max_src_conn_rate;
                SrcNode {
                    states: 0,
                    conn: 0,
                    rate: Threshold::new(c, s),
                    creation: now,
                    expire: 0,
                    limiter: l.limiter,
                    rule,
                }
            });
            n.states += 1;
            k
        });
        self.extra.insert(id, Extra { limiter: l.limiter, node, conn: false });
    }

    /// State `id` completed a TCP handshake at `now` (pf_src_connlimit): counted as a
    /// connection of its source, and Some when that source is now over its rule's
    /// `max-src-conn` or `max-src-conn-rate` (the caller kills the state, and flushes and
    /// blocks the source as `overload` says).
    pub fn established(&mut self, id: u32, now: u32) -> Option<Overloaded> {
        let x = self.extra.get_mut(&id)?;
        if x.conn {
            return None;
        }
        let k = x.node?;
        x.conn = true;
        let limiter = x.limiter;
        let n = self.nodes.get_mut(&k)?;
        n.conn += 1;
        n.rate.add(now);
        let l = &self.rules.get(&limiter)?.limits;
        let mut bad = false;
        if l.max_src_conn != 0 && n.conn > l.max_src_conn {
            self.counters.src_conn += 1;
            bad = true;
        }
        if n.rate.exceeded() {
            self.counters.src_conn_rate += 1;
            bad = true;
        }
        if !bad {
            return None;
        }
        if let Some(o) = &l.overload {
            self.counters.overload_table += 1;
            self.overloads.push((o.table.clone(), k.0));
        }
        Some(Overloaded { src: k.0, limiter, overload: l.overload.clone() })
    }

    /// Releases what state `id` held, at `now`.
    pub fn detach(&mut self, id: u32, now: u32, src_track: u32) {
        let Some(x) = self.extra.remove(&id) else { return };
        if let Some(k) = x.node {
            if let Some(n) = self.nodes.get_mut(&k) {
                n.states = n.states.saturating_sub(1);
                if x.conn {
                    n.conn = n.conn.saturating_sub(1);
                }
                if n.states == 0 {
                    n.expire = now;
                    if src_track == 0 {
                        let lim = n.limiter;
                        self.nodes.remove(&k);
                        self.node_gone(lim);
                    }
                }
            }
        }
        if let Some(r) = self.rules.get_mut(&x.limiter) {
            r.states = r.states.saturating_sub(1);
            if r.states == 0 && r.nodes == 0 {
                self.rules.remove(&x.limiter);
            }
        }
    }

    fn node_gone(&mut self, limiter: u32) {
        if let Some(r) = self.rules.get_mut(&limiter) {
            r.nodes = r.nodes.saturating_sub(1);
            if r.states == 0 && r.nodes == 0 {
                self.rules.remove(&limiter);
            }
        }
    }

    /// Removes the source nodes whose source `pick` chooses (`pfctl -K`), states or not: their
    /// states stay and no longer count to a node (pf_kill_srcnodes unlinks them); a new state
    /// from the source starts a new node. Returns the nodes removed.
    pub fn kill_nodes(&mut self, mut pick: impl FnMut(&Addr) -> bool) -> u32 {
        let gone: Vec<((Addr, u32), u32)> =
            self.nodes.iter().filter(|(k, _)| pick(&k.0)).map(|(k, n)| (*k, n.limiter)).collect();
        if gone.is_empty() {
            return 0;
        }
        for (k, lim) in &gone {
            self.nodes.remove(k);
            self.node_gone(*lim);
        }
        for x in self.extra.values_mut() {
            if x.node.is_some_and(|k| !self.nodes.contains_key(&k)) {
                x.node = None;
            }
        }
        gone.len() as u32
    }

    /// Removes the source nodes without states whose `src.track` time has passed.
    pub fn purge_nodes(&mut self, now: u32, src_track: u32) -> usize {
        let gone: Vec<((Addr, u32), u32)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.states == 0 && n.expire.saturating_add(src_track) <= now)
            .map(|(k, n)| (*k, n.limiter))
            .collect();
        for (k, lim) in &gone {
            self.nodes.remove(k);
            self.node_gone(*lim);
        }
        gone.len()
    }

    /// The timeout of `class` for a state of `limiter` (its rule's override, else `global`),
    /// scaled as pf_state_expires does, with the rule's adaptive values if it has them.
    pub fn timeout(&self, limiter: u32, class: Timeout, global: &Timeouts, states: u32, limit: u32) -> u32 {
        let Some(r) = self.rules.get(&limiter).filter(|r| !r.limits.timeouts.is_empty()) else {
            return global.effective(class, states, limit);
        };
        let mut t = global.clone();
        let mut states = states;
        for &(c, v) in &r.limits.timeouts {
            match c {
                // A rule's adaptive values apply only when it sets a start, and then to the
                // rule's own states (pf_state_expires); 0 leaves the global ones.
                Timeout::AdaptiveStart | Timeout::AdaptiveEnd if v == 0 => {}
                Timeout::AdaptiveStart => {
                    states = r.states;
                    t.set(c, v);
                }
                _ => t.set(c, v),
            }
        }
        t.effective(class, states, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_decays_linearly_like_pf() {
        let mut t = Threshold::new(3, 10);
        for now in [100, 100, 100] {
            t.add(now);
        }
        assert!(!t.exceeded(), "3 in 10 s is the limit, not over it");
        t.add(100);
        assert!(t.exceeded());
        // Half the window later, half the count is gone: 2 + 1 = 3 is not over.
        t.add(105);
        assert_eq!(t.count, 3000);
        assert!(!t.exceeded());
        // A whole window later the count restarts.
        t.add(200);
        assert_eq!(t.rate(), 1);
    }

    fn lim(limiter: u32) -> RuleLimits {
        RuleLimits { limiter, track_src: true, ..Default::default() }
    }

    #[test]
    fn nodes_and_rules_go_with_their_last_state() {
        let mut tr = Tracking::default();
        let a = Addr::v4([10, 0, 0, 1]);
        let l = lim(7);
        tr.attach(1, &l, a, 0, 0);
        tr.attach(2, &l, a, 0, 0);
        assert_eq!(tr.nodes[&(a, 0)].states, 2);
        assert_eq!(tr.rules[&7].nodes, 1);
        assert_eq!(tr.rule_states(7), 2);
        tr.detach(1, 5, 0);
        assert_eq!(tr.nodes[&(a, 0)].states, 1);
        tr.detach(2, 6, 0);
        assert!(tr.nodes.is_empty() && tr.rules.is_empty() && tr.extra.is_empty());
        // With src.track, the node outlives its states until the timeout.
        tr.attach(3, &l, a, 0, 0);
        tr.detach(3, 10, 30);
        assert_eq!(tr.purge_nodes(39, 30), 0);
        assert_eq!(tr.purge_nodes(40, 30), 1);
        assert!(tr.rules.is_empty());
    }

    #[test]
    fn killed_nodes_leave_their_states_counting_to_no_node() {
        let mut tr = Tracking::default();
        let (a, b) = (Addr::v4([10, 0, 0, 1]), Addr::v4([10, 0, 0, 2]));
        let l = RuleLimits { max_src_nodes: 1, ..lim(7) };
        tr.attach(1, &l, a, 0, 0);
        tr.attach(2, &l, b, 0, 0);
        assert_eq!(tr.kill_nodes(|x| *x == a), 1);
        assert_eq!((tr.nodes.len(), tr.rules[&7].nodes), (1, 1));
        // The killed node's state is the rule's still, but no node's: a new state from the
        // source makes a new node, which the old state's end does not touch.
        assert_eq!(tr.admit(&l, a, &Tracking::default()), Err(Refusal::Src), "b's node is the rule's one");
        tr.detach(2, 5, 0);
        tr.attach(3, &l, a, 0, 0);
        assert_eq!(tr.nodes[&(a, 0)].states, 1);
        tr.detach(1, 6, 0);
        assert_eq!((tr.nodes[&(a, 0)].states, tr.rule_states(7)), (1, 1));
        tr.detach(3, 7, 0);
        assert!(tr.nodes.is_empty() && tr.rules.is_empty() && tr.extra.is_empty());
    }

    #[test]
    fn admit_counts_each_limit() {
        let mut tr = Tracking::default();
        let (a, b) = (Addr::v4([10, 0, 0, 1]), Addr::v4([10, 0, 0, 2]));
        let l = RuleLimits { max: 3, max_src_states: 2, max_src_nodes: 1, ..lim(4) };
        let none = Tracking::default();
        assert_eq!(tr.admit(&l, a, &none), Ok(()));
        tr.attach(1, &l, a, 0, 0);
        tr.attach(2, &l, a, 0, 0);
        assert_eq!(tr.admit(&l, a, &none), Err(Refusal::Src), "max-src-states 2");
        assert_eq!(tr.admit(&l, b, &none), Err(Refusal::Src), "max-src-nodes 1");
        let mut other = Tracking::default();
        other.attach(9, &l, Addr::v4([10, 0, 0, 9]), 0, 0);
        assert_eq!(tr.admit(&l, a, &other), Err(Refusal::Max), "max 3 counts the other family");
        assert_eq!(tr.counters, LimitCounters { states: 1, src_states: 1, src_nodes: 1, ..Default::default() });
    }

    /// `set limit src-nodes`: a new source's node is refused once this table's and the other
    /// family's nodes reach the limit; a source with a node goes on; a node gone frees room.
    #[test]
    fn the_src_nodes_limit_counts_both_families() {
        let l = RuleLimits { track_src: true, ..lim(4) };
        let (a, b, c) = (Addr::v4([10, 0, 0, 1]), Addr::v4([10, 0, 0, 2]), Addr::v4([10, 0, 0, 3]));
        let mut tr = Tracking { node_limit: 2, ..Default::default() };
        let mut other = Tracking::default();
        tr.attach(1, &l, a, 0, 0);
        assert_eq!(tr.admit(&l, b, &other), Ok(()), "one node of two");
        other.attach(2, &l, Addr::v4([10, 0, 0, 9]), 0, 0);
        assert_eq!(tr.admit(&l, b, &other), Err(Refusal::Src), "two in both families: full");
        assert_eq!(tr.admit(&l, a, &other), Ok(()), "a source with a node takes no new one");
        assert_eq!(tr.counters.src_nodes_limit, 1);
        other.detach(2, 5, 0);
        assert_eq!(tr.admit(&l, c, &other), Ok(()));
        tr.node_limit = 0;
        other.attach(3, &l, b, 0, 0);
        assert_eq!(tr.admit(&l, c, &other), Ok(()), "0: no limit");
    }

    #[test]
    fn connection_over_the_limit_overloads_its_source() {
        let mut tr = Tracking::default();
        let a = Addr::v4([10, 0, 0, 1]);
        let o = Overload { table: "bad".into(), flush: true, global: false };
        let l = RuleLimits { max_src_conn: 2, overload: Some(o.clone()), ..lim(5) };
        for id in 1..=3 {
            tr.attach(id, &l, a, 0, 0);
        }
        assert_eq!(tr.established(1, 1), None);
        assert_eq!(tr.established(1, 1), None, "counted once");
        assert_eq!(tr.established(2, 1), None);
        let over = tr.established(3, 1).expect("third connection is over max-src-conn 2");
        assert_eq!(over, Overloaded { src: a, limiter: 5, overload: Some(o) });
        assert_eq!(tr.overloads, vec![("bad".to_string(), a)]);
        assert_eq!(tr.counters.src_conn, 1);
        tr.detach(1, 2, 0);
        assert_eq!(tr.nodes[&(a, 0)].conn, 2);
    }

    #[test]
    fn rule_timeouts_override_the_global_ones() {
        let mut tr = Tracking::default();
        tr.attach(
            1,
            &RuleLimits { limiter: 9, timeouts: vec![(Timeout::UdpMultiple, 5)], ..Default::default() },
            Addr::default(),
            0,
            0,
        );
        let g = Timeouts::default();
        assert_eq!(tr.timeout(9, Timeout::UdpMultiple, &g, 1, 1000), 5);
        assert_eq!(tr.timeout(9, Timeout::UdpSingle, &g, 1, 1000), 30);
        assert_eq!(tr.timeout(8, Timeout::UdpMultiple, &g, 1, 1000), 60);
        // The rule's adaptive range scales by the rule's own states: 1 of (0..2) halves it.
        let l = RuleLimits {
            limiter: 3,
            timeouts: vec![(Timeout::UdpFirst, 40), (Timeout::AdaptiveStart, 0), (Timeout::AdaptiveEnd, 0)],
            ..Default::default()
        };
        tr.attach(2, &l, Addr::default(), 0, 0);
        assert_eq!(tr.timeout(3, Timeout::UdpFirst, &g, 900, 1000), 40 * 300 / 600, "0/0: the global scaling");
        let l = RuleLimits { limiter: 4, timeouts: vec![(Timeout::AdaptiveStart, 1), (Timeout::AdaptiveEnd, 3)], ..l };
        tr.attach(3, &l, Addr::default(), 0, 0);
        tr.attach(4, &l, Addr::default(), 0, 0);
        assert_eq!(tr.timeout(4, Timeout::UdpFirst, &g, 900, 1000), 30, "rule's 2 states of 1..3: half of 60");
    }
}
