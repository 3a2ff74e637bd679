//! Hand-off between workers: both directions of a flow meet the worker that holds its state.
//!
//! A queue's frames reach the worker that owns the queue, and neither veth nor most NICs pick
//! the queue of a reply symmetrically. So each worker computes, for every frame it receives,
//! the owner of its flow from a hash that is the same both ways, and passes frames owned by
//! another worker to it by a bounded channel (a copy of the frame with the steering program's
//! metadata in front, as VPP's handoff does). The owner filters it as if it had received it.
//!
//! The hash covers the two addresses only, not the ports: every fragment of a datagram has
//! them (the first alone has the ports), so a datagram is reassembled where its flow's state
//! is; an ICMP error is owned by the flow it quotes (the addresses of the packet inside it).
//! The cost: all the flows between two hosts go to one worker.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use xpf_wire::icmp::{kind_v4, kind_v6, Kind};
use xpf_wire::pdesc::{portless, IPPROTO_ICMP, IPPROTO_ICMPV6, PROTO_PORTLESS};
use xpf_wire::{ethernet, ipv4, ipv6};

/// Frames a worker can have waiting for it from the others.
pub const DEPTH: usize = 4096;

/// A frame for another worker: the steering program's metadata and the frame, the interface
/// it came in on, the receive descriptor's options (packet mode: GSO), and the worker that
/// sent it (its buffer goes back there).
pub struct Item {
    pub ifindex: u32,
    pub options: u32,
    pub from: usize,
    pub buf: Vec<u8>,
}

/// One worker's end: a sender to every worker (its own unused) and its own receiver, and the
/// same pair for buffers going back to their sender, so that frames in flight are copied into
/// reused buffers instead of a new allocation each.
pub struct Handoff {
    pub me: usize,
    /// Every worker's wake, in worker order: a worker asleep is rung for what it is handed
    /// (set by the daemon once every worker's exists; empty, nobody is rung).
    pub wakes: Vec<std::sync::Arc<crate::dataplane::Wake>>,
    to: Vec<SyncSender<Item>>,
    pub inbox: Receiver<Item>,
    back: Vec<SyncSender<Vec<u8>>>,
    spare: Receiver<Vec<u8>>,
}

/// The ends for `n` workers, in worker order.
pub fn mesh(n: usize) -> Vec<Handoff> {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| std::sync::mpsc::sync_channel(DEPTH)).unzip();
    let (backs, spares): (Vec<_>, Vec<_>) = (0..n).map(|_| std::sync::mpsc::sync_channel(DEPTH)).unzip();
    rxs.into_iter()
        .zip(spares)
        .enumerate()
        .map(|(me, (inbox, spare))| Handoff {
            me,
            wakes: Vec::new(),
            to: txs.clone(),
            inbox,
            back: backs.clone(),
            spare,
        })
        .collect()
}

impl Handoff {
    pub fn workers(&self) -> usize {
        self.to.len()
    }

    /// Passes a copy of `frame` to worker `w`; false when its queue is full (dropped).
    pub fn send(&self, w: usize, ifindex: u32, options: u32, frame: &[u8]) -> bool {
        let mut buf = self.spare.try_recv().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        let item = Item { ifindex, options, from: self.me, buf };
        match self.to[w].try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Gives a received item's buffer back to the worker that filled it (dropped if its
    /// spares are full).
    pub fn recycle(&self, item: Item) {
        let _ = self.back[item.from].try_send(item.buf);
    }
}

/// The worker (of `n`) that owns the flow of an Ethernet frame: the same for both directions.
pub fn owner(frame: &[u8], n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let Some((a, b)) = addresses(frame) else { return 0 };
    of_folded(a, b, n)
}

/// What the hand-off owns translated traffic by: a packet to an address a translation maps
/// host by host (binat-to) by the flow it maps back to, whatever its protocol; a packet to a
/// `nat-to` pool's address by its destination port (each worker hands out only ports p with
/// p mod workers = its index, so a reply names the worker that translated its flow); a
/// packet from or to the forwarded port of a target chosen per flow by the far end and the
/// forwarding's public address; a packet to a `rdr-to` rule's address by the flow as it will
/// be translated (its source and the target its destination gives, the pair its replies hash
/// to); a packet between a host of a network whose translation remembers per host
/// (`endpoint-independent`, `sticky-address`) and an address outside it by that host alone,
/// and so the flows a map or a forwarding leads to such a host; a TCP or UDP packet (an ICMP
/// echo) between a host of a network translated many to one keeping its ports
/// (`static-port`) and an address outside it by that host's port (the echo's identifier), as
/// the replies to the pool are; a packet of a protocol without ports (GRE, ESP, ...) that a
/// many-to-one translation may take, to its pool or crossing its interface between inside
/// and outside, by its far end's address (the source of what comes in there, the
/// destination of what leaves), which its replies to the pool carry too. Built from the
/// ruleset (`Ruleset::nat_owners`, `nat_maps`, `nat_fronts`, `nat_hosts`, `nat_ports`,
/// `nat_bare`).
#[derive(Debug, Default, Clone)]
pub struct NatOwners {
    maps: Vec<(Prefix, Prefix)>,
    pools: Vec<Match>,
    fronts: Vec<Front>,
    rdr: Vec<(Match, Prefix)>,
    hosts: Vec<Prefix>,
    ports: Vec<Prefix>,
    bare: Vec<u32>,
}

/// Where a frame came in and where the kernel's routes send it (0: to this host, or not
/// known): what the owner of a flow translated by its addresses alone is told by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    pub ingress: u32,
    pub egress: u32,
}

/// A port forwarding to targets chosen per flow (`NatFront`): a TCP or UDP packet from one
/// of `back`'s addresses with a source port in `lo..=hi` is owned as its destination and
/// `front`, one to such an address and port as its source and `front`.
#[derive(Debug, Clone)]
struct Front {
    front: [u8; 16],
    v4: bool,
    proto: u8,
    lo: u16,
    hi: u16,
    back: Vec<Prefix>,
}

impl Front {
    fn holds(&self, v4: bool, proto: u8, addr: &[u8; 16], port: u16) -> bool {
        self.v4 == v4
            && self.proto == proto
            && port >= self.lo
            && port <= self.hi
            && self.back.iter().any(|b| b.covers(v4, addr))
    }
}

/// A network (family `v4`; IPv4 in the first four bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefix {
    v4: bool,
    net: [u8; 16],
    len: u8,
}

impl Prefix {
    pub(crate) fn of(net: std::net::IpAddr, len: u8) -> Prefix {
        Prefix { v4: net.is_ipv4(), net: xpf_wire::Addr::from_ip(net).0, len }
    }

    pub(crate) fn covers(&self, v4: bool, addr: &[u8; 16]) -> bool {
        let (bytes, bits) = ((self.len / 8) as usize, self.len % 8);
        self.v4 == v4
            && addr[..bytes] == self.net[..bytes]
            && (bits == 0 || (addr[bytes] ^ self.net[bytes]) & (0xff << (8 - bits)) == 0)
    }

    /// `addr`'s host bits under this network's bits (pf's bitmask pool).
    fn graft(&self, addr: &[u8; 16]) -> [u8; 16] {
        let mut out = *addr;
        for (i, b) in out.iter_mut().enumerate() {
            let keep = (self.len as usize).saturating_sub(i * 8).min(8);
            let m = (0xff00u16 >> keep) as u8;
            *b = (self.net[i] & m) | (*b & !m);
        }
        out
    }
}

/// Packets of `proto` to `net/len` (family `v4`) whose destination port (an echo reply's
/// identifier) is in `lo..=hi`.
#[derive(Debug, Clone, Copy)]
struct Match {
    to: Prefix,
    proto: u8,
    lo: u16,
    hi: u16,
}

impl Match {
    fn covers(&self, v4: bool, addr: &[u8; 16], proto: u8, port: u16) -> bool {
        (self.proto == proto || self.proto == PROTO_PORTLESS && portless(proto))
            && port >= self.lo
            && port <= self.hi
            && self.to.covers(v4, addr)
    }
}

/// (IPv4, protocol, source, destination, destination port, source port).
type Fields = (bool, u8, [u8; 16], [u8; 16], u16, u16);

/// A frame's family, protocol, source, destination, destination port (an ICMP echo reply's
/// identifier) and source port (0 for ICMP), or for an ICMP error those of the packet it
/// quotes turned round (the quoted packet went the other way): the fields a translation
/// target is recognised by.
fn target_fields(frame: &[u8]) -> Option<Fields> {
    let (v4, proto, src, dst, l4) = transport(frame)?;
    let word = |b: &[u8], at: usize| b.get(at..at + 2).map(|w| u16::from_be_bytes([w[0], w[1]]));
    match proto {
        6 | 17 => Some((v4, proto, src, dst, word(l4, 2)?, word(l4, 0)?)),
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let t = *l4.first()?;
            let error = is_error(v4, t);
            if error {
                let (qp, qs, qd, ql4) = quoted(v4, l4)?;
                let (port, sport) = match qp {
                    6 | 17 => (word(ql4, 0)?, word(ql4, 2)?),
                    _ => (word(ql4, 4)?, 0),
                };
                return Some((v4, qp, qd, qs, port, sport));
            }
            let reply = if v4 { t == 0 } else { t == 129 };
            reply.then_some(())?;
            Some((v4, proto, src, dst, word(l4, 4)?, 0))
        }
        _ => None,
    }
}

/// (IPv4, protocol, source, destination, transport header and payload).
type Transport<'a> = (bool, u8, [u8; 16], [u8; 16], &'a [u8]);
/// (protocol, source, destination, transport bytes) of a quoted packet.
type Quote<'a> = (u8, [u8; 16], [u8; 16], &'a [u8]);

/// A frame's family, transport protocol, source, destination and transport header and
/// payload (IPv6's past its extension headers); None for later fragments.
#[inline(always)]
fn transport(frame: &[u8]) -> Option<Transport<'_>> {
    let (ty, l3) = l3_of(frame)?;
    Some(match ty {
        ethernet::ETHERTYPE_IPV4 => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            if ip.frag_offset() != 0 {
                return None;
            }
            let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
            s[..4].copy_from_slice(&ip.src());
            d[..4].copy_from_slice(&ip.dst());
            (true, ip.protocol(), s, d, l3.get(ip.header_len()..ip.total_len())?)
        }
        ethernet::ETHERTYPE_IPV6 => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            let payload = l3.get(40..40 + ip.payload_len())?;
            match ip.next_header() {
                p @ (6 | 17 | IPPROTO_ICMPV6) => (false, p, ip.src(), ip.dst(), payload),
                _ => {
                    // Past extension headers; a later fragment has no transport header.
                    let ext = ip.walk().ok()?;
                    if ext.fragment.is_some_and(|f| f.offset != 0) {
                        return None;
                    }
                    (false, ext.proto, ip.src(), ip.dst(), payload.get(ext.offset..)?)
                }
            }
        }
        _ => return None,
    })
}

/// An ICMP error's (transport header and payload `l4`) quoted packet: its protocol, source,
/// destination and transport bytes, from its header after the error's 8 bytes.
#[inline(always)]
fn quoted(v4: bool, l4: &[u8]) -> Option<Quote<'_>> {
    let q = l4.get(8..)?;
    if v4 {
        let h = ipv4::Quoted::new_checked(q).ok()?;
        let hl = ((q[0] & 0x0f) as usize) * 4;
        let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
        s[..4].copy_from_slice(&h.src());
        d[..4].copy_from_slice(&h.dst());
        Some((h.protocol(), s, d, q.get(hl..)?))
    } else {
        let h = ipv6::Quoted::new_checked(q).ok()?;
        Some((h.next_header(), h.src(), h.dst(), q.get(40..)?))
    }
}

impl NatOwners {
    /// What ruleset `r` translates, as the hand-off owns it.
    pub fn of(r: &xpf_conf::compile::Ruleset) -> NatOwners {
        let mut o = NatOwners::from_targets(&r.nat_owners, &r.nat_maps);
        o.fronts = r
            .nat_fronts
            .iter()
            .map(|f| Front {
                front: xpf_wire::Addr::from_ip(f.front).0,
                v4: f.front.is_ipv4(),
                proto: f.proto,
                lo: f.ports.0,
                hi: f.ports.1,
                back: r.pools[f.pool].nets.iter().map(|n| Prefix::of(n.addr.to_ip(n.af), n.len)).collect(),
            })
            .collect();
        o.hosts = r.nat_hosts.iter().map(|h| Prefix::of(h.net.0, h.net.1)).collect();
        o.ports = r.nat_ports.iter().map(|h| Prefix::of(h.net.0, h.net.1)).collect();
        o.bare = r.nat_bare.iter().flat_map(|b| b.on.iter().flatten().map(|&i| i as u32)).collect();
        o
    }

    pub fn from_targets(ts: &[xpf_conf::compile::Target], maps: &[xpf_conf::compile::NatMap]) -> NatOwners {
        use xpf_conf::compile::By;
        let mut o = NatOwners {
            maps: maps.iter().map(|m| (Prefix::of(m.from.0, m.from.1), Prefix::of(m.to.0, m.to.1))).collect(),
            ..Default::default()
        };
        for t in ts {
            let to = t.net.map_or(Prefix { v4: t.af == xpf_wire::pdesc::AF_INET, net: [0; 16], len: 0 }, |(a, l)| {
                Prefix::of(a, l)
            });
            let (lo, hi) = if t.port != 0 { (t.port, t.port) } else { (t.lo, t.hi) };
            let m = Match { to, proto: t.proto, lo, hi };
            match t.by {
                By::Nat => o.pools.push(m),
                By::Rdr(Some((a, l))) => o.rdr.push((m, Prefix::of(a, l))),
                // The maps own these; a target chosen per flow leaves it to the address hash.
                By::Map | By::Rdr(None) => {}
            }
        }
        // What a map holds whole is the map's (binat-to's way back in among them): no second
        // look at a frame for it.
        let held = |m: &Match| o.maps.iter().any(|(from, _)| from.len <= m.to.len && from.covers(m.to.v4, &m.to.net));
        let (pools, rdr) = (
            o.pools.iter().filter(|m| !held(m)).copied().collect(),
            o.rdr.iter().filter(|(m, _)| !held(m)).copied().collect(),
        );
        NatOwners { pools, rdr, ..o }
    }

    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
            && self.pools.is_empty()
            && self.fronts.is_empty()
            && self.rdr.is_empty()
            && self.hosts.is_empty()
            && self.ports.is_empty()
            && self.bare.is_empty()
    }

    /// [`NatOwners::owner_on`] of a frame whose path does not matter (tests).
    #[cfg(test)]
    fn owner(&self, frame: &[u8], n: usize) -> Option<usize> {
        self.owner_on(frame, n, Path::default())
    }

    /// Whether a translation may take protocols without ports on some interface: the
    /// owner then needs the frame's [`Path`].
    pub fn needs_path(&self) -> bool {
        !self.bare.is_empty()
    }

    /// The worker (of `n`) that owns `frame` (which came and goes by `path`) by its
    /// translation, None when no translation target names it (the address hash decides).
    pub fn owner_on(&self, frame: &[u8], n: usize, path: Path) -> Option<usize> {
        if self.maps.is_empty() && self.hosts.is_empty() && self.ports.is_empty() && self.bare.is_empty() {
            return self.by_target(frame, n);
        }
        self.by_more(frame, n, path)
    }

    /// [`NatOwners::owner_on`] with maps, hosts, ports or protocols without ports to look at
    /// too: out of line, so that a ruleset of pools and forwardings alone keeps its owner
    /// short.
    #[inline(never)]
    fn by_more(&self, frame: &[u8], n: usize, path: Path) -> Option<usize> {
        let ends = if self.maps.is_empty() && self.hosts.is_empty() { None } else { map_fields(frame) };
        if let Some((v4, peer, ours)) = ends {
            if let Some((_, to)) = self.maps.iter().find(|(from, _)| from.covers(v4, &ours)) {
                return Some(self.inside(v4, &peer, &to.graft(&ours), n));
            }
        }
        if !self.bare.is_empty() {
            if let Some(w) = self.by_far_end(frame, n, path) {
                return Some(w);
            }
        }
        if !(self.pools.is_empty() && self.fronts.is_empty() && self.rdr.is_empty()) {
            if let Some(w) = self.by_target(frame, n) {
                return Some(w);
            }
        }
        if !self.ports.is_empty() {
            if let Some(w) = port_fields(frame)
                .and_then(|(v4, src, dst, sport, dport)| self.by_port(v4, &src, &dst, sport, dport, n))
            {
                return Some(w);
            }
        }
        let (v4, a, b) = ends?;
        self.by_host(v4, &a, &b, n)
    }

    /// A packet of a protocol without ports (an ICMP error: the packet it quotes, turned
    /// round) to a pool, or coming in through one of [`NatOwners::bare`]'s interfaces to
    /// go elsewhere (by its source), or going out through one from elsewhere (by its
    /// destination): its far end's owner. None for other packets and for one that crosses
    /// none of those interfaces or two of them.
    fn by_far_end(&self, frame: &[u8], n: usize, path: Path) -> Option<usize> {
        let (v4, proto, src, dst) = bare_fields(frame)?;
        let to_pool = self.pools.iter().any(|m| m.covers(v4, &dst, proto, 0));
        let (came, goes) = (self.bare.contains(&path.ingress), self.bare.contains(&path.egress));
        let far = match (to_pool, came, goes) {
            (true, ..) | (false, true, false) => src,
            (false, false, true) => dst,
            _ => return None,
        };
        Some(owner_of_host(v4, &far, n))
    }

    /// A flow between one host of [`NatOwners::ports`] and an address outside them: that
    /// host's port's worker. None between two of them or two others.
    fn by_port(&self, v4: bool, a: &[u8; 16], b: &[u8; 16], pa: u16, pb: u16, n: usize) -> Option<usize> {
        Some(if one_end(&self.ports, v4, a, b)? { pa } else { pb } as usize % n)
    }

    /// A packet to a pool, a front or a forwarding: its owner by the translation's target.
    #[inline]
    fn by_target(&self, frame: &[u8], n: usize) -> Option<usize> {
        let (v4, proto, src, dst, port, sport) = target_fields(frame)?;
        if self.pools.iter().any(|m| m.covers(v4, &dst, proto, port)) {
            return Some(port as usize % n);
        }
        if !self.fronts.is_empty() && matches!(proto, 6 | 17) {
            for f in &self.fronts {
                if f.holds(v4, proto, &src, sport) {
                    return Some(owner_of_pair(v4, &dst, &f.front, n));
                }
                if f.holds(v4, proto, &dst, port) {
                    return Some(owner_of_pair(v4, &src, &f.front, n));
                }
            }
        }
        let (_, to) = self.rdr.iter().find(|(m, _)| m.covers(v4, &dst, proto, port))?;
        Some(self.inside(v4, &src, &to.graft(&dst), n))
    }

    /// The owner of a flow between `peer` and the inside address `host` a map or forwarding
    /// leads to: the host's alone when its translation remembers per host, else the pair's.
    fn inside(&self, v4: bool, peer: &[u8; 16], host: &[u8; 16], n: usize) -> usize {
        match self.hosts.iter().any(|h| h.covers(v4, host)) {
            true => owner_of_host(v4, host, n),
            false => owner_of_pair(v4, peer, host, n),
        }
    }

    /// A flow between one host of [`NatOwners::hosts`] and an address outside them: that
    /// host's owner. None between two of them or two others (the address hash).
    fn by_host(&self, v4: bool, a: &[u8; 16], b: &[u8; 16], n: usize) -> Option<usize> {
        Some(owner_of_host(v4, if one_end(&self.hosts, v4, a, b)? { a } else { b }, n))
    }

    /// [`NatOwners::synced_owner`] of a state that is not an `out` state (tests).
    #[cfg(test)]
    pub fn state_owner(&self, v4: bool, proto: u8, addr: &[[u8; 16]; 2], port: [u16; 2], n: usize) -> usize {
        self.synced_owner(v4, proto, addr, port, None, n)
    }

    /// The worker whose packets a state synced from the peer belongs to, from its stack key
    /// (the flow before translation; IPv4 in the first four bytes), protocol, and for an
    /// `out` state its wire key's addresses (`out_wire`): the worker
    /// [`NatOwners::owner_on`] hands its packets to. A forwarding's target chosen per flow is
    /// owned with the public address (which the stack key does not hold); a host whose
    /// translation remembers per host by itself; an outbound flow of a protocol without
    /// ports translated many to one (its wire key's inside address changed, the far end
    /// `addr[0]` kept) by its far end; other flows by their two addresses. Other states of
    /// protocols without ports whose packets the far end owns land elsewhere; on the worker
    /// their packets meet, the rules that made them make them again.
    pub fn synced_owner(
        &self,
        v4: bool,
        proto: u8,
        addr: &[[u8; 16]; 2],
        port: [u16; 2],
        out_wire: Option<&[[u8; 16]; 2]>,
        n: usize,
    ) -> usize {
        if n <= 1 {
            return 0;
        }
        if let Some(w) = out_wire.filter(|_| !self.bare.is_empty() && portless(proto)) {
            if w[0] == addr[0] && w[1] != addr[1] {
                return owner_of_host(v4, &addr[0], n);
            }
        }
        for f in &self.fronts {
            for k in 0..2 {
                if f.holds(v4, proto, &addr[k], port[k]) {
                    return owner_of_pair(v4, &addr[1 - k], &f.front, n);
                }
            }
        }
        let ported = matches!(proto, 6 | 17 | IPPROTO_ICMP | IPPROTO_ICMPV6);
        ported
            .then(|| self.by_port(v4, &addr[0], &addr[1], port[0], port[1], n))
            .flatten()
            .or_else(|| self.by_host(v4, &addr[0], &addr[1], n))
            .unwrap_or_else(|| owner_of_pair(v4, &addr[0], &addr[1], n))
    }
}

/// Whether exactly one of `a` and `b` is in `nets`: Some(true) for `a`, Some(false) for `b`,
/// None for both or neither.
fn one_end(nets: &[Prefix], v4: bool, a: &[u8; 16], b: &[u8; 16]) -> Option<bool> {
    let held = |x: &[u8; 16]| nets.iter().any(|h| h.covers(v4, x));
    match (held(a), held(b)) {
        (true, false) => Some(true),
        (false, true) => Some(false),
        _ => None,
    }
}

/// The first fragments a hand-off owned, remembered for the later ones: a datagram's later
/// fragments carry no port, so a reply to a `nat-to` pool or a forwarding's target that
/// came in pieces would have its first piece owned by its port and the rest by the address
/// hash, and be reassembled nowhere. The fragments of one datagram come in on one queue (a
/// NIC's receive hash of a fragment is its addresses'; a kernel's fanout alike), so the
/// worker that owned the first piece sees the rest: it sends them where the first went.
/// Direct-mapped by addresses and identification (and IPv4's protocol), IPv4 and IPv6 alike
/// (IPv6's fragment header after the fixed header or other extension headers, the first
/// piece's port read past them): a datagram whose slot another took before its later pieces
/// came, or whose later pieces came first, falls back to the address hash as before.
pub struct Fragments {
    slots: Box<[(u64, u8)]>,
}

impl Default for Fragments {
    fn default() -> Self {
        Fragments { slots: vec![(0, 0); FRAGMENT_SLOTS].into_boxed_slice() }
    }
}

const FRAGMENT_SLOTS: usize = 256;

impl Fragments {
    /// The worker (of `n`) that owns `frame` under the translations `nat`.
    #[inline]
    pub fn owner(&mut self, nat: &NatOwners, frame: &[u8], n: usize, path: Path) -> usize {
        let of = |f: &[u8]| nat.owner_on(f, n, path).unwrap_or_else(|| owner(f, n));
        match fragment_key(frame) {
            None => of(frame),
            Some((key, true)) => {
                let w = of(frame);
                self.slots[key as usize % FRAGMENT_SLOTS] = (key, w as u8);
                w
            }
            Some((key, false)) => match self.slots[key as usize % FRAGMENT_SLOTS] {
                (k, w) if k == key && (w as usize) < n => w as usize,
                _ => of(frame),
            },
        }
    }
}

/// For a fragment: its datagram's key (addresses and identification, and IPv4's protocol;
/// never 0) and whether it is the first piece.
#[inline]
fn fragment_key(frame: &[u8]) -> Option<(u64, bool)> {
    match l3_of(frame)? {
        (ethernet::ETHERTYPE_IPV4, l3) => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            if !ip.is_fragment() {
                return None;
            }
            let (s, d) = pair4(ip.src(), ip.dst());
            let key = mix(s << 32 | d) ^ mix((ip.ident() as u64) << 8 | ip.protocol() as u64);
            Some((key | 1, ip.frag_offset() == 0))
        }
        (ethernet::ETHERTYPE_IPV6, l3) => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            // A fragment header comes after the fixed header or other extension headers.
            if matches!(ip.next_header(), 6 | 17 | IPPROTO_ICMPV6) {
                return None;
            }
            let f = ip.walk().ok()?.fragment?;
            let key = mix(fold16(ip.src()) ^ fold16(ip.dst()).rotate_left(29)) ^ mix(f.ident as u64);
            Some((key | 1, f.offset == 0))
        }
        _ => None,
    }
}

/// (IPv4, source, destination, source port, destination port).
type Ported = (bool, [u8; 16], [u8; 16], u16, u16);

/// For a network translated keeping its ports: a TCP or UDP packet's family, source,
/// destination and their ports; an ICMP echo's or echo reply's with its identifier as both
/// ports; for an ICMP error, those of the packet it quotes turned round (the quoted packet
/// went the other way). None for other packets and later fragments.
fn port_fields(frame: &[u8]) -> Option<Ported> {
    let (v4, proto, src, dst, l4) = transport(frame)?;
    let word = |b: &[u8], at: usize| b.get(at..at + 2).map(|w| u16::from_be_bytes([w[0], w[1]]));
    let echo = |t: u8| if v4 { t == 0 || t == 8 } else { t == 128 || t == 129 };
    match proto {
        6 | 17 => Some((v4, src, dst, word(l4, 0)?, word(l4, 2)?)),
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let t = *l4.first()?;
            if echo(t) {
                let id = word(l4, 4)?;
                return Some((v4, src, dst, id, id));
            }
            if !is_error(v4, t) {
                return None;
            }
            let (qp, qs, qd, ql4) = quoted(v4, l4)?;
            match qp {
                6 | 17 => Some((v4, qd, qs, word(ql4, 2)?, word(ql4, 0)?)),
                IPPROTO_ICMP | IPPROTO_ICMPV6 if echo(*ql4.first()?) => {
                    let id = word(ql4, 4)?;
                    Some((v4, qd, qs, id, id))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether ICMP (`v4`) or ICMPv6 type `t` is an error, which quotes the packet it is about.
#[inline]
fn is_error(v4: bool, t: u8) -> bool {
    if v4 {
        kind_v4(t) == Kind::Error
    } else {
        kind_v6(t) == Kind::Error
    }
}

/// A packet of a protocol without ports: its family, protocol, source and destination; for
/// an ICMP error quoting one, those of the packet it quotes turned round. None for other
/// packets and later fragments.
fn bare_fields(frame: &[u8]) -> Option<(bool, u8, [u8; 16], [u8; 16])> {
    // TCP and UDP, most of what comes, leave at the protocol byte.
    let (ty, l3) = l3_of(frame)?;
    let first = match ty {
        ethernet::ETHERTYPE_IPV4 => *l3.get(9)?,
        ethernet::ETHERTYPE_IPV6 => *l3.get(6)?,
        _ => return None,
    };
    if matches!(first, 6 | 17) {
        return None;
    }
    let (v4, proto, src, dst, l4) = transport(frame)?;
    if portless(proto) {
        return Some((v4, proto, src, dst));
    }
    let t = *l4.first()?;
    let error = proto == if v4 { IPPROTO_ICMP } else { IPPROTO_ICMPV6 } && is_error(v4, t);
    let (qp, qs, qd, _) = error.then(|| quoted(v4, l4)).flatten()?;
    portless(qp).then_some((v4, qp, qd, qs))
}

/// For a host-by-host map and a network of hosts: a frame's family, the far end's address and
/// the address that may be a mapped one (the destination), of any protocol, fragments too; for
/// an ICMP error, of the packet it quotes, which went the other way (its destination, its
/// source).
fn map_fields(frame: &[u8]) -> Option<(bool, [u8; 16], [u8; 16])> {
    match l3_of(frame)? {
        (ethernet::ETHERTYPE_IPV4, l3) => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            let wide = |a: [u8; 4]| {
                let mut w = [0u8; 16];
                w[..4].copy_from_slice(&a);
                w
            };
            if ip.protocol() == IPPROTO_ICMP
                && !ip.is_fragment()
                && ip.payload().first().is_some_and(|&t| kind_v4(t) == Kind::Error)
            {
                let q = ipv4::Quoted::new_checked(ip.payload().get(8..)?).ok()?;
                return Some((true, wide(q.dst()), wide(q.src())));
            }
            Some((true, wide(ip.src()), wide(ip.dst())))
        }
        (ethernet::ETHERTYPE_IPV6, l3) => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            if ip.next_header() == IPPROTO_ICMPV6 && ip.payload().first().is_some_and(|&t| kind_v6(t) == Kind::Error) {
                let q = ipv6::Quoted::new_checked(ip.payload().get(8..)?).ok()?;
                return Some((false, q.dst(), q.src()));
            }
            Some((false, ip.src(), ip.dst()))
        }
        _ => None,
    }
}

/// The same owner from a state's two addresses (pf's 16-byte form, IPv4 in the first four):
/// where a state synced from the peer goes, so that its packets find it.
pub fn owner_of_pair(v4: bool, a: &[u8; 16], b: &[u8; 16], n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let f = |x: &[u8; 16]| if v4 { u32::from_ne_bytes([x[0], x[1], x[2], x[3]]) as u64 } else { fold16(*x) };
    of_folded(f(a), f(b), n)
}

/// The owner of every flow of one host (a network's of [`NatOwners::hosts`]).
fn owner_of_host(v4: bool, a: &[u8; 16], n: usize) -> usize {
    let x = if v4 { u32::from_ne_bytes([a[0], a[1], a[2], a[3]]) as u64 } else { fold16(*a) };
    (mix(mix(x) ^ 0x686f_7374) % n as u64) as usize
}

fn of_folded(a: u64, b: u64, n: usize) -> usize {
    // Symmetric: each address mixed alone, the two combined by addition.
    let h = mix(a).wrapping_add(mix(b));
    (mix(h) % n as u64) as usize
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn fold16(a: [u8; 16]) -> u64 {
    let (h, l) = a.split_at(8);
    u64::from_ne_bytes(h.try_into().unwrap()) ^ u64::from_ne_bytes(l.try_into().unwrap()).rotate_left(17)
}

/// The flow's two addresses (folded to 64 bits): the packet's, or for an ICMP error those
/// of the packet it quotes.
fn addresses(frame: &[u8]) -> Option<(u64, u64)> {
    match l3_of(frame)? {
        (ethernet::ETHERTYPE_IPV4, l3) => v4(l3),
        (ethernet::ETHERTYPE_IPV6, l3) => v6(l3),
        _ => None,
    }
}

/// The ethertype and network-layer bytes of an Ethernet frame (behind one VLAN tag).
fn l3_of(frame: &[u8]) -> Option<(u16, &[u8])> {
    let ty = ethernet::Frame::new_checked(frame).ok()?.ethertype();
    let l3 = frame.get(ethernet::HEADER_LEN..)?;
    if ty == ethernet::ETHERTYPE_VLAN {
        let tag = ethernet::VlanTag::new_checked(l3).ok()?.ethertype();
        return Some((tag, l3.get(ethernet::VLAN_TAG_LEN..)?));
    }
    Some((ty, l3))
}

/// Whether an Ethernet frame is an ICMP or ICMPv6 error.
pub fn icmp_error(frame: &[u8]) -> bool {
    match l3_of(frame) {
        Some((ethernet::ETHERTYPE_IPV4, l3)) => ipv4::Packet::new_checked(l3).is_ok_and(|ip| {
            ip.protocol() == IPPROTO_ICMP
                && !ip.is_fragment()
                && ip.payload().first().is_some_and(|&t| kind_v4(t) == Kind::Error)
        }),
        Some((ethernet::ETHERTYPE_IPV6, l3)) => ipv6::Packet::new_checked(l3).is_ok_and(|ip| {
            ip.next_header() == IPPROTO_ICMPV6 && ip.payload().first().is_some_and(|&t| kind_v6(t) == Kind::Error)
        }),
        _ => false,
    }
}

// The outer packet is read whole (its payload holds an ICMP error's quote); a quoted one is
// its header only.
fn v4(l3: &[u8]) -> Option<(u64, u64)> {
    let ip = ipv4::Packet::new_checked(l3).ok()?;
    if ip.protocol() == IPPROTO_ICMP && !ip.is_fragment() {
        if let Some(&t) = ip.payload().first() {
            if kind_v4(t) == Kind::Error {
                if let Some(q) = ip.payload().get(8..).and_then(|b| ipv4::Quoted::new_checked(b).ok()) {
                    return Some(pair4(q.src(), q.dst()));
                }
            }
        }
    }
    Some(pair4(ip.src(), ip.dst()))
}

fn v6(l3: &[u8]) -> Option<(u64, u64)> {
    let ip = ipv6::Packet::new_checked(l3).ok()?;
    if ip.next_header() == IPPROTO_ICMPV6 {
        if let Some(&t) = ip.payload().first() {
            if kind_v6(t) == Kind::Error {
                if let Some(q) = ip.payload().get(8..).and_then(|b| ipv6::Quoted::new_checked(b).ok()) {
                    return Some((fold16(q.src()), fold16(q.dst())));
                }
            }
        }
    }
    Some((fold16(ip.src()), fold16(ip.dst())))
}

fn pair4(a: [u8; 4], b: [u8; 4]) -> (u64, u64) {
    (u32::from_ne_bytes(a) as u64, u32::from_ne_bytes(b) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&ethernet::ETHERTYPE_IPV4.to_be_bytes());
        let mut ip = vec![0u8; 20];
        ipv4::emit_header(&mut ip, src, dst, proto, (20 + payload.len()) as u16, 64, 1);
        f.extend(ip);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn both_directions_have_one_owner_and_flows_spread() {
        let mut seen = [0usize; 4];
        for i in 0..200u8 {
            let a = [10, 0, 1, i];
            let b = [10, 0, 2, 2];
            let fwd = frame4(a, b, 17, &[0; 8]);
            let rev = frame4(b, a, 17, &[0; 8]);
            let o = owner(&fwd, 4);
            assert_eq!(o, owner(&rev, 4), "host {i}");
            seen[o] += 1;
        }
        assert!(seen.iter().all(|&c| c > 20), "{seen:?}");
    }

    #[test]
    fn translated_replies_and_forwardings_meet_their_flows_worker() {
        use xpf_conf::compile::{By, Target};
        let public = std::net::IpAddr::from([192, 0, 2, 1]);
        let inside = std::net::IpAddr::from([10, 0, 1, 2]);
        let t = |proto, port, lo, hi, by| Target {
            af: xpf_wire::pdesc::AF_INET,
            proto,
            net: Some((public, 32)),
            port,
            lo,
            hi,
            by,
        };
        let nat = NatOwners::from_targets(
            &[
                t(17, 0, 50001, 65535, By::Nat),
                t(1, 0, 0, 65535, By::Nat),
                t(6, 8022, 0, 0, By::Rdr(Some((inside, 32)))),
            ],
            &[],
        );
        let udp = |sp: u16, dp: u16| {
            let mut u = vec![0u8; 8];
            u[..2].copy_from_slice(&sp.to_be_bytes());
            u[2..4].copy_from_slice(&dp.to_be_bytes());
            u
        };
        for n in 2..6 {
            for port in [50001u16, 50002, 61234] {
                // The reply to a translated flow goes to the worker whose residue the port is.
                let reply = frame4([198, 51, 100, 7], [192, 0, 2, 1], 17, &udp(53, port));
                assert_eq!(nat.owner(&reply, n), Some(port as usize % n));
                // So does an error quoting the translated datagram.
                let mut q = vec![0u8; 20];
                ipv4::emit_header(&mut q, [192, 0, 2, 1], [198, 51, 100, 7], 17, 28, 64, 1);
                q.extend(udp(port, 53));
                let mut err = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
                err.extend(q);
                assert_eq!(nat.owner(&frame4([198, 51, 100, 7], [192, 0, 2, 1], 1, &err), n), Some(port as usize % n));
            }
            // A port forwarding: owned as the flow it becomes, where the server's replies go.
            let fwd = frame4([203, 0, 113, 9], [192, 0, 2, 1], 6, &udp(40000, 8022));
            let back = frame4([10, 0, 1, 2], [203, 0, 113, 9], 6, &udp(7000, 40000));
            assert_eq!(nat.owner(&fwd, n), Some(owner(&back, n)));
            // Anything else is the address hash's.
            assert_eq!(nat.owner(&frame4([198, 51, 100, 7], [192, 0, 2, 1], 17, &udp(53, 40000)), n), None);
            assert_eq!(nat.owner(&back, n), None);
        }
    }

    /// binat-to (a network mapped host by host) and a port forwarding to a network mapped
    /// likewise, compiled from pf.conf: every packet to a mapped address, of any protocol,
    /// goes where its flow's packets from the inside go; a many-to-one `static-port` is no map.
    #[test]
    fn host_by_host_maps_own_packets_as_the_flow_they_map_back_to() {
        // OpenBSD's binat-to and FreeBSD's binat alike.
        let openbsd = "match on fs inet from 10.0.1.0/26 to any binat-to 192.0.2.64/26\n\
                       pass in on fs inet proto tcp to 198.51.100.0/28 port 80 rdr-to 10.0.3.16/28\n\
                       match out on fs inet from 10.0.9.0/24 nat-to 192.0.2.200 static-port\n";
        let freebsd = "binat on fs inet from 10.0.1.0/26 to any -> 192.0.2.64/26\n\
                       rdr on fs inet proto tcp to 198.51.100.0/28 port 80 -> 10.0.3.16/28\n\
                       nat on fs inet from 10.0.9.0/24 to any -> 192.0.2.200 static-port\n\
                       pass all\n";
        for text in [openbsd, freebsd] {
            let p = xpf_conf::parse(text, "maps.conf", &[]);
            assert!(p.errors.is_empty(), "{:?}", p.errors);
            let r = xpf_conf::compile::Ruleset::compile(&p, &|_| Some(1)).unwrap();
            assert_eq!(r.nat_maps.len(), 1, "{text}: {:?}", r.nat_maps);
            assert_eq!(r.nat_maps[0].at, "maps.conf:1");
            maps_own(&NatOwners::from_targets(&r.nat_owners, &r.nat_maps));
        }
    }

    /// A TCP or UDP header's first 20 bytes with these ports.
    fn l4(sp: u16, dp: u16) -> Vec<u8> {
        let mut u = vec![0u8; 20];
        u[..2].copy_from_slice(&sp.to_be_bytes());
        u[2..4].copy_from_slice(&dp.to_be_bytes());
        u
    }

    fn maps_own(nat: &NatOwners) {
        let (far, router) = ([203, 0, 113, 9], [198, 51, 100, 254]);
        let mut moved = false;
        for n in 2..6 {
            for host in [1u8, 10, 41, 63] {
                let (inside, public) = ([10, 0, 1, host], [192, 0, 2, 64 + host]);
                let mine = owner(&frame4(inside, far, 6, &l4(40000, 443)), n);
                // Replies of any protocol (TCP, UDP, GRE), an echo request from outside, a
                // later fragment: the inside flow's worker.
                for (proto, payload) in
                    [(6, l4(443, 40000)), (17, l4(53, 40000)), (47, vec![0; 8]), (1, vec![8, 0, 0, 0, 0, 7, 0, 1])]
                {
                    assert_eq!(nat.owner(&frame4(far, public, proto, &payload), n), Some(mine), "{n} {host} {proto}");
                }
                let mut frag = frame4(far, public, 17, &[0; 16]);
                frag[14 + 6] = 0x00;
                frag[14 + 7] = 0x10;
                assert_eq!(nat.owner(&frag, n), Some(mine));
                // An error quoting what left as the public address.
                let mut q = vec![0u8; 20];
                ipv4::emit_header(&mut q, public, far, 6, 48, 64, 1);
                q.extend(l4(40000, 443));
                let mut err = vec![3u8, 1, 0, 0, 0, 0, 0, 0];
                err.extend(q);
                assert_eq!(nat.owner(&frame4(router, public, 1, &err), n), Some(mine));
                moved |= owner(&frame4(far, public, 6, &l4(443, 40000)), n) != mine;
                // The port forwarding to a network: 198.51.100.5 is 10.0.3.21.
                let fwd = frame4(far, [198, 51, 100, 5], 6, &l4(40000, 80));
                assert_eq!(nat.owner(&fwd, n), Some(owner(&frame4([10, 0, 3, 21], far, 6, &l4(80, 40000)), n)));
            }
            // Many inside hosts behind one address keeping their ports: not a map, a pool
            // whose replies go by their port (the hosts' flows owned by it too: NatPorts).
            assert_eq!(nat.owner(&frame4(far, [192, 0, 2, 200], 6, &l4(443, 40000)), n), Some(40000 % n));
        }
        assert!(moved, "the address hash alone would have sent some replies elsewhere");
    }

    /// A port forwarding to targets chosen per flow: a flow's packets to the public address
    /// and its target's replies are owned alike, as the far end and the public address; so
    /// are both ways of another flow with a target's forwarded port; a target's other ports
    /// are the address hash's. A target added to the pool's table is owned from the next
    /// ruleset.
    #[test]
    fn a_forwarding_to_targets_chosen_per_flow_is_owned_by_its_public_address() {
        let text = "table <web> { 10.0.3.1 10.0.3.2 }\n\
                    pass in on fs inet proto tcp to 192.0.2.1 port 8080 rdr-to <web> port 80 round-robin\n\
                    pass in on fs inet proto udp to 192.0.2.1 port 5000:5010 rdr-to { 10.0.4.1, 10.0.4.2 } random\n";
        let p = xpf_conf::parse(text, "fronts.conf", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let r = xpf_conf::compile::Ruleset::compile(&p, &|_| Some(1)).unwrap();
        assert_eq!(r.nat_fronts.len(), 2, "{:?}", r.nat_fronts);
        let mut t = xpf_conf::compile::Table::default();
        for a in ["10.0.3.1", "10.0.3.2", "10.0.3.3"] {
            t.insert(a.parse().unwrap(), 32, false);
        }
        let grown = r.with_table("web", t).unwrap();
        let (front, nat) = ([192, 0, 2, 1], NatOwners::of(&grown));
        let mut moved = false;
        for n in 2..6 {
            for far in [[203, 0, 113, 9], [198, 51, 100, 7], [203, 0, 113, 200]] {
                let mine = owner(&frame4(far, front, 6, &l4(40000, 8080)), n);
                assert_eq!(nat.owner(&frame4(far, front, 6, &l4(40000, 8080)), n).unwrap_or(mine), mine);
                for (proto, target, sport) in
                    [(6, [10, 0, 3, 1], 80), (6, [10, 0, 3, 3], 80), (17, [10, 0, 4, 2], 5004)]
                {
                    let mine = owner(&frame4(far, front, proto, &l4(40000, 5004)), n);
                    let reply = frame4(target, far, proto, &l4(sport, 40000));
                    assert_eq!(nat.owner(&reply, n), Some(mine), "{n} {far:?} {target:?}");
                    moved |= owner(&reply, n) != mine;
                    // An error about the reply, from a router on the way.
                    let mut q = vec![0u8; 20];
                    ipv4::emit_header(&mut q, far, target, proto, 48, 64, 1);
                    q.extend(l4(40000, sport));
                    let mut err = vec![3u8, 1, 0, 0, 0, 0, 0, 0];
                    err.extend(q);
                    assert_eq!(nat.owner(&frame4([10, 0, 9, 1], target, 1, &err), n), Some(mine));
                    // A flow straight to the target's port, and its replies: owned alike.
                    let there = nat.owner(&frame4([10, 0, 1, 7], target, proto, &l4(33000, sport)), n);
                    let back = nat.owner(&frame4(target, [10, 0, 1, 7], proto, &l4(sport, 33000)), n);
                    assert!(there.is_some() && there == back);
                }
                // The target's other ports: the address hash's.
                assert_eq!(nat.owner(&frame4([10, 0, 3, 1], far, 6, &l4(22, 40000)), n), None);
                assert_eq!(nat.owner(&frame4([10, 0, 3, 1], far, 17, &l4(80, 40000)), n), None);
            }
        }
        assert!(moved, "the address hash alone would have sent some replies elsewhere");
        // Before the table grew, its third address was nobody's.
        let old = NatOwners::of(&r);
        assert_eq!(old.owner(&frame4([10, 0, 3, 3], [203, 0, 113, 9], 6, &l4(80, 40000)), 2), None);
    }

    #[test]
    fn an_icmp_error_goes_to_the_flow_it_quotes() {
        let (a, b, r) = ([10, 0, 1, 7], [10, 0, 2, 2], [192, 0, 2, 1]);
        let flow = frame4(a, b, 17, &[0; 8]);
        // A router's port unreachable to a about a's datagram to b.
        let mut quoted = vec![0u8; 20];
        ipv4::emit_header(&mut quoted, a, b, 17, 28, 64, 1);
        quoted.extend_from_slice(&[0; 8]);
        let mut err = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        err.extend(quoted);
        let e = frame4(r, a, 1, &err);
        for n in 2..8 {
            assert_eq!(owner(&e, n), owner(&flow, n), "{n} workers");
        }
        // An echo request is its own flow.
        let echo = frame4(r, a, 1, &[8, 0, 0, 0, 0, 0, 0, 0]);
        let mut differ = false;
        for n in 2..8 {
            differ |= owner(&echo, n) != owner(&flow, n);
        }
        assert!(differ);
    }

    /// A reply to a `nat-to` pool in pieces: the first, with the port, owned by its port;
    /// the later ones, without, sent where the first went; pieces of a datagram whose first
    /// this hand-off never saw, by the address hash as before.
    #[test]
    fn a_translated_replys_later_fragments_follow_its_first() {
        use xpf_conf::compile::{By, Target};
        let public = std::net::IpAddr::from([192, 0, 2, 1]);
        let t = |proto, lo, hi| Target {
            af: xpf_wire::pdesc::AF_INET,
            proto,
            net: Some((public, 32)),
            port: 0,
            lo,
            hi,
            by: By::Nat,
        };
        let nat = NatOwners::from_targets(&[t(17, 50001, 65535), t(1, 0, 65535)], &[]);
        // Piece `k` (of 1,480 bytes each; the last without MF) of datagram `id`.
        let piece = |id: u32, k: u16, last: bool, port: u16| {
            let payload = if k == 0 { l4(53, port) } else { vec![0u8; 16] };
            let mut f = frame4([198, 51, 100, 7], [192, 0, 2, 1], 17, &payload);
            f[14 + 4..14 + 6].copy_from_slice(&(id as u16).to_be_bytes());
            let flags = (k * 185) | if last { 0 } else { 0x2000 };
            f[14 + 6..14 + 8].copy_from_slice(&flags.to_be_bytes());
            f
        };
        for n in 2..6 {
            let mut frags = Fragments::default();
            pieces_follow_their_first(&nat, &mut frags, n, &piece);
            // Behind a VLAN tag alike.
            let tagged = |f: Vec<u8>| {
                let mut t = f[..12].to_vec();
                t.extend([0x81, 0x00, 0x00, 0x07]);
                t.extend(&f[12..]);
                t
            };
            for port in [50001u16, 50002, 50003] {
                let id = 9000 + port as u32;
                assert_eq!(
                    frags.owner(&nat, &tagged(piece(id, 0, false, port)), n, Path::default()),
                    port as usize % n
                );
                assert_eq!(
                    frags.owner(&nat, &tagged(piece(id, 1, true, port)), n, Path::default()),
                    port as usize % n,
                    "{n} {port}"
                );
            }
            // A whole datagram is owned as before.
            assert_eq!(
                frags.owner(&nat, &frame4([198, 51, 100, 7], [192, 0, 2, 1], 17, &l4(53, 50003)), n, Path::default()),
                50003 % n
            );
        }
    }

    /// IPv6 alike: a reply to an IPv6 pool in pieces (a fragment header after the fixed
    /// one); its first piece's port is read past the fragment header.
    #[test]
    fn an_ipv6_replys_later_fragments_follow_its_first() {
        use xpf_conf::compile::{By, Target};
        let public: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let nat = NatOwners::from_targets(
            &[Target {
                af: xpf_wire::pdesc::AF_INET6,
                proto: 17,
                net: Some((public, 128)),
                port: 0,
                lo: 50001,
                hi: 65535,
                by: By::Nat,
            }],
            &[],
        );
        let (far, us) = (
            "2001:db8:1::7".parse::<std::net::Ipv6Addr>().unwrap().octets(),
            "2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        );
        let piece = |id: u32, k: u16, last: bool, port: u16| {
            let mut f = vec![0u8; 14];
            f[12..14].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
            let mut body = vec![17u8, 0];
            body.extend(((k * 1448) | if last { 0 } else { 1 }).to_be_bytes());
            body.extend(id.to_be_bytes());
            body.extend(if k == 0 { l4(53, port) } else { vec![0u8; 16] });
            let mut ip = vec![0u8; 40];
            ipv6::emit_header(&mut ip, &far, &us, ipv6::NH_FRAGMENT, body.len() as u16, 64);
            f.extend(ip);
            f.extend(body);
            f
        };
        for n in 2..6 {
            pieces_follow_their_first(&nat, &mut Fragments::default(), n, &piece);
        }
    }

    /// 64 datagrams in three pieces (`piece(id, k, last, port)`) replying to pool ports: the
    /// first owned by its port, the later ones sent after it (some of which the address hash
    /// would send elsewhere); a later piece whose first was never seen, by the address hash.
    fn pieces_follow_their_first(
        nat: &NatOwners,
        frags: &mut Fragments,
        n: usize,
        piece: &dyn Fn(u32, u16, bool, u16) -> Vec<u8>,
    ) {
        let mut differ = 0;
        for (i, port) in (50001u16..50065).enumerate() {
            let id = 1000 + i as u32;
            let w = port as usize % n;
            assert_eq!(nat.owner(&piece(id, 0, false, port), n), Some(w), "the first piece's port");
            assert_eq!(frags.owner(nat, &piece(id, 0, false, port), n, Path::default()), w);
            for k in 1..3 {
                assert_eq!(frags.owner(nat, &piece(id, k, k == 2, port), n, Path::default()), w, "{n} {port} {k}");
            }
            differ += (owner(&piece(id, 1, false, port), n) != w) as usize;
            assert_eq!(
                frags.owner(nat, &piece(id + 5000, 1, false, port), n, Path::default()),
                owner(&piece(id, 1, false, port), n)
            );
        }
        assert!(differ > 0, "{n}: the address hash alone sends some later pieces elsewhere");
    }

    fn wide4(x: [u8; 4]) -> [u8; 16] {
        let mut w = [0u8; 16];
        w[..4].copy_from_slice(&x);
        w
    }

    /// The hosts of a translation that remembers per host (`endpoint-independent`,
    /// `sticky-address`): every flow between one of them and an address outside, of any
    /// protocol, either way, fragments and errors too, meets one worker, the host's; so do
    /// the flows a forwarding or a map leads to such a host. Replies to the pool still go by
    /// their port; a forwarding to targets chosen per flow stays its public address's; a
    /// synced state goes where its packets go.
    #[test]
    fn hosts_of_a_translation_remembering_per_host_own_their_flows() {
        let text = "match out on fs inet proto udp from 10.0.1.0/24 nat-to 192.0.2.1 endpoint-independent\n\
                    pass in on fs inet proto tcp to 192.0.2.1 port 80 rdr-to 10.0.1.80\n\
                    match on fs inet from 10.0.1.128/26 to any binat-to 192.0.2.128/26\n\
                    pass in on fs inet proto tcp to 192.0.2.2 port 443 rdr-to { 10.0.1.5, 10.0.1.6 } round-robin sticky-address\n\
                    pass all\n";
        let p = xpf_conf::parse(text, "hosts.conf", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let r = xpf_conf::compile::Ruleset::compile(&p, &|_| Some(1)).unwrap();
        assert_eq!(r.nat_hosts.len(), 1, "{:?}", r.nat_hosts);
        assert_eq!(r.nat_hosts[0].at, "hosts.conf:1");
        let nat = NatOwners::of(&r);
        let (router, front) = ([198, 51, 100, 254], [192, 0, 2, 2]);
        let fars = [[203, 0, 113, 9], [198, 51, 100, 7], [8, 8, 8, 8], [203, 0, 113, 200]];
        for n in 2..6 {
            let mut used = vec![false; n];
            let mut split = 0;
            for host in (1..=254u8).step_by(3) {
                let inside = [10, 0, 1, host];
                let mine = nat.owner(&frame4(inside, fars[0], 17, &l4(40000, 53)), n).expect("a host's flow");
                used[mine] = true;
                for far in fars {
                    // Its flows to every destination, both ways, of any protocol.
                    for (proto, out, back) in [
                        (17, l4(40000, 53), l4(53, 40000)),
                        (6, l4(40001, 443), l4(443, 40001)),
                        (47, vec![0; 8], vec![0; 8]),
                        (1, vec![8, 0, 0, 0, 0, 7, 0, 1], vec![0, 0, 0, 0, 0, 7, 0, 1]),
                    ] {
                        assert_eq!(
                            nat.owner(&frame4(inside, far, proto, &out), n),
                            Some(mine),
                            "{n} {inside:?} {far:?}"
                        );
                        assert_eq!(
                            nat.owner(&frame4(far, inside, proto, &back), n),
                            Some(mine),
                            "{n} {far:?} {inside:?}"
                        );
                    }
                    split += (owner(&frame4(inside, far, 17, &l4(40000, 53)), n) != mine) as usize;
                    // A later fragment, and an error quoting the host's datagram.
                    let mut frag = frame4(far, inside, 17, &[0; 16]);
                    frag[14 + 7] = 0x10;
                    assert_eq!(nat.owner(&frag, n), Some(mine));
                    let mut q = vec![0u8; 20];
                    ipv4::emit_header(&mut q, inside, far, 17, 28, 64, 1);
                    q.extend(&l4(40000, 53)[..8]);
                    let mut err = vec![11u8, 0, 0, 0, 0, 0, 0, 0];
                    err.extend(q);
                    assert_eq!(nat.owner(&frame4(router, inside, 1, &err), n), Some(mine));
                    // The synced state of the host's flow (its stack key, either order).
                    let (a, b) = (wide4(inside), wide4(far));
                    assert_eq!(nat.state_owner(true, 17, &[a, b], [40000, 53], n), mine);
                    assert_eq!(nat.state_owner(true, 17, &[b, a], [53, 40000], n), mine);
                }
                // The binat half: a packet to the host's public address.
                if (128..192).contains(&host) {
                    let public = [192, 0, 2, host];
                    assert_eq!(nat.owner(&frame4(fars[1], public, 6, &l4(5555, 22)), n), Some(mine));
                }
                // Between two hosts, or two outside: the address hash.
                assert_eq!(nat.owner(&frame4(inside, [10, 0, 1, 77], 17, &l4(1, 2)), n), None);
            }
            assert!(used.iter().all(|&u| u), "{n}: hosts spread over the workers: {used:?}");
            assert!(split > 0, "{n}: the address hash alone would split a host's flows");
            assert_eq!(nat.owner(&frame4(fars[0], fars[1], 17, &l4(1, 2)), n), None);
            // Replies to the pool: the worker whose residue the port is.
            for port in [50001u16, 50002, 61234] {
                let reply = frame4(fars[2], [192, 0, 2, 1], 17, &l4(53, port));
                assert_eq!(nat.owner(&reply, n), Some(port as usize % n));
            }
            // The forwarding to one inside host: the host's worker.
            let served = nat.owner(&frame4([10, 0, 1, 80], fars[3], 6, &l4(80, 40000)), n);
            assert_eq!(nat.owner(&frame4(fars[3], [192, 0, 2, 1], 6, &l4(40000, 80)), n), served);
            // The forwarding to targets chosen per flow: its public address's pair, both ways.
            let first = frame4(fars[3], front, 6, &l4(40000, 443));
            assert_eq!(nat.owner(&first, n), None);
            for target in [[10, 0, 1, 5], [10, 0, 1, 6]] {
                let reply = frame4(target, fars[3], 6, &l4(443, 40000));
                assert_eq!(nat.owner(&reply, n), Some(owner(&first, n)));
                let key = [wide4(fars[3]), wide4(target)];
                assert_eq!(nat.state_owner(true, 6, &key, [40000, 443], n), owner(&first, n));
            }
        }
    }

    /// Many hosts behind one address keeping their ports (`static-port`, OpenBSD's and
    /// FreeBSD's): every TCP or UDP flow and ICMP echo between one of them and an address
    /// outside, either way, translated or not, an error quoting one, and its synced state go
    /// to the worker of the host's port, the one its replies to the pool go to; between two
    /// of them, and between two others, the address hash.
    #[test]
    fn a_translation_keeping_ports_owns_its_hosts_flows_by_port() {
        for text in [
            "match out on fs inet from 10.0.9.0/24 nat-to 192.0.2.200 static-port\npass all\n",
            "nat on fs inet from 10.0.9.0/24 to any -> 192.0.2.200 static-port\npass all\n",
        ] {
            let p = xpf_conf::parse(text, "ports.conf", &[]);
            assert!(p.errors.is_empty(), "{:?}", p.errors);
            let r = xpf_conf::compile::Ruleset::compile(&p, &|_| Some(1)).unwrap();
            assert_eq!((r.nat_ports.len(), r.nat_ports[0].at.as_str()), (1, "ports.conf:1"), "{text}");
            assert!(r.nat_maps.is_empty() && r.nat_hosts.is_empty());
            let nat = NatOwners::of(&r);
            let (pool, router) = ([192, 0, 2, 200], [198, 51, 100, 254]);
            let fars = [[203, 0, 113, 9], [198, 51, 100, 7], [8, 8, 8, 8]];
            for n in 2..6 {
                let mut split = 0;
                for host in [1u8, 50, 200] {
                    let inside = [10, 0, 9, host];
                    for far in fars {
                        for port in [40000u16, 40001, 40002, 53211] {
                            let w = Some(port as usize % n);
                            for proto in [6, 17] {
                                let out = frame4(inside, far, proto, &l4(port, 53));
                                assert_eq!(nat.owner(&out, n), w, "{n} {inside:?}:{port} {far:?} {proto}");
                                split += (owner(&out, n) != port as usize % n) as usize;
                                // Its replies to the pool, and untranslated to the host.
                                assert_eq!(nat.owner(&frame4(far, pool, proto, &l4(53, port)), n), w);
                                assert_eq!(nat.owner(&frame4(far, inside, proto, &l4(53, port)), n), w);
                                let (a, b) = (wide4(inside), wide4(far));
                                assert_eq!(nat.state_owner(true, proto, &[a, b], [port, 53], n), port as usize % n);
                                assert_eq!(nat.state_owner(true, proto, &[b, a], [53, port], n), port as usize % n);
                            }
                            // An echo by its identifier, both ways.
                            let [hi, lo] = port.to_be_bytes();
                            assert_eq!(nat.owner(&frame4(inside, far, 1, &[8, 0, 0, 0, hi, lo, 0, 1]), n), w);
                            assert_eq!(nat.owner(&frame4(far, pool, 1, &[0, 0, 0, 0, hi, lo, 0, 1]), n), w);
                            // Errors quoting the host's datagram, as it left and as sent.
                            for (from, to) in [(pool, pool), (inside, inside)] {
                                let mut q = vec![0u8; 20];
                                ipv4::emit_header(&mut q, from, far, 17, 28, 64, 1);
                                q.extend(&l4(port, 53)[..8]);
                                let mut err = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
                                err.extend(q);
                                assert_eq!(nat.owner(&frame4(router, to, 1, &err), n), w, "{n} error to {to:?}");
                            }
                        }
                    }
                    // Between two hosts of the network: the address hash.
                    assert_eq!(nat.owner(&frame4(inside, [10, 0, 9, 77], 17, &l4(1, 2)), n), None);
                }
                assert!(split > 0, "{n}: the address hash alone would split a host's flows from their replies");
                assert_eq!(nat.owner(&frame4(fars[0], fars[1], 17, &l4(1, 2)), n), None);
            }
        }
    }

    /// GRE and ESP through a many-to-one `nat-to` on interface 2 (fs; inside fc is 1): a
    /// flow leaving through fs, its replies to the pool (to this host, or routed back out of
    /// fs) and ICMP errors about it meet one worker, its far end's, as does its synced state;
    /// TCP keeps its port's owner; flows between two inside interfaces, or not crossing fs,
    /// keep the address hash.
    #[test]
    fn a_flow_without_ports_translated_many_to_one_is_owned_by_its_far_end() {
        for text in [
            "match out on fs inet from 10.0.9.0/24 nat-to 192.0.2.200\npass all\n",
            "nat on fs inet from any to any -> 192.0.2.200\npass all\n",
            "match out on fs inet proto gre nat-to 192.0.2.200\nmatch out on fs inet proto esp nat-to 192.0.2.200\npass all\n",
        ] {
            let p = xpf_conf::parse(text, "bare.conf", &[]);
            assert!(p.errors.is_empty(), "{:?}", p.errors);
            let r = xpf_conf::compile::Ruleset::compile(&p, &|n| Some(if n == "fs" { 2 } else { 1 })).unwrap();
            assert!(!r.nat_bare.is_empty() && r.nat_bare.iter().all(|b| b.on.as_deref() == Some(&[2])), "{text}");
            let nat = NatOwners::of(&r);
            assert!(nat.needs_path());
            let (pool, router) = ([192, 0, 2, 200], [198, 51, 100, 254]);
            let (leaves, back, routed_back) = (
                Path { ingress: 1, egress: 2 },
                Path { ingress: 2, egress: 0 },
                Path { ingress: 2, egress: 2 },
            );
            for n in 2..6 {
                let mut split = 0;
                for host in [1u8, 50, 200] {
                    let inside = [10, 0, 9, host];
                    for far in [[203, 0, 113, 9], [198, 51, 100, 7], [8, 8, 8, 8], [192, 0, 2, 77]] {
                        let w = owner_of_host(true, &wide4(far), n);
                        for proto in [47u8, 50] {
                            let out = frame4(inside, far, proto, &[0, 0, 8, 0, 1, 2, 3, 4]);
                            assert_eq!(nat.owner_on(&out, n, leaves), Some(w), "{n} {inside:?} {far:?} {proto}");
                            split += (owner(&out, n) != w) as usize;
                            let reply = frame4(far, pool, proto, &[0, 0, 8, 0, 1, 2, 3, 4]);
                            assert_eq!(nat.owner_on(&reply, n, back), Some(w));
                            assert_eq!(nat.owner_on(&reply, n, routed_back), Some(w));
                            // Untranslated both ways through fs.
                            assert_eq!(nat.owner_on(&frame4(far, inside, proto, &[0; 8]), n, Path { ingress: 2, egress: 1 }), Some(w));
                            // An error from a router beyond fs about what left, and one
                            // from inside about what came in.
                            for (src, dst, to, path) in [(pool, far, pool, back), (far, inside, far, leaves)] {
                                let mut q = vec![0u8; 20];
                                ipv4::emit_header(&mut q, src, dst, proto, 28, 64, 1);
                                q.extend([0u8; 8]);
                                let mut err = vec![3u8, 2, 0, 0, 0, 0, 0, 0];
                                err.extend(q);
                                let from = if to == far { [10, 0, 9, 254] } else { router };
                                assert_eq!(nat.owner_on(&frame4(from, to, 1, &err), n, path), Some(w), "{n} error to {to:?}");
                            }
                            // The synced out state: stack key (far, inside), wire (far, pool).
                            let (a, b, c) = (wide4(far), wide4(inside), wide4(pool));
                            assert_eq!(nat.synced_owner(true, proto, &[a, b], [0, 0], Some(&[a, c]), n), w);
                        }
                        if text.contains("gre") {
                            continue;
                        }
                        // TCP through the same rule: by the port the worker chose.
                        let reply = frame4(far, pool, 6, &l4(443, 50003));
                        assert_eq!(nat.owner_on(&reply, n, back), Some(50003 % n));
                    }
                    // Between two inside interfaces, and beside fs: the address hash.
                    let other = frame4(inside, [10, 0, 7, 7], 47, &[0; 8]);
                    assert_eq!(nat.owner_on(&other, n, Path { ingress: 1, egress: 3 }), None);
                    assert_eq!(nat.owner_on(&other, n, Path { ingress: 3, egress: 1 }), None);
                }
                assert!(split > 0, "{n}: the address hash alone would split flows from their replies");
            }
        }
        // Without such a rule a path is not needed, and GRE keeps the address hash.
        let p = xpf_conf::parse("match out on fs inet proto tcp nat-to 192.0.2.200\npass all\n", "t", &[]);
        let nat = NatOwners::of(&xpf_conf::compile::Ruleset::compile(&p, &|_| Some(2)).unwrap());
        assert!(!nat.needs_path());
        let reply = frame4([203, 0, 113, 9], [192, 0, 2, 200], 47, &[0; 8]);
        assert_eq!(nat.owner_on(&reply, 3, Path { ingress: 2, egress: 0 }), None);
    }

    #[test]
    fn a_synced_state_goes_where_its_packets_go() {
        let (a, b) = ([10, 0, 1, 9], [10, 0, 2, 2]);
        let wide = |x: [u8; 4]| {
            let mut w = [0u8; 16];
            w[..4].copy_from_slice(&x);
            w
        };
        for n in 2..8 {
            let f = owner(&frame4(a, b, 6, &[0; 20]), n);
            assert_eq!(owner_of_pair(true, &wide(a), &wide(b), n), f);
            assert_eq!(owner_of_pair(true, &wide(b), &wide(a), n), f);
        }
    }

    #[test]
    fn malformed_headers_go_to_the_first_without_a_panic() {
        let f = frame4([10, 0, 1, 7], [10, 0, 2, 2], 1, &[3, 3, 0, 0, 0, 0, 0, 0]);
        // Total length past the frame, and below the header length.
        for total in [200u16, 10] {
            let mut g = f.clone();
            g[16..18].copy_from_slice(&total.to_be_bytes());
            assert_eq!(owner(&g, 4), 0, "total {total}");
        }
        // Every cut of an ICMP error, with and without its quoted header.
        let mut quoted = vec![0u8; 20];
        ipv4::emit_header(&mut quoted, [10, 0, 1, 7], [10, 0, 2, 2], 17, 28, 64, 1);
        let mut err = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        err.extend(quoted);
        let e = frame4([192, 0, 2, 1], [10, 0, 1, 7], 1, &err);
        for cut in 0..e.len() {
            owner(&e[..cut], 4);
        }
    }

    #[test]
    fn non_ip_and_runts_go_to_the_first() {
        assert_eq!(owner(&[0u8; 10], 4), 0);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(owner(&arp, 4), 0);
    }
}
