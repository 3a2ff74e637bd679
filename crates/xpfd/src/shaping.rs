//! The worker's side of pf's queues: a [`Shaper`] per filtered interface that has a queue
//! tree, built from the ruleset in force (rebuilt when a load changes the trees, the packets
//! waiting carried over), filled with the frames that leave by that interface and emptied
//! into its transmit ring as the tree allows. The worker wakes for the next packet due.

use crate::dataplane::{IoStats, Port};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpf_conf::compile::queues::Queues;
use xpf_shape::coord::Coord;
use xpf_shape::{Out, Pkt, QueueStats, Shaper, DRAIN_BATCH};
use xpf_xdp::packet::offload::{gso_size, gso_type};

/// A held frame that goes out as a GSO packet: its offload fields in [`Pkt::meta`].
const GSO: u64 = 1 << 63;

/// Below this interface bandwidth (bits/s) a GSO packet is held as the segments it stands
/// for (cake's `split-gso`, on below 1 Gbit/s as there): whole, 64 KB takes 13 ms of a
/// 40 Mbit/s link, and a packet of another flow (a ping in an FQ-CoDel queue) waited
/// behind it. Above, the few microseconds a whole packet takes are not worth the copies.
pub const SPLIT_GSO_BELOW: u64 = 1_000_000_000;

#[derive(Default)]
pub struct Shaping {
    /// By port index.
    shapers: Vec<Option<Shaper>>,
    from: Option<Arc<Queues>>,
    /// When the next held packet may leave (ns since the worker's start), if any waits.
    pub due: Option<u64>,
    /// Several workers: where the trees' coordination is published, this worker's index,
    /// the board's generation taken, the coordination of each port's tree, and when this
    /// worker reports next.
    pub board: Option<(Arc<Board>, usize)>,
    seen: u64,
    coords: Vec<Option<Arc<Coord>>>,
    next_sync: u64,
    /// Where a GSO packet's segments are built, one at a time.
    seg: Vec<u8>,
    /// The packets a drain took from a tree and sends next (storage kept).
    batch: Vec<Pkt>,
}

/// The trees' coordination for a ruleset's queues (several workers): published by the
/// coordinator thread, taken by the workers when its generation changes.
#[derive(Default)]
pub struct Board {
    generation: AtomicU64,
    current: Mutex<Option<Arc<Coordination>>>,
    /// The coordinator's period, ns (the workers report at the same pace).
    period: AtomicU64,
}

pub struct Coordination {
    queues: Arc<Queues>,
    trees: Vec<(String, Arc<Coord>)>,
}

/// The coordinator's shortest period: each worker's rates follow the others' demand this
/// often (a TCP flow's RTT through a firewall is longer).
pub const PERIOD: Duration = Duration::from_millis(2);

/// The coordinator thread: follows the ruleset's queue trees, and every period turns the
/// workers' reports into each worker's rates. Its period grows with the trees so that it
/// takes at most about 5% of a core.
pub fn coordinate(board: Arc<Board>, slot: Arc<xpf_conf::reload::Slot>, workers: usize, stop: Arc<AtomicBool>) {
    let mut last = Instant::now();
    let mut period = PERIOD;
    board.period.store(period.as_nanos() as u64, Ordering::Relaxed);
    let mut followed: Option<Arc<Queues>> = None;
    while !stop.load(Ordering::Relaxed) {
        let (_, r) = slot.current();
        let cur = board.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // A reload that left the trees as they were keeps their coordination.
        let same = followed.as_ref().is_some_and(|f| Arc::ptr_eq(f, &r.queues))
            || cur.as_ref().is_some_and(|c| *c.queues == *r.queues);
        followed = Some(r.queues.clone());
        if !same {
            let trees = r.queues.trees.iter().map(|t| (t.ifname.clone(), Arc::new(Coord::new(t, workers)))).collect();
            *board.current.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Arc::new(Coordination { queues: r.queues.clone(), trees }));
            board.generation.fetch_add(1, Ordering::Release);
        } else if let Some(c) = cur {
            let t = Instant::now();
            let dt = t.duration_since(last).as_nanos() as u64;
            for (_, k) in &c.trees {
                k.tick(dt);
            }
            let cost = t.elapsed();
            period = PERIOD.max(cost * 20);
            board.period.store(period.as_nanos() as u64, Ordering::Relaxed);
            last = t;
        }
        std::thread::sleep(period);
    }
}

/// A flow's hash for FQ-CoDel: protocol, addresses and ports (or ICMP's identifier), as the
/// parser finds them (VLAN tags, IPv4 options, IPv6 extension headers); 0 for a frame it does
/// not take. Held frames are hashed again from their bytes when a reload rebuilds a tree.
// PERF: 14.0-14.6 ns a 60-byte IPv4 frame against 12.3 ns for the fixed offsets it replaced
// (FNV over their bytes; a throwaway loop, A/B): a shaped packet's, in a queue with `flows`.
fn flow_hash(f: &[u8]) -> u32 {
    use xpf_state::{Dir, Key, Key4, Key6, Seed};
    // The state table's flow key and its keyed hash; a fixed key: the hash only spreads a
    // queue's flows over its sub-queues.
    const SEED: Seed = Seed::fixed(0x243f_6a88_85a3_08d3);
    let mut pd = xpf_wire::PDesc::default();
    if xpf_wire::parse_ether(f, &mut pd).is_err() {
        return 0;
    }
    let h = if pd.af == xpf_wire::pdesc::AF_INET6 {
        Key6::from_pdesc(&pd, Dir::In, 0).hash_with(&SEED)
    } else {
        Key4::from_pdesc(&pd, Dir::In, 0).hash_with(&SEED)
    };
    (h >> 32) as u32 ^ h as u32
}

impl Shaping {
    /// Whether any interface of this worker is shaped.
    pub fn any(&self) -> bool {
        self.shapers.iter().any(Option::is_some)
    }

    #[inline]
    pub fn on(&self, port: usize) -> bool {
        self.shapers.get(port).is_some_and(Option::is_some)
    }

    /// Follows the ruleset's queue trees: unchanged trees keep their shapers; changed ones
    /// are built anew with the packets waiting moved over (by queue id, the default queue
    /// for one that is gone).
    pub fn refresh(&mut self, queues: &Arc<Queues>, ports: &[Port], now: impl FnOnce() -> u64) {
        if self.from.as_ref().is_some_and(|q| Arc::ptr_eq(q, queues)) {
            return;
        }
        let now = now();
        if self.from.as_deref() == Some(&**queues) {
            self.from = Some(queues.clone());
            return;
        }
        let mut old = std::mem::take(&mut self.shapers);
        self.coords.clear();
        self.seen = 0;
        self.shapers = ports
            .iter()
            .map(|p| {
                let name = ifname(p.ifindex)?;
                queues.trees.iter().find(|t| t.ifname == name).map(Shaper::new)
            })
            .collect();
        for (i, o) in old.iter_mut().enumerate() {
            let (Some(o), Some(Some(n))) = (o.as_mut(), self.shapers.get_mut(i)) else { continue };
            while let Some(p) = o.take_any() {
                let h = flow_hash(&p.buf);
                n.enqueue(p.meta as u16, p, h, now);
            }
        }
        self.from = Some(queues.clone());
    }

    /// Holds frame `f` of `len` bytes (built by `fill` into a buffer of the shaper's) in queue
    /// `qid` of port `port`'s tree. `gso`: the frame goes out as a GSO packet (see
    /// [`gso_meta`]). A frame for a full FIFO queue is dropped and counted unbuilt: false.
    pub fn hold(
        &mut self,
        port: usize,
        qid: u16,
        gso: u64,
        now: u64,
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        let Some(Some(sh)) = self.shapers.get_mut(port) else { return false };
        if gso == 0 && sh.refuse(qid, len) {
            return false;
        }
        let mut b = sh.buffer();
        fill(&mut b);
        // The flow's hash only for a queue that spreads its flows (FQ-CoDel).
        let h = if sh.hashes(qid) { flow_hash(&b) } else { 0 };
        self.due = Some(now);
        if gso != 0 && sh.root_bits() < SPLIT_GSO_BELOW {
            let size = gso_size(Gso::of(&b, gso).opts) as usize;
            let cut = xpf_wire::offload::segment_gso(&b, size, &mut self.seg, |s| {
                let mut nb = sh.buffer();
                nb.extend_from_slice(s);
                sh.enqueue(qid, Pkt { buf: nb, enq: 0, meta: qid as u64, extra: 0 }, h, now);
            });
            if cut {
                sh.recycle(b);
                return true;
            }
        }
        let extra = if gso != 0 { gso_extra(&b, gso) } else { 0 };
        sh.enqueue(qid, Pkt { buf: b, enq: 0, meta: gso | qid as u64, extra }, h, now);
        true
    }

    /// Several workers: takes a new coordination when one is published, and every period
    /// reports this worker's queues and takes its rates.
    pub fn coordinate(&mut self, now: impl FnOnce() -> u64) {
        let Some((board, w)) = &self.board else { return };
        if !self.shapers.iter().any(Option::is_some) {
            return;
        }
        let now = now();
        let g = board.generation.load(Ordering::Acquire);
        if g != self.seen {
            let cur = board.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // The coordination of the trees this worker has (else it waits for the next).
            if let Some(c) = cur.filter(|c| self.from.as_deref() == Some(&*c.queues)) {
                self.coords = self
                    .shapers
                    .iter()
                    .map(|sh| {
                        let name = sh.as_ref()?.ifname();
                        c.trees.iter().find(|(i, _)| i == name).map(|(_, k)| k.clone())
                    })
                    .collect();
                self.seen = g;
            }
        }
        if now < self.next_sync {
            return;
        }
        let w = *w;
        let t = Instant::now();
        for (sh, k) in self.shapers.iter_mut().zip(&self.coords) {
            if let (Some(sh), Some(k)) = (sh, k) {
                sh.sync(k, w, now);
            }
        }
        // A report walks every queue of the trees: with tens of thousands it costs the worker
        // a few hundred microseconds, so it comes no more often than 20 times that (5% of
        // the worker at most), as the coordinator's own period.
        let cost = t.elapsed().as_nanos() as u64;
        self.next_sync = now + board.period.load(Ordering::Relaxed).max(cost * 20);
        // A new rate may let a waiting packet go sooner.
        if self.due.is_some() {
            self.due = Some(now);
        }
    }

    /// Sends what the trees let go now; notes when the next may.
    pub fn drain(&mut self, ports: &mut [Port], io: &mut IoStats, now: u64) {
        if self.due.is_none_or(|d| d > now) {
            return;
        }
        let mut due: Option<u64> = None;
        for (p, sh) in self.shapers.iter_mut().enumerate() {
            let Some(sh) = sh else { continue };
            let port = &mut ports[p].io;
            loop {
                if sh.backlog() > 0 && !port.room_for_answers() {
                    // The ring is full: again at the next round.
                    due = Some(now);
                    break;
                }
                // A quarter of the ring is free: room for a batch.
                let last = sh.dequeue_batch(now, &mut self.batch, DRAIN_BATCH);
                for pkt in self.batch.drain(..) {
                    let sent = if pkt.meta & GSO != 0 {
                        let g = Gso::of(&pkt.buf, pkt.meta);
                        port.tx_gso(&pkt.buf, gso_type(g.opts), gso_size(g.opts), g.start, g.offset, g.hdr_end)
                    } else {
                        port.tx_copy(&pkt.buf).is_some()
                    };
                    if sent {
                        io.forwarded += 1;
                    } else {
                        io.tx_full += 1;
                    }
                    sh.recycle(pkt.buf);
                }
                match last {
                    Some(Out::Wait(t)) => {
                        due = Some(due.map_or(t, |d| d.min(t)));
                        break;
                    }
                    Some(_) => break,
                    None => {}
                }
            }
            port.flush();
        }
        self.due = due;
    }

    /// Each queue's interface, name and counters.
    pub fn stats(&self) -> Vec<(String, String, QueueStats)> {
        let mut v = Vec::new();
        for sh in self.shapers.iter().flatten() {
            for (name, s) in sh.stats() {
                v.push((sh.ifname().to_string(), name.to_string(), s));
            }
        }
        v
    }
}

/// [`Pkt::meta`] above the queue id (bits 0-15) for a GSO packet: packet mode's options word
/// (its type and segment size, bits 8-31) at 16, the checksum's start at 40 and offset
/// (6 or 16) at 56.
pub fn gso_meta(opts: u32, start: u16, offset: u16) -> u64 {
    GSO | ((opts as u64 >> 8) << 16) | (start as u64) << 40 | ((offset as u64 & 0x3f) << 56)
}

/// What a GSO packet (`gso`: its [`gso_meta`]) adds on the wire to its frame `b`: the
/// headers, from the Ethernet header to the transport header's end, again in each segment
/// after the first. The shaper charges the wire's bytes, as the segments will be sent.
pub fn gso_extra(b: &[u8], gso: u64) -> u32 {
    let g = Gso::of(b, gso);
    let (size, hdr) = (gso_size(g.opts) as usize, g.hdr_end as usize);
    if size == 0 || b.len() <= hdr {
        return 0;
    }
    let segs = (b.len() - hdr).div_ceil(size);
    (segs.saturating_sub(1) * hdr) as u32
}

/// A held GSO packet's offload fields, from its [`gso_meta`] word and its frame: packet
/// mode's options word, the checksum's start and offset, and where its headers end (the
/// transport header's end: TCP's data offset, UDP's 8 bytes).
struct Gso {
    opts: u32,
    start: u16,
    offset: u16,
    hdr_end: u16,
}

impl Gso {
    fn of(b: &[u8], m: u64) -> Gso {
        let (opts, start, offset) = (((m >> 16) as u32 & 0xff_ffff) << 8, (m >> 40) as u16, (m >> 56) as u16 & 0x3f);
        let l4 = b.get(start as usize..).unwrap_or(&[]);
        let hl = if offset == 16 { (l4.get(12).copied().unwrap_or(0x50) >> 4) as u16 * 4 } else { 8 };
        Gso { opts, start, offset, hdr_end: start + hl }
    }
}

fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 KB TCP segment of 1,448-byte segments is charged its 45 segments' headers: 66
    /// bytes (Ethernet, IPv4, TCP with timestamps) again in 44 of them; a UDP one its 8-byte
    /// header's; a packet of one segment nothing more.
    #[test]
    fn a_gso_packet_is_charged_its_segments_headers() {
        let opts = |size: u32| (size << 16) | (1 << 8); // packet mode's options word
        let mut f = vec![0u8; 66 + 45 * 1448 - 100];
        f[34 + 12] = 0x80; // data offset 32
        assert_eq!(gso_extra(&f, gso_meta(opts(1448), 34, 16)), 44 * 66);
        let udp = vec![0u8; 42 + 3 * 1400];
        assert_eq!(gso_extra(&udp, gso_meta(opts(1400), 34, 6)), 2 * 42);
        let one = vec![0u8; 66 + 1000];
        assert_eq!(gso_extra(&one, gso_meta(opts(1448), 34, 16)), 0);
    }

    /// A flow's packets share a sub-queue whatever their IP ID and checksum (a hash over
    /// them made every packet a flow of its own, and FQ-CoDel did nothing).
    #[test]
    fn a_flows_packets_hash_alike_whatever_their_ip_id() {
        let frame = |id: u16, sport: u16| {
            let mut f = vec![0u8; 60];
            f[12] = 8;
            xpf_wire::ipv4::emit_header(&mut f[14..], [10, 0, 0, 1], [10, 0, 0, 2], 6, 46, 64, id);
            f[34..36].copy_from_slice(&sport.to_be_bytes());
            f[36..38].copy_from_slice(&80u16.to_be_bytes());
            f[46] = 0x50; // data offset 20
            f
        };
        assert_eq!(flow_hash(&frame(1, 4000)), flow_hash(&frame(999, 4000)));
        assert_ne!(flow_hash(&frame(1, 4000)), flow_hash(&frame(1, 4001)));
        // Under a VLAN tag: the same flow.
        let mut tagged = frame(7, 4000);
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
        assert_eq!(flow_hash(&tagged), flow_hash(&frame(1, 4000)));
    }
}
