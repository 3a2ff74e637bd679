//! Defer mode (`--sync-defer`; pf's `defer` on its pfsync interface): the packet that created
//! a state is held until the sync peer acknowledges the state's insert (an insert ack), or
//! until TIMEOUT passes, so that the peer holds the state before any answer can reach it.
//! That is what an active-active pair, or one with asymmetric routes, needs: without it the
//! reply to a SYN may come back through the other firewall before that one knows the state.
//!
//! A held packet is copied out of the receive ring, already rewritten for the wire (link
//! addresses, TTL, `modulate state`); the worker sends it when it is released. The queue is
//! in arrival order, so the timeouts pop from its front; at MAX_HELD the oldest goes out
//! unacknowledged (pf also releases the oldest when too many are deferred).

use serde::Serialize;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// pf's PFSYNC_DEFER_TIMEOUT (20 ms).
pub const TIMEOUT: Duration = Duration::from_millis(20);
/// Packets held per worker at most.
pub const MAX_HELD: usize = 1024;
/// No state to wait for in this place of [`Held::wait`].
const NONE: u32 = u32::MAX;

struct Held {
    frame: Vec<u8>,
    port: usize,
    /// The states whose inserts must be acknowledged (the `in` and the `out` state a packet
    /// may both create), as sync's slot references.
    wait: [u32; 2],
    until: Instant,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct DeferStats {
    pub held: u64,
    pub released_ack: u64,
    pub released_timeout: u64,
    pub released_full: u64,
    /// Held now.
    pub waiting: u64,
    /// Time from holding to the ack, summed and longest (microseconds), over `released_ack`.
    pub ack_us_sum: u64,
    pub ack_us_max: u64,
}

impl DeferStats {
    pub fn add(&mut self, o: &DeferStats) {
        self.held += o.held;
        self.released_ack += o.released_ack;
        self.released_timeout += o.released_timeout;
        self.released_full += o.released_full;
        self.waiting += o.waiting;
        self.ack_us_sum += o.ack_us_sum;
        self.ack_us_max = self.ack_us_max.max(o.ack_us_max);
    }
}

#[derive(Default)]
pub struct Defer {
    q: VecDeque<Held>,
    spare: Vec<Vec<u8>>,
    pub stats: DeferStats,
}

/// Frames released, with the port each leaves by.
pub type Released = Vec<(usize, Vec<u8>)>;

impl Defer {
    /// Holds `frame` (to leave by `port`) until the states in `wait` are acknowledged; returns
    /// the held copy, for the caller to rewrite in place.
    pub fn hold(
        &mut self,
        frame: &[u8],
        port: usize,
        wait: [Option<u32>; 2],
        now: Instant,
        out: &mut Released,
    ) -> &mut [u8] {
        if self.q.len() >= MAX_HELD {
            if let Some(h) = self.q.pop_front() {
                self.stats.released_full += 1;
                out.push((h.port, h.frame));
            }
        }
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(frame);
        self.stats.held += 1;
        self.q.push_back(Held { frame: v, port, wait: wait.map(|w| w.unwrap_or(NONE)), until: now + TIMEOUT });
        self.stats.waiting = self.q.len() as u64;
        &mut self.q.back_mut().expect("just pushed").frame
    }

    /// The peer acknowledged the inserts of `ids`: the packets that waited only for them go.
    pub fn acked(&mut self, ids: &[u32], now: Instant, out: &mut Released) {
        if ids.is_empty() || self.q.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.q.len() {
            let h = &mut self.q[i];
            for w in h.wait.iter_mut() {
                if *w != NONE && ids.contains(w) {
                    *w = NONE;
                }
            }
            if h.wait == [NONE; 2] {
                let h = self.q.remove(i).expect("in range");
                self.stats.released_ack += 1;
                let us = (now + TIMEOUT).saturating_duration_since(h.until).as_micros() as u64;
                self.stats.ack_us_sum += us;
                self.stats.ack_us_max = self.stats.ack_us_max.max(us);
                out.push((h.port, h.frame));
            } else {
                i += 1;
            }
        }
        self.stats.waiting = self.q.len() as u64;
    }

    /// The packets whose time is up go unacknowledged.
    pub fn expire(&mut self, now: Instant, out: &mut Released) {
        while self.q.front().is_some_and(|h| h.until <= now) {
            let h = self.q.pop_front().expect("checked");
            self.stats.released_timeout += 1;
            out.push((h.port, h.frame));
        }
        self.stats.waiting = self.q.len() as u64;
    }

    /// A sent frame's buffer, for reuse.
    pub fn recycle(&mut self, v: Vec<u8>) {
        if self.spare.len() < 64 {
            self.spare.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_until_every_state_is_acknowledged_or_the_time_is_up() {
        let mut d = Defer::default();
        let t0 = Instant::now();
        let mut out = Vec::new();
        d.hold(&[1], 0, [Some(5), Some(7)], t0, &mut out);
        d.hold(&[2], 1, [Some(9), None], t0, &mut out);
        d.hold(&[3], 0, [Some(11), None], t0 + Duration::from_millis(5), &mut out);
        d.acked(&[5, 9], t0 + Duration::from_millis(1), &mut out);
        assert_eq!(out, vec![(1, vec![2])], "the first still waits for 7");
        out.clear();
        d.acked(&[7], t0 + Duration::from_millis(3), &mut out);
        assert_eq!(out, vec![(0, vec![1])]);
        out.clear();
        d.expire(t0 + TIMEOUT, &mut out);
        assert!(out.is_empty(), "the third is 5 ms younger");
        d.expire(t0 + TIMEOUT + Duration::from_millis(5), &mut out);
        assert_eq!(out, vec![(0, vec![3])]);
        assert_eq!((d.stats.held, d.stats.released_ack, d.stats.released_timeout, d.stats.waiting), (3, 2, 1, 0));
        assert_eq!((d.stats.ack_us_sum, d.stats.ack_us_max), (4000, 3000));
    }

    #[test]
    fn a_full_queue_lets_the_oldest_go() {
        let mut d = Defer::default();
        let t0 = Instant::now();
        let mut out = Vec::new();
        for i in 0..MAX_HELD + 2 {
            d.hold(&[i as u8], 0, [Some(i as u32), None], t0, &mut out);
        }
        assert_eq!(out, vec![(0, vec![0]), (0, vec![1])]);
        assert_eq!((d.stats.released_full, d.stats.waiting), (2, MAX_HELD as u64));
    }
}
