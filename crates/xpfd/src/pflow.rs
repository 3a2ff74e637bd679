//! pflow: the flows of `pflow` states to a collector over UDP (`--pflow HOST:PORT`), as IPFIX
//! (RFC 7011, the default) or NetFlow v5 (`--pflow-proto 5`), the two protocols OpenBSD's
//! pflow(4) speaks.
//!
//! What is sent is OpenBSD's: per state, a flow each way (source the side that made the state,
//! then the reverse), with the information elements pflow's IPFIX templates carry (addresses,
//! interfaces, packet and octet deltas, start and end in milliseconds, ports, ToS, protocol);
//! and FreeBSD's NAT44 session events for translated states (natEvent 4 when made, 5 when
//! gone, with the addresses and ports before and after). Records come at a state's end and,
//! for long flows, every `--pflow-active` seconds with what is new (crate `xpf_state::flow`).
//!
//! The workers hand their records over a bounded queue and never wait; one thread encodes and
//! sends. Losses (queue full, records a protocol cannot carry) are counted in `-s info`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xpf_state::{Flow, FlowEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    V5,
    Ipfix,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub collector: SocketAddr,
    pub src: Option<std::net::IpAddr>,
    pub proto: Proto,
    /// Seconds between a live flow's records.
    pub active: u32,
    /// IPFIX's observation domain (pflow's, 0 unless told).
    pub domain: u32,
}

/// The exporter's counters (`-s info`, metrics): (key, text, value).
#[derive(Default)]
pub struct Shared {
    pub flows: AtomicU64,
    pub nat_events: AtomicU64,
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    pub send_errors: AtomicU64,
    /// Records lost: the workers' log or the queue to this thread was full.
    pub dropped: AtomicU64,
    /// Records NetFlow v5 cannot carry (IPv6 flows, NAT events).
    pub not_v5: AtomicU64,
}

impl Shared {
    pub fn rows(&self) -> [(&'static str, &'static str, u64); 7] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("flows", "flow records sent", g(&self.flows)),
            ("nat_events", "NAT44 events sent", g(&self.nat_events)),
            ("messages", "messages sent", g(&self.messages)),
            ("bytes", "bytes sent", g(&self.bytes)),
            ("send_errors", "send errors", g(&self.send_errors)),
            ("dropped", "records lost (queue full)", g(&self.dropped)),
            ("not_v5", "not expressible in v5", g(&self.not_v5)),
        ]
    }
}

/// Records of one worker, with the wall-clock time (ms) of its engine second 0.
pub struct Batch {
    pub flows: Vec<Flow>,
    pub epoch_ms: u64,
}

/// A worker's end.
#[derive(Clone)]
pub struct Tx {
    tx: SyncSender<Batch>,
    pub shared: Arc<Shared>,
}

impl Tx {
    /// Hands `flows` over (engine seconds counted from `start`, the worker's clock: its
    /// second `s` began at start + s - 1); `lost` records the worker could not keep.
    pub fn send(&self, flows: Vec<Flow>, start: Instant, lost: u64) {
        if lost > 0 {
            self.shared.dropped.fetch_add(lost, Ordering::Relaxed);
        }
        if flows.is_empty() {
            return;
        }
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let epoch_ms = now_ms.saturating_sub(start.elapsed().as_millis() as u64).saturating_sub(1000);
        let n = flows.len() as u64;
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(Batch { flows, epoch_ms })
        {
            self.shared.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Opens the socket and starts the sending thread.
pub fn start(cfg: Config) -> Result<Tx, String> {
    let bind: SocketAddr = match (cfg.src, cfg.collector) {
        (Some(a), _) => SocketAddr::new(a, 0),
        (None, SocketAddr::V4(_)) => "0.0.0.0:0".parse().unwrap(),
        (None, SocketAddr::V6(_)) => "[::]:0".parse().unwrap(),
    };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("--pflow: binding {bind}: {e}"))?;
    let shared = Arc::new(Shared::default());
    let (tx, rx) = sync_channel(256);
    let sh = shared.clone();
    std::thread::Builder::new()
        .name("xpf-pflow".into())
        .spawn(move || run(cfg, sock, rx, sh))
        .map_err(|e| e.to_string())?;
    Ok(Tx { tx, shared })
}

/// Templates go again this often (a collector started after xpfd learns them).
const TEMPLATE_EVERY: Duration = Duration::from_secs(30);
/// A message's size at most: under any path MTU's IPv6 minimum less headers.
const MAX_MESSAGE: usize = 1200;

fn run(cfg: Config, sock: UdpSocket, rx: Receiver<Batch>, sh: Arc<Shared>) {
    let start = Instant::now();
    let mut e = Encoder { cfg: cfg.clone(), seq: 0, templates_at: None, start };
    loop {
        let b = match rx.recv_timeout(TEMPLATE_EVERY) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => {
                if cfg.proto == Proto::Ipfix {
                    let m = e.ipfix(&[], 0, &sh);
                    send(&sock, &cfg, &m, &sh);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        for m in e.messages(&b, &sh) {
            send(&sock, &cfg, &m, &sh);
        }
    }
}

fn send(sock: &UdpSocket, cfg: &Config, m: &[u8], sh: &Shared) {
    match sock.send_to(m, cfg.collector) {
        Ok(_) => {
            sh.messages.fetch_add(1, Ordering::Relaxed);
            sh.bytes.fetch_add(m.len() as u64, Ordering::Relaxed);
        }
        Err(_) => {
            sh.send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

const TMPL_V4: u16 = 256;
const TMPL_V6: u16 = 257;
const TMPL_NAT4: u16 = 258;

/// IPFIX information elements (id, length) of each template, in record order.
const FIELDS_V4: [(u16, u16); 12] =
    [(8, 4), (12, 4), (10, 4), (14, 4), (2, 8), (1, 8), (152, 8), (153, 8), (7, 2), (11, 2), (5, 1), (4, 1)];
const FIELDS_V6: [(u16, u16); 12] =
    [(27, 16), (28, 16), (10, 4), (14, 4), (2, 8), (1, 8), (152, 8), (153, 8), (7, 2), (11, 2), (5, 1), (4, 1)];
const FIELDS_NAT4: [(u16, u16); 11] =
    [(323, 8), (230, 1), (4, 1), (8, 4), (7, 2), (225, 4), (227, 2), (12, 4), (11, 2), (226, 4), (228, 2)];

fn rec_len(f: &[(u16, u16)]) -> usize {
    f.iter().map(|x| x.1 as usize).sum()
}

/// One direction of a flow, ready to encode.
struct Dir {
    proto: u8,
    src: ([u8; 16], u16),
    dst: ([u8; 16], u16),
    input: u32,
    output: u32,
    packets: u64,
    bytes: u64,
    start_ms: u64,
    end_ms: u64,
}

/// Both directions of `f` that carried packets: from the side that made the state, then back.
fn directions(f: &Flow, epoch_ms: u64) -> impl Iterator<Item = Dir> + '_ {
    let ms = move |t: u32| epoch_ms + t as u64 * 1000;
    let kif = f.kif as u32;
    // pf knows the interface a state was made on: in on it going in, out on it going out.
    let (inn, out) = if f.out { (0, kif) } else { (kif, 0) };
    (0..2).filter(move |&i| f.packets[i] > 0).map(move |i| {
        let (s, d) = if i == 0 { (f.src, f.dst) } else { (f.dst, f.src) };
        Dir {
            proto: f.proto,
            src: (s.0 .0, s.1),
            dst: (d.0 .0, d.1),
            input: if i == 0 { inn } else { out },
            output: if i == 0 { out } else { inn },
            packets: f.packets[i],
            bytes: f.bytes[i],
            start_ms: ms(f.start),
            end_ms: ms(f.end),
        }
    })
}

struct Encoder {
    cfg: Config,
    /// IPFIX: data records sent before this message; v5: flows.
    seq: u32,
    templates_at: Option<Instant>,
    start: Instant,
}

impl Encoder {
    fn messages(&mut self, b: &Batch, sh: &Shared) -> Vec<Vec<u8>> {
        match self.cfg.proto {
            Proto::Ipfix => {
                let mut out = Vec::new();
                let mut flows = &b.flows[..];
                while !flows.is_empty() {
                    // Flows per message: each makes at most two flow records and a NAT event.
                    let n = flows.len().min(MAX_MESSAGE / (2 * rec_len(&FIELDS_V6) + rec_len(&FIELDS_NAT4)) - 1);
                    out.push(self.ipfix(&flows[..n], b.epoch_ms, sh));
                    flows = &flows[n..];
                }
                out
            }
            Proto::V5 => {
                let mut dirs = Vec::new();
                for f in &b.flows {
                    if f.af != 4 || f.event == FlowEvent::NatCreate {
                        sh.not_v5.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    dirs.extend(directions(f, b.epoch_ms));
                }
                dirs.chunks(30).map(|c| self.v5(c, sh)).collect()
            }
        }
    }

    /// One IPFIX message: the templates when due, then the data sets of `flows`.
    fn ipfix(&mut self, flows: &[Flow], epoch_ms: u64, sh: &Shared) -> Vec<u8> {
        let mut m = Vec::with_capacity(MAX_MESSAGE);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32);
        m.extend_from_slice(&10u16.to_be_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&now.to_be_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(&self.cfg.domain.to_be_bytes());
        if self.templates_at.is_none_or(|t| t.elapsed() >= TEMPLATE_EVERY) || flows.is_empty() {
            let at = m.len();
            m.extend_from_slice(&2u16.to_be_bytes());
            m.extend_from_slice(&[0, 0]);
            for (id, fields) in [(TMPL_V4, &FIELDS_V4[..]), (TMPL_V6, &FIELDS_V6[..]), (TMPL_NAT4, &FIELDS_NAT4[..])] {
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(&(fields.len() as u16).to_be_bytes());
                for (ie, len) in fields {
                    m.extend_from_slice(&ie.to_be_bytes());
                    m.extend_from_slice(&len.to_be_bytes());
                }
            }
            let l = (m.len() - at) as u16;
            m[at + 2..at + 4].copy_from_slice(&l.to_be_bytes());
            self.templates_at = Some(Instant::now());
        }
        let mut records = 0u32;
        for (tmpl, af) in [(TMPL_V4, 4u8), (TMPL_V6, 6u8)] {
            let dirs: Vec<Dir> = flows
                .iter()
                .filter(|f| f.af == af && f.event != FlowEvent::NatCreate)
                .flat_map(|f| directions(f, epoch_ms))
                .collect();
            if dirs.is_empty() {
                continue;
            }
            let at = set_start(&mut m, tmpl);
            for d in &dirs {
                if af == 4 {
                    m.extend_from_slice(&d.src.0[..4]);
                    m.extend_from_slice(&d.dst.0[..4]);
                } else {
                    m.extend_from_slice(&d.src.0);
                    m.extend_from_slice(&d.dst.0);
                }
                m.extend_from_slice(&d.input.to_be_bytes());
                m.extend_from_slice(&d.output.to_be_bytes());
                m.extend_from_slice(&d.packets.to_be_bytes());
                m.extend_from_slice(&d.bytes.to_be_bytes());
                m.extend_from_slice(&d.start_ms.to_be_bytes());
                m.extend_from_slice(&d.end_ms.to_be_bytes());
                m.extend_from_slice(&d.src.1.to_be_bytes());
                m.extend_from_slice(&d.dst.1.to_be_bytes());
                m.push(0);
                m.push(d.proto);
            }
            set_end(&mut m, at);
            records += dirs.len() as u32;
            sh.flows.fetch_add(dirs.len() as u64, Ordering::Relaxed);
        }
        // NAT44 session events: made (4) and gone (5), IPv4 translated states.
        let nat: Vec<&Flow> = flows
            .iter()
            .filter(|f| f.af == 4 && (f.src, f.dst) != (f.nat_src, f.nat_dst))
            .filter(|f| matches!(f.event, FlowEvent::NatCreate | FlowEvent::End))
            .collect();
        if !nat.is_empty() {
            let at = set_start(&mut m, TMPL_NAT4);
            for f in &nat {
                let (event, t) = if f.event == FlowEvent::NatCreate { (4u8, f.start) } else { (5u8, f.end) };
                m.extend_from_slice(&(epoch_ms + t as u64 * 1000).to_be_bytes());
                m.push(event);
                m.push(f.proto);
                for (a, p) in [f.src, f.nat_src, f.dst, f.nat_dst] {
                    m.extend_from_slice(&a.0[..4]);
                    m.extend_from_slice(&p.to_be_bytes());
                }
            }
            set_end(&mut m, at);
            records += nat.len() as u32;
            sh.nat_events.fetch_add(nat.len() as u64, Ordering::Relaxed);
        }
        let l = m.len() as u16;
        m[2..4].copy_from_slice(&l.to_be_bytes());
        self.seq = self.seq.wrapping_add(records);
        m
    }

    /// One NetFlow v5 datagram of up to 30 flows.
    fn v5(&mut self, dirs: &[Dir], sh: &Shared) -> Vec<u8> {
        let mut m = Vec::with_capacity(24 + 48 * dirs.len());
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let now_ms = wall.as_millis() as u64;
        let up_ms = self.start.elapsed().as_millis() as u64;
        // sysUptime: milliseconds since the exporter started; a flow's First and Last on it.
        let uptime = |t_ms: u64| (up_ms as i64 - (now_ms as i64 - t_ms as i64)).max(0) as u32;
        m.extend_from_slice(&5u16.to_be_bytes());
        m.extend_from_slice(&(dirs.len() as u16).to_be_bytes());
        m.extend_from_slice(&(up_ms as u32).to_be_bytes());
        m.extend_from_slice(&(wall.as_secs() as u32).to_be_bytes());
        m.extend_from_slice(&wall.subsec_nanos().to_be_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]); // engine type, engine id, sampling
        for d in dirs {
            m.extend_from_slice(&d.src.0[..4]);
            m.extend_from_slice(&d.dst.0[..4]);
            m.extend_from_slice(&[0; 4]); // next hop
            m.extend_from_slice(&(d.input as u16).to_be_bytes());
            m.extend_from_slice(&(d.output as u16).to_be_bytes());
            m.extend_from_slice(&(d.packets.min(u32::MAX as u64) as u32).to_be_bytes());
            m.extend_from_slice(&(d.bytes.min(u32::MAX as u64) as u32).to_be_bytes());
            m.extend_from_slice(&uptime(d.start_ms).to_be_bytes());
            m.extend_from_slice(&uptime(d.end_ms).to_be_bytes());
            m.extend_from_slice(&d.src.1.to_be_bytes());
            m.extend_from_slice(&d.dst.1.to_be_bytes());
            m.extend_from_slice(&[0, 0, d.proto, 0]); // pad, tcp flags, protocol, tos
            m.extend_from_slice(&[0; 8]); // AS numbers, masks, pad
        }
        self.seq = self.seq.wrapping_add(dirs.len() as u32);
        sh.flows.fetch_add(dirs.len() as u64, Ordering::Relaxed);
        m
    }
}

fn set_start(m: &mut Vec<u8>, id: u16) -> usize {
    let at = m.len();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    at
}

fn set_end(m: &mut [u8], at: usize) {
    let l = (m.len() - at) as u16;
    m[at + 2..at + 4].copy_from_slice(&l.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpf_wire::Addr;

    fn flow(event: FlowEvent, nat: bool) -> Flow {
        let a = |x: [u8; 4]| Addr::v4(x);
        Flow {
            event,
            af: 4,
            proto: 17,
            kif: 3,
            out: true,
            rule: 1,
            src: (a([10, 0, 1, 2]), 40000),
            dst: (a([198, 51, 100, 1]), 53),
            nat_src: if nat { (a([192, 0, 2, 1]), 50001) } else { (a([10, 0, 1, 2]), 40000) },
            nat_dst: (a([198, 51, 100, 1]), 53),
            packets: [3, 2],
            bytes: [300, 200],
            start: 10,
            end: 20,
        }
    }

    fn enc(proto: Proto) -> Encoder {
        let cfg = Config { collector: "127.0.0.1:2055".parse().unwrap(), src: None, proto, active: 60, domain: 7 };
        Encoder { cfg, seq: 0, templates_at: None, start: Instant::now() }
    }

    #[test]
    fn ipfix_sends_templates_then_both_directions_and_nat_events() {
        let sh = Shared::default();
        let mut e = enc(Proto::Ipfix);
        let b =
            Batch { flows: vec![flow(FlowEvent::NatCreate, true), flow(FlowEvent::End, true)], epoch_ms: 1_000_000 };
        let m = &e.messages(&b, &sh)[0];
        assert_eq!(&m[..2], &10u16.to_be_bytes());
        assert_eq!(u16::from_be_bytes([m[2], m[3]]) as usize, m.len());
        assert_eq!(&m[12..16], &7u32.to_be_bytes(), "observation domain");
        // Template set first (id 2), three templates.
        assert_eq!(u16::from_be_bytes([m[16], m[17]]), 2);
        let tl = u16::from_be_bytes([m[18], m[19]]) as usize;
        assert_eq!(tl, 4 + (4 + 4 * 12) * 2 + 4 + 4 * 11);
        // Then the IPv4 data set: two records of 54 bytes (the state's two directions).
        let d = 16 + tl;
        assert_eq!(u16::from_be_bytes([m[d], m[d + 1]]), TMPL_V4);
        assert_eq!(u16::from_be_bytes([m[d + 2], m[d + 3]]) as usize, 4 + 2 * 54);
        let r = &m[d + 4..];
        assert_eq!(&r[..8], &[10, 0, 1, 2, 198, 51, 100, 1]);
        assert_eq!(&r[8..16], &[0, 0, 0, 0, 0, 0, 0, 3], "in: none, out: the state's interface");
        assert_eq!(u64::from_be_bytes(r[16..24].try_into().unwrap()), 3);
        assert_eq!(u64::from_be_bytes(r[24..32].try_into().unwrap()), 300);
        assert_eq!(u64::from_be_bytes(r[32..40].try_into().unwrap()), 1_010_000);
        assert_eq!(u64::from_be_bytes(r[40..48].try_into().unwrap()), 1_020_000);
        assert_eq!(&r[48..54], &[0x9c, 0x40, 0, 53, 0, 17]);
        let back = &r[54..];
        assert_eq!(&back[..8], &[198, 51, 100, 1, 10, 0, 1, 2]);
        assert_eq!(u64::from_be_bytes(back[16..24].try_into().unwrap()), 2);
        // Then the NAT44 events: made (4) and gone (5).
        let n = d + 4 + 2 * 54;
        assert_eq!(u16::from_be_bytes([m[n], m[n + 1]]), TMPL_NAT4);
        assert_eq!(u16::from_be_bytes([m[n + 2], m[n + 3]]) as usize, 4 + 2 * 34);
        assert_eq!((m[n + 4 + 8], m[n + 4 + 34 + 8]), (4, 5));
        assert_eq!(&m[n + 4 + 10..n + 4 + 22], &[10, 0, 1, 2, 0x9c, 0x40, 192, 0, 2, 1, 0xc3, 0x51]);
        assert_eq!(m.len(), n + 4 + 2 * 34);
        assert_eq!((sh.flows.load(Ordering::Relaxed), sh.nat_events.load(Ordering::Relaxed)), (2, 2));
        // The next message has no templates (sent 30 s apart) and counts the records before it.
        let m2 = &e.messages(&Batch { flows: vec![flow(FlowEvent::Active, false)], epoch_ms: 0 }, &sh)[0];
        assert_eq!(u32::from_be_bytes(m2[8..12].try_into().unwrap()), 4);
        assert_eq!(u16::from_be_bytes([m2[16], m2[17]]), TMPL_V4);
    }

    #[test]
    fn netflow_v5_carries_ipv4_flows_and_counts_what_it_cannot() {
        let sh = Shared::default();
        let mut e = enc(Proto::V5);
        let mut v6 = flow(FlowEvent::End, false);
        v6.af = 6;
        let b = Batch { flows: vec![flow(FlowEvent::End, false), v6, flow(FlowEvent::NatCreate, true)], epoch_ms: 0 };
        let ms = e.messages(&b, &sh);
        assert_eq!(ms.len(), 1);
        let m = &ms[0];
        assert_eq!((u16::from_be_bytes([m[0], m[1]]), u16::from_be_bytes([m[2], m[3]])), (5, 2));
        assert_eq!(m.len(), 24 + 2 * 48);
        let r = &m[24..];
        assert_eq!(&r[..8], &[10, 0, 1, 2, 198, 51, 100, 1]);
        assert_eq!(u32::from_be_bytes(r[16..20].try_into().unwrap()), 3);
        assert_eq!(u32::from_be_bytes(r[20..24].try_into().unwrap()), 300);
        assert_eq!(&r[32..34], &40000u16.to_be_bytes());
        assert_eq!(r[38], 17);
        assert_eq!(sh.not_v5.load(Ordering::Relaxed), 2);
    }
}
