//! The userspace half of the kernel fast path (`xpfd --fastpath`).
//!
//! A UDP packet that xpfd forwarded, and whose `in` and `out` states exist, has its flow put in
//! the steering program's `fast` map of the interface it came in on (bpf/steer.c). Later
//! packets of that flow, in that direction, are forwarded by the steering program itself and
//! only counted; every 2 s the worker reads the counts back (BPF_MAP_LOOKUP_BATCH) and
//! carries them into both states, which keeps them from expiring. A flow whose states are
//! gone (expired, killed with -k, flushed) is taken out of the map at that pass, or at once
//! after -k/-F. Each worker owns the entries it installed.
//!
//! Only UDP, as pf's TCP tracking needs every segment. The reply direction is a flow of its
//! own, installed when its first packet comes through xpfd.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use xpf_engine::Worker;
use xpf_xdp::bpf::Map;

use crate::policy::Live;

/// `struct fast_key` and `struct fast_val` of bpf/steer.c.
pub const KEY_LEN: usize = 40;
pub const VAL_LEN: usize = 24;

/// How often the counts are read back: well under pf's shortest default UDP timeout
/// (udp.single 30 s). A pass costs ~0.3 us per flow in the map (two state lookups).
const SYNC_EVERY: Duration = Duration::from_secs(2);
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
    /// The map refused an entry (full: 2M flows per interface).
    pub refused: u64,
    /// Packets and bytes the kernel forwarded, as carried into the states.
    pub packets: u64,
    pub bytes: u64,
}

struct Seen {
    egress: u32,
    packets: u64,
    bytes: u64,
    pass: u32,
}

pub struct FastPath {
    /// The `fast` map of each filtered interface, by ifindex.
    maps: Vec<(u32, Map)>,
    owner: u32,
    mine: HashMap<(u32, [u8; KEY_LEN]), Seen>,
    last_sync: Instant,
    pass: u32,
    refused_at: Option<Instant>,
    /// Flows offered during the current batch, installed together by `install`.
    queued: Vec<(u32, [u8; KEY_LEN], u32)>,
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

/// A minimal frame of the flow `k` names, for the engine to key its states on.
fn frame_of(k: &[u8; KEY_LEN]) -> Vec<u8> {
    let v4 = k[0] == libc::AF_INET as u8;
    let mut f = vec![0u8; if v4 { 42 } else { 62 }];
    if v4 {
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&k[8..12]);
        f[30..34].copy_from_slice(&k[24..28]);
        f[34..38].copy_from_slice(&k[2..6]);
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        let ck = xpf_wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&ck.to_be_bytes());
    } else {
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&8u16.to_be_bytes());
        f[20] = 17;
        f[21] = 64;
        f[22..38].copy_from_slice(&k[8..24]);
        f[38..54].copy_from_slice(&k[24..40]);
        f[54..58].copy_from_slice(&k[2..6]);
        f[58..60].copy_from_slice(&8u16.to_be_bytes());
    }
    f
}

impl FastPath {
    pub fn new(maps: Vec<(u32, Map)>, owner: u32) -> FastPath {
        FastPath {
            maps,
            owner,
            mine: HashMap::new(),
            last_sync: Instant::now(),
            pass: 0,
            refused_at: None,
            queued: Vec::new(),
            stats: FastStats::default(),
        }
    }

    /// After xpfd forwarded `frame` from `in_if` to `out_if`: queues its flow for the kernel's
    /// map if it is a UDP flow with both states (`install` writes the batch's in one call).
    pub fn offer(&mut self, w: &mut Worker<Live>, frame: &[u8], in_if: u32, out_if: u32, now: u32) {
        let Some(k) = key_of(frame) else { return };
        if self.mine.contains_key(&(in_if, k)) {
            return;
        }
        if self.refused_at.is_some_and(|t| t.elapsed() < BACKOFF) {
            return;
        }
        if !self.maps.iter().any(|m| m.0 == in_if) || self.queued.iter().any(|q| q.0 == in_if && q.1 == k) {
            return;
        }
        match w.flow_states(frame, in_if as u16, out_if as u16, None, now) {
            Some(n) if n >= OFFER_AFTER => {}
            _ => return,
        }
        self.queued.push((in_if, k, out_if));
    }

    /// Writes the queued flows into the maps, one BPF_MAP_UPDATE_BATCH per interface.
    pub fn install(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let mut q = std::mem::take(&mut self.queued);
        q.sort_unstable_by_key(|e| e.0);
        let (mut keys, mut vals) = (Vec::new(), Vec::new());
        for chunk in q.chunk_by(|a, b| a.0 == b.0) {
            let in_if = chunk[0].0;
            let Some((_, map)) = self.maps.iter().find(|m| m.0 == in_if) else { continue };
            keys.clear();
            vals.clear();
            for (_, k, out_if) in chunk {
                keys.extend_from_slice(k);
                vals.extend_from_slice(&out_if.to_ne_bytes());
                vals.extend_from_slice(&self.owner.to_ne_bytes());
                vals.extend_from_slice(&[0u8; 16]);
            }
            debug_assert_eq!(vals.len(), chunk.len() * VAL_LEN);
            let (done, r) = map.update_batch(&keys, &vals);
            for (_, k, out_if) in &chunk[..done.min(chunk.len())] {
                self.mine.insert((in_if, *k), Seen { egress: *out_if, packets: 0, bytes: 0, pass: self.pass });
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

    /// Reads the kernel's counts back into the states, once a second (or now, with `force`:
    /// after states were killed), and takes out the flows whose states are gone.
    pub fn sync(&mut self, w: &mut Worker<Live>, now: u32, force: bool) {
        if !force && self.last_sync.elapsed() < SYNC_EVERY {
            return;
        }
        self.last_sync = Instant::now();
        self.pass = self.pass.wrapping_add(1);
        let pass = self.pass;
        let owner = self.owner;
        let mut gone: Vec<(u32, [u8; KEY_LEN])> = Vec::new();
        for (in_if, map) in &self.maps {
            let in_if = *in_if;
            let mine = &mut self.mine;
            let stats = &mut self.stats;
            let r = map.for_each(4096, |k, v| {
                if u32::from_ne_bytes(v[4..8].try_into().unwrap()) != owner {
                    return;
                }
                let k: [u8; KEY_LEN] = k.try_into().unwrap();
                let packets = u64::from_ne_bytes(v[8..16].try_into().unwrap());
                let bytes = u64::from_ne_bytes(v[16..24].try_into().unwrap());
                let Some(s) = mine.get_mut(&(in_if, k)) else {
                    gone.push((in_if, k));
                    return;
                };
                let (dp, db) = (packets.saturating_sub(s.packets), bytes.saturating_sub(s.bytes));
                let add = (dp > 0).then_some((dp as u32, db));
                if w.flow_states(&frame_of(&k), in_if as u16, s.egress as u16, add, now).is_some() {
                    s.packets = packets;
                    s.bytes = bytes;
                    s.pass = pass;
                    stats.packets += dp;
                    stats.bytes += db;
                } else {
                    gone.push((in_if, k));
                }
            });
            if let Err(e) = r {
                eprintln!("xpfd: fast path: reading the counts of ifindex {in_if}: {e}");
            }
        }
        for (in_if, k) in gone {
            if let Some((_, m)) = self.maps.iter().find(|m| m.0 == in_if) {
                let _ = m.delete(&k);
            }
            if self.mine.remove(&(in_if, k)).is_some() {
                self.stats.removed += 1;
            }
        }
        // Entries that left the map by other means.
        let before = self.mine.len();
        self.mine.retain(|_, s| s.pass == pass);
        self.stats.removed += (before - self.mine.len()) as u64;
        self.stats.flows = self.mine.len() as u64;
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
            assert_eq!(key_of(&frame_of(&k0)), Some(k0));
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
        assert!(xpf_wire::parse_ether(&frame_of(&k), &mut pd).is_ok(), "IPv4");
        k[0] = 10;
        k[8] = 0xfd;
        k[24] = 0xfd;
        assert!(xpf_wire::parse_ether(&frame_of(&k), &mut pd).is_ok(), "IPv6");
    }

    #[test]
    fn only_plain_udp_is_a_candidate() {
        let mut k = [0u8; KEY_LEN];
        k[0] = 2;
        k[1] = 17;
        let f = frame_of(&k);
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
