//! One worker: the AF_XDP sockets of one receive queue on every filtered interface, the
//! engine's state tables for the flows steered to that queue, and the loop that joins them.
//!
//! A forwarded packet is filtered as pf does: `in` on the interface it arrived on, then `out`
//! on the one the kernel's FIB chose, each direction with its own state (a forwarded UDP flow
//! makes two). A packet that passes both has its Ethernet addresses rewritten, its TTL or hop
//! limit decremented (IPv4 checksum updated incrementally) and is copied to the egress
//! socket's TX ring. Control requests (show, kill, flush, new ruleset) reach the worker by a
//! channel it looks at between batches: the tables have one owner and no lock.

use crate::policy::Live;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpf_conf::compile::EntrySums;
use xpf_engine::{info::Info, Verdict, Worker, BATCH};
use xpf_state::{Dir, Key, Timeouts};
use xpf_wire::ethernet;
use xpf_wire::offload::Partial;
use xpf_xdp::packet::offload::{gso_size, gso_type};
use xpf_xdp::packet::Routed;
use xpf_xdp::port::PortIo;
use xpf_xdp::steer::{Route, META_LEN};
use xpf_xdp::xsk::{Desc, XskStats};

/// Frames one next hop may have waiting for its link address: FreeBSD's default hold
/// (net.link.ether.inet.maxhold), where Linux queues up to 212,992 bytes.
pub const HOLD_PER_HOP: usize = 16;
/// Next hops that may have frames waiting at once (per worker).
pub const HOLD_HOPS: usize = 256;
/// How long a frame waits for its next hop: the kernel's own resolution gives up after three
/// solicitations a second apart.
pub const HOLD_FOR: Duration = Duration::from_secs(3);
/// How often the kernel is asked whether a waiting next hop is resolved.
const HOLD_CHECK: Duration = Duration::from_millis(1);

/// A next hop's address as the kernel takes it: 4 bytes of `nexthop` for IPv4, 16 for IPv6.
fn hop_addr(family: u8, nexthop: &[u8; 16]) -> &[u8] {
    if family == libc::AF_INET as u8 {
        &nexthop[..4]
    } else {
        &nexthop[..]
    }
}

/// Frames out of port `ep` waiting for `nexthop`'s link address on `ifindex` since `since`.
struct Unresolved {
    ep: usize,
    ifindex: u32,
    family: u8,
    nexthop: [u8; 16],
    since: Instant,
    frames: Vec<Vec<u8>>,
}

/// Drops and hand-offs that happen around the engine, in the I/O layer.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct IoStats {
    /// Passed by the filter, but the next hop's link address is unknown: the kernel is asked
    /// to resolve it and the packet waits (as in the kernel's own neighbour queue): sent once
    /// the address is known (`neighbour_sent`), dropped when its next hop already has
    /// [`HOLD_PER_HOP`] waiting, past [`HOLD_HOPS`] next hops, or unresolved after
    /// [`HOLD_FOR`] (`neighbour_dropped`).
    pub no_neighbour: u64,
    pub neighbour_sent: u64,
    pub neighbour_dropped: u64,
    /// The FIB routes it out of an interface xpfd does not filter: dropped.
    pub egress_not_filtered: u64,
    /// The egress TX ring or its free frames were full.
    pub tx_full: u64,
    /// Frames of another worker's flows passed to it, frames taken from the others, and
    /// frames dropped because the owner's queue was full.
    pub handed_off: u64,
    pub handed_in: u64,
    pub handoff_full: u64,
    /// Answers the firewall made (SYN cookies, synproxy, `block return`) not sent: the last
    /// quarter of the transmit ring is kept for forwarded traffic.
    pub answers_shed: u64,
    /// Frames without the steering program's metadata.
    pub bad_meta: u64,
    /// Non-IP frames that reached the socket (the steering program passes them up instead).
    pub not_ip: u64,
    pub forwarded: u64,
    /// Forwarded frames whose TCP/UDP checksum their sender left to offload (veth, tun/tap):
    /// finished by the transmit path on request, or by xpfd.
    pub csum_offloaded: u64,
    pub csum_finished: u64,
    /// Forwarded frames held in a queue of the egress interface's tree (`queue`); sent ones
    /// count in `forwarded` when they leave, dropped ones in the queue's counters.
    pub shaped: u64,
    pub rx_batches: u64,
    /// Times the worker slept waiting for a frame, and slept on a timer after taking many
    /// ([`NAP`]).
    pub waits: u64,
    pub naps: u64,
    /// Times the worker entered the real-time class because new connections overflowed
    /// their ring ([`RtAuto`]), and its time there, ms.
    pub rt_spells: u64,
    pub rt_ms: u64,
    /// Packets through the engine (a forwarded packet counts once: `in` and `out` together)
    /// and the worker's time inside it: the filter's cost per packet, clocked per batch.
    pub filtered: u64,
    pub filter_ns: u64,
    /// Packets to a translation target of this host that belonged to no translation: given
    /// back to the kernel as received. Translated packets whose new destination is this
    /// host (delivered by loopback), or that the FIB has no route for (dropped).
    pub nat_to_host: u64,
    pub nat_local: u64,
    pub nat_no_route: u64,
    /// Packets a rule's `route-to` or `reply-to` sent to its next hop, and those it could not
    /// (the interface gone, no route to the next hop, over its MTU): dropped.
    pub routed: u64,
    pub route_failed: u64,
    /// The host's packets not given back because more than [`TO_HOST_PER_SECOND`] came in
    /// one second (a flood at the firewall's own address must not become a flood of system
    /// calls in the worker).
    pub nat_to_host_shed: u64,
    /// The kernel fast path (--fastpath): flows in it, packets it forwarded.
    pub fast: crate::fastpath::FastStats,
    /// The host's own traffic (worker 0).
    pub host: crate::host::HostStats,
    /// `set loginterface`: pf's Interface Stats of that interface.
    pub loginterface: LogIfStats,
}

/// pf's "Interface Stats" (`set loginterface`): by family (IPv4, IPv6) and direction (in,
/// out), bytes, and packets passed and blocked.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct LogIfStats {
    pub bytes: [[u64; 2]; 2],
    pub passed: [[u64; 2]; 2],
    pub blocked: [[u64; 2]; 2],
}

impl LogIfStats {
    fn add(&mut self, o: &LogIfStats) {
        for (a, b) in [(&mut self.bytes, &o.bytes), (&mut self.passed, &o.passed), (&mut self.blocked, &o.blocked)] {
            for f in 0..2 {
                for d in 0..2 {
                    a[f][d] += b[f][d];
                }
            }
        }
    }

    /// Counts a batch the engine judged on the loginterface in direction `dir` (0 in, 1 out).
    #[cold]
    fn count(&mut self, frames: &[&[u8]], v: &[Verdict], dir: usize) {
        for (f, v) in frames.iter().zip(v) {
            let Ok(link) = ethernet::Frame::new_checked(*f) else { continue };
            let af = match link.ethertype() {
                ethernet::ETHERTYPE_IPV4 => 0,
                ethernet::ETHERTYPE_IPV6 => 1,
                _ => continue,
            };
            self.bytes[af][dir] += link.payload().len() as u64;
            if matches!(v, Verdict::Drop(_)) {
                self.blocked[af][dir] += 1;
            } else {
                self.passed[af][dir] += 1;
            }
        }
    }
}

impl IoStats {
    pub fn add(&mut self, o: &IoStats) {
        self.no_neighbour += o.no_neighbour;
        self.neighbour_sent += o.neighbour_sent;
        self.neighbour_dropped += o.neighbour_dropped;
        self.egress_not_filtered += o.egress_not_filtered;
        self.tx_full += o.tx_full;
        self.answers_shed += o.answers_shed;
        self.handed_off += o.handed_off;
        self.handed_in += o.handed_in;
        self.handoff_full += o.handoff_full;
        self.bad_meta += o.bad_meta;
        self.not_ip += o.not_ip;
        self.forwarded += o.forwarded;
        self.csum_offloaded += o.csum_offloaded;
        self.csum_finished += o.csum_finished;
        self.shaped += o.shaped;
        self.rx_batches += o.rx_batches;
        self.waits += o.waits;
        self.naps += o.naps;
        self.rt_spells += o.rt_spells;
        self.rt_ms += o.rt_ms;
        self.filtered += o.filtered;
        self.filter_ns += o.filter_ns;
        self.nat_to_host += o.nat_to_host;
        self.nat_local += o.nat_local;
        self.nat_no_route += o.nat_no_route;
        self.nat_to_host_shed += o.nat_to_host_shed;
        self.routed += o.routed;
        self.route_failed += o.route_failed;
        self.fast.add(&o.fast);
        self.host.add(&o.host);
        self.loginterface.add(&o.loginterface);
    }
}

/// One state, as `xpfctl -s states` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StateRow {
    pub ifname: String,
    pub proto: u8,
    pub af: u8,
    /// pf's key order: `addr[1]:port[1]` then the arrow then `addr[0]:port[0]`.
    pub left: String,
    pub right: String,
    pub out: bool,
    pub src_state: u8,
    pub dst_state: u8,
    pub age: u32,
    pub expires_in: u32,
    pub packets: [u32; 2],
    pub bytes: [u64; 2],
    pub rule: u32,
    /// `route-to: ADDR@IF` or `reply-to: ...`: the state's next hop (pfctl -vv).
    pub route: Option<String>,
}

/// Per rule number, its packets and bytes in and out since the ruleset was loaded, its states
/// now and the states it made ([`xpf_state::tally`]): the states' own counts summed by a
/// walk, with the tables' tallies of the states that ended and the packets decided without a
/// state.
pub type RuleSums = xpf_state::RuleCounts;

/// Which states a kill or a listing selects: hosts as pfctl -k gives them.
#[derive(Debug, Clone, Default)]
pub struct Select {
    pub src: Option<(std::net::IpAddr, u8)>,
    pub dst: Option<(std::net::IpAddr, u8)>,
    pub rule: Option<u32>,
}

/// A worker's counters: the engine's, the I/O layer's, each socket's, and packet mode's
/// classification counters by interface index.
pub type Snapshot = (Info, IoStats, Vec<XskStats>, Vec<(u32, [u64; 8])>);

pub enum Cmd {
    Snapshot(Sender<Snapshot>),
    /// Every state, copied a chunk per round (see [`Walk`]); the control thread makes the
    /// rows.
    States(Sender<Vec<RawRow>>),
    /// Per rule (by number), what its states in the table now have carried: see [`RuleSums`].
    RuleSums(Sender<RuleSums>),
    /// Per entry of the `counters` tables, what its rules' states carried.
    TableSums(Sender<EntrySums>),
    /// States per interface they are bound to (0: floating), for `-s Interfaces -v`.
    StatesByIf(Sender<std::collections::HashMap<u16, u64>>),
    /// Translation's port use per (address, protocol class): (in use, in the ranges).
    NatPorts(Sender<Vec<(std::net::IpAddr, u8, u64, u64)>>),
    Kill(Select, Sender<u32>),
    Flush(Sender<u32>),
    /// `set limit states` (this worker's share), the timeouts, and reassembly: (on, `set
    /// limit frags` share).
    Limits {
        states: u32,
        timeouts: Timeouts,
        frags: (bool, u32),
        /// `set syncookies`.
        cookies: xpf_engine::syncookie::Mode,
        /// `set limit src-nodes` (this worker's share).
        src_nodes: u32,
        done: Sender<Result<(), String>>,
    },
    /// Records from the sync peer for states this worker owns.
    Sync(Vec<xpf_sync::Msg>),
    /// Send every state to the sync peer (a bulk update).
    SyncBulk,
    /// The queues' counters: (interface, queue, counters).
    Queues(Sender<Vec<(String, String, xpf_shape::QueueStats)>>),
    /// The source nodes (`-s Sources`).
    Sources(Sender<Vec<SrcRow>>),
    /// `-K SRC [-K DST]`, `-F Sources`: the source nodes of sources in SRC (None: all) go,
    /// with DST those of `sticky-address` whose address is in DST; how many.
    KillSources(Option<(std::net::IpAddr, u8)>, Option<(std::net::IpAddr, u8)>, Sender<u32>),
}

/// A source node as `-s Sources` shows it (pf's `pf_src_node`): a source that rules with
/// `source-track` or `max-src-*` count, or one `sticky-address` keeps an address for.
#[derive(Debug, Clone)]
pub struct SrcRow {
    pub addr: std::net::IpAddr,
    /// `sticky-address`: `nat-to` or `rdr-to`, and the address the source keeps.
    pub to: Option<(&'static str, std::net::IpAddr)>,
    pub states: u32,
    pub conn: u32,
    /// Its connection rate as pf keeps it: (connections x 1000, seconds).
    pub rate: (u64, u32),
    pub age: u32,
    /// A node without states: seconds until it goes (`src.track`).
    pub expires: Option<u32>,
    /// The rule that made it (pf's number).
    pub rule: u32,
}

/// The source nodes of table `t` (family `af`) at `now`.
fn src_rows<K: Key>(t: &xpf_state::StateTable<K>, af: u8, now: u32, out: &mut Vec<SrcRow>) {
    let keep = t.timeouts().get(xpf_state::Timeout::SrcTrack);
    out.extend(t.track.nodes.iter().map(|((a, _), n)| SrcRow {
        addr: a.to_ip(af),
        to: None,
        states: n.states,
        conn: n.conn,
        rate: (n.rate.count, n.rate.seconds),
        age: now.saturating_sub(n.creation),
        expires: (n.states == 0).then(|| n.expire.saturating_add(keep).saturating_sub(now)),
        rule: n.rule,
    }));
}

pub struct Port {
    pub io: PortIo,
    pub ifindex: u32,
}

/// Where workers send the sources over their connection limits (`overload`): the control
/// loop's channel, and the eventfd that wakes that loop, so that a source is in its table a
/// turn of the loop after its worker found it over the limit (about a millisecond), not at the
/// end of the loop's idle poll. pf adds it before its next packet; until the table is
/// installed, the source's next first packets meet the rules without it.
pub struct Overloads {
    pub tx: Sender<(String, std::net::IpAddr)>,
    pub wake: Arc<Wake>,
}

pub struct Dataplane {
    pub worker: Worker<Live>,
    pub ports: Vec<Port>,
    pub cmds: Receiver<Cmd>,
    /// Rung by the sync thread when it sends a command: an idle worker wakes at once (defer
    /// mode's insert acks cannot wait for the 10-ms idle sleep).
    pub wake: Option<Arc<Wake>>,
    pub stop: Arc<AtomicBool>,
    pub io: IoStats,
    pub start: Instant,
    /// Busy-poll instead of sleeping in poll(2) when idle.
    pub busy: bool,
    /// Real-time workers nap after a busy spell ([`NAP`]).
    pub nap: bool,
    /// The real-time class while new connections overflow their ring (`--worker-rt auto`).
    pub rt_auto: Option<RtAuto>,
    /// The kernel fast path for established UDP and TCP flows (on unless --no-fastpath).
    pub fast: Option<crate::fastpath::FastPath>,
    /// The host's own traffic, queued by the kernel (worker 0 only).
    pub host: Option<crate::host::HostPath>,
    /// Sources over `max-src-conn(-rate)` to add to an `overload` table, for the control
    /// thread (a table changes by a copy installed beside the rules, not the worker's job).
    pub overload: Option<Overloads>,
    /// Copies of frames that `modulate state` rewrote on the way in (the RX ring is not
    /// written), reused from batch to batch.
    mod_bufs: Vec<Vec<u8>>,
    /// State sync (--sync-dev): this worker's replica and sender.
    pub sync: Option<crate::sync::WorkerSync>,
    /// Where `log` rules' packets go.
    pub pflog: Option<crate::pflog::Tx>,
    /// Where `pflow` states' flow records go (--pflow).
    pub pflow: Option<crate::pflow::Tx>,
    /// Defer mode: a buffer for released packets, and whether this batch held any.
    held_out: crate::defer::Released,
    held_now: bool,
    last_resolve: Vec<(u32, [u8; 16], Instant)>,
    /// Frames waiting for their next hop's link address, and when to ask the kernel again.
    unresolved: Vec<Unresolved>,
    unresolved_check: Instant,
    /// Several workers: where frames of other workers' flows go, and come from.
    pub handoff: Option<crate::handoff::Handoff>,
    /// Frames taken from the other workers this round (kept to reuse its allocation).
    handed: Vec<crate::handoff::Item>,
    /// pf's queues: the shapers of this worker's interfaces that have a queue tree.
    pub shaping: crate::shaping::Shaping,
    /// Translation: routes for rewritten destinations (the kernel's FIB, cached), the way
    /// back into the kernel for the host's packets, and the loopback way for translated
    /// packets to this host (opened when first needed).
    router: xpf_xdp::packet::Router,
    inject: Option<xpf_xdp::steer::Inject>,
    raw: Option<crate::host::RawOut>,
    /// Frames given back to the kernel this second, and the second.
    to_host_budget: (u32, u32),
    /// What the hand-off owns translated traffic by, for the ruleset generation it was built
    /// from.
    nat_owners: (u64, crate::handoff::NatOwners),
    /// The translated first fragments the hand-off owned, for their later fragments.
    fragments: crate::handoff::Fragments,
    /// Walks of the state tables asked for, the first in progress.
    walks: std::collections::VecDeque<Walk>,
    /// Commands that answer once the fast path's counts are read back: a pass the worker
    /// walks a slice a round (at 2M flows a pass is about a second of the core; taken whole,
    /// every `-s states` or metrics scrape stalled the worker that long).
    fresh: Vec<Fresh>,
    /// Commands were left in the queue when the last visit's budget ran out.
    cmds_left: bool,
    /// Translation pools that refused new flows, by their rule (`nat-to of FILE:LINE`):
    /// logged once a minute a pool ([`Dataplane::log_refusals`]).
    refusals: std::collections::HashMap<String, Refusals>,
}

/// A pool's refusals since its last log line: when that was (seconds of [`Dataplane::now`]),
/// and the flows refused since, with no port left and with no address of their family.
#[derive(Debug, Default)]
struct Refusals {
    logged: Option<u32>,
    no_port: u64,
    no_address: u64,
}

/// Seconds between two log lines about one pool's refusals.
const REFUSALS_EVERY: u32 = 60;

/// A command waiting for the fast path's read-back pass ([`Dataplane::fresh`]).
enum Fresh {
    States(Sender<Vec<RawRow>>),
    RuleSums(Sender<RuleSums>),
    TableSums(Sender<EntrySums>),
    /// `-k` and `-F states`: the states killed (their flows leave the tables in the pass).
    Killed(Sender<u32>, u32),
}

/// Frames a worker gives back to the kernel per second at most (the host's own traffic that
/// came to a translation target: each is a system call).
pub const TO_HOST_PER_SECOND: u32 = 50_000;

/// `a` with the bits past prefix length `l` cleared.
pub fn masked(a: std::net::IpAddr, l: u8) -> std::net::IpAddr {
    use std::net::IpAddr;
    match a {
        IpAddr::V4(v) => IpAddr::V4((u32::from(v) & u32::MAX.checked_shl(32 - l as u32).unwrap_or(0)).into()),
        IpAddr::V6(v) => IpAddr::V6((u128::from(v) & u128::MAX.checked_shl(128 - l as u32).unwrap_or(0)).into()),
    }
}

fn in_net(a: &xpf_wire::Addr, af: u8, net: &(std::net::IpAddr, u8)) -> bool {
    let a = a.to_ip(af);
    a.is_ipv4() == net.0.is_ipv4() && masked(a, net.1) == masked(net.0, net.1)
}

fn host(a: xpf_wire::Addr, af: u8, port: u16, proto: u8) -> String {
    let ip = a.to_ip(af);
    let ports = matches!(proto, 1 | 6 | 17 | 58 | 132);
    match (ip, ports) {
        (std::net::IpAddr::V4(_), true) => format!("{ip}:{port}"),
        (std::net::IpAddr::V6(_), true) => format!("{ip}[{port}]"),
        (_, false) => ip.to_string(),
    }
}

/// The indexes of the bits set in `m`, lowest first.
fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            i
        })
    })
}

/// A state as `-s states` shows it, as the worker copies it: no formatting and no system
/// call on the worker (names and text are made by the control thread, [`RawRow::row`]).
#[derive(Debug, Clone, Copy)]
pub struct RawRow {
    kif: u16,
    proto: u8,
    af: u8,
    /// The key shown (hosts and ports), and the other key when translated.
    shown: ([xpf_wire::Addr; 2], [u16; 2]),
    other: Option<([xpf_wire::Addr; 2], [u16; 2])>,
    out: bool,
    peer_state: [u8; 2],
    age: u32,
    expires_in: u32,
    packets: [u32; 2],
    bytes: [u64; 2],
    rule: u32,
    /// Its `route-to` / `reply-to` target's number (0: none).
    route: u16,
}

impl RawRow {
    fn of<K: Key>(t: &xpf_state::StateTable<K>, id: u32, s: &xpf_state::State<K>, now: u32) -> RawRow {
        // pf's `expire` is the last activity; the deadline adds the (adaptive) timeout.
        let deadline = s.expire.saturating_add(t.timeout_of(id));
        let (k, m) = (&s.key, t.meta(id));
        // pfctl's view of a translated state: going out, the wire key with the stack key's
        // differing hosts in parentheses; coming in, the stack key with the wire key's.
        let out = s.flags & xpf_state::sf::OUT != 0;
        let (nk, sk) = match t.stack_key(id) {
            Some(st) if out => (*k, Some(st)),
            Some(st) => (st, Some(*k)),
            None => (*k, None),
        };
        let hp = |k: &K| ([k.addr(0), k.addr(1)], [k.port(0), k.port(1)]);
        RawRow {
            kif: k.kif(),
            proto: k.proto(),
            af: k.af(),
            shown: hp(&nk),
            other: sk.as_ref().map(hp),
            out,
            peer_state: s.peer_state,
            age: now.saturating_sub(m.creation),
            expires_in: deadline.saturating_sub(now),
            packets: s.packets,
            bytes: s.bytes,
            rule: m.rule,
            route: t.actions.get(id).map_or(0, |a| a.route),
        }
    }

    /// The row pfctl prints; `names` caches interface names by index, `routes` are the
    /// routing targets by number - 1 (xpf_conf's `Ruleset::routes`).
    pub fn row(
        &self,
        names: &mut std::collections::HashMap<u16, String>,
        routes: &[xpf_engine::RouteTarget],
    ) -> StateRow {
        let (af, proto) = (self.af, self.proto);
        // ICMP: the identifier is one field; pfctl shows its change on the translated side.
        let icmp = matches!(proto, 1 | 58);
        let (na, np) = self.shown;
        let side = |i: usize| {
            let h = host(na[i], af, np[i], proto);
            let same_id = icmp && i == if self.out { 0 } else { 1 };
            match self.other.filter(|(sa, sp)| sa[i] != na[i] || (sp[i] != np[i] && !same_id)) {
                Some((sa, sp)) => format!("{h} ({})", host(sa[i], af, sp[i], proto)),
                None => h,
            }
        };
        let mut name = |k: u16| {
            names
                .entry(k)
                .or_insert_with(|| match k {
                    0 => "all".to_string(),
                    k => xpf_xdp::netlink::ifname(k as u32).unwrap_or_else(|| format!("if{k}")),
                })
                .clone()
        };
        let ifname = name(self.kif);
        // pfctl -vv: ` route-to: ADDR@IF` (the interface left out when the rule named none).
        let route = routes.get((self.route as usize).wrapping_sub(1)).map(|t| {
            let a = host(t.addr, t.af, 0, 0);
            let at = if t.ifidx != 0 { format!("@{}", name(t.ifidx)) } else { String::new() };
            format!("{}: {a}{at}", if t.reply { "reply-to" } else { "route-to" })
        });
        StateRow {
            ifname,
            proto,
            af,
            left: side(1),
            right: side(0),
            out: self.out,
            src_state: self.peer_state[0],
            dst_state: self.peer_state[1],
            age: self.age,
            expires_in: self.expires_in,
            packets: self.packets,
            bytes: self.bytes,
            rule: self.rule,
            route,
        }
    }
}

/// A walk of the state tables in progress on a worker (`-s states`' rows, `-s rules -v`'s and
/// a metrics scrape's per-rule sums, `-T show -v`'s per-entry sums, `-s Interfaces -v`'s
/// states per interface): [`LIST_CHUNK`] slots a round, between the rounds' packets, so that
/// a walk of millions of states does not stop the worker (at 1M states, copying and
/// formatting in one go held it for about a second: no packet forwarded, no VRRP advert let
/// through the host path, and the standby took the addresses). A walk is not an atomic
/// snapshot, as pf's is not: a state made or removed during it may be missing.
struct Walk {
    what: Walked,
    fam: usize,
    slot: u32,
}

/// What a [`Walk`] gathers, and where it goes when done.
enum Walked {
    Rows(Sender<Vec<RawRow>>, Vec<RawRow>),
    /// Summed with the tables' tallies at the end.
    Rules(Sender<RuleSums>, RuleSums),
    Entries(Sender<EntrySums>, Option<xpf_conf::compile::StateCounts<std::sync::Arc<xpf_conf::Ruleset>>>),
    ByIf(Sender<std::collections::HashMap<u16, u64>>, std::collections::HashMap<u16, u64>),
}

impl Walked {
    #[inline]
    fn state<K: Key>(&mut self, t: &xpf_state::StateTable<K>, id: u32, s: &xpf_state::State<K>, now: u32) {
        match self {
            Walked::Rows(_, rows) => rows.push(RawRow::of(t, id, s, now)),
            Walked::Rules(_, m) => {
                let x = t.meta(id);
                if !t.tally.counts(x.rule, x.creation, x.seq) {
                    return;
                }
                let c = m.entry(x.rule).or_default();
                c.add_state(s.flags & xpf_state::sf::OUT != 0, s.packets, s.bytes);
                c.states += 1;
                c.created += 1;
            }
            Walked::Entries(_, Some(c)) => c.state(t, id, s),
            Walked::Entries(_, None) => {}
            Walked::ByIf(_, m) => *m.entry(s.key.kif()).or_default() += 1,
        }
    }

    /// The walk is done: the answer goes.
    fn send(self, w: &mut Worker<crate::policy::Live>) {
        match self {
            Walked::Rows(tx, rows) => {
                let _ = tx.send(rows);
            }
            Walked::Rules(tx, mut m) => {
                w.t4.tally.walk_end(&mut m);
                w.t6.tally.walk_end(&mut m);
                let _ = tx.send(m);
            }
            Walked::Entries(tx, c) => {
                let _ = tx.send(c.map_or_else(EntrySums::new, |c| c.sums()));
            }
            Walked::ByIf(tx, m) => {
                let _ = tx.send(m);
            }
        }
    }
}

/// Table slots a walk visits per round.
const LIST_CHUNK: u32 = 16_384;

/// A worker's commands (sync records, control requests) run for this long at most per visit;
/// the rest wait for the next, after the round's packets and the host's own traffic.
const CMD_BUDGET: Duration = Duration::from_millis(1);

/// A real-time worker (`--worker-rt`, main.rs `WorkerSched`) that took [`NAP_AFTER`] frames
/// or more since it last slept, and finds its rings empty, sleeps this long on a timer
/// instead of waiting to be woken by the next frame: the kernel's receive work on its core
/// then fills the rings for a while, and the worker takes them in a few large batches. In
/// the real-time class a wakeup takes the core at once: without the nap, under load, the
/// worker woke every 50-100 frames and the lab's UDP new flows/s fell to 0.87-1.08x the
/// kernel against 1.22-1.62x at nice -20; with it, 1.28-1.49x. A frame that comes while the
/// worker naps waits up to this long; a worker that saw fewer frames (an idle firewall, a
/// ping) waits on its sockets. Workers in the fair class do not nap: the tick batches them.
const NAP: Duration = Duration::from_micros(250);
const NAP_AFTER: usize = 64;

/// `--worker-rt auto` (the default): a worker in the fair class that finds new connections
/// dropped at their ring (the kernel's count for the SYN sockets, read every [`RT_CHECK`])
/// enters the real-time class (SCHED_FIFO, napping as `--worker-rt` does) and goes back
/// once none were dropped for [`RT_HOLD`]. On a kernel without preemption at wakeup (this
/// one: `Dynamic Preempt: none`) a woken fair-class worker waits for the tick while NAPI
/// fills its rings; under a SYN flood those rings overflow (the rules lab at nice -20:
/// 4-5M SYNs dropped, 0.52-0.93x the expert kernel; in the real-time class none, 0.96-1.60x).
/// The real-time class stays off otherwise: beside end hosts on the same cores it made
/// pings under load 4-6 times as long.
pub struct RtAuto {
    pub prio: i32,
    pub nice: i32,
    on: Option<Instant>,
    checked: Instant,
    drops: u64,
    last_drop: Instant,
    refused: bool,
}

const RT_CHECK: Duration = Duration::from_millis(100);
const RT_HOLD: Duration = Duration::from_secs(10);

/// What [`RtAuto::step`] says to do.
#[derive(Debug, PartialEq)]
enum RtStep {
    Stay,
    /// Into the real-time class: this many new connections were dropped since the last look.
    Enter(u64),
    /// Back to the fair class after this many ms in the real-time one.
    Leave(u64),
}

impl RtAuto {
    pub fn new(prio: i32, nice: i32) -> RtAuto {
        let now = Instant::now();
        RtAuto { prio, nice, on: None, checked: now, drops: 0, last_drop: now, refused: false }
    }

    /// The SYN sockets' drop count (as the kernel counts it, all along) read at `t`.
    fn step(&mut self, t: Instant, drops: u64) -> RtStep {
        let new = drops.saturating_sub(self.drops);
        self.drops = drops;
        if new > 0 {
            self.last_drop = t;
        }
        match self.on {
            None if new > 0 => {
                self.on = Some(t);
                RtStep::Enter(new)
            }
            Some(since) if t.duration_since(self.last_drop) >= RT_HOLD => {
                self.on = None;
                RtStep::Leave(t.duration_since(since).as_millis() as u64)
            }
            _ => RtStep::Stay,
        }
    }
}

fn kill<K: Key>(t: &mut xpf_state::StateTable<K>, sel: &Select) -> u32 {
    let ids: Vec<u32> = t
        .iter()
        .filter(|&(id, s)| {
            let k = &s.key;
            // The key's source is addr[0] for inbound states and addr[1] for outbound ones.
            let (si, di) = if s.flags & xpf_state::sf::OUT != 0 { (1, 0) } else { (0, 1) };
            sel.src.as_ref().is_none_or(|n| in_net(&k.addr(si), k.af(), n))
                && sel.dst.as_ref().is_none_or(|n| in_net(&k.addr(di), k.af(), n))
                && sel.rule.is_none_or(|r| r == t.meta(id).rule)
        })
        .map(|(id, _)| id)
        .collect();
    ids.iter().filter(|&&id| t.remove(id)).count() as u32
}

impl Dataplane {
    pub fn new(worker: Worker<Live>, ports: Vec<Port>, cmds: Receiver<Cmd>, stop: Arc<AtomicBool>, busy: bool) -> Self {
        let mut d = Dataplane {
            worker,
            ports,
            cmds,
            stop,
            io: IoStats::default(),
            start: Instant::now(),
            busy,
            nap: false,
            rt_auto: None,
            fast: None,
            host: None,
            overload: None,
            mod_bufs: Vec::new(),
            sync: None,
            pflog: None,
            pflow: None,
            wake: None,
            held_out: Vec::new(),
            held_now: false,
            last_resolve: Vec::new(),
            unresolved: Vec::new(),
            unresolved_check: Instant::now(),
            handoff: None,
            handed: Vec::new(),
            shaping: Default::default(),
            router: Default::default(),
            inject: None,
            raw: None,
            to_host_budget: (0, 0),
            nat_owners: (0, Default::default()),
            fragments: Default::default(),
            walks: Default::default(),
            fresh: Vec::new(),
            cmds_left: false,
            refusals: Default::default(),
        };
        // The first ruleset's rules count every state (the tables are empty at second 0).
        d.rules_replaced(0);
        d
    }

    fn now(&self) -> u32 {
        self.start.elapsed().as_secs() as u32 + 1
    }

    /// Logs the translation pools that refused new flows (pf's `translate`: no port left,
    /// no address of the flow's family): a pool's first refusal at once, then what it
    /// refused since once a minute while it goes on. Each worker logs its own flows.
    fn log_refusals(&mut self, now: u32) {
        let (_, rs) = self.worker.policy.current();
        for (pool, no_port, no_address) in self.worker.nat.take_refusals() {
            let name = rs.pool_origin(pool).map_or_else(|| format!("translation pool {pool}"), str::to_string);
            let e = self.refusals.entry(name).or_default();
            e.no_port += no_port;
            e.no_address += no_address;
        }
        let index = self.worker.nat.share().0;
        self.refusals.retain(|name, e| {
            if e.logged.is_some_and(|l| now.saturating_sub(l) < REFUSALS_EVERY) {
                return true;
            }
            if e.no_port == 0 && e.no_address == 0 {
                // Quiet for a minute: its next refusal is logged at once.
                return false;
            }
            let what = match (e.no_port, e.no_address) {
                (n, 0) => format!("{n} new flows refused, no port left"),
                (0, a) => format!("{a} new flows refused, no address of their family"),
                (n, a) => format!("{} new flows refused ({n} no port left, {a} no address of their family)", n + a),
            };
            log::warn!("worker {index}: {name}: {what} (pf's translate; once a minute while it lasts)");
            (e.logged, e.no_port, e.no_address) = (Some(now), 0, 0);
            true
        });
    }

    /// The frames of the last engine batch (seen on `ifindex`) a `log` rule decided: to
    /// pflog, with the verdict, the rule and the translation the worker noted.
    #[inline]
    fn log_batch(&self, frames: &[&[u8]], ifindex: u32) {
        let m = self.worker.batch().logged;
        if m == 0 {
            return;
        }
        if let Some(tx) = &self.pflog {
            crate::pflog::log_frames(tx, &self.worker, frames, ifindex, m);
        }
    }

    fn port_of(&self, ifindex: u32) -> Option<usize> {
        self.ports.iter().position(|p| p.ifindex == ifindex)
    }

    /// The loop: runs until `stop` is set.
    pub fn run(&mut self) {
        let mut descs = [Desc::default(); BATCH];
        let mut mine = [Desc::default(); BATCH];
        let mut host_seen = 0usize;
        let mut idle_rounds = 0u32;
        let mut n_loops = 0u64;
        // Frames taken since the worker last slept (for the nap).
        let mut since_sleep = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.now();
            // A new ruleset applies from the next packet on: one atomic load per round. Its
            // rules count from their load, as pf's: the tallies of the rules before go.
            if self.worker.policy.stale() {
                // Refusals name their pools by the ruleset that made them.
                if self.worker.nat.has_refusals() {
                    self.log_refusals(now);
                }
                self.worker.policy.refresh();
                self.rules_replaced(now);
            }
            // The queue trees: one pointer compare per round unless they changed (no clock
            // read without queues).
            let start = self.start;
            let ns = || start.elapsed().as_nanos() as u64;
            self.shaping.refresh(&self.worker.policy.current().1.queues, &self.ports, ns);
            self.shaping.coordinate(ns);
            // Frames other workers passed here came in before this round's own: first, so that
            // the flows' packets keep their order across the hand-off as far as it can tell
            // (a connection's FIN handed off, then the next connection's SYN on this queue).
            let mut got = self.take_handed(now);
            for p in 0..self.ports.len() {
                let n = self.ports[p].io.rx_burst(&mut descs);
                if n == 0 {
                    continue;
                }
                got += n;
                self.io.rx_batches += 1;
                if self.handoff.is_some() {
                    let m = self.hand_off(p, &descs[..n], &mut mine);
                    if m > 0 {
                        self.forward(p, &mine[..m], now);
                    }
                } else {
                    self.forward(p, &descs[..n], now);
                }
                self.ports[p].io.rx_done(&descs[..n]);
            }
            for p in self.ports.iter_mut() {
                p.io.flush();
            }
            if !self.unresolved.is_empty() {
                self.send_resolved();
            }
            // Queued frames the queue trees let go now.
            if self.shaping.due.is_some() {
                let ns = self.start.elapsed().as_nanos() as u64;
                self.shaping.drain(&mut self.ports, &mut self.io, ns);
            }
            // The host's own traffic: looked at every round while it comes, every 4th otherwise.
            if let Some(h) = &mut self.host {
                if host_seen > 0 || got == 0 || n_loops.is_multiple_of(4) {
                    host_seen = h.poll(&mut self.worker, now, self.pflog.as_ref());
                    got += host_seen;
                }
            }
            if host_seen > 0 {
                let routed = self.host.as_mut().map(|h| h.take_routed()).unwrap_or_default();
                if !routed.is_empty() {
                    self.send_routed(routed);
                }
            }
            if let Some(s) = &mut self.sync {
                s.poll(&mut self.worker, now);
                if let Some(d) = &mut s.defer {
                    let mut out = std::mem::take(&mut self.held_out);
                    d.expire(Instant::now(), &mut out);
                    self.send_held(out);
                }
            }
            if !self.fresh.is_empty() {
                self.fresh_step(now);
            }
            if !self.walks.is_empty() {
                self.walk_step(now);
            }
            n_loops += 1;
            if got == 0 || n_loops.is_multiple_of(64) || (self.cmds_left && n_loops.is_multiple_of(8)) {
                let t0 = Instant::now();
                self.cmds_left = false;
                while let Ok(c) = self.cmds.try_recv() {
                    self.command(c);
                    if t0.elapsed() >= CMD_BUDGET {
                        self.cmds_left = true;
                        break;
                    }
                }
                self.worker.maintain(now, if got == 0 { 4096 } else { 256 });
                if self.worker.nat.has_refusals() || !self.refusals.is_empty() {
                    self.log_refusals(now);
                }
                if let Some(p) = &self.pflow {
                    let mut flows = Vec::new();
                    let lost = self.worker.take_flows(&mut flows);
                    p.send(flows, self.start, lost);
                }
                self.overloads();
                if let Some(f) = &mut self.fast {
                    f.sync(&mut self.worker, now);
                }
                self.rt_check();
            }
            if got == 0 {
                idle_rounds += 1;
                if !self.busy && idle_rounds > 16 && !self.cmds_left && self.walks.is_empty() && self.fresh.is_empty() {
                    // Held packets (defer mode) time out 20 ms after they came: sleep less.
                    let holding = !self.unresolved.is_empty()
                        || self.sync.as_ref().and_then(|s| s.defer.as_ref()).is_some_and(|d| d.stats.waiting > 0);
                    let mut d = Duration::from_millis(if holding { 1 } else { 10 });
                    // Queued frames: up to when the next may leave.
                    if let Some(due) = self.shaping.due {
                        let ns = self.start.elapsed().as_nanos() as u64;
                        d = d.min(Duration::from_nanos(due.saturating_sub(ns)));
                    }
                    if !d.is_zero() {
                        if self.nap && since_sleep >= NAP_AFTER {
                            self.io.naps += 1;
                            std::thread::sleep(d.min(NAP));
                        } else {
                            self.io.waits += 1;
                            self.wait(d);
                        }
                        since_sleep = 0;
                    }
                }
            } else {
                idle_rounds = 0;
                since_sleep += got;
            }
        }
    }

    /// [`RtAuto`]: into the real-time class when new connections were dropped at their ring
    /// since the last look, back to the fair class after [`RT_HOLD`] without.
    fn rt_check(&mut self) {
        let Some(r) = &mut self.rt_auto else { return };
        let t = Instant::now();
        if t.duration_since(r.checked) < RT_CHECK || r.refused {
            return;
        }
        if r.on.is_some() {
            self.io.rt_ms += t.duration_since(r.checked).as_millis() as u64;
        }
        r.checked = t;
        let drops: u64 = self.ports.iter_mut().map(|p| p.io.kernel_stats().syn_dropped).sum();
        match r.step(t, drops) {
            RtStep::Stay => {}
            RtStep::Enter(new) => {
                if let Err(e) = crate::real_time(r.prio) {
                    (r.refused, r.on) = (true, None);
                    log::warn!(
                        "worker: {new} new connections dropped at their ring; the real-time class (SCHED_FIFO {}) was refused ({e}): staying at nice {}",
                        r.prio,
                        r.nice
                    );
                    return;
                }
                self.nap = true;
                self.io.rt_spells += 1;
                log::info!(
                    "worker: {new} new connections dropped at their ring in {} ms: real-time class (SCHED_FIFO {}) until none are for {} s",
                    RT_CHECK.as_millis(),
                    r.prio,
                    RT_HOLD.as_secs()
                );
            }
            RtStep::Leave(ms) => {
                if let Err(e) = crate::fair(r.nice) {
                    log::warn!("worker: back to nice {}: {e}", r.nice);
                }
                self.nap = false;
                log::info!(
                    "worker: no new connection dropped for {} s: back to nice {} after {ms} ms",
                    RT_HOLD.as_secs(),
                    r.nice
                );
            }
        }
    }

    /// Walks the next slice of the fast path's forced pass; when it is done, answers the
    /// commands that waited for it.
    fn fresh_step(&mut self, now: u32) {
        if let Some(f) = &mut self.fast {
            if !f.forced_step(&mut self.worker, now) {
                return;
            }
        }
        for c in std::mem::take(&mut self.fresh) {
            self.answer_fresh(c);
        }
    }

    fn answer_fresh(&mut self, c: Fresh) {
        match c {
            Fresh::States(tx) => {
                let n = self.worker.t4.len() + self.worker.t6.len();
                self.walk(Walked::Rows(tx, Vec::with_capacity(n as usize)));
            }
            Fresh::RuleSums(tx) => self.walk(Walked::Rules(tx, RuleSums::default())),
            Fresh::TableSums(tx) => {
                let c = xpf_conf::compile::StateCounts::of(self.worker.policy.ruleset());
                self.walk(Walked::Entries(tx, c));
            }
            Fresh::Killed(tx, n) => {
                let _ = tx.send(n);
            }
        }
    }

    /// Answers `c` once the fast path's counts are read back: at once without a fast path,
    /// else after a forced pass. A read joins one already under way; a kill starts it again,
    /// so that every record is visited after the states went (records visited before would
    /// keep a killed flow in the tables).
    fn after_read_back(&mut self, c: Fresh) {
        match &mut self.fast {
            Some(f) => {
                if self.fresh.is_empty() || matches!(c, Fresh::Killed(..)) {
                    f.force();
                }
                self.fresh.push(c);
            }
            None => self.answer_fresh(c),
        }
    }

    /// A new ruleset was taken: the lists of rules it replaced (all of them after a load of
    /// the main ruleset, one after `-a ANCHOR -f`) count from now, as pf's new rules do.
    fn rules_replaced(&mut self, now: u32) {
        let lists: Vec<_> =
            self.worker.policy.current().1.rule_lists().into_iter().map(|l| (l.id, l.lo, l.hi)).collect();
        let w = &mut self.worker;
        w.t4.tally.follow(&lists, now, w.t4.seq());
        w.t6.tally.follow(&lists, now, w.t6.seq());
    }

    fn walk(&mut self, what: Walked) {
        self.walks.push_back(Walk { what, fam: 0, slot: 0 });
    }

    /// Walks the next chunk of the walk in progress; answers it when the tables are done.
    fn walk_step(&mut self, now: u32) {
        let Some(l) = self.walks.front_mut() else { return };
        // A walk of the rules' sums tells the tables how far it went (see
        // `RuleTally::walk_begin`).
        let rules = matches!(l.what, Walked::Rules(..));
        if rules && l.fam == 0 && l.slot == 0 {
            self.worker.t4.tally.walk_begin();
            self.worker.t6.tally.walk_begin();
        }
        let mut left = LIST_CHUNK;
        while l.fam < 2 && left > 0 {
            fn chunk<K: Key>(t: &xpf_state::StateTable<K>, l: &mut Walk, left: &mut u32, now: u32) -> bool {
                let end = t.high_water();
                while l.slot < end && *left > 0 {
                    let s = t.state(l.slot);
                    if s.flags & xpf_state::sf::LIVE != 0 {
                        l.what.state(t, l.slot, s, now);
                    }
                    l.slot += 1;
                    *left -= 1;
                }
                l.slot >= end
            }
            let done = if l.fam == 0 {
                chunk(&self.worker.t4, l, &mut left, now)
            } else {
                chunk(&self.worker.t6, l, &mut left, now)
            };
            if rules {
                let t = if l.fam == 0 { &mut self.worker.t4.tally } else { &mut self.worker.t6.tally };
                t.walk_at(if done { u32::MAX } else { l.slot });
            }
            if done {
                l.fam += 1;
                l.slot = 0;
            }
        }
        if l.fam >= 2 {
            let l = self.walks.pop_front().expect("a walk in progress");
            l.what.send(&mut self.worker);
        }
    }

    /// Hands the sources the engine found over their limits to the control thread.
    fn overloads(&mut self) {
        let w = &mut self.worker;
        if w.t4.track.overloads.is_empty() && w.t6.track.overloads.is_empty() {
            return;
        }
        let v4 = w.t4.track.overloads.drain(..).map(|(t, a)| (t, a.to_ip(xpf_wire::pdesc::AF_INET)));
        let v6 = w.t6.track.overloads.drain(..).map(|(t, a)| (t, a.to_ip(xpf_wire::pdesc::AF_INET6)));
        if let Some(o) = &self.overload {
            for x in v4.chain(v6) {
                let _ = o.tx.send(x);
            }
            // The control loop would otherwise see them at its next poll's end (up to 200 ms).
            o.wake.ring();
        }
    }

    /// Sleeps until a socket has something to read, a command is rung in or a frame handed
    /// over, or `d` passes.
    fn wait(&mut self, d: Duration) {
        if let (Some(w), Some(h)) = (&self.wake, &self.handoff) {
            w.sleeping(true);
            // A frame another worker queued before it saw the flag: no sleep (it is taken
            // first in the next round).
            if let Ok(it) = h.inbox.try_recv() {
                w.sleeping(false);
                self.handed.push(it);
                return;
            }
        }
        // Each port's socket, and its socket for new connections: a SYN wakes the worker too.
        let mut fds: Vec<libc::pollfd> = self
            .ports
            .iter()
            .flat_map(|p| std::iter::once(p.io.fd()).chain(p.io.syn_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        if let Some(w) = &self.wake {
            fds.push(libc::pollfd { fd: w.0, events: libc::POLLIN, revents: 0 });
        }
        if let Some(h) = &self.host {
            fds.push(libc::pollfd { fd: h.fd(), events: libc::POLLIN, revents: 0 });
        }
        // ppoll: a queued frame's time is finer than poll's milliseconds.
        let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
        // SAFETY: fds is a live array of pollfd of the length passed; ts lives across the call.
        unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if let Some(w) = &self.wake {
            w.sleeping(false);
            w.clear();
        }
    }

    fn forward(&mut self, p: usize, descs: &[Desc], now: u32) {
        let n = descs.len();
        let mut alls: [&[u8]; BATCH] = [&[]; BATCH];
        let mut opts = [0u32; BATCH];
        for i in 0..n {
            let d = descs[i];
            // SAFETY: the frame stays ours (not on the fill ring) until rx_done after this call;
            // nothing writes to the RX half of the UMEM meanwhile.
            alls[i] = unsafe { self.ports[p].io.frame_unbound(d.addr, d.len) };
            opts[i] = d.options;
        }
        self.forward_frames(p, &alls[..n], &opts[..n], now);
    }

    /// Passes the frames of a batch that belong to another worker's flows to that worker
    /// (copies; counted), and leaves in `mine` those of this worker's; returns how many.
    fn hand_off(&mut self, p: usize, descs: &[Desc], mine: &mut [Desc; BATCH]) -> usize {
        let Some(h) = &self.handoff else {
            mine[..descs.len()].copy_from_slice(descs);
            return descs.len();
        };
        let (generation, rules) = self.worker.policy.current();
        if self.nat_owners.0 != generation {
            self.nat_owners = (generation, crate::handoff::NatOwners::of(rules));
        }
        let nat = &self.nat_owners.1;
        let mut m = 0;
        let mut sent = 0u64;
        for d in descs {
            // SAFETY: as in forward: the frame is ours until rx_done.
            let all = unsafe { self.ports[p].io.frame_unbound(d.addr, d.len) };
            let frame = all.get(META_LEN..).unwrap_or(&[]);
            let n = h.workers();
            let w = match nat.is_empty() {
                true => crate::handoff::owner(frame, n),
                false => {
                    // Where the frame goes (the steering program's route, or packet mode's).
                    let path = match nat.needs_path() {
                        false => Default::default(),
                        true => crate::handoff::Path {
                            ingress: self.ports[p].ifindex,
                            egress: match Route::parse(all) {
                                Route::Forward { ifindex, .. } | Route::NoNeighbour { ifindex, .. } => ifindex,
                                Route::Local | Route::Invalid => 0,
                            },
                        },
                    };
                    self.fragments.owner(nat, frame, n, path)
                }
            };
            if w == h.me {
                mine[m] = *d;
                m += 1;
                continue;
            }
            if h.send(w, self.ports[p].ifindex, d.options, all) {
                self.io.handed_off += 1;
                sent |= 1 << (w % 64);
            } else {
                self.io.handoff_full += 1;
            }
        }
        // Workers that sleep are woken for what they were handed (one check of a flag each).
        for (w, wake) in h.wakes.iter().enumerate() {
            if sent & (1 << (w % 64)) != 0 {
                wake.nudge();
            }
        }
        m
    }

    /// Filters the frames other workers passed to this one (their flows' state is here).
    fn take_handed(&mut self, now: u32) -> usize {
        let Some(h) = &self.handoff else { return 0 };
        let mut items = std::mem::take(&mut self.handed);
        items.extend(h.inbox.try_iter().take(BATCH - items.len()));
        let n = items.len();
        self.io.handed_in += n as u64;
        let mut done = 0u64;
        while done.count_ones() as usize != n {
            let first = (!done).trailing_zeros() as usize;
            let ifindex = items[first].ifindex;
            let mut alls: [&[u8]; BATCH] = [&[]; BATCH];
            let mut opts = [0u32; BATCH];
            let mut m = 0;
            for (i, it) in items.iter().enumerate() {
                if done & (1 << i) == 0 && it.ifindex == ifindex {
                    done |= 1 << i;
                    alls[m] = &it.buf;
                    opts[m] = it.options;
                    m += 1;
                }
            }
            match self.port_of(ifindex) {
                Some(p) => self.forward_frames(p, &alls[..m], &opts[..m], now),
                None => self.io.egress_not_filtered += m as u64,
            }
        }
        if let Some(h) = &self.handoff {
            for it in items.drain(..) {
                h.recycle(it);
            }
        }
        self.handed = items;
        n
    }

    /// Filters a batch received on port `p` (`alls`: the steering program's metadata, then
    /// the frame; `opts`: the receive descriptors' options) and sends what passes.
    fn forward_frames(&mut self, p: usize, alls: &[&[u8]], opts: &[u32], now: u32) {
        let n = alls.len();
        let mut frames: [&[u8]; BATCH] = [&[]; BATCH];
        let mut routes = [Route::Invalid; BATCH];
        let inif = self.ports[p].ifindex;
        // TCP segments of fast-path flows the kernel handed over: their windows come from the
        // flow tables first.
        let mut handed_over = 0u64;
        let mut local = 0u64;
        let fast_tcp = self.fast.as_ref().is_some_and(|f| f.tcp_flows());
        for i in 0..n {
            routes[i] = Route::parse(alls[i]);
            if routes[i] == Route::Local {
                local |= 1 << i;
            }
            frames[i] = alls[i].get(META_LEN..).unwrap_or(&[]);
            if fast_tcp && self.ports[p].io.handed_over(alls[i]) {
                handed_over |= 1 << i;
            }
        }
        // Only the segments whose windows were merged are settled after the verdict (in
        // packet mode every frame is a candidate: one key parse and lookup, not two).
        if let Some(fp) = self.fast.as_mut().filter(|_| handed_over != 0) {
            for i in bits(handed_over) {
                if !fp.pull(&mut self.worker, frames[i], inif) {
                    handed_over &= !(1 << i);
                }
            }
        }
        // ICMP errors about fast-path TCP flows are checked against windows the program slid.
        if let Some(fp) = self.fast.as_mut().filter(|f| f.tcp_flows()) {
            for f in &frames[..n] {
                if crate::handoff::icmp_error(f) {
                    fp.pull_quoted(&mut self.worker, f);
                }
            }
        }
        let mut v_in = [Verdict::Pass; BATCH];
        // pf's packet tags: what the `in` pass tagged, the `out` pass sees (`tagged`).
        let mut tags = [0u16; BATCH];
        let clock = Instant::now();
        self.worker.process_tagged(&frames[..n], inif as u16, Dir::In, inif as u16, now, &mut v_in, &mut tags, local);
        self.log_batch(&frames[..n], inif);
        if self.worker.policy.current().1.loginterface.iter().any(|&i| i as u32 == inif) {
            self.io.loginterface.count(&frames[..n], &v_in[..n], 0);
        }
        // pf's queue of the `in` pass holds unless the `out` pass names one (as the tag).
        let mut q_in = [0u16; BATCH];
        // Frames held by a queue tree are stamped with the batch's time (one clock read).
        let mut shaped_at = 0;
        if self.shaping.any() {
            for (i, q) in q_in.iter_mut().enumerate().take(n) {
                *q = self.worker.queue_of(i);
            }
            shaped_at = self.start.elapsed().as_nanos() as u64;
        }
        // Defer mode: which frames made a state on the way in (the `out` pass may make more).
        let defer = self.sync.as_ref().is_some_and(|s| s.defer.is_some());
        let b = self.worker.batch();
        let (created_in, ids_in) = if defer { (b.created, b.created_ids) } else { (0, [0; BATCH]) };
        // `scrub (...)` of the `in` pass, applied with the `out` pass's when the frame leaves.
        let scrub_in = (b.scrubbed != 0).then_some((b.scrubbed, b.scrubs));
        let mut held = Vec::new();
        let b = self.worker.batch_mut();
        if !b.released.is_empty() {
            let (released, rewritten) = (std::mem::take(&mut b.released), b.released_translated);
            self.forward_datagrams(&released, rewritten, &routes, inif as u16, now);
        }
        let b = self.worker.batch_mut();
        if !b.host_pieces.is_empty() {
            let pieces = std::mem::take(&mut b.host_pieces);
            self.give_back(&pieces, inif);
        }
        // TCP/UDP checksums their senders left to offload, seen on the frames as they came
        // (the rewrites below update the field as if it were complete); finished on the way out.
        let mut partial = [None; BATCH];
        let mut to_local = 0u64;
        for i in 0..n {
            if v_in[i] == Verdict::Pass || local & (1 << i) != 0 {
                partial[i] = xpf_wire::offload::partial(frames[i]);
            }
        }
        // `modulate state` rewrote some on the way in: the `out` pass and the wire see the
        // rewritten copies.
        let mut bufs = std::mem::take(&mut self.mod_bufs);
        // `synproxy state`: frames that go on as another segment (the SYN to the server).
        let mut swapped = 0u64;
        for (i, b) in self.worker.batch_mut().substitutes.drain(..) {
            bufs.resize_with(BATCH, Vec::new);
            bufs[i as usize] = b;
            swapped |= 1 << i;
        }
        // Translated on the way in (`rdr-to`, replies of a translated state): rewritten
        // too, and routed where the new destination goes.
        let b = self.worker.batch();
        let xlated = b.translated;
        let copied = b.patched | swapped | xlated;
        if copied != 0 {
            bufs.resize_with(BATCH, Vec::new);
            for i in bits(b.patched) {
                bufs[i].clear();
                bufs[i].extend_from_slice(frames[i]);
                let (a, s) = b.patches[i];
                xpf_engine::proto::apply_modulation(&mut bufs[i], a, s);
            }
            let t = Instant::now();
            for i in bits(xlated) {
                if (b.patched | swapped) & (1 << i) == 0 {
                    bufs[i].clear();
                    bufs[i].extend_from_slice(frames[i]);
                }
                xpf_wire::translate::apply(&mut bufs[i], &b.rewrites[i]);
                if v_in[i] == Verdict::Pass {
                    routes[i] = match self.router.route(&bufs[i], t) {
                        Routed::Out(r) => r,
                        Routed::Local => {
                            to_local |= 1 << i;
                            Route::Local
                        }
                        Routed::Not => {
                            self.io.nat_no_route += 1;
                            v_in[i] = Verdict::Drop(xpf_wire::Reason::NoRoute);
                            Route::Invalid
                        }
                    };
                }
            }
            for (i, b) in bufs.iter().enumerate() {
                if copied & (1 << i) != 0 {
                    frames[i] = &b[..];
                }
            }
        }
        // `route-to` (and `reply-to` of a state made going out): where the rule sends them,
        // not where the routing table does.
        let rt_in = self.worker.batch().routes;
        if rt_in[..n].iter().any(|&r| r != 0) {
            let t = Instant::now();
            for i in 0..n {
                if rt_in[i] != 0 && v_in[i] == Verdict::Pass && local & (1 << i) == 0 && to_local & (1 << i) == 0 {
                    match self.route_by_rule(rt_in[i], frames[i], opts[i], t) {
                        Some(r) => routes[i] = r,
                        None => v_in[i] = Verdict::Drop(xpf_wire::Reason::NoRoute),
                    }
                }
            }
        }
        // To this host: what no translation took goes back to the kernel as it came; what a
        // translation sends here goes by loopback (it was filtered here already).
        let untranslated = |i: usize| v_in[i] == Verdict::Host || (v_in[i] == Verdict::Pass && xlated & (1 << i) == 0);
        let to_host = bits(local).filter(|&i| untranslated(i)).fold(0u64, |m, i| m | 1 << i);
        if to_host | to_local != 0 {
            self.deliver_here(&frames[..n], to_host, to_local, &partial, inif);
        }
        let mut spent = clock.elapsed();
        self.send_returns(p);
        // `out` on the egress interface, one engine batch per egress interface.
        let mut egress: [u32; BATCH] = [0; BATCH];
        let mut todo = 0u64;
        for i in 0..n {
            match (v_in[i], routes[i]) {
                (Verdict::Pass, Route::Forward { ifindex, .. } | Route::NoNeighbour { ifindex, .. }) => {
                    egress[i] = ifindex;
                    todo |= 1 << i;
                }
                (Verdict::Pass, Route::Invalid) => self.io.bad_meta += 1,
                (Verdict::Pass, Route::Local) => {}
                (Verdict::Host, _) => self.io.not_ip += 1,
                _ => {}
            }
        }
        let mut sel: [usize; BATCH] = [0; BATCH];
        let mut out_frames: [&[u8]; BATCH] = [&[]; BATCH];
        let mut out_tags = [0u16; BATCH];
        let mut v_out = [Verdict::Pass; BATCH];
        let mut passed = 0u64;
        // Frames a state's `reply-to` (or an `out` rule's `route-to`) sent on to another
        // interface, filtered again leaving by that one (once: pf_route).
        let mut rerouted = 0u64;
        while todo != 0 {
            let eg = egress[todo.trailing_zeros() as usize];
            let mut m = 0;
            let mut rest = todo;
            while rest != 0 {
                let j = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                if egress[j] == eg {
                    todo &= !(1 << j);
                    sel[m] = j;
                    out_frames[m] = frames[j];
                    out_tags[m] = tags[j];
                    m += 1;
                }
            }
            let Some(ep) = self.port_of(eg) else {
                self.io.egress_not_filtered += m as u64;
                continue;
            };
            let clock = Instant::now();
            self.worker.process_tagged(
                &out_frames[..m],
                eg as u16,
                Dir::Out,
                inif as u16,
                now,
                &mut v_out[..m],
                &mut out_tags[..m],
                0,
            );
            self.log_batch(&out_frames[..m], eg);
            if self.worker.policy.current().1.loginterface.iter().any(|&i| i as u32 == eg) {
                self.io.loginterface.count(&out_frames[..m], &v_out[..m], 1);
            }
            spent += clock.elapsed();
            // A block out with return answers the sender, back where the packet came in.
            self.send_returns(p);
            // Frames that leave as another segment (synproxy's ACK to the client).
            let swapped = std::mem::take(&mut self.worker.batch_mut().substitutes);
            let rt_out = self.worker.batch().routes;
            for k in 0..m {
                if v_out[k] != Verdict::Pass {
                    continue;
                }
                if rt_out[k] != 0 {
                    let Some(r) = self.route_by_rule(rt_out[k], out_frames[k], opts[sel[k]], clock) else {
                        v_out[k] = Verdict::Drop(xpf_wire::Reason::NoRoute);
                        continue;
                    };
                    routes[sel[k]] = r;
                    let to = match r {
                        Route::Forward { ifindex, .. } | Route::NoNeighbour { ifindex, .. } => ifindex,
                        _ => eg,
                    };
                    if to != eg {
                        // Once: a next hop out of yet another interface there is a loop of
                        // rules (pf drops a packet routed more than a few times).
                        if rerouted & (1 << sel[k]) != 0 {
                            v_out[k] = Verdict::Drop(xpf_wire::Reason::NoRoute);
                            self.io.routed -= 1;
                            self.io.route_failed += 1;
                            continue;
                        }
                        rerouted |= 1 << sel[k];
                        egress[sel[k]] = to;
                        todo |= 1 << sel[k];
                        continue;
                    }
                }
                passed |= 1 << sel[k];
                let frame_k = swapped.iter().find(|(j, _)| *j as usize == k).map_or(out_frames[k], |(_, b)| &b[..]);
                let made = |bits: u64, ids: &[u32; BATCH], i: usize| (bits & (1 << i) != 0).then(|| ids[i]);
                let wait = if defer {
                    [
                        made(created_in, &ids_in, sel[k]),
                        made(self.worker.batch().created, &self.worker.batch().created_ids, k),
                    ]
                } else {
                    [None, None]
                };
                let partial = partial[sel[k]];
                match routes[sel[k]] {
                    Route::Forward { dmac, smac, .. } if wait != [None, None] => {
                        let d = self.sync.as_mut().and_then(|s| s.defer.as_mut()).expect("defer on");
                        let f = d.hold(frame_k, ep, wait, Instant::now(), &mut held);
                        outgoing(f, &self.worker, k, sel[k], &scrub_in, &dmac, &smac);
                        // Held frames leave later by plain copy: finished here.
                        if partial.is_some() {
                            xpf_wire::offload::finish(f);
                            self.io.csum_finished += 1;
                        }
                        self.held_now = true;
                    }
                    // A queue tree on the egress: held in the queue the state (or the rules)
                    // named, sent when the tree lets it go.
                    Route::Forward { dmac, smac, .. } if self.shaping.on(ep) => {
                        let o = opts[sel[k]];
                        let qid = match self.worker.queue_of(k) {
                            0 => q_in[sel[k]],
                            q => q,
                        };
                        let gso = match partial {
                            Some(pc) if gso_type(o) != 0 => crate::shaping::gso_meta(o, pc.start, pc.offset),
                            _ => 0,
                        };
                        let w = &self.worker;
                        let built = self.shaping.hold(ep, qid, gso, shaped_at, frame_k.len(), |b| {
                            b.extend_from_slice(frame_k);
                            outgoing(b, w, k, sel[k], &scrub_in, &dmac, &smac);
                            // Held frames leave by plain copy (or whole, GSO): checksums
                            // finished here, or prepared for the kernel to finish.
                            match partial {
                                Some(_) if gso != 0 => xpf_wire::offload::prepare(b),
                                Some(_) => xpf_wire::offload::finish(b),
                                None => {}
                            }
                        });
                        if built && partial.is_some() && gso == 0 {
                            self.io.csum_finished += 1;
                        }
                        self.io.shaped += 1;
                    }
                    // Packet mode: a GSO packet (its sender left segmentation to offload)
                    // goes out whole, for the kernel to segment and checksum.
                    Route::Forward { dmac, smac, .. } if gso_type(opts[sel[k]]) != 0 => {
                        let mut f = frame_k.to_vec();
                        outgoing(&mut f, &self.worker, k, sel[k], &scrub_in, &dmac, &smac);
                        xpf_wire::offload::prepare(&mut f);
                        let o = opts[sel[k]];
                        let sent = partial.and_then(|pc| {
                            let l4 = f.get(pc.start as usize..)?;
                            let hl = if pc.offset == 16 { (*l4.get(12)? >> 4) as u16 * 4 } else { 8 };
                            let io = &mut self.ports[ep].io;
                            Some(io.tx_gso(&f, gso_type(o), gso_size(o), pc.start, pc.offset, pc.start + hl))
                        });
                        if sent == Some(true) {
                            self.io.forwarded += 1;
                            self.io.csum_offloaded += 1;
                        } else {
                            self.io.tx_full += 1;
                        }
                    }
                    Route::Forward { dmac, smac, .. } => {
                        let io = &mut self.ports[ep].io;
                        let offload = partial.is_some() && io.can_tx_checksum();
                        match io.tx_copy(frame_k) {
                            Some(f) => {
                                outgoing(f, &self.worker, k, sel[k], &scrub_in, &dmac, &smac);
                                match partial {
                                    Some(_) if offload => xpf_wire::offload::prepare(f),
                                    Some(_) => xpf_wire::offload::finish(f),
                                    None => {}
                                }
                                // A flow of a shaped interface stays here, in its queue. The
                                // fast path keys it as it came in (`frame_k` may be translated
                                // already: rdr-to, a reply to nat-to). A frame whose `out` pass
                                // made its state is a flow's first: nothing to offer yet (no
                                // flow goes on before its second packet or its handshake).
                                let first = self.worker.batch().created & (1 << k) != 0;
                                if let Some(fp) = self.fast.as_mut().filter(|_| !first && !self.shaping.any()) {
                                    let arrived = alls[sel[k]].get(META_LEN..).unwrap_or(&[]);
                                    fp.offer(&mut self.worker, arrived, f, inif, eg);
                                }
                                if let Some(pc) = partial {
                                    if offload && io.tx_checksum(pc.start, pc.offset) {
                                        self.io.csum_offloaded += 1;
                                    } else {
                                        self.io.csum_finished += 1;
                                    }
                                }
                                self.io.forwarded += 1;
                            }
                            None => self.io.tx_full += 1,
                        }
                    }
                    Route::NoNeighbour { ifindex, family, nexthop } => {
                        self.io.no_neighbour += 1;
                        // As it leaves but for the link addresses (written when known); a
                        // GSO packet (packet mode) does not wait.
                        if gso_type(opts[sel[k]]) != 0 {
                            self.io.neighbour_dropped += 1;
                        } else {
                            let mut f = frame_k.to_vec();
                            outgoing(&mut f, &self.worker, k, sel[k], &scrub_in, &[0; 6], &[0; 6]);
                            if partial.is_some() {
                                xpf_wire::offload::finish(&mut f);
                                self.io.csum_finished += 1;
                            }
                            self.hold_unresolved(ep, ifindex, family, nexthop, f);
                        }
                        self.resolve(ifindex, family, nexthop);
                    }
                    Route::Local | Route::Invalid => {}
                }
            }
        }
        if let Some(fp) = self.fast.as_mut().filter(|_| handed_over != 0) {
            for i in bits(handed_over) {
                fp.settle(&mut self.worker, frames[i], inif, passed & (1 << i) != 0);
            }
        }
        self.mod_bufs = bufs;
        if std::mem::take(&mut self.held_now) {
            // The held packets' inserts go to the peer now, not with the next second's flush.
            if let Some(s) = &mut self.sync {
                s.send_now(&mut self.worker, now);
            }
        }
        self.send_held(held);
        self.io.filtered += n as u64;
        self.io.filter_ns += spent.as_nanos() as u64;
    }

    /// Sends the answers to blocked packets (`block return`) out of port `p`, where the
    /// packets came in.
    fn send_returns(&mut self, p: usize) {
        let answers = std::mem::take(&mut self.worker.batch_mut().returns);
        for (_, f) in answers {
            if !self.ports[p].io.room_for_answers() {
                self.io.answers_shed += 1;
            } else if self.ports[p].io.tx_copy(&f).is_none() {
                self.io.tx_full += 1;
            }
            self.worker.recycle(f);
        }
    }

    /// Sends the packets defer mode released (already rewritten for the wire).
    fn send_held(&mut self, mut out: crate::defer::Released) {
        if out.is_empty() {
            self.held_out = out;
            return;
        }
        for (port, f) in out.drain(..) {
            match self.ports[port].io.tx_copy(&f) {
                Some(_) => self.io.forwarded += 1,
                None => self.io.tx_full += 1,
            }
            if let Some(d) = self.sync.as_mut().and_then(|s| s.defer.as_mut()) {
                d.recycle(f);
            }
        }
        for p in self.ports.iter_mut() {
            p.io.flush();
        }
        self.held_out = out;
    }

    /// Sends on the fragments of reassembled datagrams that passed `in`: each datagram is
    /// filtered `out` as a whole on the egress its completing frame was routed to, and its
    /// fragments leave unchanged but for the link header and TTL.
    #[cold]
    fn forward_datagrams(&mut self, released: &[(u8, Vec<u8>)], rewritten: u64, routes: &[Route], inif: u16, now: u32) {
        let mut start = 0;
        while start < released.len() {
            let idx = released[start].0;
            let end = start + released[start..].iter().take_while(|r| r.0 == idx).count();
            let group: Vec<&[u8]> = released[start..end].iter().map(|r| &r.1[..]).collect();
            start = end;
            // Translated on the way in (`rdr-to`, a reply of a translated flow): routed where the
            // rewritten destination goes.
            let rt = self.worker.batch().routes[idx as usize];
            let route = if rt != 0 {
                // `route-to`: where the rule sends it.
                match self.route_by_rule(rt, group[0], 0, Instant::now()) {
                    Some(r) => r,
                    None => continue,
                }
            } else if rewritten & (1 << idx) != 0 {
                match self.router.route(group[0], Instant::now()) {
                    Routed::Out(r) => r,
                    Routed::Local | Routed::Not => {
                        self.io.nat_no_route += group.len() as u64;
                        continue;
                    }
                }
            } else {
                routes[idx as usize]
            };
            let (eg, dmac, smac) = match route {
                Route::Forward { ifindex, dmac, smac } => (ifindex, dmac, smac),
                Route::NoNeighbour { ifindex, family, nexthop } => {
                    // A reassembled datagram's fragments do not wait (rare: the first
                    // packet to a next hop the kernel does not know, in fragments).
                    self.io.no_neighbour += group.len() as u64;
                    self.io.neighbour_dropped += group.len() as u64;
                    self.resolve(ifindex, family, nexthop);
                    continue;
                }
                Route::Local | Route::Invalid => {
                    self.io.bad_meta += group.len() as u64;
                    continue;
                }
            };
            let Some(mut ep) = self.port_of(eg) else {
                self.io.egress_not_filtered += group.len() as u64;
                continue;
            };
            let (mut v, mut to) = self.worker.filter_datagram(&group, eg as u16, Dir::Out, inif, now);
            let (mut dmac, mut smac) = (dmac, smac);
            // `reply-to` (or an `out` rule's `route-to`): sent to the rule's next hop, filtered
            // again leaving by its interface when that is another.
            let rt = self.worker.datagram_route();
            if v == Verdict::Pass && rt != 0 {
                match self.route_by_rule(rt, group[0], 0, Instant::now()) {
                    Some(Route::Forward { ifindex, dmac: d, smac: s }) => {
                        if ifindex != eg {
                            let Some(p) = self.port_of(ifindex) else {
                                self.io.egress_not_filtered += group.len() as u64;
                                continue;
                            };
                            ep = p;
                            (v, to) = self.worker.filter_datagram(&group, ifindex as u16, Dir::Out, inif, now);
                        }
                        (dmac, smac) = (d, s);
                    }
                    Some(Route::NoNeighbour { ifindex, family, nexthop }) => {
                        self.io.no_neighbour += group.len() as u64;
                        self.io.neighbour_dropped += group.len() as u64;
                        self.resolve(ifindex, family, nexthop);
                        continue;
                    }
                    _ => continue,
                }
            }
            if v != Verdict::Pass {
                continue;
            }
            for f in group {
                match self.ports[ep].io.tx_copy(f) {
                    Some(out) => {
                        if let Some(to) = &to {
                            xpf_wire::translate::apply_fragment(out, to);
                        }
                        ethernet::forward(out, dmac, smac);
                        self.io.forwarded += 1;
                    }
                    None => self.io.tx_full += 1,
                }
            }
        }
    }

    /// Frames addressed to this host: `back` (the host's own, sent here because they went to
    /// a translation target) into the kernel as received on `inif`, `local` (translated to
    /// one of the host's addresses) by loopback; checksums left to offload finished first.
    #[cold]
    fn deliver_here(&mut self, frames: &[&[u8]], back: u64, local: u64, partial: &[Option<Partial>], inif: u32) {
        self.open_back(back != 0);
        if self.raw.is_none() && local != 0 {
            match crate::host::RawOut::open() {
                Ok(r) => self.raw = Some(r),
                Err(e) => log::warn!("raw sockets for translated packets to this host: {e}"),
            }
        }
        for i in bits(back | local) {
            let mut f = frames[i].to_vec();
            if partial[i].is_some() {
                xpf_wire::offload::finish(&mut f);
            }
            if back & (1 << i) != 0 {
                self.back(&f, inif);
                continue;
            }
            self.io.nat_local += 1;
            if !self.raw.as_ref().is_some_and(|r| r.send(&f[14..])) {
                self.io.tx_full += 1;
            }
        }
    }

    /// Fragments to this host's translation address that were the host's own (no translated
    /// flow's): back into the kernel as they came in on `inif`.
    #[cold]
    fn give_back(&mut self, pieces: &[(u8, Vec<u8>)], inif: u32) {
        self.open_back(true);
        for (_, f) in pieces {
            self.back(f, inif);
        }
    }

    /// Readies the way back into the kernel (`needed`: frames will take it) and this second's
    /// budget for it.
    fn open_back(&mut self, needed: bool) {
        if self.inject.is_none() && needed {
            match xpf_xdp::steer::Inject::load() {
                Ok(i) => self.inject = Some(i),
                Err(e) => log::warn!("loading the program that gives frames back to the kernel: {e}"),
            }
        }
        let now = self.now();
        if self.to_host_budget.1 != now {
            self.to_host_budget = (0, now);
        }
    }

    /// One of the host's own frames back into the kernel as received on `inif`, within the
    /// budget of [`TO_HOST_PER_SECOND`] (shed beyond it, counted).
    fn back(&mut self, f: &[u8], inif: u32) {
        if self.to_host_budget.0 >= TO_HOST_PER_SECOND {
            self.io.nat_to_host_shed += 1;
            return;
        }
        self.to_host_budget.0 += 1;
        self.io.nat_to_host += 1;
        if self.inject.as_ref().is_none_or(|j| j.to_stack(f, inif).is_err()) {
            self.io.tx_full += 1;
        }
    }

    /// Where routing target `rt` of the rules in force sends `frame` (received with options
    /// `opt`: a GSO packet's segments must fit the MTU) at time `t` (the batch's clock),
    /// counted in `routed`; None, counted in `route_failed`, when it cannot go there.
    fn route_by_rule(&mut self, rt: u16, frame: &[u8], opt: u32, t: Instant) -> Option<Route> {
        let target = xpf_engine::Policy::route(&self.worker.policy, rt).copied();
        let r = target.map(|tg| {
            let family = if tg.af == xpf_wire::pdesc::AF_INET { libc::AF_INET } else { libc::AF_INET6 } as u8;
            let gso = if gso_type(opt) != 0 { gso_size(opt) } else { 0 };
            self.router.via(tg.ifidx as u32, family, tg.addr.0, frame, gso, t)
        });
        match r {
            Some(Routed::Out(r)) => {
                self.io.routed += 1;
                Some(r)
            }
            _ => {
                self.io.route_failed += 1;
                None
            }
        }
    }

    /// Sends the host's own packets a rule's next hop takes (`frames`: each with its target's
    /// number, link addresses still to write) out of the target's interface.
    #[cold]
    fn send_routed(&mut self, frames: Vec<(u16, Vec<u8>)>) {
        for (rt, mut f) in frames {
            let Some(r) = self.route_by_rule(rt, &f, 0, Instant::now()) else { continue };
            let (Route::Forward { ifindex, .. } | Route::NoNeighbour { ifindex, .. }) = r else { continue };
            let Some(ep) = self.port_of(ifindex) else {
                self.io.egress_not_filtered += 1;
                continue;
            };
            match r {
                Route::Forward { dmac, smac, .. } => {
                    let Ok(mut link) = ethernet::Frame::new_checked(&mut f[..]) else { continue };
                    link.set_dst(dmac);
                    link.set_src(smac);
                    match self.ports[ep].io.tx_copy(&f) {
                        Some(_) => self.io.forwarded += 1,
                        None => self.io.tx_full += 1,
                    }
                    self.ports[ep].io.flush();
                }
                Route::NoNeighbour { ifindex, family, nexthop } => {
                    self.io.no_neighbour += 1;
                    self.hold_unresolved(ep, ifindex, family, nexthop, f);
                    self.resolve(ifindex, family, nexthop);
                }
                _ => {}
            }
        }
    }

    /// Asks the kernel to resolve a next hop, at most once a second per next hop.
    fn resolve(&mut self, ifindex: u32, family: u8, nexthop: [u8; 16]) {
        let t = Instant::now();
        self.last_resolve.retain(|e| t.duration_since(e.2) < Duration::from_secs(1));
        if self.last_resolve.iter().any(|e| e.0 == ifindex && e.1 == nexthop) || self.last_resolve.len() > 256 {
            return;
        }
        self.last_resolve.push((ifindex, nexthop, t));
        let addr = hop_addr(family, &nexthop);
        if let Err(e) = xpf_xdp::netlink::neigh_resolve(ifindex, addr) {
            log::warn!("asking the kernel to resolve a next hop on ifindex {ifindex}: {e}");
        }
    }

    /// Keeps `f` (out of port `ep`, link addresses still to write) until the kernel knows
    /// `nexthop`'s link address on `ifindex`.
    fn hold_unresolved(&mut self, ep: usize, ifindex: u32, family: u8, nexthop: [u8; 16], f: Vec<u8>) {
        let now = Instant::now();
        let full = self.unresolved.len() >= HOLD_HOPS;
        match self.unresolved.iter_mut().find(|u| u.ifindex == ifindex && u.nexthop == nexthop) {
            Some(u) if u.frames.len() >= HOLD_PER_HOP => self.io.neighbour_dropped += 1,
            Some(u) => u.frames.push(f),
            None if full => self.io.neighbour_dropped += 1,
            None => {
                self.unresolved.push(Unresolved { ep, ifindex, family, nexthop, since: now, frames: vec![f] });
                self.unresolved_check = now;
            }
        }
    }

    /// Sends the frames whose next hop the kernel has resolved since (asked every
    /// [`HOLD_CHECK`]), and drops those that waited [`HOLD_FOR`] in vain.
    fn send_resolved(&mut self) {
        let now = Instant::now();
        if now < self.unresolved_check {
            return;
        }
        self.unresolved_check = now + HOLD_CHECK;
        let mut i = 0;
        while i < self.unresolved.len() {
            let u = &self.unresolved[i];
            let addr = hop_addr(u.family, &u.nexthop);
            let dmac = xpf_xdp::netlink::neigh_get(u.ifindex, addr).ok().flatten();
            let smac = dmac.and_then(|_| {
                let name = xpf_xdp::netlink::ifname(u.ifindex)?;
                xpf_xdp::netlink::mac(&name).ok()
            });
            match (dmac, smac) {
                (Some(d), Some(sm)) => {
                    let u = self.unresolved.swap_remove(i);
                    self.router.resolved(u.ifindex, &u.nexthop, d);
                    for p in self.ports.iter_mut() {
                        p.io.neighbour_resolved(u.ifindex, &u.nexthop, d);
                    }
                    log::debug!(
                        "next hop {:?} on ifindex {} resolved after {:?}: {} packets sent",
                        hop_addr(u.family, &u.nexthop),
                        u.ifindex,
                        now.duration_since(u.since),
                        u.frames.len()
                    );
                    for mut f in u.frames {
                        let Ok(mut link) = ethernet::Frame::new_checked(&mut f[..]) else { continue };
                        link.set_dst(d);
                        link.set_src(sm);
                        match self.ports[u.ep].io.tx_copy(&f) {
                            Some(_) => {
                                self.io.forwarded += 1;
                                self.io.neighbour_sent += 1;
                            }
                            None => self.io.tx_full += 1,
                        }
                    }
                    self.ports[u.ep].io.flush();
                }
                _ if now.duration_since(u.since) >= HOLD_FOR => {
                    let u = self.unresolved.swap_remove(i);
                    log::debug!(
                        "next hop {:?} on ifindex {} unresolved after {:?}: {} packets dropped",
                        hop_addr(u.family, &u.nexthop),
                        u.ifindex,
                        HOLD_FOR,
                        u.frames.len()
                    );
                    self.io.neighbour_dropped += u.frames.len() as u64;
                }
                _ => i += 1,
            }
        }
    }

    fn command(&mut self, c: Cmd) {
        let now = self.now();
        match c {
            Cmd::Queues(tx) => {
                let _ = tx.send(self.shaping.stats());
            }
            Cmd::Snapshot(tx) => {
                let x: Vec<XskStats> = self.ports.iter_mut().map(|p| p.io.kernel_stats()).collect();
                let c = self.ports.iter().filter_map(|p| Some((p.ifindex, p.io.packet_counters()?))).collect();
                let mut io = self.io;
                if let Some(f) = &self.fast {
                    io.fast = f.stats;
                }
                if let Some(h) = &self.host {
                    io.host = h.stats;
                }
                let _ = tx.send((Info::of(&self.worker), io, x, c));
            }
            Cmd::NatPorts(tx) => {
                let _ = tx
                    .send(self.worker.nat.ports_by_address().map(|(a, af, c, u, n)| (a.to_ip(af), c, u, n)).collect());
            }
            Cmd::StatesByIf(tx) => self.walk(Walked::ByIf(tx, Default::default())),
            // The fast path's counts first, so that packets, bytes and expiry are current;
            // after a kill, its flows leave the tables before the answer.
            Cmd::RuleSums(tx) => self.after_read_back(Fresh::RuleSums(tx)),
            Cmd::TableSums(tx) => self.after_read_back(Fresh::TableSums(tx)),
            Cmd::States(tx) => self.after_read_back(Fresh::States(tx)),
            Cmd::Sources(tx) => {
                let mut rows = Vec::new();
                src_rows(&self.worker.t4, xpf_wire::pdesc::AF_INET, now, &mut rows);
                src_rows(&self.worker.t6, xpf_wire::pdesc::AF_INET6, now, &mut rows);
                rows.extend(self.worker.nat.sticky_rows().map(|(inside, af, u, to, states, since)| SrcRow {
                    addr: inside.to_ip(af),
                    to: Some((if u == xpf_engine::nat::Use::Source { "nat-to" } else { "rdr-to" }, to.to_ip(af))),
                    states,
                    conn: 0,
                    rate: (0, 0),
                    age: now.saturating_sub(since),
                    expires: None,
                    rule: 0,
                }));
                let _ = tx.send(rows);
            }
            Cmd::KillSources(src, dst, tx) => {
                let within = |a: &xpf_wire::Addr, af: u8, net: &Option<(std::net::IpAddr, u8)>| {
                    net.as_ref().is_none_or(|n| in_net(a, af, n))
                };
                // A tracked source has no translation address: a DST other than `any`
                // leaves it, as pf's match of its zero address does.
                let tracked = dst.is_none_or(|d| d.1 == 0);
                let mut n = 0;
                if tracked {
                    n += self.worker.t4.track.kill_nodes(|a| within(a, xpf_wire::pdesc::AF_INET, &src))
                        + self.worker.t6.track.kill_nodes(|a| within(a, xpf_wire::pdesc::AF_INET6, &src));
                }
                n += self.worker.nat.unstick(|inside, af, to| within(inside, af, &src) && within(to, af, &dst));
                let _ = tx.send(n);
            }
            Cmd::Kill(sel, tx) => {
                let n = kill(&mut self.worker.t4, &sel) + kill(&mut self.worker.t6, &sel);
                self.after_read_back(Fresh::Killed(tx, n));
            }
            Cmd::Flush(tx) => {
                let n = match &mut self.sync {
                    Some(s) => s.flush_states(&mut self.worker, now),
                    None => self.worker.remove_all_states(true, now),
                };
                self.after_read_back(Fresh::Killed(tx, n));
            }
            Cmd::Limits { states, timeouts, frags, cookies, src_nodes, done } => {
                self.worker.set_src_node_limit(src_nodes);
                if self.worker.syncookies().0 != cookies {
                    self.worker.set_syncookies(cookies, None);
                }
                self.worker.set_reassemble(frags.0, frags.1, timeouts.get(xpf_state::Timeout::Frag));
                self.worker.t4.set_timeouts(timeouts.clone());
                self.worker.t6.set_timeouts(timeouts);
                let r = if states != self.worker.limit() {
                    self.worker.set_limit(states).map_err(|e| format!("set limit states {states}: {e:?}"))
                } else {
                    Ok(())
                };
                let _ = done.send(r);
            }
            Cmd::Sync(msgs) => {
                if let Some(s) = &mut self.sync {
                    let mut out = std::mem::take(&mut self.held_out);
                    s.apply(&mut self.worker, &msgs, now, &mut out);
                    // Answers (insert acks, update requests) go now, not after the next sleep.
                    s.answer();
                    self.send_held(out);
                }
            }
            Cmd::SyncBulk => {
                if let Some(s) = &mut self.sync {
                    s.rep.bulk_start();
                }
            }
        }
    }
}

/// An eventfd that wakes a sleeping worker (or the control loop), and whether it sleeps: a frame handed to it by
/// another worker rings it only then ([`Wake::nudge`]), so that a busy worker's hand-offs cost
/// no system call and an idle one's handed frame does not wait out its sleep (10 ms).
pub struct Wake(i32, std::sync::atomic::AtomicBool);

impl Wake {
    pub fn new() -> std::io::Result<Wake> {
        // SAFETY: plain syscall; the fd is owned by the Wake.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Wake(fd, std::sync::atomic::AtomicBool::new(false)))
    }
    pub fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64.
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }
    /// Rings the worker if it sleeps or is about to, after the caller queued something for it.
    /// With [`Wake::sleeping`] this is Dekker's handshake: the sender queues, then reads the
    /// flag; the worker raises the flag, then looks at its queue; the fences keep each pair in
    /// order, so at least one of them sees the other and no frame waits for a sleep to end.
    pub fn nudge(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.1.load(Ordering::SeqCst) {
            self.ring();
        }
    }
    /// The worker's side of [`Wake::nudge`]: raised before it looks at its queue one last time
    /// and sleeps, lowered when it wakes.
    fn sleeping(&self, on: bool) {
        self.1.store(on, Ordering::SeqCst);
        if on {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }
    /// The eventfd, for a poll that waits on it.
    pub fn fd(&self) -> i32 {
        self.0
    }
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 (non-blocking).
        unsafe { libc::read(self.0, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: the fd is ours.
        unsafe { libc::close(self.0) };
    }
}

/// Applies the scrub actions of frame `i`'s `in` pass (`scrub_in`) and of its `out` pass
/// (frame `k` of the worker's last batch), the later adding to the earlier as pf's do.
#[inline]
/// What a forwarded frame's copy gets before it leaves: the `out` pass's modulation (frame k
/// of the `out` batch), the scrub actions of both passes (frame i of the `in` batch), new
/// link addresses and TTL.
#[allow(clippy::too_many_arguments)]
fn outgoing(
    f: &mut [u8],
    w: &Worker<Live>,
    k: usize,
    i: usize,
    scrub_in: &Option<(u64, [xpf_engine::Scrub; BATCH])>,
    dmac: &[u8; 6],
    smac: &[u8; 6],
) {
    let b = w.batch();
    if b.patched & (1 << k) != 0 {
        let (a, s) = b.patches[k];
        xpf_engine::proto::apply_modulation(f, a, s);
    }
    if b.translated & (1 << k) != 0 {
        xpf_wire::translate::apply(f, &b.rewrites[k]);
    }
    scrub(f, scrub_in, i, w, k);
    ethernet::forward(f, *dmac, *smac);
}

fn scrub(f: &mut [u8], scrub_in: &Option<(u64, [xpf_engine::Scrub; BATCH])>, i: usize, w: &Worker<Live>, k: usize) {
    let mut s = match scrub_in {
        Some((m, v)) if m & (1 << i) != 0 => Some(v[i]),
        _ => None,
    };
    if w.batch().scrubbed & (1 << k) != 0 {
        let o = w.batch().scrubs[k];
        match &mut s {
            Some(s) => {
                s.merge(&o);
                if o.random_id {
                    s.id = o.id;
                }
            }
            None => s = Some(o),
        }
    }
    if let Some(s) = s {
        xpf_engine::proto::apply_scrub(f, &s);
    }
}

#[cfg(test)]
mod tests {
    /// The real-time class in a SYN flood only: in at the first look that finds new
    /// connections dropped at their ring, kept while drops go on, out after RT_HOLD without.
    #[test]
    fn real_time_while_new_connections_are_dropped_and_ten_seconds_after() {
        use super::{RtAuto, RtStep, RT_HOLD};
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut r = RtAuto::new(1, -20);
        // No drops: the fair class.
        assert_eq!(r.step(at(100), 0), RtStep::Stay);
        assert_eq!(r.step(at(200), 0), RtStep::Stay);
        assert_eq!(r.step(at(300), 250), RtStep::Enter(250));
        // Drops go on: it stays, and the hold starts again from the last of them.
        assert_eq!(r.step(at(400), 900), RtStep::Stay);
        assert_eq!(r.step(at(5_000), 901), RtStep::Stay);
        let hold = RT_HOLD.as_millis() as u64;
        assert_eq!(r.step(at(5_000 + hold - 100), 901), RtStep::Stay);
        assert_eq!(r.step(at(5_000 + hold), 901), RtStep::Leave(4_700 + hold));
        assert_eq!(r.step(at(5_100 + hold), 901), RtStep::Stay);
        // A new flood: in again.
        assert_eq!(r.step(at(5_200 + hold), 950), RtStep::Enter(49));
    }
}
