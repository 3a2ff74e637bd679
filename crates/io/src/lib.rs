//! xpf-io: where packets come from and go to, kept apart from the logic they feed.
//!
//! [`pcap`] reads capture files (pcap, microsecond or nanosecond, either byte order, and
//! pcapng) for replay and tests; [`gen`] makes frames in memory the way netmap's pkt-gen steps
//! its address ranges, for the benches. The AF_XDP and AF_PACKET backends of the daemon will
//! live here too.

pub mod gen;
pub mod pcap;
pub mod pflog;
pub mod rawip;
pub mod replay;
