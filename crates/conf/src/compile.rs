//! The compiled ruleset and its evaluation (pf_test_rule): rules in order, the last matching
//! rule decides, `quick` stops, `match` rules apply their options (the tag) and evaluation goes
//! on; a packet no rule matches passes without state (pf's default rule). Skip steps, as pf
//! computes them (pf_calc_skip_steps): for each rule and each of interface, direction, family,
//! protocol, source address, source port, destination address and destination port, the next
//! rule where that field differs, so that a mismatch jumps over every rule that would fail the
//! same way.

use crate::ast::*;
use crate::classify::{Candidates, Classifier, RuleKey};
use crate::parse::{Parsed, TablePart};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use xpf_engine::{Action as EAction, Context, Decision, Policy, Return as EReturn, Scrub as EScrub};
use xpf_state::track::Threshold;
use xpf_state::Dir as SDir;
use xpf_state::{Overload, RuleLimits};
use xpf_wire::pdesc::{pdf, AF_INET, AF_INET6, IPPROTO_TCP};
use xpf_wire::{Addr, PDesc};

mod anchor;
mod evaluations;
pub mod queues;
pub use anchor::{anchor_paths, body_end, child_of, valid_anchor_path, wildcard, AnchorInfo};
use anchor::{Anchors, RuleLog};
use evaluations::Evaluations;

/// A table: longest-prefix match over the entries, a negated entry excluding what it covers.
/// Lookup walks only the prefix lengths present, longest first. A table in force is not
/// changed in place: `xpfctl -T` builds the changed copy ([`Table::clone`] carries each
/// entry's counters) and installs it ([`Ruleset::with_table`]).
#[derive(Debug, Default)]
pub struct Table {
    v4: TableMap<(u8, u32)>,
    v6: TableMap<(u8, u128)>,
    lens4: Vec<u8>,
    lens6: Vec<u8>,
    /// `counters`: each entry counts the packets and bytes the rules naming the table
    /// blocked and passed for it, in and out (pf's PFR_TFLAG_COUNTERS).
    counted: bool,
}

#[derive(Debug, Default)]
pub struct Entry {
    pub neg: bool,
    /// Packets that matched this entry (pfctl -t T -T show -v's counters).
    pub matches: AtomicU64,
    /// When its counters were last cleared, in seconds since the epoch: when it was added,
    /// or zeroed (pfctl's "Cleared"; `-T expire` goes by it).
    pub cleared: u64,
    /// A `counters` table's entry: the packets decided without a state (see
    /// [`Table::count`]); None in other tables.
    counts: Option<Box<EntryCounts>>,
}

/// pf's per-entry counters (`pfras_packets`/`pfras_bytes`): packets and bytes by
/// [`Verdict::slot`] (In/Block, In/Pass, Out/Block, Out/Pass).
#[derive(Debug, Default)]
struct EntryCounts([[AtomicU64; 2]; 4]);

impl EntryCounts {
    fn load(&self) -> [[u64; 2]; 4] {
        self.0.each_ref().map(|c| c.each_ref().map(|x| x.load(Ordering::Relaxed)))
    }

    fn of(v: [[u64; 2]; 4]) -> EntryCounts {
        EntryCounts(v.map(|c| c.map(AtomicU64::new)))
    }
}

/// Where a packet counts in a `counters` table's entry: its direction and what the rule did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub out: bool,
    pub pass: bool,
}

impl Verdict {
    /// The row in pfctl's order: In/Block, In/Pass, Out/Block, Out/Pass.
    pub fn slot(self) -> usize {
        (self.out as usize) << 1 | self.pass as usize
    }
}

/// An entry's counter rows by [`Verdict::slot`]: pfctl's name, and the JSON key.
pub const ENTRY_COUNTER_ROWS: [(&str, &str); 4] =
    [("In/Block:", "in_block"), ("In/Pass:", "in_pass"), ("Out/Block:", "out_block"), ("Out/Pass:", "out_pass")];

/// Entries' counts by (table name, entry address, prefix length), packets and bytes by
/// [`Verdict::slot`]: what [`StateCounts`] sums, and a reader merges.
pub type EntrySums = HashMap<(String, IpAddr, u8), [[u64; 2]; 4]>;

/// Adds counts `b` to `a`, row by row.
pub fn add_counts(a: &mut [[u64; 2]; 4], b: &[[u64; 2]; 4]) {
    a.iter_mut().flatten().zip(b.iter().flatten()).for_each(|(x, y)| *x += y);
}

/// An entry as `-T show -v` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryRow {
    pub addr: IpAddr,
    pub len: u8,
    pub neg: bool,
    /// Rule tests it decided.
    pub matches: u64,
    pub cleared: u64,
    /// A `counters` table's entry: packets and bytes by [`Verdict::slot`], of the packets
    /// decided without a state since cleared (the states' own are summed by the reader,
    /// [`StateCounts`]).
    pub counts: Option<[[u64; 2]; 4]>,
}

impl Clone for Table {
    fn clone(&self) -> Table {
        let e = |x: &Entry| Entry {
            neg: x.neg,
            matches: AtomicU64::new(x.matches.load(Ordering::Relaxed)),
            cleared: x.cleared,
            counts: x.counts.as_ref().map(|c| Box::new(EntryCounts::of(c.load()))),
        };
        Table {
            v4: self.v4.iter().map(|(k, x)| (*k, e(x))).collect(),
            v6: self.v6.iter().map(|(k, x)| (*k, e(x))).collect(),
            lens4: self.lens4.clone(),
            lens6: self.lens6.clone(),
            counted: self.counted,
        }
    }
}

/// A table's entries by (prefix length, masked address). A first packet's lookup hashes its
/// address once per prefix length present: with std's SipHash that was ~3% of a worker's time
/// making connections through the 1.6M-rule campus ruleset (its bogons, blocklist and
/// trackers tables). foldhash's `quality` hasher with a random seed per process, so that the
/// sources an `overload` rule adds cannot be chosen to fall on one group of slots.
type TableMap<K> = HashMap<K, Entry, foldhash::quality::RandomState>;

/// A table entry's key: the address masked to its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum EntryKey {
    V4(u8, u32),
    V6(u8, u128),
}

fn entry_key(a: IpAddr, len: u8) -> EntryKey {
    match a {
        IpAddr::V4(v) => EntryKey::V4(len, u32::from(v) & mask4(len)),
        IpAddr::V6(v) => EntryKey::V6(len, u128::from(v) & mask6(len)),
    }
}

/// The seconds since the epoch (table entries' clear time).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Table {
    /// An empty table whose entries count what the rules do with their packets when
    /// `counted` (`table <T> counters`).
    pub fn counting(counted: bool) -> Table {
        Table { counted, ..Table::default() }
    }

    /// Whether it was declared with `counters`.
    pub fn counted(&self) -> bool {
        self.counted
    }

    /// A new entry, cleared at `cleared`.
    fn fresh(&self, neg: bool, cleared: u64) -> Entry {
        Entry {
            neg,
            matches: AtomicU64::new(0),
            cleared,
            counts: self.counted.then(|| Box::new(EntryCounts::default())),
        }
    }

    /// Sets entry `a/len` (a new entry, or an existing one with its counters cleared).
    pub fn insert(&mut self, a: IpAddr, len: u8, neg: bool) {
        self.put(a, len, self.fresh(neg, 0));
    }

    fn put(&mut self, a: IpAddr, len: u8, e: Entry) {
        let (lens, new) = match entry_key(a, len) {
            EntryKey::V4(l, x) => (&mut self.lens4, self.v4.insert((l, x), e).is_none()),
            EntryKey::V6(l, x) => (&mut self.lens6, self.v6.insert((l, x), e).is_none()),
        };
        if new && !lens.contains(&len) {
            lens.push(len);
            lens.sort_by(|a, b| b.cmp(a));
        }
    }

    /// `-T add`: adds `a/len` cleared at `now` unless it is there; true if it was added.
    pub fn add(&mut self, a: IpAddr, len: u8, now: u64) -> bool {
        let there = match entry_key(a, len) {
            EntryKey::V4(l, x) => self.v4.contains_key(&(l, x)),
            EntryKey::V6(l, x) => self.v6.contains_key(&(l, x)),
        };
        if !there {
            self.put(a, len, self.fresh(false, now));
        }
        !there
    }

    /// `-T delete`: removes the entries of `set` that are there; how many. The prefix lengths
    /// are pruned once, after all of them.
    pub fn remove(&mut self, set: impl IntoIterator<Item = (IpAddr, u8)>) -> usize {
        let mut n = 0;
        for (a, len) in set {
            n += match entry_key(a, len) {
                EntryKey::V4(l, x) => self.v4.remove(&(l, x)).is_some(),
                EntryKey::V6(l, x) => self.v6.remove(&(l, x)).is_some(),
            } as usize;
        }
        self.prune_lens();
        n
    }

    /// `-T replace`: exactly `set`, cleared at `now`, but for the entries that stay, which
    /// keep their counters.
    pub fn replaced(&self, set: &[(IpAddr, u8)], now: u64) -> Table {
        let mut t = Table::counting(self.counted);
        for &(a, len) in set {
            let old = match entry_key(a, len) {
                EntryKey::V4(l, x) => self.v4.get(&(l, x)),
                EntryKey::V6(l, x) => self.v6.get(&(l, x)),
            };
            let e = match old {
                Some(o) if !o.neg => Entry {
                    neg: false,
                    matches: AtomicU64::new(o.matches.load(Ordering::Relaxed)),
                    cleared: o.cleared,
                    counts: o.counts.as_ref().map(|c| Box::new(EntryCounts::of(c.load()))),
                },
                _ => t.fresh(false, now),
            };
            t.put(a, len, e);
        }
        t
    }

    /// `-T zero`: every entry's counters cleared at `now`.
    /// The addresses the table includes (its entries not negated), as (address, prefix
    /// length), in address order: what a translation pool drawn from it uses.
    pub fn hosts(&self) -> Vec<(IpAddr, u8)> {
        let mut v4: Vec<_> = self.v4.iter().filter(|(_, e)| !e.neg).map(|(&(l, a), _)| (a, l)).collect();
        let mut v6: Vec<_> = self.v6.iter().filter(|(_, e)| !e.neg).map(|(&(l, a), _)| (a, l)).collect();
        v4.sort_unstable();
        v6.sort_unstable();
        v4.into_iter()
            .map(|(a, l)| (IpAddr::V4(a.into()), l))
            .chain(v6.into_iter().map(|(a, l)| (IpAddr::V6(a.into()), l)))
            .collect()
    }

    pub fn zero(&mut self, now: u64) {
        let counted = self.counted;
        for e in self.v4.values_mut().chain(self.v6.values_mut()) {
            e.matches = AtomicU64::new(0);
            e.cleared = now;
            e.counts = counted.then(|| Box::new(EntryCounts::default()));
        }
    }

    /// `-T expire`: removes the entries cleared before `before`; how many.
    pub fn expire(&mut self, before: u64) -> usize {
        let n = self.len();
        self.v4.retain(|_, e| e.cleared >= before);
        self.v6.retain(|_, e| e.cleared >= before);
        self.prune_lens();
        n - self.len()
    }

    /// Drops the prefix lengths no entry has any more (lookups walk only those present).
    /// One pass over the entries.
    fn prune_lens(&mut self) {
        let (mut in4, mut in6) = ([false; 33], [false; 129]);
        self.v4.keys().for_each(|k| in4[k.0.min(32) as usize] = true);
        self.v6.keys().for_each(|k| in6[k.0.min(128) as usize] = true);
        self.lens4.retain(|&l| in4[l.min(32) as usize]);
        self.lens6.retain(|&l| in6[l.min(128) as usize]);
    }

    /// The entries in address order (pfctl -T show -v).
    pub fn entries(&self) -> Vec<EntryRow> {
        let row = |addr: IpAddr, len: u8, e: &Entry| EntryRow {
            addr,
            len,
            neg: e.neg,
            matches: e.matches.load(Ordering::Relaxed),
            cleared: e.cleared,
            counts: e.counts.as_ref().map(|c| c.load()),
        };
        let mut v: Vec<_> = self
            .v4
            .iter()
            .map(|(&(l, a), e)| row(IpAddr::from(std::net::Ipv4Addr::from(a)), l, e))
            .chain(self.v6.iter().map(|(&(l, a), e)| row(IpAddr::from(std::net::Ipv6Addr::from(a)), l, e)))
            .collect();
        v.sort();
        v
    }

    /// The entry a rule's test of `a` counts on, for a rule side negated or not (`neg`):
    /// the deciding entry when its sense agrees with the rule's (pf's pfr_update_stats;
    /// otherwise the packet is pf's XPass, which no entry counts), with its prefix length.
    fn counting_entry(&self, a: &Addr, af: u8, neg: bool) -> Option<(&Entry, u8)> {
        self.deciding(a, af).filter(|(e, _)| e.neg == neg)
    }

    /// A packet of `bytes` a rule naming the table (side negated: `neg`) decided without a
    /// state: counted on `a`'s entry in a `counters` table.
    pub fn count(&self, a: &Addr, af: u8, neg: bool, v: Verdict, bytes: u64) {
        if let Some((e, _)) = self.counting_entry(a, af, neg) {
            if let Some(c) = &e.counts {
                let [p, b] = &c.0[v.slot()];
                p.fetch_add(1, Ordering::Relaxed);
                b.fetch_add(bytes, Ordering::Relaxed);
            }
        }
    }

    /// Packets that matched an entry, summed over the entries (their counters: since each
    /// was added or zeroed).
    pub fn matches(&self) -> u64 {
        let m = |e: &Entry| e.matches.load(Ordering::Relaxed);
        self.v4.values().map(m).sum::<u64>() + self.v6.values().map(m).sum::<u64>()
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry that decides for `a` (family `af`): the longest prefix holding it, with
    /// that prefix's length.
    #[inline]
    fn deciding(&self, a: &Addr, af: u8) -> Option<(&Entry, u8)> {
        if af == AF_INET {
            let x = a.v4_u32();
            self.lens4.iter().find_map(|&l| self.v4.get(&(l, x & mask4(l))).map(|e| (e, l)))
        } else {
            let x = u128::from_be_bytes(a.0);
            self.lens6.iter().find_map(|&l| self.v6.get(&(l, x & mask6(l))).map(|e| (e, l)))
        }
    }

    /// Whether `a` (family `af`) is in the table, counting the deciding entry (a rule's test).
    pub fn contains(&self, a: &Addr, af: u8) -> bool {
        self.deciding(a, af).is_some_and(|(e, _)| {
            e.matches.fetch_add(1, Ordering::Relaxed);
            !e.neg
        })
    }

    /// Whether `a` (family `af`) is in the table, counting nothing (`-T test`: asking is not
    /// a packet matching).
    pub fn holds(&self, a: &Addr, af: u8) -> bool {
        self.deciding(a, af).is_some_and(|(e, _)| !e.neg)
    }
}

/// The entries of a table file as pfctl reads one: addresses and networks (`a.b.c.d[/n]`,
/// IPv6, `!` to negate) separated by white space, `#` comments to the end of the line. Host
/// names are an error (xpf resolves no names). Each entry or (line, what is wrong).
pub fn table_file_entries(text: &str) -> impl Iterator<Item = Result<(IpAddr, u8, bool), (usize, String)>> + '_ {
    text.lines().enumerate().flat_map(|(n, line)| {
        let line = line.split('#').next().unwrap_or("");
        line.split_whitespace().map(move |w| {
            parse_entry(w).ok_or((n + 1, format!("'{w}' is not an address or network (host names are not resolved)")))
        })
    })
}

/// One table entry: `[!]address[/prefix]`, the host bits cleared by the table itself.
pub fn parse_entry(w: &str) -> Option<(IpAddr, u8, bool)> {
    let (neg, w) = match w.strip_prefix('!') {
        Some(r) => (true, r),
        None => (false, w),
    };
    let (a, l) = match w.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (w, None),
    };
    let a: IpAddr = a.parse().ok()?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    let l = l.unwrap_or(max);
    (l <= max).then_some((a, l, neg))
}

fn mask4(l: u8) -> u32 {
    if l == 0 {
        0
    } else {
        u32::MAX << (32 - l.min(32) as u32)
    }
}

fn mask6(l: u8) -> u128 {
    if l == 0 {
        0
    } else {
        u128::MAX << (128 - l.min(128) as u32)
    }
}

/// An address test, ready for the packet path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddrTest {
    Any,
    V4(u32, u32),
    V6(u128, u128),
    Range4(u32, u32),
    Range6(u128, u128),
    Table(usize),
    /// `no-route`: the table of the routes (rejecting ones negated); matches what is not in it.
    NoRoute(usize),
    /// `urpf-failed`: `Ruleset::urpf`'s list of (interface, table of the routes out of it, the
    /// others negated); matches a source not in the current interface's table (or on an
    /// interface no route leads out of). (An index: the enum stays small and Copy, which the
    /// rule walk measured 20% faster than a slice in it.)
    Urpf,
    /// A range of two families (the parser refuses one): never matches.
    Never,
}

#[derive(Debug, Clone)]
struct CRule {
    nr: u32,
    action: Action,
    quick: bool,
    dir: Dir,
    /// (negated, interface index)
    on: Option<(bool, u16)>,
    af: u8,
    proto: Option<u8>,
    src: (bool, AddrTest),
    src_port: Option<PortOp>,
    dst: (bool, AddrTest),
    dst_port: Option<PortOp>,
    flags: Option<(u8, u8)>,
    icmp: Option<(u8, Option<u8>)>,
    keep_state: bool,
    /// A block rule's answer.
    ret: EReturn,
    /// `tos`: the TOS byte (its ECN bits aside) must equal it.
    tos: Option<u8>,
    /// `scrub (...)`: actions for the state's packets.
    scrub: EScrub,
    /// `probability`: matches when the packet's draw for this rule is at most this (pf's
    /// `r->prob`, the share of u32::MAX); 0: no probability.
    prob: u32,
    nosync: bool,
    if_bound: bool,
    allow_opts: bool,
    sloppy: bool,
    /// `pflow` in the rule's state options, or `set state-defaults pflow`.
    pflow: bool,
    modulate: bool,
    synproxy: bool,
    pickup: bool,
    /// Index + 1 in `Ruleset::limits`, 0 for none.
    limits: u32,
    tag: Option<u16>,
    tagged: Option<(bool, u16)>,
    /// `set queue (q, ack)`: the queue ids, `q | ack << 16` (0: none).
    queue: u32,
    /// `route-to` / `reply-to`: index + 1 in `Ruleset::routes` (0: none), or for several next
    /// hops, index + 1 in `Ruleset::route_pools`.
    pub(crate) route: u16,
    pub(crate) route_pool: u16,
    /// Index + 1 in `Ruleset::rare` of the tests few rules have (`received-on`, `once`,
    /// `max-pkt-rate`), 0 for none: one test on the walk for the rules without.
    rare: u32,
    depth: u8,
    /// For an anchor rule: the index after its body (0: not an anchor).
    anchor_end: u32,
    /// A named anchor's slot + 1 in `Ruleset::anchors` (0: none): rules loaded into the
    /// anchor at run time are evaluated there instead of its body.
    slot: u32,
    /// Translation pools (index + 1 in `Ruleset::pools`, 0 for none): `nat-to`, `rdr-to`.
    nat: u32,
    rdr: u32,
    /// A translation rule's `pass`: its packets skip the filter rules.
    natpass: bool,
    /// `log`: the pflog unit + 1 (0: none).
    log: u8,
    /// `log (all)`: every packet of the rule's states too.
    log_all: bool,
    /// Its source or destination is a `counters` table: the packets it decides without a
    /// state count on their entries ([`Ruleset::count_tables`]).
    counted: bool,
}

const SKIP_IF: usize = 0;
const SKIP_DIR: usize = 1;
const SKIP_AF: usize = 2;
const SKIP_PROTO: usize = 3;
const SKIP_SRC: usize = 4;
const SKIP_SPORT: usize = 5;
const SKIP_DST: usize = 6;
const SKIP_DPORT: usize = 7;

/// Rulesets of this many rules or more are looked up through the classifier; smaller ones
/// walk with skip steps, which are faster there (docs/rules.md has the crossover).
pub const CLASSIFY_FROM: usize = 64;

/// How first packets find their rules: the walk with skip steps, or the classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// As the ruleset's size says ([`CLASSIFY_FROM`]).
    Auto,
    Walk,
    Classify,
}

impl Lookup {
    /// Whether a list of `n` rules gets a classifier.
    fn wants(self, n: usize) -> bool {
        match self {
            Lookup::Auto => n >= CLASSIFY_FROM,
            Lookup::Walk => false,
            Lookup::Classify => true,
        }
    }
}

/// A list of rules' classifier, with each rule's enclosing anchor rule (u32::MAX: none).
#[derive(Debug)]
struct Classified {
    class: Classifier,
    parent: Vec<u32>,
}

impl Classified {
    fn of(rules: &[CRule]) -> Classified {
        let keys: Vec<RuleKey> = rules.iter().map(rule_key).collect();
        let mut parent = vec![u32::MAX; rules.len()];
        let mut open: Vec<(u32, u32)> = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            while open.last().is_some_and(|&(_, end)| i as u32 >= end) {
                open.pop();
            }
            parent[i] = open.last().map_or(u32::MAX, |o| o.0);
            if r.anchor_end != 0 {
                open.push((i as u32, r.anchor_end));
            }
        }
        Classified { class: Classifier::build(&keys), parent }
    }
}

/// One list of rules (the filter's, or the translation rules') with what its walk uses.
#[derive(Debug, Clone)]
struct List {
    rules: Arc<Vec<CRule>>,
    skip: Arc<Vec<[u32; 8]>>,
    /// The classifier, for lists of [`CLASSIFY_FROM`] rules or more (None: the skip-step walk).
    class: Option<Arc<Classified>>,
    /// Evaluations (pfctl -s rules -v), per rule.
    evaluations: Arc<Evaluations>,
}

impl List {
    fn new(rules: Vec<CRule>, how: Lookup) -> List {
        // A large list's classifier is built on a second core while the skip steps are
        // computed on this one.
        let class = |rules: &[CRule]| how.wants(rules.len()).then(|| Arc::new(Classified::of(rules)));
        let (skip, class) = if rules.len() >= 65_536 {
            std::thread::scope(|s| {
                let c = s.spawn(|| class(&rules));
                let skip = skip_steps(&rules);
                (skip, c.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            })
        } else {
            (skip_steps(&rules), class(&rules))
        };
        List {
            skip: Arc::new(skip),
            evaluations: Arc::new(Evaluations::new(rules.len())),
            rules: Arc::new(rules),
            class,
        }
    }

    fn set_lookup(&mut self, how: Lookup) {
        if !how.wants(self.rules.len()) {
            self.class = None;
        } else if self.class.is_none() {
            self.class = Some(Arc::new(Classified::of(&self.rules)));
        }
    }
}

/// What the classifier indexes of a rule: the fields it tests for equality or a prefix,
/// not negated.
fn rule_key(r: &CRule) -> RuleKey {
    let net = |(neg, t): &(bool, AddrTest)| match (*neg, t) {
        (false, AddrTest::V4(net, mask)) => Some((*net as u128, mask.count_ones() as u8)),
        (false, AddrTest::V6(net, mask)) => Some((*net, mask.count_ones() as u8)),
        _ => None,
    };
    let port = |p: Option<PortOp>| match p {
        Some(PortOp::Eq(p)) => Some(p),
        _ => None,
    };
    RuleKey {
        ifidx: match r.on {
            Some((false, i)) => i,
            _ => 0,
        },
        dir: match r.dir {
            Dir::In => 1,
            Dir::Out => 2,
            Dir::Both => 0,
        },
        af: r.af,
        proto: r.proto,
        src: net(&r.src),
        dst: net(&r.dst),
        sport: port(r.src_port),
        dport: port(r.dst_port),
    }
}

/// What a rule with `once` or `max-pkt-rate` keeps while it is in force: whether it fired,
/// and its packet-rate meter (pf's `pf_threshold`, shared by every worker). A recompile of
/// the same rules (a table or an address changed) keeps the marks ([`Ruleset::keep_marks`]);
/// a reload starts afresh, as pf's new rules do.
#[derive(Debug)]
pub struct Mark {
    /// The rule's identity ([`limiter_id`]); a state made by it names it.
    id: u32,
    once: bool,
    expired: AtomicBool,
    /// `max-pkt-rate`: None without.
    meter: Option<Mutex<Threshold>>,
}

impl Mark {
    /// One more packet at `now`; true when the rate is now over the limit (pf_add_threshold,
    /// then pf_check_threshold).
    fn over(&self, now: u32) -> bool {
        match &self.meter {
            None => false,
            Some(m) => {
                let mut t = m.lock().unwrap_or_else(|e| e.into_inner());
                t.add(now);
                t.exceeded()
            }
        }
    }
}

/// A rule's tests that few rules have, kept out of the rule walk's way.
#[derive(Debug, Clone)]
struct Rare {
    /// `[!] on GROUP` (or on an interface not present now): (negated, the members' interface
    /// indexes). The rule's own interface test is then any, for its skip steps and the
    /// classifier.
    on: Option<(bool, Vec<u16>)>,
    /// `[!] received-on`: (negated, the interface's index, or a group's members').
    rcv: Option<(bool, Vec<u16>)>,
    /// `[!] no-route` / `[!] urpf-failed` as the source (0) or destination (1): the rule's
    /// own address test is Any there, and this is tested out of line (in the walk's address
    /// tests, even out of line behind a branch never taken, they cost it 15-20%).
    routes: [Option<(bool, AddrTest)>; 2],
    /// `once` or `max-pkt-rate`: the rule's run-time mark.
    mark: Option<Arc<Mark>>,
    /// `fragment`: only a fragment not reassembled matches.
    fragment: bool,
}

/// The compiled ruleset; it is the engine's `Policy`.
#[derive(Debug, Clone)]
pub struct Ruleset {
    /// The filter rules.
    filter: List,
    /// FreeBSD's translation rules (a `binat` as its out and in halves), each `quick`: the
    /// first that matches decides. Empty for most rulesets.
    xlate: List,
    /// FreeBSD's scrub rules, each `quick`: the first that matches a packet gives it its
    /// options. None unless one of them has options that act on packets (`no-df`,
    /// `random-id`, `min-ttl`, `max-mss`, `set-tos`): the rest ask only for what every
    /// packet gets.
    scrubs: Option<List>,
    pub tables: Vec<(String, Arc<Table>)>,
    tags: Vec<String>,
    /// The state limits of the rules that have some.
    pub limits: Vec<RuleLimits>,
    /// `set skip on`: interfaces (indexes) whose packets pf does not look at.
    skip_ifs: Vec<u16>,
    /// A rule has `probability`: evaluation takes a random number.
    random: bool,
    /// The marks of the rules with `once` or `max-pkt-rate`, by identity.
    marks: HashMap<u32, Arc<Mark>>,
    rare: Vec<Rare>,
    /// `urpf-failed`: (interface, index in `tables` of the routes out of it).
    urpf: Arc<Vec<(u16, usize)>>,
    /// The translation pools of the rules (`nat-to`, `rdr-to`, `binat-to`'s halves).
    pub pools: Arc<Vec<xpf_engine::nat::Pool>>,
    /// The routing targets (`route-to`, `reply-to`) of these rules and of every ruleset
    /// compiled before ([`ROUTE_TARGETS`]), by number - 1.
    pub routes: Arc<Vec<xpf_engine::RouteTarget>>,
    /// The rules' lists of next hops, each taken in turn by the states they make.
    route_pools: Arc<Vec<RoutePool>>,
    /// Pools drawn from a table: (pool, table), refilled when the table changes.
    pool_tables: Vec<(usize, String)>,
    /// Each pool's rule, as a log names it (`nat-to of FILE:LINE`).
    pool_origins: Arc<Vec<String>>,
    /// Where translated traffic may come to this host's own addresses: the pools' addresses
    /// (replies to `nat-to`) and the destinations of `rdr-to` rules. xpfd's steering program
    /// sends such packets to xpfd instead of the kernel's local delivery.
    pub nat_targets: Vec<Target>,
    /// The same, unmerged: what the hand-off between workers owns by (docs/nat.md).
    pub nat_owners: Vec<Target>,
    /// The translations that map a network onto another host by host ([`NatMap`]), in rule
    /// order: the hand-off owns packets to them by the address they map back to.
    pub nat_maps: Vec<NatMap>,
    /// The port forwardings whose target is chosen per flow ([`NatFront`]): the hand-off owns
    /// their flows by the public address.
    pub nat_fronts: Vec<NatFront>,
    /// The source networks of translations that remember per inside host ([`NatHosts`]): the
    /// hand-off keeps each such host's flows on one worker.
    pub nat_hosts: Vec<NatHosts>,
    /// The source networks of many-to-one translations that keep the source port
    /// ([`NatPorts`]): the hand-off owns their hosts' flows by port.
    pub nat_ports: Vec<NatPorts>,
    /// The many-to-one translations that may take protocols without ports ([`NatBare`]):
    /// the hand-off owns such flows through their interfaces by the far end.
    pub nat_bare: Vec<NatBare>,
    /// `set loginterface`: its index, or a group's members' (empty: none, or not present
    /// when compiled).
    pub loginterface: Vec<u16>,
    /// The queue trees, one per interface, for the shaper.
    pub queues: Arc<queues::Queues>,
    /// The named anchors, and the rules loaded into them at run time.
    anchors: Anchors,
    /// The filter rules' names in pflog, for a ruleset with anchors (None: a rule's number is
    /// its index).
    rule_log: Option<Arc<RuleLog>>,
    /// What every rule takes from the main file's options (anchors loaded later too).
    globals: Globals,
}

/// The main file's options every rule takes: `set state-defaults no-sync, pflow`, `set
/// state-policy if-bound`.
#[derive(Debug, Clone, Copy, Default)]
struct Globals {
    no_sync: bool,
    pflow: bool,
    if_bound: bool,
}

impl Globals {
    fn of(p: &Parsed) -> Globals {
        Globals { no_sync: p.state_defaults.no_sync, pflow: p.state_defaults.pflow, if_bound: p.if_bound }
    }
}

/// A destination translated traffic may have ([`Ruleset::nat_targets`]): packets of `proto`
/// (family `af`) to network `net` (None: any address) whose destination port is in
/// `lo..=hi` (ICMP and protocols without ports: every packet; `proto` PROTO_PORTLESS: every
/// protocol without ports); or, with `port` not 0, is `port` (`net` then a host or None).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub af: u8,
    pub proto: u8,
    pub net: Option<(IpAddr, u8)>,
    pub port: u16,
    pub lo: u16,
    pub hi: u16,
    /// What brings traffic here: a `nat-to` pool (replies), or a `rdr-to` rule, with its
    /// target when one address follows from the packet's destination (several workers hand
    /// its packets to the worker of the flow as translated).
    pub by: By,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Replies to a `nat-to` pool whose ports the worker chose.
    Nat,
    /// Replies to a pool that maps host by host ([`NatMap`]): owned by the map.
    Map,
    /// A `rdr-to` rule's destinations. With a network: the pool is that one network (a
    /// host, or a network without a pool type or with `bitmask`), and a packet's target is
    /// its destination's host bits under the network's bits. None: the target is chosen per
    /// flow (several addresses, `round-robin`, `random`, ...).
    Rdr(Option<(IpAddr, u8)>),
}

/// A translation that maps one network onto another host by host, whose replies name the
/// flow they belong to by their address alone: `binat-to`'s out half, and `nat-to NET
/// static-port` (without a pool type, or with `bitmask`) from a network as long as NET. A
/// packet to an address of `from` belongs to the flow of the address with `to`'s network
/// bits and its own host bits (its port is the flow's own). `at` is the rule's FILE:LINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatMap {
    pub from: (IpAddr, u8),
    pub to: (IpAddr, u8),
    pub at: String,
}

impl NatMap {
    /// The map rule `r`'s `nat-to` makes, if it is one.
    pub fn of(r: &Rule) -> Option<NatMap> {
        let p = r.nat.as_deref()?;
        if !p.static_port
            || p.port.is_some()
            || p.list.is_some()
            || p.host.neg
            || r.src.neg
            || !matches!(p.kind, PoolKind::None | PoolKind::Bitmask)
        {
            return None;
        }
        let (HostKind::Net(y, l), HostKind::Net(x, m)) = (&p.host.kind, &r.src.kind) else { return None };
        (y.is_ipv4() == x.is_ipv4() && l == m).then(|| NatMap {
            from: (masked_addr(*y, *l), *l),
            to: (masked_addr(*x, *m), *m),
            at: format!("{}:{}", r.file, r.line),
        })
    }
}

/// The source network of a `nat-to` that remembers something per inside host across its flows:
/// `endpoint-independent` (a UDP source's address and port towards every destination) and
/// `sticky-address` (a source's pool address). With several workers every flow between one
/// of `net`'s hosts and an address outside it is owned by that host alone, so the worker
/// that remembers is the one its next flows meet; the ports that worker hands out are of its
/// own residue, so the replies to the pool come back to it too. `at` is the rule's FILE:LINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatHosts {
    pub net: (IpAddr, u8),
    pub at: String,
}

impl NatHosts {
    /// Whether rule `r`'s `nat-to` remembers per inside host (a map keeps nothing: its
    /// address is the host's).
    pub fn needed(r: &Rule) -> bool {
        r.nat.as_deref().is_some_and(|p| p.endpoint_independent || p.sticky) && NatMap::of(r).is_none()
    }

    /// The network whose hosts rule `r` remembers, if it needs one and its source is written
    /// as one (an address or a network, not negated: a table, `any` or `(if)` names no hosts
    /// the hand-off can know).
    pub fn of(r: &Rule) -> Option<NatHosts> {
        let net = written_source(r).filter(|_| NatHosts::needed(r))?;
        Some(NatHosts { net, at: format!("{}:{}", r.file, r.line) })
    }
}

/// Rule `r`'s source when it is written as an address or network (not negated, not `any`, a
/// table or `(if)`): the hosts the hand-off can know.
fn written_source(r: &Rule) -> Option<(IpAddr, u8)> {
    let HostKind::Net(a, l) = r.src.kind else { return None };
    (!r.src.neg && l > 0).then(|| (masked_addr(a, l), l))
}

/// The source network of a many-to-one `nat-to ... static-port` (not a map, not remembering
/// per host): a translated flow keeps its source port, so its replies to the pool name no
/// worker the allocator chose. With several workers every TCP or UDP flow (and ICMP echo)
/// between one of `net`'s hosts and an address outside it is owned by that host's port (the
/// identifier for an echo) modulo the workers, the same worker its replies to the pool are
/// owned by (their destination port); the ports the worker hands out for other translations
/// of those hosts are of its own residue too. `at` is the rule's FILE:LINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatPorts {
    pub net: (IpAddr, u8),
    pub at: String,
}

impl NatPorts {
    /// Whether rule `r`'s `nat-to` keeps the source port of many hosts (a map's replies name
    /// their host; one remembering per host is [`NatHosts`]'s).
    pub fn needed(r: &Rule) -> bool {
        r.nat.as_deref().is_some_and(|p| p.static_port) && NatMap::of(r).is_none() && !NatHosts::needed(r)
    }

    /// The network whose hosts' flows rule `r` translates keeping their ports, if it needs
    /// one and its source is written as one (an address or a network, not negated).
    pub fn of(r: &Rule) -> Option<NatPorts> {
        let net = written_source(r).filter(|_| NatPorts::needed(r))?;
        Some(NatPorts { net, at: format!("{}:{}", r.file, r.line) })
    }
}

/// A many-to-one `nat-to` (not a map) that may take protocols without ports (GRE, ESP, ...):
/// such a flow is translated by its addresses alone, so a reply to the pool names neither
/// the inside host nor a worker. With several workers every such flow that crosses one of
/// `on`'s interfaces is owned by its far end's address (the end outside), which its replies
/// to the pool carry as their source. `on`: the rule's interface or its group's members;
/// None for a rule on every interface (no `on`, `on any`, `! on`), whose flows' far end the
/// hand-off cannot tell. `sticky`: the rule has `sticky-address`. `at` is its FILE:LINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatBare {
    pub on: Option<Vec<u16>>,
    pub sticky: bool,
    pub at: String,
}

impl NatBare {
    /// Rule `r`'s, when its `nat-to` may take a protocol without ports
    /// onto fewer addresses than it takes hosts from; `on` its interfaces as above.
    pub fn of(r: &Rule, on: Option<Vec<u16>>) -> Option<NatBare> {
        let bare = r.proto.is_none_or(xpf_wire::pdesc::portless);
        (bare && r.nat.is_some() && NatMap::of(r).is_none()).then(|| NatBare {
            on,
            sticky: r.nat.as_deref().is_some_and(|p| p.sticky),
            at: format!("{}:{}", r.file, r.line),
        })
    }
}

/// A port forwarding from one public address and port (or range) to a target chosen per flow
/// among a pool's addresses (a list, a table, `round-robin`, `random`, `source-hash`,
/// `least-states`), TCP or UDP. With several workers, a flow's packets to the public address
/// and its target's replies carry different addresses; both are owned as the pair of the far
/// end and `front`: a packet to `front` by the address hash, which gives that pair; one from
/// a target address with a source port in `ports` (protocol `proto`) by its destination and
/// `front`, and one to such an address and port by its source and `front`, so that every flow
/// with that end, forwarded or not, is owned alike both ways. A source's flows through one
/// front meet one worker, so `sticky-address` keeps its target there. `pool` is the pool's index in
/// [`Ruleset::pools`] (its addresses follow its table); `at` the rule's FILE:LINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatFront {
    pub front: IpAddr,
    pub proto: u8,
    pub ports: (u16, u16),
    pub pool: usize,
    pub at: String,
}

impl NatFront {
    /// The public address, protocol and destination ports of `r` if its port forwarding is
    /// one a front can own: one address, TCP or UDP, a port or range.
    pub fn shape(r: &Rule) -> Option<(IpAddr, u8, (u16, u16))> {
        r.rdr.as_deref()?;
        let ports = match r.dst_port {
            Some(PortOp::Eq(a)) => (a, a),
            Some(PortOp::Range(a, b)) => (a.min(b), a.max(b)),
            _ => return None,
        };
        match (&r.dst.kind, r.proto) {
            (HostKind::Net(a, l), Some(proto))
                if !r.dst.neg
                    && *l == host_len(a)
                    && (proto == IPPROTO_TCP || proto == xpf_wire::pdesc::IPPROTO_UDP) =>
            {
                Some((*a, proto, ports))
            }
            _ => None,
        }
    }
}

fn host_len(a: &IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}

fn masked_addr(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => IpAddr::V4((u32::from(v) & mask4(len)).into()),
        IpAddr::V6(v) => IpAddr::V6((u128::from(v) & mask6(len)).into()),
    }
}

/// The targets rule `r` adds: its `nat-to` pool's networks (TCP and UDP in the pool's port
/// range, every ICMP message for replies and errors), its `rdr-to` rule's destinations.
/// FreeBSD's translation rules as the walk sees them, each with its number: `nat` (and `no
/// nat`) going out, `rdr` coming in, `binat` as both: out from its source to its pool (the
/// expansion made that its `nat`, static-port), and in from its destination to the pool's
/// address, back to the source. Their anchors are named and never loaded: nothing to walk.
/// In pf's order (pf_get_translation): going out the binat rules before the nat rules, coming
/// in the rdr rules before the binat rules; each kind in file order.
fn xlate_halves(xrules: &[Rule]) -> Vec<(usize, Rule)> {
    let mut out = xlate_halves_in_file_order(xrules);
    let rank = |r: &Rule| match (r.xlate.map(|x| x.kind), r.dir) {
        (Some(XlateKind::Binat), Dir::Out) => 0,
        (Some(XlateKind::Nat), _) => 1,
        (Some(XlateKind::Rdr), _) => 2,
        _ => 3,
    };
    out.sort_by_key(|(_, r)| rank(r));
    out
}

fn xlate_halves_in_file_order(xrules: &[Rule]) -> Vec<(usize, Rule)> {
    let mut out = Vec::new();
    for (nr, r) in xrules.iter().enumerate() {
        let Some(x) = r.xlate else { continue };
        if r.anchor.is_some() {
            continue;
        }
        let mut h = r.clone();
        h.dir = if x.kind == XlateKind::Rdr { Dir::In } else { Dir::Out };
        if x.kind == XlateKind::Binat {
            h.binat = None;
            let back = r.nat.as_ref().map(|pl| {
                let mut b = h.clone();
                b.dir = Dir::In;
                b.nat = None;
                b.src = r.dst.clone();
                b.src_port = None;
                b.dst = pl.host.clone();
                b.dst_port = None;
                b.rdr = Some(Box::new(Pool::to(r.src.clone())));
                b
            });
            out.push((nr, h));
            out.extend(back.map(|b| (nr, b)));
            continue;
        }
        out.push((nr, h));
    }
    out
}

fn targets_of(
    r: &Rule,
    nat: Option<&xpf_engine::nat::Pool>,
    rdr: Option<&xpf_engine::nat::Pool>,
    tables: &[(String, Arc<Table>)],
) -> Vec<Target> {
    use xpf_wire::pdesc::{portless, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_UDP, PROTO_PORTLESS};
    let mut out = Vec::new();
    let icmp = |af| if af == AF_INET { IPPROTO_ICMP } else { IPPROTO_ICMPV6 };
    let af_of = |a: &IpAddr| if a.is_ipv4() { AF_INET } else { AF_INET6 };
    let l4 = match r.proto {
        Some(p) if p == IPPROTO_TCP || p == IPPROTO_UDP => vec![p],
        Some(_) => vec![],
        None => vec![IPPROTO_TCP, IPPROTO_UDP],
    };
    // Protocols without ports (GRE, ESP, ...), translated by their addresses alone: the
    // rule's own, or for a rule of any protocol all of them (PROTO_PORTLESS).
    let bare = match r.proto {
        Some(p) if portless(p) => Some(p),
        Some(_) => None,
        None => Some(PROTO_PORTLESS),
    };
    if let Some(pool) = nat {
        let (lo, hi) = if pool.static_port || pool.ports == (0, 0) { (1, 65535) } else { pool.ports };
        let by = if NatMap::of(r).is_some() { By::Map } else { By::Nat };
        for n in &pool.nets {
            let a = n.addr.to_ip(n.af);
            let af = af_of(&a);
            let net = Some((masked_addr(a, n.len), n.len));
            for &p in &l4 {
                out.push(Target { af, proto: p, net, port: 0, lo, hi, by });
            }
            out.push(Target { af, proto: icmp(af), net, port: 0, lo: 0, hi: 65535, by });
            out.extend(bare.map(|p| Target { af, proto: p, net, port: 0, lo: 0, hi: 65535, by }));
        }
    }
    if let Some(rp) = rdr {
        let to = match rp.nets.as_slice() {
            [n] if targets_one(r, rp) => {
                let a =
                    if n.af == AF_INET { IpAddr::V4(n.addr.v4_bytes().into()) } else { IpAddr::V6(n.addr.0.into()) };
                Some((masked_addr(a, n.len), n.len))
            }
            _ => None,
        };
        let by = By::Rdr(to);
        let nets: Vec<Option<(IpAddr, u8)>> = match &r.dst.kind {
            _ if r.dst.neg => vec![None],
            HostKind::Net(a, l) => vec![Some((*a, *l))],
            HostKind::Table(n) => tables
                .iter()
                .find(|t| &t.0 == n)
                .map(|t| t.1.hosts().into_iter().map(Some).collect())
                .unwrap_or_default(),
            HostKind::Dynamic { ifname, modifier, prefix } => {
                crate::ifaddr::dynamic(ifname, modifier.as_deref(), *prefix).into_iter().map(Some).collect()
            }
            HostKind::SelfAddr => crate::ifaddr::dynamic("self", None, None).into_iter().map(Some).collect(),
            _ => vec![None],
        };
        let fams: Vec<u8> = match r.af {
            Af::Inet => vec![AF_INET],
            Af::Inet6 => vec![AF_INET6],
            Af::Any => vec![AF_INET, AF_INET6],
        };
        for net in nets {
            for &af in &fams {
                if net.is_some_and(|(a, _)| af_of(&a) != af) {
                    continue;
                }
                let host = net.is_none_or(|(a, l)| l == host_len(&a));
                for &p in &l4 {
                    let t = match r.dst_port {
                        Some(PortOp::Eq(port)) if host => Target { af, proto: p, net, port, lo: 0, hi: 0, by },
                        Some(PortOp::Eq(port)) => Target { af, proto: p, net, port: 0, lo: port, hi: port, by },
                        Some(PortOp::Range(lo, hi)) => Target { af, proto: p, net, port: 0, lo, hi, by },
                        _ => Target { af, proto: p, net, port: 0, lo: 0, hi: 65535, by },
                    };
                    out.push(t);
                }
                if r.proto.is_none() || r.proto == Some(icmp(af)) {
                    out.push(Target { af, proto: icmp(af), net, port: 0, lo: 0, hi: 65535, by });
                }
                out.extend(bare.map(|p| Target { af, proto: p, net, port: 0, lo: 0, hi: 65535, by }));
            }
        }
    }
    out
}

/// Whether rule `r`'s `rdr-to` pool (compiled: `rp`) gives each destination one address: one
/// network written in the rule (not a table, whose addresses change without a compile), a
/// host or mapped host by host (no pool type, or `bitmask`: Pool::pick).
fn targets_one(r: &Rule, rp: &xpf_engine::nat::Pool) -> bool {
    if r.rdr.as_deref().is_none_or(|p| p.list.is_some() || matches!(p.host.kind, HostKind::Table(_))) {
        return false;
    }
    match rp.nets.as_slice() {
        [n] => {
            n.len as u32 == if n.af == AF_INET { 32 } else { 128 }
                || matches!(rp.method, xpf_engine::nat::Method::None | xpf_engine::nat::Method::Bitmask)
        }
        _ => false,
    }
}

/// A limited rule's limiter id: a hash of the rule as written (its line aside) and of how many
/// identical rules come before it. A table change or a reload recompiles every rule; a rule
/// that is still there keeps its id, so its states go on counting against its limits, and a
/// changed rule starts from zero while the old one's states count against the old one (as
/// pf's states keep their rule).
fn limiter_id(r: &Rule, seen: &mut HashMap<u64, u32>) -> u32 {
    use std::hash::{Hash, Hasher};
    let text = format!("{:?}", Rule { line: 0, ..r.clone() });
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let base = h.finish();
    let n = seen.entry(base).or_insert(0);
    *n += 1;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (base, *n).hash(&mut h);
    (h.finish() as u32).max(1)
}

/// pfctl's return codes: `return` is a RST for TCP and port unreachable otherwise,
/// `return-icmp`/`return-icmp6` default to port unreachable (ICMP code 3, ICMPv6 code 4).
fn engine_return(r: &Return) -> EReturn {
    match r {
        Return::Drop => EReturn::DROP,
        Return::Return => EReturn { rst: true, ttl: 0, icmp4: Some(3), icmp6: Some(4) },
        Return::Rst { ttl } => EReturn { rst: true, ttl: ttl.unwrap_or(0), icmp4: None, icmp6: None },
        Return::Icmp { v4, v6 } => {
            EReturn { rst: false, ttl: 0, icmp4: Some(v4.unwrap_or(3)), icmp6: Some(v6.unwrap_or(4)) }
        }
    }
}

/// A rule's `keep state (...)` limits and timeouts, None when it has none.
/// Its limiter id is left 0 for the caller ([`limiter_id`]).
fn rule_limits(o: &StateOpts) -> Option<RuleLimits> {
    let track_src = o.source_track.is_some()
        || o.max_src_states.is_some()
        || o.max_src_nodes.is_some()
        || o.max_src_conn.is_some()
        || o.max_src_conn_rate.is_some();
    if !track_src && o.max.is_none() && o.timeouts.is_empty() {
        return None;
    }
    Some(RuleLimits {
        limiter: 0,
        max: o.max.unwrap_or(0),
        max_src_states: o.max_src_states.unwrap_or(0),
        max_src_nodes: o.max_src_nodes.unwrap_or(0),
        max_src_conn: o.max_src_conn.unwrap_or(0),
        max_src_conn_rate: o.max_src_conn_rate.unwrap_or((0, 0)),
        track_src,
        per_rule_nodes: o.source_track == Some(true),
        overload: o.overload.as_ref().map(|(t, flush, global)| Overload {
            table: t.clone(),
            flush: *flush,
            global: *global,
        }),
        timeouts: o.timeouts.clone(),
    })
}

/// Compile errors name the rule's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    pub line: u32,
    pub msg: String,
}

/// The routes of `fib` as a table: those out of interface `oif` (all, for None) as entries,
/// the others (and rejecting routes) as negated entries, so that the longest match decides.
fn route_table(fib: &crate::routes::Fib, oif: Option<u32>) -> Table {
    let mut tb = Table::default();
    for r in &fib.routes {
        let ok = !r.reject && oif.is_none_or(|i| r.oifs.contains(&i));
        tb.insert(r.addr, r.len, !ok);
    }
    tb
}

/// A rule's list of next hops (`route-to { (IF ADDR), ... } round-robin`): a new state takes
/// the next one in turn (shared by the workers, as pf's pool counter is).
#[derive(Debug)]
struct RoutePool {
    /// Numbers in [`ROUTE_TARGETS`], + 1.
    hops: Vec<u16>,
    turn: AtomicU32,
}

impl RoutePool {
    fn next(&self) -> u16 {
        let i = self.turn.fetch_add(1, Ordering::Relaxed) as usize % self.hops.len();
        self.hops[i]
    }
}

/// Every routing target (`route-to`, `reply-to`) compiled since the process started, each
/// once: a state keeps its rule's target by its number here, as pf's state keeps `rt_addr`,
/// through reloads that drop or renumber the rule (a ruleset holds them all as they were
/// when it was compiled).
static ROUTE_TARGETS: Mutex<Vec<xpf_engine::RouteTarget>> = Mutex::new(Vec::new());

/// The interface the longest of `fib`'s routes that holds `a` leaves by (its first, for a
/// multipath route); None when no route holds it or that route rejects.
fn oif_towards(fib: &crate::routes::Fib, a: IpAddr) -> Option<u32> {
    let holds = |r: &&crate::routes::Route| match (r.addr, a) {
        (IpAddr::V4(n), IpAddr::V4(x)) => {
            r.len == 0 || u32::from(n) >> (32 - r.len.min(32)) == u32::from(x) >> (32 - r.len.min(32))
        }
        (IpAddr::V6(n), IpAddr::V6(x)) => {
            r.len == 0 || u128::from(n) >> (128 - r.len.min(128)) == u128::from(x) >> (128 - r.len.min(128))
        }
        _ => false,
    };
    let r = fib.routes.iter().filter(holds).max_by_key(|r| r.len)?;
    if r.reject {
        return None;
    }
    r.oifs.first().copied()
}

fn table_index(tables: &mut Vec<(String, Arc<Table>)>, name: String, make: impl FnOnce() -> Table) -> usize {
    match tables.iter().position(|t| t.0 == name) {
        Some(i) => i,
        None => {
            tables.push((name, Arc::new(make())));
            tables.len() - 1
        }
    }
}

fn net(a: IpAddr, len: u8) -> xpf_engine::nat::Net {
    xpf_engine::nat::Net { addr: Addr::from_ip(a), af: if a.is_ipv4() { AF_INET } else { AF_INET6 }, len }
}

/// Compiles rule `r`'s translation target `pool` (`rdr`: a destination one) into `pools`;
/// its index + 1, or 0 without one. Tables are read as they are now (and refilled by
/// [`Ruleset::with_table`]), interfaces' addresses as they are now (xpfd compiles again when
/// they change); IPv6 link-local addresses are never a translation's.
fn add_pool(
    r: &Rule,
    pool: Option<&Pool>,
    rdr: bool,
    tables: &[(String, Arc<Table>)],
    pools: &mut Vec<xpf_engine::nat::Pool>,
    pool_tables: &mut Vec<(usize, String)>,
    origins: &mut Vec<String>,
) -> Result<u32, CompileError> {
    use xpf_engine::nat::{Method, Pool as EPool};
    let Some(pool) = pool else { return Ok(0) };
    let err = |msg: String| CompileError { line: r.line, msg };
    let mut nets = Vec::new();
    for h in std::iter::once(&pool.host).filter(|_| pool.list.is_none()).chain(pool.list.iter().flatten()) {
        match &h.kind {
            HostKind::Net(a, l) => nets.push(net(*a, *l)),
            HostKind::Dynamic { ifname, modifier, prefix } => {
                for (a, l) in crate::ifaddr::dynamic(ifname, modifier.as_deref(), *prefix) {
                    if !matches!(a, IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80) {
                        nets.push(net(a, l));
                    }
                }
            }
            HostKind::Table(name) => {
                let t = tables.iter().find(|t| &t.0 == name).map(|t| &t.1);
                nets.extend(t.map(|t| t.hosts()).unwrap_or_default().into_iter().map(|(a, l)| net(a, l)));
                pool_tables.push((pools.len(), name.clone()));
            }
            _ => return Err(err(format!("{} is not a translation address", crate::print::host_label(h)))),
        }
    }
    let method = match &pool.kind {
        PoolKind::None => Method::None,
        PoolKind::Bitmask => Method::Bitmask,
        PoolKind::Random => Method::Random,
        PoolKind::RoundRobin => Method::RoundRobin,
        PoolKind::LeastStates => Method::LeastStates,
        PoolKind::SourceHash(Some(hex)) => {
            let mut k = [0u8; 16];
            for (i, b) in k.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 + 2 * i..4 + 2 * i], 16).map_err(|_| err(format!("bad key {hex}")))?;
            }
            Method::SourceHash(k)
        }
        PoolKind::SourceHash(None) => Method::SourceHash(xpf_state::os_random()),
    };
    // rdr-to: the rule's destination port range maps onto `port P:Q` (or `P:*`, as wide).
    let (dlo, dhi) = match r.dst_port {
        Some(PortOp::Eq(p)) => (p, p),
        Some(PortOp::Range(a, b)) => (a, b),
        _ => (0, 0),
    };
    let portset = pool.mape.map(|(offset, len, psid)| xpf_engine::nat::PortSet { offset, len, psid });
    let ports = match (rdr, pool.port) {
        (false, _) if portset.is_some() => portset.unwrap().span(),
        (false, None) if pool.static_port => (0, 0),
        (false, None) => (50001, 65535),
        (false, Some((a, 0))) => (a, 65535),
        (false, Some((a, b))) => (a.min(b), a.max(b)),
        (true, None) => (0, 0),
        (true, Some((a, 0))) => (a, a.saturating_add(dhi - dlo)),
        (true, Some((a, b))) => (a, b),
    };
    pools.push(EPool {
        nets,
        method,
        ports,
        static_port: pool.static_port,
        dst_base: dlo,
        endpoint_independent: pool.endpoint_independent && !rdr,
        sticky: pool.sticky,
        portset: portset.filter(|_| !rdr),
    });
    let kind = match (rdr, r.binat.is_some(), &r.xlate) {
        (_, _, Some(x)) => x.kind.word(),
        (_, true, None) => "binat-to",
        (true, false, None) => "rdr-to",
        (false, false, None) => "nat-to",
    };
    origins.push(format!("{kind} of {}:{}", r.file, r.line));
    Ok(pools.len() as u32)
}

fn addr_test(
    h: &Host,
    tables: &mut Vec<(String, Arc<Table>)>,
    fib: &crate::routes::Fib,
    urpf: &mut Vec<(u16, usize)>,
) -> (bool, AddrTest) {
    let t = match &h.kind {
        HostKind::Any => AddrTest::Any,
        // Refused before it gets here (support.rs): Linux's routes carry no labels.
        HostKind::RouteLabel(_) => AddrTest::Never,
        HostKind::Net(IpAddr::V4(a), l) => AddrTest::V4(u32::from(*a) & mask4(*l), mask4(*l)),
        HostKind::Net(IpAddr::V6(a), l) => AddrTest::V6(u128::from(*a) & mask6(*l), mask6(*l)),
        HostKind::Range(IpAddr::V4(a), IpAddr::V4(b)) => AddrTest::Range4(u32::from(*a), u32::from(*b)),
        HostKind::Range(IpAddr::V6(a), IpAddr::V6(b)) => AddrTest::Range6(u128::from(*a), u128::from(*b)),
        // `self` and `(if)` are the addresses the interfaces have at compile time, in a table
        // of their own; xpfd compiles again when they change (pf follows them the same way).
        // The addresses are read (getifaddrs) once a compile, for the rule that first names
        // them: `to self` on every rule of a large ruleset would read them per rule.
        HostKind::SelfAddr | HostKind::Dynamic { .. } => {
            let (ifname, modifier, prefix) = match &h.kind {
                HostKind::Dynamic { ifname, modifier, prefix } => (ifname.as_str(), modifier.as_deref(), *prefix),
                _ => ("self", None, None),
            };
            let name = match h.kind {
                HostKind::SelfAddr => "__self".to_string(),
                _ => format!(
                    "__dynamic_{ifname}{}{}",
                    modifier.map_or(String::new(), |m| format!(":{m}")),
                    prefix.map_or(String::new(), |p| format!("/{p}"))
                ),
            };
            match tables.iter().position(|t| t.0 == name) {
                Some(i) => AddrTest::Table(i),
                None => {
                    let addrs = crate::ifaddr::dynamic(ifname, modifier, prefix);
                    let mut tb = Table::default();
                    for (a, l) in addrs {
                        tb.insert(a, l, false);
                    }
                    tables.push((name, Arc::new(tb)));
                    AddrTest::Table(tables.len() - 1)
                }
            }
        }
        HostKind::Table(name) => match tables.iter().position(|t| &t.0 == name) {
            Some(i) => AddrTest::Table(i),
            None => {
                // pf creates a rule's table when it is not declared (empty until filled).
                tables.push((name.clone(), Arc::default()));
                AddrTest::Table(tables.len() - 1)
            }
        },
        // pf_routable against the kernel's routes at compile time (crate::routes); xpfd
        // compiles again when they change.
        HostKind::NoRoute => AddrTest::NoRoute(table_index(tables, "__no_route".into(), || route_table(fib, None))),
        HostKind::UrpfFailed => {
            if urpf.is_empty() {
                for i in fib.interfaces().into_iter().filter(|&i| i <= u16::MAX as u32) {
                    let t = table_index(tables, format!("__urpf_{i}"), || route_table(fib, Some(i)));
                    urpf.push((i as u16, t));
                }
            }
            AddrTest::Urpf
        }
        // A range of two families (the parser refuses one).
        HostKind::Range(..) => AddrTest::Never,
    };
    (h.neg, t)
}

/// The most tags a ruleset names (pf's TAGID_MAX).
pub const TAGS_MAX: usize = 50_000;

/// What compiling rules adds to besides the rules themselves: the ruleset's tables, tags,
/// state limits, marks, rare tests and translation pools.
struct Build<'a> {
    /// The ruleset-wide defaults rules take: `set state-defaults`, `set state-policy`.
    globals: &'a Globals,
    ifindex: &'a dyn Fn(&str) -> Option<u16>,
    /// The interfaces a name that is no interface stands for: a group's members
    /// (crate::ifgroup), None when it is no group either.
    groups: &'a dyn Fn(&str) -> Option<Vec<String>>,
    fib: &'a crate::routes::Fib,
    tables: Vec<(String, Arc<Table>)>,
    tags: Vec<String>,
    /// `tags` by name: the id is the index + 1.
    tag_ids: HashMap<String, u16>,
    limits: Vec<RuleLimits>,
    seen: HashMap<u64, u32>,
    seen_marks: HashMap<u64, u32>,
    marks: HashMap<u32, Arc<Mark>>,
    rare: Vec<Rare>,
    pools: Vec<xpf_engine::nat::Pool>,
    pool_tables: Vec<(usize, String)>,
    pool_origins: Vec<String>,
    routes: Vec<xpf_engine::RouteTarget>,
    route_pools: Vec<RoutePool>,
    nat_targets: Vec<Target>,
    nat_maps: Vec<NatMap>,
    nat_fronts: Vec<NatFront>,
    nat_hosts: Vec<NatHosts>,
    nat_ports: Vec<NatPorts>,
    nat_bare: Vec<NatBare>,
    urpf: Vec<(u16, usize)>,
    /// The queues by name (`set queue`).
    queue_ids: HashMap<String, u16>,
    /// What interface names stood for, asked once a name ([`Build::iface`]).
    ifs: HashMap<String, Result<u16, Vec<u16>>>,
}

impl<'a> Build<'a> {
    fn new(
        globals: &'a Globals,
        ifindex: &'a dyn Fn(&str) -> Option<u16>,
        groups: &'a dyn Fn(&str) -> Option<Vec<String>>,
        fib: &'a crate::routes::Fib,
        tables: Vec<(String, Arc<Table>)>,
        tags: Vec<String>,
    ) -> Build<'a> {
        Build {
            globals,
            ifindex,
            groups,
            fib,
            tables,
            tag_ids: tags.iter().enumerate().map(|(i, t)| (t.clone(), i as u16 + 1)).collect(),
            tags,
            limits: Vec::new(),
            seen: HashMap::new(),
            seen_marks: HashMap::new(),
            marks: HashMap::new(),
            rare: Vec::new(),
            pools: Vec::new(),
            pool_tables: Vec::new(),
            pool_origins: Vec::new(),
            routes: ROUTE_TARGETS.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            route_pools: Vec::new(),
            nat_targets: Vec::new(),
            nat_maps: Vec::new(),
            nat_fronts: Vec::new(),
            nat_hosts: Vec::new(),
            nat_ports: Vec::new(),
            nat_bare: Vec::new(),
            urpf: Vec::new(),
            queue_ids: HashMap::new(),
            ifs: HashMap::new(),
        }
    }

    /// The id of tag `s` (a new one for a new name), for the rule at `line`: pf's ids are 16-bit
    /// and end at its TAGID_MAX.
    fn tag_id(&mut self, s: &str, line: u32) -> Result<u16, CompileError> {
        if let Some(&i) = self.tag_ids.get(s) {
            return Ok(i);
        }
        if self.tags.len() >= TAGS_MAX {
            return Err(CompileError { line, msg: format!("tag {s}: more than {TAGS_MAX} tags (pf's TAGID_MAX)") });
        }
        self.tags.push(s.to_string());
        let id = self.tags.len() as u16;
        self.tag_ids.insert(s.to_string(), id);
        Ok(id)
    }

    /// Interface `name`: its index, or a group's members' (`Err`; empty when it is neither).
    /// Asked once a name per compile: the system's answer costs a socket and an ioctl, and a
    /// generated ruleset names its few interfaces on every rule (1.6M rules on one interface
    /// took seconds of a reload in these calls).
    fn iface(&mut self, name: &str) -> Result<u16, Vec<u16>> {
        if let Some(x) = self.ifs.get(name) {
            return x.clone();
        }
        let x = match (self.ifindex)(name) {
            Some(x) => Ok(x),
            None => Err((self.groups)(name).unwrap_or_default().iter().filter_map(|m| (self.ifindex)(m)).collect()),
        };
        self.ifs.insert(name.to_string(), x.clone());
        x
    }

    /// Rule `r`'s `route-to` or `reply-to`: its target's index + 1 (0: none), or for a list
    /// of next hops, the index + 1 of its pool in `route_pools` (the second number). The rest
    /// of what routing options may say is refused before (crate::support).
    fn route(&mut self, r: &Rule) -> Result<(u16, u16), CompileError> {
        let Some((kind, pool)) = r.route.as_deref() else { return Ok((0, 0)) };
        let reply = *kind == RouteKind::ReplyTo;
        // OpenBSD's list `{ ADDR, ADDR }`, the automatic table pfctl makes of it.
        let listed = match &pool.host.kind {
            HostKind::Table(name) if name.starts_with("__automatic_") => {
                let t = self.tables.iter().find(|t| &t.0 == name).map(|t| t.1.clone());
                t.map(|t| t.hosts()).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        if pool.hops.len() > 1 || !listed.is_empty() {
            let mut hops = Vec::with_capacity(pool.hops.len().max(listed.len()));
            for (ifname, h) in &pool.hops {
                hops.push(self.route_target(r, reply, h, Some(ifname))?);
            }
            for (a, len) in listed {
                hops.push(self.route_target(r, reply, &Host { kind: HostKind::Net(a, len), ..Host::ANY }, None)?);
            }
            self.route_pools.push(RoutePool { hops, turn: AtomicU32::new(0) });
            let n = u16::try_from(self.route_pools.len())
                .map_err(|_| CompileError { line: r.line, msg: "more than 65,535 pools of next hops".into() })?;
            return Ok((0, n));
        }
        let via = pool.hops.first().map(|(n, _)| n.as_str());
        Ok((self.route_target(r, reply, &pool.host, via)?, 0))
    }

    /// The number of next hop `h` (out of interface `via`, or for None the interface of the
    /// kernel's route to it) in [`ROUTE_TARGETS`], + 1.
    fn route_target(&mut self, r: &Rule, reply: bool, h: &Host, via: Option<&str>) -> Result<u16, CompileError> {
        let err = |msg: String| CompileError { line: r.line, msg };
        let HostKind::Net(a, len) = h.kind else {
            return Err(err("route-to and reply-to take one next hop".into()));
        };
        if len != if a.is_ipv4() { 32 } else { 128 } {
            return Err(err(format!("route-to and reply-to: a next hop is an address, not {a}/{len}")));
        }
        // OpenBSD's `route-to ADDR`: the interface the kernel's route to the next hop leaves by
        // (0 without one: looked up again when a packet goes there); compiled again when the
        // routes change.
        let ifidx = match via {
            None => oif_towards(self.fib, a).and_then(|i| u16::try_from(i).ok()).unwrap_or(0),
            Some(n) => self.iface(n).map_err(|_| err(format!("routeto: unknown interface {n}")))?,
        };
        let target = xpf_engine::RouteTarget {
            reply,
            ifidx,
            af: if a.is_ipv4() { AF_INET } else { AF_INET6 },
            addr: Addr::from_ip(a),
        };
        let mut all = ROUTE_TARGETS.lock().unwrap_or_else(|e| e.into_inner());
        let i = match all.iter().position(|t| *t == target) {
            Some(i) => i,
            None if all.len() < u16::MAX as usize => {
                all.push(target);
                all.len() - 1
            }
            None => return Err(err("more than 65,535 routing targets loaded since xpfd started".into())),
        };
        self.routes = all.clone();
        Ok(i as u16 + 1)
    }

    /// Compiles rule `r` (pf number `nr`; `x`: a translation rule) with its anchor's end
    /// (0: not an anchor) and its named anchor's slot + 1 (0: none).
    fn rule(&mut self, r: &Rule, nr: u32, x: bool, anchor_end: u32, slot: u32) -> Result<CRule, CompileError> {
        let g = self.globals;
        // An interface, or a group's members (tested out of line, in the rule's rare tests).
        // A name that is neither stands for no interface, as pf keeps a rule on an interface
        // it lacks for when it appears (xpfd compiles again then).
        let (mut on, mut on_group) = (None, None);
        match &r.on {
            Some(i) if i.name == "any" => {}
            Some(i) => match self.iface(&i.name) {
                Ok(x) => on = Some((i.neg, x)),
                Err(members) => on_group = Some((i.neg, members)),
            },
            None => {}
        }
        // A translation's interfaces, for the hand-off (None: every interface).
        let xlate_on = r.nat.is_some().then(|| match (&on, &on_group) {
            (Some((false, x)), _) => Some(vec![*x]),
            (_, Some((false, m))) => Some(m.clone()),
            _ => None,
        });
        let rcv = r.received_on.as_deref().map(|i| (i.neg, self.iface(&i.name).map_or_else(|m| m, |x| vec![x])));
        let mark = (r.once || r.max_pkt_rate.is_some()).then(|| {
            let m = Arc::new(Mark {
                id: limiter_id(r, &mut self.seen_marks),
                once: r.once,
                expired: AtomicBool::new(false),
                meter: r.max_pkt_rate.map(|(n, secs)| Mutex::new(Threshold::new(n, secs))),
            });
            self.marks.insert(m.id, m.clone());
            m
        });
        // Route tests go to the rule's rare tests (see `Rare::routes`).
        let (mut src, mut dst) = (
            addr_test(&r.src, &mut self.tables, self.fib, &mut self.urpf),
            addr_test(&r.dst, &mut self.tables, self.fib, &mut self.urpf),
        );
        let mut routes = [None, None];
        for (side, t) in [&mut src, &mut dst].into_iter().enumerate() {
            if matches!(t.1, AddrTest::NoRoute(_) | AddrTest::Urpf) {
                routes[side] = Some(*t);
                *t = (false, AddrTest::Any);
            }
        }
        let route = self.route(r)?;
        let tag = r.tag.as_deref().map(|t| self.tag_id(t, r.line)).transpose()?;
        let tagged = r.tagged.as_ref().map(|(n, t)| self.tag_id(t, r.line).map(|id| (*n, id))).transpose()?;
        let counted = [&src, &dst].iter().any(|t| matches!(t.1, AddrTest::Table(i) if self.tables[i].1.counted));
        let c = CRule {
            counted,
            nr,
            action: r.action,
            // A translation rule: the first match decides.
            quick: r.quick || x,
            dir: r.dir,
            on,
            af: match r.af {
                Af::Inet => AF_INET,
                Af::Inet6 => AF_INET6,
                Af::Any => 0,
            },
            proto: r.proto,
            src,
            src_port: r.src_port,
            dst,
            dst_port: r.dst_port,
            flags: match r.flags {
                Some(Flags::Set { bits, mask }) => Some((bits, mask)),
                _ => None,
            },
            icmp: r.icmp,
            // pf keeps no state for a fragment (`fragment` rules match nothing else).
            keep_state: r.state != StateKind::No && !r.fragment,
            ret: engine_return(&r.ret),
            // `set tos` is pfctl's PFSTATE_SETTOS, as `scrub (set-tos)` is (it wins over it).
            scrub: EScrub {
                set_tos: r.set_tos.or(r.scrub.as_ref().and_then(|s| s.set_tos)),
                ..r.scrub.as_ref().map_or(EScrub::NONE, |s| EScrub {
                    no_df: s.no_df,
                    random_id: s.random_id,
                    min_ttl: s.min_ttl.unwrap_or(0),
                    set_tos: None,
                    max_mss: s.max_mss.unwrap_or(0),
                    id: 0,
                    tcp_clean: false,
                })
            },
            tos: r.tos,
            prob: r.probability.map_or(0, prob_threshold),
            nosync: r.state_opts.no_sync || g.no_sync,
            // `set state-policy if-bound` binds every state a rule does not make floating.
            if_bound: r.state_opts.if_bound || (g.if_bound && !r.state_opts.floating),
            allow_opts: r.allow_opts,
            sloppy: r.state_opts.sloppy,
            pflow: r.state_opts.pflow || g.pflow,
            modulate: r.state == StateKind::Modulate,
            synproxy: r.state == StateKind::Synproxy,
            // A rule that does not ask for a bare SYN may pick a stream up in the middle.
            pickup: match r.flags {
                Some(Flags::Set { bits, mask }) => !(bits & 0x02 != 0 && mask & 0x10 != 0 && bits & 0x10 == 0),
                _ => true,
            },
            limits: match rule_limits(&r.state_opts) {
                Some(l) if r.action == Action::Pass && r.state != StateKind::No => {
                    self.limits.push(RuleLimits { limiter: limiter_id(r, &mut self.seen), ..l });
                    self.limits.len() as u32
                }
                _ => 0,
            },
            tag,
            tagged,
            queue: match r.set_queue.as_deref() {
                None => 0,
                Some((q, ack)) => {
                    let id = |n: &str| {
                        self.queue_ids
                            .get(n)
                            .copied()
                            .ok_or_else(|| CompileError { line: r.line, msg: format!("queue {n} is not defined") })
                    };
                    let q = id(q)? as u32;
                    // pf: without an ACK queue, the ACKs go with the rest.
                    q | ack.as_deref().map_or(Ok(q), |a| id(a).map(u32::from))? << 16
                }
            },
            route: route.0,
            route_pool: route.1,
            rare: if on_group.is_some()
                || rcv.is_some()
                || mark.is_some()
                || routes.iter().any(Option::is_some)
                || r.fragment
            {
                self.rare.push(Rare { on: on_group, rcv, routes, mark, fragment: r.fragment });
                self.rare.len() as u32
            } else {
                0
            },
            depth: r.depth,
            anchor_end,
            slot,
            nat: add_pool(
                r,
                r.nat.as_deref(),
                false,
                &self.tables,
                &mut self.pools,
                &mut self.pool_tables,
                &mut self.pool_origins,
            )?,
            rdr: add_pool(
                r,
                r.rdr.as_deref(),
                true,
                &self.tables,
                &mut self.pools,
                &mut self.pool_tables,
                &mut self.pool_origins,
            )?,
            natpass: r.xlate.is_some_and(|x| x.pass),
            log: r.log.as_ref().map_or(0, |l| {
                l.to.as_deref().and_then(|t| t.strip_prefix("pflog")).and_then(|n| n.parse::<u8>().ok()).unwrap_or(0)
                    + 1
            }),
            log_all: r.log.as_ref().is_some_and(|l| l.all),
        };
        let nat = (c.nat != 0).then(|| &self.pools[c.nat as usize - 1]);
        let rdr = (c.rdr != 0).then(|| &self.pools[c.rdr as usize - 1]);
        self.nat_targets.extend(targets_of(r, nat, rdr, &self.tables));
        if nat.is_some() {
            self.nat_maps.extend(NatMap::of(r));
            self.nat_hosts.extend(NatHosts::of(r));
            self.nat_ports.extend(NatPorts::of(r));
            self.nat_bare.extend(NatBare::of(r, xlate_on.flatten()));
        }
        if let (Some(rp), Some((front, proto, (lo, hi)))) = (rdr, NatFront::shape(r)) {
            if !targets_one(r, rp) {
                // The targets' ports: the rule's, or the pool's (`port P`, `port P:Q`, `P:*`).
                let ports = if rp.ports == (0, 0) { (lo, hi) } else { (rp.ports.0, rp.ports.1.max(rp.ports.0)) };
                let at = format!("{}:{}", r.file, r.line);
                self.nat_fronts.push(NatFront { front, proto, ports, pool: c.rdr as usize - 1, at });
            }
        }
        Ok(c)
    }
}

impl Ruleset {
    /// Compiles parsed rules. `ifindex` maps interface names to the engine's indexes; a rule on
    /// an interface the machine does not have waits for it, as in pf (it matches no packet on
    /// that interface, `! on` every packet).
    pub fn compile(p: &Parsed, ifindex: &dyn Fn(&str) -> Option<u16>) -> Result<Ruleset, CompileError> {
        Self::compile_on(p, ifindex, crate::ifgroup::Links::now().ok().as_ref())
    }

    /// [`Ruleset::compile`] with the groups of `links` (None: no group), a snapshot the caller
    /// keeps to see later whether what the ruleset's names stand for changed.
    pub fn compile_on(
        p: &Parsed,
        ifindex: &dyn Fn(&str) -> Option<u16>,
        links: Option<&crate::ifgroup::Links>,
    ) -> Result<Ruleset, CompileError> {
        let fib = if Self::uses_routes(p) {
            crate::routes::Fib::kernel().map_err(|e| CompileError {
                line: 0,
                msg: format!("reading the kernel's routes (no-route, urpf-failed, route-to ADDR): {e}"),
            })?
        } else {
            crate::routes::Fib::default()
        };
        let groups = |n: &str| links?.members(n);
        Self::compile_with(p, ifindex, &groups, &fib)
    }

    /// Whether rules of `p` test routes (`no-route`, `urpf-failed`) or route by them
    /// (OpenBSD's `route-to ADDR`): the ruleset is then compiled against the kernel's routes,
    /// and again when they change.
    pub fn uses_routes(p: &Parsed) -> bool {
        p.rules.iter().any(|r| {
            [&r.src, &r.dst].iter().any(|h| matches!(h.kind, HostKind::NoRoute | HostKind::UrpfFailed))
                || r.route.as_deref().is_some_and(|(_, pl)| pl.hops.is_empty())
        })
    }

    /// [`Ruleset::compile`] against the routes `fib`.
    pub fn compile_at(
        p: &Parsed,
        ifindex: &dyn Fn(&str) -> Option<u16>,
        fib: &crate::routes::Fib,
    ) -> Result<Ruleset, CompileError> {
        let links = crate::ifgroup::Links::now().ok();
        Self::compile_with(p, ifindex, &|n| links.as_ref()?.members(n), fib)
    }

    /// [`Ruleset::compile_at`] with the interface groups `groups` has (a group's members by
    /// name; None: no group of that name).
    pub fn compile_with(
        p: &Parsed,
        ifindex: &dyn Fn(&str) -> Option<u16>,
        groups: &dyn Fn(&str) -> Option<Vec<String>>,
        fib: &crate::routes::Fib,
    ) -> Result<Ruleset, CompileError> {
        let mut tables: Vec<(String, Arc<Table>)> = Vec::new();
        for t in &p.tables {
            let mut tb = Table::counting(t.counters);
            for part in &t.parts {
                match part {
                    TablePart::Hosts(hs) => {
                        for h in hs {
                            if let HostKind::Net(a, l) = h.kind {
                                tb.insert(a, l, h.neg);
                            }
                        }
                    }
                    // Read at every compile: a reload picks up the file as it is then, and a
                    // file that cannot be read fails the load (the ruleset in force stays).
                    TablePart::File(f) => {
                        let text = std::fs::read_to_string(f).map_err(|e| CompileError {
                            line: t.line,
                            msg: format!("table <{}>: cannot load \"{f}\": {e}", t.name),
                        })?;
                        for e in table_file_entries(&text) {
                            let (a, l, neg) = e.map_err(|(n, w)| CompileError {
                                line: t.line,
                                msg: format!("table <{}>: {f}:{n}: {w}", t.name),
                            })?;
                            tb.insert(a, l, neg);
                        }
                    }
                }
            }
            tables.push((t.name.clone(), Arc::new(tb)));
        }
        let globals = Globals::of(p);
        let queues = queues::compile(&p.queues)?;
        let mut b = Build::new(&globals, ifindex, groups, fib, tables, Vec::new());
        b.queue_ids = queues.ids.clone();
        let mut rules = Vec::with_capacity(p.rules.len());
        let mut xrules = Vec::new();
        let paths = anchor_paths(&p.rules);
        let mut slots: HashMap<String, (u32, bool)> = HashMap::new();
        let mut first_of_slot: Vec<u32> = Vec::new();
        let halves = xlate_halves(&p.xrules);
        let jobs = p.rules.iter().enumerate().map(|(nr, r)| (false, nr, r));
        for (x, nr, r) in jobs.chain(halves.iter().map(|(nr, r)| (true, *nr, r))) {
            // An anchor's body is the rules after it one level deeper; one loaded from elsewhere
            // has none here yet, and is empty.
            let anchor_end = if r.anchor.is_some() && !x { body_end(&p.rules, nr) as u32 } else { 0 };
            // A named anchor's slot: where rules loaded into it at run time are found.
            let slot = match paths.get(nr).filter(|_| !x).and_then(Option::as_ref) {
                Some(path) => {
                    let n = slots.len() as u32;
                    let e = slots.entry(path.clone()).or_insert((n, false));
                    e.1 |= r.opens;
                    if e.0 == n {
                        first_of_slot.push(nr as u32);
                    }
                    e.0 + 1
                }
                None => 0,
            };
            let c = b.rule(r, nr as u32, x, anchor_end, slot)?;
            if x {
                xrules.push(c)
            } else {
                rules.push(c)
            };
        }
        let scrubs = if p.scrubs.iter().any(|r| r.scrub.is_some()) {
            let mut v = Vec::with_capacity(p.scrubs.len());
            for (nr, r) in p.scrubs.iter().enumerate() {
                v.push(b.rule(r, nr as u32, true, 0, 0)?);
            }
            Some(List::new(v, Lookup::Auto))
        } else {
            None
        };
        let Build {
            tables,
            tags,
            limits,
            marks,
            rare,
            pools,
            pool_tables,
            pool_origins,
            routes,
            route_pools,
            nat_targets,
            nat_maps,
            nat_fronts,
            nat_hosts,
            nat_ports,
            nat_bare,
            urpf,
            ..
        } = b;
        // Several ranges for one protocol and network: the span of them (packets outside a
        // translation go back to the host). The program takes the longest prefix only: a
        // range for a wider network also widens every narrower one's.
        let mut merged: Vec<Target> = Vec::new();
        for t in &nat_targets {
            match merged.iter_mut().find(|m| m.af == t.af && m.proto == t.proto && m.net == t.net && m.port == t.port) {
                Some(m) if t.port == 0 => {
                    m.lo = m.lo.min(t.lo);
                    m.hi = m.hi.max(t.hi);
                }
                Some(_) => {}
                None => merged.push(*t),
            }
        }
        let ranges: Vec<Target> = merged.iter().filter(|t| t.port == 0).copied().collect();
        for m in merged.iter_mut().filter(|m| m.port == 0) {
            for w in &ranges {
                let covers = match (w.net, m.net) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some((wa, wl)), Some((ma, ml))) => wl <= ml && masked_addr(ma, wl) == wa,
                };
                if covers && w.af == m.af && w.proto == m.proto {
                    m.lo = m.lo.min(w.lo);
                    m.hi = m.hi.max(w.hi);
                }
            }
        }
        let now = unix_now();
        let tables = tables
            .into_iter()
            .map(|(n, mut t)| {
                // Every table is this compile's own: none is shared yet.
                if let Some(t) = Arc::get_mut(&mut t) {
                    t.zero(now);
                }
                (n, t)
            })
            .collect();
        // An interface `set skip on` names that the machine lacks is skipped when it appears
        // (pf's absent interfaces), so it is not an error; a reload picks it up. A group's
        // members are skipped.
        let each = |n: &String| -> Vec<u16> {
            match ifindex(n) {
                Some(i) => vec![i],
                None => groups(n).unwrap_or_default().iter().filter_map(|m| ifindex(m)).collect(),
            }
        };
        let skip_ifs = p.skip.iter().flat_map(each).collect();
        let random = rules.iter().any(|r| r.prob != 0);
        let filter = List::new(rules, Lookup::Auto);
        let xlate = List::new(xrules, Lookup::Auto);
        let urpf = Arc::new(urpf);
        let pools = Arc::new(pools);
        Ok(Ruleset {
            pools,
            pool_tables,
            pool_origins: Arc::new(pool_origins),
            routes: Arc::new(routes),
            route_pools: Arc::new(route_pools),
            nat_targets: merged,
            nat_owners: nat_targets,
            nat_maps,
            nat_fronts,
            nat_hosts,
            nat_ports,
            nat_bare,
            filter,
            xlate,
            scrubs,
            tables,
            tags,
            limits,
            skip_ifs,
            random,
            marks,
            rare,
            urpf,
            loginterface: p.loginterface.as_ref().map(each).unwrap_or_default(),
            queues: Arc::new(queues),
            anchors: Anchors::new(slots, first_of_slot),
            rule_log: RuleLog::of(&p.rules, "").map(Arc::new),
            globals,
        })
    }

    /// Chooses how first packets find their rules (the bench compares the two).
    pub fn set_lookup(&mut self, how: Lookup) {
        self.filter.set_lookup(how);
        self.xlate.set_lookup(how);
        self.set_anchors_lookup(how);
    }

    /// The classifier's shapes for a packet of family `af` and its bytes (None: the walk).
    pub fn classifier_stats(&self, af: u8) -> Option<(usize, usize, usize)> {
        self.filter.class.as_ref().map(|c| (c.class.shapes(af), c.class.bytes() + c.parent.len() * 4, c.class.longest))
    }

    /// Takes over `old`'s marks for the rules both have (`once` rules that fired stay
    /// expired, packet-rate meters keep counting): for a recompile of the same rules.
    pub fn keep_marks(&mut self, old: &Ruleset) {
        for r in &mut self.rare {
            if let Some(m) = r.mark.as_mut() {
                if let Some(o) = old.marks.get(&m.id) {
                    *m = o.clone();
                    self.marks.insert(o.id, o.clone());
                }
            }
        }
    }

    /// The tables as they are in force in `old` (changed by `-T` since the load) for the
    /// tables of the same name, and `old`'s marks ([`Ruleset::keep_marks`]): for a recompile
    /// of the same rules. The tables the compiler makes from the host (`__self`,
    /// `__dynamic_*`, `__no_route`, `__urpf_*`; no `-T` reaches them) are this compile's: a
    /// recompile is for their sake.
    pub fn keep_runtime(&mut self, old: &Ruleset) {
        self.keep_marks(old);
        for (n, t) in &mut self.tables {
            if n.starts_with("__") {
                continue;
            }
            if let Some((_, o)) = old.tables.iter().find(|(m, _)| m == n) {
                *t = o.clone();
            }
        }
    }

    /// The rule of translation pool `i` (a [`Decision`]'s `nat` or `rdr`), as a log names it:
    /// `nat-to of FILE:LINE`.
    pub fn pool_origin(&self, i: u32) -> Option<&str> {
        self.pool_origins.get((i as usize).wrapping_sub(1)).map(String::as_str)
    }

    /// This ruleset with table `name` replaced by `t`: everything else (rules, counters,
    /// marks) shared. The workers take it as a new generation at their next batch.
    pub fn with_table(&self, name: &str, t: Table) -> Option<Ruleset> {
        let i = self.tables.iter().position(|(n, _)| n == name)?;
        let mut r = self.clone();
        if self.pool_tables.iter().any(|(_, n)| n == name) {
            let mut pools = (*self.pools).clone();
            for (k, _) in self.pool_tables.iter().filter(|(_, n)| n == name) {
                pools[*k].nets = t.hosts().into_iter().map(|(a, l)| net(a, l)).collect();
            }
            r.pools = Arc::new(pools);
        }
        r.tables[i].1 = Arc::new(t);
        Some(r)
    }

    /// The lists of filter rules in force, the main ruleset's and each anchor's loaded at run
    /// time: (identity, lowest and highest rule number). A list a load replaces has a new
    /// identity, so that its rules' counts start from the load, as pf's do; one that stays
    /// (the main ruleset when an anchor is loaded) keeps its identity.
    /// In order of their numbers ([`RuleList::find`]).
    pub fn rule_lists(&self) -> Vec<RuleList> {
        let loaded = self.anchors.loaded.values().map(|a| &a.list);
        let mut v: Vec<RuleList> = std::iter::once(&self.filter)
            .chain(loaded)
            .map(|l| {
                // A list numbers its rules in order (a rule made of several numbers each alike).
                let (lo, hi) = (l.rules.first().map_or(0, |r| r.nr), l.rules.last().map_or(0, |r| r.nr));
                RuleList { id: Arc::as_ptr(&l.evaluations) as usize, lo, hi }
            })
            .collect();
        v.sort_unstable_by_key(|l| l.lo);
        v
    }

    /// `pfctl -z`: every rule's evaluations back to 0.
    pub fn zero_evaluations(&self) {
        let loaded = self.anchors.loaded.values().map(|a| &a.list.evaluations);
        for e in [&self.filter.evaluations, &self.xlate.evaluations].into_iter().chain(loaded) {
            e.zero();
        }
    }

    /// Evaluations of translation rule `i` (both halves of a `binat`).
    pub fn xlate_evaluations(&self, i: usize) -> u64 {
        let e = &self.xlate.evaluations;
        self.xlate.rules.iter().enumerate().filter(|(_, r)| r.nr as usize == i).map(|(k, _)| e.get(k)).sum()
    }

    /// Evaluations of filter rule `i` since the load or the last `-z`.
    pub fn evaluations(&self, i: usize) -> u64 {
        self.filter.evaluations.get(i)
    }

    /// Whether rule `i` is a `once` rule that has fired (pfctl -s rules leaves it out).
    pub fn expired(&self, i: usize) -> bool {
        self.mark(&self.filter.rules[i]).is_some_and(|m| m.expired.load(Ordering::Relaxed))
    }

    #[inline]
    fn mark(&self, r: &CRule) -> Option<&Arc<Mark>> {
        self.rare.get((r.rare as usize).wrapping_sub(1)).and_then(|x| x.mark.as_ref())
    }

    pub fn len(&self) -> usize {
        self.filter.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filter.rules.is_empty()
    }

    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.0 == name).map(|t| &*t.1)
    }

    /// The index of the first field of rule `r` the packet fails, or None when it matches.
    #[inline(always)]
    fn first_mismatch(&self, r: &CRule, pd: &PDesc, at: &Context, tag: u16) -> Option<usize> {
        let (ifidx, dir) = (at.ifidx, at.dir);
        if let Some((neg, i)) = r.on {
            if (i == ifidx) == neg {
                return Some(SKIP_IF);
            }
        }
        match (r.dir, dir) {
            (Dir::In, SDir::Out) | (Dir::Out, SDir::In) => return Some(SKIP_DIR),
            _ => {}
        }
        if r.af != 0 && r.af != pd.af {
            return Some(SKIP_AF);
        }
        if let Some(p) = r.proto {
            if p != pd.proto {
                return Some(SKIP_PROTO);
            }
        }
        if !self.addr_match(&r.src, &pd.src, pd.af) {
            return Some(SKIP_SRC);
        }
        if let Some(op) = r.src_port {
            if pd.flags & pdf::HAS_PORTS == 0 || !port_match(op, pd.sport) {
                return Some(SKIP_SPORT);
            }
        }
        if !self.addr_match(&r.dst, &pd.dst, pd.af) {
            return Some(SKIP_DST);
        }
        if let Some(op) = r.dst_port {
            if pd.flags & pdf::HAS_PORTS == 0 || !port_match(op, pd.dport) {
                return Some(SKIP_DPORT);
            }
        }
        // Fields without skip steps: a mismatch goes to the next rule.
        if let Some((bits, mask)) = r.flags {
            // A later fragment has no TCP header (pf: a fragment matches no `flags`).
            if pd.proto == IPPROTO_TCP && (pd.tcp_flags & mask != bits || pd.flags & pdf::NOT_FIRST_FRAG != 0) {
                return Some(usize::MAX);
            }
        }
        if let Some((t, code)) = r.icmp {
            // A later fragment has no ICMP header (pf: a fragment matches no type or code).
            if pd.icmp_type != t || code.is_some_and(|c| c != pd.icmp_code) || pd.flags & pdf::NOT_FIRST_FRAG != 0 {
                return Some(usize::MAX);
            }
        }
        if let Some(t) = r.tos {
            if pd.tos & !0x03 != t {
                return Some(usize::MAX);
            }
        }
        if r.prob != 0 && draw(at.rnd, r.nr) > r.prob {
            return Some(usize::MAX);
        }
        if let Some((neg, t)) = r.tagged {
            if (tag == t) == neg {
                return Some(usize::MAX);
            }
        }
        if r.rare != 0 && !self.rare_match(r.rare, pd, at) {
            return Some(usize::MAX);
        }
        None
    }

    /// `no-route` (no route to `a`) and `urpf-failed` (no route back to source `a` out of
    /// interface `ifidx`), as pf_routable.
    fn route_test(&self, t: &AddrTest, a: &Addr, af: u8, ifidx: u16) -> bool {
        match t {
            AddrTest::NoRoute(i) => !self.tables[*i].1.contains(a, af),
            _ => !self.urpf.iter().find(|x| x.0 == ifidx).is_some_and(|&(_, i)| self.tables[i].1.contains(a, af)),
        }
    }

    /// The tests few rules have (`Ruleset::rare`), out of line.
    #[inline(never)]
    fn rare_match(&self, rare: u32, pd: &PDesc, at: &Context) -> bool {
        let x = &self.rare[rare as usize - 1];
        if x.fragment && pd.flags & pdf::FRAGMENT == 0 {
            return false;
        }
        if let Some((neg, members)) = &x.on {
            if members.contains(&at.ifidx) == *neg {
                return false;
            }
        }
        if let Some((neg, i)) = &x.rcv {
            if i.contains(&at.rcvif) == *neg {
                return false;
            }
        }
        for (side, a) in [&pd.src, &pd.dst].into_iter().enumerate() {
            if let Some((neg, t)) = &x.routes[side] {
                if self.route_test(t, a, pd.af, at.ifidx) == *neg {
                    return false;
                }
            }
        }
        match &x.mark {
            // A fired `once` rule is gone; the packet meter comes last, as in pf: only a
            // packet that matches all else counts.
            Some(m) => !(m.once && m.expired.load(Ordering::Relaxed) || m.over(at.now)),
            None => true,
        }
    }

    #[inline]
    fn addr_match(&self, (neg, t): &(bool, AddrTest), a: &Addr, af: u8) -> bool {
        let m = match t {
            AddrTest::Any => true,
            AddrTest::V4(net, mask) => af == AF_INET && a.v4_u32() & mask == *net,
            AddrTest::V6(net, mask) => af == AF_INET6 && u128::from_be_bytes(a.0) & mask == *net,
            AddrTest::Range4(lo, hi) => af == AF_INET && (*lo..=*hi).contains(&a.v4_u32()),
            AddrTest::Range6(lo, hi) => af == AF_INET6 && (*lo..=*hi).contains(&u128::from_be_bytes(a.0)),
            AddrTest::Table(i) => self.tables[*i].1.contains(a, af),
            // In the rule's rare tests (`Rare::routes`), never here.
            AddrTest::NoRoute(_) | AddrTest::Urpf => false,
            AddrTest::Never => false,
        };
        m != *neg
    }

    /// pf_test_rule. Returns the deciding rule's index (None: the default rule) and the tag.
    /// Anchors are evaluated in place: a matching anchor rule leads into its body, one that
    /// does not match is passed over with its body; `anchor quick` stops after its body if a
    /// rule in it matched.
    pub fn eval(&self, pd: &PDesc, ifidx: u16, dir: SDir) -> (Option<usize>, u16) {
        self.eval_with(pd, &Context::new(ifidx, dir))
    }

    /// [`Ruleset::eval`] for a packet that carries `tag` from an earlier pass.
    pub fn eval_tagged(&self, pd: &PDesc, ifidx: u16, dir: SDir, tag: u16) -> (Option<usize>, u16) {
        self.eval_with(pd, &Context { tag, ..Context::new(ifidx, dir) })
    }

    /// Whether evaluation takes a random number (a rule has `probability`).
    pub fn wants_random(&self) -> bool {
        self.random
    }

    /// [`Ruleset::eval`] in the packet's full [`Context`].
    pub fn eval_with(&self, pd: &PDesc, at: &Context) -> (Option<usize>, u16) {
        let (last, tag) = self.walk(pd, at, &mut Acts::default());
        (last.map(|r| r.nr as usize), tag)
    }

    /// The walk itself; `acc` gathers the scrub actions of the match rules that matched.
    #[inline]
    fn walk(&self, pd: &PDesc, at: &Context, acc: &mut Acts) -> (Option<&CRule>, u16) {
        let mut w = Walked { tag: at.tag, last: None };
        self.walk_in(&self.filter, pd, at, acc, &mut w);
        (w.last, w.tag)
    }

    /// The walk over one list, through its classifier when it has one; true when evaluation
    /// stops there (`quick`).
    #[inline(always)]
    fn walk_in<'a>(&'a self, l: &'a List, pd: &PDesc, at: &Context, acc: &mut Acts, w: &mut Walked<'a>) -> bool {
        match &l.class {
            Some(c) => self.walk_classified(l, c, pd, at, acc, w),
            None => self.walk_list(l, pd, at, acc, w),
        }
    }

    /// Anchor rule `r` matched: the rulesets loaded into its anchor at run time are walked
    /// (None: none is, its body in this list is). Some(true) when evaluation stops: a `quick`
    /// rule in them matched, or the anchor is `quick` and a rule in them decided.
    #[inline(never)]
    fn walk_loaded<'a>(
        &'a self,
        r: &CRule,
        pd: &PDesc,
        at: &Context,
        acc: &mut Acts,
        w: &mut Walked<'a>,
    ) -> Option<bool> {
        let subs = self.loaded_into(r);
        if subs.is_empty() {
            return None;
        }
        let before = w.decided();
        for a in subs {
            if self.walk_in(&a.list, pd, at, acc, w) {
                return Some(true);
            }
        }
        Some(r.quick && w.decided() != before)
    }

    /// The walk over the classifier's candidates: the rules it leaves out cannot match, so
    /// testing the rest in order, with anchors entered only when their rule matched, is the
    /// walk over every rule.
    #[inline]
    fn walk_classified<'a>(
        &'a self,
        l: &'a List,
        c: &Classified,
        pd: &PDesc,
        at: &Context,
        acc: &mut Acts,
        w: &mut Walked<'a>,
    ) -> bool {
        // Plain slices and this worker's row of counters, taken once: through the Arcs,
        // every rule would reload the pointers.
        let (rules, evaluations) = (&l.rules[..], l.evaluations.row(at.worker));
        let mut cands = Candidates::new();
        c.class.candidates(pd, at.ifidx, if at.dir == SDir::In { 1 } else { 2 }, &mut cands);
        // Anchors entered: (anchor rule, end of body, quick, last match when entered).
        let mut open: Vec<(u32, u32, bool, Option<*const CRule>)> = Vec::new();
        for i in cands {
            while let Some(&(_, end, quick, before)) = open.last() {
                if i < end {
                    break;
                }
                open.pop();
                if quick && w.decided() != before {
                    return true;
                }
            }
            let p = c.parent[i as usize];
            if p != u32::MAX && open.last().is_none_or(|o| o.0 != p) {
                continue;
            }
            let i = i as usize;
            let r = &rules[i];
            evaluations.add(i);
            if self.first_mismatch(r, pd, at, w.tag).is_some() {
                continue;
            }
            if r.anchor_end != 0 {
                match self.walk_loaded(r, pd, at, acc, w) {
                    Some(true) => return true,
                    // Its body here is passed over: its rules' anchor is not open.
                    Some(false) => {}
                    None => open.push((i as u32, r.anchor_end, r.quick, w.decided())),
                }
                continue;
            }
            if matched(r, self.mark(r), w, acc) {
                return true;
            }
        }
        // Anchors still open end with the list.
        open.iter().rev().any(|&(_, _, quick, before)| quick && w.decided() != before)
    }

    /// [`Ruleset::walk`] over one list of rules (the filter's, the translation rules', an
    /// anchor's loaded at run time).
    #[inline(always)]
    fn walk_list<'a>(&'a self, l: &'a List, pd: &PDesc, at: &Context, acc: &mut Acts, w: &mut Walked<'a>) -> bool {
        // Plain slices, as in walk_classified.
        let (rules, skip, evaluations) = (&l.rules[..], &l.skip[..], l.evaluations.row(at.worker));
        let mut i = 0;
        // Quick anchors entered: (end of body, last match when entered).
        let mut quick: Vec<(usize, Option<*const CRule>)> = Vec::new();
        loop {
            if let Some(&(end, before)) = quick.last() {
                if i >= end {
                    quick.pop();
                    if w.decided() != before {
                        return true;
                    }
                    continue;
                }
            }
            if i >= rules.len() {
                return false;
            }
            let r = &rules[i];
            evaluations.add(i);
            let miss = self.first_mismatch(r, pd, at, w.tag);
            if r.anchor_end != 0 {
                match miss {
                    Some(_) => i = r.anchor_end as usize,
                    None => match self.walk_loaded(r, pd, at, acc, w) {
                        Some(true) => return true,
                        Some(false) => i = r.anchor_end as usize,
                        None => {
                            if r.quick {
                                quick.push((r.anchor_end as usize, w.decided()));
                            }
                            i += 1;
                        }
                    },
                }
                continue;
            }
            match miss {
                Some(f) if f < 8 => i = skip[i][f] as usize,
                Some(_) => i += 1,
                None => {
                    if matched(r, self.mark(r), w, acc) {
                        return true;
                    }
                    i += 1;
                }
            }
        }
    }

    /// The same evaluation without skip steps or the classifier (the property tests' model):
    /// every rule in order, an anchor's body entered when its rule matches (the rules loaded
    /// into it at run time instead, when there are some).
    pub fn eval_naive(&self, pd: &PDesc, at: &Context) -> (Option<usize>, u16) {
        let mut w = Walked { tag: at.tag, last: None };
        self.naive_body(&self.filter.rules, 0, self.filter.rules.len(), pd, at, &mut w);
        (w.last.map(|r| r.nr as usize), w.tag)
    }

    /// Rules `lo..hi` of `rules` (one ruleset); true when evaluation stops (`quick`).
    fn naive_body<'a>(
        &'a self,
        rules: &'a [CRule],
        lo: usize,
        hi: usize,
        pd: &PDesc,
        at: &Context,
        w: &mut Walked<'a>,
    ) -> bool {
        let mut i = lo;
        while i < hi {
            let r = &rules[i];
            let hit = self.first_mismatch(r, pd, at, w.tag).is_none();
            if r.anchor_end != 0 {
                let before = w.decided();
                let subs = self.loaded_into(r);
                // `anchor quick`: evaluation stops after the body if a rule in it decided.
                let stop = hit
                    && (if subs.is_empty() {
                        self.naive_body(rules, i + 1, r.anchor_end as usize, pd, at, w)
                    } else {
                        subs.iter().any(|a| self.naive_body(&a.list.rules, 0, a.list.rules.len(), pd, at, w))
                    } || r.quick && w.decided() != before);
                if stop {
                    return true;
                }
                i = r.anchor_end as usize;
                continue;
            }
            if hit && matched(r, self.mark(r), w, &mut Acts::default()) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// Rule `r` decided a packet that makes no state: it counts on its entries of the
    /// `counters` tables the rule names (a state's packets are summed from the state,
    /// [`StateCounts`]).
    #[inline(never)]
    fn count_tables(&self, r: &CRule, pd: &PDesc, dir: SDir) {
        let v = Verdict { out: dir == SDir::Out, pass: r.action == Action::Pass };
        for ((neg, t), a) in [(r.src, &pd.src), (r.dst, &pd.dst)] {
            if let AddrTest::Table(i) = t {
                self.tables[i].1.count(a, pd.af, neg, v, pd.ip_len as u64);
            }
        }
    }

    /// What sums the states of the rules naming `counters` tables into the entries (None
    /// when no rule does): a walk of the state table gives it each state.
    pub fn state_counts(&self) -> Option<StateCounts<&Ruleset>> {
        StateCounts::of(self)
    }

    /// The pf rule number of compiled rule `i` (its place in the printed ruleset).
    pub fn rule_nr(&self, i: usize) -> u32 {
        self.filter.rules[i].nr
    }

    pub fn tag_name(&self, t: u16) -> Option<&str> {
        self.tags.get(t as usize - 1).map(String::as_str)
    }
}

impl Policy for Ruleset {
    fn log_name(&self, rule: u32) -> xpf_engine::LogName {
        Ruleset::log_name(self, rule)
    }

    fn pool(&self, i: u32) -> Option<&xpf_engine::nat::Pool> {
        self.pools.get((i as usize).wrapping_sub(1))
    }

    fn pools(&self) -> &[xpf_engine::nat::Pool] {
        &self.pools
    }

    #[inline]
    fn packet_scrubs(&self) -> bool {
        self.scrubs.is_some()
    }

    fn packet_scrub(&self, pd: &PDesc, at: &Context) -> EScrub {
        let Some(l) = &self.scrubs else { return EScrub::NONE };
        let mut w = Walked { tag: at.tag, last: None };
        let mut acc = Acts { scrub: EScrub::NONE, nat: 0, rdr: 0, queue: 0 };
        self.walk_in(l, pd, at, &mut acc, &mut w);
        acc.scrub
    }

    fn translation(&self, pd: &PDesc, at: &Context) -> Option<xpf_engine::policy::Xlate> {
        if self.xlate.rules.is_empty() {
            return None;
        }
        let mut w = Walked { tag: at.tag, last: None };
        self.walk_in(&self.xlate, pd, at, &mut Acts::default(), &mut w);
        let (r, tag) = (w.last?, w.tag);
        // `no nat`: the search ends, nothing is translated.
        (r.nat != 0 || r.rdr != 0).then_some(xpf_engine::policy::Xlate {
            nat: r.nat,
            rdr: r.rdr,
            pass: r.natpass,
            // A `nat pass` state's rule is in the translation ruleset, which numbers apart:
            // pf's "no rule" (-1), so that it counts against no filter rule.
            rule: xpf_engine::policy::NO_RULE,
            tag,
            log: r.log,
        })
    }

    fn route(&self, i: u16) -> Option<&xpf_engine::RouteTarget> {
        self.routes.get((i as usize).wrapping_sub(1))
    }

    fn limits(&self, i: u32) -> Option<&RuleLimits> {
        self.limits.get((i as usize).wrapping_sub(1))
    }

    #[inline]
    fn skip(&self, ifidx: u16) -> bool {
        !self.skip_ifs.is_empty() && self.skip_ifs.contains(&ifidx)
    }

    fn evaluate(&self, pd: &PDesc, ifidx: u16, dir: SDir) -> Decision {
        self.evaluate_in(pd, &Context::new(ifidx, dir))
    }

    fn rate_exceeded(&self, meter: u32, now: u32) -> bool {
        self.marks.get(&meter).is_some_and(|m| m.over(now))
    }

    fn wants_random(&self) -> bool {
        self.random
    }

    fn evaluate_in(&self, pd: &PDesc, at: &Context) -> Decision {
        // pf_rule_to_actions: the match rules' actions as they matched, then the deciding rule's.
        let mut acts = Acts { scrub: EScrub::NONE, nat: 0, rdr: 0, queue: 0 };
        let (last, tag) = self.walk(pd, at, &mut acts);
        let mut scrub = acts.scrub;
        // A translation makes a state whatever the deciding rule says (pf_test_rule).
        let translated = |r: Option<&CRule>| {
            let nat = r.map_or(0, |r| r.nat);
            let rdr = r.map_or(0, |r| r.rdr);
            (if nat != 0 { nat } else { acts.nat }, if rdr != 0 { rdr } else { acts.rdr })
        };
        match last {
            None => {
                let (nat, rdr) = translated(None);
                let queue = acts.queue;
                // pf's default rule: no rule of the ruleset counts it.
                Decision {
                    keep_state: nat != 0 || rdr != 0,
                    tag,
                    scrub,
                    nat,
                    rdr,
                    log: 0,
                    queue,
                    rule: xpf_engine::policy::NO_RULE,
                    ..Decision::PASS
                }
            }
            Some(r) => {
                let mut rate = 0;
                if let Some(m) = self.mark(r) {
                    // The deciding `once` rule expires (one winner if workers race, as
                    // pf's atomic_cas).
                    if m.once {
                        m.expired.store(true, Ordering::Relaxed);
                    }
                    if m.meter.is_some() {
                        rate = m.id;
                    }
                }
                let (nat, rdr) = translated(Some(r));
                let keep_state = (r.keep_state || nat != 0 || rdr != 0) && r.action == Action::Pass;
                if r.counted && !keep_state {
                    self.count_tables(r, pd, at.dir);
                }
                Decision {
                    action: if r.action == Action::Block { EAction::Block } else { EAction::Pass },
                    keep_state,
                    nat,
                    rdr,
                    rule: r.nr,
                    nosync: r.nosync,
                    if_bound: r.if_bound,
                    allow_opts: r.allow_opts,
                    sloppy: r.sloppy,
                    pflow: r.pflow,
                    pickup: r.pickup,
                    limits: r.limits,
                    modulate: r.modulate,
                    synproxy: r.synproxy,
                    ret: r.ret,
                    scrub: {
                        scrub.merge(&r.scrub);
                        scrub
                    },
                    tag,
                    rate,
                    log: r.log,
                    log_all: r.log_all,
                    queue: if r.queue != 0 { r.queue } else { acts.queue },
                    route: match r.route_pool {
                        0 => r.route,
                        i => self.route_pools[i as usize - 1].next(),
                    },
                }
            }
        }
    }
}

/// A list of filter rules in force ([`Ruleset::rule_lists`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleList {
    /// Its identity while it is in force.
    pub id: usize,
    /// Its rules' lowest and highest numbers.
    pub lo: u32,
    pub hi: u32,
}

impl RuleList {
    pub fn holds(&self, nr: u32) -> bool {
        (self.lo..=self.hi).contains(&nr)
    }

    /// The list of `lists` (in order of their numbers, as [`Ruleset::rule_lists`] gives them)
    /// that holds rule `nr`.
    pub fn find(lists: &[RuleList], nr: u32) -> Option<&RuleList> {
        let i = lists.partition_point(|l| l.lo <= nr);
        i.checked_sub(1).map(|i| &lists[i]).filter(|l| l.holds(nr))
    }
}

/// Sums of the states of rules naming `counters` tables, per entry ([`Ruleset::state_counts`]):
/// a state's packets from its creator count in its direction, the replies in the other, as
/// pass, on the entries that hold the addresses its rule saw (the first packet's, before
/// translation). The states in the table now: what `-s rules -v` counts for a rule. `R` holds
/// the ruleset: a borrow, or an `Arc` for a walk that goes a slice at a time.
pub struct StateCounts<R: std::ops::Deref<Target = Ruleset>> {
    rs: R,
    rules: HashMap<u32, [(bool, AddrTest); 2]>,
    /// By (table index, entry address, prefix length): packets and bytes by [`Verdict::slot`].
    sums: HashMap<(usize, IpAddr, u8), [[u64; 2]; 4]>,
}

impl<R: std::ops::Deref<Target = Ruleset>> StateCounts<R> {
    /// The sums for ruleset `rs` (None when no rule names a `counters` table).
    pub fn of(rs: R) -> Option<StateCounts<R>> {
        let loaded = rs.anchors.loaded.values().map(|a| &a.list);
        let rules: HashMap<u32, [(bool, AddrTest); 2]> = std::iter::once(&rs.filter)
            .chain(loaded)
            .flat_map(|l| l.rules.iter())
            .filter(|r| r.counted)
            .map(|r| (r.nr, [r.src, r.dst]))
            .collect();
        (!rules.is_empty()).then(|| StateCounts { rs, rules, sums: HashMap::new() })
    }

    /// The sums by (table name, entry address, prefix length): packets and bytes by
    /// [`Verdict::slot`].
    pub fn sums(self) -> EntrySums {
        let names = &self.rs.tables;
        self.sums.into_iter().map(|((i, a, l), v)| ((names[i].0.clone(), a, l), v)).collect()
    }

    /// Every state of table `t`.
    pub fn walk<K: xpf_state::Key>(&mut self, t: &xpf_state::StateTable<K>) {
        for (id, s) in t.iter() {
            self.state(t, id, s);
        }
    }

    /// State `id` (`s`) of table `t`.
    pub fn state<K: xpf_state::Key>(&mut self, t: &xpf_state::StateTable<K>, id: u32, s: &xpf_state::State<K>) {
        // The addresses its rule saw: coming in, the wire's; going out, the stack's
        // (before translation). A key holds them as an inbound packet has them.
        let out = s.flags & xpf_state::sf::OUT != 0;
        let k = if out { t.stack_key(id).unwrap_or(s.key) } else { s.key };
        let (a0, a1) = (k.addr(0), k.addr(1));
        let sd = if out { [&a1, &a0] } else { [&a0, &a1] };
        self.add(t.meta(id).rule, k.af(), sd, out, s.packets, s.bytes);
    }

    /// A state of rule `rule` (family `af`) whose first packet went from `src` to `dst`
    /// going out (`out`) or in; `packets` and `bytes` from the creator and towards it.
    fn add(&mut self, rule: u32, af: u8, [src, dst]: [&Addr; 2], out: bool, packets: [u32; 2], bytes: [u64; 2]) {
        let Some(sides) = self.rules.get(&rule) else { return };
        for ((neg, t), a) in sides.iter().zip([src, dst]) {
            let AddrTest::Table(i) = *t else { continue };
            let Some((_, len)) = self.rs.tables[i].1.counting_entry(a, af, *neg) else { continue };
            let sum = self.sums.entry((i, masked_addr(a.to_ip(af), len), len)).or_default();
            for (k, v) in [Verdict { out, pass: true }, Verdict { out: !out, pass: true }].into_iter().enumerate() {
                sum[v.slot()][0] += packets[k] as u64;
                sum[v.slot()][1] += bytes[k];
            }
        }
    }
}

/// What the matching `match` rules leave the deciding rule: scrub actions, translations.
#[derive(Debug, Default)]
struct Acts {
    scrub: EScrub,
    nat: u32,
    rdr: u32,
    queue: u32,
}

/// Where a walk stands: the packet's tag, and the deciding rule so far.
struct Walked<'a> {
    tag: u16,
    last: Option<&'a CRule>,
}

impl Walked<'_> {
    /// The deciding rule's identity, to tell later whether a rule decided since.
    #[inline(always)]
    fn decided(&self) -> Option<*const CRule> {
        self.last.map(|x| x as *const CRule)
    }
}

/// What a matching rule does: set its tag, become the deciding rule unless it is a `match`
/// rule; true when it is `quick` (evaluation stops).
#[inline(always)]
fn matched<'a>(r: &'a CRule, mark: Option<&Arc<Mark>>, w: &mut Walked<'a>, acc: &mut Acts) -> bool {
    if let Some(t) = r.tag {
        w.tag = t;
    }
    if r.action != Action::Match {
        w.last = Some(r);
    } else {
        acc.scrub.merge(&r.scrub);
        if r.nat != 0 {
            acc.nat = r.nat;
        }
        if r.rdr != 0 {
            acc.rdr = r.rdr;
        }
        if r.queue != 0 {
            acc.queue = r.queue;
        }
        if let Some(m) = mark.filter(|m| m.once) {
            m.expired.store(true, Ordering::Relaxed);
        }
    }
    r.quick
}

/// pf's `r->prob` for `probability P%`: the share of u32::MAX a draw may not exceed; never 0,
/// which means "no probability" (a 0% rule still takes a draw, and matches one in 2^32).
fn prob_threshold(percent: f64) -> u32 {
    (((percent / 100.0).clamp(0.0, 1.0) * u32::MAX as f64) as u32).max(1)
}

/// A packet's draw for rule `nr` from its random number: each rule gets its own (a packet
/// meeting two `probability` rules draws twice, as in pf), and the same one whichever rules
/// skip steps passed over.
#[inline]
fn draw(rnd: u32, nr: u32) -> u32 {
    let mut z = ((rnd as u64) << 32 | nr as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

#[inline]
fn port_match(op: PortOp, p: u16) -> bool {
    match op {
        PortOp::Eq(a) => p == a,
        PortOp::Ne(a) => p != a,
        PortOp::Lt(a) => p < a,
        PortOp::Le(a) => p <= a,
        PortOp::Gt(a) => p > a,
        PortOp::Ge(a) => p >= a,
        PortOp::Range(a, b) => (a..=b).contains(&p),
        PortOp::Inside(a, b) => p > a && p < b,
        PortOp::Outside(a, b) => p < a || p > b,
    }
}

/// pf_calc_skip_steps: for each rule and field, the next rule whose field differs.
fn skip_steps(rules: &[CRule]) -> Vec<[u32; 8]> {
    let n = rules.len();
    let mut skip = vec![[n as u32; 8]; n];
    // Skip steps stay inside one ruleset: they never run into or over an anchor, nor out of one.
    let same = |a: &CRule, b: &CRule, f: usize| -> bool {
        if a.anchor_end != 0 || b.anchor_end != 0 || a.depth != b.depth {
            return false;
        }
        match f {
            SKIP_IF => a.on == b.on,
            SKIP_DIR => a.dir == b.dir,
            SKIP_AF => a.af == b.af,
            SKIP_PROTO => a.proto == b.proto,
            SKIP_SRC => a.src == b.src,
            SKIP_SPORT => a.src_port == b.src_port,
            SKIP_DST => a.dst == b.dst,
            _ => a.dst_port == b.dst_port,
        }
    };
    for f in 0..8 {
        let mut head = 0;
        for i in 1..=n {
            if i == n || !same(&rules[head], &rules[i], f) {
                for s in skip.iter_mut().take(i).skip(head) {
                    s[f] = i as u32;
                }
                head = i;
            }
        }
    }
    skip
}
