//! Fragment reassembly, as pf's `set reassemble yes` does it: the fragments of a datagram are
//! held until it is complete, then the datagram is filtered once, as a whole (its ports, its
//! state, its rule), and its fragments go on unchanged or are dropped together.
//!
//! [`Frags`] keeps copies of held fragments, keyed by (family, protocol, addresses, id). It
//! is bounded three ways: `set limit frags` fragments in all (past it the oldest datagrams
//! are flushed, as pf does, so a flood can evict but not freeze reassembly), 64 fragments per
//! datagram (pf's PF_FRAG_ENTRY_LIMIT), and the `frag` timeout. A fragment that overlaps one
//! already held (teardrop, or the RFC 5722 attacks on IPv6) drops the whole datagram, and the
//! datagram's later fragments are dropped until its timeout, all counted. Fragments are rare
//! on the paths xpf serves, so this path copies and allocates; the per-packet path of whole
//! packets does not come here.

use std::collections::{HashMap, VecDeque};
use xpf_wire::pdesc::{pdf, AF_INET};
use xpf_wire::{ipv6, Addr, PDesc, Reason};

/// pf's PF_FRAG_ENTRY_LIMIT: fragments per datagram.
pub const PER_DATAGRAM: usize = 64;
/// The largest IP payload a datagram can reassemble to.
const MAX_PAYLOAD: u32 = 65535;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FragKey {
    af: u8,
    proto: u8,
    src: Addr,
    dst: Addr,
    id: u32,
}

/// One held fragment: a copy of its frame, and where its data is.
#[derive(Debug, Clone)]
pub struct Piece {
    pub frame: Vec<u8>,
    l3: u16,
    /// Data start and end in the frame.
    data: u16,
    end: u16,
    /// Offset of its data in the datagram.
    off: u32,
}

impl Piece {
    /// A fragment `frame` described by `pd`, as a piece to assemble.
    pub fn of(frame: &[u8], pd: &PDesc) -> Piece {
        let data = data_offset(frame, pd);
        let end = (pd.l3_off as usize + pd.ip_len as usize).min(frame.len()).max(data);
        Piece { frame: frame.to_vec(), l3: pd.l3_off, data: data as u16, end: end as u16, off: pd.frag_off as u32 }
    }
    fn len(&self) -> u32 {
        (self.end - self.data) as u32
    }
    fn stop(&self) -> u32 {
        self.off + self.len()
    }
}

/// Where fragment `frame`'s data starts: after the IPv4 header, or after the IPv6 fragment
/// header (which, in a first fragment, other headers may follow: the chain is walked again
/// here rather than widening every packet's descriptor for it).
fn data_offset(frame: &[u8], pd: &PDesc) -> usize {
    if pd.af == AF_INET || pd.flags & pdf::NOT_FIRST_FRAG != 0 && pd.frag_off != 0 {
        return pd.l4_off as usize;
    }
    let l3 = pd.l3_off as usize;
    let f = frame.get(l3..).and_then(|b| ipv6::Packet::new_checked(b).ok()).and_then(|ip| ip.walk().ok()?.fragment);
    match f {
        Some(f) => l3 + ipv6::HEADER_LEN + f.hdr as usize + 8,
        None => usize::MAX,
    }
}

/// Whether `pieces`, in datagram order, cover a datagram from its start to its end.
pub fn complete(pieces: &[Piece]) -> bool {
    !pieces.is_empty() && pieces[0].off == 0 && pieces.windows(2).all(|w| w[0].stop() == w[1].off)
}

#[derive(Debug)]
struct Datagram {
    pieces: Vec<Piece>,
    /// The datagram's length, once its last fragment came.
    total: Option<u32>,
    deadline: u32,
    /// Dropped (overlap, too many, too long): later fragments go too, until the deadline.
    bad: bool,
}

/// Reassembly counters (`xpfctl -s info`, "Fragments").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FragCounters {
    /// Fragments held now.
    pub held: u64,
    pub reassembled: u64,
    /// Datagrams dropped because fragments overlapped (teardrop).
    pub overlaps: u64,
    /// Datagrams over 64 fragments or 65,535 bytes.
    pub oversized: u64,
    /// Fragments with a bad length (not a multiple of 8 before the last, past the end).
    pub bad: u64,
    /// Fragments dropped because their datagram had been dropped.
    pub after_drop: u64,
    /// Incomplete datagrams dropped at the frag timeout.
    pub timeouts: u64,
    /// Incomplete datagrams flushed to make room (set limit frags).
    pub flushed: u64,
}

/// What became of a fragment.
#[derive(Debug)]
pub enum Outcome {
    /// Held, waiting for the rest.
    Held,
    /// It completed its datagram: the fragments, in datagram order.
    Complete(Vec<Piece>),
    /// Dropped with this reason, along with `n` fragments of its datagram held before.
    Drop(Reason, u32),
}

pub struct Frags {
    map: HashMap<FragKey, Datagram>,
    order: VecDeque<(u32, FragKey)>,
    /// `set limit frags`: fragments held at most.
    pub limit: u32,
    /// The `frag` timeout, seconds.
    pub timeout: u32,
    pub counters: FragCounters,
    /// Fragments flushed to make room, not yet reported by `expire`.
    flushed_pieces: u32,
}

impl Frags {
    pub fn new(limit: u32, timeout: u32) -> Frags {
        Frags {
            map: HashMap::new(),
            order: VecDeque::new(),
            limit,
            timeout,
            counters: FragCounters::default(),
            flushed_pieces: 0,
        }
    }

    /// Datagrams in reassembly (and dropped ones remembered until their timeout).
    pub fn datagrams(&self) -> usize {
        self.map.len()
    }

    fn key(pd: &PDesc) -> FragKey {
        // IPv6 fragments of one datagram may name different upper layers (the first one's
        // chain goes past the fragment header): the 32-bit id is enough there.
        let proto = if pd.af == AF_INET { pd.proto } else { 0 };
        FragKey { af: pd.af, proto, src: pd.src, dst: pd.dst, id: pd.frag_id }
    }

    /// Takes fragment `frame` (described by `pd`) at `now`.
    pub fn insert(&mut self, frame: &[u8], pd: &PDesc, now: u32) -> Outcome {
        let ip_end = (pd.l3_off as usize + pd.ip_len as usize).min(frame.len());
        let data = data_offset(frame, pd);
        if data > ip_end || data == usize::MAX {
            self.counters.bad += 1;
            return Outcome::Drop(Reason::Fragment, 0);
        }
        let off = pd.frag_off as u32;
        let len = (ip_end - data) as u32;
        let more = pd.flags & pdf::MORE_FRAGS != 0;
        let key = Self::key(pd);
        if more && (len == 0 || !len.is_multiple_of(8)) {
            self.counters.bad += 1;
            return Outcome::Drop(Reason::Fragment, 0);
        }
        if !self.map.contains_key(&key) {
            if self.held() >= self.limit as u64 || self.map.len() >= self.limit as usize {
                self.flush_oldest();
            }
            let deadline = now.saturating_add(self.timeout);
            self.map.insert(key, Datagram { pieces: Vec::new(), total: None, deadline, bad: false });
            self.order.push_back((deadline, key));
        }
        let d = self.map.get_mut(&key).unwrap();
        if d.bad {
            self.counters.after_drop += 1;
            return Outcome::Drop(Reason::Fragment, 0);
        }
        let stop = off + len;
        let pos = d.pieces.partition_point(|p| p.off < off);
        let overlaps = (pos > 0 && d.pieces[pos - 1].stop() > off) || d.pieces.get(pos).is_some_and(|n| n.off < stop);
        let past_end = d.total.is_some_and(|t| stop > t || (!more && stop != t))
            || (!more && d.pieces.last().is_some_and(|p| p.stop() > stop));
        let reason = if overlaps {
            self.counters.overlaps += 1;
            Some(Reason::Fragment)
        } else if stop > MAX_PAYLOAD || d.pieces.len() >= PER_DATAGRAM {
            self.counters.oversized += 1;
            Some(Reason::Fragment)
        } else if past_end {
            self.counters.bad += 1;
            Some(Reason::Fragment)
        } else {
            None
        };
        if let Some(r) = reason {
            let n = d.pieces.len() as u32;
            d.pieces = Vec::new();
            d.bad = true;
            self.counters.held -= n as u64;
            return Outcome::Drop(r, n);
        }
        if !more {
            d.total = Some(stop);
        }
        let piece = Piece { frame: frame.to_vec(), l3: pd.l3_off, data: data as u16, end: ip_end as u16, off };
        d.pieces.insert(pos, piece);
        self.counters.held += 1;
        let complete = d.total.is_some_and(|t| complete(&d.pieces) && d.pieces.last().unwrap().stop() == t);
        if !complete {
            return Outcome::Held;
        }
        let d = self.map.remove(&key).unwrap();
        self.counters.held -= d.pieces.len() as u64;
        self.counters.reassembled += 1;
        Outcome::Complete(d.pieces)
    }

    fn held(&self) -> u64 {
        self.counters.held
    }

    /// Makes room: drops the oldest tenth of the datagrams (at least one). Returns the
    /// fragments dropped.
    fn flush_oldest(&mut self) -> u32 {
        let n = (self.map.len() / 10).max(1);
        let mut dropped = 0;
        for _ in 0..n {
            let Some((_, k)) = self.order.pop_front() else { break };
            if let Some(d) = self.map.remove(&k) {
                if !d.pieces.is_empty() {
                    self.counters.flushed += 1;
                }
                dropped += d.pieces.len() as u32;
                self.counters.held -= d.pieces.len() as u64;
            }
        }
        self.flushed_pieces += dropped;
        dropped
    }

    /// Drops the datagrams whose timeout passed at `now`. Returns the fragments dropped
    /// (and those flushed to make room since the last call).
    pub fn expire(&mut self, now: u32) -> u32 {
        let mut dropped = std::mem::take(&mut self.flushed_pieces);
        while let Some(&(deadline, k)) = self.order.front() {
            if deadline > now {
                break;
            }
            self.order.pop_front();
            if let Some(d) = self.map.get(&k) {
                if d.deadline == deadline {
                    let d = self.map.remove(&k).unwrap();
                    if !d.bad {
                        self.counters.timeouts += 1;
                    }
                    dropped += d.pieces.len() as u32;
                    self.counters.held -= d.pieces.len() as u64;
                }
            }
        }
        dropped
    }

    /// The whole datagram of `pieces` (in datagram order, complete) as one frame: the first
    /// fragment's headers, without the fragment header (IPv6) or fragment fields (IPv4), its
    /// lengths and checksum set, and every fragment's data. None if the headers do not parse.
    pub fn assemble(pieces: &[Piece], buf: &mut Vec<u8>) -> Option<()> {
        let first = pieces.first()?;
        let l3 = first.l3 as usize;
        let f = &first.frame;
        buf.clear();
        let total: usize = pieces.iter().map(|p| p.len() as usize).sum();
        if f.get(l3)? >> 4 == 4 {
            let hl = ((f[l3] & 0x0f) as usize) * 4;
            buf.extend_from_slice(f.get(..l3 + hl)?);
            for p in pieces {
                buf.extend_from_slice(p.frame.get(p.data as usize..p.end as usize)?);
            }
            let len = (hl + total).min(u16::MAX as usize) as u16;
            let h = &mut buf[l3..l3 + hl];
            h[2..4].copy_from_slice(&len.to_be_bytes());
            // Keep DF, clear MF and the offset.
            h[6] &= 0x40;
            h[7] = 0;
            h[10..12].copy_from_slice(&[0, 0]);
            let c = xpf_wire::checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            let ip = ipv6::Packet::new_checked(f.get(l3..)?).ok()?;
            let fr = ip.walk().ok()?.fragment?;
            let unfrag = ipv6::HEADER_LEN + fr.hdr as usize;
            buf.extend_from_slice(f.get(..l3 + unfrag)?);
            buf[l3 + fr.named_at as usize] = fr.next;
            for p in pieces {
                buf.extend_from_slice(p.frame.get(p.data as usize..p.end as usize)?);
            }
            let plen = (fr.hdr as usize + total).min(u16::MAX as usize) as u16;
            buf[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        }
        Some(())
    }
}
