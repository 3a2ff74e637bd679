#!/usr/bin/env bash
# Shaper scenario: pf's queues in xpfd with real clients (iperf3, ping) on default veths.
#   client (10.0.1.2) -- [fc] xpfd [fs] -- server (10.0.2.2); the queue tree is on fs.
# Each check prints ok/FAIL; the last line is the tally. Needs root; cleans up after itself.
# xpfd in XDP mode (--io xdp); IO=packet: xpfd in packet mode.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
P=xq-
SOCK=/run/xpf-shaper.sock
CTL="$BIN/xpfctl --socket $SOCK"
LOG=$(mktemp /tmp/xpf-shaper-xpfd.XXXX.log)
DIR=$(mktemp -d /tmp/xpf-shaper.XXXX)
. scripts/lib.sh
needs shaper ip iperf3 ping python3
. scripts/check.sh
c() { ip netns exec ${P}client "$@"; }

# Two members' queues of 10 and 30 Mbit/s under a root of 40 on the server side; iperf3 on
# port 5201 goes to `a`, on 5202 to `b`; port 5203 is blocked (the negative control).
tree() { # $1: options of queue b
    cat <<CONF
queue root on fs bandwidth 40M
queue a parent root bandwidth 10M
queue b parent root bandwidth 30M $1 default
block all
pass in on fc inet proto icmp icmp-type echoreq
pass in on fc inet proto tcp to 10.0.2.2 port 5201 set queue a
pass in on fc inet proto tcp to 10.0.2.2 port 5202 set queue b
pass out on fs
pass in on fs
pass out on fc
CONF
}
tree "" > "$DIR/pf.conf"
tree "max 15M" > "$DIR/max.conf"
tree "flows 1024" > "$DIR/flows.conf"
tree "flows 8" > "$DIR/flows8.conf"
printf 'queue root on fs bandwidth 40M\nqueue a parent root bandwidth 30M default\nqueue b parent root bandwidth 20M\npass all\n' > "$DIR/over.conf"
printf 'queue root on fs bandwidth 40M\nqueue a parent root bandwidth 30M flows 40000 default\npass all\n' > "$DIR/manyflows.conf"
# a with pf.conf(5)'s burst, on its bandwidth and on a max of the same (so that after the burst
# a is held to its 10, and what b's TCP leaves of the root is not counted as a's); b held to
# its share (max), so that it is not ahead of its rate when a starts.
tree "max 30M" | sed 's/^queue a parent root bandwidth 10M$/queue a parent root bandwidth 10M burst 30M for 500ms max 10M burst 30M for 500ms/' > "$DIR/burst.conf"

scripts/topo.sh up $P
for port in 5201 5202 5203; do ip netns exec ${P}server iperf3 -s -D -p $port --bind 10.0.2.2 >/dev/null; done
IOARG=(--io "${IO:-xdp}")
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --workers 1 --socket $SOCK "${IOARG[@]}" 2>"$LOG" &
XPFD=$!
for _ in $(seq 100); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
check "xpfd starts with a queue tree on fs" $CTL -s queue
c ping -c 1 -W 1 10.0.2.2 >/dev/null 2>&1

# Receiver-side Mbit/s of an iperf3 JSON result.
mbps() { python3 -c "import json,sys; print(round(json.load(open('$1'))['end']['sum_received']['bits_per_second']/1e6, 2))" 2>/dev/null || echo 0; }
# A queue's rate is of whole frames, as pf's and tc's are: iperf3's goodput is 1448 bytes of
# each 1514-byte frame (TCP with timestamps). `within GOT RATE PCT`: GOT is RATE's goodput.
within() { python3 -c "import sys; g,w,t=map(float,sys.argv[1:]); w*=1448/1514; sys.exit(0 if abs(g-w)<=w*t/100 else 1)" "$@"; }

# TCP's rate through the shaper, measured on a VM that shares its host: for minutes at a
# time every rate of this script read 5-15% low, with hundreds of retransmissions, and then
# 38.2 of 40 Mbit/s with none again (tc HTB in the same lab, measured between such a run and
# the next good one, read 36.8-38.3; one CI run read 24 where 38 were due). A rate that misses its bound is measured once more, and the check
# takes the second figure; the first is printed beside it.
both() { # $1: streams a member. a and b at once for 10 s; prints their Mbit/s
    c iperf3 -c 10.0.2.2 -p 5201 -t 10 -O 2 -P "$1" -J > "$DIR/a.json" 2>&1 &
    local A=$!
    c iperf3 -c 10.0.2.2 -p 5202 -t 10 -O 2 -P "$1" -J > "$DIR/b.json" 2>&1
    wait $A
    echo "$(mbps "$DIR/a.json") $(mbps "$DIR/b.json")"
}
alone() { # $1: streams. a alone for 6 s; prints its Mbit/s
    c iperf3 -c 10.0.2.2 -p 5201 -t 6 -O 2 -P "$1" -J > "$DIR/alone.json" 2>&1
    mbps "$DIR/alone.json"
}
shares() { within "$1" 10 5 && within "$2" 30 5; }
again=

# Both members busy: each gets its bandwidth.
read -r a b < <(both 1)
shares "$a" "$b" || { again="; measured again, first $a and $b"; read -r a b < <(both 1); }
check "two members at once: a gets its 10 Mbit/s ($a) within 5%$again" within "$a" 10 5
check "... and b its 30 Mbit/s ($b) within 5%" within "$b" 30 5
check "-s queue -v counts a's packets and its queue length" bash -c "$CTL -s queue -v | grep -A2 '^queue a on fs' | grep -Eq 'pkts: +[1-9][0-9]{3,}'"

# One member alone borrows what the other leaves.
a=$(alone 1); again=
within "$a" 40 5 || { again="; measured again, first $a"; a=$(alone 1); }
check "a alone borrows up to the root's 40 Mbit/s ($a) within 5%$again" within "$a" 40 5

# A reload changes a rate live: b runs alone at 40; mid-transfer b gets max 15.
c iperf3 -c 10.0.2.2 -p 5202 -t 12 -i 1 -J > "$DIR/live.json" 2>&1 &
B=$!
sleep 5
check "a reload with b capped at max 15M loads while b runs" $CTL -f "$DIR/max.conf"
wait $B
read -r before after < <(python3 -c "
import json; iv=json.load(open('$DIR/live.json'))['intervals']
r=[i['sum']['bits_per_second']/1e6 for i in iv]
print(round(sum(r[1:4])/3,2), round(sum(r[7:11])/4,2))" 2>/dev/null || echo "0 0")
check "before the reload b borrowed the root's 40 ($before)" within "$before" 40 7
check "after it, max caps b at 15 Mbit/s ($after) within 5%" within "$after" 15 5
check "the transfer went on across the reload (iperf3 finished)" python3 -c "import json; json.load(open('$DIR/live.json'))['end']['sum_received']"

# FQ-CoDel in b: a ping keeps a low RTT beside a bulk transfer; without flows it waits behind
# the FIFO's 50 packets (the control).
rtt() { # $1 conf: ping p50 in ms while a bulk transfer fills b
    $CTL -f "$1" >/dev/null || return
    c iperf3 -c 10.0.2.2 -p 5202 -t 8 -P 4 >/dev/null 2>&1 &
    local I=$!
    sleep 2
    c ping -c 40 -i 0.1 10.0.2.2 | python3 -c "
import re,sys; v=sorted(float(x) for x in re.findall(r'time=([0-9.]+)', sys.stdin.read()))
print(v[len(v)//2] if len(v) >= 30 else 999)"
    wait $I
}
fifo=$(rtt "$DIR/pf.conf")
fq=$(rtt "$DIR/flows.conf")
check "without flows a ping waits behind the bulk transfer (p50 $fifo ms > 5)" python3 -c "import sys; sys.exit(0 if $fifo > 5 else 1)"
check "with flows 1024 the ping's p50 stays low ($fq ms <= 2)" python3 -c "import sys; sys.exit(0 if $fq <= 2 else 1)"
# Eight sub-queues, one set: the ping and the four bulk flows each have one (a plain
# hash % 8 would put the ping behind a bulk flow in 41% of runs).
fq8=$(rtt "$DIR/flows8.conf")
check "with flows 8 the ping still has a sub-queue of its own (p50 $fq8 ms <= 2)" python3 -c "import sys; sys.exit(0 if $fq8 <= 2 else 1)"

# A burst: b busy, a starts 2 s later and goes at its burst for 500 ms (beside b's 30 under
# the root's 40: about 20), then at its 10. What the shaper sent of a (its queue's bytes),
# over its first 400 ms and over a second later on.
check "a burst loads, and -s queue prints it as pfctl does" bash -c \
    "$CTL -f $DIR/burst.conf && $CTL -s queue | grep -q '^queue a on fs parent root bandwidth 10M burst 30M for 500ms'"
abytes() { $CTL -s queue --json | python3 -c "import json,sys,time; print(time.time(), [q['bytes'] for q in json.load(sys.stdin) if q['queue']=='a'][0])"; }
rate() { python3 -c "import sys; t0,b0,t1,b1=map(float,sys.argv[1:]); print(round((b1-b0)*8/(t1-t0)/1e6, 2))" $1 $2; }
c iperf3 -c 10.0.2.2 -p 5202 -t 6 > /dev/null 2>&1 &
B=$!
sleep 2
c iperf3 -c 10.0.2.2 -p 5201 -t 4 > /dev/null 2>&1 &
A=$!
sleep 0.05; s0=$(abytes); sleep 0.4; s1=$(abytes)
sleep 1.5; s2=$(abytes); sleep 1; s3=$(abytes)
wait $A $B
first=$(rate "$s0" "$s1"); later=$(rate "$s2" "$s3")
check "a's first 400 ms go at its burst, over its 10 Mbit/s ($first > 14)" python3 -c "import sys; sys.exit(0 if $first > 14 else 1)"
check "... then its 10 Mbit/s ($later) within 10%" python3 -c "import sys; sys.exit(0 if abs($later - 10) <= 1 else 1)"
$CTL -f "$DIR/pf.conf" >/dev/null

# The negative control: a port no rule passes stays blocked through the shaped interface.
check "iperf3 to port 5203 is blocked (no rule passes it)" refused c iperf3 -c 10.0.2.2 -p 5203 -t 1 --connect-timeout 2000
# Refusals at load, with the file and line.
check "children over their parent's bandwidth are refused with FILE:LINE" bash -c \
    "! $CTL -f $DIR/over.conf 2>$DIR/err && grep -q 'over.conf:1:.*higher than its own' $DIR/err"
check "flows over pfctl's 32767 are refused with FILE:LINE" bash -c \
    "! $CTL -f $DIR/manyflows.conf 2>$DIR/err && grep -q 'manyflows.conf:2:.*number of flows out of range: max 32767' $DIR/err"
# Two workers (veths of two queues a side): each shapes the flows it holds, and the
# coordinator shares the tree's rates between them by demand, so that the members still get
# 10 and 30 whichever worker their flows land on. Which worker a flow lands on is a hash of
# its ports (the veth's transmit hash, or the fanout's): eight streams a member, so that all
# sixteen land on one worker once in 2^15 runs (with four a member, once in 128: seen in CI).
kill "$XPFD"; wait "$XPFD" 2>/dev/null; XPFD=
# topo.sh up deletes the namespaces first: the first part's iperf3 daemons stop before.
ns_stop
QUEUES=2 scripts/topo.sh up $P
for port in 5201 5202 5203; do ip netns exec ${P}server iperf3 -s -D -p $port --bind 10.0.2.2 >/dev/null; done
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --workers 2 --socket $SOCK "${IOARG[@]}" 2>"$LOG" &
XPFD=$!
for _ in $(seq 100); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
check "xpfd starts with two workers and the queue tree" bash -c "$CTL -s queue && grep -q 'worker 1 on CPU' $LOG"
c ping -c 1 -W 1 10.0.2.2 >/dev/null 2>&1
rx() { $CTL -s info --json | python3 -c "
import json,sys; d=json.load(sys.stdin)
print(sum(s['rx'] for s in d['sockets'] if s['queue'] == $1))"; }
# iperf3's server runs one test at a time. With two workers, the last test's closing
# segments can be handed from one worker to the other and reach the server after the next
# test's SYN (xpfd reorders across connections there; docs/state-table.md): the server then refuses
# the new test ("busy") or resets it. The next test starts once the server has closed the
# last one's connections.
settle() {
    for _ in $(seq 30); do
        [[ -z $(ip netns exec ${P}server ss -tnH state established '( sport = :5201 or sport = :5202 )') ]] && return
        sleep 0.1
    done
}
q0=$(rx 0); q1=$(rx 1)
read -r a b < <(both 8)
q0=$(( $(rx 0) - q0 )); q1=$(( $(rx 1) - q1 ))
# Packet mode's frames are TSO's segments whole (up to 44 frames' worth each), and its
# sockets share the flows by the kernel's fanout hash: fewer frames a socket.
least=1000; [[ ${IO:-} == packet ]] && least=100
check "the streams came in on both queues, so both workers received ($q0 and $q1 frames, each > $least)" test $q0 -gt $least -a $q1 -gt $least
again=
shares "$a" "$b" || { again="; measured again, first $a and $b"; settle; read -r a b < <(both 8); }
check "two workers: a gets its 10 Mbit/s ($a) within 5%$again" within "$a" 10 5
check "... and b its 30 Mbit/s ($b) within 5%" within "$b" 30 5
settle
a=$(alone 4); again=
within "$a" 40 5 || { again="; measured again, first $a"; settle; a=$(alone 4); }
check "two workers: a alone borrows the root's 40 Mbit/s ($a) within 5%$again" within "$a" 40 5
check "two workers: port 5203 is still blocked" refused c iperf3 -c 10.0.2.2 -p 5203 -t 1 --connect-timeout 2000
echo "shaper: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
