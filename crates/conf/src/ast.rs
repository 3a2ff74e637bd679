//! The rules as pfctl prints them: one `Rule` per expanded combination.

use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pass,
    Block,
    Match,
}

/// What `block` does (pf's `block drop` default, or `set block-policy return`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Return {
    Drop,
    /// `return`: RST for TCP, ICMP unreachable otherwise.
    Return,
    Rst {
        ttl: Option<u8>,
    },
    /// ICMP unreachable codes for IPv4 and IPv6 (`return-icmp`, `return-icmp6`); pf's default
    /// is port unreachable.
    Icmp {
        v4: Option<u8>,
        v6: Option<u8>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Both,
    In,
    Out,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    pub all: bool,
    pub matches: bool,
    pub user: bool,
    pub to: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub neg: bool,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Af {
    Any,
    Inet,
    Inet6,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKind {
    Any,
    NoRoute,
    UrpfFailed,
    /// `route "label"`: the addresses OpenBSD's routes with this label lead to.
    RouteLabel(String),
    SelfAddr,
    /// An address and prefix length (host bits cleared).
    Net(IpAddr, u8),
    /// `a - b`
    Range(IpAddr, IpAddr),
    Table(String),
    /// `(ifname[:mod])[/prefix]`: the interface's addresses, followed as they change.
    Dynamic {
        ifname: String,
        modifier: Option<String>,
        prefix: Option<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub neg: bool,
    pub kind: HostKind,
}

impl Host {
    pub const ANY: Host = Host { neg: false, kind: HostKind::Any };
    /// The family an address pins, if any.
    pub fn af(&self) -> Af {
        match &self.kind {
            HostKind::Net(a, _) | HostKind::Range(a, _) => {
                if a.is_ipv4() {
                    Af::Inet
                } else {
                    Af::Inet6
                }
            }
            _ => Af::Any,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortOp {
    Eq(u16),
    Ne(u16),
    Lt(u16),
    Le(u16),
    Gt(u16),
    Ge(u16),
    /// `a:b`, inclusive.
    Range(u16, u16),
    /// `a >< b`, exclusive.
    Inside(u16, u16),
    /// `a <> b`
    Outside(u16, u16),
}

/// TCP flags `check/mask` as bits (F S R P A U E W = 1 2 4 8 16 32 64 128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flags {
    Any,
    Set { bits: u8, mask: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    No,
    Keep,
    Modulate,
    Synproxy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub action: Action,
    pub ret: Return,
    pub dir: Dir,
    pub log: Option<Log>,
    pub quick: bool,
    pub on: Option<Iface>,
    pub af: Af,
    pub proto: Option<u8>,
    pub src: Host,
    pub src_port: Option<PortOp>,
    pub dst: Host,
    pub dst_port: Option<PortOp>,
    pub flags: Option<Flags>,
    /// (type, code), ICMP or ICMPv6 by `af`/`proto`.
    pub icmp: Option<(u8, Option<u8>)>,
    pub icmp6: bool,
    pub tos: Option<u8>,
    pub state: StateKind,
    /// Explicit `keep state`: printed even without options.
    pub state_explicit: bool,
    pub allow_opts: bool,
    /// `fragment`: the rule matches only fragments that were not reassembled (pf's
    /// PFRULE_FRAGMENT), and keeps no state for them.
    pub fragment: bool,
    pub label: Option<String>,
    pub tag: Option<String>,
    pub tagged: Option<(bool, String)>,
    pub state_opts: StateOptsBox,
    pub user: Option<PortOp>,
    pub group: Option<PortOp>,
    /// Boxed, as the other rare parts below: a rule is small unless it has them (a
    /// 1.6M-rule ruleset parses into rules, not into room for pools).
    pub nat: Option<Box<Pool>>,
    pub rdr: Option<Box<Pool>>,
    pub binat: Option<Box<Pool>>,
    pub scrub: Option<Scrub>,
    pub divert: Option<Divert>,
    pub rtable: Option<u32>,
    /// `af-to inet|inet6 from ADDR [to ADDR]`: translation to the other family.
    pub af_to: Option<Box<(Af, Host, Option<Host>)>>,
    /// Nesting depth inside inline anchors (0 = the main ruleset).
    pub depth: u8,
    /// An anchor rule whose body (the rules of depth + 1 after it) follows inline.
    pub opens: bool,
    /// `route-to`, `reply-to`, `dup-to` and the pool.
    pub route: Option<Box<(RouteKind, Pool)>>,
    /// `set (prio a[, b])`, `set (queue a[, b])`, `set tos`.
    pub set_prio: Option<(u8, u8)>,
    pub set_queue: Option<Box<(String, Option<String>)>>,
    pub set_tos: Option<u8>,
    /// `probability`, in percent.
    pub probability: Option<f64>,
    /// `[!] received-on IFACE`: the interface the packet came in on (an `out` pass of
    /// forwarded traffic included).
    pub received_on: Option<Box<Iface>>,
    /// `once`: the rule expires at its first match.
    pub once: bool,
    /// `max-pkt-rate N/S`: the rule (and its states, in their first direction) stops
    /// matching above N packets in S seconds.
    pub max_pkt_rate: Option<(u32, u32)>,
    /// `anchor "name"` rules: the name (empty for an unnamed inline anchor).
    pub anchor: Option<String>,
    /// A translation rule of FreeBSD's dialect (`nat`, `rdr`, `binat`, their `no` forms and
    /// `-anchor`s): evaluated before the filter rules, first match wins.
    pub xlate: Option<Xlate>,
    /// The line of pf.conf it came from.
    pub line: u32,
    /// The file it came from (the main file or an included one).
    pub file: std::sync::Arc<str>,
}

/// What a FreeBSD-dialect translation rule is: `[no] nat|rdr|binat [pass]`. Its pool is the
/// rule's `nat` (nat), `rdr` (rdr) or `binat` (binat, whose `nat` is then the out half's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xlate {
    pub kind: XlateKind,
    /// `no nat`: a match stops the search and translates nothing.
    pub no: bool,
    /// `nat pass`: the translated packet passes without the filter rules (and makes a state).
    pub pass: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XlateKind {
    Nat,
    Rdr,
    Binat,
}

impl XlateKind {
    pub fn word(self) -> &'static str {
        match self {
            XlateKind::Nat => "nat",
            XlateKind::Rdr => "rdr",
            XlateKind::Binat => "binat",
        }
    }
}

/// A translation target (`nat-to`, `rdr-to`, `binat-to`) and its pool options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub host: Host,
    /// (low, high); None is the default (nat-to: 50001:65535; rdr-to: unchanged).
    pub port: Option<(u16, u16)>,
    pub kind: PoolKind,
    pub sticky: bool,
    pub static_port: bool,
    /// FreeBSD's `endpoint-independent`: a UDP source keeps its translated address and port
    /// towards every destination (RFC 4787 REQ-1).
    pub endpoint_independent: bool,
    /// FreeBSD's `map-e-portset OFFSET/LEN/PSID`: the source ports are that MAP-E port set
    /// (RFC 7597), as (offset, psid length, psid).
    pub mape: Option<(u8, u8, u16)>,
    /// A list of targets, before it becomes an automatic table.
    pub list: Option<Vec<Host>>,
    /// FreeBSD's routing targets `(IF ADDR)` or `{ (IF ADDR), ... }`: each the interface a
    /// packet leaves by and the next hop on it (`host` is the first next hop). Empty for
    /// OpenBSD's next hops, which are addresses.
    pub hops: Vec<(String, Host)>,
}

impl Pool {
    /// `host` as a pool with no options: pf's defaults (nat-to's ports, rdr-to's port kept).
    pub fn to(host: Host) -> Pool {
        Pool {
            host,
            port: None,
            kind: PoolKind::None,
            sticky: false,
            static_port: false,
            endpoint_independent: false,
            mape: None,
            list: None,
            hops: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolKind {
    None,
    Bitmask,
    Random,
    RoundRobin,
    LeastStates,
    /// The key as pfctl prints it (0x + 32 hex digits), or None for a random one.
    SourceHash(Option<String>),
}

/// `keep state (...)` options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateOpts {
    pub max: Option<u32>,
    pub no_sync: bool,
    pub pflow: bool,
    /// Some(true) `source-track rule`, Some(false) `source-track global`.
    pub source_track: Option<bool>,
    pub max_src_states: Option<u32>,
    pub max_src_conn: Option<u32>,
    pub max_src_conn_rate: Option<(u32, u32)>,
    pub max_src_nodes: Option<u32>,
    /// (table, flush, global)
    pub overload: Option<(String, bool, bool)>,
    pub if_bound: bool,
    pub floating: bool,
    pub sloppy: bool,
    pub timeouts: Vec<(xpf_state::Timeout, u32)>,
}

impl StateOpts {
    pub fn is_empty(&self) -> bool {
        *self == NO_STATE_OPTS
    }
}

static NO_STATE_OPTS: StateOpts = StateOpts {
    max: None,
    no_sync: false,
    pflow: false,
    source_track: None,
    max_src_states: None,
    max_src_conn: None,
    max_src_conn_rate: None,
    max_src_nodes: None,
    overload: None,
    if_bound: false,
    floating: false,
    sloppy: false,
    timeouts: Vec::new(),
};

/// A rule's `keep state (...)` options, kept out of line: most rules give none, and a
/// 1.6M-rule ruleset held 112 bytes a rule for them. Reads as the options (pf's defaults when
/// none were given); writing to them allocates them.
#[derive(Clone, Default)]
pub struct StateOptsBox(Option<Box<StateOpts>>);

impl std::ops::Deref for StateOptsBox {
    type Target = StateOpts;
    fn deref(&self) -> &StateOpts {
        self.0.as_deref().unwrap_or(&NO_STATE_OPTS)
    }
}

impl std::ops::DerefMut for StateOptsBox {
    fn deref_mut(&mut self) -> &mut StateOpts {
        self.0.get_or_insert_with(Default::default)
    }
}

impl PartialEq for StateOptsBox {
    fn eq(&self, o: &StateOptsBox) -> bool {
        **self == **o
    }
}

impl Eq for StateOptsBox {}

impl std::fmt::Debug for StateOptsBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// `scrub (...)` options of a match or pass rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrub {
    pub no_df: bool,
    pub random_id: bool,
    pub min_ttl: Option<u8>,
    pub set_tos: Option<u8>,
    pub max_mss: Option<u16>,
    pub reassemble_tcp: bool,
}

/// A queue (`queue NAME on IF | parent P ...`): HFSC bandwidth and/or FQ-CoDel flows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    pub name: String,
    pub on: Option<String>,
    pub parent: Option<String>,
    /// Bits per second, or a percentage of the parent (`50%`).
    pub bandwidth: Option<Bandwidth>,
    pub min: Option<Bandwidth>,
    pub max: Option<Bandwidth>,
    /// `burst M for T ms` after `min`, `bandwidth` and `max`, in that order.
    pub burst: [Option<(Bandwidth, u32)>; 3],
    pub flows: Option<u32>,
    pub quantum: Option<u32>,
    pub qlimit: Option<u32>,
    pub default: bool,
    pub line: u32,
    pub file: std::sync::Arc<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bandwidth {
    Bits(u64),
    Percent(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Divert {
    To(IpAddr, u16),
    Reply,
    Packet(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    RouteTo,
    ReplyTo,
    DupTo,
}
