//! xpf-wire: wire formats as checked views over bytes, and the packet descriptor.
//!
//! Each protocol module has a `Packet<T: AsRef<[u8]>>` view whose `new_checked` validates the
//! lengths once, so that no accessor can panic afterwards (the smoltcp pattern). [`pdesc`]
//! fills one [`PDesc`] per packet from those views; every later stage reads the descriptor.
//! Malformed input never panics: it yields a [`Reason`], which the engine counts.
//!
//! Modules follow the packet inward: [`ethernet`] (and 802.1Q), [`ipv4`], [`ipv6`], [`tcp`],
//! [`udp`], [`icmp`]; [`checksum`] has the full and incremental (RFC 1624) checksums.

pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod nlattr;
pub mod offload;
pub mod pdesc;
pub mod tcp;
pub mod translate;
pub mod udp;

pub use pdesc::{parse_ether, parse_raw_ip, Addr, PDesc, Parse};

/// What a packet's IP options (IPv4) or hop-by-hop, routing and destination options (IPv6)
/// are, for the filter: a router alert alone is let through on IGMP and MLD, which carry it
/// by their RFCs; anything else is for rules with `allow-opts`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// A router alert (IPv4 option 148, IPv6 hop-by-hop option 5).
    pub router_alert: bool,
    /// Any other option, or options of padding only (as pf: an options header that carries
    /// nothing is suspect).
    pub other: bool,
}

impl Options {
    /// Any option the rules must allow (`allow-opts`).
    #[inline(always)]
    pub fn any(self) -> bool {
        self.router_alert | self.other
    }
}

/// Why a view refused a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the header (or the length it declares) does.
    Truncated,
    /// Wrong IP version nibble.
    BadVersion,
    /// A header length field below the minimum.
    BadHeaderLen,
    /// A length field inconsistent with the header.
    BadLength,
    /// An option with a bad length.
    BadOption,
    /// A malformed or repeated extension header.
    BadHeader,
    /// More IPv6 extension headers than [`ipv6::MAX_EXT_HEADERS`].
    TooManyHeaders,
}

macro_rules! reasons {
    ($($var:ident = $name:literal,)*) => {
        /// Why a packet was dropped (or, for `Match`, that a rule decided it). The first
        /// seventeen are pf's `PFRES_*` counters in pf's order, as `pfctl -si` prints them; the
        /// rest are xpf's finer reasons for malformed input.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Reason { $($var,)* }

        impl Reason {
            pub const ALL: &'static [Reason] = &[$(Reason::$var,)*];
            pub const COUNT: usize = Self::ALL.len();
            /// The counter's name, as pfctl spells it.
            pub fn name(self) -> &'static str {
                match self { $(Reason::$var => $name,)* }
            }
        }
    };
}

reasons! {
    Match = "match",
    BadOffset = "bad-offset",
    Fragment = "fragment",
    Short = "short",
    Normalize = "normalize",
    Memory = "memory",
    BadTimestamp = "bad-timestamp",
    Congestion = "congestion",
    IpOption = "ip-option",
    ProtoCksum = "proto-cksum",
    StateMismatch = "state-mismatch",
    StateInsert = "state-insert",
    StateLimit = "state-limit",
    SrcLimit = "src-limit",
    Synproxy = "synproxy",
    Translate = "translate",
    NoRoute = "no-route",
    BadIpVersion = "bad-ip-version",
    BadIpHeader = "bad-ip-header",
    BadIpLength = "bad-ip-length",
    BadIpChecksum = "bad-ip-checksum",
    BadIpOptions = "bad-ip-options",
    BadL4Header = "bad-l4-header",
    V6HeaderChain = "ip6-header-chain",
    V6RoutingType0 = "ip6-rh0",
    PktRate = "pkt-rate",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pf_reasons_keep_pf_order() {
        assert_eq!(Reason::Match as u8, 0);
        assert_eq!(Reason::StateLimit as u8, 12);
        assert_eq!(Reason::NoRoute as u8, 16);
        assert_eq!(Reason::ALL.len(), Reason::COUNT);
        assert_eq!(Reason::StateLimit.name(), "state-limit");
    }
}
