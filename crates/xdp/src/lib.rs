//! xpf-xdp: how xpf meets the kernel. Its XDP programs (bpf/*.c, compiled by build.rs) and
//! their loader ([`bpf`]), the fast path's flow tables ([`flows`]), AF_XDP sockets ([`xsk`]), the rtnetlink requests it makes
//! ([`netlink`]), the layout of what the steering program writes in front of each frame
//! ([`steer`]), transmit through XDP ([`txlane`]), the AF_PACKET fallback ([`packet`]) and its fast path ([`skbpath`]) and the port type the dataplane uses for
//! either ([`port`]).

pub mod bpf;
pub mod flows;
pub mod netlink;
pub mod nfqueue;
pub mod packet;
pub mod port;
pub mod skbpath;
pub mod steer;
pub mod txlane;
pub mod xsk;
