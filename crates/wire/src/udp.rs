//! UDP (RFC 768).

use crate::{checksum, Error};

pub const HEADER_LEN: usize = 8;

/// A view over a UDP datagram. `new_checked` guarantees the header and a length field between
/// 8 and the buffer length.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view over a header whose length field may exceed `buf` (a segment being built from
    /// a larger datagram's header); [`Packet::set_len`] next.
    #[inline]
    pub(crate) fn new_header(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = u16::from_be_bytes([b[4], b[5]]) as usize;
        if len < HEADER_LEN {
            return Err(Error::BadLength);
        }
        if len > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }
    #[inline]
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[0], self.buf.as_ref()[1]])
    }
    #[inline]
    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[2], self.buf.as_ref()[3]])
    }
    #[inline]
    pub fn len(&self) -> usize {
        u16::from_be_bytes([self.buf.as_ref()[4], self.buf.as_ref()[5]]) as usize
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == HEADER_LEN
    }
    #[inline]
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[6], self.buf.as_ref()[7]])
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..self.len()]
    }
    /// Checks the checksum against an IPv4 pseudo-header; a zero checksum means "none" on IPv4.
    pub fn verify_checksum_v4(&self, src: [u8; 4], dst: [u8; 4]) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let ph = checksum::pseudo_v4(src, dst, 17, self.len() as u16);
        checksum::fold(checksum::sum(&self.buf.as_ref()[..self.len()], ph)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    pub fn set_src_port(&mut self, p: u16) {
        self.buf.as_mut()[0..2].copy_from_slice(&p.to_be_bytes());
    }
    #[inline]
    pub fn set_dst_port(&mut self, p: u16) {
        self.buf.as_mut()[2..4].copy_from_slice(&p.to_be_bytes());
    }
    #[inline]
    pub fn set_checksum(&mut self, c: u16) {
        self.buf.as_mut()[6..8].copy_from_slice(&c.to_be_bytes());
    }
    #[inline]
    pub fn set_len(&mut self, n: u16) {
        self.buf.as_mut()[4..6].copy_from_slice(&n.to_be_bytes());
    }
}

/// Writes a UDP header (checksum 0, allowed on IPv4) into `buf[..8]`.
pub fn emit_header(buf: &mut [u8], sport: u16, dport: u16, len: u16) {
    buf[0..2].copy_from_slice(&sport.to_be_bytes());
    buf[2..4].copy_from_slice(&dport.to_be_bytes());
    buf[4..6].copy_from_slice(&len.to_be_bytes());
    buf[6..8].copy_from_slice(&[0, 0]);
}

#[cfg(test)]
mod tests {
    use super::*;

    // DNS query 53000 -> 53, length 12, checksum computed over 10.0.0.1 -> 10.0.0.2.
    #[test]
    fn fields_and_checksum() {
        let mut d = [0xcf, 0x08, 0x00, 0x35, 0x00, 0x0c, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef];
        let (s, t) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let c = !checksum::fold(checksum::sum(&d, checksum::pseudo_v4(s, t, 17, 12)));
        d[6..8].copy_from_slice(&c.to_be_bytes());
        let p = Packet::new_checked(&d[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (53000, 53, 12));
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        assert!(p.verify_checksum_v4(s, t));
        assert!(!p.verify_checksum_v4(s, [10, 0, 0, 3]));
    }

    #[test]
    fn bad_lengths() {
        let d = [0, 1, 0, 2, 0, 7, 0, 0];
        assert_eq!(Packet::new_checked(&d[..]).unwrap_err(), Error::BadLength);
        let d = [0, 1, 0, 2, 0, 9, 0, 0];
        assert_eq!(Packet::new_checked(&d[..]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&d[..7]).unwrap_err(), Error::Truncated);
    }
}
