//! The kernel's NFQUEUE (nfnetlink_queue), the way the host's own traffic reaches the filter:
//! packets to the firewall's addresses (the INPUT hook) and from its own sockets (OUTPUT) on
//! the filtered interfaces are queued here by the rules [`HostRules`] installs, filtered by
//! xpfd, and given back with a verdict (accept or drop). The kernel keeps the packet meanwhile,
//! so nothing is re-injected; it segments GSO packets and completes partial checksums before
//! queueing them (the queue is bound without NFQA_CFG_F_GSO).
//!
//! Written here on a raw netlink socket rather than with a crate: xpfd's worker polls this
//! socket beside its AF_XDP rings, and the crates at hand (nfq 0.2) keep their descriptor
//! private, so they could only be read by a thread of their own, a hop away from the state
//! table.

use std::io;

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_IFINDEX_INDEV: u16 = 5;
const NFQA_IFINDEX_OUTDEV: u16 = 6;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NLMSG_ERROR: u16 = 2;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// netfilter's hooks (NF_INET_LOCAL_IN, NF_INET_LOCAL_OUT).
pub const HOOK_INPUT: u8 = 1;
pub const HOOK_OUTPUT: u8 = 3;
/// Packets the kernel holds for the queue at most; past that it drops them (counted by the
/// kernel in /proc/net/netfilter/nfnetlink_queue).
const QUEUE_MAXLEN: u32 = 4096;

/// One queued packet: the IP packet (no link header), where it was met, and its id for the
/// verdict.
#[derive(Debug, Clone, Copy)]
pub struct Queued<'a> {
    pub id: u32,
    /// HOOK_INPUT (to the host, arrived on `indev`) or HOOK_OUTPUT (from the host, leaving by
    /// `outdev`).
    pub hook: u8,
    pub indev: u32,
    pub outdev: u32,
    pub packet: &'a [u8],
}

pub struct NfQueue {
    fd: i32,
    queue: u16,
    buf: Vec<u8>,
    /// Verdicts waiting for [`NfQueue::flush`], as netlink messages back to back.
    out: Vec<u8>,
    seq: u32,
}

fn nlattr(b: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    b.extend_from_slice(&(len as u16).to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(data);
    while !b.len().is_multiple_of(4) {
        b.push(0);
    }
}

impl NfQueue {
    /// Binds queue `queue` in the caller's network namespace, copying whole packets.
    pub fn open(queue: u16) -> io::Result<NfQueue> {
        // SAFETY: plain socket(2); the fd is owned by the NfQueue from here on.
        let fd =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut q = NfQueue { fd, queue, buf: vec![0; 0x10000 + 4096], out: Vec::new(), seq: 0 };
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: a zeroed sockaddr_nl of the size passed.
        if unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, std::mem::size_of_val(&sa) as u32) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let bufsize: libc::c_int = 4 << 20;
        // SAFETY: setsockopt with a live int.
        unsafe {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &bufsize as *const _ as *const libc::c_void, 4);
        }
        let mut cmd = Vec::new();
        nlattr(&mut cmd, NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
        q.config(&cmd).map_err(|e| io::Error::new(e.kind(), format!("binding NFQUEUE {queue}: {e}")))?;
        let mut params = Vec::new();
        let mut p = 0xffffu32.to_be_bytes().to_vec();
        p.push(NFQNL_COPY_PACKET);
        nlattr(&mut params, NFQA_CFG_PARAMS, &p);
        nlattr(&mut params, NFQA_CFG_QUEUE_MAXLEN, &QUEUE_MAXLEN.to_be_bytes());
        q.config(&params)?;
        Ok(q)
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    fn header(&mut self, b: &mut Vec<u8>, msg: u16, flags: u16) {
        self.seq = self.seq.wrapping_add(1);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set when complete
        b.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg).to_ne_bytes());
        b.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
        b.extend_from_slice(&self.seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family unspec, version 0, the queue number (big-endian).
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.queue.to_be_bytes());
    }

    /// Sends a config message and waits for its acknowledgement.
    fn config(&mut self, attrs: &[u8]) -> io::Result<()> {
        let mut b = Vec::new();
        self.header(&mut b, NFQNL_MSG_CONFIG, libc::NLM_F_ACK as u16);
        b.extend_from_slice(attrs);
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        self.send(&b)?;
        // SAFETY: recv into our buffer, of its length.
        let n = unsafe { libc::recv(self.fd, self.buf.as_mut_ptr() as *mut libc::c_void, self.buf.len(), 0) };
        if n < 20 {
            return Err(io::Error::last_os_error());
        }
        let ty = u16::from_ne_bytes([self.buf[4], self.buf[5]]);
        let err = i32::from_ne_bytes(self.buf[16..20].try_into().unwrap());
        if ty == NLMSG_ERROR && err != 0 {
            return Err(io::Error::from_raw_os_error(-err));
        }
        Ok(())
    }

    fn send(&self, b: &[u8]) -> io::Result<()> {
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sends b to the kernel (pid 0).
        let r = unsafe {
            libc::sendto(
                self.fd,
                b.as_ptr() as *const libc::c_void,
                b.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of_val(&sa) as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives what is queued without waiting, calling `each` for every packet; returns how
    /// many there were. One recv may bring several.
    pub fn recv(&mut self, mut each: impl FnMut(Queued)) -> io::Result<usize> {
        // SAFETY: recv into our buffer, of its length.
        let n = unsafe {
            libc::recv(self.fd, self.buf.as_mut_ptr() as *mut libc::c_void, self.buf.len(), libc::MSG_DONTWAIT)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        let b = &self.buf[..n as usize];
        let mut off = 0;
        let mut count = 0;
        while off + 20 <= b.len() {
            let len = u32::from_ne_bytes(b[off..off + 4].try_into().unwrap()) as usize;
            if len < 20 || off + len > b.len() {
                break;
            }
            let ty = u16::from_ne_bytes([b[off + 4], b[off + 5]]);
            if ty == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
                let mut q = Queued { id: 0, hook: 0, indev: 0, outdev: 0, packet: &[] };
                let mut a = off + 20;
                while a + 4 <= off + len {
                    let alen = u16::from_ne_bytes([b[a], b[a + 1]]) as usize;
                    let aty = u16::from_ne_bytes([b[a + 2], b[a + 3]]) & 0x3fff;
                    if alen < 4 || a + alen > off + len {
                        break;
                    }
                    let v = &b[a + 4..a + alen];
                    let be32 = |v: &[u8]| v.get(..4).map_or(0, |x| u32::from_be_bytes(x.try_into().unwrap()));
                    match aty {
                        NFQA_PACKET_HDR if v.len() >= 7 => {
                            q.id = be32(v);
                            q.hook = v[6];
                        }
                        NFQA_IFINDEX_INDEV => q.indev = be32(v),
                        NFQA_IFINDEX_OUTDEV => q.outdev = be32(v),
                        NFQA_PAYLOAD => q.packet = v,
                        _ => {}
                    }
                    a += (alen + 3) & !3;
                }
                each(q);
                count += 1;
            }
            off += (len + 3) & !3;
        }
        Ok(count)
    }

    /// Queues the verdict for packet `id` (sent by [`NfQueue::flush`]); with `payload`, the
    /// packet goes on with these bytes instead (same length: `modulate state`'s rewrite).
    pub fn verdict(&mut self, id: u32, accept: bool, payload: Option<&[u8]>) {
        let mut b = std::mem::take(&mut self.out);
        let start = b.len();
        self.header(&mut b, NFQNL_MSG_VERDICT, 0);
        let mut vh = (if accept { NF_ACCEPT } else { NF_DROP }).to_be_bytes().to_vec();
        vh.extend_from_slice(&id.to_be_bytes());
        nlattr(&mut b, NFQA_VERDICT_HDR, &vh);
        if let Some(p) = payload {
            nlattr(&mut b, NFQA_PAYLOAD, p);
        }
        let len = (b.len() - start) as u32;
        b[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        self.out = b;
    }

    /// Sends the queued verdicts in one message batch.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.send(&self.out);
        self.out.clear();
        r
    }
}

impl Drop for NfQueue {
    fn drop(&mut self) {
        // SAFETY: the fd is ours; closing it unbinds the queue.
        unsafe { libc::close(self.fd) };
    }
}

/// The iptables rules that queue the host's traffic on the filtered interfaces to xpfd:
/// chains `xpfd-in` (INPUT, by input interface) and `xpfd-out` (OUTPUT, by output interface,
/// passing packets marked [`HostRules::MARK`]: xpfd's own answers), for IPv4 and IPv6. With no
/// reader on the queue the kernel drops what the rules queue: the host is closed while xpfd
/// is down (fail closed); a clean stop removes them, `HostRules::remove_stale` too.
pub struct HostRules {
    installed: bool,
}

impl HostRules {
    /// The mark on packets xpfd sends itself (answers to blocked host traffic).
    pub const MARK: u32 = 0x7870_6664;

    fn run(tool: &str, args: &[&str]) -> io::Result<()> {
        let o = std::process::Command::new(tool).arg("-w").args(args).output().map_err(|e| {
            io::Error::new(e.kind(), format!("running {tool} (filtering the host's own traffic needs iptables): {e}"))
        })?;
        if o.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("{tool} {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim())))
        }
    }

    /// Removes what an earlier xpfd left (killed before it could).
    pub fn remove_stale() {
        for tool in ["iptables", "ip6tables"] {
            let _ = Self::run(tool, &["-D", "INPUT", "-j", "xpfd-in"]);
            let _ = Self::run(tool, &["-D", "OUTPUT", "-j", "xpfd-out"]);
            let _ = Self::run(tool, &["-D", "FORWARD", "-j", "xpfd-fwd"]);
            for c in ["xpfd-in", "xpfd-out", "xpfd-fwd"] {
                let _ = Self::run(tool, &["-F", c]);
                let _ = Self::run(tool, &["-X", c]);
            }
        }
    }

    pub fn install(ifaces: &[String], queue: u16) -> io::Result<HostRules> {
        Self::remove_stale();
        let q = queue.to_string();
        let mark = format!("0x{:x}", Self::MARK);
        let mut h = HostRules { installed: true };
        let r = (|| {
            for tool in ["iptables", "ip6tables"] {
                Self::run(tool, &["-N", "xpfd-in"])?;
                Self::run(tool, &["-N", "xpfd-out"])?;
                Self::run(tool, &["-N", "xpfd-fwd"])?;
                Self::run(tool, &["-A", "xpfd-out", "-m", "mark", "--mark", &mark, "-j", "RETURN"])?;
                for i in ifaces {
                    Self::run(tool, &["-A", "xpfd-in", "-i", i, "-j", "NFQUEUE", "--queue-num", &q])?;
                    Self::run(tool, &["-A", "xpfd-out", "-o", i, "-j", "NFQUEUE", "--queue-num", &q])?;
                    // What the kernel would forward to or from a filtered interface past xpfd
                    // (an IPv4 packet over the egress MTU without DF, which the steering
                    // program leaves to the kernel for its ICMP error) is dropped: the kernel's
                    // ICMP errors (need-frag, time exceeded) come before this hook.
                    Self::run(tool, &["-A", "xpfd-fwd", "-i", i, "-j", "DROP"])?;
                    Self::run(tool, &["-A", "xpfd-fwd", "-o", i, "-j", "DROP"])?;
                }
                Self::run(tool, &["-I", "INPUT", "1", "-j", "xpfd-in"])?;
                Self::run(tool, &["-I", "OUTPUT", "1", "-j", "xpfd-out"])?;
                Self::run(tool, &["-I", "FORWARD", "1", "-j", "xpfd-fwd"])?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            h.remove();
            return Err(e);
        }
        Ok(h)
    }

    /// `xpfctl --steer off` (maintenance, the lab's kernel runs): the kernel forwards by its
    /// own rules, so the guard that drops what it would forward past xpfd comes off; `on`
    /// puts it back.
    pub fn forward_guard(on: bool) -> io::Result<()> {
        for tool in ["iptables", "ip6tables"] {
            let _ = Self::run(tool, &["-D", "FORWARD", "-j", "xpfd-fwd"]);
            if on {
                Self::run(tool, &["-I", "FORWARD", "1", "-j", "xpfd-fwd"])?;
            }
        }
        Ok(())
    }

    pub fn remove(&mut self) {
        if std::mem::take(&mut self.installed) {
            Self::remove_stale();
        }
    }
}

impl Drop for HostRules {
    fn drop(&mut self) {
        self.remove();
    }
}
