#!/usr/bin/env bash
# Reloads under load: xpfd between client and server with the campus ruleset of N rules
# (default 1,602,300: `xpf-bench rules --campus`), iperf3 and ping -i 0.01 running through it
# while the whole ruleset is loaded again (xpfctl -f) and one member's anchor of 1,000 rules is
# replaced (xpfctl -a, five times), and a table takes deltas of 100,000 and a million entries
# (xpfctl -T). Reports the pings lost and the slowest, iperf3's slowest
# second, and each load's time as xpfd logs it. Bounded: 25 s of traffic; the namespaces are
# deleted at the end.
#
# usage: scripts/reload-lab.sh [N]
set -euo pipefail
N=${1:-1600000}
P=xr-
BIN=${BIN:-target/release}
for t in iperf3 ping; do command -v $t >/dev/null || { echo "reload-lab: $t is missing (scripts/deps.sh)"; exit 1; }; done
DIR=$(mktemp -d /tmp/xpf-reload.XXXX)
SOCK=$DIR/xpfd.sock
CTL="$BIN/xpfctl --socket $SOCK"
XPFD=
cleanup() {
    [ -n "$XPFD" ] && kill "$XPFD" 2>/dev/null && wait "$XPFD" 2>/dev/null || true
    for n in client server; do ip netns pids ${P}$n 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    scripts/topo.sh down $P
    rm -rf "$DIR"
}
trap cleanup EXIT
c() { ip netns exec ${P}client "$@"; }
ms() { echo $(($(date +%s%N) / 1000000)); }

$BIN/xpf-bench rules --campus "$N" --out "$DIR" >/dev/null
# The campus names its outside em0 and its inside em1; here they are fc and fs. The lab's
# traffic passes by a first quick rule: what is measured is the reload beside it.
{
    # pf's default table-entries limit (200,000) would refuse the million-entry replace.
    echo "set limit table-entries 2000000"
    echo "table <feed> persist"
    echo "pass quick inet from 10.0.1.0/24 to 10.0.2.0/24"
    echo "block in quick from <feed>"
    sed 's/\bem0\b/fc/g; s/\bem1\b/fs/g' "$DIR/campus-$N.pf.conf"
} > "$DIR/campus.conf"
# A feed's table deltas: 100,000 new hosts, a million to replace the table with.
python3 -c "
for i in range(100000): print('11.%d.%d.%d' % (i >> 16, (i >> 8) & 255, i & 255))" > "$DIR/add.txt"
python3 -c "
for i in range(1000000): print('12.%d.%d.%d' % (i >> 16, (i >> 8) & 255, i & 255))" > "$DIR/million.txt"
for i in $(seq 0 999); do echo "pass in quick proto tcp to 44.0.0.$((1 + i % 250)) port $((1000 + i / 250))"; done > "$DIR/member.conf"
rules=$(grep -c . "$DIR/campus.conf")

scripts/topo.sh up $P
ip netns exec ${P}server iperf3 -s -D --bind 10.0.2.2 >/dev/null
t0=$(ms)
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/campus.conf" -i fc -i fs --io xdp --socket "$SOCK" 2>"$DIR/xpfd.log" &
XPFD=$!
for _ in $(seq 600); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
$CTL -s memory >/dev/null
echo "xpfd up with $rules lines of pf.conf in $(($(ms) - t0)) ms, RSS $(($(awk '/VmRSS/ {print $2}' /proc/$XPFD/status) / 1024)) MiB"
c ping -c 1 -W 2 10.0.2.2 >/dev/null || true
t=$(ms)
$CTL -f "$DIR/campus.conf"
echo "xpfctl -f (whole ruleset), no traffic: $(($(ms) - t)) ms"

c iperf3 -c 10.0.2.2 -t 22 -i 1 > "$DIR/iperf.log" 2>&1 &
IPERF=$!
c ping -i 0.01 -c 2000 -W 1 10.0.2.2 > "$DIR/ping.log" 2>&1 &
PING=$!
sleep 3
t=$(ms)
$CTL -f "$DIR/campus.conf"
echo "xpfctl -f (whole ruleset), under iperf3 and ping: $(($(ms) - t)) ms"
sleep 1
for k in 1 2 3 4 5; do
    t=$(ms)
    $CTL -a campus/in/44.0.0 -f "$DIR/member.conf" >/dev/null
    echo "xpfctl -a campus/in/44.0.0 -f (1,000 rules) #$k: $(($(ms) - t)) ms end to end"
    sleep 0.5
done
for step in "add add.txt" "replace million.txt" "add add.txt" "delete add.txt"; do
    set -- $step
    t=$(ms)
    out=$($CTL -t feed -T "$1" -f "$DIR/$2" 2>&1)
    took=$(($(ms) - t))
    echo "xpfctl -t feed -T $1 -f $2: $out in $took ms ($(( $(grep -c . "$DIR/$2") * 1000 / (took > 0 ? took : 1) )) entries/s)"
done
wait $PING || true
wait $IPERF || true
echo "xpfd's log of the loads:"
grep -E "ruleset generation" "$DIR/xpfd.log" | sed 's/^/  /'
grep -E "packets transmitted" "$DIR/ping.log"
grep -E "^rtt" "$DIR/ping.log" || true
awk '/sec .*bits\/sec/ && !/sender|receiver/ {print $7, $8}' "$DIR/iperf.log" | sort -n | head -1 | sed 's/^/iperf3 slowest second: /'
grep -E "sender|receiver" "$DIR/iperf.log" | sed 's/^/iperf3 /'
echo "xpfd RSS at the end: $(($(awk '/VmRSS/ {print $2}' /proc/$XPFD/status) / 1024)) MiB"
