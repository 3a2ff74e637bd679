#!/usr/bin/env bash
# Seeing what the firewall does, with the tools operators reach for first: pflog read by
# `tcpdump -n -e -ttt -r` on the file xpfd writes (pflogd's habit) and `xpfctl log | tcpdump
# -r -` live; the metrics page linted by `promtool check metrics` and scraped by a real
# Prometheus. xpfd between the client's network (fc) and the server's (fs), default host
# settings:
#   client 10.0.1.2 -- [fc] xpfd [fs] -- server 10.0.2.2
# Each check prints ok/FAIL; the last line is the tally. Needs root; cleans up after itself.
# xpfd in XDP mode (--io xdp); IO=packet: xpfd in packet mode (its fast path forwards established flows in the kernel).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
P=xp-
SOCK=/run/xpf-observe-test.sock
METRICS=127.0.0.1:9109
PROM=127.0.0.1:9199
CTL="$BIN/xpfctl --socket $SOCK"
DIR=$(mktemp -d /tmp/xpf-observe.XXXX)
LOG=$DIR/xpfd.log
. scripts/lib.sh
needs observe ip tcpdump python3 timeout curl promtool prometheus nfcapd nfdump

. scripts/check.sh
c() { ip netns exec ${P}client "$@"; }
# try PROTO PORT: one connection (TCP) or datagram (UDP) from the client to the server.
try() {
    c python3 - "$1" "$2" <<'PY'
import socket, sys
proto, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
s.settimeout(1)
try:
    if proto == "tcp":
        s.connect(("10.0.2.2", port))
    else:
        s.sendto(b"x", ("10.0.2.2", port))
except OSError:
    pass
PY
}
export -f c try
export P

cat >"$DIR/pf.conf" <<'CONF'
set loginterface fc
table <inside> { 10.0.1.0/24 }
block log all
pass in log on fc inet proto tcp to 10.0.2.2 port 7000 label "web" keep state (pflow)
pass in log (to pflog1) on fc inet proto udp to 10.0.2.2 port 7000 keep state (pflow)
pass in on fc inet proto icmp from <inside>
pass out on fs
anchor "obs" in on fc {
  pass in log on fc inet proto tcp to 10.0.2.2 port 7003
}
CONF

scripts/topo.sh up $P
ip netns exec ${P}server python3 scripts/peer.py 0.0.0.0 7000 >/dev/null 2>&1 &
# The flow collector, before xpfd: IPFIX from xpfd's pflow to nfcapd on the firewall's loopback.
mkdir -p "$DIR/flows"
ip netns exec ${P}fw nfcapd -w "$DIR/flows" -b 127.0.0.1 -p 2055 -t 3600 >"$DIR/nfcapd.log" 2>&1 &
NFCAPD=$!
IOARG=(--io "${IO:-xdp}")
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --socket $SOCK "${IOARG[@]}" --pflog "$DIR/pflog" --metrics $METRICS \
    --pflow 127.0.0.1:2055 --pflow-active 2 2>"$LOG" &
XPFD=$!
for _ in $(seq 100); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
check "xpfd starts with log rules and --pflog" $CTL -s memory
HEAD12=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
check "xpfd --version and its log's first line name the commit it was built from ($HEAD12)" bash -c "
    $BIN/xpfd --version | tee /dev/stderr | grep -qE '^xpfd [0-9]+\.[0-9]+\.[0-9]+ \(commit $HEAD12(\+dirty)?\)\$' &&
    $BIN/xpfctl --version | grep -qE '^xpfctl [0-9.]+ \(commit $HEAD12(\+dirty)?\)\$' &&
    grep -m1 -E 'xpfd [0-9.]+ \(commit $HEAD12(\+dirty)?\) starting' '$LOG'"

# Live first: a reader on the stream sees the next blocked connection.
timeout 10 $BIN/xpfctl log --socket $SOCK 2>"$DIR/live.err" | timeout 10 tcpdump -n -e -r - -c 1 'tcp port 7002' >"$DIR/live.txt" 2>/dev/null &
LIVE=$!
sleep 1
try tcp 7002
try tcp 7000
try udp 7000
c ping -c 1 -W 1 10.0.2.2 >/dev/null
# ssh to the firewall itself, under `block log all`: the host's own traffic is logged too.
c python3 -c "
import socket; s = socket.socket(); s.settimeout(1)
try: s.connect(('10.0.1.1', 22))
except OSError: pass"
wait $LIVE
check "xpfctl log | tcpdump -r - shows the block live (rule 0, block in on fc)" \
    bash -c "cat $DIR/live.txt; grep -qE 'rule 0/[^ ]*: block in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7002: Flags \[S\]' $DIR/live.txt"

sleep 0.5 # the writer flushes after each burst
tcpdump -n -e -ttt -r "$DIR/pflog" >"$DIR/file.txt" 2>"$DIR/file.err"
check "tcpdump -n -e -ttt -r reads the pflog file" bash -c "cat $DIR/file.err; [[ -s $DIR/file.txt ]]"
check "the blocked connection is in it: rule 0, block in on fc" \
    bash -c "grep -E 'rule 0/[^ ]*: block in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7002' $DIR/file.txt"
check "the logged pass is in it: rule 1, pass in on fc, the SYN" \
    bash -c "grep -E 'rule 1/[^ ]*: pass in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7000: Flags \[S\]' $DIR/file.txt"
check "ssh to the firewall itself is in it: rule 0, block in on fc, to 10.0.1.1.22" \
    bash -c "grep -E 'rule 0/[^ ]*: block in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.1\.1\.22: Flags \[S\]' $DIR/file.txt"
check "only the connection's first packet (the state's later ones are not the rule's)" \
    bash -c "[[ \$(grep -c '> 10.0.2.2.7000' $DIR/file.txt) -eq 1 ]]"
check "a rule without log logs nothing (the ping passed, unlogged)" refused grep -q 'ICMP echo' "$DIR/file.txt"
# A rule in an anchor is logged as pf logs it (tcpdump: rule N.ANCHOR.M/): under the main
# ruleset's anchor rule (5), with its number in the anchor (0); the same once the anchor's
# rules are replaced with xpfctl -a (the loaded rule numbered 1 in it).
try tcp 7003
printf 'pass in on fc inet proto tcp to 10.0.2.2 port 7005\npass in log on fc inet proto tcp to 10.0.2.2 port 7004\n' >"$DIR/obs.conf"
$CTL -a obs -f "$DIR/obs.conf"
try tcp 7004
sleep 0.5
check "a logged rule in an anchor: rule 5.obs.0, pass in on fc" bash -c "
    tcpdump -n -e -r $DIR/pflog 2>/dev/null | grep -E 'rule 5\.obs\.0/[^ ]*: pass in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7003: Flags \[S\]'"
check "a logged rule loaded into the anchor with -a: rule 5.obs.1" bash -c "
    tcpdump -n -e -r $DIR/pflog 2>/dev/null | grep -E 'rule 5\.obs\.1/[^ ]*: pass in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7004: Flags \[S\]'"
check "log (to pflog1): the UDP datagram is in pflog1, not in pflog" bash -c "
    tcpdump -n -e -r $DIR/pflog1 2>/dev/null | tee /dev/stderr | grep -qE 'rule 2/[^ ]*: pass in on fc: 10\.0\.1\.2\.[0-9]+ > 10\.0\.2\.2\.7000: UDP'
    ! grep -q 'UDP' $DIR/file.txt"
check "set loginterface fc: -s info's Interface Stats count fc's packets passed and blocked" bash -c "
    $CTL -s info | sed -n '/^Interface Stats for fc/,/^Forwarding/p' | tee /dev/stderr >$DIR/lif.txt
    grep -A1 'Packets In' $DIR/lif.txt | grep -qE 'Passed +[1-9]' && grep -A2 'Packets In' $DIR/lif.txt | grep -qE 'Blocked +[1-9]'"
check "-s info counts what was logged" bash -c "$CTL -s info | sed -n '/^Pflog/,/live readers/p' | tee /dev/stderr | grep -E 'logged +([3-9]|[1-9][0-9]+)$'"

# Prometheus: the page, linted by promtool, then scraped by a Prometheus server.
fw() { ip netns exec ${P}fw "$@"; }
export -f fw
export DIR METRICS PROM
fw curl -s -D "$DIR/headers" "http://$METRICS/metrics" >"$DIR/metrics.txt"
check "--metrics serves the text format (version 0.0.4)" grep -qi 'content-type: text/plain; version=0.0.4' "$DIR/headers"
check "promtool check metrics passes" bash -c "fw promtool check metrics <$DIR/metrics.txt"
check "the page has pf's counters, the state table, per-rule and per-socket series" bash -c "
    grep -E '^xpf_counters_total\{counter=\"match\"\} [1-9]' $DIR/metrics.txt &&
    grep -E '^xpf_states_limit 100000$' $DIR/metrics.txt &&
    grep -E '^xpf_rule_evaluations_total\{rule=\"1\",label=\"web\"\} [1-9]' $DIR/metrics.txt &&
    grep -E '^xpf_socket_received_packets_total\{interface=\"fc\",queue=\"0\"\} [1-9]' $DIR/metrics.txt &&
    grep -E '^xpf_pflog_total\{counter=\"logged\"\} [1-9]' $DIR/metrics.txt &&
    grep -E '^xpf_table_matches_total\{table=\"inside\"\} [1-9]' $DIR/metrics.txt &&
    grep -E '^xpf_build_info\{version=\"[0-9.]+\",commit=\"$HEAD12(\+dirty)?\"\} 1$' $DIR/metrics.txt"
check "anything but GET /metrics is refused (404, 405)" bash -c "
    [[ \$(fw curl -s -o /dev/null -w '%{http_code}' http://$METRICS/x) == 404 ]] &&
    [[ \$(fw curl -s -o /dev/null -w '%{http_code}' -X POST http://$METRICS/metrics) == 405 ]]"
cat >"$DIR/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: xpf
    static_configs: [{targets: ['$METRICS']}]
YML
fw prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prom" \
    --web.listen-address=$PROM >"$DIR/prometheus.log" 2>&1 &
PROMPID=$!
query() { fw curl -s "http://$PROM/api/v1/query" --data-urlencode "query=$1"; }
export -f query
for _ in $(seq 60); do query 'up{job="xpf"}' 2>/dev/null | grep -q '"value":\[[0-9.]*,"1"\]' && break; sleep 0.5; done
check "a Prometheus server scrapes xpfd (up == 1)" bash -c "query 'up{job=\"xpf\"}' | tee /dev/stderr | grep -q '\"1\"\]'"
check "and stores its series: the labelled rule's evaluations" bash -c "
    query 'xpf_rule_evaluations_total{label=\"web\"}' | tee /dev/stderr | grep -qE '\"value\":\[[0-9.]+,\"[1-9]'"
kill $PROMPID 2>/dev/null; wait $PROMPID 2>/dev/null

# The operator's counters: per label, and zeroed.
check "-s labels: the labelled rule's evaluations, packets, bytes and states" bash -c "
    $CTL -s labels | tee /dev/stderr | grep -E '^web [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* [0-9]+ [0-9]+ [0-9]+ [0-9]+ [1-9][0-9]*$'"
check "-z zeroes the rules' evaluations" bash -c "$CTL -z && $CTL -s labels | tee /dev/stderr | grep -E '^web 0 '"
check "-s Interfaces lists the filtered interfaces; -v the states and rules of each (floating states under all)" bash -c "
    $CTL -s Interfaces | tee /dev/stderr | grep -qx fc && $CTL -s Interfaces -v >$DIR/ifs.txt && cat $DIR/ifs.txt &&
        grep -A1 '^all\$' $DIR/ifs.txt | grep -qE 'States: +[1-9][0-9]* +Rules: +1 ' &&
        grep -A2 '^fc\$' $DIR/ifs.txt | grep -qE 'States: +0 +Rules: +5 ' && grep -A2 '^fc\$' $DIR/ifs.txt | grep -qE 'Received: +[1-9]'"
check "xpfctl --help and xpfd --help print their usage (log, --pflog)" \
    bash -c "$BIN/xpfctl --help | grep -q 'xpfctl log' && $BIN/xpfd --help | grep -q -- '--pflog FILE'"

# pflow: the states of `keep state (pflow)` rules exported as IPFIX; nfdump's counts are the
# states'. A UDP flow from a fixed port, alive past the active timeout (2 s), then killed.
c python3 -c "
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.2', 45000)); s.settimeout(1)
for i in range(5):
    s.sendto(b'x' * (100 * i + 10), ('10.0.2.2', 7000))
    try: s.recv(100)
    except OSError: pass"
sleep 3
$CTL -s states -v >"$DIR/all-states.txt"
grep -A1 "10.0.1.2:45000" "$DIR/all-states.txt" >"$DIR/state.txt"
$CTL -k 10.0.1.2 >/dev/null
sleep 1
kill -TERM $NFCAPD; wait $NFCAPD 2>/dev/null
nfdump -R "$DIR/flows" -q -N -o 'fmt:%pr %sa %sp %da %dp %pkt %byt' >"$DIR/flows.txt" 2>"$DIR/nfdump.err"
check "nfcapd received xpfd's IPFIX and nfdump reads it" bash -c "cat $DIR/nfdump.err; cat $DIR/flows.txt; [[ -s $DIR/flows.txt ]]"
check "the UDP flow's packets and bytes each way, summed over its records, are the state's (-s states -v)" python3 - "$DIR/state.txt" "$DIR/flows.txt" <<'PY'
import re, sys
st = open(sys.argv[1]).read()
m = re.search(r"(\d+):(\d+) pkts, (\d+):(\d+) bytes", st)
assert m, st
want = tuple(int(x) for x in m.groups())
got = [0, 0, 0, 0]
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) < 7 or f[0] != "17":
        continue
    if (f[1], f[2], f[3], f[4]) == ("10.0.1.2", "45000", "10.0.2.2", "7000"):
        got[0] += int(f[5]); got[2] += int(f[6])
    elif (f[1], f[2], f[3], f[4]) == ("10.0.2.2", "7000", "10.0.1.2", "45000"):
        got[1] += int(f[5]); got[3] += int(f[6])
print("state", want, "nfdump", got)
assert tuple(got) == want and want[0] == 5, (want, got)
PY
check "the TCP connection of the pflow rule is there; the ping (a rule without pflow) is not" bash -c "
    grep -qE '^6 +10\.0\.1\.2 +[0-9]+ +10\.0\.2\.2 +7000 ' $DIR/flows.txt && ! grep -q '^1 ' $DIR/flows.txt"
check "-s info counts what pflow sent" bash -c "$CTL -s info | sed -n '/^Pflow/,/not expressible/p' | tee /dev/stderr | grep -E 'flow records sent +[1-9]'"
printf 'pass in proto udp keep state (pflow)\n' >"$DIR/pflow.conf"
check "without --pflow, a pflow rule is refused with FILE:LINE (a JSON log line with --log-format json)" bash -c "
    ip netns exec ${P}fw $BIN/xpfd -f $DIR/pflow.conf -i fc --socket $DIR/x.sock --log-format json 2>&1 | tee /dev/stderr |
        python3 -c 'import json,sys; ds = [json.loads(l) for l in sys.stdin]; assert any(d[\"level\"] == \"err\" and \"pflow.conf:1: pflow:\" in d[\"msg\"] for d in ds), ds'"

# log (all): every packet of the rule's states, both ways, into pflog2; `log` beside it
# logs a state's first packet only.
sed 's/^pass in on fc inet proto icmp from <inside>$/pass in log (all, to pflog2) on fc inet proto udp to 10.0.2.2 port 7000\n&/' \
    "$DIR/pf.conf" >"$DIR/all.conf"
$CTL -f "$DIR/all.conf"
c python3 -c "
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.2', 46000)); s.settimeout(1)
for i in range(4):
    s.sendto(b'y', ('10.0.2.2', 7000))
    try: s.recv(100)
    except OSError: pass"
sleep 0.5
check "log (all): the flow's 4 datagrams and 4 answers are all in pflog2" bash -c "
    tcpdump -n -e -r $DIR/pflog2 2>/dev/null | tee /dev/stderr > $DIR/all.txt
    [[ \$(grep -cE 'pass in on fc: 10\.0\.1\.2\.46000 > 10\.0\.2\.2\.7000' $DIR/all.txt) -eq 4 ]] &&
    [[ \$(grep -cE '10\.0\.2\.2\.7000 > 10\.0\.1\.2\.46000' $DIR/all.txt) -eq 4 ]]"
$CTL -f "$DIR/pf.conf"

# pf's rule counters, since the load just made: what a block rule blocked, a rule's states'
# packets kept after the states end, and who loaded the rules.
try tcp 7000; try tcp 7000; try tcp 7999
check "-s rules -v: the block rule counts the packets it blocked; the rules name the pid of the xpfctl that loaded them" bash -c "
    $CTL -s rules -v >$DIR/rv.txt; cat $DIR/rv.txt
    grep -A1 '^block drop log all\$' $DIR/rv.txt | grep -qE 'Packets: +[1-9]' &&
        pid=\$(grep -A2 '^block drop log all\$' $DIR/rv.txt | sed -nE 's/.*Inserted: uid 0 pid ([0-9]+) State Creations: 0 +]\$/\\1/p') &&
        [[ -n \$pid && \$pid != $XPFD && \$pid != \$(pgrep -x xpfd | head -1) ]]"
check "a rule keeps its states' packets when they end: after -F states, web's 2 connections still counted (States: 0, 2 creations)" bash -c "
    $CTL -F states && $CTL -s labels | tee /dev/stderr |
        grep -E '^web [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* [1-9][0-9]* 2\$' &&
        $CTL -s rules -v | grep -A1 'label \"web\"' | tee /dev/stderr | grep -qE 'States: 0 '"

# xpfd's own log: levelled lines, one summary line per load, pf's debug levels.
cp "$DIR/pf.conf" "$DIR/pf2.conf"
printf 'set debug debug\npass in on fc inet proto udp to 10.0.2.2 port 7001\n' >>"$DIR/pf2.conf"
$CTL -f "$DIR/pf2.conf"
check "a load logs one line of what changed (rules +1, set options)" bash -c "
    grep -E 'xpfd: info: ruleset generation [0-9]+: rules 8 \(\+1 -0\), translation rules 0 \(\+0 -0\), tables 1, set options changed' $LOG"
check "set debug debug: control requests are logged at debug; xpfctl -x info quiets them; -x refuses a bad level" bash -c "
    $CTL -s memory >/dev/null; n=\$(grep -c 'xpfd: debug: control: show memory' $LOG)
    $CTL -x info && $CTL -s memory >/dev/null
    [[ \$n -ge 1 && \$(grep -c 'xpfd: debug: control: show memory' $LOG) -eq \$n ]] &&
        grep -q 'xpfd: info: debug level info (xpfctl -x)' $LOG && ! $CTL -x verbose"
check "-s info names the debug level as pfctl -si does (Debug: info)" bash -c "$CTL -s info | head -1 | grep -q 'Debug: info\$'"

# Refused where it cannot be kept.
printf 'pass in log (matches) proto tcp\n' >"$DIR/matches.conf"
check "log (matches) is refused with FILE:LINE" bash -c "! $CTL -f $DIR/matches.conf 2>$DIR/err; cat $DIR/err; grep -q 'matches.conf:1:.*log (matches)' $DIR/err"

# NetFlow v5 to the same collector: xpfd restarted with --pflow-proto 5, a UDP flow, its
# records in nfdump as a v5 exporter's.
kill "$XPFD"; wait "$XPFD" 2>/dev/null
rm -rf "$DIR/flows5"; mkdir -p "$DIR/flows5"
ip netns exec ${P}fw nfcapd -w "$DIR/flows5" -b 127.0.0.1 -p 2057 -t 3600 >"$DIR/nfcapd5.log" 2>&1 &
NFCAPD=$!
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --socket $SOCK "${IOARG[@]}" --pflog "$DIR/pflog" \
    --pflow 127.0.0.1:2057 --pflow-proto 5 --pflow-active 1 2>>"$LOG" &
XPFD=$!
for _ in $(seq 100); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
c python3 -c "
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.2', 47000)); s.settimeout(1)
for i in range(3):
    s.sendto(b'z' * 50, ('10.0.2.2', 7000))
    try: s.recv(100)
    except OSError: pass"
sleep 2.5
kill -TERM $NFCAPD; wait $NFCAPD 2>/dev/null
check "NetFlow v5 (--pflow-proto 5): nfcapd takes it as v5, nfdump lists the flow's 3 datagrams each way" bash -c "
    grep -q 'Process_v5: New exporter' $DIR/nfcapd5.log && nfdump -R $DIR/flows5 -q -N -o 'fmt:%pr %sa %sp %da %dp %pkt' | tee /dev/stderr > $DIR/v5.txt
    [[ \$(awk '\$2 == \"10.0.1.2\" && \$3 == 47000 && \$5 == 7000 {s += \$6} END {print s+0}' $DIR/v5.txt) -eq 3 ]] &&
    [[ \$(awk '\$2 == \"10.0.2.2\" && \$3 == 7000 && \$5 == 47000 {s += \$6} END {print s+0}' $DIR/v5.txt) -eq 3 ]]"

[[ $fail -gt 0 ]] && sed "s/^/     xpfd: /" "$LOG" | tail -20
echo "observe: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
