//! The packet descriptor: everything later stages need, filled once per packet (pf's
//! `pf_pdesc`). Rules, the state table, NAT and sync read it and never parse the packet again.

use crate::{ethernet, icmp, ipv4, ipv6, tcp, udp, Error, Options, Reason};

pub const AF_INET: u8 = 4;
pub const AF_INET6: u8 = 6;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_IGMP: u8 = 2;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
/// Not a protocol (IANA's 255 is reserved): what a translation target for every protocol
/// without ports (GRE, ESP, SCTP's neighbours, ...) is filed under, besides one protocol's
/// own number.
pub const PROTO_PORTLESS: u8 = 255;

/// Whether `proto` has no ports or identifier a translation could name a flow by (not TCP,
/// UDP, ICMP or ICMPv6): translated by its addresses alone.
#[inline]
pub fn portless(proto: u8) -> bool {
    !matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6)
}

/// Descriptor flags.
pub mod pdf {
    /// The packet is a fragment (IPv4 MF or offset, or an IPv6 fragment header).
    pub const FRAGMENT: u16 = 1 << 0;
    /// A fragment with offset > 0: no transport header in this packet.
    pub const NOT_FIRST_FRAG: u16 = 1 << 1;
    /// IPv4 options or IPv6 hop-by-hop / destination options are present (pf's `allow-opts`).
    pub const IP_OPTIONS: u16 = 1 << 2;
    /// The packet came with an 802.1Q tag.
    pub const VLAN: u16 = 1 << 3;
    /// ICMP or ICMPv6 error: `sport`/`dport` are meaningless, the quoted packet decides.
    pub const ICMP_ERROR: u16 = 1 << 4;
    /// Transport ports (or the ICMP id) are valid.
    pub const HAS_PORTS: u16 = 1 << 5;
    /// A fragment with more after it (IPv4 MF, IPv6 M): not the last one.
    pub const MORE_FRAGS: u16 = 1 << 6;
    /// A TCP header with reserved bits set, or an urgent pointer without URG: what
    /// pf_normalize_tcp clears before the packet goes on.
    pub const TCP_UNCLEAN: u16 = 1 << 7;
    /// An ICMPv6 neighbour solicitation or advertisement: its state is keyed by its target
    /// ([`nd_key`](super::nd_key)), its ports hold pf's identifier of that target and the
    /// solicitation's type.
    pub const ND: u16 = 1 << 8;
}

/// An address: IPv4 in the first four bytes, the rest zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(C, align(4))]
pub struct Addr(pub [u8; 16]);

impl Addr {
    #[inline]
    pub fn v4(a: [u8; 4]) -> Addr {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&a);
        Addr(b)
    }
    #[inline]
    pub fn v4_bytes(&self) -> [u8; 4] {
        [self.0[0], self.0[1], self.0[2], self.0[3]]
    }
    /// The IPv4 address as a host-order integer.
    #[inline]
    pub fn v4_u32(&self) -> u32 {
        u32::from_be_bytes(self.v4_bytes())
    }
    /// The address of `a` (IPv4 in the first four bytes).
    pub fn from_ip(a: std::net::IpAddr) -> Addr {
        match a {
            std::net::IpAddr::V4(v) => Addr::v4(v.octets()),
            std::net::IpAddr::V6(v) => Addr(v.octets()),
        }
    }
    pub fn to_ip(&self, af: u8) -> std::net::IpAddr {
        if af == AF_INET {
            std::net::IpAddr::from(self.v4_bytes())
        } else {
            std::net::IpAddr::from(self.0)
        }
    }
}

/// The descriptor. 80 bytes; `Default` is an empty descriptor ready for `parse_*`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PDesc {
    pub src: Addr,
    pub dst: Addr,
    /// Source and destination ports; for ICMP queries and replies both hold the identifier
    /// (pf keys ICMP states on the id).
    pub sport: u16,
    pub dport: u16,
    /// 4 or 6.
    pub af: u8,
    /// The transport protocol (after IPv6 extension headers).
    pub proto: u8,
    pub tcp_flags: u8,
    pub icmp_type: u8,
    pub icmp_code: u8,
    pub ttl: u8,
    pub tos: u8,
    pub flags: u16,
    /// 802.1Q TCI when `pdf::VLAN`.
    pub vlan_tci: u16,
    /// Offsets from the start of the frame.
    pub l3_off: u16,
    pub l4_off: u16,
    /// IP length from the header (header + payload); what pf counts in bytes.
    pub ip_len: u16,
    /// Fragment offset in bytes.
    pub frag_off: u16,
    pub frag_id: u32,
    /// TCP: sequence, acknowledgement, window; read by the state machine without reparsing.
    pub tcp_seq: u32,
    pub tcp_ack: u32,
    pub tcp_win: u16,
    /// Transport payload length (TCP: segment data, UDP: datagram data).
    pub payload_len: u16,
    /// TCP SYN segments only: the window scale option as pf keeps it, shift | 0x80 when the
    /// option is present (shift clamped to 14), 0 when absent.
    pub tcp_wscale: u8,
}

const _: () = assert!(core::mem::size_of::<PDesc>() <= 96);

/// ff02::1, every node of the link.
pub const ALL_NODES: Addr = Addr([0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

impl PDesc {
    /// Whether this is a message of the link itself, which no router forwards: IPv6 neighbour
    /// and router discovery, redirects and multicast listener messages (RFC 4861, 2710,
    /// 3810; Linux's conntrack leaves these untracked, so its NAT never rewrites them).
    #[inline]
    pub fn link_control(&self) -> bool {
        self.proto == IPPROTO_ICMPV6
            && self.flags & pdf::NOT_FIRST_FRAG == 0
            && (icmp::is_mld(self.icmp_type) || icmp::is_nd(self.icmp_type))
    }

    /// Whether this packet cannot leave its link, so no translation can apply to it: a
    /// [`PDesc::link_control`] message, or one from an unspecified or link-local address, or
    /// to a link-local address, a multicast group of link or interface scope (IPv6 ff01::/16
    /// and ff02::/16 whatever the flags, IPv4 224.0.0.0/24) or the limited broadcast.
    #[inline]
    pub fn link_scoped(&self) -> bool {
        let (s, d) = (&self.src.0, &self.dst.0);
        if self.af == AF_INET {
            let ll = |a: &[u8; 16]| a[0] == 169 && a[1] == 254;
            return s[..4] == [0; 4] || ll(s) || ll(d) || d[..3] == [224, 0, 0] || d[..4] == [255; 4];
        }
        let ll = |a: &[u8; 16]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
        self.link_control() || *s == [0; 16] || ll(s) || ll(d) || (d[0] == 0xff && d[1] & 0x0f <= 2)
    }
}

/// Why a frame was not given a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): the dataplane hands it to the host, it is not a drop.
    NotIp(u16),
    /// Malformed: dropped with this reason.
    Drop(Reason),
}

impl From<Reason> for Parse {
    fn from(r: Reason) -> Self {
        Parse::Drop(r)
    }
}

/// Fills `pd` from an Ethernet frame (with up to two VLAN tags); every field is written.
#[inline(always)]
pub fn parse_ether(frame: &[u8], pd: &mut PDesc) -> Result<(), Parse> {
    if let Some(fast) = fast_udp_tcp4(frame) {
        *pd = fast;
        return Ok(());
    }
    parse_slow(frame, pd)
}

#[inline(never)]
fn parse_slow(frame: &[u8], pd: &mut PDesc) -> Result<(), Parse> {
    *pd = PDesc::default();
    parse_ether_general(frame, pd)
}

/// The common case in one straight line: untagged IPv4 with a 20-byte header, correct header
/// checksum, not a fragment, carrying a whole UDP datagram or a TCP segment with a valid data
/// offset. Anything else returns None and takes the general path, which gives the same
/// descriptor or the drop reason.
// PERF: the general path cost ~9 ns/pkt on this case; this one ~4 ns (xpf-bench states at 9,800
// states went from 39 to NN Mpps; docs/bench-results.md).
#[inline(always)]
fn fast_udp_tcp4(f: &[u8]) -> Option<PDesc> {
    let h: &[u8; 34] = f.get(..34)?.try_into().ok()?;
    if h[12] != 0x08 || h[13] != 0x00 || h[14] != 0x45 {
        return None;
    }
    let total = u16::from_be_bytes([h[16], h[17]]) as usize;
    if total < 20 || 14 + total > f.len() || (h[20] & 0x3f) | h[21] != 0 {
        return None;
    }
    let w = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as u64;
    let sum = w(14) + w(18) + w(22) + w(26) + w(30);
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    if (sum & 0xffff) + (sum >> 16) != 0xffff {
        return None;
    }
    let l4 = &f[34..14 + total];
    let proto = h[23];
    let mut pd = PDesc {
        src: Addr::v4([h[26], h[27], h[28], h[29]]),
        dst: Addr::v4([h[30], h[31], h[32], h[33]]),
        af: AF_INET,
        proto,
        ttl: h[22],
        tos: h[15],
        flags: pdf::HAS_PORTS,
        l3_off: 14,
        l4_off: 34,
        ip_len: total as u16,
        ..PDesc::default()
    };
    match proto {
        IPPROTO_UDP => {
            let u: &[u8; 8] = l4.get(..8)?.try_into().ok()?;
            let ulen = u16::from_be_bytes([u[4], u[5]]) as usize;
            if ulen < 8 || ulen > l4.len() {
                return None;
            }
            pd.sport = u16::from_be_bytes([u[0], u[1]]);
            pd.dport = u16::from_be_bytes([u[2], u[3]]);
            pd.payload_len = (ulen - 8) as u16;
        }
        IPPROTO_TCP => {
            let t: &[u8; 20] = l4.get(..20)?.try_into().ok()?;
            let off = ((t[12] >> 4) as usize) * 4;
            if off < 20 || off > l4.len() {
                return None;
            }
            pd.sport = u16::from_be_bytes([t[0], t[1]]);
            pd.dport = u16::from_be_bytes([t[2], t[3]]);
            pd.tcp_seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
            pd.tcp_ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
            pd.tcp_flags = t[13];
            pd.tcp_win = u16::from_be_bytes([t[14], t[15]]);
            pd.payload_len = (l4.len() - off) as u16;
            if t[12] & 0x0f != 0 || t[13] & tcp::URG == 0 && t[18] | t[19] != 0 {
                pd.flags |= pdf::TCP_UNCLEAN;
            }
            if t[13] & tcp::SYN != 0 && off > 20 {
                pd.tcp_wscale = wscale_of(&l4[20..off]);
            }
        }
        _ => return None,
    }
    Some(pd)
}

/// pf's view of a SYN's window scale option (`pf_get_wscale`): shift | 0x80, or 0 without one
/// (or with options that do not parse).
#[inline(never)]
fn wscale_of(opts: &[u8]) -> u8 {
    match tcp::Options::parse(opts) {
        Ok(tcp::Options { wscale: Some(w), .. }) => w.min(14) | 0x80,
        _ => 0,
    }
}

/// The general parser: VLAN tags, IPv4 options and fragments, IPv6, every transport. `pd`
/// must be a fresh (default) descriptor.
pub fn parse_ether_general(frame: &[u8], pd: &mut PDesc) -> Result<(), Parse> {
    let eth = ethernet::Frame::new_checked(frame).map_err(|_| Reason::Short)?;
    let mut et = eth.ethertype();
    let mut off = ethernet::HEADER_LEN;
    let mut tags = 0;
    while et == ethernet::ETHERTYPE_VLAN || et == ethernet::ETHERTYPE_QINQ {
        if tags == 2 {
            return Err(Parse::NotIp(et));
        }
        let tag = ethernet::VlanTag::new_checked(&frame[off..]).map_err(|_| Reason::Short)?;
        if tags == 0 {
            pd.vlan_tci = tag.tci();
            pd.flags |= pdf::VLAN;
        }
        et = tag.ethertype();
        off += ethernet::VLAN_TAG_LEN;
        tags += 1;
    }
    match et {
        ethernet::ETHERTYPE_IPV4 => parse_ipv4(frame, off, pd),
        ethernet::ETHERTYPE_IPV6 => parse_ipv6(frame, off, pd),
        other => Err(Parse::NotIp(other)),
    }
}

/// Fills `pd` from a packet with no link header (raw IP, as on tun devices); the IP version
/// decides.
pub fn parse_raw_ip(pkt: &[u8], pd: &mut PDesc) -> Result<(), Parse> {
    *pd = PDesc::default();
    match pkt.first().map(|b| b >> 4) {
        Some(4) => parse_ipv4(pkt, 0, pd),
        Some(6) => parse_ipv6(pkt, 0, pd),
        Some(_) => Err(Reason::BadIpVersion.into()),
        None => Err(Reason::Short.into()),
    }
}

/// The packet quoted by an ICMP or ICMPv6 error (`q` starts at its IP header): addresses,
/// protocol, and ports (or the ICMP id) and the TCP sequence number from the 8 transport
/// bytes an error must carry. The quote is truncated by design, so lengths and the checksum
/// are not checked. None when it is not a quote a state can be found for (a non-first
/// fragment, IPv6 extension headers, too short).
pub fn parse_quoted(q: &[u8], af: u8) -> Option<PDesc> {
    let mut pd = PDesc { af, ..PDesc::default() };
    let l4 = match af {
        AF_INET => {
            let h = q.get(..20)?;
            let hl = ((h[0] & 0x0f) as usize) * 4;
            if h[0] >> 4 != 4 || hl < 20 || u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
                return None;
            }
            pd.proto = h[9];
            pd.src = Addr::v4(h[12..16].try_into().unwrap());
            pd.dst = Addr::v4(h[16..20].try_into().unwrap());
            q.get(hl..hl + 8)?
        }
        AF_INET6 => {
            let h = q.get(..40)?;
            if h[0] >> 4 != 6 {
                return None;
            }
            pd.proto = h[6];
            pd.src = Addr(h[8..24].try_into().unwrap());
            pd.dst = Addr(h[24..40].try_into().unwrap());
            q.get(40..48)?
        }
        _ => return None,
    };
    match pd.proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            pd.sport = u16::from_be_bytes([l4[0], l4[1]]);
            pd.dport = u16::from_be_bytes([l4[2], l4[3]]);
            pd.tcp_seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let kind = if pd.proto == IPPROTO_ICMP { icmp::kind_v4(l4[0]) } else { icmp::kind_v6(l4[0]) };
            if !matches!(kind, icmp::Kind::Query | icmp::Kind::Reply) {
                return None;
            }
            pd.icmp_type = l4[0];
            pd.sport = u16::from_be_bytes([l4[4], l4[5]]);
            pd.dport = pd.sport;
        }
        _ => {}
    }
    pd.flags |= pdf::HAS_PORTS;
    Some(pd)
}

fn ip_error(e: Error) -> Reason {
    match e {
        Error::Truncated => Reason::Short,
        Error::BadVersion => Reason::BadIpVersion,
        Error::BadHeaderLen | Error::BadHeader => Reason::BadIpHeader,
        Error::BadLength => Reason::BadIpLength,
        Error::BadOption => Reason::BadIpOptions,
        Error::TooManyHeaders => Reason::V6HeaderChain,
    }
}

/// Parses IPv4 at `frame[off..]`.
#[inline]
pub fn parse_ipv4(frame: &[u8], off: usize, pd: &mut PDesc) -> Result<(), Parse> {
    let ip = ipv4::Packet::new_checked(&frame[off..]).map_err(ip_error)?;
    let hl = ip.header_len();
    if !ip.verify_checksum() {
        return Err(Reason::BadIpChecksum.into());
    }
    let mut opts = Options::default();
    if hl > ipv4::MIN_HEADER_LEN {
        opts = ip.check_options().map_err(ip_error)?;
    }
    pd.af = AF_INET;
    pd.proto = ip.protocol();
    pd.ttl = ip.ttl();
    // IGMP carries a router alert (RFC 2236, 3376): passed without `allow-opts`. A message to
    // all hosts must not leave the link (TTL 1, RFC 1112); one that would is dropped.
    if pd.proto == IPPROTO_IGMP {
        if ip.dst() == [224, 0, 0, 1] && pd.ttl != 1 {
            return Err(Reason::IpOption.into());
        }
        opts.router_alert = false;
    }
    if opts.any() {
        pd.flags |= pdf::IP_OPTIONS;
    }
    pd.tos = ip.tos();
    pd.src = Addr::v4(ip.src());
    pd.dst = Addr::v4(ip.dst());
    pd.ip_len = ip.total_len() as u16;
    pd.l3_off = off as u16;
    pd.l4_off = (off + hl) as u16;
    if ip.is_fragment() {
        pd.flags |= pdf::FRAGMENT;
        if ip.more_frags() {
            pd.flags |= pdf::MORE_FRAGS;
        }
        pd.frag_off = ip.frag_offset();
        pd.frag_id = ip.ident() as u32;
        if pd.frag_off != 0 {
            pd.flags |= pdf::NOT_FIRST_FRAG;
            return Ok(());
        }
    }
    let l4 = ip.payload();
    first_fragment_l4(parse_l4(l4, pd, pd.flags & pdf::FRAGMENT != 0), pd)
}

/// A first fragment too short for its transport header (the tiny-fragment trick, or just a
/// small first fragment) is still a fragment: kept for reassembly, or, without it, filtered
/// like a later fragment (no ports). A whole packet that is too short stays an error.
#[inline]
fn first_fragment_l4(r: Result<(), Parse>, pd: &mut PDesc) -> Result<(), Parse> {
    match r {
        Err(Parse::Drop(Reason::Short)) if pd.flags & pdf::FRAGMENT != 0 => {
            pd.flags = (pd.flags | pdf::NOT_FIRST_FRAG) & !pdf::HAS_PORTS;
            Ok(())
        }
        r => r,
    }
}

/// Parses IPv6 at `frame[off..]`, walking extension headers with a bound.
pub fn parse_ipv6(frame: &[u8], off: usize, pd: &mut PDesc) -> Result<(), Parse> {
    let ip = ipv6::Packet::new_checked(&frame[off..]).map_err(ip_error)?;
    let ext = ip.walk().map_err(ip_error)?;
    if ext.rh0 {
        return Err(Reason::V6RoutingType0.into());
    }
    if ext.misplaced_hbh {
        return Err(Reason::BadIpHeader.into());
    }
    if ext.options.any() {
        pd.flags |= pdf::IP_OPTIONS;
    }
    pd.af = AF_INET6;
    pd.proto = ext.proto;
    pd.ttl = ip.hop_limit();
    pd.tos = ip.traffic_class();
    pd.src = Addr(ip.src());
    pd.dst = Addr(ip.dst());
    pd.ip_len = (ipv6::HEADER_LEN + ip.payload_len()) as u16;
    pd.l3_off = off as u16;
    pd.l4_off = (off + ipv6::HEADER_LEN + ext.offset) as u16;
    let mut partial = false;
    if let Some(f) = ext.fragment {
        // An atomic fragment (offset 0, no M) is a whole packet (RFC 6946).
        if f.offset != 0 || f.more {
            pd.flags |= pdf::FRAGMENT;
            if f.more {
                pd.flags |= pdf::MORE_FRAGS;
            }
            pd.frag_off = f.offset;
            pd.frag_id = f.ident;
            partial = true;
            if f.offset != 0 {
                pd.flags |= pdf::NOT_FIRST_FRAG;
                return Ok(());
            }
        }
    }
    let l4 = &ip.payload()[ext.offset..];
    first_fragment_l4(parse_l4(l4, pd, partial), pd)?;
    if pd.proto == IPPROTO_ICMPV6 {
        if icmp::is_mld(pd.icmp_type) {
            mld(pd, ext.options)?;
        } else if icmp::is_nd(pd.icmp_type) {
            nd(pd, l4)?;
        }
    }
    Ok(())
}

/// Neighbour discovery (RFC 4861). A message whose hop limit is not 255 was routed here from
/// off the link, which RFC 4861 forbids: dropped, as pf drops it (normalize). A neighbour
/// solicitation and the advertisement that answers it are a query and its reply, as in pf's
/// pf_icmp_mapping: ports (identifier, 135) for the solicitation, (135, identifier) for the
/// advertisement, the identifier pf's fold of the target ([`icmp::nd_id`]); one too short to
/// hold its target is dropped as short.
#[cold]
fn nd(pd: &mut PDesc, l4: &[u8]) -> Result<(), Parse> {
    if pd.ttl != 255 {
        return Err(Reason::Normalize.into());
    }
    if matches!(pd.icmp_type, icmp::V6_NEIGHBOR_SOLICIT | icmp::V6_NEIGHBOR_ADVERT) {
        let m = icmp::Packet::new_checked(l4).map_err(|_| Reason::Short)?;
        let id = icmp::nd_id(&m.nd_target().ok_or(Reason::Short)?);
        let sol = icmp::V6_NEIGHBOR_SOLICIT as u16;
        (pd.sport, pd.dport) = if pd.icmp_type == icmp::V6_NEIGHBOR_SOLICIT { (id, sol) } else { (sol, id) };
        pd.flags |= pdf::ND;
    }
    Ok(())
}

/// The descriptor of `frame` (whose descriptor `pd` has [`pdf::ND`]) with the addresses its
/// state is keyed by, as pf's pf_state_key_addr_setup sets them: a solicitation's destination
/// is its target (a solicited-node multicast address names only the target's last 24 bits),
/// an advertisement's source is its target and a multicast destination is the unspecified
/// address (the answer to a duplicate address probe from ::). An advertisement then finds
/// the state of the solicitation it answers, wherever it was sent. Rules match the packet's
/// own addresses, in `pd`.
pub fn nd_key(frame: &[u8], pd: &PDesc) -> PDesc {
    let mut k = *pd;
    let target =
        frame.get(pd.l4_off as usize..).and_then(|l4| icmp::Packet::new_checked(l4).ok()).and_then(|m| m.nd_target());
    if let Some(t) = target {
        if pd.icmp_type == icmp::V6_NEIGHBOR_SOLICIT {
            k.dst = Addr(t);
        } else {
            k.src = Addr(t);
            if pd.dst.0[0] == 0xff {
                k.dst = Addr::default();
            }
        }
    }
    k
}

/// MLD (RFC 2710, 3810) carries a router alert: passed without `allow-opts` when it is
/// valid, which is from a link-local address with hop limit 1, or from the unspecified
/// address for a report (RFC 3590: a node without a link-local address yet). An invalid one
/// is dropped, as pf does (which refuses the unspecified source too).
#[cold]
fn mld(pd: &mut PDesc, opts: Options) -> Result<(), Parse> {
    let src = pd.src.0;
    let link_local = src[0] == 0xfe && src[1] & 0xc0 == 0x80;
    let report = matches!(pd.icmp_type, icmp::MLD_REPORT | icmp::MLD2_REPORT);
    if pd.ttl != 1 || !(link_local || (report && src == [0; 16])) {
        return Err(Reason::IpOption.into());
    }
    if !opts.other {
        pd.flags &= !pdf::IP_OPTIONS;
    }
    Ok(())
}

/// Transport header. `partial`: the packet is a first fragment, so the transport length may
/// exceed what is here; only the header itself must be present.
#[inline]
fn parse_l4(l4: &[u8], pd: &mut PDesc, partial: bool) -> Result<(), Parse> {
    match pd.proto {
        IPPROTO_UDP => {
            if partial {
                let h = l4.get(..udp::HEADER_LEN).ok_or(Reason::Short)?;
                pd.sport = u16::from_be_bytes([h[0], h[1]]);
                pd.dport = u16::from_be_bytes([h[2], h[3]]);
            } else {
                let u = udp::Packet::new_checked(l4).map_err(|e| match e {
                    Error::Truncated => Reason::Short,
                    _ => Reason::BadL4Header,
                })?;
                pd.sport = u.src_port();
                pd.dport = u.dst_port();
                pd.payload_len = (u.len() - udp::HEADER_LEN) as u16;
            }
            pd.flags |= pdf::HAS_PORTS;
        }
        IPPROTO_TCP => {
            let t = tcp::Packet::new_checked(l4).map_err(|e| match e {
                Error::Truncated => Reason::Short,
                _ => Reason::BadOffset,
            })?;
            pd.sport = t.src_port();
            pd.dport = t.dst_port();
            pd.tcp_flags = t.flags();
            pd.tcp_seq = t.seq();
            pd.tcp_ack = t.ack();
            pd.tcp_win = t.window();
            pd.payload_len = (l4.len() - t.header_len()) as u16;
            if pd.tcp_flags & tcp::SYN != 0 && t.header_len() > 20 {
                pd.tcp_wscale = wscale_of(&l4[20..t.header_len()]);
            }
            pd.flags |= pdf::HAS_PORTS;
            if t.reserved() != 0 || pd.tcp_flags & tcp::URG == 0 && t.urgent() != 0 {
                pd.flags |= pdf::TCP_UNCLEAN;
            }
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let m = icmp::Packet::new_checked(l4).map_err(|_| Reason::Short)?;
            pd.icmp_type = m.msg_type();
            pd.icmp_code = m.code();
            let kind = if pd.proto == IPPROTO_ICMP { icmp::kind_v4(m.msg_type()) } else { icmp::kind_v6(m.msg_type()) };
            match kind {
                icmp::Kind::Query | icmp::Kind::Reply => {
                    pd.sport = m.ident();
                    pd.dport = m.ident();
                    pd.flags |= pdf::HAS_PORTS;
                }
                icmp::Kind::Error => pd.flags |= pdf::ICMP_ERROR,
                // pf's other types: a state of their own (ports 0 and the type, as
                // pf_icmp_mapping keys them), which only their own direction matches.
                icmp::Kind::Other => pd.dport = m.msg_type() as u16,
            }
            pd.payload_len = (l4.len() - icmp::HEADER_LEN) as u16;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn udp4_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        ipv4::emit_header(&mut f[14..], src, dst, 17, 46, 64, 1);
        udp::emit_header(&mut f[34..], sport, dport, 26);
        f
    }

    #[test]
    fn link_scoped_packets_are_those_no_router_forwards() {
        let v6 = |src: &str, dst: &str, proto: u8, t: u8| {
            let a = |x: &str| Addr(x.parse::<std::net::Ipv6Addr>().unwrap().octets());
            PDesc { af: AF_INET6, src: a(src), dst: a(dst), proto, icmp_type: t, ..PDesc::default() }
        };
        let v4 = |src: [u8; 4], dst: [u8; 4]| PDesc {
            af: AF_INET,
            src: Addr::v4(src),
            dst: Addr::v4(dst),
            ..PDesc::default()
        };
        let (g1, g2) = ("2001:db8::1", "2001:db8:1::2");
        // Neighbour discovery and MLD between global addresses: by their type.
        for t in [icmp::V6_NEIGHBOR_SOLICIT, icmp::V6_NEIGHBOR_ADVERT, icmp::V6_ROUTER_ADVERT, icmp::MLD2_REPORT] {
            let pd = v6(g1, g2, IPPROTO_ICMPV6, t);
            assert!(pd.link_control() && pd.link_scoped(), "type {t}");
            let later = PDesc { flags: pdf::FRAGMENT | pdf::NOT_FIRST_FRAG, ..pd };
            assert!(!later.link_control(), "a later fragment's type is not read");
        }
        for (src, dst) in [
            ("fe80::1", g2),
            (g1, "fe80::2"),
            ("::", "ff02::16"),
            (g1, "ff02::1:ff00:2"),
            (g1, "ff12::9"),
            (g1, "ff01::1"),
        ] {
            assert!(v6(src, dst, IPPROTO_UDP, 0).link_scoped(), "{src} -> {dst}");
        }
        for (src, dst, proto, t) in [
            (g1, g2, IPPROTO_UDP, 0),
            (g1, g2, IPPROTO_ICMPV6, icmp::V6_ECHO_REQUEST),
            (g1, "ff05::2", IPPROTO_UDP, 0),
            (g1, "ff0e::1", IPPROTO_UDP, 0),
        ] {
            let pd = v6(src, dst, proto, t);
            assert!(!pd.link_scoped() && !pd.link_control(), "{src} -> {dst} {proto}/{t}");
        }
        for (src, dst) in [
            ([0; 4], [255; 4]),
            ([169, 254, 1, 1], [10, 0, 0, 1]),
            ([10, 0, 0, 1], [169, 254, 9, 9]),
            ([10, 0, 0, 1], [224, 0, 0, 22]),
        ] {
            assert!(v4(src, dst).link_scoped(), "{src:?} -> {dst:?}");
        }
        for (src, dst) in
            [([10, 0, 0, 1], [192, 0, 2, 1]), ([10, 0, 0, 1], [224, 0, 1, 1]), ([10, 0, 0, 1], [239, 1, 1, 1])]
        {
            assert!(!v4(src, dst).link_scoped(), "{src:?} -> {dst:?}");
        }
    }

    #[test]
    fn udp4() {
        let f = udp4_frame([198, 18, 10, 1], [198, 19, 10, 1], 2000, 2000);
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!(pd.af, AF_INET);
        assert_eq!(pd.proto, IPPROTO_UDP);
        assert_eq!(pd.src.v4_bytes(), [198, 18, 10, 1]);
        assert_eq!(pd.dst.v4_bytes(), [198, 19, 10, 1]);
        assert_eq!((pd.sport, pd.dport), (2000, 2000));
        assert_eq!((pd.l3_off, pd.l4_off, pd.ip_len, pd.payload_len), (14, 34, 46, 18));
        assert_eq!(pd.flags, pdf::HAS_PORTS);
    }

    #[test]
    fn vlan_tagged_udp4() {
        let plain = udp4_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let mut f = plain[..12].to_vec();
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
        f.extend_from_slice(&plain[12..]);
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!(pd.vlan_tci, 10);
        assert_eq!(pd.l3_off, 18);
        assert!(pd.flags & pdf::VLAN != 0);
    }

    #[test]
    fn bad_ip_checksum_and_not_ip() {
        let mut f = udp4_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        f[24] ^= 0xff;
        let mut pd = PDesc::default();
        assert_eq!(parse_ether(&f, &mut pd), Err(Parse::Drop(Reason::BadIpChecksum)));
        f[12] = 0x08;
        f[13] = 0x06;
        assert_eq!(parse_ether(&f, &mut PDesc::default()), Err(Parse::NotIp(0x0806)));
        assert_eq!(parse_ether(&f[..10], &mut PDesc::default()), Err(Parse::Drop(Reason::Short)));
    }

    #[test]
    fn tcp4_syn_and_fragments() {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12] = 0x08;
        ipv4::emit_header(&mut f[14..], [10, 0, 0, 1], [10, 0, 0, 2], 6, 40, 64, 9);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        f[38..42].copy_from_slice(&7u32.to_be_bytes());
        f[46] = 0x50;
        f[47] = tcp::SYN;
        f[48..50].copy_from_slice(&1000u16.to_be_bytes());
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!((pd.sport, pd.dport, pd.tcp_flags, pd.tcp_seq, pd.tcp_win), (1234, 80, tcp::SYN, 7, 1000));
        // Now a non-first fragment: no ports.
        let mut g = f.clone();
        g[20] = 0x00;
        g[21] = 0x02;
        ipv4::Packet::new_checked(&mut g[14..]).unwrap().fill_checksum();
        let mut pd = PDesc::default();
        parse_ether(&g, &mut pd).unwrap();
        assert_eq!(
            pd.flags & (pdf::FRAGMENT | pdf::NOT_FIRST_FRAG | pdf::HAS_PORTS),
            pdf::FRAGMENT | pdf::NOT_FIRST_FRAG
        );
        assert_eq!(pd.frag_off, 16);
        // Truncated TCP data offset.
        let mut h = f.clone();
        h[46] = 0xf0;
        assert_eq!(parse_ether(&h, &mut PDesc::default()), Err(Parse::Drop(Reason::Short)));
        h[46] = 0x30;
        assert_eq!(parse_ether(&h, &mut PDesc::default()), Err(Parse::Drop(Reason::BadOffset)));
    }

    #[test]
    fn icmp6_echo_and_error() {
        let mut f = vec![0u8; 14 + 40 + 8];
        f[12] = 0x86;
        f[13] = 0xdd;
        f[14] = 0x60;
        f[19] = 8;
        f[20] = IPPROTO_ICMPV6;
        f[21] = 64;
        f[22] = 0xfe;
        f[38] = 0xfe;
        f[54] = icmp::V6_ECHO_REQUEST;
        f[58] = 0xab;
        f[59] = 0xcd;
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!((pd.af, pd.proto, pd.sport, pd.dport), (AF_INET6, IPPROTO_ICMPV6, 0xabcd, 0xabcd));
        assert_eq!(pd.l4_off, 54);
        f[54] = icmp::V6_TIME_EXCEEDED;
        let mut pd = PDesc::default();
        parse_ether(&f, &mut pd).unwrap();
        assert_eq!(pd.flags & (pdf::ICMP_ERROR | pdf::HAS_PORTS), pdf::ICMP_ERROR);
    }

    /// An IPv6 frame: hop limit `hlim`, from `src` to ff02::16, a hop-by-hop header with
    /// `opts` (six bytes) when given, then 8 bytes of ICMPv6 type `t` (or UDP when `t` is 0).
    fn v6_with_options(src: [u8; 16], hlim: u8, opts: Option<[u8; 6]>, t: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let next = if t == 0 { IPPROTO_UDP } else { IPPROTO_ICMPV6 };
        let mut pl = Vec::new();
        if let Some(o) = opts {
            pl.extend_from_slice(&[next, 0]);
            pl.extend_from_slice(&o);
        }
        pl.extend_from_slice(&if t == 0 { [0, 1, 0, 2, 0, 8, 0, 0] } else { [t, 0, 0, 0, 0, 0, 0, 0] });
        let mut ip = [0u8; 40];
        let dst = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16];
        ipv6::emit_header(
            &mut ip,
            &src,
            &dst,
            if opts.is_some() { ipv6::NH_HOPOPTS } else { next },
            pl.len() as u16,
            hlim,
        );
        f.extend_from_slice(&ip);
        f.extend_from_slice(&pl);
        f
    }

    #[test]
    fn router_alert_passes_on_mld_and_igmp_only() {
        let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let global = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let ra = Some([ipv6::OPT_ROUTER_ALERT, 2, 0, 0, ipv6::OPT_PADN, 0]);
        let parse = |f: Vec<u8>| {
            let mut pd = PDesc::default();
            parse_ether(&f, &mut pd).map(|_| pd.flags & pdf::IP_OPTIONS != 0)
        };
        // MLD with its router alert: no options for the rules; without the header the same.
        assert_eq!(parse(v6_with_options(ll, 1, ra, icmp::MLD2_REPORT)), Ok(false));
        assert_eq!(parse(v6_with_options(ll, 1, None, icmp::MLD_QUERY)), Ok(false));
        // A report before the node has a link-local address (RFC 3590); a query may not.
        assert_eq!(parse(v6_with_options([0; 16], 1, ra, icmp::MLD2_REPORT)), Ok(false));
        assert_eq!(parse(v6_with_options([0; 16], 1, ra, icmp::MLD_QUERY)), Err(Parse::Drop(Reason::IpOption)));
        // Invalid MLD: routed (hop limit 64) or from a global address, options or not.
        assert_eq!(parse(v6_with_options(ll, 64, ra, icmp::MLD_REPORT)), Err(Parse::Drop(Reason::IpOption)));
        assert_eq!(parse(v6_with_options(global, 1, None, icmp::MLD_DONE)), Err(Parse::Drop(Reason::IpOption)));
        // A router alert on anything else, or MLD with another option too: for allow-opts.
        assert_eq!(parse(v6_with_options(ll, 1, ra, 0)), Ok(true));
        assert_eq!(parse(v6_with_options(ll, 1, ra, icmp::V6_ECHO_REQUEST)), Ok(true));
        assert_eq!(
            parse(v6_with_options(ll, 1, Some([ipv6::OPT_ROUTER_ALERT, 2, 0, 0, 0x1e, 0]), icmp::MLD2_REPORT)),
            Ok(true)
        );
        assert_eq!(parse(v6_with_options(ll, 1, Some([ipv6::OPT_PADN, 4, 0, 0, 0, 0]), icmp::MLD2_REPORT)), Ok(true));
        // IPv4: IGMP with a router alert passes; UDP with one does not; an IGMP message to
        // all hosts that could leave the link is dropped.
        let v4 = |proto: u8, dst: [u8; 4], ttl: u8| {
            let mut f = vec![0u8; 14 + 24 + 8];
            f[12] = 0x08;
            ipv4::emit_header(&mut f[14..], [10, 0, 0, 1], dst, proto, 32, ttl, 1);
            f[14] = 0x46;
            f[34..38].copy_from_slice(&[ipv4::OPT_ROUTER_ALERT, 4, 0, 0]);
            if proto == IPPROTO_UDP {
                udp::emit_header(&mut f[38..], 1, 2, 8);
            }
            ipv4::Packet::new_checked(&mut f[14..]).unwrap().fill_checksum();
            f
        };
        assert_eq!(parse(v4(IPPROTO_IGMP, [224, 0, 0, 22], 1)), Ok(false));
        assert_eq!(parse(v4(IPPROTO_IGMP, [224, 0, 0, 1], 1)), Ok(false));
        assert_eq!(parse(v4(IPPROTO_IGMP, [224, 0, 0, 1], 2)), Err(Parse::Drop(Reason::IpOption)));
        assert_eq!(parse(v4(IPPROTO_UDP, [224, 0, 0, 22], 1)), Ok(true));
    }

    proptest::proptest! {
        /// The fast path must give exactly what the general parser gives, on any bytes.
        #[test]
        fn fast_path_agrees_with_general(mut f in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80usize), udp in proptest::prelude::any::<bool>(), fix in proptest::prelude::any::<bool>()) {
            if fix && f.len() >= 42 {
                // Bias towards frames that reach the fast path.
                f[12] = 8; f[13] = 0; f[14] = 0x45; f[20] &= 0x80; f[21] = 0; f[23] = if udp { 17 } else { 6 };
                let total = (f.len() - 14) as u16;
                f[16..18].copy_from_slice(&total.to_be_bytes());
                ipv4::Packet::new_checked(&mut f[14..]).unwrap().fill_checksum();
            }
            let mut a = PDesc::default();
            let mut b = PDesc::default();
            let ra = parse_ether(&f, &mut a);
            let rb = parse_ether_general(&f, &mut b);
            proptest::prop_assert_eq!(ra, rb);
            if ra.is_ok() {
                proptest::prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn raw_ip() {
        let f = udp4_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let mut pd = PDesc::default();
        parse_raw_ip(&f[14..], &mut pd).unwrap();
        assert_eq!(pd.l3_off, 0);
        assert_eq!(parse_raw_ip(&[0x50], &mut PDesc::default()), Err(Parse::Drop(Reason::BadIpVersion)));
        assert_eq!(parse_raw_ip(&[], &mut PDesc::default()), Err(Parse::Drop(Reason::Short)));
    }
}
