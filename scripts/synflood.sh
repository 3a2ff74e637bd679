#!/usr/bin/env bash
# The SYN flood bench: a spoofed SYN flood at the lab generator's full rate (every packet a
# new source in 198.18.0.0/15, `xpf-bench flood`) against port 80 of the server, while 100
# established TCP flows (iperf3 -P 100, 1 Mbit/s each) run through the same firewall, in the
# scenario's namespaces on default settings but two queues per veth:
#   client (10.0.1.2, and the flood) -- [fc] firewall [fs] -- server (10.0.2.2: HTTP, iperf3)
# Four firewalls, alternated in one run, each measured without and with the flood:
#   xpfd synproxy        pass in on fc ... port 80 synproxy state
#   xpfd syncookies      set syncookies adaptive, plain keep state on port 80
#   kernel conntrack     nftables forward + conntrack (the server's tcp_syncookies answers)
#   kernel synproxy      nftables synproxy on port 80 (notrack SYNs, nf_conntrack_tcp_loose 0,
#                        as the nftables documentation sets it up)
# Per run: what the 100 flows delivered (Mbit/s at the iperf3 server, 100 offered) and their
# retransmitted segments; new HTTP connections during the flood (curl, 10 tries, 3 s each);
# the firewall's states (xpfd) or conntrack entries at the flood's end; flood SYNs that reached
# the server (a counting rule in its INPUT); xpfd's resident memory before and after.
# usage: synflood.sh [ROUNDS] [SECONDS]     (default 1 round of 8 s per measure)
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}; SECS=${2:-8}
BIN=${BIN:-target/release}
P=xs-
SOCK=/run/xpf-synflood.sock
DIR=$(mktemp -d /tmp/xpf-synflood.XXXX)
. scripts/lib.sh
needs synflood ip iperf3 nft curl python3 iptables conntrack bc ethtool

# The policy: HTTP (the flood's target) and iperf3 on the server, ping.
cat > "$DIR/base.conf" <<'CONF'
block all
pass in on fc inet proto tcp to 10.0.2.2 port 5201
pass in on fc inet proto icmp icmp-type echoreq
pass out on fs
CONF
{ cat "$DIR/base.conf"; echo 'pass in on fc inet proto tcp to 10.0.2.2 port 80 synproxy state'; } > "$DIR/synproxy.conf"
{ echo 'set syncookies adaptive'; cat "$DIR/base.conf"; echo 'pass in on fc inet proto tcp to 10.0.2.2 port 80'; } > "$DIR/cookies.conf"
cat > "$DIR/conntrack.nft" <<'CONF'
table inet flood {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "fc" ip daddr 10.0.2.2 tcp dport { 80, 5201 } ct state new accept
        iifname "fc" icmp type echo-request ct state new accept
    }
}
CONF
cat > "$DIR/synproxy.nft" <<'CONF'
table inet flood {
    chain pre {
        type filter hook prerouting priority raw; policy accept;
        iifname "fc" tcp dport 80 tcp flags syn notrack
    }
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "fc" ip daddr 10.0.2.2 tcp dport 80 ct state invalid,untracked synproxy mss 1460 wscale 7 timestamp sack-perm
        ct state invalid drop
        iifname "fc" ip daddr 10.0.2.2 tcp dport { 80, 5201 } ct state new accept
        iifname "fc" icmp type echo-request ct state new accept
    }
}
CONF

# Two queues a side, as a multi-queue NIC has (the same for all four firewalls). With one, the
# flows lose segments through xpfd even without a flood: a native XDP program on a veth turns
# off its peer's TSO, and bursts of MTU-size segments overflow veth's 256-entry ring in front
# of it (docs/xpfd.md); the kernel's path keeps the 64 KB segments whole.
QUEUES=2 scripts/topo.sh up $P
# The flood's replies (the server's or the firewall's SYN|ACKs) go back towards the client
# side, where nobody owns 198.18.0.0/15: both firewalls send them, neither gets an answer.
ip -n ${P}fw route add 198.18.0.0/15 via 10.0.1.2
# The client's kernel drops them at ingress: on veth the firewall's transmit runs the receiver's
# stack in its own context, and a route lookup and an ICMP error per SYN|ACK there (nobody owns
# 198.18/15) would be charged to the firewall (a real NIC's transmit is DMA). Same for both.
ip netns exec ${P}client nft -f - <<'NFT'
table netdev floodsink {
    chain in {
        type filter hook ingress device "c0" priority 0; policy accept;
        ip daddr 198.18.0.0/15 drop
    }
}
NFT
ip netns exec ${P}server iptables -w -A INPUT -p tcp --syn --dport 80 -s 198.18.0.0/15
ip netns exec ${P}server iperf3 -s -D --bind 10.0.2.2 >/dev/null
ip netns exec ${P}server python3 -m http.server 80 --bind 10.0.2.2 >/dev/null 2>&1 &
FCMAC=$(ip -n ${P}fw link show fc | awk '/ether/ {print $2}')

xpfd_on() {
    ip netns exec ${P}fw $BIN/xpfd -f "$1" -i fc -i fs --io xdp --socket $SOCK 2>"$DIR/xpfd.log" &
    XPFD=$!
    for _ in $(seq 100); do $BIN/xpfctl --socket $SOCK -s memory >/dev/null 2>&1 && break; sleep 0.1; done
}
xpfd_off() { kill "$XPFD"; wait "$XPFD" 2>/dev/null; XPFD=; }
# The kernel's synproxy needs strict TCP tracking; put back after.
kernel_on() {
    ip netns exec ${P}fw nft -f "$1"
    [[ $1 == *synproxy* ]] && ip netns exec ${P}fw sysctl -qw net.netfilter.nf_conntrack_tcp_loose=0
    # No XDP program on fc then: the generator's XDP_TX needs the receiver's NAPI (GRO on), as
    # in the lab; xpfd's own program provides it when xpfd runs.
    ip netns exec ${P}fw ethtool -K fc gro on >/dev/null 2>&1 || true
}
kernel_off() {
    ip netns exec ${P}fw nft delete table inet flood 2>/dev/null
    ip netns exec ${P}fw sysctl -qw net.netfilter.nf_conntrack_tcp_loose=1
    ip netns exec ${P}fw ethtool -K fc gro off >/dev/null 2>&1 || true
    ip netns exec ${P}fw conntrack -F >/dev/null 2>&1 || true
}
c() { ip netns exec ${P}client "$@"; }
syns() { ip netns exec ${P}server iptables -w -nvxL INPUT | awk '/198.18.0.0/ {print $1}'; }
rss() { [[ -n ${XPFD:-} ]] && awk '/VmRSS/ {print $2}' /proc/$XPFD/status || echo 0; }
fw_states() {
    if [[ -n ${XPFD:-} ]]; then $BIN/xpfctl --socket $SOCK -s info --json | python3 -c "import json,sys; print(json.load(sys.stdin)['states'])"
    else ip netns exec ${P}fw cat /proc/sys/net/netfilter/nf_conntrack_count; fi
}

measure() { # measure SETUP FLOOD(0|1): one row
    c ping -c 2 -i 0.2 -W 1 10.0.2.2 >/dev/null
    local s0 r0 flood=
    s0=$(syns); r0=$(rss)
    c iperf3 -c 10.0.2.2 -t "$SECS" -P 100 -b 1M --json > "$DIR/iperf.json" 2>/dev/null &
    local ip=$!
    sleep 1
    if [[ $2 == 1 ]]; then
        $BIN/xpf-bench flood --seconds $((SECS - 2)) ${P}client c0 "$FCMAC" 10.0.2.2 80 > "$DIR/flood.txt" 2>&1 &
        flood=$!
        sleep 1
    fi
    local ok=0 t0 times=()
    for _ in $(seq 10); do
        t0=$(date +%s.%N)
        if c curl -sf -m 3 -o /dev/null http://10.0.2.2/; then ok=$((ok + 1)); times+=("$(echo "$(date +%s.%N) - $t0" | bc)"); fi
        [[ -z $flood ]] && sleep 0.3
    done
    local states
    states=$(fw_states)
    [[ -n $flood ]] && wait $flood
    wait $ip
    local sent=0
    [[ $2 == 1 ]] && sent=$(awk '{print $2}' "$DIR/flood.txt")
    python3 - "$1" "$2" "$DIR/iperf.json" "$ok" "$states" "$(( $(syns) - s0 ))" "$r0" "$(rss)" "$sent" "${times[*]:-}" <<'PY' | tee -a "$DIR/rows"
import json, sys
setup, flood, f, ok, states, syns, r0, r1, sent, times = sys.argv[1:]
try:
    e = json.load(open(f))['end']
    mbit = e['sum_received']['bits_per_second'] / 1e6
    retr = e['sum_sent'].get('retransmits', 0)
    segs = e['sum_sent']['bytes'] / 1448
except Exception:
    mbit, retr, segs = 0.0, 0, 1
t = sorted(float(x) for x in times.split()) if times.strip() else []
p50 = '%.3f' % t[len(t) // 2] if t else 'nan'
print(setup, flood, '%.1f' % mbit, '%.2f' % (100.0 * retr / max(segs, 1)), '%s/10' % ok, p50, states, syns, sent, int(r0) // 1024, int(r1) // 1024)
PY
}

echo "synflood: $ROUNDS round(s), $SECS s per measure; commit $(git rev-parse --short HEAD 2>/dev/null)"
echo "setup flood flows(Mbit/s) retransmitted(%) curl-ok curl-p50(s) fw-states flood-SYNs-at-server flood-SYNs-sent rss-before(MiB) rss-after(MiB)"
for r in $(seq "$ROUNDS"); do
    for fl in 0 1; do
        xpfd_on "$DIR/synproxy.conf"; measure xpfd-synproxy $fl; xpfd_off
        xpfd_on "$DIR/cookies.conf"; measure xpfd-syncookies $fl; xpfd_off
        kernel_on "$DIR/conntrack.nft"; measure kernel-conntrack $fl; kernel_off
        kernel_on "$DIR/synproxy.nft"; measure kernel-synproxy $fl; kernel_off
    done
done
python3 - "$DIR/rows" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
print('\n| firewall | flows without flood, Mbit/s | flows under flood, Mbit/s | kept | retransmitted without / under flood | HTTP during flood | states/conntrack at flood end | flood SYNs at the server | flood SYNs sent | RSS before/after, MiB |')
print('|---|---|---|---|---|---|---|---|---|---|')
for s in ('xpfd-synproxy', 'xpfd-syncookies', 'kernel-conntrack', 'kernel-synproxy'):
    a = [r for r in rows if r[0] == s and r[1] == '0']
    b = [r for r in rows if r[0] == s and r[1] == '1']
    if not a or not b:
        continue
    m0 = st.median(float(r[2]) for r in a)
    m1 = st.median(float(r[2]) for r in b)
    last = b[-1]
    r0 = st.median(float(r[3]) for r in a)
    r1 = st.median(float(r[3]) for r in b)
    print('| %s | %.1f | %.1f | %.1f%% | %.2f%% / %.2f%% | %s (p50 %s s) | %s | %s | %s | %s / %s |' % (
        s, m0, m1, 100 * m1 / m0 if m0 else float('nan'), r0, r1, last[4], last[5], last[6], last[7], last[8], last[9], last[10]))
PY
