//! pflog: the packets `log` rules decide, to a pcap file per pflog unit (pflogd's habit:
//! `/var/log/pflog` for pflog0, `/var/log/pflog1` for `log (to pflog1)`, read with `tcpdump
//! -n -e -ttt -r`), rotated at a size (the old file kept as FILE.0), and live to whoever is
//! connected to the pflog socket (`xpfctl log [-i pflogN] | tcpdump -n -e -r -`).
//!
//! Workers never wait for it: each logged packet is copied (its first bytes) into a bounded
//! queue; a full queue drops the record and counts it. One thread writes the files and the
//! live streams; a live reader that does not keep up loses records, counted, and is let go
//! when it stops reading.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Seek, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;
use xpf_io::pflog::{self as fmt, Header, SNAPLEN};

/// Records the workers may have queued before the writer takes them.
const QUEUE: usize = 8192;

/// One logged packet, as a worker hands it over.
pub struct Entry {
    pub unit: u8,
    pub ifindex: u32,
    /// The header, its interface name filled in by the writer.
    pub hdr: Header,
    pub ts: (u32, u32),
    pub len: u16,
    pub data: [u8; SNAPLEN],
    pub orig_len: u32,
}

/// What `xpfctl -s info` shows of pflog.
#[derive(Default)]
pub struct Shared {
    pub logged: AtomicU64,
    /// Records lost: the queue was full (the writer behind), or a live reader's was.
    pub dropped: AtomicU64,
    pub dropped_live: AtomicU64,
    pub bytes: AtomicU64,
    pub readers: AtomicU64,
    pub write_errors: AtomicU64,
    /// Records not made: their rule was over `--pflog-rate` this second.
    pub rate_limited: AtomicU64,
}

impl Shared {
    /// The counters: (key for JSON and metrics, text for `xpfctl -s info`, value).
    pub fn rows(&self) -> [(&'static str, &'static str, u64); 7] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("logged", "logged", g(&self.logged)),
            ("dropped", "dropped (queue full)", g(&self.dropped)),
            ("bytes", "bytes written", g(&self.bytes)),
            ("write_errors", "write errors", g(&self.write_errors)),
            ("readers", "live readers", g(&self.readers)),
            ("dropped_live", "lost by live readers", g(&self.dropped_live)),
            ("rate_limited", "over a rule's rate", g(&self.rate_limited)),
        ]
    }
}

/// A worker's end of the queue.
#[derive(Clone)]
pub struct Tx {
    tx: SyncSender<Box<Entry>>,
    pub shared: Arc<Shared>,
    /// `--pflog-rate`: records per rule per second this worker makes at most (0: no limit),
    /// and the count of each rule in the current second.
    rate: u32,
    seen: std::cell::RefCell<(u32, HashMap<u32, u32>)>,
}

impl Tx {
    /// Whether rule `rule` may log one more record in second `sec` (per-rule limit).
    fn admit(&self, rule: u32, sec: u32) -> bool {
        if self.rate == 0 {
            return true;
        }
        let mut s = self.seen.borrow_mut();
        if s.0 != sec {
            *s = (sec, HashMap::new());
        }
        let n = s.1.entry(rule).or_insert(0);
        *n += 1;
        if *n > self.rate {
            self.shared.rate_limited.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues `e`; never waits.
    pub fn log(&self, e: Box<Entry>) {
        match self.tx.try_send(e) {
            Ok(()) => self.shared.logged.fetch_add(1, Ordering::Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// The files' place and size: unit 0 writes `file`, unit N `file` followed by N.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    pub max_bytes: u64,
    /// Where live readers connect.
    pub socket: PathBuf,
    /// Records per rule per second and worker at most (0: no limit).
    pub rate: u32,
}

/// The live socket's path for xpfd's control socket `control`.
pub fn socket_of(control: &str) -> PathBuf {
    PathBuf::from(format!("{control}.pflog"))
}

/// Starts the writer thread.
pub fn start(cfg: Config) -> io::Result<Tx> {
    let _ = std::fs::remove_file(&cfg.socket);
    let l = UnixListener::bind(&cfg.socket)?;
    l.set_nonblocking(true)?;
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let shared = Arc::new(Shared::default());
    let s = shared.clone();
    let rate = cfg.rate;
    std::thread::Builder::new().name("xpfd-pflog".into()).spawn(move || Writer::new(cfg, s).run(rx, l))?;
    Ok(Tx { tx, shared, rate, seen: Default::default() })
}

struct File {
    w: io::BufWriter<std::fs::File>,
    size: u64,
}

struct Writer {
    cfg: Config,
    shared: Arc<Shared>,
    files: HashMap<u8, File>,
    readers: Vec<(UnixStream, u8)>,
    names: HashMap<u32, [u8; 16]>,
    buf: Vec<u8>,
}

impl Writer {
    fn new(cfg: Config, shared: Arc<Shared>) -> Writer {
        Writer { cfg, shared, files: HashMap::new(), readers: Vec::new(), names: HashMap::new(), buf: Vec::new() }
    }

    fn run(mut self, rx: Receiver<Box<Entry>>, l: UnixListener) {
        loop {
            while let Ok((s, _)) = l.accept() {
                self.reader(s);
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(e) => {
                    self.write(&e);
                    for e in rx.try_iter().take(4096) {
                        self.write(&e);
                    }
                    for f in self.files.values_mut() {
                        if f.w.flush().is_err() {
                            self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// A live reader: its first line names the unit (`pflog1`; empty for pflog0); it gets a
    /// pcap file header, then every record of that unit.
    fn reader(&mut self, s: UnixStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut line = String::new();
        if BufReader::new((&s).take(64)).read_line(&mut line).is_err() {
            return;
        }
        let unit = line.trim().strip_prefix("pflog").and_then(|n| n.parse().ok()).unwrap_or(0);
        let _ = s.set_write_timeout(Some(Duration::from_millis(20)));
        if (&s).write_all(&fmt::file_header()).is_ok() {
            self.readers.push((s, unit));
            self.shared.readers.store(self.readers.len() as u64, Ordering::Relaxed);
        }
    }

    fn ifname(&mut self, ifindex: u32) -> [u8; 16] {
        *self.names.entry(ifindex).or_insert_with(|| {
            let mut b = [0 as libc::c_char; libc::IF_NAMESIZE];
            // SAFETY: b holds IF_NAMESIZE bytes, as if_indextoname needs.
            let p = unsafe { libc::if_indextoname(ifindex, b.as_mut_ptr()) };
            let name = if p.is_null() {
                format!("if{ifindex}")
            } else {
                // SAFETY: if_indextoname wrote a NUL-terminated name into b.
                unsafe { std::ffi::CStr::from_ptr(b.as_ptr()) }.to_string_lossy().into_owned()
            };
            Header::ifname_of(&name)
        })
    }

    fn write(&mut self, e: &Entry) {
        let hdr = Header { ifname: self.ifname(e.ifindex), ..e.hdr };
        self.buf.clear();
        fmt::record(&mut self.buf, e.ts, &hdr, &e.data[..e.len as usize]);
        // The pcap record says the packet's whole length.
        let orig = (fmt::HDRLEN as u32 + e.orig_len).to_ne_bytes();
        self.buf[12..16].copy_from_slice(&orig);
        if let Err(err) = self.append(e.unit) {
            if self.shared.write_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                log::warn!("pflog: {}: {err}", self.path(e.unit).display());
            }
        }
        let (buf, shared) = (&self.buf, &self.shared);
        self.readers.retain_mut(|(s, unit)| {
            if *unit != e.unit {
                return true;
            }
            // A reader that cannot take a record within the timeout may have half of it: its
            // stream would no longer parse, so it is let go (and the record counted lost).
            match s.write_all(buf) {
                Ok(()) => true,
                Err(_) => {
                    shared.dropped_live.fetch_add(1, Ordering::Relaxed);
                    false
                }
            }
        });
        self.shared.readers.store(self.readers.len() as u64, Ordering::Relaxed);
    }

    fn path(&self, unit: u8) -> PathBuf {
        if unit == 0 {
            self.cfg.file.clone()
        } else {
            PathBuf::from(format!("{}{unit}", self.cfg.file.display()))
        }
    }

    /// Appends the record in `buf` to unit `unit`'s file (opened when first needed).
    fn append(&mut self, unit: u8) -> io::Result<()> {
        let path = self.path(unit);
        let f = match self.files.entry(unit) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(open(&path)?),
        };
        f.w.write_all(&self.buf)?;
        f.size += self.buf.len() as u64;
        self.shared.bytes.fetch_add(self.buf.len() as u64, Ordering::Relaxed);
        if f.size >= self.cfg.max_bytes {
            // newsyslog's way with pflogd's file: the full one becomes FILE.0.
            f.w.flush()?;
            self.files.remove(&unit);
            std::fs::rename(&path, format!("{}.0", path.display()))?;
        }
        Ok(())
    }
}

/// Opens a pflog file to append to: a new one gets its header; one that is not a pflog file
/// of this layout is moved aside to FILE.bad (pflogd does the same) and a new one started.
fn open(path: &Path) -> io::Result<File> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d)?;
    }
    let mut head = [0u8; 24];
    let existing = match std::fs::File::open(path) {
        Ok(mut f) => {
            let n = f.read(&mut head)?;
            Some((n, f.seek(io::SeekFrom::End(0))?))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match existing {
        Some((n, size)) if n == 24 && fmt::is_file_header(&head) => {
            let f = std::fs::OpenOptions::new().append(true).open(path)?;
            Ok(File { w: io::BufWriter::new(f), size })
        }
        Some((n, _)) if n > 0 => {
            std::fs::rename(path, format!("{}.bad", path.display()))?;
            fresh(path)
        }
        _ => fresh(path),
    }
}

fn fresh(path: &Path) -> io::Result<File> {
    let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(path)?;
    f.write_all(&fmt::file_header())?;
    Ok(File { w: io::BufWriter::new(f), size: 24 })
}

/// The frames of `w`'s last batch (seen on `ifindex`) a `log` rule decided (`m`): to pflog
/// through `tx`, with the verdict, the rule and the translation the worker noted.
#[cold]
pub fn log_frames<P: xpf_engine::Policy>(tx: &Tx, w: &xpf_engine::Worker<P>, frames: &[&[u8]], ifindex: u32, m: u64) {
    use xpf_io::pflog::{self as fmt, Header};
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let ts = (t.as_secs() as u32, t.subsec_micros());
    for i in (0..frames.len().min(64)).filter(|&i| m & (1 << i) != 0) {
        let l = w.batch().logs[i];
        if !tx.admit(l.rule, ts.0) {
            continue;
        }
        let f = frames[i];
        // The IP packet: after the Ethernet header and any 802.1Q tags.
        let mut at = 14;
        while f.len() >= at + 4 && matches!(u16::from_be_bytes([f[at - 2], f[at - 1]]), 0x8100 | 0x88a8) {
            at += 4;
        }
        let ip = f.get(at..).unwrap_or(&[]);
        let af = match ip.first().map(|b| b >> 4) {
            Some(4) => fmt::AF_INET,
            Some(6) => fmt::AF_INET6,
            _ => continue,
        };
        let b = w.batch();
        let rewritten = (b.translated & (1 << i) != 0).then(|| (b.rewrites[i].addr, b.rewrites[i].port));
        // pf's names: a rule in an anchor is logged under the main ruleset's anchor rule.
        let name = w.policy.log_name(l.rule);
        let len = ip.len().min(fmt::SNAPLEN);
        let mut e = Box::new(Entry {
            unit: l.unit,
            ifindex,
            hdr: Header {
                af,
                action: l.action,
                reason: l.reason,
                ifname: [0; 16],
                rulenr: name.rulenr,
                subrulenr: name.subrulenr,
                ruleset: name.ruleset,
                dir: l.dir,
                rewritten,
            },
            ts,
            len: len as u16,
            data: [0; fmt::SNAPLEN],
            orig_len: ip.len() as u32,
        });
        e.data[..len].copy_from_slice(&ip[..len]);
        tx.log(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_logs_at_most_its_rate_per_second() {
        let (tx, _rx) = mpsc::sync_channel(1);
        let t = Tx { tx, shared: Arc::new(Shared::default()), rate: 3, seen: Default::default() };
        let got: Vec<bool> = (0..5).map(|_| t.admit(7, 100)).collect();
        assert_eq!(got, [true, true, true, false, false]);
        assert!(t.admit(8, 100), "another rule has its own count");
        assert!(t.admit(7, 101), "a new second starts again");
        assert_eq!(t.shared.rate_limited.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn files_rotate_and_a_foreign_file_is_moved_aside() {
        let dir = std::env::temp_dir().join(format!("xpf-pflog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pflog");
        std::fs::write(&path, b"not a pflog file").unwrap();
        let cfg = Config { file: path.clone(), max_bytes: 4096, socket: dir.join("sock"), rate: 0 };
        let mut w = Writer::new(cfg, Arc::new(Shared::default()));
        let hdr = Header { af: fmt::AF_INET, action: 1, rulenr: 3, dir: 1, ..Header::default() };
        let e = Entry { unit: 0, ifindex: 1, hdr, ts: (1, 2), len: 60, data: [0x45; SNAPLEN], orig_len: 60 };
        for _ in 0..30 {
            w.write(&e);
        }
        for f in w.files.values_mut() {
            f.w.flush().unwrap();
        }
        assert_eq!(std::fs::read(dir.join("pflog.bad")).unwrap(), b"not a pflog file");
        // 176 bytes a record: the first file took 23 (24 + 23 x 176 >= 4096), the next the rest.
        let old = std::fs::read(dir.join("pflog.0")).unwrap();
        let new = std::fs::read(&path).unwrap();
        let (a, b) = (xpf_io::pcap::read(&old).unwrap(), xpf_io::pcap::read(&new).unwrap());
        assert_eq!(a.len() + b.len(), 30);
        assert!(old.len() >= 4096 && old.len() < 4096 + 176, "{}", old.len());
        assert_eq!(Header::parse(b[0].data).map(|h| (h.rulenr, h.action)), Some((3, 1)));
        // Unit 1 writes its own file.
        w.write(&Entry { unit: 1, ..e });
        w.files.get_mut(&1).unwrap().w.flush().unwrap();
        assert_eq!(xpf_io::pcap::read(&std::fs::read(dir.join("pflog1")).unwrap()).unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
