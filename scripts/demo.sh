#!/usr/bin/env bash
# make demo: xpf filtering real traffic between network namespaces, with live counters.
#   client (10.0.1.2) -- [fc] xpfd [fs] -- server (10.0.2.2: HTTP, iperf3)
# Everything it creates is removed at the end, also on Ctrl-C or failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
P=xd-
SOCK=/run/xpf-demo.sock
LOG=$(mktemp /tmp/xpf-demo-xpfd.XXXX.log)
CTL="$BIN/xpfctl --socket $SOCK"
[[ $(id -u) -eq 0 ]] || { echo "demo: needs root (network namespaces, XDP)"; exit 1; }

cleanup() {
    set +e
    [[ -n ${XPFD:-} ]] && kill "$XPFD" 2>/dev/null && wait "$XPFD" 2>/dev/null
    for n in client server; do ip netns pids ${P}$n 2>/dev/null | xargs -r kill 2>/dev/null; done
    scripts/topo.sh down $P
    rm -f "$SOCK"
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
in_() { local n=$1; shift; ip netns exec "${P}$n" "$@"; }

say "lab: client -- xpf -- server in network namespaces"
scripts/topo.sh up $P
ip netns exec ${P}server python3 -m http.server 80 --bind 10.0.2.2 >/dev/null 2>&1 &
in_ server iperf3 -s -D --bind 10.0.2.2 >/dev/null
ip netns exec ${P}server nc -lk 10.0.2.2 2222 >/dev/null 2>&1 &
sleep 0.5

# Without --io, as a user starts it: on these veths xpfd chooses packet mode and says why.
say "xpfd -f examples/pf.conf -i fc -i fs"
ip netns exec ${P}fw $BIN/xpfd -f examples/pf.conf -i fc -i fs --socket $SOCK 2>"$LOG" &
XPFD=$!
for _ in $(seq 50); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
sed 's/^/  /' "$LOG"

say "ping the server through the firewall (allowed: echoreq)"
in_ client ping -c 3 -i 0.3 10.0.2.2 | tail -2

say "HTTP to the published web server (allowed: tcp port 80)"
in_ client curl -s -o /dev/null -w '  curl http://10.0.2.2/ -> HTTP %{http_code} in %{time_total}s\n' http://10.0.2.2/

say "iperf3 TCP for 6 s, with live counters (xpfctl -s info)"
ip netns exec ${P}client iperf3 -c 10.0.2.2 -t 6 -i 0 >/tmp/xpf-demo-iperf.txt 2>&1 &
IPERF=$!
for i in $(seq 6); do
    sleep 1
    $CTL -s info --json | python3 -c '
import json,sys; d=json.load(sys.stdin); f=d["forwarding"]
print("  t=%ss  states %-4d searches %-9d passed %-9d blocked %-5d forwarded by xpfd %-7d in the kernel (fast path) %d" % (sys.argv[1], d["states"], d["searches"], d["passed"], d["dropped"], f["forwarded"], f["fast"]["packets"]))' "$i"
done
wait $IPERF || true
grep -E 'sender|receiver' /tmp/xpf-demo-iperf.txt | sed 's/^/  /'

say "UDP through the firewall (allowed: udp port 5201)"
in_ client iperf3 -c 10.0.2.2 -u -b 50M -t 2 2>&1 | grep -E 'receiver' | sed 's/^/  /'

say "a forbidden connection: client -> server port 2222 (no rule passes it)"
before=$($CTL -s info --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["dropped"])')
if in_ client nc -z -w 2 10.0.2.2 2222; then echo "  UNEXPECTED: it connected"; exit 1; else echo "  nc -z 10.0.2.2 2222: refused by the firewall (timed out)"; fi
after=$($CTL -s info --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["dropped"])')
echo "  packets blocked meanwhile: $((after - before))"

say "block the client with the <blocked> table, at run time"
$CTL -t blocked -T add 10.0.1.2 | sed 's/^/  /'
$CTL -k 10.0.1.2 | sed 's/^/  /'
if in_ client curl -s -m 2 -o /dev/null http://10.0.2.2/; then echo "  UNEXPECTED: curl passed"; exit 1; else echo "  curl http://10.0.2.2/: blocked"; fi
$CTL -t blocked -T delete 10.0.1.2 | sed 's/^/  /'
in_ client curl -s -o /dev/null -w '  after delete: HTTP %{http_code}\n' http://10.0.2.2/

say "xpfctl -s states"
$CTL -s states | head -20 | sed 's/^/  /'

say "xpfctl -s info"
$CTL -s info | sed 's/^/  /'

say "xpfctl -s rules -v"
$CTL -s rules -v | sed 's/^/  /'

say "cleaning up"
