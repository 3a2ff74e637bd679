//! State events for sync: every insert, update and delete, as (state id, kind), in a bounded
//! per-worker queue. Repeated updates of one state collapse into the one already queued (a flag
//! in the entry), so the queue holds at most one insert or update per state.

use crate::table::{sf, State};
use crate::Key;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    Insert,
    Update,
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub id: u32,
    pub kind: EventKind,
}

/// A bounded FIFO that never allocates after creation. A full queue refuses the event and
/// counts it; the sync module recovers by a bulk update, as pfsync does.
pub struct EventQueue {
    q: VecDeque<Event>,
    cap: usize,
    pub dropped: u64,
}

impl EventQueue {
    pub fn new(cap: usize) -> EventQueue {
        EventQueue { q: VecDeque::with_capacity(cap), cap, dropped: 0 }
    }
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }
    /// Queues `e`; false (and counted) when full.
    #[inline]
    pub fn push(&mut self, e: Event) -> bool {
        if self.q.len() >= self.cap {
            self.dropped += 1;
            return false;
        }
        self.q.push_back(e);
        true
    }
    #[inline]
    pub fn pop(&mut self) -> Option<Event> {
        self.q.pop_front()
    }
    pub fn len(&self) -> usize {
        self.q.len()
    }
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// Seconds between the sync updates of an active state the engine has no other reason to
/// offer (its protocol state did not change).
pub const SYNC_EVERY: u32 = 4;

#[inline(always)]
pub(crate) fn sync_epoch(t: u32, id: u32) -> u32 {
    t.wrapping_add(id) / SYNC_EVERY
}

/// Queues an update event for state `s` (id `id`) unless one is queued or it is `no-sync`.
#[inline(always)]
pub(crate) fn offer<K: Key>(events: &mut EventQueue, s: &mut State<K>, id: u32) {
    if events.enabled()
        && s.flags & (sf::EVQ_INS | sf::EVQ_UPD | sf::NOSYNC) == 0
        && events.push(Event { id, kind: EventKind::Update })
    {
        s.flags |= sf::EVQ_UPD;
    }
}
