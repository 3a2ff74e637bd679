//! An AF_XDP socket on one queue of one interface, with its own UMEM.
//!
//! A second socket on the same queue, sharing the UMEM and its fill ring, receives the new
//! connections (TCP SYNs, which the steering program sends there): `rx_burst` reads the first
//! socket's ring before it, keeping an eighth of each batch for it, so a SYN flood overflows
//! only its own ring and established traffic keeps its place.
//!
//! The UMEM's first half of frames feeds the receive path (fill ring -> RX ring -> back to the
//! fill ring once the worker is done with the frame); the second half is a free list for
//! transmission (TX ring -> completion ring -> free list). Forwarding from one socket to
//! another copies the frame into a TX frame of the egress socket: on veth (copy mode) the
//! kernel copies anyway, and it keeps each UMEM owned by one socket. Zero-copy is asked for
//! first and copy mode taken when the driver refuses it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

pub const FRAME: u32 = 2048;
/// Bytes in front of each transmitted frame: room for its `xsk_tx_metadata` (a checksum
/// request), kept 64 so frames stay cache-line aligned.
const TX_HEADROOM: u32 = 64;
/// The kernel's `struct xsk_tx_metadata` (Linux 6.14+: flags u64, then csum_start u16,
/// csum_offset u16, launch_time u64; older kernels read only the first 12 bytes).
const TX_META: u32 = 24;
const FRAMES: u32 = 16384;
const RING: u32 = 8192;
/// The new-connection socket's ring: a flood's backlog the worker can clear in a few ms.
const SYN_RING: u32 = 2048;
const XDP_SHARED_UMEM: u16 = 1 << 0;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_COPY: u16 = 1 << 1;
const XDP_ZEROCOPY: u16 = 1 << 2;
const XDP_RING_NEED_WAKEUP: u32 = 1;
const PGOFF_RX: i64 = 0;
const PGOFF_TX: i64 = 0x8000_0000;
const PGOFF_FILL: i64 = 0x1_0000_0000;
const PGOFF_COMP: i64 = 0x1_8000_0000;
const SO_PREFER_BUSY_POLL: i32 = 69;
const SO_BUSY_POLL_BUDGET: i32 = 70;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub options: u32,
}

struct Ring<T> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    ring: *mut T,
    mask: u32,
    size: u32,
    map: *mut libc::c_void,
    map_len: usize,
    /// Producer side: next index to write; consumer side: next index to read.
    cached: u32,
}

impl<T: Copy> Ring<T> {
    fn map(fd: i32, off: &libc::xdp_ring_offset, size: u32, pgoff: i64) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let b = map_shared(fd, len, pgoff)?;
        let p: *mut libc::c_void = b.cast();
        // SAFETY: offsets come from XDP_MMAP_OFFSETS for this very mapping.
        unsafe {
            Ok(Ring {
                producer: b.add(off.producer as usize).cast(),
                consumer: b.add(off.consumer as usize).cast(),
                flags: b.add(off.flags as usize).cast(),
                ring: b.add(off.desc as usize).cast(),
                mask: size - 1,
                size,
                map: p,
                map_len: len,
                cached: 0,
            })
        }
    }
    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping.
        unsafe { &*self.producer }
    }
    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    fn need_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { (*self.flags).load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0 }
    }
    /// Consumer: entries ready to read.
    fn ready(&self) -> u32 {
        self.prod().load(Ordering::Acquire).wrapping_sub(self.cached)
    }
    fn read(&self, i: u32) -> T {
        // SAFETY: index masked into the ring.
        unsafe { *self.ring.add((self.cached.wrapping_add(i) & self.mask) as usize) }
    }
    fn release(&mut self, n: u32) {
        self.cached = self.cached.wrapping_add(n);
        self.cons().store(self.cached, Ordering::Release);
    }
    /// Producer: free slots.
    fn free(&self) -> u32 {
        self.size - self.cached.wrapping_sub(self.cons().load(Ordering::Acquire))
    }
    fn write(&mut self, i: u32, v: T) {
        // SAFETY: index masked into the ring.
        unsafe { *self.ring.add((self.cached.wrapping_add(i) & self.mask) as usize) = v }
    }
    fn submit(&mut self, n: u32) {
        self.cached = self.cached.wrapping_add(n);
        self.prod().store(self.cached, Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping what map() mapped.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// Statistics of one socket.
#[derive(Debug, Default, Clone, Copy)]
pub struct XskStats {
    /// The interface and queue of the socket.
    pub ifindex: u32,
    pub queue: u32,
    pub rx: u64,
    pub tx: u64,
    /// Frames dropped because the TX ring or the free list was full.
    pub tx_full: u64,
    pub kicks: u64,
    /// From the kernel (XDP_STATISTICS): dropped for want of fill ring entries, invalid
    /// descriptors.
    pub rx_dropped: u64,
    pub rx_invalid: u64,
    pub rx_ring_full: u64,
    pub fill_empty: u64,
    /// New connections (TCP SYNs) received on the second socket, and dropped by the kernel
    /// because its ring was full.
    pub syn_rx: u64,
    pub syn_dropped: u64,
    /// Of `tx`, the frames sent through XDP ([`crate::txlane`]), and the test runs that sent
    /// them.
    pub tx_xdp: u64,
    pub tx_xdp_runs: u64,
    /// Test runs the kernel refused: the lane's frames went through the ring, and the lane
    /// is off from then on.
    pub tx_xdp_errors: u64,
}

impl XskStats {
    /// Frames the kernel dropped on the way in: rx_dropped counts them all, a full ring also
    /// in rx_ring_full and a missing fill ring entry also in fill_empty (each of those seen
    /// equal to rx_dropped when it was the only cause), so once.
    pub fn rx_drops(&self) -> u64 {
        self.rx_dropped.max(self.rx_ring_full + self.fill_empty)
    }
}

/// The queue's second socket: its receive ring only (frames, fill and completion rings are
/// the first socket's).
struct SynLane {
    fd: OwnedFd,
    rx: Ring<Desc>,
}

pub struct Xsk {
    fd: OwnedFd,
    umem: *mut u8,
    umem_len: usize,
    rx: Ring<Desc>,
    syn: Option<SynLane>,
    tx: Ring<Desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    tx_free: Vec<u64>,
    tx_pending: u32,
    /// The UMEM takes transmit metadata (a checksum request per frame).
    tx_md: bool,
    /// Where the frame queued last lies.
    last_tx: u64,
    /// Transmit through XDP, when xpfd gave the socket a lane.
    lane: Option<crate::txlane::TxLane>,
    pub ifindex: u32,
    pub queue: u32,
    pub zero_copy: bool,
    pub stats: XskStats,
}

// SAFETY: the socket and its mappings are used by one worker thread at a time.
unsafe impl Send for Xsk {}

/// Where the kernel put each ring of socket `fd` in its mapping.
fn mmap_offsets(fd: i32) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: all-zero is valid; getsockopt fills it.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut ol = std::mem::size_of::<libc::xdp_mmap_offsets>() as u32;
    // SAFETY: off has the size passed in ol.
    if unsafe { libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off as *mut _ as *mut _, &mut ol) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(off)
}

/// The kernel's `struct xdp_statistics` of socket `fd`: rx_dropped, rx_invalid_descs,
/// tx_invalid_descs, rx_ring_full, rx_fill_ring_empty_descs, tx_ring_empty_descs.
fn xdp_statistics(fd: i32) -> Option<[u64; 6]> {
    let mut s = [0u64; 6];
    let mut l = std::mem::size_of_val(&s) as u32;
    // SAFETY: s has the size passed in l.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_STATISTICS, s.as_mut_ptr().cast(), &mut l) };
    (r == 0).then_some(s)
}

/// Maps `len` bytes of rings the kernel set up on socket `fd`, from page offset `pgoff`,
/// shared with it.
pub(crate) fn map_shared(fd: i32, len: usize, pgoff: i64) -> io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of the socket's rings; the kernel checks the range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            pgoff,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

pub(crate) fn setopt<T>(fd: i32, level: i32, opt: i32, v: &T) -> io::Result<()> {
    // SAFETY: v points to a value of the size passed.
    let r = unsafe { libc::setsockopt(fd, level, opt, (v as *const T).cast(), std::mem::size_of::<T>() as u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Xsk {
    /// Opens a socket on `queue` of `ifindex`. `busy_poll_us` > 0 turns on preferred busy
    /// polling (the application drives the driver's NAPI instead of an interrupt).
    pub fn open(ifindex: u32, queue: u32, busy_poll_us: u32) -> io::Result<Xsk> {
        // SAFETY: plain socket call.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let umem_len = (FRAMES * FRAME) as usize;
        // SAFETY: anonymous private mapping.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let free_umem = |e: io::Error| {
            // SAFETY: unmapping the region mapped above.
            unsafe { libc::munmap(umem, umem_len) };
            e
        };
        // SAFETY: all-zero is a valid xdp_umem_reg.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem as u64;
        reg.len = umem_len as u64;
        reg.chunk_size = FRAME;
        // Transmit metadata (Linux 6.8+): a frame can ask the kernel to finish its TCP/UDP
        // checksum (the sender left it to offload). Without it, xpfd finishes them itself.
        // (6.11+ reads the length only with XDP_UMEM_TX_METADATA_LEN set.)
        reg.tx_metadata_len = TX_META;
        reg.flags = libc::XDP_UMEM_TX_METADATA_LEN;
        let tx_md = match setopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg) {
            Ok(()) => true,
            Err(_) => {
                reg.tx_metadata_len = 0;
                reg.flags = 0;
                setopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(free_umem)?;
                false
            }
        };
        for (opt, n) in [
            (libc::XDP_UMEM_FILL_RING, RING),
            (libc::XDP_UMEM_COMPLETION_RING, RING),
            (libc::XDP_RX_RING, RING),
            (libc::XDP_TX_RING, RING),
        ] {
            setopt(raw, libc::SOL_XDP, opt, &n).map_err(free_umem)?;
        }
        let off = mmap_offsets(raw).map_err(free_umem)?;
        let rx = Ring::map(raw, &off.rx, RING, PGOFF_RX).map_err(free_umem)?;
        let tx = Ring::map(raw, &off.tx, RING, PGOFF_TX).map_err(free_umem)?;
        let fill = Ring::map(raw, &off.fr, RING, PGOFF_FILL).map_err(free_umem)?;
        let comp = Ring::map(raw, &off.cr, RING, PGOFF_COMP).map_err(free_umem)?;
        let mut x = Xsk {
            fd,
            umem: umem.cast(),
            umem_len,
            rx,
            syn: None,
            tx,
            fill,
            comp,
            tx_free: (FRAMES / 2..FRAMES).map(|i| (i * FRAME) as u64).collect(),
            tx_pending: 0,
            tx_md,
            last_tx: 0,
            lane: None,
            ifindex,
            queue,
            zero_copy: false,
            stats: XskStats::default(),
        };
        // Hand the receive half to the kernel (one short of the ring: a full fill ring at
        // start was seen to stall libxdp's sockets).
        let n = (FRAMES / 2).min(RING - 1);
        for i in 0..n {
            x.fill.write(i, (i * FRAME) as u64);
        }
        x.fill.submit(n);
        let mut last = None;
        for mode in [XDP_ZEROCOPY, XDP_COPY] {
            // SAFETY: all-zero is a valid sockaddr_xdp.
            let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
            sa.sxdp_family = libc::AF_XDP as u16;
            sa.sxdp_ifindex = ifindex;
            sa.sxdp_queue_id = queue;
            sa.sxdp_flags = mode | XDP_USE_NEED_WAKEUP;
            // SAFETY: sa is a sockaddr_xdp of the size passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as u32,
                )
            };
            if r == 0 {
                x.zero_copy = mode == XDP_ZEROCOPY;
                // A zero-copy driver without transmit-metadata support ignores the request
                // silently; only copy mode (the kernel builds the skb) is sure to honour it.
                x.tx_md &= !x.zero_copy;
                last = None;
                break;
            }
            last = Some(io::Error::last_os_error());
        }
        if let Some(e) = last {
            return Err(io::Error::new(e.kind(), format!("binding AF_XDP to ifindex {ifindex} queue {queue}: {e}")));
        }
        if busy_poll_us > 0 {
            setopt(raw, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, &1i32)?;
            setopt(raw, libc::SOL_SOCKET, libc::SO_BUSY_POLL, &(busy_poll_us as i32))?;
            setopt(raw, libc::SOL_SOCKET, SO_BUSY_POLL_BUDGET, &64i32)?;
        }
        Ok(x)
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    pub fn syn_fd(&self) -> Option<i32> {
        self.syn.as_ref().map(|l| l.fd.as_raw_fd())
    }

    /// Opens the queue's second socket, for new connections, on this socket's UMEM; returns
    /// its descriptor for the steering program's map.
    pub fn open_syn_lane(&mut self) -> io::Result<i32> {
        // SAFETY: plain socket call.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        setopt(raw, libc::SOL_XDP, libc::XDP_RX_RING, &SYN_RING)?;
        let off = mmap_offsets(raw)?;
        let rx = Ring::map(raw, &off.rx, SYN_RING, PGOFF_RX)?;
        // SAFETY: all-zero is a valid sockaddr_xdp.
        let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
        sa.sxdp_family = libc::AF_XDP as u16;
        sa.sxdp_ifindex = self.ifindex;
        sa.sxdp_queue_id = self.queue;
        // A socket sharing a UMEM takes the first's mode: no mode flags of its own.
        sa.sxdp_flags = XDP_SHARED_UMEM;
        sa.sxdp_shared_umem_fd = self.fd.as_raw_fd() as u32;
        // SAFETY: sa is a sockaddr_xdp of the size passed.
        let r = unsafe {
            libc::bind(raw, (&sa as *const libc::sockaddr_xdp).cast(), std::mem::size_of::<libc::sockaddr_xdp>() as u32)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.syn = Some(SynLane { fd, rx });
        Ok(raw)
    }

    /// Up to `out.len()` received descriptors; they stay owned by the caller until
    /// `rx_done` returns them to the fill ring. The first socket's frames come first; the
    /// new-connection socket gets what is left of the batch, and at least an eighth of it
    /// while it has frames waiting.
    pub fn rx_burst(&mut self, out: &mut [Desc]) -> usize {
        let cap = out.len() as u32;
        let syn_ready = self.syn.as_ref().map_or(0, |l| l.rx.ready());
        let n = self.rx.ready().min(cap - syn_ready.min(cap / 8));
        for i in 0..n {
            out[i as usize] = self.rx.read(i);
        }
        self.rx.release(n);
        self.stats.rx += n as u64;
        let mut m = 0;
        if let Some(l) = &mut self.syn {
            m = syn_ready.min(cap - n);
            for i in 0..m {
                out[(n + i) as usize] = l.rx.read(i);
            }
            l.rx.release(m);
            self.stats.syn_rx += m as u64;
        }
        (n + m) as usize
    }

    /// A received frame with a lifetime not tied to the socket, so that it can be read while
    /// another socket (or this one) transmits.
    ///
    /// # Safety
    /// The caller must not use the slice after giving the frame back with `rx_done`.
    #[inline]
    pub unsafe fn frame_unbound<'a>(&self, addr: u64, len: u32) -> &'a [u8] {
        assert!(addr as usize + len as usize <= self.umem_len);
        // SAFETY: in bounds; the caller keeps the frame off the fill ring while it reads.
        unsafe { std::slice::from_raw_parts(self.umem.add(addr as usize), len as usize) }
    }

    #[inline]
    pub fn frame_mut(&mut self, addr: u64, len: u32) -> &mut [u8] {
        assert!(addr as usize + len as usize <= self.umem_len);
        // SAFETY: as above; &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.umem.add(addr as usize), len as usize) }
    }

    /// Gives received frames back to the kernel.
    pub fn rx_done(&mut self, descs: &[Desc]) {
        let n = (descs.len() as u32).min(self.fill.free());
        for i in 0..n {
            self.fill.write(i, descs[i as usize].addr & !(FRAME as u64 - 1));
        }
        self.fill.submit(n);
    }

    /// Gives the socket a lane to transmit through XDP ([`crate::txlane`]).
    pub fn set_lane(&mut self, lane: crate::txlane::TxLane) {
        self.lane = Some(lane);
    }

    /// Copies `bytes` into a free TX frame and queues it; None (counted) when full. With a
    /// lane that takes it, the frame waits there instead (until [`Xsk::flush`]).
    #[inline]
    pub fn tx_copy(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        if let Some(l) = self.lane.as_ref() {
            if !l.takes(bytes.len()) && !l.is_empty() {
                // The lane full, or a frame it cannot take (too long, the egress not taking
                // redirected frames): those waiting leave first, in order.
                self.flush_lane();
            }
        }
        if self.lane.as_ref().is_some_and(|l| l.takes(bytes.len())) {
            if self.tx_pending > 0 {
                // Frames queued in the ring before this one leave before it.
                self.flush_ring();
            }
            return self.lane.as_mut().and_then(|l| l.push(bytes));
        }
        self.ring_copy(bytes)
    }

    /// Copies `bytes` into a free frame of the AF_XDP transmit ring.
    #[inline]
    fn ring_copy(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        if self.tx_free.is_empty() {
            self.reap();
        }
        if bytes.len() > (FRAME - TX_HEADROOM) as usize || self.tx.free() == 0 {
            self.stats.tx_full += 1;
            return None;
        }
        let Some(chunk) = self.tx_free.pop() else {
            self.stats.tx_full += 1;
            return None;
        };
        let addr = chunk + TX_HEADROOM as u64;
        let len = bytes.len() as u32;
        self.frame_mut(addr, len).copy_from_slice(bytes);
        self.tx.write(self.tx_pending, Desc { addr, len, options: 0 });
        self.last_tx = addr;
        self.tx_pending += 1;
        Some(self.frame_mut(addr, len))
    }

    /// Whether a quarter of the transmit ring and its frames is still free: answers the
    /// firewall makes itself (SYN cookies, `block return`) leave that room to forwarded
    /// traffic, so a flood's answers cannot crowd out established connections.
    pub fn room_for_answers(&mut self) -> bool {
        if (self.tx_free.len() as u32) < RING / 4 {
            self.reap();
        }
        self.tx.free().saturating_sub(self.tx_pending) >= RING / 4 && self.tx_free.len() as u32 >= RING / 4
    }

    /// Whether the next frame can carry a checksum request ([`Xsk::tx_checksum`]): not while
    /// the socket sends through its lane (an XDP frame carries no offload request; the
    /// caller finishes the checksum). Whether the frame then waits in the lane or, full or
    /// too long for it, goes to the ring, its checksum is complete either way.
    #[inline]
    pub fn can_tx_checksum(&self) -> bool {
        self.tx_md && !self.lane.as_ref().is_some_and(|l| l.on())
    }

    /// Asks the kernel to finish the TCP/UDP checksum of the frame [`Xsk::tx_copy`] queued
    /// last: computed from `start` (the transport header's offset), stored at `start +
    /// offset`, over a field that holds the pseudo-header sum (`offload::prepare`). On veth
    /// the frame goes on as the kernel's own CHECKSUM_PARTIAL packets do (nothing summed); a
    /// device without offload has the kernel sum it. False when this socket cannot (the
    /// caller finishes it).
    #[inline]
    pub fn tx_checksum(&mut self, start: u16, offset: u16) -> bool {
        if !self.tx_md || self.tx_pending == 0 {
            return false;
        }
        let meta = self.frame_mut(self.last_tx - TX_META as u64, TX_META);
        meta.fill(0);
        meta[0..8].copy_from_slice(&(libc::XDP_TXMD_FLAGS_CHECKSUM as u64).to_ne_bytes());
        meta[8..10].copy_from_slice(&start.to_ne_bytes());
        meta[10..12].copy_from_slice(&offset.to_ne_bytes());
        let i = self.tx_pending - 1;
        let d = self.tx.read(i);
        self.tx.write(i, Desc { options: d.options | libc::XDP_TX_METADATA, ..d });
        true
    }

    /// Sends the frames waiting in the lane: by one test run when there are [`LANE_MIN`] or
    /// more, else (or when the run fails) through the ring, ahead of what is queued there
    /// after them.
    ///
    /// [`LANE_MIN`]: crate::txlane::LANE_MIN
    fn flush_lane(&mut self) {
        let Some(mut l) = self.lane.take() else { return };
        let n = l.len() as u64;
        let sent = l.len() >= crate::txlane::LANE_MIN && l.send().is_ok();
        self.stats.tx_xdp = l.stats.frames;
        self.stats.tx_xdp_runs = l.stats.runs;
        self.stats.tx_xdp_errors = l.stats.errors;
        if sent {
            self.stats.tx += n;
        } else {
            l.drain(|f| {
                let _ = self.ring_copy(f);
            });
        }
        self.lane = Some(l);
    }

    /// Publishes queued frames and wakes the kernel to send them.
    pub fn flush(&mut self) {
        self.flush_lane();
        if let Some(l) = self.lane.as_mut() {
            l.refresh();
        }
        self.flush_ring();
    }

    /// Publishes the frames queued in the ring and wakes the kernel to send them.
    fn flush_ring(&mut self) {
        if self.tx_pending > 0 {
            self.stats.tx += self.tx_pending as u64;
            self.tx.submit(self.tx_pending);
            self.tx_pending = 0;
        }
        // In copy mode a kick sends at most 32 frames (the kernel's TX_BATCH_SIZE) and says
        // EAGAIN when more wait: kicked once a batch, the ring filled and frames were dropped
        // as tx-ring-full (two of three new flows in the lab's new-flows measure, whose
        // states were made). Kicked again while the kernel says so, up to the whole ring. A
        // zero-copy driver's kick only wakes its NAPI and returns 0: one kick. A kick that
        // took nothing (EAGAIN for a full completion ring, a busy device) ends it too.
        let mut cons = self.tx.cons().load(Ordering::Acquire);
        if self.tx.need_wakeup() && self.tx.cached != cons {
            for _ in 0..RING / 32 + 1 {
                self.stats.kicks += 1;
                // SAFETY: zero-length send on our socket is the documented TX kick.
                let r = unsafe {
                    libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0)
                };
                let again = r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
                let now = self.tx.cons().load(Ordering::Acquire);
                if !again || now == cons {
                    break;
                }
                cons = now;
            }
        }
        self.reap();
    }

    /// Takes completed TX frames back onto the free list.
    fn reap(&mut self) {
        let n = self.comp.ready();
        for i in 0..n {
            self.tx_free.push(self.comp.read(i) & !(FRAME as u64 - 1));
        }
        self.comp.release(n);
    }

    /// The kernel's counters for this socket.
    pub fn kernel_stats(&mut self) -> XskStats {
        if let Some(s) = xdp_statistics(self.fd.as_raw_fd()) {
            self.stats.rx_dropped = s[0];
            self.stats.rx_invalid = s[1];
            self.stats.rx_ring_full = s[3];
            self.stats.fill_empty = s[4];
        }
        self.stats.ifindex = self.ifindex;
        self.stats.queue = self.queue;
        if let Some(s) = self.syn.as_ref().and_then(|l| xdp_statistics(l.fd.as_raw_fd())) {
            // A full ring counts in both rx_dropped and rx_ring_full: the drops once.
            self.stats.syn_dropped = s[0].max(s[3]);
        }
        self.stats
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: the rings are unmapped by their own Drop; the UMEM is ours.
        unsafe { libc::munmap(self.umem.cast(), self.umem_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::XskStats;

    #[test]
    fn a_drop_counts_once_whichever_counters_the_kernel_raised() {
        // A frame with no fill ring entry: rx_dropped and fill_empty both (kernel 6.18, copy
        // mode, seen equal); a full ring: rx_dropped and rx_ring_full.
        let no_fill = XskStats { rx_dropped: 1_220_714, fill_empty: 1_220_714, ..Default::default() };
        assert_eq!(no_fill.rx_drops(), 1_220_714);
        let full = XskStats { rx_dropped: 50, rx_ring_full: 50, ..Default::default() };
        assert_eq!(full.rx_drops(), 50);
        let both = XskStats { rx_dropped: 70, rx_ring_full: 50, fill_empty: 20, ..Default::default() };
        assert_eq!(both.rx_drops(), 70);
    }
}
