//! The fast path of packet mode (bpf/skb.c) seen from userspace: a socket filter on xpfd's
//! packet socket of each interface and a program at the interface's tcx ingress, sharing the
//! flow tables xpfd writes (as the steering program's; [`crate::steer::fast_tables`]).
//! Established flows are forwarded in the kernel as socket buffers: a 64 KB segment whole, its
//! checksum left to offload. The links die with xpfd; its netdev table then keeps the box
//! closed, as in packet mode without the fast path.

use crate::bpf::{attach_socket_filter, objects, tcx_ingress, Kind, Program};
use std::io;
use std::os::fd::OwnedFd;

/// The program's counters (`skb_stats` in bpf/skb.c): key for JSON, text for `xpfctl -s info`.
pub const SKB_COUNTERS: [(&str, &str); 5] = [
    ("forwarded", "forwarded in the kernel"),
    ("forwarded_neighbour", "forwarded in the kernel, the next hop resolved by it"),
    ("rerouted", "route changed: the flow back to xpfd, the frame dropped"),
    ("over_mtu", "over the egress MTU, dropped"),
    ("stale", "decisions not taken up"),
];

/// The two programs, loaded once for every interface.
pub struct SkbPath {
    pub tap: Program,
    fwd: Program,
    links: Vec<OwnedFd>,
}

impl SkbPath {
    /// Loads both programs; `tables`: the flow tables' sizes (IPv4, IPv6 entries, powers of two).
    pub fn load(tables: (u32, u32)) -> io::Result<SkbPath> {
        let tap = Program::load_kind(
            "xpf_tap",
            objects::SKB,
            Kind::SOCKET,
            &[("flows4", tables.0), ("flows6", tables.1)],
            &[],
        )?;
        let shared: Vec<&crate::bpf::Map> = tap.maps.iter().collect();
        let fwd = Program::load_kind("xpf_fwd", objects::SKB, Kind::TC, &[], &shared)?;
        Ok(SkbPath { tap, fwd, links: Vec::new() })
    }

    /// Puts the fast path on interface `ifindex`, whose packet socket is `sock`.
    pub fn attach(&mut self, ifindex: u32, sock: i32) -> io::Result<()> {
        self.links.push(tcx_ingress(&self.fwd, ifindex)?);
        attach_socket_filter(sock, &self.tap)
    }

    pub fn counters(&self) -> [u64; 5] {
        let m = self.tap.map("skb_stats");
        std::array::from_fn(|i| m.percpu_sum(i as u32).unwrap_or(0))
    }
}
