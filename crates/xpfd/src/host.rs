//! The firewall's own traffic through the rules, as pf filters it: packets addressed to the
//! host on a filtered interface are filtered `in` on it, and the host's own packets `out` on
//! the interface they leave by, with state, by worker 0's engine (the same tables, so
//! `-s states`, `-k` and sync see them). The kernel queues them to xpfd through NFQUEUE (the
//! iptables chains `xpfd-in`/`xpfd-out`, xpf_xdp::nfqueue) and waits for the verdict; passed
//! packets go on in the kernel untouched, or rewritten when `modulate state` changed them.
//! Answers to blocked ones (`block return`) are sent through raw sockets carrying the mark
//! the `xpfd-out` chain lets by, as pf marks what it generates.
//!
//! Fragments: the kernel reassembles IPv4 before the INPUT hook and fragments after OUTPUT,
//! but IPv6 reaches INPUT in fragments (its reassembly comes after the hook, unless conntrack
//! defragments, which xpfd's chains do not ask for). The engine reassembles them and filters
//! the datagram whole; the verdict on each fragment waits (NFQUEUE lets it) until the
//! datagram is complete, then every fragment gets the datagram's verdict. Fragments waiting
//! longer than the `frag` timeout, or beyond PENDING_MAX, are dropped.

use serde::Serialize;
use xpf_engine::{Policy, Verdict, Worker};
use xpf_state::Dir;
use xpf_xdp::nfqueue::{HostRules, NfQueue, HOOK_INPUT, HOOK_OUTPUT};

/// The NFQUEUE number xpfd reads (queue numbers are per network namespace).
pub const QUEUE: u16 = 7870;

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct HostStats {
    /// Packets to the host, and from it, that the rules saw.
    pub to_host: u64,
    pub from_host: u64,
    /// Of those, dropped (by a rule, a state mismatch, a limit...).
    pub dropped: u64,
    /// Answers sent for blocked host traffic (`block return`).
    pub answers: u64,
    /// Answers that could not be sent.
    pub answer_errors: u64,
}

impl HostStats {
    pub fn add(&mut self, o: &HostStats) {
        self.to_host += o.to_host;
        self.from_host += o.from_host;
        self.dropped += o.dropped;
        self.answers += o.answers;
        self.answer_errors += o.answer_errors;
    }
}

/// Applies to `frame` what the engine's last one-packet batch `b` asks of it: translation,
/// `modulate state`'s sequence numbers, scrub.
fn rewrite(frame: &mut [u8], b: &xpf_engine::Batch) {
    if b.translated & 1 != 0 {
        xpf_wire::translate::apply(frame, &b.rewrites[0]);
    }
    if b.patched & 1 != 0 {
        let (a, s) = b.patches[0];
        xpf_engine::proto::apply_modulation(frame, a, s);
    }
    if b.scrubbed & 1 != 0 {
        xpf_engine::proto::apply_scrub(frame, &b.scrubs[0]);
    }
}

/// Fragments waiting for their datagram's verdict, at most (NFQUEUE's own queue holds 1,024
/// packets by default).
const PENDING_MAX: usize = 512;

/// A datagram's fragments: source, destination, identification.
type FragKey = ([u8; 16], [u8; 16], u32);

pub struct HostPath {
    q: NfQueue,
    /// Queued fragments whose datagram is not complete: (packet id, when it came), by datagram.
    pending: std::collections::HashMap<FragKey, Vec<(u32, u32)>>,
    pending_n: usize,
    /// Where answers to blocked host traffic go.
    raw: RawOut,
    frame: Vec<u8>,
    verdicts: Vec<(u32, bool, Option<Vec<u8>>)>,
    /// The host's own packets a state's `reply-to` (or an `out` rule's `route-to`) sends to
    /// its next hop: taken from the kernel, with their target's number, as Ethernet frames
    /// whose link addresses the caller writes ([`HostPath::take_routed`]).
    routed: Vec<(u16, Vec<u8>)>,
    pub stats: HostStats,
}

fn raw_socket(family: i32) -> std::io::Result<i32> {
    // SAFETY: plain socket(2) and setsockopt on it; the fd is owned by the HostPath.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mark = HostRules::MARK;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_MARK, &mark as *const u32 as *const libc::c_void, 4) < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

impl HostPath {
    pub fn open() -> std::io::Result<HostPath> {
        let q = NfQueue::open(QUEUE)?;
        let raw = RawOut::open()?;
        Ok(HostPath {
            q,
            pending: Default::default(),
            pending_n: 0,
            raw,
            frame: Vec::with_capacity(0x10000 + 14),
            verdicts: Vec::new(),
            routed: Vec::new(),
            stats: HostStats::default(),
        })
    }

    pub fn fd(&self) -> i32 {
        self.q.fd()
    }

    /// Filters what the kernel queued since the last call and gives it the verdicts.
    /// Returns the packets handled.
    pub fn poll<P: Policy>(&mut self, w: &mut Worker<P>, now: u32, pflog: Option<&crate::pflog::Tx>) -> usize {
        let HostPath { q, frame, verdicts, stats, pending, pending_n, routed, .. } = self;
        // `block return` answers, gathered packet by packet (each call of the engine returns
        // its own) and sent once the kernel has its verdicts.
        let mut answers = Vec::new();
        let r = q.recv(|p| {
            let (dir, ifidx) = match p.hook {
                HOOK_INPUT => (Dir::In, p.indev),
                HOOK_OUTPUT => (Dir::Out, p.outdev),
                _ => (Dir::In, p.indev),
            };
            if dir == Dir::In {
                stats.to_host += 1;
            } else {
                stats.from_host += 1;
            }
            // The engine reads Ethernet frames: a blank link header in front of the packet.
            let ethertype: u16 = if p.packet.first().is_some_and(|b| b >> 4 == 6) { 0x86dd } else { 0x0800 };
            frame.clear();
            frame.extend_from_slice(&[0; 12]);
            frame.extend_from_slice(&ethertype.to_be_bytes());
            frame.extend_from_slice(p.packet);
            let mut v = [Verdict::Pass];
            let b = w.process(&[&frame[..]], ifidx as u16, dir, now, &mut v);
            let logged = b.logged;
            answers.append(&mut b.returns);
            if let (Some(tx), 1) = (pflog, logged & 1) {
                crate::pflog::log_frames(tx, w, &[&frame[..]], ifidx, 1);
            }
            // A fragment (IPv6 at INPUT: see the module's note): its verdict waits for its
            // datagram's, which every fragment then gets.
            let mut pd = xpf_wire::PDesc::default();
            // Only a held fragment, or a packet while fragments wait, needs its datagram's key:
            // other host packets are not parsed a second time.
            let maybe_frag = matches!(v[0], Verdict::Held) || !pending.is_empty();
            let frag = (maybe_frag
                && xpf_wire::parse_ether(frame, &mut pd).is_ok()
                && pd.flags & xpf_wire::pdesc::pdf::FRAGMENT != 0)
                .then_some((pd.src.0, pd.dst.0, pd.frag_id));
            let b = w.batch_mut();
            let complete = !b.released.is_empty();
            if let (Some(k), Verdict::Held, false) = (frag, v[0], complete) {
                if *pending_n < PENDING_MAX {
                    pending.entry(k).or_default().push((p.id, now));
                    *pending_n += 1;
                } else {
                    stats.dropped += 1;
                    verdicts.push((p.id, false, None));
                }
                return;
            }
            let accept = match v[0] {
                Verdict::Pass | Verdict::Host => true,
                // The last fragment of a datagram that passed.
                Verdict::Held => complete,
                Verdict::Drop(_) => false,
            };
            if let Some(held) = frag.and_then(|k| pending.remove(&k)) {
                *pending_n -= held.len();
                if !accept {
                    stats.dropped += held.len() as u64;
                }
                verdicts.extend(held.into_iter().map(|(id, _)| (id, accept, None)));
            }
            let rewritten = (accept && (b.patched | b.scrubbed | b.translated) & 1 != 0).then(|| {
                // A translated packet of the host's (its own connection through `nat-to`, a
                // `rdr-to` to one of its ports): the kernel takes it rewritten (and routes
                // an outgoing one again).
                rewrite(frame, b);
                frame[14..].to_vec()
            });
            if !accept {
                stats.dropped += 1;
            }
            // synproxy: the packet goes on as another segment (the SYN to the local server,
            // the ACK to the client).
            let rewritten = match b.substitutes.pop() {
                Some((_, b)) => Some(b[14..].to_vec()),
                None => rewritten,
            };
            let rt = b.routes[0];
            if accept && dir == Dir::Out && rt != 0 {
                // Its next hop is a rule's: it leaves by xpfd, filtered leaving by the target's
                // interface when the kernel chose another (pf_route), the kernel's copy dropped.
                let mut f = vec![0u8; 14];
                f[12..14].copy_from_slice(&ethertype.to_be_bytes());
                f.extend_from_slice(rewritten.as_deref().unwrap_or(&frame[14..]));
                let to = w.policy.route(rt).map_or(0, |t| t.ifidx);
                let ok = to == 0 || to as u32 == ifidx || {
                    let mut v = [Verdict::Pass];
                    w.process(&[&f[..]], to, Dir::Out, now, &mut v);
                    rewrite(&mut f, w.batch());
                    v[0] == Verdict::Pass
                };
                if ok {
                    routed.push((rt, f));
                } else {
                    stats.dropped += 1;
                }
                verdicts.push((p.id, false, None));
                return;
            }
            verdicts.push((p.id, accept, rewritten));
        });
        // Fragments whose datagram did not come whole in time: dropped, as the engine drops
        // what it held of them.
        let timeout = w.frags.as_ref().map_or(0, |f| f.timeout);
        if !self.pending.is_empty() {
            let stats = &mut self.stats;
            let verdicts = &mut self.verdicts;
            let mut gone = 0;
            self.pending.retain(|_, ids| {
                if ids.first().is_some_and(|&(_, t)| now.saturating_sub(t) > timeout) {
                    gone += ids.len();
                    stats.dropped += ids.len() as u64;
                    verdicts.extend(ids.drain(..).map(|(id, _)| (id, false, None)));
                    false
                } else {
                    true
                }
            });
            self.pending_n -= gone;
        }
        let HostPath { q, verdicts, .. } = self;
        let n = verdicts.len();
        for (id, accept, payload) in verdicts.drain(..) {
            q.verdict(id, accept, payload.as_deref());
        }
        if let Err(e) = q.flush().and(r.map(|_| ())) {
            log::warn!("host traffic queue: {e}");
        }
        for (_, f) in answers {
            self.answer(&f[14..]);
            w.recycle(f);
        }
        n
    }

    /// The host's packets [`HostPath::poll`] took for their rules' next hops since the last
    /// call, each with its target's number.
    pub fn take_routed(&mut self) -> Vec<(u16, Vec<u8>)> {
        std::mem::take(&mut self.routed)
    }

    /// Sends an answer (an IP packet) into the kernel, which routes it to its destination.
    fn answer(&mut self, ip: &[u8]) {
        if self.raw.send(ip) {
            self.stats.answers += 1;
        } else {
            self.stats.answer_errors += 1;
        }
    }
}

/// Raw IPv4 and IPv6 sockets (header included) marked with HostRules::MARK, which the
/// `xpfd-out` chain lets by: IP packets xpfd made or already filtered go into the kernel
/// through them, routed by it (to this host by loopback, which no xpfd chain queues).
pub struct RawOut {
    fds: [i32; 2],
}

impl RawOut {
    pub fn open() -> std::io::Result<RawOut> {
        let v4 = raw_socket(libc::AF_INET)?;
        match raw_socket(libc::AF_INET6) {
            Ok(v6) => Ok(RawOut { fds: [v4, v6] }),
            Err(e) => {
                // SAFETY: ours, just opened.
                unsafe { libc::close(v4) };
                Err(e)
            }
        }
    }

    /// Sends IP packet `ip` (checksums complete) to its destination; false if it could not.
    pub fn send(&self, ip: &[u8]) -> bool {
        // SAFETY (both arms): zeroed sockaddrs with family and address set, of their size.
        match ip.first().map(|b| b >> 4) {
            Some(4) if ip.len() >= 20 => {
                let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                sa.sin_family = libc::AF_INET as u16;
                sa.sin_addr.s_addr = u32::from_ne_bytes(ip[16..20].try_into().unwrap());
                send_to(self.fds[0], ip, &sa)
            }
            Some(6) if ip.len() >= 40 => {
                let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sa.sin6_family = libc::AF_INET6 as u16;
                sa.sin6_addr.s6_addr.copy_from_slice(&ip[24..40]);
                send_to(self.fds[1], ip, &sa)
            }
            _ => false,
        }
    }
}

impl Drop for RawOut {
    fn drop(&mut self) {
        for fd in self.fds {
            // SAFETY: the fds are ours.
            unsafe { libc::close(fd) };
        }
    }
}

/// sendto(2) of `data` on `fd` to socket address `sa`.
fn send_to<T>(fd: i32, data: &[u8], sa: &T) -> bool {
    // SAFETY: data and sa are live for the call, with the lengths passed.
    unsafe {
        libc::sendto(
            fd,
            data.as_ptr() as *const libc::c_void,
            data.len(),
            0,
            sa as *const T as *const libc::sockaddr,
            std::mem::size_of::<T>() as u32,
        ) >= 0
    }
}
