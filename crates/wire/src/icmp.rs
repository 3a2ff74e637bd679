//! ICMP (RFC 792) and ICMPv6 (RFC 4443): the common header, query ids, and the classification
//! pf needs (query or error, and which reply answers which request).

use crate::Error;

pub const HEADER_LEN: usize = 8;

pub const ECHO_REPLY: u8 = 0;
pub const UNREACH: u8 = 3;
pub const SOURCE_QUENCH: u8 = 4;
pub const REDIRECT: u8 = 5;
pub const ECHO_REQUEST: u8 = 8;
pub const ROUTER_ADVERT: u8 = 9;
pub const ROUTER_SOLICIT: u8 = 10;
pub const TIME_EXCEEDED: u8 = 11;
pub const PARAM_PROBLEM: u8 = 12;
pub const TIMESTAMP: u8 = 13;
pub const TIMESTAMP_REPLY: u8 = 14;
pub const INFO_REQUEST: u8 = 15;
pub const INFO_REPLY: u8 = 16;
pub const MASK_REQUEST: u8 = 17;
pub const MASK_REPLY: u8 = 18;

pub const V6_UNREACH: u8 = 1;
pub const V6_PACKET_TOO_BIG: u8 = 2;
pub const V6_TIME_EXCEEDED: u8 = 3;
pub const V6_PARAM_PROBLEM: u8 = 4;
pub const V6_ECHO_REQUEST: u8 = 128;
pub const V6_ECHO_REPLY: u8 = 129;
pub const V6_ROUTER_SOLICIT: u8 = 133;
pub const V6_ROUTER_ADVERT: u8 = 134;
pub const V6_NEIGHBOR_SOLICIT: u8 = 135;
pub const V6_NEIGHBOR_ADVERT: u8 = 136;
pub const V6_REDIRECT: u8 = 137;

/// A view over an ICMP or ICMPv6 message (same header layout). `new_checked` guarantees the
/// 8-byte header.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Packet { buf })
    }
    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.buf.as_ref()[0]
    }
    #[inline]
    pub fn code(&self) -> u8 {
        self.buf.as_ref()[1]
    }
    #[inline]
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[2], self.buf.as_ref()[3]])
    }
    /// Identifier of a query message (echo, timestamp, ...).
    #[inline]
    pub fn ident(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[4], self.buf.as_ref()[5]])
    }
    #[inline]
    pub fn seq(&self) -> u16 {
        u16::from_be_bytes([self.buf.as_ref()[6], self.buf.as_ref()[7]])
    }
    /// For an error message, the quoted packet (the invoking IP header and what follows).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
    /// A neighbour solicitation's or advertisement's target address (RFC 4861 4.3, 4.4: the
    /// 16 bytes after the header); None when the message is too short to hold one.
    #[inline]
    pub fn nd_target(&self) -> Option<[u8; 16]> {
        self.buf.as_ref().get(HEADER_LEN..HEADER_LEN + 16)?.try_into().ok()
    }
}

/// The identifier pf gives a neighbour solicitation and the advertisements that answer it
/// (pf_icmp_mapping): the target's four words folded by exclusive or into 16 bits, the
/// number pfctl shows as the state's port on a little-endian host.
pub fn nd_id(target: &[u8; 16]) -> u16 {
    let h = target.chunks_exact(4).fold(0u32, |h, w| h ^ u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    (h >> 16) as u16 ^ h as u16
}

/// What kind of ICMP message this is, for state keeping (pf's `pf_icmp_mapping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A query that creates a state keyed by its identifier.
    Query,
    /// The reply to a query; matched against the query's state.
    Reply,
    /// An error quoting another packet; matched against that packet's state.
    Error,
    /// Anything else (router advertisements, neighbour discovery, ...).
    Other,
}

pub fn kind_v4(t: u8) -> Kind {
    match t {
        ECHO_REQUEST | TIMESTAMP | INFO_REQUEST | MASK_REQUEST | ROUTER_SOLICIT => Kind::Query,
        ECHO_REPLY | TIMESTAMP_REPLY | INFO_REPLY | MASK_REPLY | ROUTER_ADVERT => Kind::Reply,
        UNREACH | SOURCE_QUENCH | REDIRECT | TIME_EXCEEDED | PARAM_PROBLEM => Kind::Error,
        _ => Kind::Other,
    }
}

/// MLD messages (RFC 2710, RFC 3810).
pub const MLD_QUERY: u8 = 130;
pub const MLD_REPORT: u8 = 131;
pub const MLD_DONE: u8 = 132;
pub const MLD2_REPORT: u8 = 143;

#[inline]
pub fn is_mld(t: u8) -> bool {
    matches!(t, MLD_QUERY | MLD_REPORT | MLD_DONE | MLD2_REPORT)
}

/// Neighbour discovery (RFC 4861): router and neighbour solicitations and advertisements,
/// redirects.
#[inline]
pub fn is_nd(t: u8) -> bool {
    (V6_ROUTER_SOLICIT..=V6_REDIRECT).contains(&t)
}

pub fn kind_v6(t: u8) -> Kind {
    match t {
        V6_ECHO_REQUEST => Kind::Query,
        V6_ECHO_REPLY => Kind::Reply,
        V6_UNREACH | V6_PACKET_TOO_BIG | V6_TIME_EXCEEDED | V6_PARAM_PROBLEM => Kind::Error,
        _ => Kind::Other,
    }
}

/// Writes an 8-byte ICMP/ICMPv6 header (`rest`: the word after the checksum, 0 for
/// destination unreachable), checksum 0, into `buf[..8]`.
pub fn emit_header(buf: &mut [u8], msg_type: u8, code: u8, rest: u32) {
    buf[0] = msg_type;
    buf[1] = code;
    buf[2..4].fill(0);
    buf[4..8].copy_from_slice(&rest.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_request() {
        let m = [8, 0, 0xf7, 0xfd, 0x12, 0x34, 0x00, 0x01, b'h', b'i'];
        let p = Packet::new_checked(&m[..]).unwrap();
        assert_eq!((p.msg_type(), p.code(), p.ident(), p.seq()), (8, 0, 0x1234, 1));
        assert_eq!(p.checksum(), 0xf7fd);
        assert_eq!(p.payload(), b"hi");
        assert_eq!(kind_v4(p.msg_type()), Kind::Query);
        assert_eq!(Packet::new_checked(&m[..7]).unwrap_err(), Error::Truncated);
    }

    #[test]
    fn classification() {
        assert_eq!(kind_v4(TIME_EXCEEDED), Kind::Error);
        assert_eq!(kind_v4(ECHO_REPLY), Kind::Reply);
        assert_eq!(kind_v4(200), Kind::Other);
        assert_eq!(kind_v6(V6_PACKET_TOO_BIG), Kind::Error);
        assert_eq!(kind_v6(V6_ECHO_REQUEST), Kind::Query);
        assert_eq!(kind_v6(V6_NEIGHBOR_SOLICIT), Kind::Other);
    }
}
