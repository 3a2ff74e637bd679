#!/usr/bin/env bash
# Installs what the build, the tests and the benches need and the machine lacks.
# Debian's packages through apt-get (as root); everything else comes with cargo.
set -euo pipefail

need=()
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox)   # the benches' PNG plots
command -v cc >/dev/null 2>&1 || need+=(gcc)                # libfuzzer-sys, cc-using crates
command -v ip >/dev/null 2>&1 || need+=(iproute2)           # the pf.conf conformance test's network namespace
command -v clang >/dev/null 2>&1 || need+=(clang)              # the XDP programs (crates/xdp/bpf)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)          # the scenario tests (reading the hosts' offload settings; veth GRO for the fast path)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)            # demo and scenario tests
command -v nc >/dev/null 2>&1 || need+=(netcat-openbsd)         # scenario tests
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)         # demo and scenario tests
command -v curl >/dev/null 2>&1 || need+=(curl)                # demo and scenario tests
command -v nft >/dev/null 2>&1 || need+=(nftables)              # the lab: the kernel firewall xpf is compared with
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)       # the lab: warming and counting the kernel's states
command -v traceroute >/dev/null 2>&1 || need+=(traceroute)     # scenario tests (ICMP time exceeded through xpfd)
command -v keepalived >/dev/null 2>&1 || need+=(keepalived)     # the failover scenario (VRRP between two xpfd)
command -v bc >/dev/null 2>&1 || need+=(bc)                     # the failover scenario (timing)
command -v iptables >/dev/null 2>&1 || need+=(iptables)         # xpfd: queues the host's own traffic to the filter (NFQUEUE)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)           # the failover scenario (captures the sync link), observe.sh (reads pflog)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)       # observe.sh: promtool lints the metrics page, a Prometheus server scrapes it
command -v nfcapd >/dev/null 2>&1 || need+=(nfdump)             # observe.sh: nfcapd collects xpfd's IPFIX and NetFlow v5, nfdump reads it
/usr/bin/python3 -c 'import scapy' >/dev/null 2>&1 || need+=(python3-scapy)  # scenario tests (crafted TCP segments)

if ! command -v cargo >/dev/null 2>&1; then
    echo "deps: cargo is not installed; xpf needs Rust 1.95 (rustup)" >&2
    exit 1
fi

if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
        exit 1
    fi
    echo "deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # The failover scenario runs its own keepalived in namespaces; the system's has no config.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now keepalived >/dev/null 2>&1 || true; fi
    # Likewise Prometheus and nfcapd: the tests run their own.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus nfdump >/dev/null 2>&1 || true; fi
fi
