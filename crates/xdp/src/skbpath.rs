//! The fast path of packet mode (bpf/skb.c) seen from userspace: one program at each filtered
//! interface's tcx ingress, reading the flow tables xpfd writes (as the steering program's;
//! [`crate::steer::fast_tables`]). Established flows are forwarded in the kernel as socket
//! buffers (a 64 KB segment whole, its checksum left to offload); what the kernel must see
//! goes on to it; everything else is redirected into the ingress of an ifb device of xpfd's,
//! where xpfd's packet socket for that interface reads it. No socket taps the filtered
//! interfaces themselves. The links die with xpfd; its netdev table then keeps the box
//! closed, as in packet mode without the fast path.

use crate::bpf::{objects, tcx_ingress, Kind, Program};
use std::io;
use std::os::fd::OwnedFd;

/// The program's counters (`skb_stats` in bpf/skb.c): key for JSON, text for `xpfctl -s info`.
pub const SKB_COUNTERS: [(&str, &str); 15] = [
    ("forwarded", "forwarded in the kernel"),
    ("forwarded_neighbour", "forwarded in the kernel, the next hop resolved by it"),
    ("rerouted", "route changed: the flow back to xpfd"),
    ("over_mtu", "over the egress MTU, left to the kernel (too big)"),
    ("to_xpfd", "to xpfd"),
    ("for_host", "for this host, left to the kernel"),
    ("kernel", "not IP, multicast, ND, TTL expiring: to the kernel"),
    ("other_mac", "not for this host's MAC, left to the kernel (dropped)"),
    ("no_divert", "no xpfd socket: to the kernel (not forwarded)"),
    ("nat_local", "to a translation target on this host, to xpfd"),
    ("given_back", "given back by xpfd (no translation's), to the kernel"),
    ("no_route", "no route, left to the kernel (unreachable)"),
    ("translated", "translated in the kernel"),
    ("rewrite_failed", "translation failed in the kernel, dropped"),
    ("to_xpfd_syn", "new connections (TCP SYN) to xpfd's socket for them"),
];

/// The programs, loaded once for every interface.
pub struct SkbPath {
    pub prog: Program,
    drop: Program,
    links: Vec<OwnedFd>,
}

impl SkbPath {
    /// Loads both programs; `tables`: the flow tables' sizes (IPv4, IPv6 entries, powers of two).
    pub fn load(tables: (u32, u32)) -> io::Result<SkbPath> {
        let sizes = [("flows4", tables.0), ("flows6", tables.1), ("xlats4", tables.0), ("xlats6", tables.1)];
        let prog = Program::load_kind("xpf_skb", objects::SKB, Kind::TC, &sizes, &[])?;
        let shared: Vec<&crate::bpf::Map> = prog.maps.iter().collect();
        let drop = Program::load_kind("xpf_drop", objects::SKB, Kind::TC_DROP, &[], &shared)?;
        Ok(SkbPath { prog, drop, links: Vec::new() })
    }

    /// Puts the fast path on interface `ifindex`, whose frames for xpfd go into the ingress of
    /// `rx` (an ifb device xpfd's packet socket reads, opened before this), its new
    /// connections (TCP SYNs without ACK) into `syn`'s when there is one.
    pub fn attach(&mut self, ifindex: u32, rx: u32, syn: Option<u32>) -> io::Result<()> {
        self.links.push(tcx_ingress(&self.drop, rx)?);
        if let Some(s) = syn {
            self.links.push(tcx_ingress(&self.drop, s)?);
        }
        // struct divert: rx, syn (0: none).
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&rx.to_ne_bytes());
        v[4..].copy_from_slice(&syn.unwrap_or(0).to_ne_bytes());
        self.prog.map("divert").update(&ifindex.to_ne_bytes(), &v)?;
        self.links.push(tcx_ingress(&self.prog, ifindex)?);
        Ok(())
    }

    /// The translation targets' maps (`natnet`, `natport`) for
    /// [`crate::steer::set_nat_targets`], shared.
    pub fn nat_maps(&self) -> io::Result<(crate::bpf::Map, crate::bpf::Map)> {
        Ok((self.prog.map("natnet").share()?, self.prog.map("natport").share()?))
    }

    pub fn counters(&self) -> [u64; SKB_COUNTERS.len()] {
        let m = self.prog.map("skb_stats");
        std::array::from_fn(|i| m.percpu_sum(i as u32).unwrap_or(0))
    }
}
