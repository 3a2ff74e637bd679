//! xpf-xdp: how xpf meets the kernel. Its XDP programs (bpf/*.c, compiled by build.rs) and
//! their loader ([`bpf`]), AF_XDP sockets ([`xsk`]), the rtnetlink requests it makes
//! ([`netlink`]) and the layout of what the steering program writes in front of each frame
//! ([`steer`]).

pub mod bpf;
pub mod netlink;
pub mod steer;
pub mod xsk;
