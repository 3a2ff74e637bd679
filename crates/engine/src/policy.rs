//! What the engine asks the ruleset on a state miss. The pf.conf compiler (issue 3) implements
//! [`Policy`]; the simple policies here serve the benches and tests until then.

use xpf_state::{Dir, RuleLimits};
use xpf_wire::PDesc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pass,
    Block,
}

/// The ruleset's answer for a packet that matched no state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// `keep state` (pf's default for pass rules).
    pub keep_state: bool,
    /// The deciding rule's number.
    pub rule: u32,
    /// `no-sync`.
    pub nosync: bool,
    /// `if-bound`: the state only matches on this interface.
    pub if_bound: bool,
    /// `allow-opts`: packets with IP options pass (pf drops them otherwise, as `ip-option`).
    pub allow_opts: bool,
    /// `sloppy`: TCP tracked by its flags only, without sequence windows.
    pub sloppy: bool,
    /// The rule lets any TCP segment make a state (`flags any`), not only a SYN: a stream
    /// picked up in the middle.
    pub pickup: bool,
    /// The rule's limits ([`Policy::limits`]), 0 for none.
    pub limits: u32,
    /// `modulate state`: the TCP initial sequence numbers are replaced by random ones.
    pub modulate: bool,
    /// `synproxy state`: the filter completes the client's handshake first.
    pub synproxy: bool,
    /// For a block: what is sent back (`block return`, `return-rst`, `return-icmp`).
    pub ret: Return,
    /// The `scrub (...)` actions of the matching match rules and the deciding rule.
    pub scrub: Scrub,
    /// The tag the packet carries after the ruleset (the last `tag` of a matching rule, else
    /// the one it came in with), kept in the state it makes.
    pub tag: u16,
    /// The deciding rule's `max-pkt-rate` meter ([`Policy::rate_exceeded`]), 0 for none;
    /// kept in the state it makes.
    pub rate: u32,
    /// The translation pools ([`Policy::pool`]) for the source (`nat-to`) and the
    /// destination (`rdr-to`), 0 for none: the last matching rule's that has one, the
    /// deciding rule's first (pf applies a match rule's translation unless a later one
    /// replaces it).
    pub nat: u32,
    pub rdr: u32,
    /// `log` on the deciding rule: the pflog unit + 1 (`log (to pflogN)`, pflog0 by
    /// default); 0 for none.
    pub log: u8,
    /// `pflow` (or `set state-defaults pflow`): the state's flow is exported.
    pub pflow: bool,
    /// `log (all)`: every packet of the state it makes goes to pflog (unit `log`), not only
    /// the first.
    pub log_all: bool,
    /// `set queue (q, ack)`: the queue ids, `q | ack << 16`, of the last matching rule that
    /// sets one, the deciding rule's first (0: none); kept in the state it makes.
    pub queue: u32,
    /// `route-to` / `reply-to` on the deciding rule: its target ([`Policy::route`]), 0 for
    /// none; kept in the state it makes.
    pub route: u16,
}

/// pf's "no rule" (`-1`): the rule number of a decision no filter rule made (pf's default
/// rule, a `nat pass` translation's); it counts against no rule.
pub const NO_RULE: u32 = u32::MAX;

impl Decision {
    /// `pass` with pf's defaults (keep state, no options allowed).
    pub const PASS: Decision = Decision {
        action: Action::Pass,
        keep_state: true,
        rule: 0,
        nosync: false,
        if_bound: false,
        allow_opts: false,
        sloppy: false,
        pickup: false,
        limits: 0,
        modulate: false,
        synproxy: false,
        ret: Return::DROP,
        scrub: Scrub::NONE,
        tag: 0,
        rate: 0,
        nat: 0,
        rdr: 0,
        log: 0,
        pflow: false,
        log_all: false,
        queue: 0,
        route: 0,
    };
    /// `block` (drop).
    pub const BLOCK: Decision = Decision { action: Action::Block, keep_state: false, ..Decision::PASS };
}

/// pf's return options of a block rule (`return_icmp`, `return_icmp6`, `return_ttl`, and the
/// RST flag): what [`crate::reply::build`] sends back for a blocked packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Return {
    /// TCP gets a RST.
    pub rst: bool,
    /// The RST's TTL (0: pf's default, 64).
    pub ttl: u8,
    /// ICMP unreachable code for IPv4 (non-TCP, or TCP without `rst`); None: nothing.
    pub icmp4: Option<u8>,
    /// ICMPv6 destination unreachable code.
    pub icmp6: Option<u8>,
}

impl Return {
    pub const DROP: Return = Return { rst: false, ttl: 0, icmp4: None, icmp6: None };
    pub fn is_drop(&self) -> bool {
        *self == Return::DROP
    }
}

pub use xpf_state::Scrub;

/// Where and when a packet is judged: what rules test besides its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// The interface of this pass.
    pub ifidx: u16,
    pub dir: Dir,
    /// The interface the packet came in on (`received-on`): this pass's for `in`, the `in`
    /// pass's for a forwarded packet's `out`, 0 for the host's own packets.
    pub rcvif: u16,
    /// The tag the packet carries from an earlier pass (pf's mbuf tag: `tagged` rules see
    /// it, `tag` rules replace it).
    pub tag: u16,
    /// A random number the worker drew for this packet when [`Policy::wants_random`] says
    /// the ruleset needs one (`probability`), else 0.
    pub rnd: u32,
    /// The worker's clock, in seconds (`max-pkt-rate`).
    pub now: u32,
    /// The worker's index (its own row of the rules' evaluation counters).
    pub worker: u16,
}

impl Context {
    /// A packet with no tag, no draw, at time 0, on worker 0; received on `ifidx` when it
    /// comes in.
    pub fn new(ifidx: u16, dir: Dir) -> Context {
        Context { ifidx, dir, rcvif: if dir == Dir::In { ifidx } else { 0 }, tag: 0, rnd: 0, now: 0, worker: 0 }
    }
}

/// A translation rule's answer for a new flow (FreeBSD's `nat`, `rdr`, `binat`, which come
/// before the filter rules): the pools to translate with, whether the translated packet skips
/// the filter rules (`pass`), the rule's number and the packet's tag after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xlate {
    pub nat: u32,
    pub rdr: u32,
    pub pass: bool,
    pub rule: u32,
    pub tag: u16,
    /// `nat pass log`: as [`Decision::log`].
    pub log: u8,
}

/// How pf names a rule in its log (pflog's rulenr, subrulenr and ruleset): a rule of the main
/// ruleset by its number there; a rule in an anchor by the number of the main ruleset's anchor
/// rule that led there, its own number in the anchor, and the anchor's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogName {
    pub rulenr: u32,
    pub subrulenr: Option<u32>,
    /// The anchor's path, NUL-padded, at most 15 bytes kept (pf's field).
    pub ruleset: [u8; 16],
}

impl LogName {
    /// Rule `nr` of the main ruleset.
    pub fn main(nr: u32) -> LogName {
        LogName { rulenr: nr, subrulenr: None, ruleset: [0; 16] }
    }

    /// Rule `sub` of the anchor at `path`, reached through the main ruleset's anchor rule
    /// `rulenr` (the path cut to 15 bytes, as pf's field).
    pub fn in_anchor(rulenr: u32, sub: u32, path: &str) -> LogName {
        let mut ruleset = [0u8; 16];
        let n = path.len().min(15);
        ruleset[..n].copy_from_slice(&path.as_bytes()[..n]);
        LogName { rulenr, subrulenr: Some(sub), ruleset }
    }
}

pub trait Policy {
    fn evaluate(&self, pd: &PDesc, ifidx: u16, dir: Dir) -> Decision;

    /// How pflog names rule `rule` (a `Decision::rule`).
    fn log_name(&self, rule: u32) -> LogName {
        LogName::main(rule)
    }
    /// [`Policy::evaluate`] with the packet's [`Context`]. A policy without tags keeps the
    /// packet's.
    fn evaluate_in(&self, pd: &PDesc, at: &Context) -> Decision {
        Decision { tag: at.tag, ..self.evaluate(pd, at.ifidx, at.dir) }
    }
    /// A packet of a state made by a rule with `max-pkt-rate`, in the state's first
    /// direction, counted at `now` against the rule's meter `meter` (`Decision::rate`); true
    /// when the rate is over the limit (the packet is dropped, as pf_find_state does).
    fn rate_exceeded(&self, _meter: u32, _now: u32) -> bool {
        false
    }
    /// Whether evaluation takes a random number (a rule with `probability`).
    fn wants_random(&self) -> bool {
        false
    }
    /// Whether FreeBSD scrub rules with options that act on packets are loaded
    /// ([`Policy::packet_scrub`]); read once a batch.
    fn packet_scrubs(&self) -> bool {
        false
    }
    /// FreeBSD's scrub rules (pf_normalize_ip, pf_normalize_tcp): the options of the first
    /// one that matches the packet (none: [`Scrub::NONE`]), for every packet, a state's or not.
    fn packet_scrub(&self, _pd: &PDesc, _at: &Context) -> crate::Scrub {
        crate::Scrub::NONE
    }
    /// Translation pool `i` (a [`Decision`]'s `nat` or `rdr`).
    fn pool(&self, _i: u32) -> Option<&crate::nat::Pool> {
        None
    }
    /// Every translation pool (pool `i` is `pools()[i - 1]`).
    fn pools(&self) -> &[crate::nat::Pool] {
        &[]
    }
    /// The translation rules' answer for a new flow, before the filter rules see it (which
    /// then see it translated); None when none matches or a `no` rule does.
    fn translation(&self, _pd: &PDesc, _at: &Context) -> Option<Xlate> {
        None
    }
    /// The limits a decision names (`Decision::limits` != 0).
    fn limits(&self, _i: u32) -> Option<&RuleLimits> {
        None
    }
    /// `set skip on`: the filter does not look at packets on this interface.
    fn skip(&self, _ifidx: u16) -> bool {
        false
    }
    /// Routing target `i` (a [`Decision`]'s `route`, numbered from 1).
    fn route(&self, _i: u16) -> Option<&RouteTarget> {
        None
    }
}

/// Where a rule's `route-to` or `reply-to` sends the packets it applies to (pf's `rt`,
/// `rt_kif` and `rt_addr`): `route-to`, a state's packets in its rule's direction; `reply-to`,
/// those the other way. The engine says which packets go there (`Batch::routes`); the
/// caller routes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTarget {
    pub reply: bool,
    /// The interface to leave by (0: the one the kernel's route to `addr` leaves by).
    pub ifidx: u16,
    /// The next hop (of family `af`).
    pub af: u8,
    pub addr: xpf_wire::Addr,
}

/// `pass all` (keep state implied), the lab's ruleset.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassAll;

impl Policy for PassAll {
    #[inline]
    fn evaluate(&self, _: &PDesc, _: u16, _: Dir) -> Decision {
        Decision::PASS
    }
}

/// `block all`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockAll;

impl Policy for BlockAll {
    fn evaluate(&self, _: &PDesc, _: u16, _: Dir) -> Decision {
        Decision::BLOCK
    }
}

/// Any closure is a policy (tests).
impl<F: Fn(&PDesc, u16, Dir) -> Decision> Policy for F {
    fn evaluate(&self, pd: &PDesc, ifidx: u16, dir: Dir) -> Decision {
        self(pd, ifidx, dir)
    }
}
