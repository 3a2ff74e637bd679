//! The userspace half of the kernel fast path (`xpfd --fastpath`).
//!
//! A UDP packet that xpfd forwarded, and whose `in` and `out` states exist and have seen a
//! second packet, has its flow put in the steering program's `fast` map of the interface it
//! came in on (bpf/steer.c), naming a record of this worker's by slot. Later packets of that
//! flow, in that direction, are forwarded by the steering program itself and counted in the
//! map entry. A read-back pass walks the map (BPF_MAP_LOOKUP_BATCH, a slice per call so that
//! a million flows never stall the worker), carries the counts into both states (which keeps
//! them from expiring) and takes out the flows whose states are gone (expired, killed with -k,
//! flushed; at once after -k/-F). Passes come every third of the shortest UDP timeout, at
//! most every 10 s: a state cannot expire unseen.
//!
//! Only UDP, as pf's TCP tracking needs every segment. The reply direction is a flow of its
//! own, installed when its packets come through xpfd.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use xpf_engine::Worker;
use xpf_state::Timeout;
use xpf_xdp::bpf::{BatchCursor, Map};

use crate::policy::Live;

/// `struct fast_key` and `struct fast_val` of bpf/steer.c.
pub const KEY_LEN: usize = 40;
pub const VAL_LEN: usize = 32;

/// The longest interval between read-back passes; shorter when UDP timeouts are short.
const SYNC_MAX: Duration = Duration::from_secs(10);
/// Map entries read per slice of a pass (one BPF_MAP_LOOKUP_BATCH).
const SLICE: usize = 4096;
/// After the map refused an entry (full), offers wait this long.
const BACKOFF: Duration = Duration::from_secs(1);
/// A flow is offered to the kernel once its `in` state has seen this many packets in the
/// offered direction: one-packet flows (DNS, scans, floods of new flows) never cost a map
/// entry and its upkeep.
const OFFER_AFTER: u32 = 2;

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct FastStats {
    /// Flows in the map now (this worker's), installed and removed since start.
    pub flows: u64,
    pub installed: u64,
    pub removed: u64,
    /// No room: the map is full (--fastpath FLOWS, 1M per interface by default).
    pub refused: u64,
    /// Packets and bytes the kernel forwarded, as carried into the states.
    pub packets: u64,
    pub bytes: u64,
    /// The last complete read-back pass: worker time it took (summed over its slices) and
    /// flows it visited.
    pub last_pass_us: u64,
    pub last_pass_entries: u64,
}

/// A worker's record of a flow it installed; the map entry names it by slot.
impl FastStats {
    /// Adds another worker's (counts add up; the pass figures are the slowest worker's).
    pub fn add(&mut self, g: &FastStats) {
        self.flows += g.flows;
        self.installed += g.installed;
        self.removed += g.removed;
        self.refused += g.refused;
        self.packets += g.packets;
        self.bytes += g.bytes;
        self.last_pass_us = self.last_pass_us.max(g.last_pass_us);
        self.last_pass_entries = self.last_pass_entries.max(g.last_pass_entries);
    }
}

struct Seen {
    in_if: u32,
    key: [u8; KEY_LEN],
    egress: u32,
    /// The `in` and `out` states.
    ids: [u32; 2],
    /// The counts already carried into the states.
    packets: u64,
    bytes: u64,
    /// The last pass that found its map entry.
    pass: u32,
}

pub struct FastPath {
    /// The `fast` map of each filtered interface, by ifindex.
    maps: Vec<(u32, Map)>,
    owner: u32,
    /// Installed flows: records by slot, and slots by flow (to offer each flow once).
    seen: Vec<Option<Seen>>,
    free: Vec<u32>,
    mine: HashMap<(u32, [u8; KEY_LEN]), u32>,
    last_sync: Instant,
    pass: u32,
    refused_at: Option<Instant>,
    /// Flows offered during the current batch, installed together by `install`.
    queued: Vec<(u32, [u8; KEY_LEN], u32, [u32; 2])>,
    /// The pass under way: which map, and where in it.
    walking: Option<(usize, BatchCursor)>,
    gone: Vec<(u32, [u8; KEY_LEN], Option<u32>)>,
    pass_time: Duration,
    pass_entries: u64,
    pub stats: FastStats,
}

/// The fast-path key of a frame (Ethernet first), if it is a candidate: UDP over IPv4 without
/// options or fragments, or UDP right after the IPv6 header.
pub fn key_of(f: &[u8]) -> Option<[u8; KEY_LEN]> {
    let mut k = [0u8; KEY_LEN];
    match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        0x0800 => {
            if f.len() < 42 || f[14] != 0x45 || f[23] != 17 || u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0 {
                return None;
            }
            k[0] = libc::AF_INET as u8;
            k[2..6].copy_from_slice(&f[34..38]);
            k[8..12].copy_from_slice(&f[26..30]);
            k[24..28].copy_from_slice(&f[30..34]);
        }
        0x86dd => {
            if f.len() < 62 || f[14] >> 4 != 6 || f[20] != 17 {
                return None;
            }
            k[0] = libc::AF_INET6 as u8;
            k[2..6].copy_from_slice(&f[54..58]);
            k[8..24].copy_from_slice(&f[22..38]);
            k[24..40].copy_from_slice(&f[38..54]);
        }
        _ => return None,
    }
    k[1] = 17;
    Some(k)
}

/// A minimal frame of the flow `k` names, for the engine to key its states on, and its length.
fn frame_of(k: &[u8; KEY_LEN]) -> ([u8; 62], usize) {
    let v4 = k[0] == libc::AF_INET as u8;
    let mut f = [0u8; 62];
    let (sport, dport) = (u16::from_be_bytes([k[2], k[3]]), u16::from_be_bytes([k[4], k[5]]));
    if v4 {
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let (src, dst) = (k[8..12].try_into().unwrap(), k[24..28].try_into().unwrap());
        xpf_wire::ipv4::emit_header(&mut f[14..], src, dst, 17, 28, 64, 0);
        xpf_wire::udp::emit_header(&mut f[34..], sport, dport, 8);
    } else {
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&8u16.to_be_bytes());
        f[20] = 17;
        f[21] = 64;
        f[22..38].copy_from_slice(&k[8..24]);
        f[38..54].copy_from_slice(&k[24..40]);
        xpf_wire::udp::emit_header(&mut f[54..], sport, dport, 8);
    }
    (f, if v4 { 42 } else { 62 })
}

impl FastPath {
    pub fn new(maps: Vec<(u32, Map)>, owner: u32) -> FastPath {
        FastPath {
            maps,
            owner,
            seen: Vec::new(),
            free: Vec::new(),
            mine: HashMap::new(),
            last_sync: Instant::now(),
            pass: 0,
            refused_at: None,
            queued: Vec::new(),
            walking: None,
            gone: Vec::new(),
            pass_time: Duration::ZERO,
            pass_entries: 0,
            stats: FastStats::default(),
        }
    }

    /// After xpfd forwarded `frame` from `in_if` to `out_if`: queues its flow for the kernel's
    /// map if it is a UDP flow with both states (`install` writes the batch's in one call).
    pub fn offer(&mut self, w: &mut Worker<Live>, frame: &[u8], in_if: u32, out_if: u32) {
        let Some(k) = key_of(frame) else { return };
        if self.mine.contains_key(&(in_if, k)) || self.refused_at.is_some_and(|t| t.elapsed() < BACKOFF) {
            return;
        }
        if !self.maps.iter().any(|m| m.0 == in_if) {
            return;
        }
        match w.flow_states(frame, in_if as u16, out_if as u16) {
            Some((ids, n)) if n >= OFFER_AFTER => self.queued.push((in_if, k, out_if, ids)),
            _ => {}
        }
    }

    fn alloc(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.seen.push(None);
            self.seen.len() as u32 - 1
        })
    }

    /// Writes the queued flows into the maps, one BPF_MAP_UPDATE_BATCH per interface.
    pub fn install(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let mut q = std::mem::take(&mut self.queued);
        // A flow offered twice in one batch (two of its packets) is installed once.
        q.sort_unstable_by_key(|e| (e.0, e.1));
        q.dedup_by_key(|e| (e.0, e.1));
        let (mut keys, mut vals, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for chunk in q.chunk_by(|a, b| a.0 == b.0) {
            let in_if = chunk[0].0;
            let Some(mi) = self.maps.iter().position(|m| m.0 == in_if) else { continue };
            keys.clear();
            vals.clear();
            slots.clear();
            for &(_, k, out_if, ids) in chunk {
                let slot = self.alloc();
                self.seen[slot as usize] =
                    Some(Seen { in_if, key: k, egress: out_if, ids, packets: 0, bytes: 0, pass: self.pass });
                slots.push(slot);
                keys.extend_from_slice(&k);
                vals.extend_from_slice(&out_if.to_ne_bytes());
                vals.extend_from_slice(&self.owner.to_ne_bytes());
                vals.extend_from_slice(&slot.to_ne_bytes());
                vals.extend_from_slice(&[0u8; 20]);
            }
            debug_assert_eq!(vals.len(), slots.len() * VAL_LEN);
            let (done, r) = self.maps[mi].1.update_batch(&keys, &vals);
            let done = done.min(slots.len());
            for (i, &slot) in slots.iter().enumerate() {
                if i < done {
                    self.mine.insert((in_if, chunk[i].1), slot);
                } else {
                    self.seen[slot as usize] = None;
                    self.free.push(slot);
                }
            }
            self.stats.installed += done as u64;
            if r.is_err() {
                self.stats.refused += (chunk.len() - done) as u64;
                self.refused_at = Some(Instant::now());
            }
        }
        self.stats.flows = self.mine.len() as u64;
        q.clear();
        self.queued = q;
    }

    /// The interval between passes: a third of the shortest UDP timeout now in force
    /// (adaptive scaling included), at most SYNC_MAX.
    fn interval(w: &Worker<Live>) -> Duration {
        let t = &w.t4;
        let shortest = [Timeout::UdpFirst, Timeout::UdpSingle, Timeout::UdpMultiple]
            .into_iter()
            .map(|c| t.timeouts().effective(c, t.len() + w.t6.len(), t.limit()))
            .min()
            .unwrap_or(30);
        Duration::from_secs((shortest / 3).max(1) as u64).min(SYNC_MAX)
    }

    /// Carries the kernel's counts into the states and takes out the flows whose states are
    /// gone: a pass every `interval`, a slice of a map per call; with `force` (after states
    /// were killed) a whole pass now.
    pub fn sync(&mut self, w: &mut Worker<Live>, now: u32, force: bool) {
        if force {
            self.begin();
            while self.walking.is_some() {
                self.step(w, now);
            }
            return;
        }
        if self.walking.is_none() {
            if self.last_sync.elapsed() < Self::interval(w) {
                return;
            }
            self.begin();
        }
        self.step(w, now);
    }

    fn begin(&mut self) {
        self.last_sync = Instant::now();
        if self.maps.is_empty() {
            return;
        }
        self.pass = self.pass.wrapping_add(1);
        self.walking = Some((0, BatchCursor::default()));
        self.pass_time = Duration::ZERO;
        self.pass_entries = 0;
    }

    /// One slice of the current pass; the pass ends after the last map's last slice.
    fn step(&mut self, w: &mut Worker<Live>, now: u32) {
        let t = Instant::now();
        let Some((mi, mut cur)) = self.walking.take() else { return };
        let (pass, owner) = (self.pass, self.owner);
        let (in_if, map) = (self.maps[mi].0, &self.maps[mi].1);
        let (seen_v, stats, gone) = (&mut self.seen, &mut self.stats, &mut self.gone);
        let mut read = 0u64;
        let r = map.read_chunk(&mut cur, SLICE, |k, v| {
            read += 1;
            if u32::from_ne_bytes(v[4..8].try_into().unwrap()) != owner {
                return;
            }
            let k: [u8; KEY_LEN] = k.try_into().unwrap();
            let slot = u32::from_ne_bytes(v[8..12].try_into().unwrap());
            let packets = u64::from_ne_bytes(v[16..24].try_into().unwrap());
            let bytes = u64::from_ne_bytes(v[24..32].try_into().unwrap());
            let Some(s) =
                seen_v.get_mut(slot as usize).and_then(|s| s.as_mut()).filter(|s| s.key == k && s.in_if == in_if)
            else {
                gone.push((in_if, k, None));
                return;
            };
            let (dp, db) = (packets.saturating_sub(s.packets), bytes.saturating_sub(s.bytes));
            let add = (dp > 0).then_some((dp as u32, db));
            let (f, len) = frame_of(&k);
            if w.flow_account(&f[..len], in_if as u16, s.egress as u16, s.ids, add, now) {
                s.packets = packets;
                s.bytes = bytes;
                s.pass = pass;
                stats.packets += dp;
                stats.bytes += db;
            } else {
                gone.push((in_if, k, Some(slot)));
            }
        });
        if let Err(e) = &r {
            eprintln!("xpfd: fast path: reading the counts of ifindex {in_if}: {e}");
        }
        self.pass_entries += read;
        if !cur.done && r.is_ok() {
            self.walking = Some((mi, cur));
        } else if mi + 1 < self.maps.len() {
            self.walking = Some((mi + 1, BatchCursor::default()));
        } else {
            self.finish(pass);
        }
        self.pass_time += t.elapsed();
        if self.walking.is_none() {
            self.stats.last_pass_us = self.pass_time.as_micros() as u64;
            self.stats.last_pass_entries = self.pass_entries;
        }
    }

    fn finish(&mut self, pass: u32) {
        for (in_if, k, slot) in std::mem::take(&mut self.gone) {
            if let Some((_, m)) = self.maps.iter().find(|m| m.0 == in_if) {
                let _ = m.delete(&k);
            }
            if let Some(slot) = slot {
                self.release(slot);
            }
        }
        // Records whose entries left the map by other means, or were installed where the
        // pass had already been (they are found by the next one).
        for slot in 0..self.seen.len() as u32 {
            if self.seen[slot as usize].as_ref().is_some_and(|s| pass.wrapping_sub(s.pass) > 1) {
                self.release(slot);
            }
        }
        self.stats.flows = self.mine.len() as u64;
    }

    /// Forgets flow `slot` (its map entry is gone or being deleted) and frees the slot.
    fn release(&mut self, slot: u32) {
        if let Some(s) = self.seen[slot as usize].take() {
            self.mine.remove(&(s.in_if, s.key));
            self.free.push(slot);
            self.stats.removed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_frame_round_trip() {
        for k0 in [
            {
                let mut k = [0u8; KEY_LEN];
                k[0] = 2;
                k[1] = 17;
                k[2..6].copy_from_slice(&[0x07, 0xd0, 0x07, 0xd1]);
                k[8..12].copy_from_slice(&[198, 18, 0, 1]);
                k[24..28].copy_from_slice(&[198, 19, 0, 1]);
                k
            },
            {
                let mut k = [0u8; KEY_LEN];
                k[0] = 10;
                k[1] = 17;
                k[2..6].copy_from_slice(&[0, 53, 0x04, 0x00]);
                k[8] = 0xfd;
                k[39] = 2;
                k
            },
        ] {
            let (f, n) = frame_of(&k0);
            assert_eq!(key_of(&f[..n]), Some(k0));
        }
    }

    #[test]
    fn the_engine_parses_the_made_up_frames() {
        let mut k = [0u8; KEY_LEN];
        k[0] = 2;
        k[1] = 17;
        k[8..12].copy_from_slice(&[10, 0, 0, 1]);
        k[24..28].copy_from_slice(&[10, 0, 1, 1]);
        let mut pd = xpf_wire::PDesc::default();
        let (f, n) = frame_of(&k);
        assert!(xpf_wire::parse_ether(&f[..n], &mut pd).is_ok(), "IPv4");
        k[0] = 10;
        k[8] = 0xfd;
        k[24] = 0xfd;
        let (f, n) = frame_of(&k);
        assert!(xpf_wire::parse_ether(&f[..n], &mut pd).is_ok(), "IPv6");
    }

    #[test]
    fn only_plain_udp_is_a_candidate() {
        let mut k = [0u8; KEY_LEN];
        k[0] = 2;
        k[1] = 17;
        let (f, n) = frame_of(&k);
        let f = f[..n].to_vec();
        let mut tcp = f.clone();
        tcp[23] = 6;
        assert_eq!(key_of(&tcp), None);
        let mut opts = f.clone();
        opts[14] = 0x46;
        assert_eq!(key_of(&opts), None);
        let mut frag = f;
        frag[20] = 0x20; // more fragments
        assert_eq!(key_of(&frag), None);
        assert_eq!(key_of(&[0u8; 10]), None);
    }
}
