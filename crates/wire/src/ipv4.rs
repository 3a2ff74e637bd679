//! IPv4 (RFC 791): header view with options and fragment fields.

use crate::{checksum, Error, Options};

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LEN: usize = 2; // ..4
    pub const IDENT: usize = 4; // ..6
    pub const FLAGS_FRAG: usize = 6; // ..8
    pub const TTL: usize = 8;
    pub const PROTO: usize = 9;
    pub const CKSUM: usize = 10; // ..12
    pub const SRC: usize = 12; // ..16
    pub const DST: usize = 16; // ..20
}
pub const MIN_HEADER_LEN: usize = 20;

pub const FLAG_DF: u16 = 0x4000;
pub const FLAG_MF: u16 = 0x2000;
const FRAG_MASK: u16 = 0x1fff;

pub const OPT_EOL: u8 = 0;
pub const OPT_NOP: u8 = 1;
pub const OPT_ROUTER_ALERT: u8 = 148;

/// A view over an IPv4 packet. `new_checked` guarantees version 4, a header length of at least
/// 20 bytes that fits the buffer, and a total length between the header length and the buffer
/// length; accessors below cannot panic after it.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        let hl = Self::header_fits(b)?;
        let total = u16::from_be_bytes([b[field::LEN], b[field::LEN + 1]]) as usize;
        if total < hl {
            return Err(Error::BadLength);
        }
        if total > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }

    /// A view over a header whose total length may exceed `buf` (a segment being built from
    /// a larger packet's headers): only the header must fit; [`Packet::set_total_len`] next.
    #[inline]
    pub(crate) fn new_header(buf: T) -> Result<Self, Error> {
        Self::header_fits(buf.as_ref())?;
        Ok(Packet { buf })
    }

    /// Version 4 and a whole header in `b`: its length.
    #[inline]
    pub(crate) fn header_fits(b: &[u8]) -> Result<usize, Error> {
        if b.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[field::VER_IHL] >> 4 != 4 {
            return Err(Error::BadVersion);
        }
        let hl = ((b[field::VER_IHL] & 0x0f) as usize) * 4;
        if hl < MIN_HEADER_LEN {
            return Err(Error::BadHeaderLen);
        }
        if hl > b.len() {
            return Err(Error::Truncated);
        }
        Ok(hl)
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.b()[field::VER_IHL] & 0x0f) as usize) * 4
    }
    #[inline]
    pub fn tos(&self) -> u8 {
        self.b()[field::TOS]
    }
    #[inline]
    pub fn total_len(&self) -> usize {
        u16::from_be_bytes([self.b()[field::LEN], self.b()[field::LEN + 1]]) as usize
    }
    #[inline]
    pub fn ident(&self) -> u16 {
        u16::from_be_bytes([self.b()[field::IDENT], self.b()[field::IDENT + 1]])
    }
    #[inline]
    fn flags_frag(&self) -> u16 {
        u16::from_be_bytes([self.b()[field::FLAGS_FRAG], self.b()[field::FLAGS_FRAG + 1]])
    }
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.flags_frag() & FLAG_MF != 0
    }
    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (self.flags_frag() & FRAG_MASK) << 3
    }
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & (FLAG_MF | FRAG_MASK) != 0
    }
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTO]
    }
    #[inline]
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.b()[field::CKSUM], self.b()[field::CKSUM + 1]])
    }
    #[inline]
    pub fn src(&self) -> [u8; 4] {
        self.b()[field::SRC..field::SRC + 4].try_into().unwrap()
    }
    #[inline]
    pub fn dst(&self) -> [u8; 4] {
        self.b()[field::DST..field::DST + 4].try_into().unwrap()
    }
    /// True when the header checksum is correct.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(&self.b()[..self.header_len()], 0)) == 0xffff
    }
    #[inline]
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Walks the options (RFC 791 section 3.1), checks every length byte and says what they are.
    pub fn check_options(&self) -> Result<Options, Error> {
        let mut o = self.options();
        let mut found = Options::default();
        while let Some(&kind) = o.first() {
            match kind {
                OPT_EOL => break,
                OPT_NOP => o = &o[1..],
                _ => {
                    let len = *o.get(1).ok_or(Error::BadOption)? as usize;
                    if len < 2 || len > o.len() {
                        return Err(Error::BadOption);
                    }
                    if kind == OPT_ROUTER_ALERT {
                        found.router_alert = true;
                    } else {
                        found.other = true;
                    }
                    o = &o[len..];
                }
            }
        }
        // Options of padding only are suspect, as pf has it: counted as other.
        if !found.any() {
            found.other = true;
        }
        Ok(found)
    }
    /// The bytes after the header, up to the total length (link padding excluded).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Decrements the TTL and patches the checksum incrementally (RFC 1624).
    #[inline]
    pub fn dec_ttl(&mut self) {
        let b = self.buf.as_mut();
        let old = u16::from_be_bytes([b[field::TTL], b[field::PROTO]]);
        b[field::TTL] = b[field::TTL].wrapping_sub(1);
        let new = u16::from_be_bytes([b[field::TTL], b[field::PROTO]]);
        let c = u16::from_be_bytes([b[field::CKSUM], b[field::CKSUM + 1]]);
        b[field::CKSUM..field::CKSUM + 2].copy_from_slice(&checksum::update16(c, old, new).to_be_bytes());
    }
    /// Rewrites the source address, patching the header checksum. Returns the old address so the
    /// caller can patch the transport checksum too.
    #[inline]
    pub fn set_src(&mut self, a: [u8; 4]) -> [u8; 4] {
        self.set_addr(field::SRC, a)
    }
    #[inline]
    pub fn set_dst(&mut self, a: [u8; 4]) -> [u8; 4] {
        self.set_addr(field::DST, a)
    }
    fn set_addr(&mut self, at: usize, a: [u8; 4]) -> [u8; 4] {
        let b = self.buf.as_mut();
        let old: [u8; 4] = b[at..at + 4].try_into().unwrap();
        b[at..at + 4].copy_from_slice(&a);
        let c = u16::from_be_bytes([b[field::CKSUM], b[field::CKSUM + 1]]);
        let n = checksum::update32(c, u32::from_be_bytes(old), u32::from_be_bytes(a));
        b[field::CKSUM..field::CKSUM + 2].copy_from_slice(&n.to_be_bytes());
        old
    }
    /// Sets the total length and the identification (the header checksum is left to
    /// [`Packet::fill_checksum`]).
    #[inline]
    pub fn set_len_ident(&mut self, total_len: u16, ident: u16) {
        let b = self.buf.as_mut();
        b[field::LEN..field::LEN + 2].copy_from_slice(&total_len.to_be_bytes());
        b[field::IDENT..field::IDENT + 2].copy_from_slice(&ident.to_be_bytes());
    }
    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.buf.as_mut();
        b[field::CKSUM] = 0;
        b[field::CKSUM + 1] = 0;
        let c = checksum::checksum(&b[..hl]);
        b[field::CKSUM..field::CKSUM + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// Writes a 20-byte header with no options and a correct checksum into `buf[..20]`.
pub fn emit_header(buf: &mut [u8], src: [u8; 4], dst: [u8; 4], proto: u8, total_len: u16, ttl: u8, ident: u16) {
    buf[0] = 0x45;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&total_len.to_be_bytes());
    buf[4..6].copy_from_slice(&ident.to_be_bytes());
    buf[6..8].copy_from_slice(&0u16.to_be_bytes());
    buf[8] = ttl;
    buf[9] = proto;
    buf[10..12].copy_from_slice(&[0, 0]);
    buf[12..16].copy_from_slice(&src);
    buf[16..20].copy_from_slice(&dst);
    let c = checksum::checksum(&buf[..20]);
    buf[10..12].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    // 192.168.0.1 -> 192.168.0.199, UDP, total 0x73, DF, ttl 64, checksum b861.
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
        0x00, 0xc7,
    ];

    fn packet() -> Vec<u8> {
        let mut v = HDR.to_vec();
        v.resize(0x73, 0xaa);
        v
    }

    #[test]
    fn fields() {
        let v = packet();
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 0x73);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 17);
        assert_eq!(p.src(), [192, 168, 0, 1]);
        assert_eq!(p.dst(), [192, 168, 0, 199]);
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 0x73 - 20);
    }

    #[test]
    fn rejects_bad_headers() {
        let mut v = packet();
        v[0] = 0x44;
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadHeaderLen);
        v[0] = 0x65;
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadVersion);
        let mut v = packet();
        v[3] = 19; // total length below header length
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadLength);
        let v = packet();
        assert_eq!(Packet::new_checked(&v[..0x72]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&v[..19]).unwrap_err(), Error::Truncated);
        let mut v = packet();
        v[0] = 0x4f; // 60-byte header in a buffer that has it, total length too small
        v[3] = 40;
        assert_eq!(Packet::new_checked(&v[..]).unwrap_err(), Error::BadLength);
    }

    #[test]
    fn fragment_fields() {
        let mut v = packet();
        v[6] = 0x20; // MF
        v[7] = 0x03; // offset 3*8
        let p = Packet::new_checked(&v[..]).unwrap();
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(p.frag_offset(), 24);
    }

    #[test]
    fn options_walk() {
        let mut v = vec![0x46, 0, 0, 24, 0, 0, 0, 0, 64, 17, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2];
        v.extend_from_slice(&[OPT_NOP, 0x94, 0x04, 0x00]); // NOP, router alert truncated
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(p.check_options(), Err(Error::BadOption));
        v[20..24].copy_from_slice(&[0x94, 0x04, 0x00, 0x00]); // router alert, len 4
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(p.check_options(), Ok(Options { router_alert: true, other: false }));
        v[20..24].copy_from_slice(&[OPT_NOP, OPT_NOP, OPT_NOP, OPT_EOL]); // padding only
        assert_eq!(
            Packet::new_checked(&v[..]).unwrap().check_options(),
            Ok(Options { router_alert: false, other: true })
        );
        v[20..24].copy_from_slice(&[0x94, 0x04, 0x00, 0x00]);
        v.splice(24..24, [0x83, 0x03, 0x00, OPT_EOL]); // and a loose source route (RFC 791)
        v[0] = 0x47;
        v[3] = 28;
        assert_eq!(
            Packet::new_checked(&v[..]).unwrap().check_options(),
            Ok(Options { router_alert: true, other: true })
        );
        v.drain(24..28);
        v[0] = 0x46;
        v[3] = 24;
        v[20..24].copy_from_slice(&[0x94, 0x00, 0x00, 0x00]); // length 0
        assert_eq!(Packet::new_checked(&v[..]).unwrap().check_options(), Err(Error::BadOption));
    }

    #[test]
    fn ttl_and_address_rewrite_keep_checksum_valid() {
        let mut v = packet();
        let mut p = Packet::new_checked(&mut v[..]).unwrap();
        p.dec_ttl();
        assert_eq!(p.ttl(), 63);
        assert!(p.verify_checksum());
        let old = p.set_src([10, 0, 0, 1]);
        assert_eq!(old, [192, 168, 0, 1]);
        p.set_dst([10, 9, 8, 7]);
        assert!(p.verify_checksum());
    }

    #[test]
    fn emit_roundtrip() {
        let mut b = [0u8; 28];
        emit_header(&mut b, [1, 2, 3, 4], [5, 6, 7, 8], 17, 28, 64, 7);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.ident(), 7);
        assert_eq!(p.payload().len(), 8);
    }
}

/// A header quoted in an ICMP error: whole, the datagram behind it possibly cut short, so only
/// what the header itself says can be read.
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a> {
    b: &'a [u8],
}

impl<'a> Quoted<'a> {
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        Packet::<&[u8]>::header_fits(b)?;
        Ok(Quoted { b })
    }
    pub fn protocol(&self) -> u8 {
        self.b[field::PROTO]
    }
    pub fn src(&self) -> [u8; 4] {
        self.b[field::SRC..field::SRC + 4].try_into().unwrap()
    }
    pub fn dst(&self) -> [u8; 4] {
        self.b[field::DST..field::DST + 4].try_into().unwrap()
    }
}
