//! The addresses of the machine's interfaces, for pf.conf's `ifname`, `ifname:network`,
//! `:broadcast`, `:peer` and `:0` (the first address only). Read with getifaddrs, in the
//! namespace the caller runs in; IPv6 addresses are listed before IPv4 ones, as OpenBSD's
//! getifaddrs lists them (pfctl's printed order follows), each family in address order.

use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub addr: IpAddr,
    pub prefix: u8,
    /// The broadcast address (IPv4) or the peer of a point-to-point link.
    pub dst: Option<IpAddr>,
    pub point_to_point: bool,
}

fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: getifaddrs gives valid sockaddrs of the family they declare.
    unsafe {
        match (*sa).sa_family as i32 {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(IpAddr::from(s.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

fn prefix_of(m: Option<IpAddr>) -> u8 {
    match m {
        Some(IpAddr::V4(v)) => u32::from(v).count_ones() as u8,
        Some(IpAddr::V6(v)) => u128::from(v).count_ones() as u8,
        None => 0,
    }
}

/// Addresses of interface `name`, IPv6 first; None if there is no such interface.
pub fn addresses(name: &str) -> Option<Vec<IfAddr>> {
    collect(Some(name))
}

/// The addresses of interface `name`, or of every interface (None).
fn collect(name: Option<&str>) -> Option<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let (mut v4, mut v6, mut found) = (Vec::new(), Vec::new(), false);
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let ifa = unsafe { &*p };
        let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if name.is_none_or(|name| n == name) {
            found = true;
            if let Some(addr) = sockaddr_ip(ifa.ifa_addr) {
                let p2p = ifa.ifa_flags & libc::IFF_POINTOPOINT as u32 != 0;
                let a = IfAddr {
                    addr,
                    prefix: prefix_of(sockaddr_ip(ifa.ifa_netmask)),
                    dst: sockaddr_ip(ifa.ifa_ifu),
                    point_to_point: p2p,
                };
                if addr.is_ipv4() {
                    v4.push(a);
                } else {
                    v6.push(a);
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    if !found {
        return None;
    }
    // Linux lists an interface's IPv6 addresses newest first; sorting makes the order the same
    // whatever order they were configured in (::1 before fe80::1, as OpenBSD lists lo0).
    v6.sort_by_key(|a| a.addr);
    v4.sort_by_key(|a| a.addr);
    v6.extend(v4);
    Some(v6)
}

/// The addresses of every interface (pf's `self`), IPv6 first.
pub fn all() -> Vec<IfAddr> {
    collect(None).unwrap_or_default()
}

/// The addresses `(ifname[:modifier])[/prefix]` stands for now, as networks (address, prefix
/// length): the interface's addresses, or with `network` their networks, `broadcast` their
/// broadcast addresses, `peer` the far ends of a point-to-point link, `0` the first address of
/// each family (no aliases). Empty when the interface has none (or does not exist): pf's
/// dynamic address then matches nothing until one appears. A group stands for its members'.
pub fn dynamic(ifname: &str, modifier: Option<&str>, prefix: Option<u8>) -> Vec<(IpAddr, u8)> {
    let each = if ifname == "self" { vec![all()] } else { addresses_each(ifname).unwrap_or_default() };
    let host = |a: &IpAddr| if a.is_ipv4() { 32 } else { 128 };
    let mut out = Vec::new();
    // `:0` is each member's first address of a family, as pf takes a group's members one by one.
    for addrs in &each {
        let mut seen_family = [false, false];
        for a in addrs {
            let fam = a.addr.is_ipv6() as usize;
            let e = match modifier {
                Some("network") => Some((a.addr, a.prefix)),
                Some("broadcast") => a.dst.filter(|_| !a.point_to_point && a.addr.is_ipv4()).map(|d| (d, host(&d))),
                Some("peer") => a.dst.filter(|_| a.point_to_point).map(|d| (d, host(&d))),
                Some("0") if seen_family[fam] => None,
                _ => Some((a.addr, host(&a.addr))),
            };
            seen_family[fam] = true;
            if let Some((addr, l)) = e {
                let l = prefix.map_or(l, |p| p.min(host(&addr)));
                out.push((addr, l));
            }
        }
    }
    out
}

/// The addresses of each interface `name` stands for: the interface's, or each member's of a
/// group of that name (crate::ifgroup); None when it is neither.
pub fn addresses_each(name: &str) -> Option<Vec<Vec<IfAddr>>> {
    if let Some(a) = addresses(name) {
        return Some(vec![a]);
    }
    Some(crate::ifgroup::interfaces(name)?.iter().filter_map(|m| addresses(m)).collect())
}

/// Whether interface `name` is a loopback interface (None: no such interface).
pub fn is_loopback(name: &str) -> Option<bool> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy() == name {
            found = Some(ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0);
            break;
        }
        p = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// A hash of every interface's name, addresses and prefixes: it changes when an address that
/// `self` or `(if)` may stand for comes, goes or moves (xpfd compiles the ruleset again then).
pub fn fingerprint() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return 0;
    }
    let mut rows = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if let Some(a) = sockaddr_ip(ifa.ifa_addr) {
            let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            rows.push((n, a, prefix_of(sockaddr_ip(ifa.ifa_netmask)), sockaddr_ip(ifa.ifa_ifu)));
        }
        p = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    rows.sort();
    rows.hash(&mut h);
    h.finish()
}
