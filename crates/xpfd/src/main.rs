//! xpfd, the xpf daemon: filters the traffic routed between the interfaces it is given, with
//! the pf.conf it is given, on AF_XDP sockets; answers xpfctl on a Unix socket.
//!
//! ```text
//! xpfd -f /etc/xpf/pf.conf -i IF -i IF [--io xdp|packet|auto] [--workers N] [--cpus 0,1]
//!      [--socket PATH] [--busy-poll] [--no-xdp-tx] [--worker-nice N] [--worker-rt auto|off|PRIO]
//!      [--fastpath FLOWS | --no-fastpath]
//!      [-D macro=value]
//! ```
//! Workers run at nice -20 unless `--worker-nice N` says otherwise, in the real-time class
//! (SCHED_FIFO 1) while new connections overflow their ring (`--worker-rt auto`, the
//! default; `off`: never), or there always with `--worker-rt [PRIO]` (for cores given to the
//! workers; `WorkerSched`).
//! `--io packet` uses AF_PACKET rings (xpf_xdp::packet); `auto` (the default) chooses packet
//! mode when an interface is a veth, else XDP, and either when the other cannot be set up.
//! The fast path (on unless `--no-fastpath`; `--fastpath FLOWS` sizes its tables) lets the
//! steering program forward established UDP and TCP flows in the kernel (fastpath.rs),
//! towards the interfaces that take redirected frames (probed: real NICs do; a veth only
//! when its peer has an XDP program or GRO on). In XDP mode a worker's full batches leave
//! through XDP towards those interfaces too (xpf_xdp::txlane; `--no-xdp-tx`: AF_XDP only).
//! Runs in the foreground and logs to stderr. SIGHUP reloads the file; SIGINT and SIGTERM
//! stop it cleanly (the XDP programs are removed). Killed hard, it leaves the steering
//! programs attached with no socket behind them: forwarded traffic is dropped until xpfd
//! starts again (fail closed).

mod anchors;
mod control;
mod dataplane;
mod defer;
mod fastpath;
mod handoff;
mod host;
mod logging;
mod metrics;
mod pflog;
mod pflow;
mod policy;
mod retire;
mod shaping;
mod sync;

use control::{Daemon, Loaded};
use dataplane::{Cmd, Dataplane, Port};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use xpf_engine::{Worker, WorkerConfig};
use xpf_state::Seed;
use xpf_xdp::packet::{Guard, PacketPort};
use xpf_xdp::port::PortIo;
use xpf_xdp::skbpath::SkbPath;
use xpf_xdp::steer::Steer;
use xpf_xdp::{netlink, xsk::Xsk};

pub const DEFAULT_SOCKET: &str = "/run/xpfd.sock";

const USAGE: &str = "usage: xpfd -f FILE -i IF [-i IF ...] [--io xdp|packet|auto] [--workers N] [--cpus LIST] \
                     [--socket PATH] [--busy-poll] [--no-xdp-tx] [--worker-nice N] [--worker-rt auto|off|PRIO] [--fastpath FLOWS | --no-fastpath] [-D macro=value] \
                     [--pflog FILE] [--pflog-size BYTES] [--pflog-rate N] [--log-level LEVEL] [--log-format text|json] [--syslog] [--metrics ADDR:PORT] [--pflow HOST:PORT [--pflow-proto 10|5] [--pflow-src ADDR] [--pflow-active SECS]] [--sync-dev IF [--sync-peer ADDR] [--sync-key FILE] [--sync-maxupd N] [--sync-hostid ID] [--sync-defer]] | --version";

#[derive(Debug)]
struct Args {
    file: String,
    ifaces: Vec<String>,
    io: String,
    workers: Option<u32>,
    cpus: Option<Vec<usize>>,
    socket: String,
    busy: bool,
    /// XDP mode sends full batches through XDP (xpf_xdp::txlane) unless `--no-xdp-tx`.
    xdp_tx: bool,
    /// The workers' scheduling class and priority.
    worker_sched: WorkerSched,
    /// `--worker-rt auto` said in so many words (refused with `--busy-poll`).
    rt_told: bool,
    /// Fast-path flow directions the tables hold: None sized from the state limit (the
    /// default), Some(0) off (--no-fastpath).
    fastpath: Option<u32>,
    defines: Vec<(String, String)>,
    sync: Option<sync::SyncArgs>,
    /// Where `log` rules' packets go (pflog0's file; pflogN's is FILE followed by N).
    pflog: String,
    pflog_size: u64,
    /// `--pflog-rate N`: records per logging rule per second (per worker), 0 for no limit.
    pflog_rate: u32,
    /// Where Prometheus scrapes (`--metrics 127.0.0.1:9101`).
    metrics: Option<String>,
    /// Where `pflow` states' flows go (`--pflow 192.0.2.9:2055`), and how.
    pflow: Option<pflow::Config>,
    /// xpfd's own messages: the level until pf.conf's `set debug` or `xpfctl -x` says
    /// otherwise, the form on stderr, or syslog.
    log_level: log::LevelFilter,
    log_format: logging::Format,
    syslog: bool,
}

fn parse_args(a: &[String]) -> Result<Args, String> {
    let mut r = Args {
        file: String::new(),
        ifaces: Vec::new(),
        io: "auto".into(),
        workers: None,
        cpus: None,
        socket: DEFAULT_SOCKET.into(),
        busy: false,
        xdp_tx: true,
        worker_sched: WorkerSched::Auto(WORKER_NICE),
        rt_told: false,
        fastpath: None,
        defines: Vec::new(),
        sync: None,
        pflog: "/var/log/pflog".into(),
        pflog_size: 16 << 20,
        pflog_rate: 0,
        metrics: None,
        pflow: None,
        log_level: log::LevelFilter::Info,
        log_format: logging::Format::Text,
        syslog: false,
    };
    let mut flow_cfg = (None, pflow::Proto::Ipfix, None, 60u32);
    let mut sync =
        sync::SyncArgs { dev: String::new(), peer: None, key_file: None, maxupd: 128, hostid: None, defer: false };
    let mut i = 0;
    while i < a.len() {
        let flag = a[i].clone();
        let mut val = || {
            i += 1;
            a.get(i).cloned().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "-f" => r.file = val()?,
            "-i" => r.ifaces.push(val()?),
            "--io" => r.io = val()?,
            "--workers" => r.workers = Some(val()?.parse().map_err(|_| "--workers: a number".to_string())?),
            "--cpus" => {
                let v = val()?;
                r.cpus = Some(
                    v.split(',')
                        .map(|c| c.parse().map_err(|_| format!("--cpus {v}: numbers, comma-separated")))
                        .collect::<Result<_, _>>()?,
                )
            }
            "--socket" => r.socket = val()?,
            "--busy-poll" => r.busy = true,
            "--no-xdp-tx" => r.xdp_tx = false,
            "--worker-nice" => {
                let v = val()?;
                let n = v
                    .parse()
                    .ok()
                    .filter(|n| (-20..=19).contains(n))
                    .ok_or_else(|| format!("--worker-nice {v}: a nice value, -20 to 19"))?;
                // The fair class's nice, in `auto` as in `off`; the last of it and a real-time
                // priority wins.
                r.worker_sched = match r.worker_sched {
                    WorkerSched::Auto(_) => WorkerSched::Auto(n),
                    _ => WorkerSched::Nice(n),
                };
            }
            "--worker-rt" => {
                // auto (the default), off, or always at an optional priority: --worker-rt [PRIO].
                let nice = match r.worker_sched {
                    WorkerSched::Auto(n) | WorkerSched::Nice(n) => n,
                    WorkerSched::Fifo(_) => WORKER_NICE,
                };
                let mut prio = WORKER_FIFO;
                match a.get(i + 1).map(String::as_str) {
                    Some("auto") => {
                        i += 1;
                        r.worker_sched = WorkerSched::Auto(nice);
                        r.rt_told = true;
                    }
                    Some("off") => {
                        i += 1;
                        r.worker_sched = WorkerSched::Nice(nice);
                        r.rt_told = false;
                    }
                    v => {
                        if let Some(v) = v.filter(|v| !v.starts_with('-')) {
                            i += 1;
                            prio = v.parse().ok().filter(|n| (1..=99).contains(n)).ok_or_else(|| {
                                format!("--worker-rt {v}: auto, off, or a real-time priority, 1 to 99")
                            })?;
                        }
                        r.worker_sched = WorkerSched::Fifo(prio);
                    }
                }
            }
            "--fastpath" => {
                // On by default; an optional size: --fastpath [FLOWS] (flow directions).
                if let Some(n) = a.get(i + 1).and_then(|v| v.parse::<u32>().ok()) {
                    i += 1;
                    r.fastpath = Some(n.clamp(1, 1 << 24));
                }
            }
            "--no-fastpath" => r.fastpath = Some(0),
            "--pflog" => r.pflog = val()?,
            "--pflog-rate" => {
                let v = val()?;
                r.pflog_rate =
                    v.parse().map_err(|_| format!("--pflog-rate {v}: records per rule per second (0: no limit)"))?;
            }
            "--pflow" => {
                let v = val()?;
                flow_cfg.0 = Some(v.parse::<std::net::SocketAddr>().map_err(|_| {
                    format!("--pflow {v}: the collector's ADDR:PORT (192.0.2.9:2055, [2001:db8::9]:4739)")
                })?);
            }
            "--pflow-proto" => {
                let v = val()?;
                flow_cfg.1 = match v.as_str() {
                    "10" => pflow::Proto::Ipfix,
                    "5" => pflow::Proto::V5,
                    _ => return Err(format!("--pflow-proto {v}: 10 (IPFIX) or 5 (NetFlow v5)")),
                };
            }
            "--pflow-src" => {
                let v = val()?;
                flow_cfg.2 = Some(v.parse().map_err(|_| format!("--pflow-src {v}: an address"))?);
            }
            "--pflow-active" => {
                let v = val()?;
                flow_cfg.3 = v.parse().map_err(|_| format!("--pflow-active {v}: seconds (0: at a flow's end only)"))?;
            }
            "--log-level" => {
                let v = val()?;
                r.log_level = logging::level_of(&v).ok_or_else(|| {
                    format!("--log-level {v}: emerg, alert, crit, err, warning, notice, info or debug (pf's set debug)")
                })?;
            }
            "--log-format" => {
                let v = val()?;
                r.log_format = match v.as_str() {
                    "text" => logging::Format::Text,
                    "json" => logging::Format::Json,
                    _ => return Err(format!("--log-format {v}: text or json")),
                };
            }
            "--syslog" => r.syslog = true,
            "--metrics" => {
                let v = val()?;
                v.parse::<std::net::SocketAddr>()
                    .map_err(|_| format!("--metrics {v}: ADDR:PORT (127.0.0.1:9101, [::1]:9101)"))?;
                r.metrics = Some(v);
            }
            "--pflog-size" => {
                let v = val()?;
                r.pflog_size = v
                    .parse()
                    .ok()
                    .filter(|&n| n >= 4096)
                    .ok_or_else(|| format!("--pflog-size {v}: bytes, 4096 or more"))?
            }
            "-D" => {
                let d = val()?;
                let (k, v) = d.split_once('=').ok_or_else(|| format!("-D {d}: expected macro=value"))?;
                r.defines.push((k.into(), v.into()));
            }
            "--sync-dev" => sync.dev = val()?,
            "--sync-peer" => {
                let v = val()?;
                sync.peer = Some(v.parse().map_err(|_| format!("--sync-peer {v}: an IPv4 address"))?)
            }
            "--sync-key" => sync.key_file = Some(val()?),
            "--sync-defer" => sync.defer = true,
            "--sync-maxupd" => {
                let v = val()?;
                sync.maxupd = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("--sync-maxupd {v}: 1 to 255"))?
            }
            "--sync-hostid" => {
                let v = val()?;
                let x = u32::from_str_radix(v.trim_start_matches("0x"), 16).ok().filter(|&n| n != 0);
                sync.hostid = Some(x.ok_or_else(|| format!("--sync-hostid {v}: a non-zero hex number"))?)
            }
            "-h" | "--help" => return Err(USAGE.into()),
            x => return Err(format!("unknown argument '{x}'\n{USAGE}")),
        }
        i += 1;
    }
    if r.file.is_empty() || r.ifaces.is_empty() {
        return Err(format!("xpfd needs a ruleset (-f) and at least one interface (-i)\n{USAGE}"));
    }
    if r.busy && (matches!(r.worker_sched, WorkerSched::Fifo(_)) || r.rt_told) {
        // A busy-polling worker never sleeps: in the real-time class it would leave its
        // core's other work (NAPI for the other sockets, the shell) only the kernel's
        // throttled 5%.
        return Err("--worker-rt with --busy-poll: a busy-polling worker never sleeps; choose one".into());
    }
    if let (true, WorkerSched::Auto(n)) = (r.busy, r.worker_sched) {
        r.worker_sched = WorkerSched::Nice(n);
    }
    if !sync.dev.is_empty() {
        r.sync = Some(sync);
    } else if sync.peer.is_some() || sync.key_file.is_some() || sync.defer {
        return Err("--sync-peer, --sync-key and --sync-defer need --sync-dev".into());
    }
    if !matches!(r.io.as_str(), "xdp" | "auto" | "packet") {
        return Err(format!("--io {}: xdp, packet or auto", r.io));
    }
    match flow_cfg {
        (Some(collector), proto, src, active) => {
            r.pflow = Some(pflow::Config { collector, src, proto, active, domain: 0 });
        }
        (None, _, src, _) if src.is_some() => return Err("--pflow-src needs --pflow".into()),
        _ => {}
    }
    Ok(r)
}

static STOP: AtomicBool = AtomicBool::new(false);
static HUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGHUP {
        HUP.fetch_add(1, Ordering::Relaxed);
    } else {
        STOP.store(true, Ordering::Relaxed);
    }
}

/// How a worker is scheduled. A worker shares its core with the kernel's receive work (NAPI)
/// that steers frames to it. At nice 0 the scheduler gives that work half the core or more
/// under load, and the frames it steers past what the worker can take are dropped at the
/// worker's ring: work done for nothing (the lab's new flows, every packet to the worker:
/// 108,000/s at nice 0, 160,000 at -10, 195,000 at -20). At nice -20 (the default) the worker
/// still waits for the scheduler's tick once NAPI wakes it on a kernel built without
/// preemption: under a SYN flood a quarter to half of its time, while its new-connection ring
/// overflows. In the real-time class (`--worker-rt`) a wakeup takes the core at NAPI's next
/// scheduling point: the SYN flood's connections/s rise by a third, with no ring drops; but
/// every other task on that core (the end hosts' clients in `xpf-bench real`, a shell) waits
/// behind the worker, and ping through xpfd under load took 4-6 times as long. Hence an
/// option, for cores given to the workers (docs/xpfd.md, "Workers' scheduling").
#[derive(Debug, Clone, Copy, PartialEq)]
enum WorkerSched {
    /// SCHED_FIFO at this priority.
    Fifo(i32),
    /// The fair class at this nice value.
    Nice(i32),
    /// The fair class at this nice value, SCHED_FIFO [`WORKER_FIFO`] while new connections
    /// overflow their ring (dataplane.rs `RtAuto`).
    Auto(i32),
}

/// `--worker-rt`'s priority unless given: the lowest, above every fair-class task (NAPI's
/// threads, ksoftirqd), below the kernel's interrupt threads (50).
const WORKER_FIFO: i32 = 1;
/// The default: the fair class's highest priority (also where real-time is refused).
const WORKER_NICE: i32 = -20;

impl WorkerSched {
    /// Puts the calling thread in this class; where the real-time class is refused (no
    /// CAP_SYS_NICE, a container's limit), the fair class at nice -20. Returns what it got.
    fn apply(self) -> WorkerSched {
        let nice = match self {
            WorkerSched::Fifo(prio) => {
                match real_time(prio) {
                    Ok(()) => return self,
                    Err(e) => {
                        log::warn!("worker: the real-time class (SCHED_FIFO {prio}) was refused ({e}); nice {WORKER_NICE} instead");
                        WORKER_NICE
                    }
                }
            }
            WorkerSched::Nice(n) | WorkerSched::Auto(n) => n,
        };
        if let Err(e) = fair(nice) {
            log::warn!("worker priority (nice {nice}): {e}");
        }
        match self {
            WorkerSched::Auto(_) => WorkerSched::Auto(nice),
            _ => WorkerSched::Nice(nice),
        }
    }
}

/// The calling thread into SCHED_FIFO at `prio`.
pub(crate) fn real_time(prio: i32) -> std::io::Result<()> {
    let sp = libc::sched_param { sched_priority: prio };
    // SAFETY: sched_setscheduler on this thread (0) with a live sched_param.
    match unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &sp) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The calling thread into the fair class (from wherever it is) at `nice`.
pub(crate) fn fair(nice: i32) -> std::io::Result<()> {
    let sp = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on this thread (0) with a live sched_param, then
    // setpriority on this thread's id.
    unsafe {
        if libc::sched_setscheduler(0, libc::SCHED_OTHER, &sp) != 0
            || libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl std::fmt::Display for WorkerSched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerSched::Fifo(p) => write!(f, "SCHED_FIFO {p}"),
            WorkerSched::Nice(n) => write!(f, "nice {n}"),
            WorkerSched::Auto(n) => {
                write!(f, "nice {n}, SCHED_FIFO {WORKER_FIFO} while new connections overflow their ring")
            }
        }
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

type Ports = (Vec<Vec<Port>>, Vec<(String, Steer)>);

/// Packet mode's tcx program on every interface: two ifb devices each (`xpfd-rx<ifindex>` for
/// what xpfd judges, `xpfd-sy<ifindex>` for new connections; listed in `ifbs` as made, for the
/// caller to delete), the drop program at their ingress, the program at the interface's.
/// Frames it sends to xpfd before the sockets open are dropped there. `flows`: the fast path's
/// size (0: off, its tables match nothing). Returns, per interface, the devices its sockets read.
fn skb_path(ifs: &[(String, u32, u32)], flows: u32, ifbs: &mut Vec<u32>) -> Result<(SkbPath, Vec<Divert>), String> {
    let mut sp = SkbPath::load(table_sizes(flows)).map_err(|e| e.to_string())?;
    log::debug!("packet mode's program {}", sp.prog.verified);
    let mut devs = Vec::new();
    for (name, idx, _) in ifs {
        let ifb = format!("xpfd-rx{idx}");
        let rx = netlink::ifb_create(&ifb).map_err(|e| e.to_string())?;
        ifbs.push(rx);
        // New connections queue apart, as in XDP mode: a SYN flood overflows only their ring.
        let syn = match netlink::ifb_create(&format!("xpfd-sy{idx}")) {
            Ok(s) => {
                ifbs.push(s);
                Some(s)
            }
            Err(e) => {
                log::warn!("{name}: no separate queue for new connections ({e}): a SYN flood shares xpfd's ring");
                None
            }
        };
        sp.attach(*idx, rx, syn).map_err(|e| format!("{name}: {e}"))?;
        log::info!(
            "{name}: frames for xpfd come through ifb device {ifb}{}",
            if syn.is_some() { format!(", new connections through xpfd-sy{idx}") } else { String::new() }
        );
        devs.push(Divert { rx, syn });
    }
    Ok((sp, devs))
}

/// The ifb devices packet mode's sockets read for one interface.
#[derive(Clone, Copy)]
struct Divert {
    rx: u32,
    syn: Option<u32>,
}

/// The interfaces among IFS (name, driver if known) that are veth devices: where `--io auto`
/// chooses packet mode.
fn veth_names<'a>(ifs: impl Iterator<Item = (&'a str, Option<String>)>) -> Vec<&'a str> {
    ifs.filter(|(_, d)| d.as_deref() == Some("veth")).map(|(n, _)| n).collect()
}

/// The fast path's flow tables' entries for FLOWS flow directions: IPv4 at half load, IPv6 a
/// quarter of that (powers of two; one each when the fast path is off).
fn table_sizes(flows: u32) -> (u32, u32) {
    if flows == 0 {
        return (1, 1);
    }
    let v4 = (2 * flows).next_power_of_two();
    (v4, (v4 / 4).max(1))
}

/// XDP mode: a steering program per interface and an AF_XDP socket per receive queue, queue q
/// served by worker q mod workers; the programs attached last, when every socket is in place.
fn xdp_ports(a: &Args, ifs: &[(String, u32, u32)], flows: u32) -> Result<Ports, String> {
    let queues = ifs.iter().map(|i| i.2).min().unwrap_or(1);
    // One worker unless told: it serves every queue, so both directions of each flow meet its
    // state. Several workers split the queues, and the NIC's (or veth's) queue choice is not
    // symmetric: a reply on another worker's queue misses its state.
    let workers = a.workers.unwrap_or(1).clamp(1, queues);
    if workers > 1 {
        log::info!(
            "{workers} workers on {queues} queues: each frame goes to the worker that owns its flow \
             (a hash of the two addresses, the same both ways; handed off between workers)"
        );
    }
    let mut steers = Vec::new();
    let mut ports_of: Vec<Vec<Port>> = (0..workers).map(|_| Vec::new()).collect();
    let ports: u32 = ifs.iter().map(|i| i.2).sum();
    for (name, idx, nq) in ifs {
        // One program for every interface, each in its slot (one pair of flow tables: a TCP
        // flow's two directions come in on different interfaces).
        let first = steers.first().map(|s: &(String, Steer)| &s.1);
        let steer = Steer::load(table_sizes(flows), ports, first).map_err(|e| e.to_string())?;
        if first.is_none() {
            log::debug!("steering program {}", steer.prog.verified);
        }
        for q in 0..*nq {
            let w = (q % workers) as usize;
            let mut x = Xsk::open(*idx, q, if a.busy { 20 } else { 0 }).map_err(|e| format!("-i {name}: {e}"))?;
            steer.register(q, x.fd()).map_err(|e| format!("-i {name} queue {q}: {e}"))?;
            // New connections queue apart (a SYN flood then overflows only their ring).
            match x.open_syn_lane() {
                Ok(fd) => steer.register_syn_lane(q, fd).map_err(|e| format!("-i {name} queue {q}: {e}"))?,
                Err(e) => log::warn!(
                    "{name} queue {q}: no separate queue for new connections ({e}): a SYN flood shares \
                     the ring of established traffic"
                ),
            }
            log::info!("{name} queue {q}: AF_XDP {} mode, worker {w}", if x.zero_copy { "zero-copy" } else { "copy" });
            ports_of[w].push(Port { io: PortIo::Xdp(x), ifindex: *idx });
        }
        steers.push((name.clone(), steer));
    }
    for i in 0..steers.len() {
        let name = steers[i].0.clone();
        let idx = ifs.iter().find(|f| f.0 == name).unwrap().1;
        match steers[i].1.attach(idx) {
            Ok(mode) => log::info!("{name}: steering program attached ({mode} XDP)"),
            Err(e) => {
                for (_, s) in steers.iter_mut() {
                    s.detach_all();
                }
                return Err(format!("-i {name}: attaching XDP: {e}"));
            }
        }
    }
    Ok((ports_of, steers))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    if args.iter().any(|a| a == "--version") {
        println!("{}", xpf_version::line("xpfd"));
        return;
    }
    let a = match parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("xpfd: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = logging::init(a.syslog, a.log_format, a.log_level) {
        eprintln!("xpfd: {e}");
        std::process::exit(2);
    }
    let syslog = a.syslog;
    if let Err(e) = run(a) {
        // To the log, and with --syslog to the terminal that started xpfd too.
        log::error!("{e}");
        if syslog {
            eprintln!("xpfd: {e}");
        }
        std::process::exit(1);
    }
}

fn group_by_table(v: &[(String, std::net::IpAddr)]) -> Vec<(String, Vec<std::net::IpAddr>)> {
    let mut out: Vec<(String, Vec<std::net::IpAddr>)> = Vec::new();
    for (t, a) in v {
        match out.last_mut() {
            Some((name, addrs)) if name == t => addrs.push(*a),
            _ => out.push((t.clone(), vec![*a])),
        }
    }
    out
}

/// Probes whether each filtered interface takes the fast path's redirected frames and tells
/// the workers (`Steer::probe_egress`): at start, then every 2 s (a veth whose peer turns GRO
/// off or drops its XDP program would lose the flows' frames: they go back to xpfd within
/// that; one whose peer gains them takes flows within that). Says what changed.
/// `last`: when each interface was probed.
fn probe_egresses(
    steers: &[(String, Steer)],
    e: &fastpath::Egresses,
    last: &mut Vec<(u32, std::time::Instant)>,
    first: bool,
    fast: bool,
    xdp_tx: bool,
) {
    use std::time::{Duration, Instant};
    for (name, s) in steers {
        let Ok(i) = netlink::ifindex(name) else { continue };
        let every = Duration::from_secs(2);
        match last.iter_mut().find(|l| l.0 == i) {
            Some(l) if !first && l.1.elapsed() < every => continue,
            Some(l) => l.1 = Instant::now(),
            None => last.push((i, Instant::now())),
        }
        let ok = match s.probe_egress(i) {
            Ok(ok) => ok,
            Err(err) => {
                if first {
                    log::info!("{name}: could not probe it for the fast path ({err}): flows out of it stay in xpfd");
                }
                false
            }
        };
        let before = e.any();
        let changed = e.set(i, ok);
        if fast && (e.any() != before || (first && e.any())) {
            // Lookups only while a flow can be in the tables (shared: one write for all).
            if let Err(err) = s.fast_lookups(e.any()) {
                log::warn!("fast path: {err}");
            }
        }
        if changed || first {
            if ok {
                let what = match (fast, xdp_tx) {
                    (true, true) => "flows out of it go on the fast path, and xpfd sends to it through XDP",
                    (true, false) => "flows out of it go on the fast path",
                    _ => "xpfd sends to it through XDP",
                };
                log::info!("{name}: takes redirected frames: {what}");
            } else {
                let what = match (fast, xdp_tx) {
                    (true, true) => "flows out of it stay in xpfd, which sends to it through AF_XDP",
                    (true, false) => "flows out of it stay in xpfd",
                    _ => "xpfd sends to it through AF_XDP",
                };
                log::info!(
                    "{name}: takes no redirected frames (a veth whose peer runs neither XDP nor GRO): \
                     {what}; probed again every 2 s"
                );
            }
        }
    }
}

/// Gives each XDP port a lane to transmit through XDP (xpf_xdp::txlane), used while its
/// interface takes redirected frames, when a test run is cheap here (the steering program is
/// attached natively: a run with the program in no native slot changes the kernel's XDP
/// dispatcher, milliseconds each). Says what it did.
fn tx_lanes(steers: &[(String, Steer)], e: &fastpath::Egresses, ports_of: &mut [Vec<Port>]) {
    let Some((_, s)) = steers.first() else { return };
    let slots = match xpf_xdp::txlane::TxSlots::new(s.prog.clone(), u32::from_ne_bytes(xpf_state::os_random())) {
        Ok(t) => t,
        Err(err) => {
            log::info!("transmit through XDP: not available ({err}); frames leave through AF_XDP");
            return;
        }
    };
    match slots.run_cost() {
        Ok(c) if c < std::time::Duration::from_micros(500) => {}
        Ok(c) => {
            log::info!(
                "transmit through XDP: a test run costs {} us here (the steering program is not attached \
                 natively): frames leave through AF_XDP",
                c.as_micros()
            );
            return;
        }
        Err(err) => {
            log::info!("transmit through XDP: test run refused ({err}); frames leave through AF_XDP");
            return;
        }
    }
    let mut n = 0;
    for p in ports_of.iter_mut().flatten() {
        let (PortIo::Xdp(x), Some(flag)) = (&mut p.io, e.flag(p.ifindex)) else { continue };
        if let Some(l) = slots.lane(p.ifindex, flag) {
            x.set_lane(l);
            n += 1;
        }
    }
    log::info!(
        "transmit through XDP: {n} ports send batches of {} frames or more by XDP redirect to interfaces \
         that take redirected frames (--no-xdp-tx: AF_XDP only)",
        xpf_xdp::txlane::LANE_MIN
    );
}

fn run(a: Args) -> Result<(), String> {
    log::info!("{} starting", xpf_version::line("xpfd"));
    let text = std::fs::read_to_string(&a.file).map_err(|e| format!("{}: {e}", a.file))?;
    let loaded = Loaded::build(&text, &a.file, &a.defines).map_err(|e| e.join("\n"))?;
    log::info!("{}: {} rules, {} tables", a.file, loaded.parsed.rules.len(), loaded.parsed.tables.len());
    for w in &loaded.warnings {
        log::warn!("{w}");
    }
    let limit = loaded.state_limit();
    let timeouts = loaded.timeouts();
    let (ruleset, loaded) = loaded.take_ruleset();
    let slot = Arc::new(xpf_conf::reload::Slot::new(ruleset));
    let status = Arc::new(policy::Status::new());

    // What the ruleset asks of the daemon, checked before any interface is touched.
    control::pflow_fits(&loaded.parsed, a.pflow.is_some())?;
    control::queues_fit(&loaded.parsed, &a.ifaces)?;

    // Interfaces, queues, sockets.
    let mut ifs = Vec::new();
    for name in &a.ifaces {
        let idx = netlink::ifindex(name).map_err(|e| format!("-i {name}: {e}"))?;
        if idx > u16::MAX as u32 {
            return Err(format!("-i {name}: interface index {idx} beyond what the engine keys on"));
        }
        ifs.push((name.clone(), idx, netlink::rx_queues(name)));
    }
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // The fast path's tables hold as many flow directions as the state limit (each needs a
    // state), up to 1M unless --fastpath FLOWS says otherwise: per flow direction two IPv4
    // entries (64 bytes and a 16-byte rewrite record each) and half an IPv6 one (128 + 40),
    // 260 bytes.
    let flows = a.fastpath.unwrap_or(limit.clamp(1024, 1 << 20));
    // --io auto: packet mode when an interface is a veth (there AF_XDP copies every frame and
    // an XDP program turns TSO off at the peer; packet mode keeps 64 KB segments whole), if
    // its tcx program loads (below); else XDP, and packet mode where XDP cannot be set up.
    let auto = a.io == "auto";
    let veths = veth_names(ifs.iter().map(|i| (i.0.as_str(), netlink::driver(&i.0).map(|d| d.0).ok())));
    let mut xdp = match a.io.as_str() {
        "packet" => None,
        "xdp" => Some(xdp_ports(&a, &ifs, flows)?),
        _ if !veths.is_empty() => {
            log::info!(
                "--io auto: packet mode, as {} {} veth (AF_XDP copies every frame there and an XDP program \
                 turns TSO off at the peer; packet mode keeps the senders' 64 KB segments whole); \
                 --io xdp chooses XDP",
                veths.join(", "),
                if veths.len() == 1 { "is a" } else { "are" }
            );
            None
        }
        _ => match xdp_ports(&a, &ifs, flows) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("--io auto: XDP is not available here ({e}); falling back to AF_PACKET (TPACKET_V2)");
                None
            }
        },
    };
    let mut guard = None;
    let mut gro_restore = Vec::new();
    // Packet mode's tcx program (bpf/skb.c) on each interface, and for each an ifb device
    // into which it sends what it leaves to xpfd (the port's sockets read that device). It
    // runs with the fast path off too (its tables then match nothing): it is what keeps the
    // frames xpfd forwards from a tap and sends replies to translation targets to xpfd.
    let mut ifbs: Vec<u32> = Vec::new();
    let mut diverts: Vec<Divert> = Vec::new();
    let mut skb = None;
    if xdp.is_none() {
        match skb_path(&ifs, flows, &mut ifbs) {
            Ok((p, d)) => {
                diverts = d;
                skb = Some(p);
            }
            Err(e) => {
                for i in ifbs.drain(..) {
                    let _ = netlink::link_delete(i);
                }
                if auto && !veths.is_empty() {
                    log::warn!("--io auto: packet mode has no tcx program here ({e}); trying XDP mode");
                    match xdp_ports(&a, &ifs, flows) {
                        Ok(p) => xdp = Some(p),
                        Err(e) => log::warn!("--io auto: XDP is not available either ({e})"),
                    }
                }
                if xdp.is_none() {
                    log::warn!(
                        "packet mode: no tcx program here ({e}); the sockets tap the interfaces, every \
                         packet goes through xpfd, and translation is refused"
                    );
                }
            }
        }
    }
    let (ports_of, steers) = match xdp {
        Some(p) => p,
        None => {
            // A packet socket per interface and worker; a device's sockets share its frames
            // in a fanout group (the kernel's symmetric flow hash), and the hand-off brings
            // each frame to the worker that owns its flow, as in XDP mode.
            let workers = a.workers.unwrap_or(1).clamp(1, 64);
            if workers > 1 {
                log::info!(
                    "{workers} workers: each interface's frames shared by a fanout group (the kernel's \
                     symmetric flow hash), each frame to the worker that owns its flow (handed off)"
                );
            }
            let mut ports_of: Vec<Vec<Port>> = (0..workers).map(|_| Vec::new()).collect();
            for (k, (name, idx, _)) in ifs.iter().enumerate() {
                match netlink::set_gro(name, false) {
                    Ok(true) => {
                        log::info!("{name}: GRO turned off for packet mode (merged packets would exceed the MTU)");
                        gro_restore.push(name.clone());
                    }
                    Ok(false) => {}
                    Err(e) => log::warn!("{name}: {e}; packets merged by GRO will be dropped as over the MTU"),
                }
                let dev = diverts.get(k).copied().unwrap_or(Divert { rx: *idx, syn: None });
                let mut group = None;
                for (w, ports) in ports_of.iter_mut().enumerate() {
                    let mut p = PacketPort::open(*idx, dev.rx).map_err(|e| format!("-i {name}: AF_PACKET: {e}"))?;
                    if let Some(s) = dev.syn {
                        p.open_syn_lane(s).map_err(|e| format!("-i {name}: AF_PACKET (new connections): {e}"))?;
                    }
                    p.set_member(w as u32);
                    if workers > 1 {
                        group = Some(p.join_fanout(group).map_err(|e| format!("-i {name}: {e}"))?);
                    }
                    log::info!("{name}: AF_PACKET (TPACKET_V2 rings), worker {w}");
                    ports.push(Port { io: PortIo::Packet(p), ifindex: *idx });
                }
            }
            // Sockets that tap the interfaces (no tcx program) leave every frame to the kernel
            // as well: the netdev table drops the transit IP there before the kernel routes it.
            // With the tcx program transit frames never reach the stack, and what it leaves
            // to the kernel meets chain xpfd-fwd after the kernel's ICMP errors (too big, TTL),
            // as in XDP mode.
            if skb.is_none() {
                guard = Some(Guard::install(&a.ifaces).map_err(|e| format!("packet mode: {e}"))?);
                log::info!(
                    "packet mode: nftables table netdev {} drops transit IP in the kernel on {}",
                    Guard::TABLE,
                    a.ifaces.join(", ")
                );
            } else {
                Guard::remove_stale();
            }
            (ports_of, Vec::new())
        }
    };
    let workers = ports_of.len();
    // A large ruleset's parse is helped by the cores no worker runs on (the first load above
    // had them all): beside a busy worker a helper thread slows the parse down.
    let helpers = ncpu.saturating_sub(workers + 1);
    xpf_conf::parse::set_helpers(helpers);
    log::info!(
        "rulesets of 8 MB or more are parsed with {helpers} helper thread{}",
        if helpers == 1 { "" } else { "s" }
    );
    let frags = loaded.frags(workers);
    // `set limit src-nodes`: each worker's share (a reload sets it again, control.rs).
    let src_nodes = loaded.share("src-nodes", workers);
    // One key for every worker's syncookies: an ACK proves a cookie whichever worker sent it.
    let (cookies, cookie_key) = (loaded.parsed.syncookies.unwrap_or_default(), xpf_state::os_random());
    let cpus: Vec<usize> = a.cpus.clone().unwrap_or_else(|| (0..workers).map(|w| w % ncpu).collect());
    let skb_nat = skb.as_ref().map(|s| s.nat_maps()).transpose().map_err(|e| format!("packet mode: {e}"))?;
    control::translation_fits(&loaded, workers, !steers.is_empty() || skb_nat.is_some())?;
    control::write_nat_targets(&slot.current().1, &steers, skb_nat.as_ref())?;
    let steers = Arc::new(Mutex::new(steers));

    // Workers.
    let stop = Arc::new(AtomicBool::new(false));
    // Several workers shape one tree together: a coordinator shares its rates between them.
    let shape_board = (workers > 1).then(|| {
        let b = Arc::new(shaping::Board::default());
        let (b2, slot, stop) = (b.clone(), slot.clone(), stop.clone());
        std::thread::Builder::new()
            .name("xpf-shaper".into())
            .spawn(move || shaping::coordinate(b2, slot, workers, stop))
            .map(|_| b)
    });
    let shape_board = match shape_board {
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return Err(format!("the shaper's coordinator: {e}")),
        None => None,
    };
    let per_worker = (limit / workers as u32).max(1);
    let mut txs = Vec::new();
    let mut handles = Vec::new();
    let seed = Seed::random();
    let (overload_tx, overload_rx) = mpsc::channel::<(String, std::net::IpAddr)>();
    let overload_wake = Arc::new(dataplane::Wake::new().map_err(|e| format!("eventfd: {e}"))?);
    let sync_setup = match &a.sync {
        Some(sa) => {
            use md5::Digest;
            let cksum: [u8; 16] = md5::Md5::digest(text.as_bytes()).into();
            let cfg = sync::config(sa, loaded.parsed.hostid, cksum)?;
            let ifindex = netlink::ifindex(&sa.dev).map_err(|e| format!("--sync-dev {}: {e}", sa.dev))?;
            let tx = sync::Transport::open(
                &sa.dev,
                ifindex,
                xpf_sync::wire::PROTO,
                sa.peer,
                xpf_sync::wire::GROUP,
                xpf_sync::wire::TTL,
            )
            .map_err(|e| format!("--sync-dev {}: {e}", sa.dev))?;
            let shared = Arc::new(sync::Shared {
                workers: (0..workers).map(|_| Mutex::new(sync::WorkerReport::default())).collect(),
                endpoint: Mutex::new(Default::default()),
                bulk_left: Default::default(),
                bulk_sent: Default::default(),
                stop: AtomicBool::new(false),
                dev: sa.dev.clone(),
                peer: sa.peer.map(|p| p.to_string()).unwrap_or_else(|| "224.0.0.240".into()),
                auth: cfg.key.is_some(),
                defer: cfg.defer,
                creatorid: cfg.creatorid,
                placed_gone: Mutex::new(Vec::new()),
                placed: Default::default(),
            });
            log::info!(
                "sync on {} to {} (creator id {:08x}, frames up to {} bytes, authentication {}{})",
                sa.dev,
                shared.peer,
                cfg.creatorid,
                cfg.max_frame,
                if cfg.key.is_some() { "on" } else { "off" },
                if cfg.defer { ", defer" } else { "" }
            );
            Some((cfg, tx, shared, sa.maxupd))
        }
        None => None,
    };
    let mut wakes = Vec::new();
    let tables = {
        let st = steers.lock().unwrap();
        let prog = st.first().map(|s| (&*s.1.prog, "the steering program (XDP)")).or(skb
            .as_ref()
            .map(|s| (&s.prog, "the kernel as whole socket buffers (tcx ingress; packet mode's fast path)")));
        match prog {
            Some((p, by)) if flows > 0 => {
                // With sync on, a fast-path TCP segment comes to xpfd as often as the engine
                // sends a state's update (`maxupdates` counts), keeping the standby's windows
                // current.
                let pace = sync_setup.as_ref().map_or(0, |s| s.3 as u32);
                let t = xpf_xdp::steer::fast_tables(p, u32::from_ne_bytes(xpf_state::os_random()), pace)
                    .map_err(|e| format!("fast path tables: {e}"))?;
                log::info!(
                    "fast path on: established UDP, TCP and ICMP echo flows are forwarded by {by} \
                     ({} IPv4 and {} IPv6 table entries; --no-fastpath turns it off)",
                    t.v4.entries(),
                    t.v6.entries()
                );
                Some(Arc::new(t))
            }
            _ => None,
        }
    };
    // Which egresses take redirected frames: probed now, and again while xpfd runs (XDP); in
    // packet mode every egress takes the redirected socket buffers.
    // XDP mode probes them with the fast path off too: the workers' transmit through XDP
    // (xpf_xdp::txlane) goes only to those; with neither (`--no-fastpath --no-xdp-tx`) it
    // probes nothing.
    let egresses = (tables.is_some() || (skb.is_none() && a.xdp_tx))
        .then(|| Arc::new(fastpath::Egresses::new(&ifs.iter().map(|f| f.1).collect::<Vec<_>>())));
    let mut probed = Vec::new();
    let fast_on = tables.is_some();
    let xdp_tx = a.xdp_tx && skb.is_none();
    if let Some(e) = &egresses {
        match &skb {
            Some(sp) => {
                for (_, i, _) in &ifs {
                    e.set(*i, true);
                }
                xpf_xdp::steer::fast_lookups(&sp.prog, true).map_err(|e| format!("fast path: {e}"))?;
            }
            None => probe_egresses(&steers.lock().unwrap(), e, &mut probed, true, fast_on, xdp_tx),
        }
    }
    let mut ports_of = ports_of;
    if let (Some(e), true) = (&egresses, xdp_tx) {
        tx_lanes(&steers.lock().unwrap(), e, &mut ports_of);
    }
    // pflog: the writer runs from the start (a reload may bring `log` rules); the files are
    // opened when their first packet comes.
    let pflog = pflog::start(pflog::Config {
        file: a.pflog.clone().into(),
        max_bytes: a.pflog_size,
        socket: pflog::socket_of(&a.socket),
        rate: a.pflog_rate,
    })
    .map_err(|e| format!("pflog ({}): {e}", pflog::socket_of(&a.socket).display()))?;
    // pflow: the exporter runs when a collector is named; rules with `pflow` need one.
    let pflow = a.pflow.clone().map(pflow::start).transpose()?;
    if let Some(c) = &a.pflow {
        let p = if c.proto == pflow::Proto::Ipfix { "IPFIX" } else { "NetFlow v5" };
        log::info!("pflow: flows of pflow states to {} ({p}, active timeout {} s)", c.collector, c.active);
    }
    for _ in 0..ports_of.len() {
        wakes.push(Arc::new(dataplane::Wake::new().map_err(|e| format!("eventfd: {e}"))?));
    }
    let mut handoffs: Vec<Option<handoff::Handoff>> = if ports_of.len() > 1 {
        let mut m = handoff::mesh(ports_of.len());
        for h in &mut m {
            h.wakes = wakes.clone();
        }
        m.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    for (w, ports) in ports_of.into_iter().enumerate() {
        let handoff = handoffs[w].take();
        let (tx, rx) = mpsc::channel::<Cmd>();
        txs.push(tx);
        let wake = wakes[w].clone();
        let events = if sync_setup.is_some() { 1 << 20 } else { 0 };
        let cfg = WorkerConfig {
            limit: per_worker,
            rows: None,
            seed,
            events,
            now: 1,
            prefault: true,
            secret: xpf_state::os_random(),
        };
        let mut worker = Worker::new(cfg, policy::Live::new(slot.clone(), status.clone()))
            .map_err(|e| format!("state table: {e:?}"))?;
        let wsync = sync_setup.as_ref().map(|(cfg, tx, shared, maxupd)| {
            worker.t4.sync_max = *maxupd;
            worker.t6.sync_max = *maxupd;
            let mut ws = sync::WorkerSync::new(cfg, w, *tx, shared.clone());
            ws.rep.reserve(per_worker as usize);
            ws
        });
        worker.t4.set_timeouts(timeouts.clone());
        worker.t6.set_timeouts(timeouts.clone());
        worker.set_reassemble(frags.0, frags.1, timeouts.get(xpf_state::Timeout::Frag));
        worker.set_syncookies(cookies, Some(cookie_key));
        worker.set_src_node_limit(src_nodes);
        worker.set_flow_active(a.pflow.as_ref().map_or(0, |c| c.active));
        // Its own row of rule counters; translation's source ports by residue (the hand-off
        // owns replies by port).
        worker.set_index(w as u16, workers as u16);
        let cpu = cpus[w % cpus.len()];
        let (stop, busy, sched) = (stop.clone(), a.busy, a.worker_sched);
        let fast = tables.clone().zip(egresses.clone());
        let overload = dataplane::Overloads { tx: overload_tx.clone(), wake: overload_wake.clone() };
        let logger = pflog.clone();
        let flows = pflow.clone();
        let board = shape_board.clone();
        // Worker 0 filters the host's own traffic too: the queue is bound before the rules
        // that fill it are installed (below), so nothing is queued with no reader.
        let host = if w == 0 {
            Some(host::HostPath::open().map_err(|e| format!("the host's own traffic (NFQUEUE {}): {e}", host::QUEUE))?)
        } else {
            None
        };
        handles.push(
            std::thread::Builder::new()
                .name(format!("xpf-worker{w}"))
                .spawn(move || {
                    pin(cpu);
                    let got = sched.apply();
                    log::info!("worker {w} on CPU {cpu}, {got}, state limit {per_worker}");
                    let rt = matches!(got, WorkerSched::Fifo(_));
                    let mut dp = Dataplane::new(worker, ports, rx, stop, busy);
                    dp.overload = Some(overload);
                    dp.pflog = Some(logger);
                    dp.pflow = flows;
                    dp.host = host;
                    dp.sync = wsync;
                    dp.wake = Some(wake);
                    dp.handoff = handoff;
                    dp.shaping.board = board.map(|b| (b, w));
                    dp.nap = rt;
                    if let WorkerSched::Auto(nice) = got {
                        dp.rt_auto = Some(dataplane::RtAuto::new(WORKER_FIFO, nice));
                    }
                    if let Some((t, e)) = fast {
                        dp.fast = Some(fastpath::FastPath::new(t, e, w as u32));
                    }
                    dp.run();
                })
                .map_err(|e| e.to_string())?,
        );
    }

    let mut host_rules = xpf_xdp::nfqueue::HostRules::install(&a.ifaces, host::QUEUE)
        .map_err(|e| format!("the host's own traffic: {e}"))?;
    log::info!(
        "the host's own traffic on {} is filtered too (iptables chains xpfd-in, xpfd-out -> NFQUEUE {}); \
         the kernel forwards nothing to or from them past xpfd (chain xpfd-fwd)",
        a.ifaces.join(", "),
        host::QUEUE
    );

    // SAFETY: installing async-signal-safe handlers that only store to atomics.
    unsafe {
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
    }
    let mut sync_thread = None;
    let mut sync_shared = None;
    if let Some((cfg, tx, shared, _)) = sync_setup {
        let ep = xpf_sync::Endpoint::new(cfg);
        let (workers_tx, sh) = (txs.clone(), shared.clone());
        let rules = policy::Live::new(slot.clone(), status.clone());
        sync_thread = Some(
            std::thread::Builder::new()
                .name("xpf-sync".into())
                .spawn(move || sync::run(ep, tx, workers_tx, wakes, sh, rules))
                .map_err(|e| e.to_string())?,
        );
        sync_shared = Some(shared);
    }
    let mut d = Daemon::new(a.file.clone(), a.defines.clone(), loaded, slot, txs, steers.clone());
    d.sync = sync_shared.clone();
    d.status = status;
    d.ifaces = a.ifaces.clone();
    d.egresses = egresses.clone();
    d.skb_nat = skb_nat;
    d.skb_stats =
        skb.as_ref().map(|s| s.prog.map("skb_stats").share()).transpose().map_err(|e| format!("fast path: {e}"))?;
    d.pflog = Some(pflog.shared.clone());
    d.pflow = pflow.as_ref().map(|p| p.shared.clone());
    let listener = control::listen(&a.socket).map_err(|e| format!("control socket {}: {e}", a.socket))?;
    log::info!("filtering {}; control socket {}", a.ifaces.join(", "), a.socket);
    let scrapes = a.metrics.as_deref().map(metrics::start).transpose()?;
    if let Some(m) = &a.metrics {
        log::info!("metrics for Prometheus at http://{m}/metrics");
    }
    let mut hups = 0;
    let mut addrs = (xpf_conf::ifaddr::fingerprint(), std::time::Instant::now());
    // `no-route` and `urpf-failed` follow the kernel's routes the same way.
    let routes_now = || xpf_conf::routes::Fib::kernel().map(|f| f.fingerprint()).unwrap_or(0);
    let mut routes = routes_now();
    // What the ruleset's interface names stand for (an interface appearing or coming back with
    // another index, a group's members: `egress` follows the default routes) is followed too,
    // against what they stood for when the ruleset in force was installed.
    let resolution = |d: &control::Daemon| xpf_conf::ifgroup::Links::now().map(|l| d.interface_resolution(&l)).ok();
    let at_start = d.loaded_links();
    d.note_resolution(at_start.as_ref());
    // The interfaces' MACs as the steering program has them (it leaves frames for any other
    // unicast MAC to the kernel): followed once a second, as the addresses are.
    let mut macs: Vec<Option<[u8; 6]>> =
        steers.lock().unwrap().iter().map(|(n, _)| xpf_xdp::netlink::mac(n).ok()).collect();
    while !STOP.load(Ordering::Relaxed) {
        // `self` and `(if)` follow the interfaces' addresses: looked at once a second.
        if addrs.1.elapsed() >= std::time::Duration::from_secs(1) {
            for ((name, steer), known) in steers.lock().unwrap().iter().zip(macs.iter_mut()) {
                let now = xpf_xdp::netlink::mac(name).ok();
                if now.is_some() && now != *known {
                    let r = xpf_xdp::netlink::ifindex(name).and_then(|i| steer.set_mac(i));
                    match r {
                        Ok(()) => log::info!("{name}: MAC changed, the steering program follows"),
                        Err(e) => log::warn!("{name}: MAC changed, the steering program could not follow: {e}"),
                    }
                    *known = now;
                }
            }
            let f = xpf_conf::ifaddr::fingerprint();
            if f != addrs.0 && d.follows_addresses() {
                match d.recompile() {
                    Ok(g) => log::info!("interface addresses changed: ruleset compiled again (generation {g})"),
                    Err(e) => log::warn!("interface addresses changed, compiling again failed:\n{}", e.join("\n")),
                }
            }
            if d.follows_routes() {
                let r = routes_now();
                if r != routes {
                    match d.recompile() {
                        Ok(g) => log::info!("routes changed: ruleset compiled again (generation {g})"),
                        Err(e) => log::warn!("routes changed, compiling again failed:\n{}", e.join("\n")),
                    }
                    routes = r;
                }
            }
            let now = resolution(&d);
            if now.is_some() && now != d.resolved {
                match d.recompile() {
                    Ok(n) => log::info!("interfaces or groups changed: ruleset compiled again (generation {n})"),
                    Err(e) => {
                        log::warn!("interfaces or groups changed, compiling again failed:\n{}", e.join("\n"));
                        d.resolved = now;
                    }
                }
            }
            addrs = (f, std::time::Instant::now());
            if let Some(e) = &egresses {
                probe_egresses(&steers.lock().unwrap(), e, &mut probed, false, fast_on, xdp_tx);
            }
        }
        let h = HUP.load(Ordering::Relaxed);
        if h != hups {
            hups = h;
            match d.reload_file() {
                Ok(g) => log::info!("SIGHUP: {} reloaded (generation {g})", a.file),
                Err(e) => {
                    log::warn!("SIGHUP: {} not loaded, the ruleset in force stays:\n{}", a.file, e.join("\n"))
                }
            }
        }
        // Sources over their connection limits go to their `overload` table, a batch at a time.
        let mut over: Vec<(String, std::net::IpAddr)> = overload_rx.try_iter().collect();
        over.sort();
        over.dedup();
        for (table, addrs) in group_by_table(&over) {
            match d.table_add(&table, &addrs) {
                Ok(n) => log::info!("overload: {n} source(s) added to table <{table}>"),
                Err(e) => log::warn!("overload: table <{table}>: {e}"),
            }
        }
        control::serve_once(&listener, scrapes.as_ref(), &overload_wake, &mut d, if over.is_empty() { 200 } else { 0 });
    }
    log::info!("stopping");
    stop.store(true, Ordering::Relaxed);
    if let (Some(h), Some(sh)) = (sync_thread, &sync_shared) {
        sh.stop.store(true, Ordering::Relaxed);
        let _ = h.join();
    }
    for h in handles {
        let _ = h.join();
    }
    for (_, s) in steers.lock().unwrap().iter_mut() {
        s.detach_all();
    }
    host_rules.remove();
    if let Some(mut g) = guard {
        g.remove();
    }
    for name in gro_restore {
        let _ = netlink::set_gro(&name, true);
    }
    drop(skb);
    for i in ifbs {
        let _ = netlink::link_delete(i);
    }
    let _ = std::fs::remove_file(&a.socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_args, veth_names, WorkerSched};

    fn sched(extra: &[&str]) -> Result<WorkerSched, String> {
        let mut a: Vec<String> = ["-f", "pf.conf", "-i", "f0"].iter().map(|s| s.to_string()).collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        parse_args(&a).map(|r| r.worker_sched)
    }

    #[test]
    fn workers_at_nice_minus_20_and_real_time_in_a_flood_unless_told() {
        assert_eq!(sched(&[]), Ok(WorkerSched::Auto(-20)));
        assert_eq!(sched(&["--worker-nice", "-5"]), Ok(WorkerSched::Auto(-5)));
        assert_eq!(sched(&["--worker-rt", "off"]), Ok(WorkerSched::Nice(-20)));
        assert_eq!(sched(&["--worker-nice", "-5", "--worker-rt", "off"]), Ok(WorkerSched::Nice(-5)));
        assert_eq!(sched(&["--worker-rt", "off", "--worker-nice", "3"]), Ok(WorkerSched::Nice(3)));
        assert_eq!(sched(&["--worker-rt", "auto"]), Ok(WorkerSched::Auto(-20)));
        // Busy-polling workers never sleep: no real-time class unless told, and then refused.
        assert_eq!(sched(&["--busy-poll"]), Ok(WorkerSched::Nice(-20)));
        assert!(sched(&["--worker-rt", "auto", "--busy-poll"]).unwrap_err().contains("--busy-poll"));
        assert_eq!(sched(&["--worker-rt", "auto", "--worker-rt", "off", "--busy-poll"]), Ok(WorkerSched::Nice(-20)));
        assert_eq!(sched(&["--worker-rt"]), Ok(WorkerSched::Fifo(1)));
        assert_eq!(sched(&["--worker-rt", "-i", "f1"]), Ok(WorkerSched::Fifo(1)));
        assert_eq!(sched(&["--worker-rt", "10"]), Ok(WorkerSched::Fifo(10)));
        assert!(sched(&["--worker-rt", "0"]).unwrap_err().contains("--worker-rt 0"));
        assert!(sched(&["--worker-rt", "--busy-poll"]).unwrap_err().contains("--busy-poll"));
        assert!(sched(&["--worker-nice", "-21"]).is_err());
    }

    #[test]
    fn auto_chooses_packet_mode_for_the_veths_only() {
        let ifs = [("fc", Some("veth".to_string())), ("eth0", Some("ixgbe".into())), ("x", None)];
        assert_eq!(veth_names(ifs.iter().map(|(n, d)| (*n, d.clone()))), ["fc"]);
        let nics = [("eth0", Some("mlx5_core".to_string()))];
        assert!(veth_names(nics.iter().map(|(n, d)| (*n, d.clone()))).is_empty());
    }
}
