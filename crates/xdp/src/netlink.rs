//! The rtnetlink requests xpf makes: attach and detach an XDP program, create and delete ifb
//! devices, ask the kernel's routes and neighbours, and have it resolve a neighbour. Each request is one message on a fresh NETLINK_ROUTE socket, answered
//! by the kernel's acknowledgement.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use xpf_wire::nlattr::attrs;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
/// XDP_FLAGS_SKB_MODE (generic XDP) and XDP_FLAGS_DRV_MODE (native).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const NDA_DST: u16 = 1;
const NTF_USE: u8 = 1;

struct Msg(Vec<u8>);

impl Msg {
    fn new(ty: u16, flags: u16) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[6..8].copy_from_slice(&(flags | libc::NLM_F_REQUEST as u16 | libc::NLM_F_ACK as u16).to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        Msg(b)
    }
    fn put(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
    fn attr(&mut self, ty: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        let mut h = len.to_ne_bytes().to_vec();
        h.extend_from_slice(&ty.to_ne_bytes());
        h.extend_from_slice(payload);
        self.put(&h);
    }
    /// Starts a nested attribute; returns its offset for `end_nest`.
    fn nest(&mut self, ty: u16) -> usize {
        let at = self.0.len();
        self.put(&[0, 0, 0, 0]);
        self.0[at + 2..at + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }
    fn end_nest(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }
    fn send(self) -> io::Result<()> {
        self.exchange().map(|_| ())
    }

    /// Sends a get request (no acknowledgement asked) and returns the answer's payload after
    /// its nlmsghdr, or the kernel's error.
    fn get(mut self) -> io::Result<Vec<u8>> {
        let flags = u16::from_ne_bytes([self.0[6], self.0[7]]) & !(libc::NLM_F_ACK as u16);
        self.0[6..8].copy_from_slice(&flags.to_ne_bytes());
        let (buf, n) = self.exchange()?;
        Ok(buf[16.min(n)..n].to_vec())
    }

    fn exchange(mut self) -> io::Result<(Vec<u8>, usize)> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        // SAFETY: plain socket calls on a descriptor we own; buffers outlive the calls.
        unsafe {
            let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            let mut sa: libc::sockaddr_nl = std::mem::zeroed();
            sa.nl_family = libc::AF_NETLINK as u16;
            let r = libc::sendto(
                fd.as_raw_fd(),
                self.0.as_ptr().cast(),
                self.0.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            );
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut buf = vec![0u8; 8192];
            let n = libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            if n < 16 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "short netlink answer"));
            }
            // struct nlmsghdr (16) then, for NLMSG_ERROR, the error code.
            let ty = u16::from_ne_bytes([buf[4], buf[5]]);
            if ty == libc::NLMSG_ERROR as u16 && n >= 20 {
                let err = i32::from_ne_bytes(buf[16..20].try_into().unwrap());
                if err != 0 {
                    return Err(io::Error::from_raw_os_error(-err));
                }
            }
            Ok((buf, n))
        }
    }
}

fn ifinfomsg(ifindex: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    m
}

/// Attaches program `prog_fd` to `ifindex` (native mode when `flags` has DRV_MODE), replacing
/// what was there. It stays attached when xpfd dies: with no socket in its map, forwardable
/// traffic is dropped, so the box fails closed.
pub fn xdp_attach(ifindex: u32, prog_fd: i32, flags: u32) -> io::Result<()> {
    let mut m = Msg::new(libc::RTM_SETLINK, 0);
    m.put(&ifinfomsg(ifindex));
    let at = m.nest(IFLA_XDP);
    m.attr(IFLA_XDP_FD, &prog_fd.to_ne_bytes());
    m.attr(IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    m.end_nest(at);
    m.send()
}

/// Removes the XDP program of `ifindex` (in the mode `flags` names).
pub fn xdp_detach(ifindex: u32, flags: u32) -> io::Result<()> {
    xdp_attach(ifindex, -1, flags)
}

/// Creates an ifb device named `name` (one of the same name, left by an earlier run, is
/// deleted first), up, without IPv6 addresses (it sends nothing); returns its index. Packet
/// mode's fast path redirects the frames it leaves to xpfd into such a device's ingress.
pub fn ifb_create(name: &str) -> io::Result<u32> {
    const IFLA_IFNAME: u16 = 3;
    const IFLA_LINKINFO: u16 = 18;
    const IFLA_INFO_KIND: u16 = 1;
    const IFLA_AF_SPEC: u16 = 26;
    const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
    const IN6_ADDR_GEN_MODE_NONE: u8 = 1;
    if let Ok(old) = ifindex(name) {
        link_delete(old)?;
    }
    let mut m = Msg::new(libc::RTM_NEWLINK, (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16);
    m.put(&ifinfomsg(0));
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    m.attr(IFLA_IFNAME, &n);
    let info = m.nest(IFLA_LINKINFO);
    m.attr(IFLA_INFO_KIND, b"ifb\0");
    m.end_nest(info);
    m.send().map_err(|e| io::Error::new(e.kind(), format!("creating ifb device {name}: {e}")))?;
    let i = ifindex(name)?;
    // No IPv6 link-local address (the kernel would send neighbour discovery from it), then up.
    let mut m = Msg::new(libc::RTM_SETLINK, 0);
    m.put(&ifi_up(i));
    let spec = m.nest(IFLA_AF_SPEC);
    let v6 = m.nest(libc::AF_INET6 as u16);
    m.attr(IFLA_INET6_ADDR_GEN_MODE, &[IN6_ADDR_GEN_MODE_NONE]);
    m.end_nest(v6);
    m.end_nest(spec);
    m.send().map_err(|e| io::Error::new(e.kind(), format!("setting ifb device {name} up: {e}")))?;
    Ok(i)
}

fn ifi_up(ifindex: u32) -> [u8; 16] {
    let mut ifi = ifinfomsg(ifindex);
    ifi[8..12].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
    ifi[12..16].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
    ifi
}

/// Deletes interface `ifindex`.
pub fn link_delete(ifindex: u32) -> io::Result<()> {
    let mut m = Msg::new(libc::RTM_DELLINK, 0);
    m.put(&ifinfomsg(ifindex));
    m.send()
}

/// Asks the kernel to resolve `addr` (4 or 16 bytes) on `ifindex` (ARP or neighbour
/// solicitation), as a packet it forwarded itself would: RTM_NEWNEIGH with NTF_USE.
pub fn neigh_resolve(ifindex: u32, addr: &[u8]) -> io::Result<()> {
    let family = if addr.len() == 4 { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let mut m = Msg::new(libc::RTM_NEWNEIGH, (libc::NLM_F_CREATE | libc::NLM_F_REPLACE) as u16);
    // struct ndmsg: family, pad1, pad2, ifindex, state, flags, type
    let mut nd = [0u8; 12];
    nd[0] = family;
    nd[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    nd[8..10].copy_from_slice(&(libc::NUD_NONE).to_ne_bytes());
    nd[10] = NTF_USE;
    m.put(&nd);
    m.attr(NDA_DST, addr);
    m.send()
}

/// What the kernel's FIB answers for a destination (`ip route get`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FibRoute {
    /// rtm_type: RTN_UNICAST (1), RTN_LOCAL (2), RTN_BROADCAST (3), RTN_MULTICAST (5), or a
    /// reject type (blackhole 6, unreachable 7, prohibit 8).
    pub kind: u8,
    pub oif: u32,
    /// The next hop: the gateway, or the destination itself when it is on link.
    pub nexthop: [u8; 16],
}

/// Asks the FIB for the route to `dst` (4 or 16 bytes), as `ip route get` does.
pub fn route_get(dst: &[u8]) -> io::Result<FibRoute> {
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    const RTA_GATEWAY: u16 = 5;
    let family = if dst.len() == 4 { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let mut m = Msg::new(libc::RTM_GETROUTE, 0);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
    let mut rt = [0u8; 12];
    rt[0] = family;
    rt[1] = (dst.len() * 8) as u8;
    m.put(&rt);
    m.attr(RTA_DST, dst);
    let a = m.get()?;
    if a.len() < 12 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short route answer"));
    }
    let mut r = FibRoute { kind: a[7], oif: 0, nexthop: [0; 16] };
    r.nexthop[..dst.len()].copy_from_slice(dst);
    for (ty, v) in attrs(&a[12..]) {
        match ty {
            RTA_OIF if v.len() == 4 => r.oif = u32::from_ne_bytes(v.try_into().unwrap()),
            RTA_GATEWAY if v.len() == dst.len() => {
                r.nexthop = [0; 16];
                r.nexthop[..v.len()].copy_from_slice(v);
            }
            _ => {}
        }
    }
    Ok(r)
}

/// The link address of neighbour `addr` (4 or 16 bytes) on `ifindex`, if the kernel holds a
/// usable one (reachable, stale, delay, probe, permanent or noarp), as `ip neigh get` asks.
pub fn neigh_get(ifindex: u32, addr: &[u8]) -> io::Result<Option<[u8; 6]>> {
    const NDA_LLADDR: u16 = 2;
    let family = if addr.len() == 4 { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let mut m = Msg::new(libc::RTM_GETNEIGH, 0);
    let mut nd = [0u8; 12];
    nd[0] = family;
    nd[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    m.put(&nd);
    m.attr(NDA_DST, addr);
    let a = match m.get() {
        Ok(a) => a,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if a.len() < 12 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short neighbour answer"));
    }
    let state = u16::from_ne_bytes([a[8], a[9]]);
    let usable = libc::NUD_REACHABLE
        | libc::NUD_STALE
        | libc::NUD_DELAY
        | libc::NUD_PROBE
        | libc::NUD_PERMANENT
        | libc::NUD_NOARP;
    if state & usable == 0 {
        return Ok(None);
    }
    let ll = attrs(&a[12..]).find(|(t, v)| *t == NDA_LLADDR && v.len() == 6).map(|(_, v)| v.try_into().unwrap());
    Ok(ll)
}

/// Runs `f` with a datagram socket and an ifreq naming interface `name` (for the SIOC*
/// ioctls, which answer for the calling thread's network namespace).
fn with_ifreq<T>(name: &str, f: impl FnOnce(i32, &mut libc::ifreq) -> io::Result<T>) -> io::Result<T> {
    if name.len() >= libc::IF_NAMESIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: name too long")));
    }
    // SAFETY: a fresh datagram socket we own; a zeroed ifreq with the name copied in.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, c) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = c as libc::c_char;
        }
        f(fd.as_raw_fd(), &mut req)
    }
}

/// Turns generic receive offload of interface `name` on or off (SIOCETHTOOL); returns whether
/// it was on. Packet mode needs it off: a tap sees GRO's merged packets, larger than the MTU.
pub fn set_gro(name: &str, on: bool) -> io::Result<bool> {
    const ETHTOOL_GGRO: u32 = 0x2b;
    const ETHTOOL_SGRO: u32 = 0x2c;
    with_ifreq(name, |fd, req| {
        let mut v = [ETHTOOL_GGRO, 0u32];
        req.ifr_ifru.ifru_data = v.as_mut_ptr().cast();
        // SAFETY: ifr_data points to a live ethtool_value for the call.
        if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::other(format!("{name}: reading GRO: {}", io::Error::last_os_error())));
        }
        let was = v[1] != 0;
        if was != on {
            v = [ETHTOOL_SGRO, on as u32];
            req.ifr_ifru.ifru_data = v.as_mut_ptr().cast();
            // SAFETY: as above.
            if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, req as *mut libc::ifreq) } < 0 {
                let what = if on { "on" } else { "off" };
                return Err(io::Error::other(format!("{name}: setting GRO {what}: {}", io::Error::last_os_error())));
            }
        }
        Ok(was)
    })
}

/// The driver of interface `name` (ETHTOOL_GDRVINFO), as `ethtool -i` names it, and its
/// number of statistics.
pub fn driver(name: &str) -> io::Result<(String, u32)> {
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    with_ifreq(name, |fd, req| {
        // struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32],
        // erom_version[32], reserved2[12], n_priv_flags, n_stats, ... (196 bytes).
        let mut d = [0u8; 196];
        d[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
        req.ifr_ifru.ifru_data = d.as_mut_ptr().cast();
        // SAFETY: ifr_data points to a live ethtool_drvinfo-sized buffer for the call.
        if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::other(format!("{name}: driver info: {}", io::Error::last_os_error())));
        }
        let drv = String::from_utf8_lossy(&d[4..36]).trim_end_matches('\0').to_string();
        Ok((drv, u32::from_ne_bytes(d[180..184].try_into().unwrap())))
    })
}

/// The sum of interface `name`'s driver statistics (`ethtool -S`) whose names end with
/// `suffix`.
pub fn ethtool_sum(name: &str, suffix: &str) -> io::Result<u64> {
    const ETHTOOL_GSTRINGS: u32 = 0x1b;
    const ETHTOOL_GSTATS: u32 = 0x1d;
    const ETH_SS_STATS: u32 = 1;
    const GSTRING_LEN: usize = 32;
    let (_, n) = driver(name)?;
    // The kernel writes as many as it has when asked, whatever length the request says: room
    // for more in case the count grew since (queues added); the first n are read.
    let (n, room) = (n as usize, n as usize + 256);
    with_ifreq(name, |fd, req| {
        let mut strings = vec![0u8; 12 + room * GSTRING_LEN];
        strings[..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
        strings[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
        strings[8..12].copy_from_slice(&(n as u32).to_ne_bytes());
        req.ifr_ifru.ifru_data = strings.as_mut_ptr().cast();
        // SAFETY: ifr_data points to an ethtool_gstrings with room for n strings.
        if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::other(format!("{name}: statistics names: {}", io::Error::last_os_error())));
        }
        let mut stats = vec![0u8; 8 + room * 8];
        stats[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
        stats[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
        req.ifr_ifru.ifru_data = stats.as_mut_ptr().cast();
        // SAFETY: ifr_data points to an ethtool_stats with room for n values.
        if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::other(format!("{name}: statistics: {}", io::Error::last_os_error())));
        }
        let mut sum = 0u64;
        for i in 0..n {
            let s = &strings[12 + i * GSTRING_LEN..12 + (i + 1) * GSTRING_LEN];
            let s = String::from_utf8_lossy(s);
            if s.trim_end_matches('\0').ends_with(suffix) {
                sum += u64::from_ne_bytes(stats[8 + i * 8..16 + i * 8].try_into().unwrap());
            }
        }
        Ok(sum)
    })
}

/// The MTU of interface `name`.
pub fn mtu(name: &str) -> io::Result<u32> {
    with_ifreq(name, |fd, req| {
        // SAFETY: SIOCGIFMTU fills ifr_mtu of the ifreq passed.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name}: {}", io::Error::last_os_error())));
        }
        // SAFETY: the kernel wrote the mtu member.
        Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
    })
}

/// The index of interface `name` in this network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface named {name}")))
    } else {
        Ok(i)
    }
}

/// The name of interface `ifindex`.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as the call requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    Some(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// The hardware address of interface `name` (asked with SIOCGIFHWADDR, so that it answers
/// for the calling thread's network namespace, which /sys may not show).
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    with_ifreq(name, |fd, req| {
        // SAFETY: SIOCGIFHWADDR fills ifr_hwaddr of the ifreq passed.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name}: {}", io::Error::last_os_error())));
        }
        // SAFETY: the kernel wrote the hwaddr member.
        let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
        let mut m = [0u8; 6];
        for (d, c) in m.iter_mut().zip(sa.sa_data.iter()) {
            *d = *c as u8;
        }
        Ok(m)
    })
}

/// Receive queues of interface `name` (one AF_XDP socket and one worker each).
pub fn rx_queues(name: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
        .unwrap_or(1)
        .max(1)
}
