//! xpf-state: pf's state table for one worker.
//!
//! [`StateTable`] holds states keyed by [`Key4`] or [`Key6`] (pf's `pf_state_key`, oriented by
//! direction), each with a wire-side key and, under NAT, a stack-side key that finds it too.
//! Guarantees: capacity comes from `set limit states`, and the index is sized from it; raising
//! the limit resizes the index online; no allocation and no lock per packet on the lookup
//! path ([`StateTable::lookup_batch`], [`StateTable::touch`]); expiry by a wheel
//! ([`wheel`]) that never scans the table; every insert, update and delete is offered as an
//! [`Event`] to a bounded queue, updates collapsed per state.
//!
//! The table is owned by one worker thread (it is `Send`, not shared); docs/state-table.md
//! gives the measurements behind per-worker tables over one shared table.

pub mod event;
pub mod fixtures;
pub mod flow;
pub mod index;
pub mod key;
pub mod region;
pub mod table;
pub mod tally;
pub mod timeout;
pub mod track;
pub mod wheel;

pub use event::{Event, EventKind};
pub use flow::{Flow, FlowEvent, FlowLog};
pub use key::{os_random, Dir, Key, Key4, Key6, Seed};
pub use table::{
    auto_rows, half_open, held, sf, Actions, Config, Counters, InsertError, Memory, Meta, NatGone, NewState, Peer,
    State, StateActions, StateTable, ID_MASK, NONE, STACK,
};
pub use tally::{RuleCount, RuleCounts, RuleTally};
pub use timeout::{Timeout, Timeouts};
pub use track::{LimitCounters, Overload, Refusal, RuleLimits, Tracking};

/// pf's scrub actions on match and pass rules (`scrub (no-df random-id min-ttl N max-mss N
/// set-tos T)`), kept in the state and applied to every packet of it, as pf_scrub and
/// pf_normalize_mss apply them (the engine's `proto::apply_scrub`); the state table keeps
/// them packed ([`Scrub::pack`]), and sync carries them (pfsync's min_ttl, set_tos, max_mss
/// and state_flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scrub {
    /// Clear IPv4's don't-fragment bit.
    pub no_df: bool,
    /// A random IPv4 identification on unfragmented packets ([`Scrub::id`] is the number).
    pub random_id: bool,
    /// Raise the TTL / hop limit to at least this (0: no).
    pub min_ttl: u8,
    /// Set the TOS / traffic class (ECN bits kept).
    pub set_tos: Option<u8>,
    /// Lower a TCP SYN's MSS option to at most this (0: no).
    pub max_mss: u16,
    /// The random identification for this packet (drawn by the worker).
    pub id: u16,
    /// This packet's TCP header cleaned as pf_normalize_tcp cleans it (FIN taken off a SYN,
    /// the reserved bits and an urgent pointer without URG zeroed): set per packet by the
    /// worker, never a rule's or a state's (not packed).
    pub tcp_clean: bool,
}

impl Scrub {
    pub const NONE: Scrub =
        Scrub { no_df: false, random_id: false, min_ttl: 0, set_tos: None, max_mss: 0, id: 0, tcp_clean: false };

    pub fn is_none(&self) -> bool {
        Scrub { id: 0, ..*self } == Scrub::NONE
    }

    /// What a later matching rule adds (pf_rule_to_actions: flags add up, values replace).
    pub fn merge(&mut self, o: &Scrub) {
        self.no_df |= o.no_df;
        self.random_id |= o.random_id;
        self.tcp_clean |= o.tcp_clean;
        if o.min_ttl != 0 {
            self.min_ttl = o.min_ttl;
        }
        if o.set_tos.is_some() {
            self.set_tos = o.set_tos;
        }
        if o.max_mss != 0 {
            self.max_mss = o.max_mss;
        }
    }

    /// Both applied in turn, this first (a FreeBSD scrub rule's, pf_normalize_ip, then a
    /// state's, pf_scrub): flags add up, the higher TTL and the lower MSS stand, the later TOS.
    pub fn then(&self, later: &Scrub) -> Scrub {
        let nz = |a: u16, b: u16| if a == 0 || b == 0 { a.max(b) } else { a.min(b) };
        Scrub {
            no_df: self.no_df | later.no_df,
            random_id: self.random_id | later.random_id,
            min_ttl: self.min_ttl.max(later.min_ttl),
            set_tos: later.set_tos.or(self.set_tos),
            max_mss: nz(self.max_mss, later.max_mss),
            id: self.id,
            tcp_clean: self.tcp_clean | later.tcp_clean,
        }
    }

    /// Packed for the state's side record (0: none).
    pub fn pack(&self) -> u64 {
        if (Scrub { tcp_clean: false, ..*self }).is_none() {
            return 0;
        }
        1 | (self.no_df as u64) << 1
            | (self.random_id as u64) << 2
            | (self.set_tos.is_some() as u64) << 3
            | (self.min_ttl as u64) << 8
            | (self.set_tos.unwrap_or(0) as u64) << 16
            | (self.max_mss as u64) << 24
    }

    pub fn unpack(v: u64) -> Scrub {
        if v == 0 {
            return Scrub::NONE;
        }
        Scrub {
            no_df: v & 2 != 0,
            random_id: v & 4 != 0,
            min_ttl: (v >> 8) as u8,
            set_tos: (v & 8 != 0).then_some((v >> 16) as u8),
            max_mss: (v >> 24) as u16,
            id: 0,
            tcp_clean: false,
        }
    }
}
