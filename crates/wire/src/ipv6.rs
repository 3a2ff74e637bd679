//! IPv6 (RFC 8200): the fixed header and a bounded walk over extension headers.

use crate::{Error, Options};

pub const HEADER_LEN: usize = 40;

pub const NH_HOPOPTS: u8 = 0;
pub const NH_ROUTING: u8 = 43;
pub const NH_FRAGMENT: u8 = 44;
pub const NH_ESP: u8 = 50;
pub const NH_AH: u8 = 51;
pub const NH_NONE: u8 = 59;
pub const NH_DSTOPTS: u8 = 60;

/// At most this many extension headers are walked; a longer chain is dropped (a chain of
/// thousands of tiny headers is a known way to exhaust a parser, RFC 7112).
pub const MAX_EXT_HEADERS: usize = 10;

/// A view over an IPv6 packet. `new_checked` guarantees version 6, the 40-byte header, and a
/// payload length that fits the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        Self::header_fits(b)?;
        let plen = u16::from_be_bytes([b[4], b[5]]) as usize;
        // A zero payload length means a jumbogram (RFC 2675); unsupported, like pf.
        if plen == 0 {
            return Err(Error::BadLength);
        }
        if HEADER_LEN + plen > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }

    /// A view over a fixed header whose payload may exceed `buf` (a segment being built from
    /// a larger packet's headers); [`Packet::set_payload_len`] next.
    #[inline]
    pub(crate) fn new_header(buf: T) -> Result<Self, Error> {
        Self::header_fits(buf.as_ref())?;
        Ok(Packet { buf })
    }

    /// Version 6 and a whole fixed header in `b`.
    #[inline]
    pub(crate) fn header_fits(b: &[u8]) -> Result<(), Error> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(Error::BadVersion);
        }
        Ok(())
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        (b[0] << 4) | (b[1] >> 4)
    }
    #[inline]
    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[1] & 0x0f, b[2], b[3]])
    }
    #[inline]
    pub fn payload_len(&self) -> usize {
        u16::from_be_bytes([self.b()[4], self.b()[5]]) as usize
    }
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }
    #[inline]
    pub fn src(&self) -> [u8; 16] {
        self.b()[8..24].try_into().unwrap()
    }
    #[inline]
    pub fn dst(&self) -> [u8; 16] {
        self.b()[24..40].try_into().unwrap()
    }
    /// The bytes after the fixed header up to the payload length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len()]
    }

    /// Walks the extension headers, bounded by [`MAX_EXT_HEADERS`].
    pub fn walk(&self) -> Result<ExtInfo, Error> {
        walk(self.next_header(), self.payload())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    pub fn dec_hop_limit(&mut self) {
        let b = self.buf.as_mut();
        b[7] = b[7].wrapping_sub(1);
    }
    #[inline]
    pub fn set_src(&mut self, a: [u8; 16]) {
        self.buf.as_mut()[8..24].copy_from_slice(&a);
    }
    #[inline]
    pub fn set_payload_len(&mut self, n: u16) {
        self.buf.as_mut()[4..6].copy_from_slice(&n.to_be_bytes());
    }
    #[inline]
    pub fn set_dst(&mut self, a: [u8; 16]) {
        self.buf.as_mut()[24..40].copy_from_slice(&a);
    }
}

/// What the extension-header walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtInfo {
    /// The upper-layer protocol (or the header where the walk stopped: ESP, no-next-header,
    /// or the protocol after a non-first fragment).
    pub proto: u8,
    /// Offset of the upper-layer header from the start of the IPv6 payload.
    pub offset: usize,
    /// Extension headers seen.
    pub count: u8,
    /// A fragment header was present.
    pub fragment: Option<FragInfo>,
    /// A routing header of type 0 (deprecated by RFC 5095) was present.
    pub rh0: bool,
    /// Hop-by-hop options appeared somewhere other than first (RFC 8200 section 4.1).
    pub misplaced_hbh: bool,
    /// A routing header (of any type) was present.
    pub routing: bool,
    /// The options the hop-by-hop header carried; a routing or destination options header
    /// counts as other (authentication and fragment headers are not options).
    pub options: Options,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragInfo {
    /// Offset in bytes.
    pub offset: u16,
    pub more: bool,
    pub ident: u32,
    /// Where the fragment header starts, from the start of the payload (what reassembly
    /// removes), and where the byte naming it is, from the start of the IPv6 header (6: the
    /// fixed header's next-header field; else the first byte of the header before it).
    pub hdr: u16,
    pub named_at: u16,
    /// The header after the fragment header.
    pub next: u8,
}

/// Walks extension headers starting with `next` over `payload` (the bytes after the fixed header).
pub fn walk(mut next: u8, payload: &[u8]) -> Result<ExtInfo, Error> {
    let mut info = ExtInfo::default();
    let mut off = 0usize;
    let mut named_at = 6usize;
    loop {
        match next {
            NH_HOPOPTS | NH_ROUTING | NH_DSTOPTS | NH_AH => {
                if info.count as usize >= MAX_EXT_HEADERS {
                    return Err(Error::TooManyHeaders);
                }
                if next == NH_HOPOPTS && info.count != 0 {
                    info.misplaced_hbh = true;
                }
                let h = payload.get(off..off + 2).ok_or(Error::Truncated)?;
                let len = if next == NH_AH { (h[1] as usize + 2) * 4 } else { (h[1] as usize + 1) * 8 };
                if off + len > payload.len() {
                    return Err(Error::Truncated);
                }
                match next {
                    NH_ROUTING => {
                        info.routing = true;
                        info.rh0 |= payload[off + 2] == 0;
                        info.options.other = true;
                    }
                    NH_DSTOPTS => info.options.other = true,
                    NH_HOPOPTS => hop_by_hop(&payload[off + 2..off + len], &mut info.options)?,
                    _ => {}
                }
                next = h[0];
                named_at = HEADER_LEN + off;
                off += len;
                info.count += 1;
            }
            NH_FRAGMENT => {
                if info.count as usize >= MAX_EXT_HEADERS {
                    return Err(Error::TooManyHeaders);
                }
                if info.fragment.is_some() {
                    return Err(Error::BadHeader);
                }
                let h = payload.get(off..off + 8).ok_or(Error::Truncated)?;
                let fo = u16::from_be_bytes([h[2], h[3]]);
                let frag = FragInfo {
                    offset: fo & 0xfff8,
                    more: fo & 1 != 0,
                    ident: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                    hdr: off as u16,
                    named_at: named_at as u16,
                    next: h[0],
                };
                info.fragment = Some(frag);
                info.count += 1;
                next = h[0];
                off += 8;
                if frag.offset != 0 {
                    // The rest of the chain is in the first fragment.
                    break;
                }
            }
            _ => break,
        }
    }
    info.proto = next;
    info.offset = off;
    Ok(info)
}

/// Hop-by-hop option types (RFC 8200 section 4.2, RFC 2711).
pub const OPT_PAD1: u8 = 0;
pub const OPT_PADN: u8 = 1;
pub const OPT_ROUTER_ALERT: u8 = 5;

/// Walks a hop-by-hop header's options (the bytes after its first two), checking every
/// length. A jumbo payload (type 0xc2) counts as other: no link xpf runs on carries one.
fn hop_by_hop(mut o: &[u8], found: &mut Options) -> Result<(), Error> {
    let before = *found;
    while let Some(&kind) = o.first() {
        if kind == OPT_PAD1 {
            o = &o[1..];
            continue;
        }
        let len = 2 + *o.get(1).ok_or(Error::BadOption)? as usize;
        if len > o.len() {
            return Err(Error::BadOption);
        }
        match kind {
            OPT_PADN => {}
            OPT_ROUTER_ALERT => found.router_alert = true,
            _ => found.other = true,
        }
        o = &o[len..];
    }
    // A header of padding only is suspect, as pf has it: counted as other.
    if *found == before {
        found.other = true;
    }
    Ok(())
}

/// Writes a 40-byte IPv6 header (traffic class and flow label 0) into `buf[..40]`.
pub fn emit_header(buf: &mut [u8], src: &[u8; 16], dst: &[u8; 16], next: u8, payload_len: u16, hop_limit: u8) {
    buf[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    buf[4..6].copy_from_slice(&payload_len.to_be_bytes());
    buf[6] = next;
    buf[7] = hop_limit;
    buf[8..24].copy_from_slice(src);
    buf[24..40].copy_from_slice(dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0x60, 0x00, 0x00, 0x00];
        v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        v.push(next);
        v.push(64);
        v.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        v.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn fixed_header_fields() {
        let v = header(17, &[0; 8]);
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(p.next_header(), 17);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.payload_len(), 8);
        assert_eq!(p.src()[15], 1);
        assert_eq!(p.dst()[15], 2);
        assert_eq!(p.walk().unwrap(), ExtInfo { proto: 17, ..Default::default() });
    }

    #[test]
    fn rejects_bad_version_length_and_jumbo() {
        let mut v = header(17, &[0; 8]);
        v[0] = 0x40;
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadVersion);
        let v = header(17, &[0; 8]);
        assert_eq!(Packet::new_checked(&v[..v.len() - 1]).unwrap_err(), Error::Truncated);
        let mut v = header(17, &[0; 8]);
        v[4] = 0;
        v[5] = 0;
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadLength);
    }

    #[test]
    fn walks_hbh_dstopts_fragment() {
        let mut pl = vec![NH_DSTOPTS, 0, 1, 4, 0, 0, 0, 0]; // HBH -> dstopts, PadN
        pl.extend_from_slice(&[NH_FRAGMENT, 0, 1, 4, 0, 0, 0, 0]); // dstopts -> frag
        pl.extend_from_slice(&[6, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef]); // frag off 0, M
        pl.extend_from_slice(&[0; 20]);
        let v = header(NH_HOPOPTS, &pl);
        let info = Packet::new_checked(&v[..]).unwrap().walk().unwrap();
        assert_eq!(info.proto, 6);
        assert_eq!(info.offset, 24);
        assert_eq!(info.count, 3);
        // The fragment header is at 16 in the payload, named by the dstopts header at 40 + 8.
        let f = FragInfo { offset: 0, more: true, ident: 0xdeadbeef, hdr: 16, named_at: 48, next: 6 };
        assert_eq!(info.fragment, Some(f));
    }

    #[test]
    fn hop_by_hop_options_are_told_apart() {
        let opts = |hbh: [u8; 6]| {
            let mut pl = vec![58, 0];
            pl.extend_from_slice(&hbh);
            walk(NH_HOPOPTS, &pl).map(|i| i.options)
        };
        let (ra, other) = (Options { router_alert: true, other: false }, Options { router_alert: false, other: true });
        // A router alert (MLD), then PadN of none.
        assert_eq!(opts([OPT_ROUTER_ALERT, 2, 0, 0, OPT_PADN, 0]), Ok(ra));
        // Pad1s around it.
        assert_eq!(opts([OPT_PAD1, OPT_ROUTER_ALERT, 2, 0, 0, OPT_PAD1]), Ok(ra));
        // Padding only; an unknown option; a jumbo payload.
        assert_eq!(opts([OPT_PADN, 4, 0, 0, 0, 0]), Ok(other));
        assert_eq!(opts([0x1e, 4, 0, 0, 0, 0]), Ok(other));
        assert_eq!(opts([0xc2, 4, 0, 1, 0, 0]), Ok(other));
        // An option running past its header.
        assert_eq!(opts([OPT_ROUTER_ALERT, 5, 0, 0, 0, 0]), Err(Error::BadOption));
        assert_eq!(opts([OPT_PAD1, OPT_PAD1, OPT_PAD1, OPT_PAD1, OPT_PAD1, OPT_PADN]), Err(Error::BadOption));
        // Destination options and routing headers are other; an authentication header is not.
        assert_eq!(walk(NH_DSTOPTS, &[17, 0, OPT_PADN, 4, 0, 0, 0, 0]).unwrap().options, other);
        assert_eq!(walk(NH_ROUTING, &[17, 0, 4, 0, 0, 0, 0, 0]).unwrap().options, other);
        assert_eq!(walk(NH_AH, &[17, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap().options, Options::default());
    }

    #[test]
    fn stops_at_non_first_fragment() {
        let pl = [17, 0, 0x00, 0x10, 0, 0, 0, 1, 9, 9, 9, 9];
        let info = walk(NH_FRAGMENT, &pl).unwrap();
        assert_eq!(info.proto, 17);
        assert_eq!(info.fragment.unwrap().offset, 16);
        assert!(!info.fragment.unwrap().more);
    }

    #[test]
    fn long_chain_is_refused() {
        let mut pl = Vec::new();
        for _ in 0..MAX_EXT_HEADERS + 1 {
            pl.extend_from_slice(&[NH_DSTOPTS, 0, 1, 4, 0, 0, 0, 0]);
        }
        assert_eq!(walk(NH_DSTOPTS, &pl).unwrap_err(), Error::TooManyHeaders);
    }

    #[test]
    fn truncated_and_rh0() {
        assert_eq!(walk(NH_HOPOPTS, &[6]).unwrap_err(), Error::Truncated);
        assert_eq!(walk(NH_HOPOPTS, &[6, 1, 0, 0, 0, 0, 0, 0]).unwrap_err(), Error::Truncated);
        assert_eq!(walk(NH_FRAGMENT, &[6, 0, 0, 0]).unwrap_err(), Error::Truncated);
        let info = walk(NH_ROUTING, &[59, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert!(info.rh0);
        assert_eq!(info.proto, NH_NONE);
        let dup = [NH_FRAGMENT, 0, 0, 1, 0, 0, 0, 1, 6, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(walk(NH_FRAGMENT, &dup).unwrap_err(), Error::BadHeader);
    }
}

/// A header quoted in an ICMPv6 error: whole, the packet behind it possibly cut short, so only
/// what the fixed header itself says can be read.
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a> {
    b: &'a [u8],
}

impl<'a> Quoted<'a> {
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        Packet::<&[u8]>::header_fits(b)?;
        Ok(Quoted { b })
    }
    pub fn next_header(&self) -> u8 {
        self.b[6]
    }
    pub fn src(&self) -> [u8; 16] {
        self.b[8..24].try_into().unwrap()
    }
    pub fn dst(&self) -> [u8; 16] {
        self.b[24..40].try_into().unwrap()
    }
}
