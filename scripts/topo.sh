#!/usr/bin/env bash
# Builds and removes the three-host lab the demo and the scenario tests use:
#
#   netns ${P}client [c0] 10.0.1.2/24 fd00:1::2/64
#        |  veth
#   netns ${P}fw     [fc] 10.0.1.1/24 fd00:1::1/64   -- xpfd filters fc and fs --
#                    [fs] 10.0.2.1/24 fd00:2::1/64
#        |  veth
#   netns ${P}server [s0] 10.0.2.2/24 fd00:2::2/64
#                    [s1] 10.0.3.1/24   -- a router too, for traceroute beyond the firewall --
#        |  veth
#   netns ${P}far    [f0] 10.0.3.2/24
#
# usage: topo.sh up PREFIX | down PREFIX
# QUEUES=N gives each veth N queues a side (veth's default is one), as a multi-queue NIC has.
set -euo pipefail
cmd=${1:?up or down}; P=${2:?prefix}
Q=${QUEUES:-1}

down() {
    for n in client fw server far; do ip netns del "${P}$n" 2>/dev/null || true; done
}

up() {
    down
    for n in client fw server far; do
        ip netns add "${P}$n"
        ip -n "${P}$n" link set lo up
    done
    ip link add "${P}c0" numtxqueues $Q numrxqueues $Q type veth peer name "${P}fc" numtxqueues $Q numrxqueues $Q
    ip link set "${P}c0" netns "${P}client" name c0
    ip link set "${P}fc" netns "${P}fw" name fc
    ip link add "${P}s0" numtxqueues $Q numrxqueues $Q type veth peer name "${P}fs" numtxqueues $Q numrxqueues $Q
    ip link set "${P}s0" netns "${P}server" name s0
    ip link set "${P}fs" netns "${P}fw" name fs
    ip link add "${P}f0" type veth peer name "${P}s1"
    ip link set "${P}f0" netns "${P}far" name f0
    ip link set "${P}s1" netns "${P}server" name s1
    ip -n "${P}far" addr add 10.0.3.2/24 dev f0
    ip -n "${P}server" addr add 10.0.3.1/24 dev s1
    ip -n "${P}client" addr add 10.0.1.2/24 dev c0
    ip -n "${P}client" addr add fd00:1::2/64 dev c0 nodad
    ip -n "${P}fw" addr add 10.0.1.1/24 dev fc
    ip -n "${P}fw" addr add fd00:1::1/64 dev fc nodad
    ip -n "${P}fw" addr add 10.0.2.1/24 dev fs
    ip -n "${P}fw" addr add fd00:2::1/64 dev fs nodad
    ip -n "${P}server" addr add 10.0.2.2/24 dev s0
    ip -n "${P}server" addr add fd00:2::2/64 dev s0 nodad
    for x in "client c0" "fw fc" "fw fs" "server s0" "server s1" "far f0"; do
        set -- $x
        ip -n "${P}$1" link set "$2" up
    done
    # The hosts keep veth's defaults: TCP/UDP checksums left to offload (CHECKSUM_PARTIAL),
    # which xpfd finishes on the way through.
    ip -n "${P}client" route add default via 10.0.1.1
    ip -n "${P}client" -6 route add default via fd00:1::1
    ip -n "${P}server" route add default via 10.0.2.1
    ip -n "${P}server" -6 route add default via fd00:2::1
    ip -n "${P}far" route add default via 10.0.3.1
    ip -n "${P}fw" route add 10.0.3.0/24 via 10.0.2.2
    ip netns exec "${P}server" sysctl -qw net.ipv4.ip_forward=1
    # A router: forwarding on (the XDP program's FIB lookups need it too).
    ip netns exec "${P}fw" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
}

"$cmd"
