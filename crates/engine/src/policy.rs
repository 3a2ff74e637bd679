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
    /// For a block: what is sent back (`block return`, `return-rst`, `return-icmp`).
    pub ret: Return,
    /// The tag the packet carries after the ruleset (the last `tag` of a matching rule, else
    /// the one it came in with), kept in the state it makes.
    pub tag: u16,
}

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
        ret: Return::DROP,
        tag: 0,
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

pub trait Policy {
    fn evaluate(&self, pd: &PDesc, ifidx: u16, dir: Dir) -> Decision;
    /// [`Policy::evaluate`] for a packet that carries `tag` from an earlier pass (pf's mbuf
    /// tag: `tagged` rules see it, `tag` rules replace it). A policy without tags keeps it.
    /// `rnd` is a random number the worker drew for this packet when [`Policy::wants_random`]
    /// says the ruleset needs one (`probability`), else 0.
    fn evaluate_tagged(&self, pd: &PDesc, ifidx: u16, dir: Dir, tag: u16, rnd: u32) -> Decision {
        let _ = rnd;
        Decision { tag, ..self.evaluate(pd, ifidx, dir) }
    }
    /// Whether evaluation takes a random number (a rule with `probability`).
    fn wants_random(&self) -> bool {
        false
    }
    /// The limits a decision names (`Decision::limits` != 0).
    fn limits(&self, _i: u32) -> Option<&RuleLimits> {
        None
    }
    /// `set skip on`: the filter does not look at packets on this interface.
    fn skip(&self, _ifidx: u16) -> bool {
        false
    }
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
