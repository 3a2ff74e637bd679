//! `xpf-bench lab`: xpfd and the Linux kernel (nftables + conntrack) forwarding the same
//! traffic, in the same run, point by point.
//!
//! ```text
//! netns xl-gen [g0] --veth-- [f0] netns xl-fw [f1] --veth-- [s0] netns xl-sink
//!  XDP generator (CPU0)       firewall work on CPU1          XDP drop + counter
//! ```
//! The generator is an XDP program run by BPF_PROG_TEST_RUN in live-frames mode (XDP_TX out of
//! g0), stepping N/2 flows of 60-byte UDP frames from 198.18.0.0/15 to 198.19.0.0/16. In the
//! firewall namespace the kernel's forwarding is set up once (routes, a permanent neighbour
//! for the sink, nftables forward chain with `ct state established,related accept; ct state
//! new accept`), and xpfd runs throughout with `pass all` keep-state rules. Three setups are
//! measured in turn for every run of every point: (a) xpfd (steering on), (b) the kernel
//! (xpfd's steering off: the same packets take the kernel's forward path and conntrack), (c)
//! xpfd with `pass all no state` (its I/O ceiling: everything but the state table), (d) the
//! kernel forwarding with the nftables table deleted (its own ceiling: no conntrack hooks). A
//! forwarded flow makes two pf states (in and out) and one conntrack entry, so N states means
//! N/2 flows, as in pf's own counting (4,900 flows -> 9,800 states).
//!
//! The figure is what reaches the sink, per second, over `seconds` after one second of
//! settling. Each firewall's cost per packet is set against its own ceiling: for the kernel
//! 1/pps(b) - 1/pps(d); for xpfd the worker clocks its time in the engine per packet, since
//! the difference of two AF_XDP-bound rates is mostly noise. Global sysctls (nf_conntrack_max, the conntrack hash size) are restored at the
//! end, and the namespaces deleted, also on Ctrl-C.

use crate::stats::{self, Summary};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use xpf_xdp::bpf::{objects, Kind, Program, TEST_XDP_LIVE_FRAMES};
use xpf_xdp::netlink;

mod rules;
mod shaper;

const NS: [&str; 3] = ["xl-gen", "xl-fw", "xl-sink"];
const SOCK: &str = "/run/xpf-lab.sock";
/// The generator's pace while flows enter xpfd's fast path: under what xpfd's own path
/// takes (~120,000 packets/s here), so that each packet reaches it.
const FAST_WARM_PPS: f64 = 80_000.0;
const GEN_CPU: usize = 0;
const FW_CPU: usize = 1;

static STOP: AtomicBool = AtomicBool::new(false);
/// xpfd's pid, for the panic hook: the build aborts on panic, so no destructor runs then.
static XPFD_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// On a panic: stop xpfd and delete the namespaces before the process aborts.
fn cleanup_on_panic() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let pid = XPFD_PID.load(Ordering::Relaxed);
        if pid > 0 {
            // SAFETY: signalling the child we started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            std::thread::sleep(Duration::from_millis(500));
        }
        for n in NS {
            let _ = Command::new("ip").args(["netns", "del", n]).stderr(Stdio::null()).status();
        }
        prev(info);
    }));
}

extern "C" fn on_int(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub struct LabOpts {
    pub points: Vec<u64>,
    pub runs: usize,
    pub seconds: f64,
    pub out: PathBuf,
    pub bin: PathBuf,
    pub json: bool,
    pub busy_poll: bool,
    /// xpfd started with --no-xdp-tx.
    pub no_xdp_tx: bool,
    /// xpfd started with --worker-rt MODE (auto, off, a priority).
    pub worker_rt: Option<String>,
    /// Each measurement's CPU split per core, printed (/proc/stat, /proc/softirqs).
    pub cpu: bool,
    /// The sink's NAPI as a thread on the generator's core (SCHED_FIFO, ahead of the
    /// generator) instead of a softirq on the firewall core.
    pub sink_thread: bool,
    pub fastpath: bool,
    /// Both firewalls translate the flows' sources to the firewall's address on f1, with the
    /// same source ports: xpfd with `match out on f1 nat-to 10.10.2.1 port 1024:65535`, the
    /// kernel with nftables `snat to 10.10.2.1`.
    pub nat: bool,
    /// xpfd's keep-state rule logs every packet of its states (`pass log (all) all`) to a
    /// pflog file: the cost of logging on a busy rule.
    pub log: bool,
    /// New connections/s through campus rulesets of these sizes instead of the state points
    /// (lab/rules.rs).
    pub rules: Vec<usize>,
    /// The shaper lab with this many member queues instead (lab/shaper.rs); 0: not.
    pub shaper: u32,
    /// The flows are TCP connections (gen.c's TCP flows: a handshake answered by sink.c,
    /// then 6-byte segments) instead of UDP.
    pub tcp: bool,
}

/// gen.c's modes (`gen_cfg.proto`; bpf/lab.h): UDP flows, a SYN flood, the TCP flows'
/// handshakes and their data.
const GEN_UDP: u32 = 17;
const GEN_SYN_FLOOD: u32 = 6;
const GEN_TCP_OPEN: u32 = 1;
const GEN_TCP_DATA: u32 = 2;

fn sh(args: &[&str]) -> Result<String, String> {
    let o = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if !o.status.success() {
        return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn ns(n: &str, args: &[&str]) -> Result<String, String> {
    let mut v = vec!["ip", "netns", "exec", n];
    v.extend_from_slice(args);
    sh(&v)
}

/// Runs `f` on a thread that has entered network namespace `name`.
fn in_ns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: setns on this thread only, with a namespace file we opened.
        if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| "namespace thread panicked".to_string())?
}

/// What the lab changed outside its namespaces, to put back.
struct Restore {
    sysctls: Vec<(String, String)>,
    xpfd: Option<Child>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(mut c) = self.xpfd.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for (k, v) in self.sysctls.drain(..) {
            let _ = std::fs::write(&k, &v);
        }
        if std::env::var_os("XPF_LAB_KEEP").is_none() {
            for n in NS {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
        let _ = std::fs::remove_file(SOCK);
    }
}

fn set_global(r: &mut Restore, path: &str, v: &str) -> Result<(), String> {
    let old = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    r.sysctls.push((path.to_string(), old.trim().to_string()));
    std::fs::write(path, v).map_err(|e| format!("{path} = {v}: {e}"))
}

fn mac(n: &str, dev: &str) -> Result<[u8; 6], String> {
    let dev = dev.to_string();
    in_ns(n, move || netlink::mac(&dev))?.map_err(|e| e.to_string())
}

/// The generator's configuration (gen.c's `struct gen_cfg`): the six u32s of the flows, the
/// MACs, the protocol (17 UDP flows, 6 a SYN flood) and the destination port.
fn gen_config(prog: &Program, flows: [u32; 6], dmac: [u8; 6], smac: [u8; 6], proto: u32, dport: u32) {
    let mut cfg = Vec::new();
    for v in flows {
        cfg.extend_from_slice(&v.to_ne_bytes());
    }
    cfg.extend_from_slice(&dmac);
    cfg.extend_from_slice(&smac);
    cfg.extend_from_slice(&proto.to_ne_bytes());
    cfg.extend_from_slice(&dport.to_ne_bytes());
    prog.map("gen_cfg").update(&0u32.to_ne_bytes(), &cfg).expect("gen config");
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s.split(':').map(|x| u8::from_str_radix(x, 16).ok()).collect::<Option<_>>()?;
    v.try_into().ok()
}

/// A SYN flood out of `dev` in namespace `netns` towards `dst`:`port` through the next hop
/// `dmac`, every packet from a new source in 198.18.0.0/15 (gen.c, proto 6), at the
/// generator's full rate for `secs` seconds from one pinned core (GEN_CPU). Returns the SYNs
/// sent and the seconds it took.
pub fn syn_flood(
    netns: &str,
    dev: &str,
    dmac: [u8; 6],
    dst: std::net::Ipv4Addr,
    port: u16,
    secs: f64,
) -> Result<(u64, f64), String> {
    let prog = Program::load("xpf_gen", objects::GEN).map_err(|e| e.to_string())?;
    let d = dev.to_string();
    let ifindex = in_ns(netns, move || netlink::ifindex(&d))?.map_err(|e| e.to_string())?;
    let smac = mac(netns, dev)?;
    gen_config(&prog, [0xc612_0000u32, u32::from(dst), 1 << 17, 1, 1, 1024], dmac, smac, GEN_SYN_FLOOD, port as u32);
    let fd = prog.fd.try_clone().map_err(|e| e.to_string())?;
    let frame = frame(dmac, smac);
    let d = Duration::from_secs_f64(secs);
    let t = Instant::now();
    in_ns(netns, move || {
        crate::sys::pin(GEN_CPU);
        let p = Program { name: "xpf_gen".into(), fd, maps: Vec::new(), verified: String::new() };
        send_for(&p, &frame, ifindex, d, false)
    })??;
    let secs = t.elapsed().as_secs_f64();
    Ok((prog.map("gen_count").percpu_sum(0).unwrap_or(0), secs))
}

/// Runs the generator `p` for `d` on the calling thread (pinned by the caller): at the pace
/// gen.c keeps when `paced` (runs of 2M frames: ~0.3 s each at the shaper lab's paces), else
/// at full rate.
///
/// A BPF_PROG_TEST_RUN in live-frame mode of a program attached nowhere puts it into the XDP
/// dispatcher and takes it out again, each a `synchronize_rcu` (~14 ms here) in which nothing
/// is sent ([`hold_in_dispatcher`] now keeps the generator's there). Runs of 65,536 frames
/// left the generator asleep 55% of the time (its thread in `synchronize_rcu_normal`, both
/// cores ~55% idle in every setup), so each full-rate run after the first is sized to last
/// what remains of `d`, from the rate so far.
fn send_for(p: &Program, frame: &[u8], ifindex: u32, d: Duration, paced: bool) -> Result<(), String> {
    let t = Instant::now();
    let (mut sent, mut repeat) = (0u64, if paced { 1u32 << 21 } else { 1 << 16 });
    while t.elapsed() < d && !STOP.load(Ordering::Relaxed) {
        p.test_run(frame, ifindex, repeat, 64, TEST_XDP_LIVE_FRAMES).map_err(|e| format!("generator: {e}"))?;
        sent += repeat as u64;
        if !paced {
            let rate = sent as f64 / t.elapsed().as_secs_f64().max(1e-3);
            let left = d.saturating_sub(t.elapsed()).as_secs_f64();
            repeat = (rate * left).clamp((1 << 14) as f64, (1u64 << 25) as f64) as u32;
        }
    }
    Ok(())
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn build(r: &mut Restore, nat: bool) -> Result<(), String> {
    for n in NS {
        let _ = Command::new("ip").args(["netns", "del", n]).stderr(Stdio::null()).status();
        sh(&["ip", "netns", "add", n])?;
        ns(n, &["ip", "link", "set", "lo", "up"])?;
    }
    sh(&["ip", "link", "add", "xl-g0", "type", "veth", "peer", "name", "xl-f0"])?;
    sh(&["ip", "link", "add", "xl-f1", "type", "veth", "peer", "name", "xl-s0"])?;
    for (dev, n, name) in
        [("xl-g0", NS[0], "g0"), ("xl-f0", NS[1], "f0"), ("xl-f1", NS[1], "f1"), ("xl-s0", NS[2], "s0")]
    {
        sh(&["ip", "link", "set", dev, "netns", n, "name", name])?;
        ns(n, &["ip", "link", "set", name, "up"])?;
    }
    ns(NS[0], &["ip", "addr", "add", "10.10.1.2/24", "dev", "g0"])?;
    ns(NS[1], &["ip", "addr", "add", "10.10.1.1/24", "dev", "f0"])?;
    ns(NS[1], &["ip", "addr", "add", "10.10.2.1/24", "dev", "f1"])?;
    ns(NS[2], &["ip", "addr", "add", "10.10.2.2/24", "dev", "s0"])?;
    let s0 = mac(NS[2], "s0")?;
    let g0 = mac(NS[0], "g0")?;
    ns(NS[1], &["ip", "neigh", "replace", "10.10.2.2", "lladdr", &fmt_mac(&s0), "dev", "f1", "nud", "permanent"])?;
    ns(NS[1], &["ip", "neigh", "replace", "10.10.1.2", "lladdr", &fmt_mac(&g0), "dev", "f0", "nud", "permanent"])?;
    ns(NS[1], &["ip", "route", "add", "198.19.0.0/16", "via", "10.10.2.2"])?;
    ns(NS[1], &["ip", "route", "add", "198.18.0.0/16", "via", "10.10.1.2"])?;
    ns(
        NS[1],
        &["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.f0.rp_filter=0"],
    )?;
    // One-way flows stay "unreplied" in conntrack (30 s by default): long enough here.
    ns(NS[1], &["sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=600"])?;
    // The kernel's forwarding work on the firewall core: f0's NAPI as a thread pinned there.
    // GRO on f0 lets XDP_TX from the generator reach it while no XDP program is attached.
    ns(NS[1], &["ethtool", "-K", "f0", "gro", "on"])?;
    ns(NS[1], &["sh", "-c", "echo 1 > /sys/class/net/f0/threaded"])?;
    nft(true, nat)?;
    set_global(r, "/proc/sys/net/netfilter/nf_conntrack_max", "8388608")?;
    set_global(r, "/proc/sys/net/netfilter/nf_conntrack_buckets", "2097152")?;
    Ok(())
}

/// The kernel firewall on (nftables + conntrack) or off (plain forwarding: the kernel's own
/// ceiling). Without a rule that uses `ct`, the namespace has no conntrack hooks at all.
fn nft(on: bool, nat: bool) -> Result<(), String> {
    if !on {
        return ns(NS[1], &["nft", "delete", "table", "inet", "xpflab"]).map(|_| ());
    }
    let snat = if nat {
        " chain post {\n  type nat hook postrouting priority srcnat; policy accept;\n  oif \"f1\" snat ip to 10.10.2.1\n }\n"
    } else {
        ""
    };
    let rules = format!(
        "table inet xpflab {{\n chain forward {{\n  type filter hook forward priority 0; policy drop;\n  \
         ct state established,related accept\n  ct state new accept\n }}\n{snat}}}\n"
    );
    let f = std::env::temp_dir().join("xpf-lab.nft");
    std::fs::write(&f, rules).map_err(|e| e.to_string())?;
    ns(NS[1], &["nft", "-f", &f.to_string_lossy()]).map(|_| ())
}

struct Gen {
    prog: Program,
    frame: Vec<u8>,
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
    /// Whether gen.c paces the frames (then a run is longer).
    paced: AtomicBool,
}

fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&46u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[34..36].copy_from_slice(&2000u16.to_be_bytes());
    f[36..38].copy_from_slice(&2000u16.to_be_bytes());
    f[38..40].copy_from_slice(&26u16.to_be_bytes());
    f
}

/// Keeps generator program `prog` in the kernel's XDP dispatcher for as long as namespace
/// `netns` lives: attached natively to a veth pair of its own there (both ends down, so no
/// frame ever runs it). A live-frame test run of a program attached nowhere puts it into the
/// dispatcher and takes it out again, each change a `synchronize_rcu` (~14 ms here) under the
/// dispatcher's mutex; every other test run on the host (xpfd's transmit through XDP) waits
/// for that mutex: the worker stood in uninterruptible sleep 8-16 ms at each of the paced
/// generator's runs, three times a second, and the packets behind it waited as long.
fn hold_in_dispatcher(prog: &Program, netns: &str) -> Result<(), String> {
    ns(netns, &["ip", "link", "add", "gh0", "type", "veth", "peer", "name", "gh1"])?;
    attach_native(prog, netns, "gh0").map_err(|e| format!("holding the generator in the XDP dispatcher: {e}"))
}

/// Attaches XDP program `prog` natively to `dev` in namespace `netns`.
fn attach_native(prog: &Program, netns: &str, dev: &'static str) -> Result<(), String> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&prog.fd);
    in_ns(netns, move || netlink::xdp_attach(netlink::ifindex(dev)?, fd, netlink::XDP_FLAGS_DRV_MODE))?
        .map_err(|e| e.to_string())
}

impl Gen {
    fn new() -> Result<Gen, String> {
        let prog = Program::load("xpf_gen", objects::GEN).map_err(|e| e.to_string())?;
        hold_in_dispatcher(&prog, NS[0])?;
        let ifindex = in_ns(NS[0], || netlink::ifindex("g0"))?.map_err(|e| e.to_string())?;
        let (dmac, smac) = (mac(NS[1], "f0")?, mac(NS[0], "g0")?);
        Ok(Gen { prog, frame: frame(dmac, smac), ifindex, dmac, smac, paced: AtomicBool::new(false) })
    }

    /// Flows: `srcs` x `dsts` x `ports` (source port varies fastest), UDP.
    fn flows(&self, srcs: u32, dsts: u32, ports: u32) {
        self.mode(srcs, dsts, ports, GEN_UDP);
    }

    /// The same flows in gen.c's mode `mode` (GEN_*).
    fn mode(&self, srcs: u32, dsts: u32, ports: u32, mode: u32) {
        gen_config(
            &self.prog,
            [0xc612_0000u32, 0xc613_0000, srcs, dsts, ports, 1024],
            self.dmac,
            self.smac,
            mode,
            2000,
        );
    }

    /// Later runs send at `pps` frames per second (None: the generator's full rate).
    fn pace(&self, pps: Option<f64>) {
        let gap = pps.filter(|p| *p > 0.0).map_or(0u64, |p| (1e9 / p) as u64);
        let mut v = gap.to_ne_bytes().to_vec();
        v.extend_from_slice(&0u64.to_ne_bytes());
        self.prog.map("gen_pace").update(&0u32.to_ne_bytes(), &v).expect("gen pace");
        self.paced.store(gap != 0, Ordering::Relaxed);
    }

    /// Sends for `d` from the generator's core, as fast as the runs go or at the pace set
    /// (gen.c spaces the frames; a run then lasts ~0.1 s, so that `d` is kept).
    fn run(&self, d: Duration) -> Result<(), String> {
        let fd = self.prog.fd.try_clone().map_err(|e| e.to_string())?;
        let frame = self.frame.clone();
        let ifindex = self.ifindex;
        let paced = self.paced.load(Ordering::Relaxed);
        in_ns(NS[0], move || {
            crate::sys::pin(GEN_CPU);
            let p = Program { name: "xpf_gen".into(), fd, maps: Vec::new(), verified: String::new() };
            send_for(&p, &frame, ifindex, d, paced)
        })?
    }
}

struct Sink {
    prog: Program,
    /// `sink_src` mapped: a counter a source, by the low 16 bits of its address.
    by_src: xpf_xdp::bpf::Mapped,
}

impl Sink {
    fn new() -> Result<Sink, String> {
        let prog = Program::load("xpf_sink", objects::SINK).map_err(|e| e.to_string())?;
        attach_native(&prog, NS[2], "s0").map_err(|e| format!("attaching the sink: {e}"))?;
        let by_src = prog.map("sink_src").mmap().map_err(|e| e.to_string())?;
        Ok(Sink { prog, by_src })
    }
    fn count(&self) -> u64 {
        self.prog.map("sink_count").percpu_sum(0).unwrap_or(0)
    }
    /// The counts of sources `low..low + n` (the low 16 bits of their addresses), read
    /// from the mapped array in one pass (microseconds for 24,000: one instant).
    fn by_source(&self, low: u32, n: u32) -> Vec<u64> {
        (0..n)
            .map(|i| {
                let k = ((low + i) & 0xffff) as usize;
                // SAFETY: the mapping holds 65,536 aligned u64 counters, which the sink's
                // program adds to atomically.
                let c = unsafe { &*(self.by_src.ptr as *const std::sync::atomic::AtomicU64).add(k) };
                c.load(std::sync::atomic::Ordering::Relaxed)
            })
            .collect()
    }
}

/// The TCP flows' handshakes, answered (sink.c): `xpf_answer` at the sink's tcx ingress
/// sends the SYN/ACK, `xpf_ack` on the generator's interface the ACK. Gone with the
/// namespaces (the link with its descriptor).
fn answerers() -> Result<(Program, Program, std::os::fd::OwnedFd), String> {
    let ack = Program::load_kind("xpf_ack", objects::SINK, Kind::XDP_ACK, &[], &[]).map_err(|e| e.to_string())?;
    attach_native(&ack, NS[0], "g0").map_err(|e| format!("attaching the answerer to g0: {e}"))?;
    let syn = Program::load_kind("xpf_answer", objects::SINK, Kind::TC_ANSWER, &[], &[]).map_err(|e| e.to_string())?;
    let fd = syn.fd.try_clone().map_err(|e| e.to_string())?;
    let link = in_ns(NS[2], move || {
        let p = Program { name: "xpf_answer".into(), fd, maps: Vec::new(), verified: String::new() };
        xpf_xdp::bpf::tcx_ingress(&p, netlink::ifindex("s0")?)
    })?
    .map_err(|e| format!("attaching the answerer to s0: {e}"))?;
    Ok((ack, syn, link))
}

/// The TCP connections in conntrack past their SYN (SYN_RECV or ESTABLISHED: the first
/// data segment completes a handshake whose last ACK was lost).
fn kernel_opened() -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", NS[1], "conntrack", "-L", "-p", "tcp"])
        .stderr(Stdio::null())
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.contains(" SYN_SENT ")).count() as u64)
        .unwrap_or(0)
}

/// SYNs of the TCP flows per second while they open: what both firewalls take with little
/// loss (a SYN, its SYN/ACK and the ACK each; at 100,000/s xpfd's userspace path, which
/// opens them, missed 2.6% of a million in three passes).
const OPEN_PPS: f64 = 50_000.0;

/// Opens the TCP flows (`flows` of them) through the firewall that `--steer` selects (xpfd
/// when `xpf`): each flow's SYN once a pass, paced, up to four passes until it holds
/// `want` (xpfd: 2 states a connection; the kernel: entries past their SYN). Each SYN once:
/// a SYN repeated into an established connection makes conntrack take the connection as
/// reopened. Returns what it holds.
fn open_tcp(bin: &Path, g: &Gen, xpf: bool, flows: u64, want: u64) -> Result<u64, String> {
    g.pace(Some(OPEN_PPS));
    let pass = Duration::from_secs_f64(flows as f64 / OPEN_PPS);
    let mut have = 0;
    for _ in 0..4 {
        g.run(pass)?;
        std::thread::sleep(Duration::from_millis(200));
        have = if xpf {
            let info: serde_json::Value = info_json(bin)?;
            info["states"].as_u64().unwrap_or(0)
        } else {
            kernel_opened()
        };
        if have >= want || STOP.load(Ordering::Relaxed) {
            break;
        }
    }
    g.pace(None);
    Ok(have)
}

/// Flow directions in xpfd's fast-path tables.
fn fast_flows(bin: &Path) -> Result<u64, String> {
    let info: serde_json::Value = info_json(bin)?;
    Ok(info["forwarding"]["fast"]["flows"].as_u64().unwrap_or(0))
}

/// Waits (up to 10 s) until xpfd has probed each of `ifs` able to take the fast path's
/// redirected frames.
fn wait_egresses(bin: &Path, ifs: &[&str]) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let info: serde_json::Value = info_json(bin)?;
        let unable: Vec<&str> = ifs
            .iter()
            .copied()
            .filter(|i| {
                !info["steering"].as_array().is_some_and(|a| {
                    a.iter().any(|s| s["interface"] == *i && s["fast_path_out"].as_bool() == Some(true))
                })
            })
            .collect();
        if unable.is_empty() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "xpfd finds {} unable to take redirected frames after 10 s: the fast path would carry nothing",
                unable.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Measures what reaches the sink per second while the generator sends for `settle +
/// seconds`, counting over the last `seconds`.
fn measure(g: &Gen, s: &Sink, secs: f64) -> Result<f64, String> {
    let settle = Duration::from_millis(700);
    let total = settle + Duration::from_secs_f64(secs);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(settle);
            let trace = CPU_SPLIT.load(Ordering::Relaxed);
            let c0 = if trace { cpu_sample() } else { Vec::new() };
            let a = (Instant::now(), s.count());
            std::thread::sleep(Duration::from_secs_f64(secs));
            let b = (Instant::now(), s.count());
            let pps = (b.1 - a.1) as f64 / b.0.duration_since(a.0).as_secs_f64();
            if trace {
                let c1 = cpu_sample();
                let mut line = format!("  cpu: {pps:>10.0}/s");
                for (x, y) in c0.iter().zip(&c1) {
                    let d: Vec<u64> = (0..x.len()).map(|i| y[i].saturating_sub(x[i])).collect();
                    let all: u64 = d[..8].iter().sum::<u64>().max(1);
                    let pc = |v: u64| 100 * v / all;
                    line += &format!(
                        " | usr {}% sys {}% softirq {}% idle {}% steal {}%, NET_RX {}",
                        pc(d[0] + d[1]),
                        pc(d[2]),
                        pc(d[6]),
                        pc(d[3]),
                        pc(d[7]),
                        d[8]
                    );
                }
                println!("{line}");
            }
            let _ = tx.send(pps);
        });
        g.run(total)
    })?;
    rx.recv().map_err(|_| "measuring thread".to_string())
}

/// `--cpu`: each measurement prints its CPU split.
static CPU_SPLIT: AtomicBool = AtomicBool::new(false);

/// Per CPU: /proc/stat's first eight columns and NET_RX from /proc/softirqs (`--cpu`).
fn cpu_sample() -> Vec<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let soft = std::fs::read_to_string("/proc/softirqs").unwrap_or_default();
    let netrx: Vec<u64> = soft
        .lines()
        .find(|l| l.trim_start().starts_with("NET_RX:"))
        .map(|l| l.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .enumerate()
        .map(|(i, l)| {
            let mut v: Vec<u64> = l.split_whitespace().skip(1).take(8).filter_map(|x| x.parse().ok()).collect();
            v.push(netrx.get(i).copied().unwrap_or(0));
            v
        })
        .collect()
}

/// xpfd's own clock of its filter: (packets through the engine, ns spent in it), and the
/// steering programs' packets forwarded on the fast path and redirected to xpfd.
fn filter_clock(bin: &Path) -> Result<[u64; 4], String> {
    let v: serde_json::Value = info_json(bin)?;
    let f = &v["forwarding"];
    let steer = |k: &str| -> u64 {
        v["steering"].as_array().map_or(0, |a| a.iter().filter_map(|s| s["counters"][k].as_u64()).sum())
    };
    Ok([
        f["filtered"].as_u64().unwrap_or(0),
        f["filter_ns"].as_u64().unwrap_or(0),
        steer("fast_path"),
        steer("to_xpfd"),
    ])
}

/// `measure` for xpfd, also returning the worker's filter time per packet over the run and
/// the share of the steered packets that the fast path forwarded.
fn measure_xpf(bin: &Path, g: &Gen, s: &Sink, secs: f64) -> Result<(f64, f64, f64), String> {
    let a = filter_clock(bin)?;
    let pps = measure(g, s, secs)?;
    let b = filter_clock(bin)?;
    let d: Vec<u64> = (0..4).map(|i| b[i].saturating_sub(a[i])).collect();
    let ns = if d[0] > 0 { d[1] as f64 / d[0] as f64 } else { f64::NAN };
    let fast = if d[2] + d[3] > 0 { d[2] as f64 / (d[2] + d[3]) as f64 } else { 0.0 };
    Ok((pps, ns, fast))
}

/// `xpfctl -s info --json`, parsed.
fn info_json(bin: &Path) -> Result<serde_json::Value, String> {
    serde_json::from_str(&xpfctl(bin, &["-s", "info", "--json"])?).map_err(|e| e.to_string())
}

fn xpfctl(bin: &Path, args: &[&str]) -> Result<String, String> {
    let mut v = vec![bin.join("xpfctl").to_string_lossy().into_owned(), "--socket".into(), SOCK.into()];
    v.extend(args.iter().map(|s| s.to_string()));
    let r: Vec<&str> = v.iter().map(String::as_str).collect();
    sh(&r)
}

fn conf(keep: bool, limit: u64, nat: bool, log: bool) -> String {
    format!(
        "set limit states {limit}\nset timeout {{ udp.first 600, udp.single 600, udp.multiple 600 }}\npass {}all{}\n{}",
        if keep && log { "log (all) " } else { "" },
        if keep { "" } else { " no state" },
        // The kernel's snat range without a port spec: 1024-65535 (pf's default is 50001:65535).
        if keep && nat { "match out on f1 inet nat-to 10.10.2.1 port 1024:65535\n" } else { "" }
    )
}

fn split(flows: u64) -> (u32, u32) {
    // srcs x dsts = flows, dsts a power of two up to 256 (pkt-gen style ranges).
    let mut d = 1u64;
    while d < 256 && flows.is_multiple_of(d * 2) {
        d *= 2;
    }
    ((flows / d) as u32, d as u32)
}

#[derive(serde::Serialize)]
struct Point {
    states: u64,
    flows: u64,
    xpf: Summary,
    kernel: Summary,
    ceiling: Summary,
    kernel_ceiling: Summary,
    ratio: f64,
    /// The worker's time in the engine per packet it filtered (`in` + `out`, rules + states);
    /// None when no packet reached it (all on the fast path).
    xpf_filter_ns: Option<Summary>,
    /// The same with `no state`: the ruleset alone (not measured with the fast path).
    xpf_rules_ns: Option<Summary>,
    /// xpf's cost per packet measured as the kernel's is: 1/xpf - 1/xpf-bare (the bare XDP
    /// forwarder), end to end; like for like with `kernel_ns`. Noise can make it negative.
    xpf_ns: f64,
    /// 1/kernel - 1/kern-bare: the kernel firewall's cost per packet over plain forwarding.
    kernel_ns: f64,
    xpf_of_ceiling: f64,
    /// The share of xpfd's packets that its fast path forwarded (the lowest run's).
    xpf_fast_share: f64,
    xpf_states: u64,
    kernel_entries: u64,
}

/// The uncertainty of 1/fw - 1/bare in ns from the runs' spread (packets/s): the spread of
/// 1/x is stddev(x) / x^2, the two added in quadrature.
fn cost_noise_ns(fw: &Summary, bare: &Summary) -> f64 {
    let one = |s: &Summary| if s.median > 0.0 { 1e9 * s.stddev / (s.median * s.median) } else { 0.0 };
    one(fw).hypot(one(bare))
}

pub fn run(o: &LabOpts) -> Result<(), String> {
    // SAFETY: a handler that only sets an atomic flag.
    unsafe { libc::signal(libc::SIGINT, on_int as *const () as libc::sighandler_t) };
    if unsafe { libc::geteuid() } != 0 {
        return Err("the lab builds network namespaces: run it as root".into());
    }
    // One lab at a time: a second one would tear down the first one's namespaces.
    let lock = std::fs::File::create("/run/xpf-lab.lock").map_err(|e| format!("/run/xpf-lab.lock: {e}"))?;
    // SAFETY: flock on a file we hold open; released when `lock` is dropped at the end.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err("another xpf-bench lab is running (it holds /run/xpf-lab.lock)".into());
    }
    cleanup_on_panic();
    let mut r = Restore { sysctls: Vec::new(), xpfd: None };
    build(&mut r, o.nat)?;
    let maxp = *o.points.iter().max().unwrap_or(&9800);
    // Room for the new-flows measurement too: 2 states a flow for a few seconds of new flows.
    let limit = (maxp * 2 + 100_000).max(8_000_000);
    let keep = std::env::temp_dir().join("xpf-lab-keep.conf");
    let nostate = std::env::temp_dir().join("xpf-lab-nostate.conf");
    std::fs::write(&keep, conf(true, limit, o.nat, o.log)).map_err(|e| e.to_string())?;
    std::fs::write(&nostate, conf(false, limit, false, false)).map_err(|e| e.to_string())?;
    let pflog = std::env::temp_dir().join("xpf-lab-pflog");
    let _ = std::fs::remove_file(&pflog);
    let log = std::fs::File::create(std::env::temp_dir().join("xpf-lab-xpfd.log")).map_err(|e| e.to_string())?;
    let child = Command::new("ip")
        .args(["netns", "exec", NS[1]])
        .arg(o.bin.join("xpfd"))
        .args(["-f", &keep.to_string_lossy(), "-i", "f0", "-i", "f1", "--io", "xdp"])
        .args(["--cpus", &FW_CPU.to_string(), "--socket", SOCK])
        .args(if o.busy_poll { &["--busy-poll"][..] } else { &[] })
        .args(if o.no_xdp_tx { &["--no-xdp-tx"][..] } else { &[] })
        .args(o.worker_rt.iter().flat_map(|m| ["--worker-rt", m.as_str()]))
        // The fast path's tables sized for the largest point (a flow direction per state), as
        // an operator sizes them for the load: xpfd's default holds 1M, and at 2M TCP states
        // a tenth of the connections found no room (their packets went through xpfd).
        .args(if o.fastpath {
            vec!["--fastpath".to_string(), maxp.to_string()]
        } else {
            vec!["--no-fastpath".to_string()]
        })
        .args(["--pflog", &pflog.to_string_lossy()])
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting xpfd: {e}"))?;
    XPFD_PID.store(child.id() as i32, Ordering::Relaxed);
    r.xpfd = Some(child);
    let t = Instant::now();
    while xpfctl(&o.bin, &["-s", "memory"]).is_err() {
        if t.elapsed() > Duration::from_secs(60) {
            return Err("xpfd did not come up in 60 s (see /tmp/xpf-lab-xpfd.log)".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let g = Gen::new()?;
    let s = Sink::new()?;
    let _answer = o.tcp.then(answerers).transpose()?;
    // The sink's NAPI stays a softirq by default: it runs where f1 transmits, on the firewall
    // core, for both firewalls alike (the method of ../shared/reference/kernel-baseline.md),
    // and takes a share of that core that grows with the rate (`--cpu`: 15-18% for the
    // kernel, ~30% at xpfd's fast path). `--sink-thread` moves it to the generator's core as
    // a thread at SCHED_FIFO (at nice 0 beside the generator it starved and dropped in f1's
    // transmit): the firewall core then does only firewall work, but each packet the kernel
    // transmits one at a time wakes that thread across cores when it went idle, which XDP's
    // bulk transmit does once a batch (bench-results/README.md, "Where the sink runs").
    CPU_SPLIT.store(o.cpu, Ordering::Relaxed);
    if o.sink_thread {
        ns(NS[2], &["sh", "-c", "echo 1 > /sys/class/net/s0/threaded"])?;
    }
    pin_napi_threads();
    if o.fastpath {
        // The sink (and with --tcp the answerer at g0) came after xpfd: its egresses take
        // redirected frames only from its next probe on (every 2 s). Measured before that,
        // every flow stays in xpfd (a run once read 0.5x its fast path so).
        wait_egresses(&o.bin, if o.tcp { &["f0", "f1"] } else { &["f1"] })?;
    }

    if !o.rules.is_empty() {
        let done = rules::run(o, &g, &s, limit, &keep);
        drop(r);
        return done;
    }
    if o.shaper > 0 {
        let done = shaper::run(o, &g, &s, limit, &keep);
        drop(r);
        return done;
    }
    println!("xpf-bench lab: gen -- fw -- sink in network namespaces; firewall work on CPU {FW_CPU}, generator on CPU {GEN_CPU}");
    println!("firewalls: (a) xpfd, pass all keep state; (b) kernel nftables + conntrack; ceilings: (c) xpfd pass all no state,");
    println!("(d) the kernel forwarding with no nftables table (no conntrack hooks)");
    if o.nat {
        println!(
            "translation: (a) with `match out on f1 nat-to 10.10.2.1`, (b) with nftables `oif f1 snat ip to 10.10.2.1`"
        );
    }
    if o.log {
        println!("logging: (a) is `pass log (all) all`: every packet to pflog ({})", pflog.display());
    }
    if o.tcp {
        println!(
            "TCP: each flow a connection to port 2000, opened through each firewall (SYN, the sink's SYN/ACK, the ACK from \
             g0), then 6-byte segments"
        );
    }
    if o.fastpath {
        println!(
            "fast path on: (a) carries established {} flows in XDP; (c) is the steering program forwarding everything (--steer bare)",
            if o.tcp { "TCP" } else { "UDP" }
        );
    }
    println!("{} runs of {:.1} s per point, setups alternated within each run\n", o.runs, o.seconds);
    let mut points = Vec::new();
    for &n in &o.points {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let step = crate::progress::step(format!("{n} states: warm, then {} runs of each setup", o.runs));
        let flows = (n / 2).max(1);
        let (srcs, dsts) = split(flows);
        g.flows(srcs, dsts, 1);
        xpfctl(&o.bin, &["-F", "states"])?;
        let _ = ns(NS[1], &["conntrack", "-F"]);
        if o.tcp {
            // Each firewall opens every connection (the handshake through it), then carries
            // their data.
            g.mode(srcs, dsts, 1, GEN_TCP_OPEN);
            xpfctl(&o.bin, &["--steer", "on"])?;
            let x = open_tcp(&o.bin, &g, true, flows, 2 * flows)?;
            xpfctl(&o.bin, &["--steer", "off"])?;
            let k = open_tcp(&o.bin, &g, false, flows, flows)?;
            // A connection that did not open loses its segments at that firewall: more than
            // 0.1% would make the comparison unequal.
            if x * 1000 < 2 * flows * 999 || k * 1000 < flows * 999 {
                return Err(format!(
                    "{n} states: the connections did not open in four passes (xpfd {x} states of {}, the kernel {k} past SYN of {flows})",
                    2 * flows
                ));
            }
            g.mode(srcs, dsts, 1, GEN_TCP_DATA);
        }
        // Warm both tables: every flow seen by each firewall.
        let warm = Duration::from_secs_f64((flows as f64 / 250_000.0).clamp(1.0, 20.0));
        xpfctl(&o.bin, &["--steer", "on"])?;
        g.run(warm)?;
        if o.fastpath {
            // A flow enters the fast path at its 2nd packet through xpfd. At the generator's
            // full rate xpfd's path takes ~0.12M of its 5M+ packets/s, at random: after 20 s
            // of it 10% of a million flows had not had their second (measured: 89.8% of the
            // packets on the fast path at 2M states). Paced under what xpfd takes, pass after
            // pass, until every flow direction that sends is in (TCP: both, UDP: one).
            let want = if o.tcp { 2 * flows } else { flows };
            g.pace(Some(FAST_WARM_PPS));
            for _ in 0..4 {
                g.run(Duration::from_secs_f64((flows as f64 / FAST_WARM_PPS).max(0.2)))?;
                if fast_flows(&o.bin)? * 1000 >= want * 999 || STOP.load(Ordering::Relaxed) {
                    break;
                }
            }
            g.pace(None);
        }
        xpfctl(&o.bin, &["--steer", "off"])?;
        g.run(warm)?;
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut fa, mut fc, mut fs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..o.runs {
            if STOP.load(Ordering::Relaxed) {
                break;
            }
            xpfctl(&o.bin, &["--steer", "on"])?;
            let (pps, ns, fast) = measure_xpf(&o.bin, &g, &s, o.seconds)?;
            a.push(pps);
            fa.push(ns);
            fs.push(fast);
            xpfctl(&o.bin, &["--steer", "off"])?;
            b.push(measure(&g, &s, o.seconds)?);
            nft(false, o.nat)?;
            d.push(measure(&g, &s, o.seconds)?);
            nft(true, o.nat)?;
            if o.fastpath {
                // The fast path's ceiling: the steering program forwarding everything itself.
                xpfctl(&o.bin, &["--steer", "bare"])?;
                c.push(measure(&g, &s, o.seconds)?);
                xpfctl(&o.bin, &["--steer", "off"])?;
            } else {
                xpfctl(&o.bin, &["-f", &nostate.to_string_lossy()])?;
                xpfctl(&o.bin, &["--steer", "on"])?;
                let (pps, ns, _) = measure_xpf(&o.bin, &g, &s, o.seconds)?;
                c.push(pps);
                fc.push(ns);
                xpfctl(&o.bin, &["--steer", "off"])?;
                xpfctl(&o.bin, &["-f", &keep.to_string_lossy()])?;
            }
        }
        if a.is_empty() {
            break;
        }
        let info: serde_json::Value = info_json(&o.bin)?;
        let xpf_states = info["states"].as_u64().unwrap_or(0);
        let kernel_entries: u64 =
            ns(NS[1], &["cat", "/proc/sys/net/netfilter/nf_conntrack_count"])?.trim().parse().unwrap_or(0);
        let (sa, sb, sc, sd) = (Summary::of(&a), Summary::of(&b), Summary::of(&c), Summary::of(&d));
        let ns_per = |x: f64| if x > 0.0 { 1e9 / x } else { f64::INFINITY };
        let p = Point {
            states: n,
            flows,
            ratio: sa.median / sb.median,
            xpf_filter_ns: {
                let f: Vec<f64> = fa.iter().copied().filter(|x| x.is_finite()).collect();
                (!f.is_empty()).then(|| Summary::of(&f))
            },
            xpf_rules_ns: (!fc.is_empty()).then(|| Summary::of(&fc)),
            // Both measured the same way, end to end against each one's own bare forwarder.
            // (The worker's clock, xpf_filter_ns, times the engine alone: no kernel figure
            // compares with it.)
            xpf_ns: ns_per(sa.median) - ns_per(sc.median),
            kernel_ns: ns_per(sb.median) - ns_per(sd.median),
            xpf_of_ceiling: sa.median / sc.median,
            xpf_fast_share: fs.iter().copied().fold(1.0, f64::min),
            xpf: sa,
            kernel: sb,
            ceiling: sc,
            kernel_ceiling: sd,
            xpf_states,
            kernel_entries,
        };
        // A setup that forwarded nothing is a broken lab, not a figure (the kernel's runs once
        // read 0 for a whole session unnoticed: xpfd's forward guard dropped them).
        for (name, s) in [
            ("xpfd", &p.xpf),
            ("the kernel", &p.kernel),
            ("xpfd bare", &p.ceiling),
            ("the bare kernel", &p.kernel_ceiling),
        ] {
            if s.median <= 0.0 {
                return Err(format!("{n} states: {name} forwarded nothing to the sink: the lab is broken"));
            }
        }
        drop(step);
        println!("{} states ({} flows; xpf holds {}, conntrack {}):", n, flows, p.xpf_states, p.kernel_entries);
        println!("{}", stats::header("setup", "packets/s into the sink"));
        println!("{}", stats::row("xpf", &p.xpf));
        println!("{}", stats::row("kernel", &p.kernel));
        println!("{}", stats::row("xpf-bare", &p.ceiling));
        println!("{}", stats::row("kern-bare", &p.kernel_ceiling));
        let engine = match (&p.xpf_filter_ns, &p.xpf_rules_ns) {
            (Some(f), Some(r)) => {
                format!(
                    "\n  xpf's engine alone (the worker's clock, in + out): {:.0} ns, rules alone {:.0} ns",
                    f.median, r.median
                )
            }
            (Some(f), None) => format!("\n  xpf's engine alone (the worker's clock, in + out): {:.0} ns", f.median),
            _ => String::new(),
        };
        // A cost no larger than twice its uncertainty (from the runs' spread) gives no ratio:
        // a few ns over a noisy ceiling once printed "671x".
        let (xpf_noise, kernel_noise) =
            (cost_noise_ns(&p.xpf, &p.ceiling), cost_noise_ns(&p.kernel, &p.kernel_ceiling));
        let ratio = if p.xpf_ns > 2.0 * xpf_noise && p.kernel_ns > 2.0 * kernel_noise {
            format!("kernel/xpf {:.1}x", p.kernel_ns / p.xpf_ns)
        } else {
            "not above twice the runs' spread on both sides: no ratio".to_string()
        };
        let engine = if o.fastpath {
            format!(
                "{engine}\n  xpf's packets forwarded by its fast path: {:.2}% (the lowest run){}",
                100.0 * p.xpf_fast_share,
                if p.xpf_fast_share < 0.95 {
                    " -- a twentieth or more went through xpfd: the figure is not the fast path's alone"
                } else {
                    ""
                }
            )
        } else {
            engine
        };
        println!(
            "  xpf/kernel {:.2}x; xpf at {:.0}% of its ceiling, kernel at {:.0}% of its own\n  \
             firewall cost per packet over each one's bare forwarder (1/fw - 1/bare, end to end):\n  \
             xpf {:.0} ns (+/- {:.0}), kernel {:.0} ns (+/- {:.0}): {ratio}{engine}\n",
            p.ratio,
            100.0 * p.xpf_of_ceiling,
            100.0 * p.kernel.median / p.kernel_ceiling.median,
            p.xpf_ns,
            xpf_noise,
            p.kernel_ns,
            kernel_noise,
        );
        points.push(p);
    }
    // New states per second: every packet a new flow (UDP; not with --tcp).
    let mut newrate = None;
    if !STOP.load(Ordering::Relaxed) && !o.tcp {
        // With translation, to 256 destinations: towards one, both firewalls would run out of
        // the public address's ports for it (64,512) within the measurement, and the faster
        // one first.
        g.flows(64, if o.nat { 256 } else { 1 }, 60_000);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..o.runs.min(3) {
            xpfctl(&o.bin, &["-F", "states"])?;
            let _ = ns(NS[1], &["conntrack", "-F"]);
            xpfctl(&o.bin, &["--steer", "on"])?;
            a.push(measure(&g, &s, o.seconds.min(2.0))?);
            xpfctl(&o.bin, &["--steer", "off"])?;
            b.push(measure(&g, &s, o.seconds.min(2.0))?);
        }
        let (sa, sb) = (Summary::of(&a), Summary::of(&b));
        println!("new flows per second (each packet a new flow; xpf makes 2 states per flow, the kernel 1 entry):");
        println!("{}", stats::header("setup", "new flows/s forwarded"));
        println!("{}", stats::row("xpf", &sa));
        println!("{}", stats::row("kernel", &sb));
        println!("  xpf/kernel {:.2}x\n", sa.median / sb.median);
        newrate = Some((sa, sb));
    }
    xpfctl(&o.bin, &["--steer", "on"]).ok();
    if o.log {
        // What logging every packet left: records written, lost (queue full), bytes.
        let info: serde_json::Value = info_json(&o.bin)?;
        let p = &info["pflog"];
        println!(
            "pflog: {} packets logged, {} lost (queue full), {} bytes written\n",
            p["logged"], p["dropped"], p["bytes"]
        );
    }
    if !points.is_empty() {
        let series = |f: &dyn Fn(&Point) -> &Summary, title: &'static str| crate::plot::Series {
            title,
            points: points.iter().map(|p| (p.states as f64, f(p).median, f(p).min, f(p).max)).collect(),
        };
        let all = [
            series(&|p| &p.xpf, "xpf (pass keep state)"),
            series(&|p| &p.kernel, "kernel (nftables + conntrack)"),
            series(&|p| &p.ceiling, "xpf no state (I/O ceiling)"),
            series(&|p| &p.kernel_ceiling, "kernel forwarding, no firewall"),
        ];
        match crate::plot::write(
            &o.out,
            "lab",
            "pps forwarded vs number of states, one firewall core",
            "states",
            "packets/s",
            true,
            &all,
        ) {
            Ok(Ok(png)) => println!("plot: {png}"),
            Ok(Err(why)) => println!("plot: {why}"),
            Err(e) => println!("plot: {e}"),
        }
    }
    if o.json {
        let j = serde_json::json!({"points": points, "new_flows": newrate.map(|(a, b)| serde_json::json!({"xpf": a, "kernel": b}))});
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    }
    drop(r);
    if STOP.load(Ordering::Relaxed) {
        return Err("interrupted; namespaces deleted and sysctls restored".into());
    }
    Ok(())
}

/// Pins the NAPI threads of the firewall's interfaces to the firewall core.
fn pin_napi_threads() {
    let Ok(out) = sh(&["ps", "-eo", "pid=,comm="]) else { return };
    for l in out.lines() {
        let mut it = l.split_whitespace();
        let (Some(pid), Some(comm)) = (it.next(), it.next()) else { continue };
        let cpu = if comm.starts_with("napi/f0-") || comm.starts_with("napi/f1-") {
            FW_CPU
        } else if comm.starts_with("napi/s0-") {
            let _ = sh(&["chrt", "-f", "-p", "50", pid]);
            GEN_CPU
        } else {
            continue;
        };
        let _ = sh(&["taskset", "-pc", &cpu.to_string(), pid]);
    }
}

#[cfg(test)]
mod noise_tests {
    use super::*;

    fn s(median: f64, stddev: f64) -> Summary {
        Summary { n: 3, min: median - stddev, max: median + stddev, median, avg: median, stddev }
    }

    #[test]
    fn a_cost_of_a_few_ns_over_a_noisy_ceiling_is_inside_the_noise() {
        // 180k +/- 5k against 175k +/- 2.5k packets/s: 1/fw - 1/bare is -159 ns, its
        // uncertainty ~174 ns; a 3-ns difference is no figure to divide by.
        let n = cost_noise_ns(&s(180_000.0, 5_000.0), &s(175_000.0, 2_500.0));
        assert!((n - 174.0).abs() < 2.0, "{n}");
        assert_eq!(cost_noise_ns(&s(0.0, 0.0), &s(0.0, 0.0)), 0.0);
    }
}
