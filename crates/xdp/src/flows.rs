//! The steering program's fast-path flow tables (`flows4`, `flows6` in bpf/steer.c), mapped
//! into xpfd's memory: xpfd writes and reads them with plain loads and stores, no system call.
//!
//! Open addressing: a flow's entry is one of the `PROBE` entries from its key's hash (murmur3
//! steps over the key's words, seeded at random by xpfd: the program computes the same).
//! IPv4 entries are one cache line (64 bytes), IPv6 entries two. An entry's `ctl` word holds
//! its state (byte 0), protocol (byte 1) and owner worker (byte 2). A worker claims an empty
//! or dead entry by compare-and-swap (workers share the tables), writes it while it is HELD
//! (the program does not match it), and publishes it LIVE. Taking a flow back: HELD (the
//! program stops matching it; the owner reads it a last time a moment later, once no program
//! run that matched it can still be writing), then DEAD; a dead entry with an empty one after
//! it becomes empty again, so lookups that miss stay short.

use crate::bpf::Mapped;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

pub const F_EMPTY: u32 = 0;
pub const F_LIVE: u32 = 1;
pub const F_DEAD: u32 = 2;
pub const F_HELD: u32 = 3;
/// Entries a lookup visits from the key's hash (bpf/steer.c FAST_PROBE).
pub const PROBE: u32 = 16;

/// `struct fast_tail` of bpf/steer.c: what follows the key in either family's entry.
#[repr(C)]
#[derive(Debug)]
pub struct Tail {
    pub bytes: AtomicU64,
    pub packets: AtomicU32,
    pub in_if: AtomicU32,
    pub out_if: AtomicU32,
    /// TCP: this direction's sender is `src`. `peer_seqhi` is the reverse entry's `seqhi` as
    /// this direction's program runs last wrote it: whoever writes one writes both.
    pub peer_seqhi: AtomicU32,
    pub seqlo: AtomicU32,
    pub seqhi: AtomicU32,
    pub peer_seqlo: AtomicU32,
    pub max_win: AtomicU16,
    pub peer_max_win: AtomicU16,
    pub rev: AtomicU32,
    pub sws: AtomicU8,
    pub dws: AtomicU8,
    pub unsynced: AtomicU16,
}
const _: () = assert!(std::mem::size_of::<Tail>() == 48);

/// Where the tail starts in each family's entry, and the entries' sizes.
const TAIL4: usize = 16;
const TAIL6: usize = 48;
pub const STRIDE4: usize = 64;
pub const STRIDE6: usize = 128;

/// A flow as the program keys it: words as they are in the packet (read in native order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    pub v6: bool,
    pub proto: u8,
    /// Source and destination port, the four bytes as they are in the packet.
    pub ports: u32,
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

fn word(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// The key word of an ICMP(v6) echo request or reply (a type in `types`) at `l4`: type, code
/// and identifier (bytes 0, 1, 4, 5).
fn echo_word(f: &[u8], l4: usize, types: [u8; 2]) -> Option<u32> {
    let h = f.get(l4..l4 + 8)?;
    types.contains(&h[0]).then(|| u32::from_ne_bytes([h[0], h[1], h[4], h[5]]))
}

fn hmix(h: u32, w: u32) -> u32 {
    let w = w.wrapping_mul(0xcc9e2d51).rotate_left(15).wrapping_mul(0x1b873593);
    (h ^ w).rotate_left(13).wrapping_mul(5).wrapping_add(0xe6546b64)
}

fn hfinal(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85ebca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2ae35);
    h ^ (h >> 16)
}

impl FlowKey {
    /// The key of an Ethernet frame the program would look up: TCP, UDP or an ICMP echo
    /// request or reply right after an IPv4 header without options (not a fragment), or
    /// right after the IPv6 header (ICMPv6 echo). An echo's key holds its type, code and
    /// identifier where the ports are (bytes 0, 1, 4 and 5 of its header), as the programs'.
    pub fn of_frame(f: &[u8]) -> Option<FlowKey> {
        let mut k = FlowKey::default();
        match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
            0x0800 => {
                if f.len() < 38 || f[14] != 0x45 || u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0 {
                    return None;
                }
                k.proto = f[23];
                k.src[0] = word(&f[26..30]);
                k.dst[0] = word(&f[30..34]);
                k.ports = if k.proto == ICMP { echo_word(f, 34, [8, 0])? } else { word(&f[34..38]) };
            }
            0x86dd => {
                if f.len() < 58 || f[14] >> 4 != 6 {
                    return None;
                }
                k.v6 = true;
                k.proto = f[20];
                for w in 0..4 {
                    k.src[w] = word(&f[22 + 4 * w..]);
                    k.dst[w] = word(&f[38 + 4 * w..]);
                }
                k.ports = if k.proto == ICMPV6 { echo_word(f, 54, [128, 129])? } else { word(&f[54..58]) };
            }
            _ => return None,
        }
        let family_icmp = if k.v6 { ICMPV6 } else { ICMP };
        (matches!(k.proto, 6 | 17) || k.proto == family_icmp).then_some(k)
    }

    /// Whether the key is an ICMP or ICMPv6 echo's.
    pub fn echo(&self) -> bool {
        self.proto == ICMP || self.proto == ICMPV6
    }

    /// An echo key's type, code and identifier.
    pub fn echo_parts(&self) -> (u8, u8, u16) {
        let b = self.ports.to_ne_bytes();
        (b[0], b[1], u16::from_be_bytes([b[2], b[3]]))
    }

    /// The other direction of the flow (TCP or UDP).
    pub fn reversed(&self) -> FlowKey {
        let b = self.ports.to_ne_bytes();
        FlowKey { src: self.dst, dst: self.src, ports: u32::from_ne_bytes([b[2], b[3], b[0], b[1]]), ..*self }
    }

    pub fn sport(&self) -> u16 {
        let b = self.ports.to_ne_bytes();
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn dport(&self) -> u16 {
        let b = self.ports.to_ne_bytes();
        u16::from_be_bytes([b[2], b[3]])
    }

    /// The address bytes as in the packet (the first 4 for IPv4).
    pub fn addr_bytes(w: &[u32; 4]) -> [u8; 16] {
        let mut b = [0u8; 16];
        for (i, x) in w.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&x.to_ne_bytes());
        }
        b
    }

    pub fn hash(&self, seed: u32) -> u32 {
        let mut h = seed;
        if self.v6 {
            for w in self.src.iter().chain(self.dst.iter()) {
                h = hmix(h, *w);
            }
        } else {
            h = hmix(hmix(h, self.src[0]), self.dst[0]);
        }
        hfinal(hmix(hmix(h, self.ports), self.proto as u32))
    }
}

enum Mem {
    Map(#[allow(dead_code)] Mapped),
    Heap(#[allow(dead_code)] Vec<u64>),
}

/// ctl byte 3: the entry's flow is translated, its rewrite in the family's `xlats` array at
/// the same index (bpf/fast.h X_XLAT).
pub const X_XLAT: u32 = 1 << 24;
/// `struct xlat4` / `struct xlat6` of bpf/fast.h.
const XSTRIDE4: usize = 16;
const XSTRIDE6: usize = 40;

/// Ones'-complement sum (RFC 1071) of what a rewrite from `from` to `to` adds: the 16-bit
/// words as they are in memory, so the result adds to a checksum field read the same way.
fn csum_diff(from: &[u8], to: &[u8]) -> u16 {
    let mut s = 0u32;
    for (a, b) in from.chunks(2).zip(to.chunks(2)) {
        s += !u16::from_ne_bytes([a[0], a[1]]) as u32 + u16::from_ne_bytes([b[0], b[1]]) as u32;
    }
    xpf_wire::checksum::fold(s)
}

/// One family's table, and the rewrites of its translated flows.
pub struct Table {
    base: *mut u8,
    xbase: *mut u8,
    _mem: Mem,
    _xmem: Mem,
    /// Each entry's owner's record of its flow: xpfd's alone, kept out of the entries (the
    /// program's cache line holds only what it reads or writes).
    slots: Box<[AtomicU32]>,
    mask: u32,
    v6: bool,
    seed: u32,
}

// SAFETY: the memory is shared with the kernel anyway; every field written concurrently is
// accessed through atomics, and keys are written only while their entry is HELD by the writer.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}

impl Table {
    /// The program's maps: flows `mem` and rewrites `xmem`, `entries` long (a power of two).
    pub fn mapped(mem: Mapped, xmem: Mapped, entries: u32, v6: bool, seed: u32) -> Table {
        let (stride, xstride) = if v6 { (STRIDE6, XSTRIDE6) } else { (STRIDE4, XSTRIDE4) };
        assert!(entries.is_power_of_two() && mem.len >= entries as usize * stride);
        assert!(xmem.len >= entries as usize * xstride);
        Table {
            base: mem.ptr,
            xbase: xmem.ptr,
            _mem: Mem::Map(mem),
            _xmem: Mem::Map(xmem),
            slots: zeroed(entries),
            mask: entries - 1,
            v6,
            seed,
        }
    }

    /// A table in ordinary memory (tests).
    pub fn heap(entries: u32, v6: bool, seed: u32) -> Table {
        let (stride, xstride) = if v6 { (STRIDE6, XSTRIDE6) } else { (STRIDE4, XSTRIDE4) };
        assert!(entries.is_power_of_two());
        let mut v = vec![0u64; entries as usize * stride / 8];
        let mut x = vec![0u64; (entries as usize * xstride).div_ceil(8)];
        Table {
            base: v.as_mut_ptr() as *mut u8,
            xbase: x.as_mut_ptr() as *mut u8,
            _mem: Mem::Heap(v),
            _xmem: Mem::Heap(x),
            slots: zeroed(entries),
            mask: entries - 1,
            v6,
            seed,
        }
    }

    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    fn entry(&self, i: u32) -> *mut u8 {
        let stride = if self.v6 { STRIDE6 } else { STRIDE4 };
        // SAFETY: i is masked into the table.
        unsafe { self.base.add((i & self.mask) as usize * stride) }
    }

    pub fn ctl(&self, i: u32) -> &AtomicU32 {
        // SAFETY: offset 0 of an entry, 4-aligned; the memory lives as long as self.
        unsafe { &*(self.entry(i) as *const AtomicU32) }
    }

    pub fn tail(&self, i: u32) -> &Tail {
        let off = if self.v6 { TAIL6 } else { TAIL4 };
        // SAFETY: the tail's offset is 8-aligned in an aligned entry; atomics only.
        unsafe { &*(self.entry(i).add(off) as *const Tail) }
    }

    /// Entry `i`'s owner's record of its flow (written by the owner when it claims it).
    pub fn slot(&self, i: u32) -> &AtomicU32 {
        &self.slots[(i & self.mask) as usize]
    }

    /// The key words: [ports, src.., dst..] as stored.
    fn words(&self, i: u32) -> &[AtomicU32] {
        let n = if self.v6 { 9 } else { 3 };
        // SAFETY: v4: src, dst, ports at 4..16; v6: ports, src, dst at 4..40.
        unsafe { std::slice::from_raw_parts(self.entry(i).add(4) as *const AtomicU32, n) }
    }

    fn write_key(&self, i: u32, k: &FlowKey) {
        let w = self.words(i);
        if self.v6 {
            w[0].store(k.ports, Ordering::Relaxed);
            for j in 0..4 {
                w[1 + j].store(k.src[j], Ordering::Relaxed);
                w[5 + j].store(k.dst[j], Ordering::Relaxed);
            }
        } else {
            w[0].store(k.src[0], Ordering::Relaxed);
            w[1].store(k.dst[0], Ordering::Relaxed);
            w[2].store(k.ports, Ordering::Relaxed);
        }
    }

    fn key_is(&self, i: u32, k: &FlowKey) -> bool {
        let w = self.words(i);
        let l = |j: usize| w[j].load(Ordering::Relaxed);
        if self.v6 {
            l(0) == k.ports && (0..4).all(|j| l(1 + j) == k.src[j] && l(5 + j) == k.dst[j])
        } else {
            l(0) == k.src[0] && l(1) == k.dst[0] && l(2) == k.ports
        }
    }

    /// The entry holding `k` LIVE or HELD, as the program would find it.
    pub fn find(&self, k: &FlowKey) -> Option<u32> {
        let h = k.hash(self.seed);
        for p in 0..PROBE {
            let i = h.wrapping_add(p) & self.mask;
            let c = self.ctl(i).load(Ordering::Acquire);
            match c & 0xff {
                F_EMPTY => return None,
                F_LIVE | F_HELD if (c >> 8) & 0xff == k.proto as u32 && self.key_is(i, k) => return Some(i),
                _ => {}
            }
        }
        None
    }

    /// Claims an entry for `k` (which must not be in the table) for worker `owner`: HELD, key
    /// written, the rest zero. None when the probe window is full.
    pub fn claim(&self, k: &FlowKey, owner: u8) -> Option<u32> {
        let h = k.hash(self.seed);
        let held = F_HELD | (k.proto as u32) << 8 | (owner as u32) << 16;
        for p in 0..PROBE {
            let i = h.wrapping_add(p) & self.mask;
            let c = self.ctl(i).load(Ordering::Acquire);
            if (c & 0xff == F_EMPTY || c & 0xff == F_DEAD)
                && self.ctl(i).compare_exchange(c, held, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                self.write_key(i, k);
                let t = self.tail(i);
                t.bytes.store(0, Ordering::Relaxed);
                t.packets.store(0, Ordering::Relaxed);
                t.unsynced.store(0, Ordering::Relaxed);
                return Some(i);
            }
        }
        None
    }

    /// Marks claimed entry `i` translated: its packets leave as `to` says (the flow's key as
    /// they leave: addresses, ports or echo identifier), the checksums' differences from its
    /// key computed here once.
    pub fn set_rewrite(&self, i: u32, to: &FlowKey) {
        let from = self.key(i);
        let n = if self.v6 { 4 } else { 1 };
        let addrs =
            |k: &FlowKey| -> Vec<u8> { k.src[..n].iter().chain(&k.dst[..n]).flat_map(|w| w.to_ne_bytes()).collect() };
        let addr_diff = csum_diff(&addrs(&from), &addrs(to));
        // An echo's key word holds its type and code too: only the identifier changes.
        let span = if from.echo() { 2..4 } else { 0..4 };
        let port_diff = csum_diff(&from.ports.to_ne_bytes()[span.clone()], &to.ports.to_ne_bytes()[span]);
        let (xstride, words) = if self.v6 { (XSTRIDE6, 9) } else { (XSTRIDE4, 3) };
        // SAFETY: i is masked into the table; the rewrite array has one record per entry,
        // 4-aligned; the program reads it only once the entry is LIVE.
        let x = unsafe {
            std::slice::from_raw_parts(
                self.xbase.add((i & self.mask) as usize * xstride) as *const AtomicU32,
                words + 1,
            )
        };
        for j in 0..n {
            x[j].store(to.src[j], Ordering::Relaxed);
            x[n + j].store(to.dst[j], Ordering::Relaxed);
        }
        x[2 * n].store(to.ports, Ordering::Relaxed);
        let diffs = [addr_diff.to_ne_bytes(), port_diff.to_ne_bytes()].concat();
        x[2 * n + 1].store(u32::from_ne_bytes(diffs.try_into().unwrap()), Ordering::Relaxed);
        let c = self.ctl(i).load(Ordering::Relaxed);
        self.ctl(i).store(c | X_XLAT, Ordering::Relaxed);
    }

    /// The key entry `i` holds.
    fn key(&self, i: u32) -> FlowKey {
        let w = self.words(i);
        let l = |j: usize| w[j].load(Ordering::Relaxed);
        let proto = ((self.ctl(i).load(Ordering::Relaxed) >> 8) & 0xff) as u8;
        let mut k = FlowKey { v6: self.v6, proto, ..Default::default() };
        if self.v6 {
            k.ports = l(0);
            for j in 0..4 {
                k.src[j] = l(1 + j);
                k.dst[j] = l(5 + j);
            }
        } else {
            (k.src[0], k.dst[0], k.ports) = (l(0), l(1), l(2));
        }
        k
    }

    /// Makes a claimed entry visible to the program.
    pub fn publish(&self, i: u32) {
        let c = self.ctl(i).load(Ordering::Relaxed);
        self.ctl(i).store((c & !0xff) | F_LIVE, Ordering::Release);
    }

    /// Stops the program matching the entry (its owner still reads it).
    pub fn hold(&self, i: u32) {
        let c = self.ctl(i).load(Ordering::Relaxed);
        self.ctl(i).store((c & !0xff) | F_HELD, Ordering::Release);
    }

    /// Frees a held entry: dead, or empty when the entry after it is empty (and the dead ones
    /// before it with it), so that misses stop early.
    pub fn free(&self, i: u32) {
        self.ctl(i).store(F_DEAD, Ordering::Release);
        if self.ctl(i.wrapping_add(1) & self.mask).load(Ordering::Acquire) & 0xff != F_EMPTY {
            return;
        }
        let mut j = i;
        for _ in 0..2 * PROBE {
            if self.ctl(j).compare_exchange(F_DEAD, F_EMPTY, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                break;
            }
            j = j.wrapping_sub(1) & self.mask;
        }
    }
}

/// `n` atomics at zero, from zeroed memory the system maps as it is first written (a table
/// of 16M entries costs nothing until its entries are claimed).
fn zeroed(n: u32) -> Box<[AtomicU32]> {
    let v: Box<[u32]> = vec![0u32; n as usize].into_boxed_slice();
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32.
    unsafe { Box::from_raw(Box::into_raw(v) as *mut [AtomicU32]) }
}

/// Sequence-number maximum of what is in `a` and `v` (TCP's modular order), stored.
pub fn seq_max(a: &AtomicU32, v: u32) {
    let mut cur = a.load(Ordering::Relaxed);
    while (v.wrapping_sub(cur) as i32) > 0 {
        match a.compare_exchange_weak(cur, v, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(c) => cur = c,
        }
    }
}

/// Both families' tables and what the program needs to find entries.
pub struct FlowTables {
    pub v4: Table,
    pub v6: Table,
}

impl FlowTables {
    pub fn of(&self, k: &FlowKey) -> &Table {
        if k.v6 {
            &self.v6
        } else {
            &self.v4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32, v6: bool) -> FlowKey {
        FlowKey { v6, proto: 17, ports: 0x3500_0104u32.wrapping_add(i), src: [i, 1, 2, 3], dst: [!i, 4, 5, 6] }
    }

    #[test]
    fn claimed_entries_are_found_when_published_and_held_then_gone_when_freed() {
        for v6 in [false, true] {
            let t = Table::heap(1024, v6, 0x1234_5678);
            let mut at = Vec::new();
            for i in 0..400 {
                let k = key(i, v6);
                assert_eq!(t.find(&k), None);
                let e = t.claim(&k, 1).expect("room at 40% load");
                assert_eq!(t.find(&k), Some(e), "a held entry is its owner's");
                t.publish(e);
                at.push(e);
            }
            for i in 0..400 {
                assert_eq!(t.find(&key(i, v6)), Some(at[i as usize]));
            }
            for i in (0..400).step_by(2) {
                t.hold(at[i]);
                t.free(at[i]);
            }
            for i in 0..400u32 {
                assert_eq!(t.find(&key(i, v6)).is_some(), i % 2 == 1, "key {i}");
            }
            // Freed entries are reused.
            for i in 400..600 {
                let e = t.claim(&key(i, v6), 0).unwrap();
                t.publish(e);
            }
            for i in 400..600 {
                assert!(t.find(&key(i, v6)).is_some());
            }
        }
    }

    use xpf_wire::checksum::{fold, pseudo_v4, pseudo_v6, sum};

    /// A frame: IPv4 or IPv6, then `proto`'s header and 13 bytes of payload, checksums right
    /// (or, with `partial`, the transport's holding the pseudo-header sum, as a sender that
    /// leaves it to offload writes it).
    fn frame(v6: bool, proto: u8, partial: bool) -> Vec<u8> {
        let l4len = if proto == 6 { 20 } else { 8 } + 13;
        let l3 = if v6 { 40 } else { 20 };
        let mut f = vec![0u8; 14 + l3 + l4len];
        let (src, dst) = ([10u8, 0, 1, 2], [198u8, 51, 100, 7]);
        if v6 {
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            f[14] = 0x60;
            f[18..20].copy_from_slice(&(l4len as u16).to_be_bytes());
            f[20] = proto;
            f[21] = 64;
            f[22..38].copy_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            f[38..54].copy_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        } else {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            xpf_wire::ipv4::emit_header(&mut f[14..], src, dst, proto, (20 + l4len) as u16, 64, 9);
        }
        let l4 = 14 + l3;
        for (i, b) in f[l4..].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0x5a;
        }
        if proto == 1 || proto == 58 {
            f[l4] = if proto == 1 { 8 } else { 128 };
            f[l4 + 1] = 0;
        }
        f[l4 + 12] = 0x50; // TCP: data offset
        let off = l4 + csum_off(proto);
        f[off..off + 2].fill(0);
        let ph = pseudo(&f, v6, proto);
        let c = if partial { fold(ph) } else { !fold(sum(&f[l4..], ph)) };
        f[off..off + 2].copy_from_slice(&c.to_be_bytes());
        f
    }

    fn csum_off(proto: u8) -> usize {
        match proto {
            6 => 16,
            17 => 6,
            _ => 2,
        }
    }

    fn pseudo(f: &[u8], v6: bool, proto: u8) -> u32 {
        if v6 {
            let l4len = u16::from_be_bytes([f[18], f[19]]) as u32;
            pseudo_v6(f[22..38].try_into().unwrap(), f[38..54].try_into().unwrap(), proto, l4len)
        } else if proto == 1 {
            0
        } else {
            let l4len = u16::from_be_bytes([f[16], f[17]]) - 20;
            pseudo_v4(f[26..30].try_into().unwrap(), f[30..34].try_into().unwrap(), proto, l4len)
        }
    }

    /// What bpf/steer.c's rewrite() does with an entry's rewrite record: addresses and ports
    /// written, checksums moved by the record's differences, read and written as the
    /// program does (16-bit words in memory order).
    fn rewrite_as_the_program(f: &mut [u8], v6: bool, proto: u8, partial: bool, x: &[u32]) {
        let n = if v6 { 4 } else { 1 };
        let d = x[2 * n + 1].to_ne_bytes();
        let (addr_diff, port_diff) = (u16::from_ne_bytes([d[0], d[1]]) as u32, u16::from_ne_bytes([d[2], d[3]]) as u32);
        let get = |f: &[u8], o: usize| u16::from_ne_bytes([f[o], f[o + 1]]);
        let l3 = 14;
        let l4 = if v6 { 54 } else { 34 };
        if v6 {
            for j in 0..4 {
                f[22 + 4 * j..26 + 4 * j].copy_from_slice(&x[j].to_ne_bytes());
                f[38 + 4 * j..42 + 4 * j].copy_from_slice(&x[4 + j].to_ne_bytes());
            }
        } else {
            f[26..30].copy_from_slice(&x[0].to_ne_bytes());
            f[30..34].copy_from_slice(&x[1].to_ne_bytes());
            let c = !fold(!get(f, l3 + 10) as u32 + addr_diff);
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_ne_bytes());
        }
        let off = l4 + csum_off(proto);
        let diff = port_diff + if proto == 1 { 0 } else { addr_diff };
        let c = get(f, off);
        let c = if partial {
            fold(c as u32 + addr_diff)
        } else if proto != 17 || c != 0 || v6 {
            let c = !fold(!c as u32 + diff);
            if proto == 17 && c == 0 {
                0xffff
            } else {
                c
            }
        } else {
            0
        };
        f[off..off + 2].copy_from_slice(&c.to_ne_bytes());
        let ports = x[2 * n].to_ne_bytes();
        if proto == 6 || proto == 17 {
            f[l4..l4 + 4].copy_from_slice(&ports);
        } else {
            f[l4 + 4..l4 + 6].copy_from_slice(&ports[2..]);
        }
    }

    /// The checksum differences xpfd writes for a translated flow, applied as the XDP program
    /// applies them, leave every checksum right: IPv4 and IPv6; TCP, UDP (a zero checksum
    /// stays zero) and ICMP echoes (the identifier only; ICMPv6 with its pseudo-header); a
    /// checksum left to offload (the pseudo-header sum follows the addresses alone).
    #[test]
    fn rewrites_keep_checksums_right() {
        for v6 in [false, true] {
            for proto in [6u8, 17, if v6 { 58 } else { 1 }] {
                for partial in [false, true] {
                    if partial && (proto == 1 || proto == 58) {
                        continue;
                    }
                    for zero in [false, true] {
                        if zero && (proto != 17 || v6 || partial) {
                            continue;
                        }
                        let mut f = frame(v6, proto, partial);
                        if zero {
                            f[40..42].fill(0);
                        }
                        let k = FlowKey::of_frame(&f).unwrap();
                        let mut to = k;
                        to.src[0] = u32::from_ne_bytes([192, 0, 2, 1]);
                        if v6 {
                            to.dst[3] = u32::from_ne_bytes([0, 0, 0x80, 0x11]);
                        }
                        let pb = k.ports.to_ne_bytes();
                        to.ports = if k.echo() {
                            u32::from_ne_bytes([pb[0], pb[1], 0xc3, 0x51])
                        } else {
                            u32::from_ne_bytes([0xc3, 0x51, pb[2], pb[3]])
                        };
                        let t = Table::heap(64, v6, 5);
                        let i = t.claim(&k, 0).unwrap();
                        t.set_rewrite(i, &to);
                        assert_ne!(t.ctl(i).load(Ordering::Relaxed) & X_XLAT, 0);
                        let xs = if v6 { XSTRIDE6 } else { XSTRIDE4 };
                        // SAFETY: the record just written, in the table's memory.
                        let x: Vec<u32> = unsafe {
                            std::slice::from_raw_parts(t.xbase.add(i as usize * xs) as *const u32, xs / 4).to_vec()
                        };
                        rewrite_as_the_program(&mut f, v6, proto, partial, &x);
                        let what = format!("v6 {v6} proto {proto} partial {partial} zero {zero}");
                        assert_eq!(FlowKey::of_frame(&f), Some(to), "{what}");
                        if !v6 {
                            assert_eq!(fold(sum(&f[14..34], 0)), 0xffff, "IPv4 header: {what}");
                        }
                        let l4 = if v6 { 54 } else { 34 };
                        let ph = pseudo(&f, v6, proto);
                        let c = u16::from_be_bytes([f[l4 + csum_off(proto)], f[l4 + csum_off(proto) + 1]]);
                        if zero {
                            assert_eq!(c, 0, "{what}");
                        } else if partial {
                            assert_eq!(c, fold(ph), "the pseudo-header sum of the new addresses: {what}");
                        } else {
                            assert_eq!(fold(sum(&f[l4..], ph)), 0xffff, "{what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_full_table_refuses() {
        let t = Table::heap(8, false, 7);
        let n = (0..100).filter(|&i| t.claim(&key(i, false), 0).is_some()).count();
        assert_eq!(n, 8);
    }

    #[test]
    fn keys_of_frames_and_their_reverse() {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 1, 1]);
        f[34..38].copy_from_slice(&[0x30, 0x39, 0x00, 0x50]);
        let k = FlowKey::of_frame(&f).unwrap();
        assert_eq!((k.sport(), k.dport(), k.proto, k.v6), (12345, 80, 6, false));
        let r = k.reversed();
        assert_eq!((r.sport(), r.dport()), (80, 12345));
        assert_eq!(r.src[0], k.dst[0]);
        assert_eq!(r.reversed(), k);
        f[23] = 1;
        assert_eq!(FlowKey::of_frame(&f), None, "ICMP");
        f[23] = 17;
        f[20] = 0x20;
        assert_eq!(FlowKey::of_frame(&f), None, "a fragment");
    }

    #[test]
    fn seq_max_follows_modular_order() {
        let a = AtomicU32::new(0xffff_fff0);
        seq_max(&a, 5);
        assert_eq!(a.load(Ordering::Relaxed), 5, "5 is after 0xfffffff0");
        seq_max(&a, 0xffff_fff8);
        assert_eq!(a.load(Ordering::Relaxed), 5);
    }

    /// At half load (the tables' size at FLOWS directions), fewer than one flow in a thousand
    /// finds its probe window full (PROBE 8 refused 0.45%, 16 refuses 0.04%).
    #[test]
    fn half_load_refuses_almost_nothing() {
        let n = 1u32 << 16;
        let t = Table::heap(n, false, 99);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut refused = 0;
        for _ in 0..n / 2 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = FlowKey {
                v6: false,
                proto: 6,
                ports: x as u32,
                src: [(x >> 32) as u32, 0, 0, 0],
                dst: [(x >> 16) as u32, 0, 0, 0],
            };
            match t.claim(&k, 0) {
                Some(e) => t.publish(e),
                None => refused += 1,
            }
        }
        assert!(refused < n / 2 / 1000, "{refused} refused");
    }
}
