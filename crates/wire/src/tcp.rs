//! TCP (RFC 9293): header view and options (MSS, window scale, SACK-permitted, timestamps).

use crate::Error;

pub const MIN_HEADER_LEN: usize = 20;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;
pub const URG: u8 = 0x20;
pub const ECE: u8 = 0x40;
pub const CWR: u8 = 0x80;

pub const OPT_EOL: u8 = 0;
pub const OPT_NOP: u8 = 1;
pub const OPT_MSS: u8 = 2;
pub const OPT_WSCALE: u8 = 3;
pub const OPT_SACK_PERMITTED: u8 = 4;
pub const OPT_SACK: u8 = 5;
pub const OPT_TIMESTAMP: u8 = 8;

/// A view over a TCP segment. `new_checked` guarantees a data offset of at least 20 bytes that
/// fits the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let off = ((b[12] >> 4) as usize) * 4;
        if off < MIN_HEADER_LEN {
            return Err(Error::BadHeaderLen);
        }
        if off > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.b()[0], self.b()[1]])
    }
    #[inline]
    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes([self.b()[2], self.b()[3]])
    }
    #[inline]
    pub fn seq(&self) -> u32 {
        u32::from_be_bytes(self.b()[4..8].try_into().unwrap())
    }
    #[inline]
    pub fn ack(&self) -> u32 {
        u32::from_be_bytes(self.b()[8..12].try_into().unwrap())
    }
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.b()[12] >> 4) as usize) * 4
    }
    #[inline]
    pub fn flags(&self) -> u8 {
        self.b()[13]
    }
    #[inline]
    pub fn window(&self) -> u16 {
        u16::from_be_bytes([self.b()[14], self.b()[15]])
    }
    #[inline]
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.b()[16], self.b()[17]])
    }
    #[inline]
    pub fn urgent(&self) -> u16 {
        u16::from_be_bytes([self.b()[18], self.b()[19]])
    }
    /// The four bits between the data offset and the flags (reserved; pf's `th_x2`).
    #[inline]
    pub fn reserved(&self) -> u8 {
        self.b()[12] & 0x0f
    }
    #[inline]
    pub fn options_raw(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }
    pub fn options(&self) -> Result<Options, Error> {
        Options::parse(self.options_raw())
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
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
    pub fn set_seq(&mut self, v: u32) {
        self.buf.as_mut()[4..8].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn set_ack(&mut self, v: u32) {
        self.buf.as_mut()[8..12].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn set_checksum(&mut self, c: u16) {
        self.buf.as_mut()[16..18].copy_from_slice(&c.to_be_bytes());
    }
    #[inline]
    pub fn set_flags(&mut self, f: u8) {
        self.buf.as_mut()[13] = f;
    }
}

/// The options pf's TCP tracking reads. Unknown options are skipped by their length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    /// (TSval, TSecr)
    pub timestamp: Option<(u32, u32)>,
}

impl Options {
    pub fn parse(mut o: &[u8]) -> Result<Options, Error> {
        let mut r = Options::default();
        while let Some(&kind) = o.first() {
            match kind {
                OPT_EOL => break,
                OPT_NOP => o = &o[1..],
                _ => {
                    let len = *o.get(1).ok_or(Error::BadOption)? as usize;
                    if len < 2 || len > o.len() {
                        return Err(Error::BadOption);
                    }
                    let body = &o[2..len];
                    match (kind, body.len()) {
                        (OPT_MSS, 2) => r.mss = Some(u16::from_be_bytes([body[0], body[1]])),
                        // RFC 7323 section 2.3: a shift above 14 is treated as 14.
                        (OPT_WSCALE, 1) => r.wscale = Some(body[0].min(14)),
                        (OPT_SACK_PERMITTED, 0) => r.sack_permitted = true,
                        (OPT_TIMESTAMP, 8) => {
                            r.timestamp = Some((
                                u32::from_be_bytes(body[0..4].try_into().unwrap()),
                                u32::from_be_bytes(body[4..8].try_into().unwrap()),
                            ))
                        }
                        (OPT_MSS | OPT_WSCALE | OPT_SACK_PERMITTED | OPT_TIMESTAMP, _) => return Err(Error::BadOption),
                        _ => {}
                    }
                    o = &o[len..];
                }
            }
        }
        Ok(r)
    }
}

/// Writes a 20-byte TCP header without options into `buf[..20]`, checksum 0 (the caller sums
/// it over the pseudo-header: [`crate::checksum::pseudo_v4`]/[`crate::checksum::pseudo_v6`]).
pub fn emit_header(buf: &mut [u8], sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, window: u16) {
    buf[0..2].copy_from_slice(&sport.to_be_bytes());
    buf[2..4].copy_from_slice(&dport.to_be_bytes());
    buf[4..8].copy_from_slice(&seq.to_be_bytes());
    buf[8..12].copy_from_slice(&ack.to_be_bytes());
    buf[12] = 5 << 4;
    buf[13] = flags;
    buf[14..16].copy_from_slice(&window.to_be_bytes());
    buf[16..20].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    // A Linux SYN: 43210 -> 80, seq 0x01020304, offset 40, SYN, window 64240,
    // options: MSS 1460, SACK-permitted, TS 1/0, NOP, wscale 7.
    const SYN_SEG: [u8; 40] = [
        0xa8, 0xca, 0x00, 0x50, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa, 0xf0, 0x12, 0x34,
        0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x03, 0x03, 0x07,
    ];

    #[test]
    fn header_and_options() {
        let p = Packet::new_checked(&SYN_SEG[..]).unwrap();
        assert_eq!(p.src_port(), 43210);
        assert_eq!(p.dst_port(), 80);
        assert_eq!(p.seq(), 0x01020304);
        assert_eq!(p.header_len(), 40);
        assert_eq!(p.flags(), SYN);
        assert_eq!(p.window(), 64240);
        assert_eq!(p.checksum(), 0x1234);
        let o = p.options().unwrap();
        assert_eq!(o, Options { mss: Some(1460), wscale: Some(7), sack_permitted: true, timestamp: Some((1, 0)) });
        assert!(p.payload().is_empty());
    }

    #[test]
    fn bad_offsets_and_options() {
        let mut s = SYN_SEG;
        s[12] = 0x40;
        assert_eq!(Packet::new_checked(&s[..]).unwrap_err(), Error::BadHeaderLen);
        assert_eq!(Packet::new_checked(&SYN_SEG[..39]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&SYN_SEG[..19]).unwrap_err(), Error::Truncated);
        assert_eq!(Options::parse(&[OPT_MSS, 4, 5]), Err(Error::BadOption));
        assert_eq!(Options::parse(&[OPT_MSS, 3, 5]), Err(Error::BadOption));
        assert_eq!(Options::parse(&[99, 1]), Err(Error::BadOption));
        assert_eq!(Options::parse(&[OPT_WSCALE, 3, 30]).unwrap().wscale, Some(14));
        assert_eq!(Options::parse(&[99, 3, 0, OPT_EOL, 0xff]).unwrap(), Options::default());
    }

    #[test]
    fn setters() {
        let mut s = SYN_SEG;
        let mut p = Packet::new_checked(&mut s[..]).unwrap();
        p.set_src_port(1);
        p.set_dst_port(2);
        p.set_seq(3);
        p.set_ack(4);
        p.set_checksum(5);
        assert_eq!((p.src_port(), p.dst_port(), p.seq(), p.ack(), p.checksum()), (1, 2, 3, 4, 5));
    }
}
