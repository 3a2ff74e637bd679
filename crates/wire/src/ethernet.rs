//! Ethernet II frames and 802.1Q / 802.1ad VLAN tags.

use crate::Error;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}
pub const HEADER_LEN: usize = 14;

/// A view over an Ethernet II frame. `new_checked` guarantees the 14-byte header is present.
#[derive(Debug, Clone, Copy)]
pub struct Frame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Frame { buf })
    }
    #[inline]
    pub fn dst(&self) -> [u8; 6] {
        self.buf.as_ref()[field::DST].try_into().unwrap()
    }
    #[inline]
    pub fn src(&self) -> [u8; 6] {
        self.buf.as_ref()[field::SRC].try_into().unwrap()
    }
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[12], b[13]])
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    #[inline]
    pub fn set_dst(&mut self, mac: [u8; 6]) {
        self.buf.as_mut()[field::DST].copy_from_slice(&mac);
    }
    #[inline]
    pub fn set_src(&mut self, mac: [u8; 6]) {
        self.buf.as_mut()[field::SRC].copy_from_slice(&mac);
    }
    #[inline]
    pub fn set_ethertype(&mut self, t: u16) {
        self.buf.as_mut()[field::ETHERTYPE].copy_from_slice(&t.to_be_bytes());
    }
}

/// One 802.1Q tag: TCI (PCP, DEI, VID) and the encapsulated ethertype.
#[derive(Debug, Clone, Copy)]
pub struct VlanTag<T: AsRef<[u8]>> {
    buf: T,
}
pub const VLAN_TAG_LEN: usize = 4;

impl<T: AsRef<[u8]>> VlanTag<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < VLAN_TAG_LEN {
            return Err(Error::Truncated);
        }
        Ok(VlanTag { buf })
    }
    #[inline]
    pub fn tci(&self) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[0], b[1]])
    }
    #[inline]
    pub fn vid(&self) -> u16 {
        self.tci() & 0x0fff
    }
    #[inline]
    pub fn pcp(&self) -> u8 {
        (self.tci() >> 13) as u8
    }
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGGED: [u8; 22] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x81, 0x00, // eth
        0xa0, 0x64, 0x08, 0x00, // pcp 5, vid 100, ipv4
        0x45, 0x00, 0x00, 0x14,
    ];

    #[test]
    fn reads_header_and_tag() {
        let f = Frame::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(f.dst(), [0xff; 6]);
        assert_eq!(f.src(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(f.ethertype(), ETHERTYPE_VLAN);
        let t = VlanTag::new_checked(f.payload()).unwrap();
        assert_eq!(t.vid(), 100);
        assert_eq!(t.pcp(), 5);
        assert_eq!(t.ethertype(), ETHERTYPE_IPV4);
    }

    #[test]
    fn short_frames_are_rejected() {
        assert_eq!(Frame::new_checked(&TAGGED[..13]).unwrap_err(), Error::Truncated);
        assert_eq!(VlanTag::new_checked(&TAGGED[14..17]).unwrap_err(), Error::Truncated);
    }

    #[test]
    fn setters_write_in_place() {
        let mut b = TAGGED;
        let mut f = Frame::new_checked(&mut b[..]).unwrap();
        f.set_dst([1, 2, 3, 4, 5, 6]);
        f.set_ethertype(ETHERTYPE_IPV6);
        assert_eq!(&b[0..6], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[12..14], &[0x86, 0xdd]);
    }
}
