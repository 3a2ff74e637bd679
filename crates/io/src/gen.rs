//! In-memory traffic generator: 60-byte Ethernet/IPv4/UDP frames (64 on the wire with the FCS)
//! over source x destination address and port ranges, stepped the way netmap's pkt-gen steps
//! them (`-s 198.18.10.1:2000-198.18.10.70 -d 198.19.10.1:2000-198.19.10.70` is 70 x 70 =
//! 4,900 flows): source port fastest, then source address, destination port, destination
//! address.

use std::fmt;
use std::net::Ipv4Addr;
use xpf_wire::{checksum, ipv4, tcp, udp};

pub const FRAME_LEN: usize = 60;

/// An address and port range, `A[:P]-B[:Q]` or `A[:P]` as pkt-gen writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub ip_lo: u32,
    pub ip_hi: u32,
    pub port_lo: u16,
    pub port_hi: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeError(pub String);

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for RangeError {}

impl Range {
    pub fn parse(s: &str) -> Result<Range, RangeError> {
        let bad = |why: &str| RangeError(format!("bad range '{s}': {why}"));
        let end = |e: &str| -> Result<(u32, Option<u16>), RangeError> {
            let (ip, port) = match e.split_once(':') {
                Some((i, p)) => (i, Some(p.parse::<u16>().map_err(|_| bad("port is not a number 0-65535"))?)),
                None => (e, None),
            };
            let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
            Ok((u32::from(ip), port))
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (end(a)?, end(b)?),
            None => {
                let e = end(s)?;
                (e, e)
            }
        };
        let port_lo = lo.1.unwrap_or(2000);
        let r = Range { ip_lo: lo.0, ip_hi: hi.0, port_lo, port_hi: hi.1.or(lo.1).unwrap_or(port_lo) };
        if r.ip_hi < r.ip_lo || r.port_hi < r.port_lo {
            return Err(bad("the end is below the start"));
        }
        Ok(r)
    }
    pub fn ips(&self) -> u64 {
        (self.ip_hi - self.ip_lo) as u64 + 1
    }
    pub fn ports(&self) -> u64 {
        (self.port_hi - self.port_lo) as u64 + 1
    }
    pub fn count(&self) -> u64 {
        self.ips() * self.ports()
    }
}

/// A flow: (source address, source port, destination address, destination port).
pub type Flow = (u32, u16, u32, u16);

#[derive(Debug, Clone)]
pub struct Gen {
    pub src: Range,
    pub dst: Range,
    tmpl: [u8; FRAME_LEN],
    flows: u64,
    next: u64,
}

impl Gen {
    pub fn new(src: Range, dst: Range) -> Gen {
        let mut t = [0u8; FRAME_LEN];
        t[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        t[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        t[12..14].copy_from_slice(&[0x08, 0x00]);
        ipv4::emit_header(&mut t[14..], [0; 4], [0; 4], 17, (FRAME_LEN - 14) as u16, 64, 0);
        udp::emit_header(&mut t[34..], 0, 0, (FRAME_LEN - 34) as u16);
        Gen { src, dst, tmpl: t, flows: src.count() * dst.count(), next: 0 }
    }

    /// The same flows as TCP segments (20-byte header, padded to 60 bytes), with `SYN` set so
    /// that a keep-state rule creates their states; see [`Gen::established`].
    pub fn tcp(mut self) -> Gen {
        let t = &mut self.tmpl;
        ipv4::emit_header(&mut t[14..], [0; 4], [0; 4], 6, 40, 64, 0);
        t[34..54].fill(0);
        t[46] = 0x50;
        t[47] = tcp::SYN;
        t[48..50].copy_from_slice(&65535u16.to_be_bytes());
        t[54..].fill(0);
        self
    }

    /// For TCP flows, switches the segments to bare ACKs (the traffic of established
    /// connections); nothing for UDP.
    pub fn established(&mut self) {
        if self.tmpl[23] == 6 {
            self.tmpl[47] = tcp::ACK;
        }
    }

    /// N flows from 198.18.0.0 to 198.19.0.0 (RFC 2544's benchmark range), port 2000 to 2000,
    /// as A sources x B destinations with A the largest divisor of N not above its square root.
    pub fn for_flows(n: u64) -> Gen {
        assert!((1..=1 << 32).contains(&n), "flows must be 1..2^32");
        let mut a = (n as f64).sqrt() as u64;
        while a > 1 && !n.is_multiple_of(a) {
            a -= 1;
        }
        let b = n / a;
        assert!(a <= 65536 && b <= 65536, "{n} flows do not fit 198.18/16 x 198.19/16");
        let base_s = u32::from(Ipv4Addr::new(198, 18, 0, 0));
        let base_d = u32::from(Ipv4Addr::new(198, 19, 0, 0));
        Gen::new(
            Range { ip_lo: base_s, ip_hi: base_s + (a - 1) as u32, port_lo: 2000, port_hi: 2000 },
            Range { ip_lo: base_d, ip_hi: base_d + (b - 1) as u32, port_lo: 2000, port_hi: 2000 },
        )
    }

    pub fn flows(&self) -> u64 {
        self.flows
    }

    /// Flow number `i` (mod the number of flows), in pkt-gen's order.
    #[inline]
    pub fn flow(&self, i: u64) -> Flow {
        let mut i = i % self.flows;
        let sp = (i % self.src.ports()) as u16;
        i /= self.src.ports();
        let sa = (i % self.src.ips()) as u32;
        i /= self.src.ips();
        let dp = (i % self.dst.ports()) as u16;
        i /= self.dst.ports();
        let da = i as u32;
        (self.src.ip_lo + sa, self.src.port_lo + sp, self.dst.ip_lo + da, self.dst.port_lo + dp)
    }

    /// Writes the frame of flow `i` into `buf`.
    #[inline]
    pub fn write(&self, i: u64, buf: &mut [u8; FRAME_LEN]) {
        let (sa, sp, da, dp) = self.flow(i);
        *buf = self.tmpl;
        buf[26..30].copy_from_slice(&sa.to_be_bytes());
        buf[30..34].copy_from_slice(&da.to_be_bytes());
        let c = checksum::update32(checksum::update32(u16::from_be_bytes([buf[24], buf[25]]), 0, sa), 0, da);
        buf[24..26].copy_from_slice(&c.to_be_bytes());
        buf[34..36].copy_from_slice(&sp.to_be_bytes());
        buf[36..38].copy_from_slice(&dp.to_be_bytes());
    }

    /// Fills `bufs` with the next flows in order, wrapping around.
    #[inline]
    pub fn fill(&mut self, bufs: &mut [[u8; FRAME_LEN]]) {
        for b in bufs {
            self.write(self.next, b);
            self.next += 1;
            if self.next == self.flows {
                self.next = 0;
            }
        }
    }

    /// Restarts at flow `i`.
    pub fn seek(&mut self, i: u64) {
        self.next = i % self.flows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpf_wire::{parse_ether, PDesc};

    #[test]
    fn pkt_gen_example_is_4900_flows() {
        let g = Gen::new(
            Range::parse("198.18.10.1:2000-198.18.10.70").unwrap(),
            Range::parse("198.19.10.1:2000-198.19.10.70").unwrap(),
        );
        assert_eq!(g.flows(), 4900);
        assert_eq!(
            g.flow(0),
            (u32::from(Ipv4Addr::new(198, 18, 10, 1)), 2000, u32::from(Ipv4Addr::new(198, 19, 10, 1)), 2000)
        );
        assert_eq!(g.flow(1).0, u32::from(Ipv4Addr::new(198, 18, 10, 2)));
        assert_eq!(g.flow(70).2, u32::from(Ipv4Addr::new(198, 19, 10, 2)));
        assert_eq!(g.flow(4900), g.flow(0));
    }

    #[test]
    fn frames_parse_and_are_distinct() {
        let mut g = Gen::for_flows(9800);
        assert_eq!(g.flows(), 9800);
        let mut bufs = vec![[0u8; FRAME_LEN]; 9800];
        g.fill(&mut bufs);
        let mut seen = std::collections::HashSet::new();
        for b in &bufs {
            let mut pd = PDesc::default();
            parse_ether(b, &mut pd).unwrap();
            assert!(seen.insert((pd.src, pd.dst, pd.sport, pd.dport)));
        }
    }

    #[test]
    fn tcp_flows_start_with_syn_then_ack() {
        let mut g = Gen::for_flows(4).tcp();
        let mut b = [0u8; FRAME_LEN];
        g.write(1, &mut b);
        let mut pd = PDesc::default();
        parse_ether(&b, &mut pd).unwrap();
        assert_eq!((pd.proto, pd.tcp_flags, pd.ip_len, pd.sport), (6, tcp::SYN, 40, 2000));
        g.established();
        g.write(1, &mut b);
        parse_ether(&b, &mut pd).unwrap();
        assert_eq!(pd.tcp_flags, tcp::ACK);
    }

    #[test]
    fn range_errors_name_the_value() {
        assert!(Range::parse("198.18.10.9-198.18.10.1").unwrap_err().0.contains("198.18.10.9-198.18.10.1"));
        assert!(Range::parse("1.2.3.4:99999").is_err());
        assert!(Range::parse("nonsense").is_err());
        let r = Range::parse("10.0.0.1:1000-10.0.0.1:1009").unwrap();
        assert_eq!(r.count(), 10);
    }
}
