//! Flow records for export (pf's `pflow`): a flagged state's keys on both sides of a
//! translation, its packets and bytes each way, and its times, at its end, every `active`
//! seconds while it lives, and, for translated states, at their creation (FreeBSD's NAT44
//! session events).
//!
//! The table makes a record where a state ends (one place: `unlink`) and where the expiry
//! wheel visits it: a flagged state is filed at the earlier of its deadline and its next
//! active export, so that long flows are reported without a scan of the table. Counts in an
//! active or end record are deltas since the state's last record (kept per exported state, in
//! a side map only long flows enter).

use crate::Key;
use std::collections::HashMap;
use xpf_wire::Addr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowEvent {
    /// The state ended (expired, closed, killed, flushed, replaced).
    End,
    /// The state lives on: its counts since the last record.
    Active,
    /// A translated state was made (IPFIX natEvent 4); its end is also sent as natEvent 5.
    NatCreate,
}

/// One record. Addresses and ports as pf's pflow exports them: the state's key on the side
/// where the rule saw it (inbound: the wire key; outbound: the stack key, before
/// translation), `src` being the side that made the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub event: FlowEvent,
    pub af: u8,
    pub proto: u8,
    /// The interface the state was made on (0: floating).
    pub kif: u16,
    pub out: bool,
    pub rule: u32,
    /// (address, port) of the side that made the state, and of the other; before translation.
    pub src: (Addr, u16),
    pub dst: (Addr, u16),
    /// The same after translation (equal to the above without one).
    pub nat_src: (Addr, u16),
    pub nat_dst: (Addr, u16),
    /// [from src, towards src], since the state's last record.
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
    /// Engine seconds: the first packet counted (creation, or the last record), the last.
    pub start: u32,
    pub end: u32,
}

/// What the last record of a long flow said (for the next one's deltas).
#[derive(Debug, Clone, Copy)]
struct Sent {
    seq: u32,
    at: u32,
    packets: [u32; 2],
    bytes: [u64; 2],
}

/// A table's flow export: records made, waiting for the worker to take them.
#[derive(Debug, Default)]
pub struct FlowLog {
    /// Seconds between a live flow's records (0: at its end only).
    pub active: u32,
    pub records: Vec<Flow>,
    /// Records not kept: more than [`FlowLog::CAP`] waited (the worker takes them every batch).
    pub dropped: u64,
    sent: HashMap<u32, Sent>,
}

impl FlowLog {
    pub const CAP: usize = 1 << 16;

    /// When state `id` (made at `creation`, insert sequence `seq`) is next due an active
    /// record; None without active export.
    pub fn next_active(&self, id: u32, seq: u32, creation: u32) -> Option<u32> {
        if self.active == 0 {
            return None;
        }
        let last = self.sent.get(&id).filter(|s| s.seq == seq).map_or(creation, |s| s.at);
        Some(last.saturating_add(self.active))
    }

    /// Records `event` for state `s` (id `id`, meta `m`, stack key `stack` under translation)
    /// at `now`.
    pub fn record<K: Key>(
        &mut self,
        id: u32,
        s: &crate::State<K>,
        m: crate::Meta,
        stack: Option<K>,
        event: FlowEvent,
        now: u32,
    ) {
        let prev = match event {
            FlowEvent::End => self.sent.remove(&id).filter(|p| p.seq == m.seq),
            FlowEvent::Active => {
                let p = self.sent.get(&id).copied().filter(|p| p.seq == m.seq);
                self.sent.insert(id, Sent { seq: m.seq, at: now, packets: s.packets, bytes: s.bytes });
                p
            }
            FlowEvent::NatCreate => None,
        };
        // A flow idle since its last record has nothing new to say, at its end either.
        if prev.is_some_and(|p| p.packets == s.packets) {
            return;
        }
        if self.records.len() >= Self::CAP {
            self.dropped += 1;
            return;
        }
        let out = s.flags & crate::sf::OUT != 0;
        let wire = &s.key;
        let stack = stack.as_ref().unwrap_or(wire);
        // The side the rule saw, and the other; the creator is addr[1] going out, addr[0] in.
        let (seen, other) = if out { (stack, wire) } else { (wire, stack) };
        let (si, di) = if out { (1, 0) } else { (0, 1) };
        let side = |k: &K, i: usize| (k.addr(i), k.port(i));
        let (mut packets, mut bytes) = ([0u64; 2], [0u64; 2]);
        if event != FlowEvent::NatCreate {
            for i in 0..2 {
                let (p0, b0) = prev.map_or((0, 0), |p| (p.packets[i], p.bytes[i]));
                packets[i] = s.packets[i].wrapping_sub(p0) as u64;
                bytes[i] = s.bytes[i].saturating_sub(b0);
            }
        }
        self.records.push(Flow {
            event,
            af: wire.af(),
            proto: wire.proto(),
            kif: wire.kif(),
            out,
            rule: m.rule,
            src: side(seen, si),
            dst: side(seen, di),
            nat_src: side(other, si),
            nat_dst: side(other, di),
            packets,
            bytes,
            start: prev.map_or(m.creation, |p| p.at),
            end: if event == FlowEvent::NatCreate { m.creation } else { s.expire },
        });
    }

    /// Long flows remembered for their next record's deltas.
    pub fn remembered(&self) -> usize {
        self.sent.len()
    }
}
