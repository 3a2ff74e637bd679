//! The steering program (bpf/steer.c) seen from userspace: the metadata it writes in front of
//! each frame it redirects, and the names of its counters.

use crate::bpf::{objects, Map, Program};
use crate::netlink;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes of metadata in front of each frame (`struct meta` in bpf/steer.c).
pub const META_LEN: usize = 36;

/// Whether the steering program found a live fast-path entry for the frame and handed it on
/// (a TCP segment it could not judge, a route that changed): byte 2 of the metadata.
#[inline]
pub fn fast_flow(m: &[u8]) -> bool {
    m.get(2) == Some(&1)
}

/// What the kernel's FIB said about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Forward out of `ifindex` with these Ethernet addresses.
    Forward { ifindex: u32, dmac: [u8; 6], smac: [u8; 6] },
    /// Out of `ifindex` via `nexthop`, whose link address the kernel does not know yet.
    NoNeighbour { ifindex: u32, family: u8, nexthop: [u8; 16] },
    /// For this host, sent to xpfd because it goes to a translation target: a translated
    /// packet is routed anew, anything else goes back to the kernel.
    Local,
    /// Metadata missing or unknown (never seen from our own program).
    Invalid,
}

impl Route {
    #[inline]
    pub fn parse(m: &[u8]) -> Route {
        if m.len() < META_LEN {
            return Route::Invalid;
        }
        let ifindex = u32::from_ne_bytes([m[4], m[5], m[6], m[7]]);
        match m[0] {
            1 => Route::Forward { ifindex, dmac: m[8..14].try_into().unwrap(), smac: m[14..20].try_into().unwrap() },
            2 => Route::NoNeighbour { ifindex, family: m[1], nexthop: m[20..36].try_into().unwrap() },
            3 => Route::Local,
            _ => Route::Invalid,
        }
    }

    /// Writes the metadata as the steering program does (packet mode routes in userspace).
    pub fn write(&self, m: &mut [u8]) {
        m[..META_LEN].fill(0);
        match *self {
            Route::Forward { ifindex, dmac, smac } => {
                m[0] = 1;
                m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
                m[8..14].copy_from_slice(&dmac);
                m[14..20].copy_from_slice(&smac);
            }
            Route::NoNeighbour { ifindex, family, nexthop } => {
                m[0] = 2;
                m[1] = family;
                m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
                m[20..36].copy_from_slice(&nexthop);
            }
            Route::Local => m[0] = 3,
            Route::Invalid => {}
        }
    }
}

fn random4() -> [u8; 4] {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a 4-byte buffer we own.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    b
}

/// steer_cfg's slots (bpf/steer.c).
const C_BARE: u32 = 0;
const C_SEED: u32 = 1;
const C_MASK4: u32 = 2;
const C_MASK6: u32 = 3;
const C_PACE: u32 = 4;
const C_PROBE: u32 = 5;
const C_COOKIE: u32 = 6;
/// The probe frames' ethertype (IEEE 802 local experimental; bpf/steer.c PROBE_ETHERTYPE).
const PROBE_ETHERTYPE: u16 = 0x88b5;
/// Frames per probe.
const PROBE_FRAMES: u32 = 4;

/// Where a queue's socket for new connections sits in map `xsks`, past the queue's own
/// (steer.c: SYN_LANE), and how many sockets each interface's slot has there (SLOT_XSKS).
const SYN_LANE: u32 = 64;
const SLOT_XSKS: u32 = 2 * SYN_LANE;
/// Interfaces one steering program serves (steer.c: SLOTS).
const SLOTS: u32 = 32;

/// The program's counters by slot (the enum in bpf/steer.c): (key for JSON and metrics,
/// text for `xpfctl -s info`).
pub const COUNTERS: [(&str, &str); 13] = [
    ("not_ip", "not IP, to the kernel"),
    ("for_host", "for this host, to the kernel"),
    ("ttl_expiring", "TTL/hop limit expiring, to the kernel"),
    ("no_route", "no route, to the kernel"),
    ("over_mtu", "over the egress MTU, to the kernel"),
    ("to_xpfd", "redirected to xpfd"),
    ("no_socket", "no xpfd socket, dropped"),
    ("neighbour_discovery", "neighbour discovery, to the kernel"),
    ("fast_path", "forwarded in the kernel (fast path)"),
    ("other_mac", "for another host's MAC, to the kernel"),
    ("syn_queue", "new TCP connections, to xpfd's SYN queue"),
    ("translation_target", "for this host, to a translation target, to xpfd"),
    ("fast_path_translated", "translated in the kernel (fast path)"),
];

/// A translation target the kernel would not forward (bpf/steer.c's natnet and natport):
/// packets of `proto` to `addr/len` (IPv4 in the first four bytes; length 0: any) whose
/// destination port is in `lo..=hi` (ICMP: 0..=65535), or, with `port` not 0, is `port` (to
/// the host `addr`, or to any address when it is all zero), go to xpfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatTarget {
    pub family: u8,
    pub proto: u8,
    pub addr: [u8; 16],
    pub len: u8,
    pub port: u16,
    pub lo: u16,
    pub hi: u16,
}

/// Gives frames to the kernel as if an interface had received them (bpf/inject.c).
pub struct Inject {
    prog: Program,
}

impl Inject {
    pub fn load() -> io::Result<Inject> {
        Ok(Inject { prog: Program::load("xpf_inject", objects::INJECT)? })
    }

    /// Passes `frame` (Ethernet, checksums complete) up the stack of interface `ifindex`.
    pub fn to_stack(&self, frame: &[u8], ifindex: u32) -> io::Result<()> {
        self.prog.test_run(frame, ifindex, 1, 1, crate::bpf::TEST_XDP_LIVE_FRAMES).map(|_| ())
    }
}

/// Maps the flow tables of `prog` (the steering program, or the skb fast path's) and sets
/// their hash seed and the sync pace (a TCP segment goes to xpfd every `pace` sync counts; 0:
/// never). Lookups stay off until [`fast_lookups`].
pub fn fast_tables(prog: &Program, seed: u32, pace: u32) -> io::Result<crate::flows::FlowTables> {
    let (m4, m6) = (prog.map("flows4"), prog.map("flows6"));
    let (x4, x6) = (prog.map("xlats4"), prog.map("xlats6"));
    let v4 = crate::flows::Table::mapped(m4.mmap()?, x4.mmap()?, m4.max_entries, false, seed);
    let v6 = crate::flows::Table::mapped(m6.mmap()?, x6.mmap()?, m6.max_entries, true, seed);
    let cfg = prog.map("steer_cfg");
    cfg.update(&C_SEED.to_ne_bytes(), &seed.to_ne_bytes())?;
    cfg.update(&C_PACE.to_ne_bytes(), &pace.to_ne_bytes())?;
    Ok(crate::flows::FlowTables { v4, v6 })
}

/// Writes translation targets into maps `natnet` and `natport` of a program that has them (the
/// steering program's, or packet mode's tcx program's: bpf/fast.h), replacing the ones there.
/// Errors when there are more than the maps hold.
pub fn set_nat_targets(net: &Map, port: &Map, targets: &[NatTarget]) -> io::Result<()> {
    let mut nets: std::collections::HashMap<Vec<u8>, [u8; 4]> = Default::default();
    let mut ports: std::collections::HashMap<Vec<u8>, [u8; 4]> = Default::default();
    for t in targets {
        let mut v = [0u8; 4];
        v[..2].copy_from_slice(&t.lo.to_ne_bytes());
        v[2..].copy_from_slice(&t.hi.to_ne_bytes());
        if t.port == 0 {
            let mut k = vec![0u8; 24];
            k[..4].copy_from_slice(&(32 + t.len as u32).to_ne_bytes());
            k[4] = t.family;
            k[5] = t.proto;
            k[8..24].copy_from_slice(&t.addr);
            nets.insert(k, v);
        } else {
            let mut k = vec![0u8; 20];
            k[0] = t.family;
            k[1] = t.proto;
            k[2..4].copy_from_slice(&t.port.to_ne_bytes());
            k[4..20].copy_from_slice(&t.addr);
            ports.insert(k, v);
        }
    }
    for (m, want) in [(net, &nets), (port, &ports)] {
        if want.len() > m.max_entries as usize {
            return Err(io::Error::other(format!(
                "{} translation targets on this host's addresses; at most {}",
                want.len(),
                m.max_entries
            )));
        }
        for k in m.keys()? {
            if !want.contains_key(&k) {
                m.delete(&k)?;
            }
        }
        for (k, v) in want.iter() {
            m.update(k, v)?;
        }
    }
    Ok(())
}

/// Turns table lookups of `prog`'s fast path on or off (the tables' masks; 0: no lookup).
pub fn fast_lookups(prog: &Program, on: bool) -> io::Result<()> {
    let cfg = prog.map("steer_cfg");
    let mask = |m: &str| if on { prog.map(m).max_entries - 1 } else { 0 };
    cfg.update(&C_MASK6.to_ne_bytes(), &mask("flows6").to_ne_bytes())?;
    cfg.update(&C_MASK4.to_ne_bytes(), &mask("flows4").to_ne_bytes())
}

/// The steering program on one filtered interface. Loaded once (the verifier's work is the
/// most of xpfd's start) and shared by every interface, each in its own slot: its sockets at
/// SLOT_XSKS * slot in map `xsks`, its counters at COUNTERS.len() * slot in `steer_stats`,
/// its slot beside its MAC in `ifmacs` (bpf/steer.c).
pub struct Steer {
    pub prog: Arc<Program>,
    slot: u32,
    /// The slots taken so far, shared by the interfaces of one program.
    taken: Arc<AtomicU32>,
    attached: Vec<(u32, u32)>,
}

impl Steer {
    /// Loads the program for the first interface; `first`: the program one interface already
    /// has, which this one then shares in the next slot (errors past SLOTS interfaces).
    /// `tables`: the fast-path flow tables' sizes (IPv4, IPv6 entries, powers of two; 1 each
    /// when the fast path is off); `ports`: the AF_XDP sockets it will serve (a transmit lane
    /// each, xpf_xdp::txlane).
    pub fn load(tables: (u32, u32), ports: u32, first: Option<&Steer>) -> io::Result<Steer> {
        if let Some(f) = first {
            let slot = f.taken.fetch_add(1, Ordering::Relaxed);
            if slot >= SLOTS {
                return Err(io::Error::other(format!("the steering program serves up to {SLOTS} interfaces")));
            }
            return Ok(Steer { prog: f.prog.clone(), slot, taken: f.taken.clone(), attached: Vec::new() });
        }
        let sizes = [
            ("flows4", tables.0),
            ("flows6", tables.1),
            ("xlats4", tables.0),
            ("xlats6", tables.1),
            ("tx_slots", ports.max(1) * crate::txlane::LANE),
        ];
        let prog = Program::load_sized("xpf_steer", objects::STEER, &sizes)?;
        Ok(Steer { prog: Arc::new(prog), slot: 0, taken: Arc::new(AtomicU32::new(1)), attached: Vec::new() })
    }

    /// Maps the flow tables and turns the fast path on (see [`fast_tables`]).
    pub fn fast_tables(&self, seed: u32, pace: u32) -> io::Result<crate::flows::FlowTables> {
        fast_tables(&self.prog, seed, pace)
    }

    /// Turns the program's table lookups on or off (see [`fast_lookups`]). Off while no
    /// interface takes redirected frames: no flow can be in the tables then, and every
    /// packet would pay a lookup that misses.
    pub fn fast_lookups(&self, on: bool) -> io::Result<()> {
        fast_lookups(&self.prog, on)
    }

    /// Attaches to `ifindex`, native mode first, then generic (skb) mode; returns the mode.
    /// The interface's MAC goes to the program first: unicast frames for other MACs are left
    /// to the kernel, which drops them.
    pub fn attach(&mut self, ifindex: u32) -> io::Result<&'static str> {
        use std::os::fd::AsRawFd;
        self.set_mac(ifindex)?;
        let fd = self.prog.fd.as_raw_fd();
        match netlink::xdp_attach(ifindex, fd, netlink::XDP_FLAGS_DRV_MODE) {
            Ok(()) => {
                self.attached.push((ifindex, netlink::XDP_FLAGS_DRV_MODE));
                Ok("native")
            }
            Err(_) => {
                netlink::xdp_attach(ifindex, fd, netlink::XDP_FLAGS_SKB_MODE)?;
                self.attached.push((ifindex, netlink::XDP_FLAGS_SKB_MODE));
                Ok("generic")
            }
        }
    }

    /// Writes `ifindex`'s current MAC into the program's map (again after a change).
    pub fn set_mac(&self, ifindex: u32) -> io::Result<()> {
        let name = netlink::ifname(ifindex)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifindex}")))?;
        let mac = netlink::mac(&name)?;
        let mut v = [0u8; 8];
        v[..6].copy_from_slice(&mac);
        v[6] = self.slot as u8;
        self.prog.map("ifmacs").update(&ifindex.to_ne_bytes(), &v)
    }

    /// Puts socket `fd` in the map for receive queue `queue`.
    pub fn register(&self, queue: u32, fd: i32) -> io::Result<()> {
        self.prog.map("xsks").update(&self.xsk_key(queue, 0)?.to_ne_bytes(), &fd.to_ne_bytes())
    }

    /// Puts socket `fd` in the map as the queue's socket for new connections (TCP SYNs).
    pub fn register_syn_lane(&self, queue: u32, fd: i32) -> io::Result<()> {
        self.prog.map("xsks").update(&self.xsk_key(queue, SYN_LANE)?.to_ne_bytes(), &fd.to_ne_bytes())
    }

    fn xsk_key(&self, queue: u32, lane: u32) -> io::Result<u32> {
        if queue >= SYN_LANE {
            return Err(io::Error::other(format!(
                "queue {queue}: the steering program serves queues 0-{}",
                SYN_LANE - 1
            )));
        }
        Ok(SLOT_XSKS * self.slot + lane + queue)
    }

    /// Whether `egress` takes frames the program redirects to it (XDP_REDIRECT). A veth does
    /// only while its peer runs NAPI (an XDP program there, or GRO on), a setting of the host
    /// at the other end; a frame it cannot take is dropped and counted nowhere. So it is tried,
    /// not assumed: PROBE_FRAMES frames of the local experimental ethertype, from and to the
    /// interface's own MAC (the far host drops them as not its own), go through the program
    /// with BPF_PROG_TEST_RUN in live-frame mode and are redirected to `egress`; the veth's
    /// `tx_queue_N_xdp_xmit` and `tx_queue_N_xdp_xmit_errors` statistics must count them. Other drivers that run the program
    /// natively take redirected frames (ndo_xdp_xmit): not probed; one where the program
    /// runs in generic (skb) mode only has no ndo_xdp_xmit, and takes none.
    pub fn probe_egress(&self, egress: u32) -> io::Result<bool> {
        let name = netlink::ifname(egress).ok_or_else(|| io::Error::other(format!("no interface {egress}")))?;
        if netlink::driver(&name)?.0 != "veth" {
            return Ok(self.attached.iter().any(|&(i, f)| i == egress && f == netlink::XDP_FLAGS_DRV_MODE));
        }
        let cookie = u32::from_ne_bytes(random4());
        // From the interface's MAC to itself: the program takes it as addressed to the
        // interface (the probe runs with `egress` as the receiving interface).
        let mut f = vec![0u8; 60];
        let mac = netlink::mac(&name)?;
        f[..6].copy_from_slice(&mac);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&PROBE_ETHERTYPE.to_be_bytes());
        f[14..18].copy_from_slice(&cookie.to_ne_bytes());
        // A frame the peer's ring had no room for is counted as an error: the veth takes
        // redirected frames, it was busy (a probe during a full load once read "no" and kept
        // every flow out of the fast path for 10 s). One it cannot take is counted nowhere.
        let taken = || -> io::Result<u64> {
            Ok(netlink::ethtool_sum(&name, "_xdp_xmit")? + netlink::ethtool_sum(&name, "_xdp_xmit_errors")?)
        };
        let before = taken()?;
        let cfg = self.prog.map("steer_cfg");
        cfg.update(&C_COOKIE.to_ne_bytes(), &cookie.to_ne_bytes())?;
        cfg.update(&C_PROBE.to_ne_bytes(), &egress.to_ne_bytes())?;
        let ran = self.prog.test_run(&f, egress, PROBE_FRAMES, PROBE_FRAMES, crate::bpf::TEST_XDP_LIVE_FRAMES);
        cfg.update(&C_PROBE.to_ne_bytes(), &0u32.to_ne_bytes())?;
        ran?;
        let after = taken()?;
        Ok(after.saturating_sub(before) >= PROBE_FRAMES as u64)
    }

    pub fn counters(&self) -> [u64; COUNTERS.len()] {
        let m = self.prog.map("steer_stats");
        let base = self.slot * COUNTERS.len() as u32;
        std::array::from_fn(|i| m.percpu_sum(base + i as u32).unwrap_or(0))
    }

    /// Writes the translation targets the program sends to xpfd although the kernel would
    /// not forward them (maps `natnet` and `natport`, shared by every interface's program),
    /// replacing the ones there. Errors when there are more than the maps hold.
    pub fn set_nat_targets(&self, targets: &[NatTarget]) -> io::Result<()> {
        set_nat_targets(self.prog.map("natnet"), self.prog.map("natport"), targets)
    }

    /// Bare mode: forward everything routable in the kernel, unfiltered (the lab's measure
    /// of the fast path's I/O ceiling).
    pub fn set_bare(&self, on: bool) -> io::Result<()> {
        self.prog.map("steer_cfg").update(&C_BARE.to_ne_bytes(), &(on as u32).to_ne_bytes())
    }

    /// Detaches from every interface (a clean stop; see netlink::xdp_attach for a crash).
    pub fn detach_all(&mut self) {
        for (i, f) in self.attached.drain(..) {
            let _ = netlink::xdp_detach(i, f);
        }
    }
}

/// Dropped without a clean stop (xpfd refusing to start after it attached): the interfaces
/// go back to how they were. A killed xpfd drops nothing, and its programs stay (fail closed).
impl Drop for Steer {
    fn drop(&mut self) {
        self.detach_all();
    }
}
