//! The bpf(2) calls xpf needs, and a loader for its own BPF objects.
//!
//! xpf's programs (bpf/*.c) are compiled to ELF by clang. The loader reads the one program
//! section `xdp`, creates a map for each symbol of section `maps` (a `struct xpf_map`: type,
//! key size, value size, entries, flags) and patches every `ld_imm64` that refers to a map with
//! the map's file descriptor, as libbpf does for legacy map definitions. There is no BTF and no
//! CO-RE: the programs only use stable UAPI structures.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_MAP_DELETE_ELEM: i32 = 3;
const BPF_MAP_GET_NEXT_KEY: i32 = 4;
const BPF_PROG_LOAD: i32 = 5;
const BPF_MAP_LOOKUP_BATCH: i32 = 24;
const BPF_MAP_UPDATE_BATCH: i32 = 26;
const BPF_PROG_TEST_RUN: i32 = 10;
const BPF_LINK_CREATE: i32 = 28;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `BPF_F_TEST_XDP_LIVE_FRAMES`: frames really go out (XDP_TX/REDIRECT).
pub const TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

fn sys_bpf<T>(cmd: i32, attr: &mut T) -> io::Result<i64> {
    // SAFETY: attr is a properly sized, zero-padded bpf_attr variant for cmd.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MapBatch {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, c) in n.iter_mut().zip(s.bytes().filter(|c| c.is_ascii_alphanumeric() || *c == b'_').take(15)) {
        *d = c;
    }
    n
}

/// Where a walk of a hash map stands (see [`Map::read_chunk`]).
#[derive(Debug, Default)]
pub struct BatchCursor {
    token: u32,
    started: bool,
    pub done: bool,
    keys: Vec<u8>,
    vals: Vec<u8>,
}

/// A BPF map.
#[derive(Debug)]
pub struct Map {
    pub name: String,
    pub fd: OwnedFd,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl Map {
    pub fn create(
        name: &str,
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    ) -> io::Result<Map> {
        let mut a = MapCreate {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags: flags,
            map_name: name16(name),
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &mut a).map_err(|e| ctx(e, &format!("creating BPF map {name}")))?;
        // SAFETY: the kernel returned a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Map { name: name.to_string(), fd, map_type, key_size, value_size, max_entries })
    }

    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        assert_eq!(key.len(), self.key_size as usize);
        let mut a = MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
    }

    /// Reads entry `key` into `out` (for per-CPU maps, one value per possible CPU, each
    /// rounded up to 8 bytes).
    pub fn lookup(&self, key: &[u8], out: &mut [u8]) -> io::Result<()> {
        let mut a = MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: out.as_mut_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut a).map(|_| ())
    }

    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        assert_eq!(key.len(), self.key_size as usize);
        let mut a = MapElem { map_fd: self.fd.as_raw_fd() as u32, key: key.as_ptr() as u64, ..Default::default() };
        sys_bpf(BPF_MAP_DELETE_ELEM, &mut a).map(|_| ())
    }

    /// Every key of a hash map (BPF_MAP_GET_NEXT_KEY): for small maps.
    pub fn keys(&self) -> io::Result<Vec<Vec<u8>>> {
        let ks = self.key_size as usize;
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut next = vec![0u8; ks];
        loop {
            let prev = out.last().cloned();
            let mut a = MapElem {
                map_fd: self.fd.as_raw_fd() as u32,
                key: prev.as_ref().map_or(0, |p| p.as_ptr() as u64),
                value: next.as_mut_ptr() as u64,
                ..Default::default()
            };
            match sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
                Ok(_) => out.push(next.clone()),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
                Err(e) => return Err(e),
            }
            if out.len() > self.max_entries as usize {
                return Ok(out);
            }
        }
    }

    /// The next (up to) `chunk` entries of a hash map after cursor `c` (BPF_MAP_LOOKUP_BATCH),
    /// for walking a big map a slice at a time; `c.done` is set after the last. Entries added
    /// or removed meanwhile may or may not be seen.
    pub fn read_chunk(&self, c: &mut BatchCursor, chunk: usize, mut f: impl FnMut(&[u8], &[u8])) -> io::Result<()> {
        let (ks, vs) = (self.key_size as usize, self.value_size as usize);
        c.keys.resize(ks * chunk, 0);
        c.vals.resize(vs * chunk, 0);
        let mut next = 0u32;
        let mut a = MapBatch {
            in_batch: if c.started { &mut c.token as *mut u32 as u64 } else { 0 },
            out_batch: &mut next as *mut u32 as u64,
            keys: c.keys.as_mut_ptr() as u64,
            values: c.vals.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: self.fd.as_raw_fd() as u32,
            ..Default::default()
        };
        match sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut a) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => c.done = true,
            Err(e) => return Err(e),
        }
        for i in 0..(a.count as usize).min(chunk) {
            f(&c.keys[i * ks..(i + 1) * ks], &c.vals[i * vs..(i + 1) * vs]);
        }
        c.token = next;
        c.started = true;
        Ok(())
    }

    /// Writes `keys.len() / key_size` entries in one call (BPF_MAP_UPDATE_BATCH); returns how
    /// many were written before an error, and the error.
    pub fn update_batch(&self, keys: &[u8], values: &[u8]) -> (usize, io::Result<()>) {
        let n = keys.len() / self.key_size as usize;
        assert_eq!(values.len(), n * self.value_size as usize);
        let mut a = MapBatch {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: n as u32,
            map_fd: self.fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let r = sys_bpf(BPF_MAP_UPDATE_BATCH, &mut a).map(|_| ());
        (a.count as usize, r)
    }

    /// Another handle on the same map (for another thread).
    pub fn share(&self) -> io::Result<Map> {
        Ok(Map {
            name: self.name.clone(),
            fd: self.fd.try_clone()?,
            map_type: self.map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
        })
    }

    /// Maps the values of an array made with BPF_F_MMAPABLE into this process (shared with
    /// the kernel: what a program writes is seen here, and the other way round).
    pub fn mmap(&self) -> io::Result<Mapped> {
        let page = 4096usize;
        let len = ((self.value_size as usize).next_multiple_of(8) * self.max_entries as usize).next_multiple_of(page);
        // SAFETY: a fresh shared mapping of the map's fd; the kernel checks the length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ctx(io::Error::last_os_error(), &format!("mapping BPF map {}", self.name)));
        }
        Ok(Mapped { ptr: p as *mut u8, len })
    }

    /// Sum over CPUs of the u64 counter at `index` of a per-CPU array.
    pub fn percpu_sum(&self, index: u32) -> io::Result<u64> {
        let n = possible_cpus();
        let mut buf = vec![0u8; 8 * n];
        self.lookup(&index.to_ne_bytes(), &mut buf)?;
        Ok(buf.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).sum())
    }
}

/// A BPF array's values mapped into this process (`Map::mmap`); unmapped on drop.
#[derive(Debug)]
pub struct Mapped {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the mapping is plain shared memory; callers synchronise through atomics.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The kernel's number of possible CPUs (the width of per-CPU map values).
pub fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    s.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0),
            None => usize::from(!r.is_empty()),
        })
        .sum::<usize>()
        .max(1)
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Which program of an object to load, and as what.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    section: &'static str,
    prog_type: u32,
}

impl Kind {
    pub const XDP: Kind = Kind { section: "xdp", prog_type: BPF_PROG_TYPE_XDP };
    /// BPF_PROG_TYPE_SCHED_CLS, attached with [`tcx_ingress`].
    pub const TC: Kind = Kind { section: "tc", prog_type: 3 };
    /// The same kind, from section "tc/drop".
    pub const TC_DROP: Kind = Kind { section: "tc/drop", prog_type: 3 };
    /// XDP, from section "xdp/ack" (the lab's handshake answerer, sink.c).
    pub const XDP_ACK: Kind = Kind { section: "xdp/ack", prog_type: BPF_PROG_TYPE_XDP };
    /// SCHED_CLS from section "tc/answer" (the lab sink's SYN/ACK, sink.c).
    pub const TC_ANSWER: Kind = Kind { section: "tc/answer", prog_type: 3 };
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    _pad: u32,
    expected_revision: u64,
}

/// Attaches a `Kind::TC` program at `ifindex`'s tcx ingress (kernel 6.6 and later): the link
/// returned holds it there, and detaches it when dropped (xpfd's exit included).
pub fn tcx_ingress(prog: &Program, ifindex: u32) -> io::Result<OwnedFd> {
    let mut a = LinkCreate {
        prog_fd: prog.fd.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_TCX_INGRESS,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_LINK_CREATE, &mut a).map_err(|e| ctx(e, &format!("tcx ingress of interface {ifindex}")))?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A loaded BPF program and the maps it uses.
#[derive(Debug)]
pub struct Program {
    pub name: String,
    pub fd: OwnedFd,
    pub maps: Vec<Map>,
    /// The verifier's statistics for this load and the time it took ("" when not loaded here).
    pub verified: String,
}

impl Program {
    pub fn map(&self, name: &str) -> &Map {
        self.maps.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("program {} has no map {name}", self.name))
    }

    /// Loads the `xdp` section of an ELF object made by clang -target bpf.
    pub fn load(name: &str, elf: &[u8]) -> io::Result<Program> {
        Self::load_sized(name, elf, &[])
    }

    /// As `load`, with the maps named in `sizes` made with those max_entries instead of the
    /// object's.
    pub fn load_sized(name: &str, elf: &[u8], sizes: &[(&str, u32)]) -> io::Result<Program> {
        Self::load_with(name, elf, sizes, &[])
    }

    /// As `load_sized`, with the maps in `shared` used in place of the object's maps of the
    /// same names (one map for the programs of several interfaces).
    pub fn load_with(name: &str, elf: &[u8], sizes: &[(&str, u32)], shared: &[&Map]) -> io::Result<Program> {
        Self::load_kind(name, elf, Kind::XDP, sizes, shared)
    }

    /// As `load_with`, for the program of section `kind.section`, loaded as that kind.
    pub fn load_kind(
        name: &str,
        elf: &[u8],
        kind: Kind,
        sizes: &[(&str, u32)],
        shared: &[&Map],
    ) -> io::Result<Program> {
        let obj = Elf::parse(elf).map_err(|m| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {m}")))?;
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {m}"));
        let prog = obj.section(kind.section).ok_or_else(|| bad(&format!("no {} section", kind.section)))?;
        let license = obj.section("license").map(|s| obj.data(s)).unwrap_or(b"GPL\0");
        let license = CString::new(license.split(|&b| b == 0).next().unwrap_or(b"GPL")).unwrap();
        let mut insns = obj.data(prog).to_vec();
        let mut maps: Vec<Map> = Vec::new();
        let mut by_sym: Vec<(usize, usize)> = Vec::new(); // symbol index -> maps index
        if let Some(ms) = obj.section("maps") {
            let data = obj.data(ms);
            for (si, sym) in obj.symbols().enumerate() {
                if sym.shndx as usize != ms.index || sym.name.is_empty() {
                    continue;
                }
                let o = sym.value as usize;
                let f = |i: usize| u32::from_le_bytes(data[o + 4 * i..o + 4 * i + 4].try_into().unwrap());
                if o + 20 > data.len() {
                    return Err(bad("short map definition"));
                }
                if let Some(m) = shared.iter().find(|m| m.name == sym.name) {
                    maps.push(m.share()?);
                } else {
                    let entries = sizes.iter().find(|s| s.0 == sym.name).map_or(f(3), |s| s.1);
                    maps.push(Map::create(sym.name, f(0), f(1), f(2), entries, f(4))?);
                }
                by_sym.push((si, maps.len() - 1));
            }
        }
        for rel in obj.relocations_for(prog.index) {
            let Some(&(_, mi)) = by_sym.iter().find(|(s, _)| *s == rel.sym) else {
                return Err(bad(&format!("relocation to symbol {} that is not a map", rel.sym)));
            };
            let at = rel.offset as usize;
            if at + 8 > insns.len() || insns[at] != 0x18 {
                return Err(bad("map relocation not on a ld_imm64"));
            }
            insns[at + 1] = (insns[at + 1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
            insns[at + 4..at + 8].copy_from_slice(&(maps[mi].fd.as_raw_fd() as u32).to_le_bytes());
        }
        let mut log = vec![0u8; 1 << 20];
        let mut a = ProgLoad {
            prog_type: kind.prog_type,
            insn_cnt: (insns.len() / 8) as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name16(name),
            ..Default::default()
        };
        // The verifier's statistics (log level 4: a line or two, no trace): how much work it
        // did explains the time a load takes.
        let mut stats = vec![0u8; 1024];
        a.log_level = 4;
        a.log_size = stats.len() as u32;
        a.log_buf = stats.as_mut_ptr() as u64;
        let t0 = std::time::Instant::now();
        let first = sys_bpf(BPF_PROG_LOAD, &mut a);
        let verified = format!(
            "verified in {:.2} s: {}",
            t0.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&stats[..stats.iter().position(|&b| b == 0).unwrap_or(0)])
                .trim()
                .replace('\n', "; ")
        );
        a.log_level = 0;
        a.log_size = 0;
        a.log_buf = 0;
        let fd = match first {
            Ok(fd) => fd,
            Err(_) => {
                // Load again with the verifier's log, to say why.
                a.log_level = 1;
                a.log_size = log.len() as u32;
                a.log_buf = log.as_mut_ptr() as u64;
                match sys_bpf(BPF_PROG_LOAD, &mut a) {
                    Ok(fd) => fd,
                    Err(e) => {
                        let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                            .lines()
                            .rev()
                            .take(12)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect::<Vec<_>>()
                            .join("\n");
                        return Err(ctx(e, &format!("loading BPF program {name}; verifier said:\n{text}")));
                    }
                }
            }
        };
        // SAFETY: fresh descriptor from the kernel.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Program { name: name.to_string(), fd, maps, verified })
    }

    /// BPF_PROG_TEST_RUN: runs the program `repeat` times on `frame`, with `ingress` as the
    /// receiving interface, in batches of `batch` (live frames when `flags` says so).
    pub fn test_run(&self, frame: &[u8], ingress: u32, repeat: u32, batch: u32, flags: u32) -> io::Result<u32> {
        self.test_run_meta(frame, 0, ingress, repeat, batch, flags)
    }

    /// [`Program::test_run`] with the first `meta` bytes of `frame` as the frame's XDP
    /// metadata (a multiple of 4, at most 32).
    pub fn test_run_meta(
        &self,
        frame: &[u8],
        meta: u32,
        ingress: u32,
        repeat: u32,
        batch: u32,
        flags: u32,
    ) -> io::Result<u32> {
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
        let mut md = [0u32; 6];
        md[0] = meta;
        md[1] = frame.len() as u32;
        md[3] = ingress;
        let mut a = TestRun {
            prog_fd: self.fd.as_raw_fd() as u32,
            data_size_in: frame.len() as u32,
            data_in: frame.as_ptr() as u64,
            repeat,
            ctx_size_in: std::mem::size_of_val(&md) as u32,
            ctx_in: md.as_mut_ptr() as u64,
            flags,
            batch_size: batch,
            ..Default::default()
        };
        sys_bpf(BPF_PROG_TEST_RUN, &mut a)?;
        Ok(a.retval)
    }
}

// ---- a minimal ELF64 little-endian reader, enough for clang's BPF objects ----

struct Section {
    index: usize,
    name: String,
    offset: usize,
    size: usize,
    sh_type: u32,
    link: u32,
    info: u32,
}

struct Sym<'a> {
    name: &'a str,
    shndx: u16,
    value: u64,
}

struct Rel {
    offset: u64,
    sym: usize,
}

struct Elf<'a> {
    b: &'a [u8],
    sections: Vec<Section>,
}

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;

impl<'a> Elf<'a> {
    fn parse(b: &'a [u8]) -> Result<Elf<'a>, String> {
        if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
            return Err("not a 64-bit little-endian ELF object".into());
        }
        let u16_ = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
        let shoff = u64::from_le_bytes(b[0x28..0x30].try_into().unwrap()) as usize;
        let (shentsize, shnum, shstrndx) = (u16_(0x3a), u16_(0x3c), u16_(0x3e));
        if shentsize < 64 || shoff.checked_add(shnum * shentsize).is_none_or(|e| e > b.len()) || shstrndx >= shnum {
            return Err("bad section header table".into());
        }
        let mut raw = Vec::new();
        for i in 0..shnum {
            let h = &b[shoff + i * shentsize..shoff + i * shentsize + 64];
            let r32 = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
            let r64 = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap()) as usize;
            let (offset, size) = (r64(24), r64(32));
            if r32(4) != 8 && offset.checked_add(size).is_none_or(|e| e > b.len()) {
                return Err(format!("section {i} out of the file"));
            }
            raw.push((r32(0), r32(4), offset, size, r32(40), r32(44)));
        }
        let (_, _, stro, strs, _, _) = raw[shstrndx];
        let names = &b[stro..stro + strs];
        let cstr = |t: &[u8], o: usize| -> String {
            t.get(o..)
                .map(|s| String::from_utf8_lossy(s.split(|&c| c == 0).next().unwrap_or(&[])).into_owned())
                .unwrap_or_default()
        };
        let sections = raw
            .iter()
            .enumerate()
            .map(|(index, &(n, sh_type, offset, size, link, info))| Section {
                index,
                name: cstr(names, n as usize),
                offset,
                size,
                sh_type,
                link,
                info,
            })
            .collect();
        Ok(Elf { b, sections })
    }

    fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    fn data(&self, s: &Section) -> &'a [u8] {
        &self.b[s.offset..s.offset + s.size]
    }

    fn symbols(&self) -> impl Iterator<Item = Sym<'a>> + '_ {
        let st = self.sections.iter().find(|s| s.sh_type == SHT_SYMTAB);
        let (data, strtab) = match st {
            Some(s) => (self.data(s), self.sections.get(s.link as usize).map(|t| self.data(t)).unwrap_or(&[])),
            None => (&[][..], &[][..]),
        };
        data.chunks_exact(24).map(move |e| {
            let n = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
            let name =
                strtab.get(n..).and_then(|s| std::str::from_utf8(s.split(|&c| c == 0).next()?).ok()).unwrap_or("");
            Sym {
                name,
                shndx: u16::from_le_bytes([e[6], e[7]]),
                value: u64::from_le_bytes(e[8..16].try_into().unwrap()),
            }
        })
    }

    fn relocations_for(&self, target: usize) -> Vec<Rel> {
        self.sections
            .iter()
            .filter(|s| s.sh_type == SHT_REL && s.info as usize == target)
            .flat_map(|s| {
                self.data(s).chunks_exact(16).map(|e| Rel {
                    offset: u64::from_le_bytes(e[0..8].try_into().unwrap()),
                    sym: (u64::from_le_bytes(e[8..16].try_into().unwrap()) >> 32) as usize,
                })
            })
            .collect()
    }
}

/// The programs of bpf/, compiled by build.rs.
pub mod objects {
    pub const STEER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer.o"));
    pub const GEN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gen.o"));
    pub const SINK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sink.o"));
    pub const INJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/inject.o"));
    pub const SKB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/skb.o"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_parse_and_name_their_maps() {
        for (o, maps, progs) in [
            (objects::STEER, &["xsks", "steer_stats", "flows4", "flows6", "steer_cfg"][..], &["xdp"][..]),
            (objects::GEN, &["gen_cfg", "gen_count", "gen_pace"][..], &["xdp"][..]),
            (objects::SINK, &["sink_count", "sink_src"][..], &["xdp"][..]),
            (
                objects::SKB,
                &["flows4", "flows6", "steer_cfg", "divert", "skb_stats", "natnet", "natport"][..],
                &["tc"][..],
            ),
        ] {
            let e = Elf::parse(o).unwrap();
            let ms = e.section("maps").unwrap();
            let names: Vec<_> = e.symbols().filter(|s| s.shndx as usize == ms.index).map(|s| s.name).collect();
            for m in maps {
                assert!(names.contains(m), "{m} in {names:?}");
            }
            for p in progs {
                let x = e.section(p).unwrap();
                assert!(!e.relocations_for(x.index).is_empty(), "{p}");
            }
        }
    }

    #[test]
    fn the_skb_object_has_its_drop_program() {
        let e = Elf::parse(objects::SKB).unwrap();
        assert!(e.section("tc/drop").is_some());
        let sink = Elf::parse(objects::SINK).unwrap();
        assert!(sink.section("xdp/ack").is_some() && sink.section("tc/answer").is_some(), "the lab's answerers");
    }

    /// The kernel's verifier walks the programs at each load (most of xpfd's start) and refuses
    /// one past 1,000,000 instructions processed. The steering program stays well inside: a
    /// change that makes its paths multiply (docs/xpfd.md, "One program serves every
    /// interface") fails here before it slows every start or stops loading on a kernel whose
    /// verifier walks a little differently. Needs root, as `make test` runs.
    #[test]
    fn the_programs_verify_well_inside_the_kernels_limit() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: the programs are not loaded");
            return;
        }
        let sizes = [("flows4", 1 << 16), ("flows6", 1 << 14), ("xlats4", 1 << 16), ("xlats6", 1 << 14)];
        for (name, elf, kind, budget) in
            [("xpf_steer", objects::STEER, Kind::XDP, 400_000), ("xpf_skb", objects::SKB, Kind::TC, 100_000)]
        {
            let p = Program::load_kind(name, elf, kind, &sizes, &[]).unwrap();
            let n: u64 = p
                .verified
                .split("processed ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no count in {:?}", p.verified));
            eprintln!("{name}: {}", p.verified);
            assert!(n <= budget, "{name}: the verifier processed {n} instructions (budget {budget}): {}", p.verified);
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert!(Elf::parse(b"hello").is_err());
        let mut b = objects::SINK.to_vec();
        b[0x3c] = 0xff; // section count beyond the file
        assert!(Elf::parse(&b).is_err());
    }
}
