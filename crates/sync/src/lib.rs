//! State sync in pfsync's wire format: FreeBSD 14's message version 1400, so that a FreeBSD
//! pf box can be a peer (docs/sync.md).
//!
//! - [`wire`]: the messages as typed records over bytes, and the handler table by action;
//! - [`frame`]: frames built from records, and checked whole on receipt;
//! - [`auth`]: the optional MAC and anti-replay trailer (an xpf extension, off by default);
//! - [`endpoint`]: the protocol core of one firewall, without I/O or clock: receive checks,
//!   counters, the bulk-update state machines;
//! - [`replica`]: one worker's side: its tables' events to frames, received records applied.
//!
//! Nothing here reads a clock or touches a socket; xpfd's sync thread and workers do, and the
//! tests drive two firewalls through a simulated link.

pub mod auth;
pub mod endpoint;
pub mod frame;
pub mod replica;
pub mod wire;

pub use endpoint::{BulkIn, BulkOut, Config, Endpoint, Stats};
pub use replica::{ApplyStats, Ifnames, Replica, Tables};
pub use wire::{Msg, StateId};

#[cfg(test)]
mod tests;
