//! OpenBSD's pfctl regression cases (../shared/peer/openbsd-pfctl-regress, see its MANIFEST):
//! pfN.in must print as pfN.ok byte for byte, pfailN.in must be refused with pfailN.ok's errors,
//! and every pfN.ok must print as itself. The test prints the tally and fails if any count falls
//! below the floor kept in tests/conformance-floor.txt (raise it as cases pass).

use std::path::PathBuf;

const PF: &[u32] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
    32, 34, 35, 36, 38, 39, 40, 41, 44, 46, 47, 48, 49, 50, 52, 53, 54, 55, 56, 57, 60, 61, 65, 66, 67, 68, 69, 70, 71,
    72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99,
    100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 114,
];
const PFAIL: &[u32] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 19, 20, 23, 25, 27, 30, 37, 38, 39, 40, 41, 42, 43, 47, 48, 49,
    50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67,
];

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer/openbsd-pfctl-regress");
    assert!(d.is_dir(), "{} is missing: the test suite needs ../shared beside the checkout", d.display());
    d
}

/// What `pfctl -o none -nv -f - < src` prints: the rules, or the errors.
fn pfctl_nv(src: &str) -> String {
    // pfctl's harness runs in the regress directory: includes are found there.
    let p = xpf_conf::parse::parse_in(src, "stdin", &[], Some(&dir()));
    if p.errors.is_empty() {
        xpf_conf::print::parsed(&p)
    } else {
        // stderr (the errors) then stdout (what parsing printed), as the regress files hold them.
        let mut o: String = p.errors.iter().map(|e| format!("{e}\n")).collect();
        for h in &p.header {
            o.push_str(h);
            o.push('\n');
        }
        o
    }
}

fn floor() -> (usize, usize, usize) {
    let f =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance-floor.txt")).unwrap();
    let n = |k: &str| -> usize {
        f.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("floor file lacks '{k}'"))
    };
    (n("pf:"), n("pfail:"), n("selfpf:"))
}

/// The interfaces OpenBSD's regress harness has (lo0 with 127.0.0.1/8, ::1 and fe80::1; the
/// others bare) in a private network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new() -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("the interface cases need root (a network namespace with dummy interfaces)".into());
        }
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("xpfrg{}-{seq}", std::process::id());
        let ip = |args: &[&str]| -> Result<(), String> {
            let o = std::process::Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
            }
        };
        ip(&["netns", "add", &name])?;
        let ns = Netns(name.clone());
        // lo0 is the namespace's own loopback renamed (Linux puts ::1 on loopback only); the
        // others are veth (this kernel has no dummy driver and loads no modules).
        ip(&["-n", &name, "link", "set", "lo", "name", "lo0"])?;
        ip(&["-n", &name, "link", "set", "lo0", "up"])?;
        ip(&["-n", &name, "addr", "add", "fe80::1/64", "dev", "lo0", "nodad"])?;
        for (k, ifname) in ["lo1000000", "tun1000000", "tun1000001"].into_iter().enumerate() {
            let peer = format!("xpfp{k}");
            ip(&["-n", &name, "link", "add", ifname, "type", "veth", "peer", "name", &peer])?;
            ip(&["-n", &name, "link", "set", ifname, "addrgenmode", "none"])?;
            ip(&["-n", &name, "link", "set", ifname, "up"])?;
        }
        Ok(ns)
    }

    /// Runs `f` on a thread that has entered the namespace and sees OpenBSD's users and groups.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.0);
        let users = std::env::temp_dir().join(format!("{}-users", self.0));
        let u = users.clone();
        let out = std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: fd is a network namespace file; setns affects only this thread.
            let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            openbsd_users(&u);
            f()
        })
        .join();
        let _ = std::fs::remove_dir_all(&users);
        out.unwrap()
    }
}

/// The users and groups the cases name, with the ids OpenBSD gives them (the expected output
/// holds ids: `user bin` is `user = 3`), over /etc/passwd and /etc/group in a mount namespace
/// of this thread's own: the host's own files are not touched, and go with the thread.
fn openbsd_users(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let files = [
        ("passwd", "root:*:0:0:root:/root:/bin/ksh\ndaemon:*:1:1::/root:/sbin/nologin\nbin:*:3:7::/:/sbin/nologin\nsshd:*:27:27::/var/empty:/sbin/nologin\nnobody:*:32767:32767::/nonexistent:/sbin/nologin\n"),
        ("group", "wheel:*:0:root\ndaemon:*:1:daemon\nbin:*:7:\nsshd:*:27:\nnobody:*:32767:\n"),
    ];
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    // SAFETY: unshare and mount with valid C strings; they change this thread's view only
    // (CLONE_FS: the thread leaves the process's shared root and working directory).
    unsafe {
        assert_eq!(
            libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS),
            0,
            "unshare: {}",
            std::io::Error::last_os_error()
        );
        let rc = libc::mount(
            std::ptr::null(),
            c("/").as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "mount --make-rprivate /: {}", std::io::Error::last_os_error());
    }
    for (name, text) in files {
        let src = dir.join(name);
        std::fs::write(&src, text).unwrap();
        let (src, dst) = (c(src.to_str().unwrap()), c(&format!("/etc/{name}")));
        // SAFETY: as above.
        let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        assert_eq!(rc, 0, "mount --bind over /etc/{name}: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn pfctl_regress_tally() {
    let ns = Netns::new().unwrap_or_else(|e| panic!("{e}"));
    ns.run(tally);
}

fn tally() {
    let d = dir();
    let read = |n: &str| std::fs::read_to_string(d.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let (mut pf, mut pfail, mut selfpf) = (Vec::new(), Vec::new(), Vec::new());
    for n in PF {
        let ok = read(&format!("pf{n}.ok"));
        if pfctl_nv(&read(&format!("pf{n}.in"))) == ok {
            pf.push(*n);
        }
        if pfctl_nv(&ok) == ok {
            selfpf.push(*n);
        }
    }
    for n in PFAIL {
        let p = xpf_conf::parse::parse_in(&read(&format!("pfail{n}.in")), "stdin", &[], Some(&d));
        let want = read(&format!("pfail{n}.ok"));
        let refused = !p.errors.is_empty();
        let got = pfctl_nv(&read(&format!("pfail{n}.in")));
        // pfail14 is accepted nowadays: its .ok is the printed rule.
        if (refused && got == want) || (*n == 14 && !refused && xpf_conf::print::parsed(&p) == want) {
            pfail.push(*n);
        }
    }
    println!(
        "pf: {}/{}, pfail: {}/{}, selfpf: {}/{}",
        pf.len(),
        PF.len(),
        pfail.len(),
        PFAIL.len(),
        selfpf.len(),
        PF.len()
    );
    println!("pf passing: {pf:?}");
    println!("pfail passing: {pfail:?}");
    println!("selfpf failing: {:?}", PF.iter().filter(|n| !selfpf.contains(n)).collect::<Vec<_>>());
    let (f_pf, f_pfail, f_self) = floor();
    assert!(pf.len() >= f_pf, "pf conformance fell to {} below the floor {f_pf}", pf.len());
    assert!(pfail.len() >= f_pfail, "pfail conformance fell to {} below the floor {f_pfail}", pfail.len());
    assert!(selfpf.len() >= f_self, "selfpf conformance fell to {} below the floor {f_self}", selfpf.len());
}

/// `XPF_PFDIFF=1 cargo test -p xpf-conf --test pfctl_regress -- --nocapture show_first_differences`
/// prints each failing case's first differing line (a work aid, it asserts nothing).
#[test]
fn show_first_differences() {
    if std::env::var_os("XPF_PFDIFF").is_none() {
        return;
    }
    Netns::new().unwrap().run(first_differences);
}

fn first_differences() {
    let d = dir();
    for n in PF {
        let ok = std::fs::read_to_string(d.join(format!("pf{n}.ok"))).unwrap();
        let got = pfctl_nv(&std::fs::read_to_string(d.join(format!("pf{n}.in"))).unwrap());
        if got != ok {
            let (g, w) = got.lines().zip(ok.lines()).find(|(a, b)| a != b).unwrap_or(("<length>", "<length>"));
            println!("pf{n}:\n  got  {g}\n  want {w}");
        }
    }
    for n in PFAIL {
        let ok = std::fs::read_to_string(d.join(format!("pfail{n}.ok"))).unwrap();
        let got = pfctl_nv(&std::fs::read_to_string(d.join(format!("pfail{n}.in"))).unwrap());
        if got != ok {
            println!(
                "pfail{n}:\n  got  {}\n  want {}",
                got.lines().next().unwrap_or(""),
                ok.lines().next().unwrap_or("")
            );
        }
    }
}

/// `XPF_PFCASE=pfail25 cargo test -p xpf-conf --test pfctl_regress -- --nocapture show_case`
/// prints what xpf gives for one case and what pfctl gives (a work aid).
#[test]
fn show_case() {
    let Some(c) = std::env::var_os("XPF_PFCASE") else { return };
    let c = c.to_string_lossy().to_string();
    Netns::new().unwrap().run(move || one_case(c));
}

fn one_case(c: String) {
    let d = dir();
    let got = pfctl_nv(&std::fs::read_to_string(d.join(format!("{c}.in"))).unwrap());
    let want = std::fs::read_to_string(d.join(format!("{c}.ok"))).unwrap();
    println!("--- xpf\n{got}--- pfctl\n{want}");
}
