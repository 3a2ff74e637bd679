//! Turns capture records into Ethernet frames for the engine, whatever their link type.

use crate::pcap::*;

/// Why a record could not be turned into a frame (counted by the caller, never a panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A link type xpf does not read.
    LinkType(u32),
    /// The link header itself is cut short.
    ShortLinkHeader,
    /// A link-layer protocol that is not IP (PPP LCP, ...).
    NotIp,
}

/// Writes an Ethernet frame for `r` into `out` (cleared first).
pub fn to_ether(r: &Record, out: &mut Vec<u8>) -> Result<(), Skip> {
    out.clear();
    let (ethertype, payload): (u16, &[u8]) = match r.linktype {
        LINKTYPE_ETHERNET => {
            out.extend_from_slice(r.data);
            return Ok(());
        }
        LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => match r.data.first().map(|b| b >> 4) {
            Some(6) => (0x86dd, r.data),
            _ => (0x0800, r.data),
        },
        LINKTYPE_LINUX_SLL => {
            let h = r.data.get(..16).ok_or(Skip::ShortLinkHeader)?;
            (u16::from_be_bytes([h[14], h[15]]), &r.data[16..])
        }
        LINKTYPE_NULL | LINKTYPE_LOOP => {
            let h = r.data.get(..4).ok_or(Skip::ShortLinkHeader)?;
            // The address family, in the capturing host's byte order: 2 is AF_INET; the
            // various AF_INET6 values are 10 (Linux), 24, 28, 30 (BSDs).
            let af = if h[0] != 0 { h[0] } else { h[3] };
            (if af == 2 { 0x0800 } else { 0x86dd }, &r.data[4..])
        }
        LINKTYPE_PPP => {
            let d = if r.data.starts_with(&[0xff, 0x03]) { &r.data[2..] } else { r.data };
            let h = d.get(..2).ok_or(Skip::ShortLinkHeader)?;
            match u16::from_be_bytes([h[0], h[1]]) {
                0x0021 => (0x0800, &d[2..]),
                0x0057 => (0x86dd, &d[2..]),
                0x0281 | 0x0283 => (0x8847, &d[2..]), // MPLS: passed to the parser as such
                _ => return Err(Skip::NotIp),
            }
        }
        other => return Err(Skip::LinkType(other)),
    };
    out.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]);
    out.extend_from_slice(&ethertype.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}
