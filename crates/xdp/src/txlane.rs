//! Transmit through XDP (bpf/steer.c, `tx_batch`): a port's frames wait in its lane of the
//! steering program's `tx_slots` (memory mapped here) and leave by one BPF_PROG_TEST_RUN in
//! live-frame mode, which redirects each to its egress in XDP bulk. AF_XDP's copy mode (the
//! only mode veth and most drivers without zero-copy support offer) builds a socket buffer
//! per frame and sends it through the device's transmit path; here the frames reach the
//! device's `ndo_xdp_xmit` as XDP frames, as the fast path's do.
//!
//! A test run has a fixed cost (the kernel makes and frees a page pool for it: about 20 us
//! here) beside its cost per frame (about 0.33 us against AF_XDP's 1.85 us on veth into an
//! XDP receiver): a lane is sent this way only when it holds [`LANE_MIN`] frames or more;
//! fewer go through the AF_XDP ring (docs/xpfd.md, "Transmit through XDP").

use crate::bpf::{Mapped, Program, TEST_XDP_LIVE_FRAMES};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// A slot: length and egress ifindex (u32 each), then the frame (bpf/steer.c TX_SLOT).
pub const SLOT: usize = 2048;
/// The longest frame a slot holds (TX_DATA).
pub const DATA: usize = SLOT - 8;
/// Slots per lane: the most frames one test run sends (TX_LANE; one batch of the kernel's).
pub const LANE: u32 = 128;
/// A lane holding fewer frames at a flush sends them through the AF_XDP ring instead.
pub const LANE_MIN: u32 = 16;
/// steer_cfg's words (bpf/fast.h): the interface the test runs name, and their key.
const C_TXDEV: u32 = 7;
const C_TXKEY: u32 = 8;
/// The input frame: the metadata (key, run, first slot, count), then an Ethernet header's
/// worth of bytes (the program grows it to each slot's length).
const META: usize = 16;
const INPUT: usize = META + 14;

/// The steering program's slots, shared by the lanes of every port.
pub struct TxSlots {
    prog: Arc<Program>,
    map: Mapped,
    lanes: u32,
    next: AtomicU32,
    key: u32,
    /// The interface the test runs name as receiving (loopback: no filtered traffic).
    dev: u32,
}

impl TxSlots {
    /// Maps `prog`'s `tx_slots` (sized to LANE slots a port) and turns the branch on.
    pub fn new(prog: Arc<Program>, key: u32) -> io::Result<Arc<TxSlots>> {
        let m = prog.map("tx_slots");
        let lanes = m.max_entries / LANE;
        let map = m.mmap()?;
        let dev = crate::netlink::ifindex("lo")?;
        let key = key.max(1);
        let cfg = prog.map("steer_cfg");
        cfg.update(&C_TXKEY.to_ne_bytes(), &key.to_ne_bytes())?;
        cfg.update(&C_TXDEV.to_ne_bytes(), &dev.to_ne_bytes())?;
        Ok(Arc::new(TxSlots { prog, map, lanes, next: AtomicU32::new(0), key, dev }))
    }

    /// The next port's lane, sending out of `egress` while `able` says the egress takes
    /// redirected frames (probed: a veth only while its peer runs NAPI). None when every
    /// lane is taken.
    pub fn lane(self: &Arc<Self>, egress: u32, able: Arc<AtomicBool>) -> Option<TxLane> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.lanes {
            return None;
        }
        let mut input = [0u8; INPUT];
        input[0..4].copy_from_slice(&self.key.to_ne_bytes());
        input[8..12].copy_from_slice(&(i * LANE).to_ne_bytes());
        let on = able.load(Ordering::Relaxed);
        Some(TxLane {
            slots: self.clone(),
            first: i * LANE,
            n: 0,
            run: 0,
            egress,
            able,
            on,
            input,
            stats: Default::default(),
        })
    }

    /// The fixed cost of a test run, the least of three that send nothing (a batch of no
    /// frames: the program drops its one run). Where a test run changes the kernel's XDP
    /// dispatcher (the program not attached natively anywhere) a run takes milliseconds, and
    /// lanes are not worth it.
    pub fn run_cost(&self) -> io::Result<std::time::Duration> {
        let mut input = [0u8; INPUT];
        input[0..4].copy_from_slice(&self.key.to_ne_bytes());
        input[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        let mut best = std::time::Duration::MAX;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            self.prog.test_run_meta(&input, META as u32, self.dev, 1, 1, TEST_XDP_LIVE_FRAMES)?;
            best = best.min(t.elapsed());
        }
        Ok(best)
    }
}

/// Counters of a lane.
#[derive(Debug, Default, Clone, Copy)]
pub struct LaneStats {
    /// Frames sent by test runs, and the runs.
    pub frames: u64,
    pub runs: u64,
    /// Runs the kernel refused (their frames went through the AF_XDP ring, and the lane
    /// takes no more).
    pub errors: u64,
}

/// One port's slots.
pub struct TxLane {
    slots: Arc<TxSlots>,
    first: u32,
    n: u32,
    run: u32,
    egress: u32,
    able: Arc<AtomicBool>,
    /// `able` as of the last flush.
    on: bool,
    input: [u8; INPUT],
    pub stats: LaneStats,
}

// SAFETY: the slots are written by the one worker that owns the lane; the kernel reads them
// only during that worker's own test run.
unsafe impl Send for TxLane {}

impl TxLane {
    /// Whether the next frame of up to `len` bytes can wait here.
    #[inline]
    pub fn takes(&self, len: usize) -> bool {
        self.on && self.n < LANE && (14..=DATA).contains(&len)
    }

    /// Reads the egress's probed state again (once a flush, so that a checksum decision
    /// made before a frame is queued holds when it is: [`crate::xsk::Xsk::can_tx_checksum`]).
    #[inline]
    pub fn refresh(&mut self) {
        self.on = self.stats.errors == 0 && self.able.load(Ordering::Relaxed);
    }

    /// Whether frames go through the lane until the next flush (the egress takes redirected
    /// frames, as of the last flush).
    #[inline]
    pub fn on(&self) -> bool {
        self.on
    }

    /// Frames waiting.
    #[inline]
    pub fn len(&self) -> u32 {
        self.n
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn slot(&mut self, i: u32) -> &mut [u8] {
        let at = (self.first + i) as usize * SLOT;
        debug_assert!(at + SLOT <= self.slots.map.len);
        // SAFETY: within the mapping (lanes are LANE slots of the map's max_entries); the
        // lane's slots are this worker's alone.
        unsafe { std::slice::from_raw_parts_mut(self.slots.map.ptr.add(at), SLOT) }
    }

    /// Copies `bytes` into the next slot; the frame as it waits there, to finish in place.
    /// None when the lane cannot take it ([`TxLane::takes`]).
    #[inline]
    pub fn push(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        if !self.takes(bytes.len()) {
            return None;
        }
        let (i, egress) = (self.n, self.egress);
        self.n += 1;
        let s = self.slot(i);
        s[0..4].copy_from_slice(&(bytes.len() as u32).to_ne_bytes());
        s[4..8].copy_from_slice(&egress.to_ne_bytes());
        let f = &mut s[8..8 + bytes.len()];
        f.copy_from_slice(bytes);
        Some(f)
    }

    /// The frames waiting, in order, and empties the lane (for a batch too small to send
    /// here: the caller copies them into its ring).
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) {
        for i in 0..std::mem::take(&mut self.n) {
            let s = self.slot(i);
            let len = u32::from_ne_bytes(s[0..4].try_into().unwrap()) as usize;
            f(&s[8..8 + len]);
        }
    }

    /// Sends the frames waiting by one test run. On Err they are still waiting: the caller
    /// sends them otherwise ([`TxLane::drain`]).
    pub fn send(&mut self) -> io::Result<()> {
        if self.n == 0 {
            return Ok(());
        }
        self.run = self.run.wrapping_add(1);
        self.input[4..8].copy_from_slice(&self.run.to_ne_bytes());
        self.input[12..16].copy_from_slice(&self.n.to_ne_bytes());
        let r = self.slots.prog.test_run_meta(
            &self.input,
            META as u32,
            self.slots.dev,
            self.n,
            self.n,
            TEST_XDP_LIVE_FRAMES,
        );
        match r {
            Ok(_) => {
                self.stats.frames += self.n as u64;
                self.stats.runs += 1;
                self.n = 0;
                Ok(())
            }
            Err(e) => {
                self.stats.errors += 1;
                self.on = false;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::objects;
    use crate::netlink;
    use crate::steer::Steer;
    use crate::xsk::Xsk;

    /// A UDP frame from 198.18.`src` (the sink counts by the source's low 16 bits; the links'
    /// own IPv6 frames are counted apart).
    fn frame(src: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12] = 8;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&46u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..28].copy_from_slice(&[198, 18]);
        f[28..30].copy_from_slice(&src.to_be_bytes());
        f[30..34].copy_from_slice(&[198, 19, 0, 1]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&2000u16.to_be_bytes());
        f[38..40].copy_from_slice(&26u16.to_be_bytes());
        f
    }

    fn sh(args: &[&str]) {
        let st = std::process::Command::new(args[0]).args(&args[1..]).status().unwrap();
        assert!(st.success(), "{args:?}");
    }

    /// In a namespace of its own: a veth pair xta -- xtb, the steering program on xta
    /// (natively), the lab's counting sink on xtb. Frames pushed into xta's lane arrive at xtb each once, by
    /// one test run; a batch under LANE_MIN leaves through the AF_XDP ring instead; a run
    /// whose key is not the program's sends nothing; an egress that takes no redirected
    /// frames gets none through the lane. Needs root, as `make test` runs.
    #[test]
    fn a_lane_sends_each_frame_once_and_small_batches_take_the_ring() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: no namespace, nothing sent");
            return;
        }
        let ns = format!("xpf-txlane-{}", std::process::id());
        sh(&["ip", "netns", "add", &ns]);
        let path = format!("/run/netns/{ns}");
        let r = std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on this thread only, with a namespace file we hold open.
            assert_eq!(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) }, 0);
            sh(&["ip", "link", "add", "name", "xta", "type", "veth", "peer", "name", "xtb"]);
            sh(&["ip", "link", "set", "xta", "up"]);
            sh(&["ip", "link", "set", "xtb", "up"]);
            sh(&["ip", "link", "set", "lo", "up"]);
            let (a, b) = (netlink::ifindex("xta").unwrap(), netlink::ifindex("xtb").unwrap());
            let mut steer = Steer::load((1, 1), 2, None).unwrap();
            assert_eq!(steer.attach(a).unwrap(), "native");
            let sink = Program::load("xpf_sink", objects::SINK).unwrap();
            netlink::xdp_attach(b, std::os::fd::AsRawFd::as_raw_fd(&sink.fd), netlink::XDP_FLAGS_DRV_MODE).unwrap();
            let src = |i: u16| {
                let mut v = [0u8; 8];
                sink.map("sink_src").lookup(&(i as u32).to_ne_bytes(), &mut v).unwrap();
                u64::from_ne_bytes(v)
            };
            let settle = || std::thread::sleep(std::time::Duration::from_millis(100));

            let slots = TxSlots::new(steer.prog.clone(), 0x5eed).unwrap();
            eprintln!("a test run's fixed cost: {:?}", slots.run_cost().unwrap());
            let able = Arc::new(AtomicBool::new(true));
            let mut lane = slots.lane(a, able.clone()).unwrap();
            for i in 1..=LANE as u16 {
                assert!(lane.push(&frame(i)).is_some());
            }
            assert!(lane.push(&frame(999)).is_none(), "a full lane takes no more");
            lane.send().unwrap();
            settle();
            for i in 1..=LANE as u16 {
                assert_eq!(src(i), 1, "source {i}");
            }
            assert_eq!((lane.stats.frames, lane.stats.runs), (LANE as u64, 1));

            // A run whose key is not the program's: nothing leaves.
            let cfg = steer.prog.map("steer_cfg");
            cfg.update(&C_TXKEY.to_ne_bytes(), &7u32.to_ne_bytes()).unwrap();
            lane.push(&frame(999)).unwrap();
            lane.send().unwrap();
            settle();
            assert_eq!(src(999), 0);
            cfg.update(&C_TXKEY.to_ne_bytes(), &0x5eedu32.to_ne_bytes()).unwrap();

            // Through a socket: 5 frames take the ring, 40 the lane; all arrive, in each
            // batch once.
            let mut x = Xsk::open(a, 0, 0).unwrap();
            x.set_lane(slots.lane(a, able.clone()).unwrap());
            // No checksum request while frames may wait in the lane, even a full one: the
            // caller finishes the checksum (an XDP frame carries no offload).
            assert!(!x.can_tx_checksum());
            for i in 200..205 {
                x.tx_copy(&frame(i)).unwrap();
            }
            x.flush();
            for i in 300..340 {
                x.tx_copy(&frame(i)).unwrap();
            }
            x.flush();
            settle();
            let s = x.kernel_stats();
            assert_eq!((s.tx, s.tx_xdp, s.tx_xdp_runs), (45, 40, 1));
            assert!((200..205).chain(300..340).all(|i| src(i) == 1));

            // The egress no longer takes redirected frames: from the next flush on, the ring.
            able.store(false, Ordering::Relaxed);
            x.flush();
            for i in 400..440 {
                x.tx_copy(&frame(i)).unwrap();
            }
            x.flush();
            settle();
            assert_eq!(x.kernel_stats().tx_xdp, 40);
            assert!((400..440).all(|i| src(i) == 1));
            steer.detach_all();
        })
        .join();
        sh(&["ip", "netns", "del", &ns]);
        r.unwrap();
    }
}
