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
pub mod index;
pub mod key;
pub mod region;
pub mod table;
pub mod timeout;
pub mod track;
pub mod wheel;

pub use event::{Event, EventKind};
pub use key::{os_random, Dir, Key, Key4, Key6, Seed};
pub use table::{
    auto_rows, half_open, sf, Actions, Config, Counters, InsertError, Memory, NewState, Peer, State, StateTable,
    ID_MASK, NONE, STACK,
};
pub use timeout::{Timeout, Timeouts};
pub use track::{LimitCounters, Overload, Refusal, RuleLimits, Tracking};
