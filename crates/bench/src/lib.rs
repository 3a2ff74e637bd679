//! The lab's library part: what the `xpf-bench` binary and the test suite share.

pub mod replay;
pub mod rulegen;
