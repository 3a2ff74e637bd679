#!/usr/bin/env bash
# The real-client bench: what clients see through xpfd and through the kernel's firewall
# (nftables + conntrack) with the same policy, on the hosts' default settings, alternated
# (kernel, xpfd, kernel, xpfd ...) in one run between the scenario's namespaces:
#   client (10.0.1.2) -- [fc] firewall [fs] -- server (10.0.2.2)
# Measures: iperf3 TCP 1 stream and 4 streams (Gbit/s), iperf3 UDP 64-byte payloads
# (datagrams/s received), ping RTT p50/p99 while 4 TCP streams run. Prints one row per run,
# then medians and xpf/kernel ratios.
# usage: real.sh [ROUNDS] [SECONDS]      (default 2 rounds of 4 s per measure)
# FASTPATH=1 runs xpfd with --fastpath. XDP frames redirected into a veth arrive only when its
# peer runs NAPI (GRO on, or an XDP program there), a setting of the end hosts: with
# FASTPATH=1 the script turns GRO on at the client's and the server's veth, for the kernel's
# runs too (like for like), and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}; SECS=${2:-4}
BIN=target/release
P=xr-
SOCK=/run/xpf-real.sock
DIR=$(mktemp -d /tmp/xpf-real.XXXX)
. scripts/lib.sh
needs real ip iperf3 ping nft python3 ethtool

# The policy, both ways: the client may reach the server's iperf3 (TCP and UDP) and ping it.
cat > "$DIR/pf.conf" <<'CONF'
block all
pass in on fc inet proto tcp to 10.0.2.2 port 5201
pass in on fc inet proto udp to 10.0.2.2 port 5201
pass in on fc inet proto icmp icmp-type echoreq
pass out on fs
CONF
cat > "$DIR/nft.conf" <<'CONF'
table inet real {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "fc" ip daddr 10.0.2.2 tcp dport 5201 ct state new accept
        iifname "fc" ip daddr 10.0.2.2 udp dport 5201 ct state new accept
        iifname "fc" icmp type echo-request ct state new accept
    }
}
CONF

scripts/topo.sh up $P
if [ "${FASTPATH:-0}" = 1 ]; then
    echo "real: FASTPATH=1: xpfd --fastpath; GRO on at c0 and s0 (the end hosts), both setups"
    ip netns exec ${P}client ethtool -K c0 gro on >/dev/null
    ip netns exec ${P}server ethtool -K s0 gro on >/dev/null
fi
ip netns exec ${P}server iperf3 -s -D --bind 10.0.2.2 >/dev/null

# The firewall namespace forwards (topo.sh); xpfd's XDP program takes the packets before the
# kernel's forward path sees them, so the kernel's ruleset is simply absent while xpfd runs.
kernel_on() { ip netns exec ${P}fw nft -f "$DIR/nft.conf"; }
kernel_off() { ip netns exec ${P}fw nft delete table inet real 2>/dev/null; }
xpfd_on() {
    ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --socket $SOCK \
        $([ "${FASTPATH:-0}" = 1 ] && echo --fastpath) 2>"$DIR/xpfd.log" &
    XPFD=$!
    for _ in $(seq 100); do $BIN/xpfctl --socket $SOCK -s memory >/dev/null 2>&1 && break; sleep 0.1; done
}
xpfd_off() { kill "$XPFD"; wait "$XPFD" 2>/dev/null; XPFD=; }

c() { ip netns exec ${P}client "$@"; }
gbits() { python3 -c "import json,sys; print('%.2f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second'] / 1e9))"; }
measure() { # measure SETUP: one row
    c ping -c 2 -i 0.2 -W 1 10.0.2.2 >/dev/null
    local t1 t4 udp rtt
    t1=$(c iperf3 -c 10.0.2.2 -t "$SECS" --json | gbits)
    t4=$(c iperf3 -c 10.0.2.2 -t "$SECS" -P 4 --json | gbits)
    udp=$(c iperf3 -c 10.0.2.2 -u -b 0 -l 64 -t "$SECS" --json | python3 -c "import json,sys; s=json.load(sys.stdin)['end']['sum']; print(int((s['packets'] - s['lost_packets']) / s['seconds']))")
    c iperf3 -c 10.0.2.2 -t "$SECS" -P 4 >/dev/null 2>&1 &
    local bulk=$!
    sleep 0.5
    c ping -i 0.01 -c $((SECS * 80)) -W 1 10.0.2.2 > "$DIR/ping.txt" 2>&1
    wait $bulk
    rtt=$(python3 -c "
import re
v = sorted(float(x) for x in re.findall(r'time=([0-9.]+)', open('$DIR/ping.txt').read()))
print('%.3f %.3f' % (v[len(v) // 2], v[min(len(v) - 1, int(len(v) * 0.99))]) if v else 'nan nan')")
    echo "$1 $t1 $t4 $udp $rtt" | tee -a "$DIR/rows"
}

echo "real: $ROUNDS rounds, $SECS s per measure; commit $(git rev-parse --short HEAD 2>/dev/null)"
echo "setup tcp1(Gbit/s) tcp4(Gbit/s) udp64(pps) rtt-p50(ms) rtt-p99(ms)"
for r in $(seq "$ROUNDS"); do
    kernel_on; measure kernel; kernel_off
    xpfd_on; measure xpfd; xpfd_off
done
python3 - "$DIR/rows" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for s in ('kernel', 'xpfd'):
    cols = list(zip(*[[float(x) for x in r[1:]] for r in rows if r[0] == s]))
    med[s] = [st.median(c) for c in cols]
names = ['TCP 1 stream, Gbit/s', 'TCP 4 streams, Gbit/s', 'UDP 64 B, datagrams/s', 'ping under load p50, ms', 'ping under load p99, ms']
print('\n| medians | kernel nft+conntrack | xpfd | xpf/kernel |\n|---|---|---|---|')
for i, n in enumerate(names):
    k, x = med['kernel'][i], med['xpfd'][i]
    ratio = x / k if k else float('nan')
    print('| %s | %s | %s | %.2fx%s |' % (n, f'{k:g}', f'{x:g}', ratio, '' if i < 3 else ' (lower is better)'))
PY
