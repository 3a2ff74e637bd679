//! The kernel's routes, for pf.conf's `no-route` and `urpf-failed` (pf_routable): read with
//! one rtnetlink dump (RTM_GETROUTE, NLM_F_DUMP) of the main and local tables, in the
//! namespace the caller runs in. A ruleset that uses either is compiled against this snapshot
//! and compiled again when it changes (xpfd looks once a second), as `self` follows the
//! interfaces' addresses. Policy routing (`ip rule`) and other tables are not consulted.
//!
//! Hand-written, as the rest of xpf's rtnetlink (crates/xdp/src/netlink.rs): one request and
//! five attributes; the crates that parse every rtnetlink message change their API often.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use xpf_wire::nlattr::attrs;

/// One route: its prefix, whether it rejects (blackhole, unreachable, prohibit, throw: no
/// route, for pf), and the interfaces it leads out of (several for a multipath route).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub addr: IpAddr,
    pub len: u8,
    pub reject: bool,
    pub oifs: Vec<u32>,
}

/// A snapshot of the routes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Fib {
    pub routes: Vec<Route>,
}

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u32 = 254;
const RT_TABLE_LOCAL: u32 = 255;
// rtm_type values that carry no traffic.
const RTN_BLACKHOLE: u8 = 6;
const RTN_UNREACHABLE: u8 = 7;
const RTN_PROHIBIT: u8 = 8;
const RTN_THROW: u8 = 9;

/// One RTM_NEWROUTE message (after its nlmsghdr): the route, if it is in the main or the local
/// table and of IPv4 or IPv6.
fn route_of(m: &[u8]) -> Option<Route> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
    if m.len() < 12 {
        return None;
    }
    let (family, len, kind) = (m[0] as i32, m[1], m[7]);
    let mut table = m[4] as u32;
    let mut dst = None;
    let mut oifs = Vec::new();
    for (ty, v) in attrs(&m[12..]) {
        match ty {
            RTA_DST => dst = Some(v.to_vec()),
            RTA_OIF if v.len() == 4 => oifs.push(u32::from_ne_bytes(v.try_into().ok()?)),
            RTA_TABLE if v.len() == 4 => table = u32::from_ne_bytes(v.try_into().ok()?),
            RTA_MULTIPATH => {
                // struct rtnexthop: len u16, flags u8, hops u8, ifindex i32, then attributes.
                let mut n = v;
                while n.len() >= 8 {
                    let l = (u16::from_ne_bytes([n[0], n[1]]) as usize).max(8);
                    oifs.push(u32::from_ne_bytes(n[4..8].try_into().ok()?));
                    n = &n[l.next_multiple_of(4).min(n.len())..];
                }
            }
            _ => {}
        }
    }
    if table != RT_TABLE_MAIN && table != RT_TABLE_LOCAL {
        return None;
    }
    let addr = match (family, dst) {
        (libc::AF_INET, None) => IpAddr::from([0u8; 4]),
        (libc::AF_INET6, None) => IpAddr::from([0u8; 16]),
        (libc::AF_INET, Some(d)) if d.len() == 4 => IpAddr::from(<[u8; 4]>::try_from(&d[..]).ok()?),
        (libc::AF_INET6, Some(d)) if d.len() == 16 => IpAddr::from(<[u8; 16]>::try_from(&d[..]).ok()?),
        _ => return None,
    };
    let reject = matches!(kind, RTN_BLACKHOLE | RTN_UNREACHABLE | RTN_PROHIBIT | RTN_THROW);
    Some(Route { addr, len, reject, oifs })
}

/// Every message of one rtnetlink dump of `ty` (RTM_GETROUTE, RTM_GETLINK) of both families,
/// each after its nlmsghdr: `head` is the size of the request's family header (rtmsg 12,
/// ifinfomsg 16), all zero but for the family (AF_UNSPEC).
pub(crate) fn dump(ty: u16, head: usize) -> io::Result<Vec<Vec<u8>>> {
    // The answers are RTM_NEWROUTE, RTM_NEWLINK: two below the request.
    let reply = ty - 2;
    let mut out = Vec::new();
    // SAFETY: plain socket calls on a descriptor we own; buffers outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let len = 16 + head;
        let mut req = vec![0u8; len];
        req[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&ty.to_ne_bytes());
        req[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
        req[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        let sl = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        if libc::sendto(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0, (&sa as *const libc::sockaddr_nl).cast(), sl)
            < 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut b = &buf[..n as usize];
            while b.len() >= 16 {
                let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
                let t = u16::from_ne_bytes([b[4], b[5]]);
                if len < 16 || len > b.len() {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "bad netlink message in a dump"));
                }
                match t as i32 {
                    libc::NLMSG_DONE => return Ok(out),
                    libc::NLMSG_ERROR => {
                        let err = i32::from_ne_bytes(b[16..20].try_into().unwrap_or([0; 4]));
                        return Err(io::Error::from_raw_os_error(-err));
                    }
                    _ if t == reply => out.push(b[16..len].to_vec()),
                    _ => {}
                }
                b = &b[len.next_multiple_of(4).min(b.len())..];
            }
        }
    }
}

impl Fib {
    /// The kernel's routes now.
    pub fn kernel() -> io::Result<Fib> {
        let routes = dump(libc::RTM_GETROUTE, 12)?.iter().filter_map(|m| route_of(m)).collect();
        Ok(Fib { routes })
    }

    /// A hash of the routes, to see whether they changed.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    /// The interfaces routes lead out of.
    pub fn interfaces(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.routes.iter().flat_map(|r| r.oifs.iter().copied()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_routes_are_read() {
        // Every Linux namespace has loopback's local routes; a dump that fails or finds none
        // is a broken reader.
        let f = Fib::kernel().expect("route dump");
        assert!(f.routes.iter().any(|r| r.addr == IpAddr::from([127, 0, 0, 1]) && r.len == 32 && !r.reject), "{f:?}");
    }

    #[test]
    fn a_multipath_route_lists_every_interface() {
        // rtmsg (AF_INET, /16, main, unicast), RTA_DST 10.109.0.0, RTA_MULTIPATH with two
        // next hops out of interfaces 17 and 18.
        let mut m = vec![2, 16, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        m.extend_from_slice(&[8, 0, 1, 0, 10, 109, 0, 0]);
        m.extend_from_slice(&[20, 0, 9, 0]);
        m.extend_from_slice(&[8, 0, 0, 0, 17, 0, 0, 0]);
        m.extend_from_slice(&[8, 0, 0, 0, 18, 0, 0, 0]);
        let r = route_of(&m).unwrap();
        assert_eq!((r.addr, r.len, r.reject, r.oifs), (IpAddr::from([10, 109, 0, 0]), 16, false, vec![17, 18]));
        // A blackhole route rejects; another table is not read.
        let mut b = vec![2, 24, 0, 0, 254, 3, 0, RTN_BLACKHOLE, 0, 0, 0, 0];
        b.extend_from_slice(&[8, 0, 1, 0, 192, 0, 2, 0]);
        assert!(route_of(&b).unwrap().reject);
        let mut o = vec![2, 24, 0, 0, 100, 3, 0, 1, 0, 0, 0, 0];
        o.extend_from_slice(&[8, 0, 1, 0, 192, 0, 2, 0]);
        assert_eq!(route_of(&o), None);
    }
}
