//! Every capture of ../shared/peer/pcaps (third-party, odd and malformed traffic) goes through
//! the engine: nothing may panic, every record must be accounted for, and where the content is
//! known (shared/peer/pcaps/MANIFEST.md) the verdicts must say why.

use std::path::PathBuf;
use xpf_bench::replay::{replay_file, Report};
use xpf_engine::PassAll;
use xpf_wire::Reason;

fn pcaps_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer/pcaps");
    assert!(d.is_dir(), "{} is missing: the test suite needs ../shared beside the checkout", d.display());
    d
}

fn replay(rel: &str) -> Report {
    replay_file(&pcaps_dir().join(rel), PassAll, true).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn all_captures_replay_and_every_record_is_accounted_for() {
    let mut files = Vec::new();
    for sub in std::fs::read_dir(pcaps_dir()).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                let name = f.to_string_lossy().to_string();
                if name.ends_with(".pcap") || name.ends_with(".pcapng") {
                    files.push(f);
                }
            }
        }
    }
    assert_eq!(files.len(), 43, "the manifest lists 43 captures");
    let mut total = 0;
    for f in &files {
        let r = replay_file(f, PassAll, true).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        // Fragments of datagrams that never completed are still held at the end.
        assert_eq!(r.passed + r.dropped_total() + r.to_host + r.skipped + r.held, r.records, "{}: {r:?}", f.display());
        total += r.records;
    }
    assert!(total > 1000);
}

#[test]
fn malformed_ip_headers_are_dropped_with_their_reason() {
    assert_eq!(replay("tcpdump/ipv4_invalid_hdr_length.pcap").dropped(Reason::BadIpHeader), 1);
    // Total length beyond the captured bytes, and a header cut by the snap length.
    assert_eq!(replay("tcpdump/ipv4_invalid_total_length.pcap").dropped(Reason::Short), 1);
    assert_eq!(replay("tcpdump/ipv4_invalid_length.pcap").dropped(Reason::Short), 1);
    assert_eq!(replay("suricata-verify/ipv4-truncated__truncated.pcap").dropped(Reason::Short), 1);
    let v6 = replay("tcpdump/ipv6-bad-version.pcap");
    assert_eq!(v6.dropped(Reason::BadIpVersion), 2);
    assert_eq!(replay("tcpdump/ipv6_frag6_negative_len.pcap").dropped(Reason::BadIpLength), 1);
    assert_eq!(replay("tcpdump/ipv6_invalid_length.pcap").dropped(Reason::Short), 1);
    assert_eq!(replay("tcpdump/ip6_frag_asan.pcap").dropped(Reason::Short), 1);
}

#[test]
fn truncated_transport_headers_are_short() {
    assert_eq!(replay("tcpdump/tcp_header_heapoverflow.pcap").dropped(Reason::Short), 1);
    assert_eq!(replay("tcpdump/udp-length-heapoverflow.pcap").dropped(Reason::Short), 1);
    let r = replay("suricata-verify/decode-too-small__test.pcap");
    assert_eq!(r.dropped_total(), 6, "{r:?}"); // tshark flags the same six as malformed
}

#[test]
fn deprecated_routing_header_type_0_is_dropped() {
    let r = replay("tcpdump/ipv6-routing-header.pcap");
    assert_eq!(r.dropped(Reason::V6RoutingType0), 4, "{r:?}");
}

#[test]
fn ip_options_are_dropped_without_allow_opts_mid_session() {
    // One packet of the session carries an IPv4 option; pass-all has no allow-opts.
    let r = replay("suricata-verify/firewall__tcp-session-decode-malformed-ipv4__input.pcap");
    assert_eq!(r.dropped(Reason::IpOption), 1, "{r:?}");
    assert_eq!(r.passed, 10);
    assert_eq!(r.states, 1);
}

#[test]
fn known_sessions_make_the_states_they_should() {
    assert_eq!(replay("tcpdump/ssh.pcap").states, 1);
    assert_eq!(replay("tcpdump/dns_tcp.pcap").states, 1);
    // 200 SYNs from different sources: 200 states.
    assert_eq!(replay("suricata-verify/firewall__tcp-session-syn-flood-drop-precedence__input.pcap").states, 200);
    // A flow picked up midstream has no SYN: flags S/SA creates no state.
    assert_eq!(replay("suricata-verify/firewall__tcp-session-midstream-policy__input.pcap").states, 0);
    // Link types other than Ethernet: raw IPv4, Linux SLL (nanosecond pcap).
    assert_eq!(replay("tcpdump/LINKTYPE_RAW_ipv4.pcap").states, 1);
    assert_eq!(replay("tcpdump/tcp-handshake-nano.pcap").states, 1);
    let teardrop = replay("wireshark-wiki-via-filesamples/teardrop.pcap");
    assert_eq!(teardrop.to_host, 11, "ARP, CDP and the like go to the host: {teardrop:?}");
}

#[test]
fn tcp_data_outside_the_window_is_dropped_and_real_sessions_are_not() {
    // SYN, SYN/ACK, then data 100,001 bytes past the window (IPv4 and IPv6).
    for f in [
        "suricata-verify/firewall__tcp-session-stream-out-of-window__input.pcap",
        "suricata-verify/firewall__tcp-session-ipv6-stream-out-of-window__input.pcap",
    ] {
        let r = replay(f);
        assert_eq!((r.passed, r.dropped(Reason::StateMismatch), r.states), (2, 1, 1), "{f}: {r:?}");
    }
    // Whole sessions with handshakes, data both ways and teardowns: every segment in window.
    for (f, n) in [("tcpdump/ssh.pcap", 54), ("tcpdump/print-flags.pcap", 10), ("tcpdump/dns_tcp.pcap", 11)] {
        let r = replay(f);
        assert_eq!((r.passed, r.dropped_total()), (n, 0), "{f}: {r:?}");
    }
}

fn replay_with(rel: &str, conf: &str) -> Report {
    let p = xpf_conf::parse(conf, "test.conf", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let rs = xpf_conf::Ruleset::compile(&p, &|_| Some(1)).unwrap();
    replay_file(&pcaps_dir().join(rel), rs, p.reassemble != Some(false)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn teardrop_fragments_never_pass() {
    // Two fragments of id 0xf2: the first 36 data bytes with MF (not a multiple of 8: a bad
    // fragment), the second at offset 24, overlapping it. Nothing of the datagram passes.
    let r = replay("wireshark-wiki-via-filesamples/teardrop.pcap");
    assert_eq!(r.dropped(Reason::Fragment), 1, "{r:?}");
    assert_eq!(r.held, 1, "the second waits for a first that will never be valid");
    assert_eq!(r.passed, 4, "the DNS and the rest of the noise pass");
    assert!(r.info.contains("bad length"), "{}", r.info);
    // Without reassembly pf passes fragments to the rules: pass all lets both through.
    let plain = replay_with("wireshark-wiki-via-filesamples/teardrop.pcap", "set reassemble no\npass all\n");
    assert_eq!(plain.dropped(Reason::Fragment), 0);
    assert_eq!(plain.passed, 6);
}

#[test]
fn a_tcp_syn_in_three_fragments_is_reassembled_and_makes_its_state() {
    // The first fragment is too short for the TCP header: only the reassembled datagram has
    // ports, and flags S/SA sees the SYN.
    let r = replay("suricata-verify/defrag__bug-6887-defrag-ipv4-tcp-syn__frag-ip-tcp-syn.pcap");
    assert_eq!((r.passed, r.held, r.states), (3, 0, 1), "{r:?}");
    // A ruleset that passes only port 80 decides on the whole datagram.
    // (12345 -> 8080, 8 bytes of TCP header per fragment.)
    let f = "suricata-verify/defrag__bug-6887-defrag-ipv4-tcp-syn__frag-ip-tcp-syn.pcap";
    let r = replay_with(f, "block all\npass in proto tcp to port 8080\n");
    assert_eq!((r.passed, r.states), (3, 1), "{r:?}");
    let r = replay_with(f, "block all\npass in proto tcp to port 8081\n");
    assert_eq!(r.dropped(Reason::Match), 3, "{r:?}");
    // Without reassembly a fragment's ports are not read (pf's way): a port rule passes none
    // of them, and pf counts each as a blocked fragment.
    let r = replay_with(f, "set reassemble no\nblock all\npass in proto tcp to port 8080\n");
    assert_eq!(r.dropped(Reason::Fragment), 3, "{r:?}");
}

#[test]
fn overlapping_ipv6_fragments_are_dropped() {
    for f in ["frag-1", "frag-2"] {
        let r = replay(&format!("suricata-verify/ipv6-evasion__ipv6-malformed-fragments-{}__{f}.pcap", &f[5..]));
        assert_eq!(r.dropped(Reason::Fragment), 4, "{f}: {r:?}");
        assert!(r.info.contains("overlapping"), "{}", r.info);
    }
}

#[test]
fn afs_rpc_fragments_all_reassemble() {
    let r = replay("tcpdump/afs.pcap");
    assert_eq!((r.passed, r.held, r.dropped_total()), (601, 0, 0), "{r:?}");
}

#[test]
fn a_syn_flood_fills_only_what_the_limits_allow() {
    let flood = "suricata-verify/firewall__tcp-session-syn-flood-drop-precedence__input.pcap";
    let r = replay(flood);
    assert_eq!((r.passed, r.states), (200, 200), "200 SYNs, 200 half-open states");
    let r = replay_with(flood, "set limit states 1000\npass in proto tcp keep state (max 50)\n");
    assert_eq!((r.passed, r.states, r.dropped(Reason::StateLimit)), (50, 50, 150), "{r:?}");
    let r = replay_with(flood, "pass in proto tcp keep state (max-src-states 20)\n");
    assert_eq!(r.passed + r.dropped(Reason::SrcLimit), 200, "{r:?}");
    assert!(r.dropped(Reason::SrcLimit) > 0 && r.info.contains("max-src-states"), "{r:?}");
}
