//! AF_PACKET ports (TPACKET_V2 rings): the fallback where XDP cannot be attached.
//!
//! A packet socket is a tap, not a diversion: the kernel goes on processing what the socket
//! copies. So packet mode has two halves. In the kernel, a `table netdev xpfd` ingress chain
//! per filtered interface ([`Guard`]) drops every IPv4/IPv6 frame the kernel would forward,
//! and lets through what the steering program would have passed up in XDP mode (non-IP,
//! neighbour discovery, TTL/hop limit expiring, traffic for this host, broadcast and
//! multicast). Taps see a frame before the ingress hook, so xpfd still gets it. In xpfd, each
//! received frame is classified the same way and, when it is to be forwarded, routed with the
//! kernel's FIB and neighbour table over rtnetlink (answers cached for a second), and the
//! answer written in the ring's reserved headroom in front of the frame exactly as the
//! steering program writes it: the dataplane cannot tell the two kinds of port apart.
//!
//! With the fast path ([`crate::skbpath`]) no socket taps the filtered interface: its tcx
//! program forwards established flows itself, leaves to the kernel what the kernel must see,
//! and redirects the rest into the ingress of an ifb device, which this port's socket reads
//! instead; the port still sends out of the interface. With several workers, each has a
//! socket per interface and the sockets of a device share its frames
//! ([`PacketPort::join_fanout`]).
//!
//! Like XDP mode it fails closed: if xpfd dies, the ingress chains stay and transit traffic
//! stops. `nft delete table netdev xpfd` opens the box again.

use crate::netlink::{self, FibRoute};
use crate::steer::{Route, META_LEN};
use crate::xsk::{map_shared, setopt, Desc, XskStats};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// TPACKET_V2 rings: per-frame status words, so each frame reaches xpfd as soon as the kernel
/// wrote it (TPACKET_V3 hands over whole blocks, retired by a timer when not full: a
/// millisecond's wait for a lone packet, and a timer interrupt a millisecond on every socket,
/// which cost forwarded traffic ~15% of its throughput on a 2-vCPU VM).
const BLOCK: usize = 1 << 16;
const RX_FRAME: usize = 2048;
const RX_FRAMES: usize = 2048;
const RX_LEN: usize = RX_FRAME * RX_FRAMES;
/// The ring of the socket for new connections (TCP SYNs; [`PacketPort::open_syn_lane`]).
const SYN_FRAMES: usize = 1024;
/// Descriptor addresses from here on are in that ring.
const SYN_BASE: u64 = 1 << 39;
const TX_FRAME: usize = 2048;
const TX_FRAMES: usize = 1024;
/// Where a TX frame's data starts: TPACKET2_HDRLEN less the sockaddr_ll (the kernel's rule
/// without PACKET_TX_HAS_OFF).
const TX_DATA: usize = 32;
/// tpacket2_hdr: tp_status at 0, tp_len 4, tp_snaplen 8, tp_mac 12; the sockaddr_ll at 32
/// (its sll_pkttype at 42).
const H_LEN: usize = 4;
const H_SNAPLEN: usize = 8;
const H_MAC: usize = 12;
const H_PKTTYPE: usize = 42;
/// A frame longer than a ring slot (a GSO packet: up to 64 KB) comes whole through the
/// socket's receive queue (PACKET_COPY_THRESH), its slot marked TP_STATUS_COPY; the
/// copies wait in these buffers until `rx_done`.
const TP_STATUS_COPY: u32 = 1 << 1;
const PACKET_COPY_THRESH: i32 = 7;
const COPY_SLOT: usize = 65536 + 512;
const COPY_SLOTS: usize = 8;
/// Descriptor addresses from here on are in the copy buffers, not the ring.
const COPY_BASE: u64 = 1 << 40;
/// Headroom asked of the RX ring in front of each frame, for the routing metadata.
const RESERVE: u32 = 64;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// `struct virtio_net_hdr` (PACKET_VNET_HDR): in front of each received frame, and of each
/// one sent. It says what the sender left to offload (a checksum, a segmentation), so that
/// xpfd can leave the same to the kernel on the way out.
const VNET: usize = 10;
const VNET_NEEDS_CSUM: u8 = 1;
const PACKET_VNET_HDR: i32 = 15;

/// What a received frame's `Desc::options` carries in packet mode: its sender left the
/// TCP/UDP checksum to offload (bit 0), and it is a GSO packet to be segmented on the way out
/// (gso_type in bits 8-15, the segment size in bits 16-31).
pub mod offload {
    pub const NEEDS_CSUM: u32 = 1;
    #[inline]
    pub fn gso_type(options: u32) -> u8 {
        (options >> 8) as u8
    }
    #[inline]
    pub fn gso_size(options: u32) -> u16 {
        (options >> 16) as u16
    }
}

/// Why a received frame was not handed to the filter (slots of [`PACKET_COUNTERS`]): (key
/// for JSON and metrics, text for `xpfctl -s info`).
pub const PACKET_COUNTERS: [(&str, &str); 8] = [
    ("not_ip", "not IP, left to the kernel"),
    ("for_host", "for this host, left to the kernel"),
    ("ttl_expiring", "TTL/hop limit expiring, left to the kernel"),
    ("no_route", "no route, dropped"),
    ("over_mtu", "over the egress MTU or truncated, dropped"),
    ("to_filter", "to the filter"),
    ("other_mac", "not for this host's MAC, ignored"),
    ("neighbour_discovery", "neighbour discovery, left to the kernel"),
];

/// One interface's packet socket with its RX and TX rings.
pub struct PacketPort {
    fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
    rx: RxRing,
    /// The socket for new connections, on a device of its own (`None`: they share `rx`).
    syn: Option<SynLane>,
    /// Frames too long for a ring slot, and how many slots the last burst used.
    copies: Vec<u8>,
    copies_used: usize,
    tx_head: usize,
    tx_pending: Vec<usize>,
    /// The frame queued last (its ring index), for a checksum request.
    tx_last: usize,
    /// A second socket on the interface, without rings, for GSO packets (a socket with a TX
    /// ring sends only from the ring); opened at the first one.
    gso: Option<OwnedFd>,
    ifindex: u32,
    /// With the fast path, the socket reads an ifb device that the kernel's program fills
    /// ([`crate::skbpath`]): every frame there is another host's as the ifb sees it, and the
    /// TX ring is sent out of `ifindex` by address.
    diverted: bool,
    stats: XskStats,
    pub counters: [u64; 8],
    router: Router,
}

// SAFETY: the mapping belongs to the port; the port moves to its worker thread and is used
// there only.
unsafe impl Send for PacketPort {}

impl PacketPort {
    /// See [`Router::resolved`].
    pub fn neighbour_resolved(&mut self, ifindex: u32, nexthop: &[u8; 16], mac: [u8; 6]) {
        self.router.resolved(ifindex, nexthop, mac);
    }

    /// Opens a packet socket for interface `ifindex` with a TPACKET_V2 RX ring and a TX ring:
    /// it receives from `rx_from` (`ifindex` itself, or the ifb device the fast path fills for it)
    /// and sends out of `ifindex`.
    pub fn open(ifindex: u32, rx_from: u32) -> io::Result<PacketPort> {
        let fd = ring_socket()?;
        let raw = fd.as_raw_fd();
        setopt(raw, libc::SOL_PACKET, PACKET_COPY_THRESH, &1i32)?;
        // Room on the receive queue for the copies of long frames: a burst of GSO packets.
        setopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(8i32 << 20))?;
        setopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &ring_req(RX_FRAME, RX_FRAMES))?;
        setopt(raw, libc::SOL_PACKET, libc::PACKET_TX_RING, &ring_req(TX_FRAME, TX_FRAMES))?;
        let map_len = RX_LEN + TX_FRAME * TX_FRAMES;
        let map = map_shared(raw, map_len, 0)?;
        let port = PacketPort {
            fd,
            map,
            map_len,
            rx: RxRing { map, frames: RX_FRAMES, head: 0, held: Vec::with_capacity(64), base: 0 },
            syn: None,
            copies: vec![0; COPY_SLOT * COPY_SLOTS],
            copies_used: 0,
            tx_head: 0,
            tx_pending: Vec::with_capacity(64),
            tx_last: 0,
            gso: None,
            ifindex,
            diverted: rx_from != ifindex,
            stats: XskStats::default(),
            counters: [0; 8],
            router: Router::default(),
        };
        bind_all(raw, rx_from)?;
        Ok(port)
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Numbers the socket among its device's (the worker it serves: `queue` in the
    /// counters, as an AF_XDP socket's queue).
    pub fn set_member(&mut self, worker: u32) {
        self.stats.queue = worker;
    }

    pub fn syn_fd(&self) -> Option<i32> {
        self.syn.as_ref().map(|l| l.fd.as_raw_fd())
    }

    /// Opens the port's socket for new connections: an RX ring on device `from` (the second
    /// ifb device the tcx program sends TCP SYNs without ACK into). `rx_burst` serves it
    /// after the first, so a SYN flood fills and overflows its ring only.
    pub fn open_syn_lane(&mut self, from: u32) -> io::Result<()> {
        let fd = ring_socket()?;
        let raw = fd.as_raw_fd();
        setopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &ring_req(RX_FRAME, SYN_FRAMES))?;
        let len = RX_FRAME * SYN_FRAMES;
        let map = map_shared(raw, len, 0)?;
        let ring = RxRing { map, frames: SYN_FRAMES, head: 0, held: Vec::with_capacity(64), base: SYN_BASE };
        let lane = SynLane { fd, ring, map_len: len };
        bind_all(raw, from)?;
        self.syn = Some(lane);
        Ok(())
    }

    /// Puts the socket in a fanout group with the other workers' sockets on the same device:
    /// each frame goes to one of them, chosen by the kernel's symmetric flow hash
    /// (PACKET_FANOUT_HASH: addresses and ports, the same both ways), and the socket for new
    /// connections in another with theirs (a group is one device's). `groups`: the groups to
    /// join, or None to found them with ids the kernel picks (returned, for the others).
    /// Frames the hash gives a worker that does not own the flow (the owner is a hash of the
    /// addresses alone, so that fragments meet their flow) are handed off by the workers.
    pub fn join_fanout(&self, groups: Option<(u16, u16)>) -> io::Result<(u16, u16)> {
        let main = fanout(self.fd.as_raw_fd(), groups.map(|g| g.0))?;
        let syn = match &self.syn {
            Some(l) => fanout(l.fd.as_raw_fd(), groups.map(|g| g.1))?,
            None => 0,
        };
        Ok((main, syn))
    }

    fn tx_frame(&self, i: usize) -> *mut u8 {
        // SAFETY: i < TX_FRAMES, inside the mapping after the RX ring.
        unsafe { self.map.add(RX_LEN + i * TX_FRAME) }
    }

    fn status(p: *mut u8) -> &'static AtomicU32 {
        // SAFETY: p is a 4-byte aligned status word inside the mapping, shared with the kernel.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    fn u32_at(p: *const u8, off: usize) -> u32 {
        // SAFETY: callers pass offsets inside a header the kernel wrote.
        unsafe { std::ptr::read_unaligned(p.add(off).cast::<u32>()) }
    }

    /// The next frame of socket `fd`'s receive queue (a copy of a frame too long for its ring
    /// slot), read into copy slot `c` behind room for the metadata; its length.
    fn read_copy(&mut self, fd: i32, c: usize) -> Option<usize> {
        let buf = &mut self.copies[c * COPY_SLOT..(c + 1) * COPY_SLOT];
        // The virtio_net_hdr comes first, right in front of the frame.
        let at = META_LEN - VNET;
        // SAFETY: reading into a buffer we own, of the length passed.
        let r = unsafe { libc::recv(fd, buf[at..].as_mut_ptr().cast(), COPY_SLOT - at, libc::MSG_DONTWAIT) };
        (r >= VNET as isize).then(|| r as usize - VNET)
    }

    /// Up to `out.len()` frames for the filter, from the RX ring (and, for frames too long
    /// for a slot, the receive queue), each with the routing metadata in front of it. What
    /// the filter must not see is counted and given back at once. The ring of the socket for
    /// new connections gets what is left of the batch, and at least an eighth of it while it
    /// has frames waiting (as an AF_XDP queue's second socket).
    pub fn rx_burst(&mut self, out: &mut [Desc]) -> usize {
        let now = Instant::now();
        self.copies_used = 0;
        let cap = out.len();
        let syn_waiting = self.syn.as_ref().is_some_and(|l| l.ring.ready());
        let first = if syn_waiting { cap - cap / 8 } else { cap };
        let fd = self.fd.as_raw_fd();
        let mut ring = std::mem::replace(&mut self.rx, RxRing::NONE);
        let n = self.rx_ring(&mut ring, fd, now, &mut out[..first]);
        self.rx = ring;
        if !syn_waiting {
            return n;
        }
        let Some(mut lane) = self.syn.take() else { return n };
        let m = self.rx_ring(&mut lane.ring, lane.fd.as_raw_fd(), now, &mut out[n..]);
        self.syn = Some(lane);
        self.stats.syn_rx += m as u64;
        n + m
    }

    /// [`PacketPort::rx_burst`] from one ring, socket `fd`'s.
    fn rx_ring(&mut self, ring: &mut RxRing, fd: i32, now: Instant, out: &mut [Desc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let i = ring.head;
            let h = ring.frame(i);
            let status = Self::status(h).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            let copied = status & TP_STATUS_COPY != 0;
            if copied && self.copies_used == COPY_SLOTS {
                // The copy slots are taken: the frame waits for the next burst.
                break;
            }
            ring.head = (i + 1) % ring.frames;
            self.stats.rx += 1;
            let len = Self::u32_at(h, H_LEN) as usize;
            let mut snaplen = Self::u32_at(h, H_SNAPLEN) as usize;
            // SAFETY: tp_mac is a u16 at 12 of the header, sll_pkttype a byte at 42.
            let (mut mac, pkttype) =
                unsafe { (std::ptr::read_unaligned(h.add(H_MAC).cast::<u16>()) as usize, *h.add(H_PKTTYPE)) };
            let (base, addr0) = if copied {
                let c = self.copies_used;
                match self.read_copy(fd, c) {
                    Some(l) => {
                        self.copies_used += 1;
                        // The ring's slot has served its purpose.
                        Self::status(h).store(libc::TP_STATUS_KERNEL, Ordering::Release);
                        snaplen = l;
                        mac = META_LEN;
                        // SAFETY: slot c of the copy buffers.
                        (unsafe { self.copies.as_mut_ptr().add(c * COPY_SLOT) }, COPY_BASE + (c * COPY_SLOT) as u64)
                    }
                    None => {
                        Self::status(h).store(libc::TP_STATUS_KERNEL, Ordering::Release);
                        self.counters[4] += 1;
                        continue;
                    }
                }
            } else {
                (h, ring.base + (i * RX_FRAME) as u64)
            };
            // SAFETY: the frame lies at mac within its slot (ring or copy), snaplen long.
            let frame = unsafe { std::slice::from_raw_parts(base.add(mac), snaplen) };
            // SAFETY: the kernel wrote the virtio_net_hdr right in front of the frame
            // (tp_mac leaves RESERVE >= VNET bytes there; read_copy put it there).
            let v = unsafe { std::slice::from_raw_parts(base.add(mac - VNET), VNET) };
            let gso = v[1];
            let options =
                (v[0] & VNET_NEEDS_CSUM) as u32 | (gso as u32) << 8 | (u16::from_ne_bytes([v[4], v[5]]) as u32) << 16;
            let slot = if (pkttype == libc::PACKET_OTHERHOST && !self.diverted) || pkttype == libc::PACKET_OUTGOING {
                Some(6)
            } else if status & TP_STATUS_VLAN_VALID != 0 {
                Some(0)
            } else if snaplen < len {
                // Truncated: longer than a slot with no copy, or than a copy buffer.
                Some(4)
            } else {
                None
            };
            let (slot, route) = match slot {
                Some(s) => (s, Route::Invalid),
                None => match self.router.classify(frame, now, if gso != 0 { offload::gso_size(options) } else { 0 }) {
                    // The tcx program leaves the host's traffic and the unroutable to the
                    // kernel, and sends xpfd of those only what goes to a translation target:
                    // a reply to be translated, or the host's own, which xpfd gives back.
                    (1 | 3, _) if self.diverted => (5, Route::Local),
                    r => r,
                },
            };
            self.counters[slot] += 1;
            if slot != 5 || mac < META_LEN {
                if !copied {
                    Self::status(h).store(libc::TP_STATUS_KERNEL, Ordering::Release);
                }
                continue;
            }
            // SAFETY: PACKET_RESERVE (or read_copy) left RESERVE >= META_LEN bytes in front of
            // the frame.
            let meta = unsafe { std::slice::from_raw_parts_mut(base.add(mac - META_LEN), META_LEN) };
            route.write(meta);
            out[n] = Desc { addr: addr0 + (mac - META_LEN) as u64, len: (META_LEN + snaplen) as u32, options };
            n += 1;
            if !copied {
                ring.held.push(i);
            }
        }
        n
    }

    /// # Safety
    /// As [`crate::xsk::Xsk::frame_unbound`]: not to be used after `rx_done`.
    pub unsafe fn frame_unbound<'a>(&self, addr: u64, len: u32) -> &'a [u8] {
        if addr >= COPY_BASE {
            let at = (addr - COPY_BASE) as usize;
            assert!(at + len as usize <= self.copies.len());
            // SAFETY: in the copy buffers, which stay as they are until the next rx_burst.
            return unsafe { std::slice::from_raw_parts(self.copies.as_ptr().add(at), len as usize) };
        }
        if addr >= SYN_BASE {
            let (at, lane) = ((addr - SYN_BASE) as usize, self.syn.as_ref().expect("a frame of the SYN ring"));
            assert!(at + len as usize <= lane.map_len);
            // SAFETY: in the SYN ring's mapping; the frame stays ours until rx_done.
            return unsafe { std::slice::from_raw_parts(lane.ring.map.add(at), len as usize) };
        }
        assert!(addr as usize + len as usize <= RX_LEN);
        // SAFETY: in the RX part of the mapping; the frame stays ours until rx_done.
        unsafe { std::slice::from_raw_parts(self.map.add(addr as usize), len as usize) }
    }

    /// Frames handed out by the last `rx_burst` are done with: their ring slots go back.
    pub fn rx_done(&mut self, _descs: &[Desc]) {
        self.rx.done();
        if let Some(l) = &mut self.syn {
            l.ring.done();
        }
    }

    /// Copies `bytes` into a free TX frame; returns it for in-place edits before `flush`.
    /// Whether a quarter of the TX ring is free (see `Xsk::room_for_answers`).
    pub fn room_for_answers(&self) -> bool {
        // The ring fills in order from the head: free a quarter ahead means free up to there.
        let i = (self.tx_head + TX_FRAMES / 4) % TX_FRAMES;
        // tp_status at 0 of the frame's header.
        let st = Self::status(self.tx_frame(i)).load(Ordering::Acquire);
        st & (libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING) == 0
    }

    pub fn tx_copy(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        if bytes.len() > TX_FRAME - TX_DATA - VNET || self.tx_pending.len() >= TX_FRAMES {
            self.stats.tx_full += 1;
            return None;
        }
        let i = self.tx_head;
        let f = self.tx_frame(i);
        let st = Self::status(f).load(Ordering::Acquire);
        if st & (libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING) != 0 {
            self.stats.tx_full += 1;
            return None;
        }
        self.tx_head = (i + 1) % TX_FRAMES;
        // SAFETY: header fields and data area of a frame the kernel is not using.
        unsafe {
            let n = (VNET + bytes.len()) as u32;
            std::ptr::write_unaligned(f.add(H_LEN).cast::<u32>(), n); // tp_len
            std::ptr::write_unaligned(f.add(H_SNAPLEN).cast::<u32>(), n); // tp_snaplen
                                                                          // No offload asked unless tx_checksum says otherwise.
            std::slice::from_raw_parts_mut(f.add(TX_DATA), VNET).fill(0);
            let d = std::slice::from_raw_parts_mut(f.add(TX_DATA + VNET), bytes.len());
            d.copy_from_slice(bytes);
            self.tx_pending.push(i);
            self.tx_last = i;
            Some(d)
        }
    }

    /// Asks the kernel to finish the TCP/UDP checksum of the frame queued last (the field
    /// holds the pseudo-header sum): NEEDS_CSUM in its virtio_net_hdr.
    pub fn tx_checksum(&mut self, start: u16, offset: u16) -> bool {
        if self.tx_pending.is_empty() {
            return false;
        }
        // SAFETY: the virtio_net_hdr of a frame queued by tx_copy, not yet handed over.
        let v = unsafe { std::slice::from_raw_parts_mut(self.tx_frame(self.tx_last).add(TX_DATA), VNET) };
        vnet_csum(v, start, offset);
        true
    }

    /// Sends `frame`, a GSO packet (larger than a ring frame), at once with a virtio_net_hdr
    /// that has the kernel cut it into `gso_size` segments and finish their checksums (the
    /// field holds the pseudo-header sum). False (counted) when the kernel refuses it.
    pub fn tx_gso(&mut self, frame: &[u8], gso_type: u8, gso_size: u16, start: u16, offset: u16, hdr_len: u16) -> bool {
        // What the ring holds goes first: the stream keeps its order.
        self.flush();
        let mut v = [0u8; VNET];
        vnet_csum(&mut v, start, offset);
        v[1] = gso_type;
        v[2..4].copy_from_slice(&hdr_len.to_ne_bytes());
        v[4..6].copy_from_slice(&gso_size.to_ne_bytes());
        let iov = [
            libc::iovec { iov_base: v.as_mut_ptr().cast(), iov_len: VNET },
            libc::iovec { iov_base: frame.as_ptr() as *mut _, iov_len: frame.len() },
        ];
        if self.gso.is_none() {
            match gso_socket(self.ifindex) {
                Ok(fd) => self.gso = Some(fd),
                Err(_) => {
                    self.stats.tx_full += 1;
                    return false;
                }
            }
        }
        let fd = self.gso.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a msghdr over two live buffers; the socket is bound to the interface.
        let r = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = iov.as_ptr() as *mut _;
            m.msg_iovlen = 2;
            libc::sendmsg(fd, &m, libc::MSG_DONTWAIT)
        };
        if r < 0 {
            self.stats.tx_full += 1;
            return false;
        }
        self.stats.tx += 1;
        true
    }

    /// Hands the queued frames to the kernel and has it send them.
    pub fn flush(&mut self) {
        if self.tx_pending.is_empty() {
            return;
        }
        for &i in &self.tx_pending {
            Self::status(self.tx_frame(i)).store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        }
        self.stats.tx += self.tx_pending.len() as u64;
        self.tx_pending.clear();
        self.stats.kicks += 1;
        // SAFETY: a zero-length send transmits the ring's requested frames, out of the
        // interface the sockaddr_ll (ours) names: the socket may be bound to the ifb device
        // it reads.
        unsafe {
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            sa.sll_ifindex = self.ifindex as i32;
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
        }
    }

    /// Counters in the AF_XDP shape; the kernel's drops (ring full) from PACKET_STATISTICS.
    pub fn kernel_stats(&mut self) -> XskStats {
        self.stats.rx_ring_full += ring_drops(self.fd.as_raw_fd());
        if let Some(lane) = &self.syn {
            self.stats.syn_dropped += ring_drops(lane.fd.as_raw_fd());
        }
        self.stats.ifindex = self.ifindex;
        self.stats
    }
}

/// Frames the kernel dropped at packet socket `fd` since the last call (it resets the count on
/// every read): its ring was full.
fn ring_drops(fd: i32) -> u64 {
    // SAFETY: a zeroed tpacket_stats of the size passed.
    unsafe {
        let mut s: libc::tpacket_stats = std::mem::zeroed();
        let mut l = std::mem::size_of::<libc::tpacket_stats>() as u32;
        let r = libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut s as *mut libc::tpacket_stats).cast(),
            &mut l,
        );
        if r == 0 {
            s.tp_drops as u64
        } else {
            0
        }
    }
}

impl Drop for PacketPort {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// A TPACKET_V2 receive ring: its mapping, its next frame, the frames handed out by the last
/// burst (given back at `rx_done`), where its descriptor addresses start.
struct RxRing {
    map: *mut u8,
    frames: usize,
    head: usize,
    held: Vec<usize>,
    base: u64,
}

impl RxRing {
    /// A placeholder while a port's ring is lent out.
    const NONE: RxRing = RxRing { map: std::ptr::null_mut(), frames: 1, head: 0, held: Vec::new(), base: 0 };

    fn frame(&self, i: usize) -> *mut u8 {
        // SAFETY: i < frames, inside the mapping.
        unsafe { self.map.add(i * RX_FRAME) }
    }

    /// Whether the kernel has handed the next frame over.
    fn ready(&self) -> bool {
        PacketPort::status(self.frame(self.head)).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    fn done(&mut self) {
        for &i in &self.held {
            PacketPort::status(self.frame(i)).store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
        self.held.clear();
    }
}

/// The socket for new connections, its ring mapped alone.
struct SynLane {
    fd: OwnedFd,
    ring: RxRing,
    map_len: usize,
}

impl Drop for SynLane {
    fn drop(&mut self) {
        // SAFETY: unmapping the lane's own mapping once.
        unsafe { libc::munmap(self.ring.map.cast(), self.map_len) };
    }
}

/// A TPACKET_V2 packet socket for rings, not yet bound (protocol 0 until the rings are set up
/// and it is bound: it sees nothing before), with routing headroom in front of each received
/// frame and a virtio_net_hdr with each frame (senders on veth and tun/tap leave checksums and
/// segmentation, TSO's 64 KB segments, to offload; the kernel finishes both when xpfd sends
/// the frame on with the same header). Its own transmissions, and the host's, are not
/// received back.
fn ring_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    setopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &1i32 /* TPACKET_V2 */)?;
    setopt(raw, libc::SOL_PACKET, libc::PACKET_RESERVE, &RESERVE)?;
    setopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1i32)?;
    setopt(raw, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)?;
    Ok(fd)
}

/// A ring of `n` frames of `frame` bytes, in blocks of BLOCK.
fn ring_req(frame: usize, n: usize) -> libc::tpacket_req {
    libc::tpacket_req {
        tp_block_size: BLOCK as u32,
        tp_block_nr: (frame * n / BLOCK) as u32,
        tp_frame_size: frame as u32,
        tp_frame_nr: n as u32,
    }
}

/// Binds packet socket `fd` to every protocol on device `ifindex`.
fn bind_all(fd: i32, ifindex: u32) -> io::Result<()> {
    // SAFETY: a zeroed sockaddr_ll filled in for bind.
    unsafe {
        let mut sa: libc::sockaddr_ll = std::mem::zeroed();
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sa.sll_ifindex = ifindex as i32;
        if libc::bind(fd, (&sa as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) < 0
        {
            return Err(io::Error::other(format!(
                "binding a packet socket to ifindex {ifindex}: {}",
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Joins packet socket `fd` to fanout group `group` (PACKET_FANOUT_HASH), or founds one with
/// an id the kernel picks; the group's id.
fn fanout(fd: i32, group: Option<u16>) -> io::Result<u16> {
    const PACKET_FANOUT: i32 = 18;
    const PACKET_FANOUT_HASH: u32 = 0;
    const PACKET_FANOUT_FLAG_UNIQUEID: u32 = 0x2000;
    let arg = match group {
        Some(id) => id as u32 | PACKET_FANOUT_HASH << 16,
        None => (PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_UNIQUEID) << 16,
    };
    setopt(fd, libc::SOL_PACKET, PACKET_FANOUT, &arg)
        .map_err(|e| io::Error::new(e.kind(), format!("PACKET_FANOUT: {e}")))?;
    if let Some(id) = group {
        return Ok(id);
    }
    let mut v = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt into a u32 we own, its length passed.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_PACKET, PACKET_FANOUT, (&mut v as *mut u32).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::other(format!("PACKET_FANOUT: {}", io::Error::last_os_error())));
    }
    Ok(v as u16)
}

/// A send-only packet socket on `ifindex` taking a virtio_net_hdr with each frame (protocol
/// 0: it receives nothing).
fn gso_socket(ifindex: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket call; the descriptor is owned at once.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    setopt(raw, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)?;
    // SAFETY: a zeroed sockaddr_ll filled in for bind.
    unsafe {
        let mut sa: libc::sockaddr_ll = std::mem::zeroed();
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex as i32;
        if libc::bind(raw, (&sa as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32)
            < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// The IP length of one segment of GSO packet `f` cut at `gso_size` bytes of payload: its IP
/// and TCP/UDP headers and the payload (usize::MAX when the headers cannot be read).
fn gso_segment_len(f: &[u8], gso_size: u16) -> usize {
    xpf_wire::offload::headers_len(f).map_or(usize::MAX, |h| h + gso_size as usize)
}

/// Whether Ethernet frame `f` fits an MTU of `mtu`: a GSO packet (`gso`: its segment size, 0
/// for none) is over it until the kernel segments it on the way out; its segments must fit.
fn fits(f: &[u8], gso: u16, mtu: u32) -> bool {
    if gso == 0 {
        f.len().saturating_sub(14) <= mtu as usize
    } else {
        gso_segment_len(f, gso) <= mtu as usize
    }
}

/// A virtio_net_hdr asking for the checksum from `start`, stored at `start + offset`.
fn vnet_csum(v: &mut [u8], start: u16, offset: u16) {
    v[0] = VNET_NEEDS_CSUM;
    v[6..8].copy_from_slice(&start.to_ne_bytes());
    v[8..10].copy_from_slice(&offset.to_ne_bytes());
}

/// The FIB and neighbour answers of the last second, by destination.
/// When asked, the FIB's answer, and the next hop's link address if the kernel had one.
type Answer = (Instant, Option<FibRoute>, Option<[u8; 6]>);

#[derive(Default)]
pub struct Router {
    routes: HashMap<(u8, [u8; 16]), Answer>,
    links: HashMap<u32, (Instant, [u8; 6], u32)>,
    /// A rule's next hops (`route-to`, `reply-to`), by (interface, family, address): the
    /// interface and next hop they lead to (the kernel's route to the address when the
    /// rule names no interface) and its link address if the kernel had one.
    hops: HashMap<(u32, u8, [u8; 16]), Answer>,
}

const FRESH: Duration = Duration::from_secs(1);
/// An unresolved neighbour is asked again sooner.
const FRESH_UNRESOLVED: Duration = Duration::from_millis(100);
const MAX_ROUTES: usize = 1 << 16;

/// Where the FIB sends a frame xpfd rewrote ([`Router::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Forwarded (or waiting for its neighbour).
    Out(Route),
    /// To this host.
    Local,
    /// No route, TTL expiring, over the MTU, not IP.
    Not,
}

impl Router {
    /// The kernel has resolved `nexthop` on `ifindex` (xpfd sends what waited for it): the
    /// answers that were waiting for it take its link address now, rather than routing the
    /// next packets to it as unresolved for the rest of FRESH_UNRESOLVED (each of them then
    /// waiting, or dropped past the hold).
    pub fn resolved(&mut self, ifindex: u32, nexthop: &[u8; 16], mac: [u8; 6]) {
        for e in self.routes.values_mut().chain(self.hops.values_mut()) {
            if e.2.is_none() && e.1.is_some_and(|r| r.oif == ifindex && r.nexthop == *nexthop) {
                e.2 = Some(mac);
            }
        }
    }

    /// The FIB's route at time `t` for a frame whose destination xpfd rewrote (translation):
    /// the kernel's routes and neighbours, cached a second per destination.
    pub fn route(&mut self, frame: &[u8], t: Instant) -> Routed {
        match self.classify(frame, t, 0) {
            (5, r) => Routed::Out(r),
            (1, _) => Routed::Local,
            _ => Routed::Not,
        }
    }

    /// The steering program's decision for `frame`: a slot of [`PACKET_COUNTERS`], and the
    /// route when the slot is 5 (to the filter).
    /// A GSO packet (`gso`: its segment size, 0 for none) is over the MTU until the kernel
    /// segments it on the way out: its segments must fit.
    fn classify(&mut self, f: &[u8], t: Instant, gso: u16) -> (usize, Route) {
        if f.len() < 14 {
            return (0, Route::Invalid);
        }
        let (family, dst, l3) = match u16::from_be_bytes([f[12], f[13]]) {
            0x0800 if f.len() >= 34 && f[14] >> 4 == 4 => {
                if f[22] <= 1 {
                    return (2, Route::Invalid);
                }
                let mut d = [0u8; 16];
                d[..4].copy_from_slice(&f[30..34]);
                if d[0] >= 224 {
                    return (1, Route::Invalid);
                }
                (libc::AF_INET as u8, d, 4)
            }
            0x86dd if f.len() >= 54 && f[14] >> 4 == 6 => {
                if f[21] <= 1 {
                    return (2, Route::Invalid);
                }
                if f[20] == 58 && f.len() >= 55 && (133..=137).contains(&f[54]) {
                    return (7, Route::Invalid);
                }
                let d: [u8; 16] = f[38..54].try_into().unwrap();
                if d[0] == 0xff {
                    return (1, Route::Invalid);
                }
                (libc::AF_INET6 as u8, d, 16)
            }
            _ => return (0, Route::Invalid),
        };
        let fresh = |e: &Answer| t.duration_since(e.0) < if e.2.is_some() { FRESH } else { FRESH_UNRESOLVED };
        let (route, dmac) = match self.routes.get(&(family, dst)) {
            Some(e) if fresh(e) => (e.1, e.2),
            _ => {
                let r = netlink::route_get(&dst[..l3]).ok();
                let mac =
                    r.filter(|r| r.kind == 1).and_then(|r| netlink::neigh_get(r.oif, &r.nexthop[..l3]).ok().flatten());
                if self.routes.len() >= MAX_ROUTES {
                    self.routes.clear();
                }
                self.routes.insert((family, dst), (t, r, mac));
                (r, mac)
            }
        };
        let Some(r) = route else { return (3, Route::Invalid) };
        match r.kind {
            1 => {}
            2 | 3 | 5 => return (1, Route::Invalid),
            _ => return (3, Route::Invalid),
        }
        let Some((smac, mtu)) = self.link(r.oif, t) else { return (3, Route::Invalid) };
        if !fits(f, gso, mtu) {
            return (4, Route::Invalid);
        }
        match dmac {
            Some(dmac) => (5, Route::Forward { ifindex: r.oif, dmac, smac }),
            None => (5, Route::NoNeighbour { ifindex: r.oif, family, nexthop: r.nexthop }),
        }
    }

    /// Where a rule's `route-to` or `reply-to` sends a frame at time `t`: out of interface
    /// `ifindex` to next hop `addr` (of `family`, 4 or 16 bytes used), or with `ifindex` 0 the
    /// way the kernel's route to `addr` goes (to its gateway when `addr` is not on link), as
    /// pf_route does. The kernel's answers are cached a second per next hop. Not when the
    /// interface is gone, no route leads to `addr`, or the frame is over the MTU.
    /// A GSO packet (`gso`: its segment size, 0 for none) fits when its segments do.
    pub fn via(&mut self, ifindex: u32, family: u8, addr: [u8; 16], frame: &[u8], gso: u16, t: Instant) -> Routed {
        let l3 = if family == libc::AF_INET as u8 { 4 } else { 16 };
        let fresh = |e: &Answer| t.duration_since(e.0) < if e.2.is_some() { FRESH } else { FRESH_UNRESOLVED };
        let (hop, dmac) = match self.hops.get(&(ifindex, family, addr)) {
            Some(e) if fresh(e) => (e.1, e.2),
            _ => {
                let hop = if ifindex != 0 {
                    Some(FibRoute { kind: 1, oif: ifindex, nexthop: addr })
                } else {
                    netlink::route_get(&addr[..l3]).ok().filter(|r| r.kind == 1)
                };
                let mac = hop.and_then(|h| netlink::neigh_get(h.oif, &h.nexthop[..l3]).ok().flatten());
                if self.hops.len() >= MAX_ROUTES {
                    self.hops.clear();
                }
                self.hops.insert((ifindex, family, addr), (t, hop, mac));
                (hop, mac)
            }
        };
        let Some(h) = hop else { return Routed::Not };
        let Some((smac, mtu)) = self.link(h.oif, t) else { return Routed::Not };
        if !fits(frame, gso, mtu) {
            return Routed::Not;
        }
        Routed::Out(match dmac {
            Some(dmac) => Route::Forward { ifindex: h.oif, dmac, smac },
            None => Route::NoNeighbour { ifindex: h.oif, family, nexthop: h.nexthop },
        })
    }

    /// The MAC and MTU of interface `ifindex`, refreshed every second.
    fn link(&mut self, ifindex: u32, t: Instant) -> Option<([u8; 6], u32)> {
        if let Some(e) = self.links.get(&ifindex) {
            if t.duration_since(e.0) < FRESH {
                return Some((e.1, e.2));
            }
        }
        let name = netlink::ifname(ifindex)?;
        let (mac, mtu) = (netlink::mac(&name).ok()?, netlink::mtu(&name).ok()?);
        self.links.insert(ifindex, (t, mac, mtu));
        Some((mac, mtu))
    }
}

/// The kernel half of packet mode: a `table netdev xpfd` whose ingress chains drop, on the
/// filtered interfaces, the IP traffic the kernel would otherwise forward past the filter.
pub struct Guard {
    installed: bool,
}

impl Guard {
    pub const TABLE: &'static str = "xpfd";

    /// The nftables text for `ifaces`.
    pub fn rules(ifaces: &[String]) -> String {
        let mut s = format!("table netdev {} {{\n", Self::TABLE);
        for (i, name) in ifaces.iter().enumerate() {
            s.push_str(&format!(
                "  chain in{i} {{\n    type filter hook ingress device \"{name}\" priority -500; policy accept;\n    \
                 meta protocol != {{ ip, ip6 }} accept\n    \
                 ip ttl <= 1 accept\n    \
                 ip6 hoplimit <= 1 accept\n    \
                 icmpv6 type {{ nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }} accept\n    \
                 meta pkttype {{ broadcast, multicast }} accept\n    \
                 fib daddr type {{ local, broadcast, multicast }} accept\n    \
                 counter drop comment \"forwarded by xpfd, not by the kernel\"\n  }}\n"
            ));
        }
        s.push_str("}\n");
        s
    }

    /// Replaces any earlier table of ours with chains for `ifaces`.
    pub fn install(ifaces: &[String]) -> io::Result<Guard> {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "netdev", Self::TABLE])
            .stderr(std::process::Stdio::null())
            .status();
        let mut child = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("running nft (packet mode needs nftables): {e}")))?;
        use std::io::Write;
        child.stdin.take().unwrap().write_all(Self::rules(ifaces).as_bytes())?;
        let st = child.wait()?;
        if !st.success() {
            return Err(io::Error::other(format!("nft refused the packet-mode guard table ({st})")));
        }
        Ok(Guard { installed: true })
    }

    /// Deletes a table an earlier xpfd left (killed), where this one needs none (its tcx
    /// program keeps transit frames from the stack).
    pub fn remove_stale() {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "netdev", Self::TABLE])
            .stderr(std::process::Stdio::null())
            .status();
    }

    /// Takes the table away (a clean stop): the kernel forwards unfiltered again, as after
    /// XDP mode's detach.
    pub fn remove(&mut self) {
        if std::mem::take(&mut self.installed) {
            let _ = std::process::Command::new("nft").args(["delete", "table", "netdev", Self::TABLE]).status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ttl: u8, dst: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12] = 0x08;
        f[14] = 0x45;
        f[22] = ttl;
        f[23] = 17;
        f[30..34].copy_from_slice(&dst);
        f
    }

    #[test]
    fn a_resolved_next_hop_ends_the_cached_wait_of_its_routes_only() {
        let mut r = Router::default();
        let t = Instant::now();
        let hop = |a: u8| {
            let mut n = [0u8; 16];
            n[..4].copy_from_slice(&[10, 0, 1, a]);
            n
        };
        let route = |oif: u32, a: u8| Some(FibRoute { kind: 1, oif, nexthop: hop(a) });
        r.routes.insert((4, hop(2)), (t, route(3, 2), None));
        r.routes.insert((4, hop(3)), (t, route(3, 3), None));
        r.routes.insert((4, hop(4)), (t, route(5, 2), None));
        r.resolved(3, &hop(2), [2, 0, 0, 0, 0, 1]);
        assert_eq!(r.routes[&(4, hop(2))].2, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(r.routes[&(4, hop(3))].2, None, "another next hop still waits");
        assert_eq!(r.routes[&(4, hop(4))].2, None, "the same address on another interface still waits");
    }

    #[test]
    fn classification_mirrors_the_steering_program() {
        let mut r = Router::default();
        assert_eq!(r.classify(&[0u8; 10], Instant::now(), 0).0, 0, "runt");
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(r.classify(&arp, Instant::now(), 0).0, 0, "ARP to the kernel");
        assert_eq!(r.classify(&v4(1, [192, 0, 2, 1]), Instant::now(), 0).0, 2, "TTL 1 to the kernel");
        assert_eq!(r.classify(&v4(64, [224, 0, 0, 5]), Instant::now(), 0).0, 1, "multicast to the kernel");
        assert_eq!(r.classify(&v4(64, [127, 0, 0, 1]), Instant::now(), 0).0, 1, "local to the kernel");
        let mut ns = vec![0u8; 78];
        ns[12..14].copy_from_slice(&[0x86, 0xdd]);
        ns[14] = 0x60;
        ns[20] = 58;
        ns[21] = 255;
        ns[38] = 0xfe;
        ns[54] = 135;
        assert_eq!(r.classify(&ns, Instant::now(), 0).0, 7, "neighbour solicitation to the kernel");
    }

    #[test]
    fn guard_rules_name_every_interface() {
        let t = Guard::rules(&["eth0".into(), "eth1".into()]);
        assert!(t.contains("device \"eth0\"") && t.contains("device \"eth1\""));
        assert_eq!(t.matches("counter drop").count(), 2);
    }
}
