//! States for tests and benches to fill tables with.

use crate::{Dir, Key, NewState, Peer, Timeout};

/// An established TCP state (both peers ESTABLISHED) with these windows, made by an inbound
/// packet, rule 1: what a firewall in front of busy clients holds, or a standby learns.
pub fn established_tcp<K: Key>(key: K, peers: [Peer; 2]) -> NewState<K> {
    NewState {
        key,
        stack: None,
        dir: Dir::In,
        rule: 1,
        timeout: Timeout::TcpEstablished,
        src_state: 4,
        dst_state: 4,
        tcp: Some(peers),
        nosync: false,
        allow_opts: false,
        sloppy: false,
        tag: 0,
        scrub: 0,
        rate: 0,
        pflow: false,
        log: 0,
        queue: 0,
        route: 0,
        held: 0,
    }
}
