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
        if n == name {
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
