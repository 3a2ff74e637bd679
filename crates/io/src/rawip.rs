//! Raw IPv4 sockets for one IP protocol (state sync's transport, IP protocol 240): bound to
//! an interface, sending to a unicast peer or a multicast group with a fixed TTL, receiving
//! datagrams with their IP header (the receiver checks the TTL).

use std::net::Ipv4Addr;
use std::time::Duration;

/// A raw IPv4 socket for one protocol, bound to one interface (pfsync's transport).
#[derive(Debug, Clone, Copy)]
pub struct Transport {
    fd: i32,
    dst: libc::sockaddr_in,
}

fn setopt<T>(fd: i32, level: i32, name: i32, v: &T) -> std::io::Result<()> {
    // SAFETY: v points to a live T of the size passed.
    let r = unsafe { libc::setsockopt(fd, level, name, v as *const T as *const libc::c_void, size_of::<T>() as u32) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Transport {
    /// A socket for IP protocol `proto` on interface `dev` (index `ifindex`), sending to
    /// `peer` or, without one, to multicast `group` (joined on `dev`), with TTL `ttl`.
    pub fn open(
        dev: &str,
        ifindex: u32,
        proto: u8,
        peer: Option<Ipv4Addr>,
        group: [u8; 4],
        ttl: u8,
    ) -> Result<Transport, String> {
        // SAFETY: plain socket(2).
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
        if fd < 0 {
            return Err(format!("raw socket (protocol {proto}): {}", std::io::Error::last_os_error()));
        }
        let e = |what: &str, r: std::io::Result<()>| r.map_err(|e| format!("raw socket {what}: {e}"));
        let mut name = [0u8; 16];
        name[..dev.len().min(15)].copy_from_slice(&dev.as_bytes()[..dev.len().min(15)]);
        e("SO_BINDTODEVICE", setopt(fd, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, &name))?;
        e("IP_TTL", setopt(fd, libc::IPPROTO_IP, libc::IP_TTL, &(ttl as i32)))?;
        e("IP_MULTICAST_TTL", setopt(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, &(ttl as i32)))?;
        e("IP_MULTICAST_LOOP", setopt(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, &0i32))?;
        // A bulk update arrives faster than one thread reads: 64 MB of buffer (as root).
        let _ = setopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(64i32 << 20));
        let _ = setopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &(16i32 << 20));
        let group_addr = u32::from_ne_bytes(group);
        let mreq = libc::ip_mreqn {
            imr_multiaddr: libc::in_addr { s_addr: group_addr },
            imr_address: libc::in_addr { s_addr: 0 },
            imr_ifindex: ifindex as i32,
        };
        e("IP_MULTICAST_IF", setopt(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &mreq))?;
        if peer.is_none() {
            e("IP_ADD_MEMBERSHIP", setopt(fd, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq))?;
        }
        let to = peer.map(|p| p.octets()).unwrap_or(group);
        let dst = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(to) },
            sin_zero: [0; 8],
        };
        Ok(Transport { fd, dst })
    }

    /// Sends one frame; false if the kernel refused it (counted by the caller).
    pub fn send(&self, frame: &[u8]) -> bool {
        loop {
            // SAFETY: frame and dst are live for the call.
            let r = unsafe {
                libc::sendto(
                    self.fd,
                    frame.as_ptr() as *const libc::c_void,
                    frame.len(),
                    0,
                    &self.dst as *const libc::sockaddr_in as *const libc::sockaddr,
                    size_of::<libc::sockaddr_in>() as u32,
                )
            };
            if r >= 0 {
                return true;
            }
            // A full socket buffer during a bulk: wait for the link rather than lose states.
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) => std::thread::sleep(Duration::from_micros(200)),
                _ => return false,
            }
        }
    }

    /// Receives one datagram (IP header included) into `buf`; None when nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: buf is live and writable for its length.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
        (n > 0).then_some(n as usize)
    }

    pub fn wait(&self, ms: i32) {
        let mut p = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
    /// Binds the socket to local address `a`: it then receives only datagrams sent to `a`
    /// (two endpoints on one loopback, in the benches).
    pub fn bind(&self, a: Ipv4Addr) -> std::io::Result<()> {
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.octets()) },
            sin_zero: [0; 8],
        };
        // SAFETY: sa is a live sockaddr_in of the size passed.
        let r = unsafe {
            libc::bind(
                self.fd,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
