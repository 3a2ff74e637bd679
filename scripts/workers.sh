#!/usr/bin/env bash
# Several workers on multi-queue interfaces: veth with 4 queues each way, `xpfd --workers 2`.
# A reply can arrive on a queue of the other worker; each worker passes frames of flows it
# does not own to the one that does (a hash of the two addresses, the same both ways). From
# 32 client addresses: 1,000 TCP connections (each a 100-byte echo) and 100 UDP flows (an
# echo each) must all succeed; a port the rules block must not answer (the negative
# control); the hand-off must have been used (so the test cannot pass on one worker's luck).
# Then the same through `nat-to` the firewall's address, then through `binat-to` (each client
# address mapped onto a public one, and connections from outside to those), a port
# forwarding round-robin over two inside hosts, endpoint-independent UDP and sticky-address
# (each client's flows kept on one worker), GRE through nat-to (owned by its far end), and
# translations two workers cannot share refused at their line.
# usage: workers.sh
# FASTPATH=1: GRO goes on at the end hosts, so that their veths take redirected frames and
# xpfd's fast path (on by default) is used: flows forwarded by the steering program once
# established; what it hands over goes to the flow's worker like any frame.
# xpfd in XDP mode (--io xdp) unless IO=packet: xpfd in packet mode (AF_PACKET, its fast path of socket buffers on, the hosts'
# defaults): each interface's frames are shared among the workers' sockets by the kernel's
# fanout hash, and the hand-off brings them to their flow's owner; replies to the nat-to
# address reach xpfd through its tcx program.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
P=xw-
SOCK=/run/xpf-workers.sock
DIR=$(mktemp -d /tmp/xpf-workers.XXXX)
. scripts/lib.sh
needs workers ip python3 ethtool
PASS=0 FAIL=0
check() { # check DESCRIPTION COMMAND...
    local d=$1; shift
    if "$@"; then echo "ok   $d"; PASS=$((PASS + 1)); else echo "FAIL $d"; FAIL=$((FAIL + 1)); fi
}

QUEUES=4 scripts/topo.sh up $P
FAST=()
IO=${IO:-xdp}
if [[ ${FASTPATH:-0} == 1 ]]; then
    FAST=(--fastpath 65536)
    ip netns exec ${P}client ethtool -K c0 gro on >/dev/null
    ip netns exec ${P}server ethtool -K s0 gro on >/dev/null
fi
for i in $(seq 10 41); do ip -n ${P}client addr add 10.0.1.$i/24 dev c0; done
# The end hosts pick their transmit queue by CPU (XPS), as multi-queue NICs are set up: the
# client sends on queues 0 and 2 (worker 0's), the server on 1 and 3 (worker 1's). Every
# reply then arrives at the other worker: without the hand-off no connection would complete.
xps() { ip netns exec ${P}$1 sh -c "echo $4 > /sys/class/net/$2/queues/tx-$3/xps_cpus"; }
for q in 0 1 2 3; do xps client c0 $q 0; xps server s0 $q 0; done
xps client c0 0 1; xps client c0 2 2; xps server s0 1 1; xps server s0 3 2
cat > "$DIR/pf.conf" <<'CONF'
block all
pass in on fc inet proto tcp to 10.0.2.2 port 7100
pass in on fc inet proto udp to 10.0.2.2 port 7200
pass in on fc inet proto icmp
pass out on fs
CONF
cat > "$DIR/echo.py" <<'PY'
import socket, socketserver, sys, threading
class T(socketserver.BaseRequestHandler):
    def handle(self):
        d = self.request.recv(4096)
        self.request.sendall(d)
class U(socketserver.BaseRequestHandler):
    def handle(self):
        d, s = self.request
        s.sendto(d, self.client_address)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.request_queue_size = 256
for port in (7100, 7300):
    t = socketserver.ThreadingTCPServer(("10.0.2.2", port), T)
    threading.Thread(target=t.serve_forever, daemon=True).start()
u = socketserver.ThreadingUDPServer(("10.0.2.2", 7200), U)
u.serve_forever()
PY
cat > "$DIR/client.py" <<'PY'
import socket, sys, concurrent.futures as cf
kind, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srcs = ["10.0.1.%d" % i for i in range(10, 42)]
def tcp(i):
    for _ in range(3):
        try:
            s = socket.create_connection(("10.0.2.2", port), timeout=3, source_address=(srcs[i % 32], 0))
            s.sendall(b"x" * 100)
            got = b""
            while len(got) < 100:
                d = s.recv(100 - len(got))
                if not d:
                    break
                got += d
            s.close()
            if got == b"x" * 100:
                return True
        except OSError:
            pass
    return False
def udp(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((srcs[i % 32], 0))
    s.settimeout(1)
    msg = b"flow %d" % i
    for _ in range(3):
        try:
            s.sendto(msg, ("10.0.2.2", port))
            d, _ = s.recvfrom(100)
            if d == msg:
                return True
        except OSError:
            pass
    return False
with cf.ThreadPoolExecutor(50) as ex:
    ok = sum(ex.map(tcp if kind == "tcp" else udp, range(n)))
print(ok)
PY
ip netns exec ${P}server python3 "$DIR/echo.py" &
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --workers 2 --socket $SOCK --io "$IO" "${FAST[@]}" 2>"$DIR/xpfd.log" &
XPFD=$!
for _ in $(seq 100); do $BIN/xpfctl --socket $SOCK -s memory >/dev/null 2>&1 && break; sleep 0.1; done
info() { $BIN/xpfctl --socket $SOCK -s info --json | python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
c() { ip netns exec ${P}client "$@"; }

check "xpfd runs two workers on the 4-queue interfaces" grep -q "worker 1 on CPU" "$DIR/xpfd.log"
check "ping through the firewall" c ping -c 2 -i 0.2 -W 1 10.0.2.2
# An echo's two directions come in on different workers' queues, so one of them is handed
# over (XDP mode without FASTPATH: every echo crosses xpfd; with a fast path the kernel
# forwards them after the first); between pings both workers are idle and asleep. A handed
# frame rings its worker: the round trip stays well under the 10 ms an idle worker sleeps
# (without the ring, p50 5.8 ms).
rtt=$(c ping -c 40 -i 0.05 -W 1 10.0.2.2 | python3 -c "
import re, sys, statistics
t = [float(x) for x in re.findall(r'time=([0-9.]+)', sys.stdin.read())]
print(round(statistics.median(t), 3) if len(t) >= 30 else 99)")
check "ping's round trip across the hand-off with both workers idle: p50 ${rtt} ms (< 2)" python3 -c "import sys; sys.exit(0 if $rtt < 2 else 1)"
n=$(c python3 "$DIR/client.py" tcp 7100 1000)
check "1,000 TCP connections from 32 addresses all succeed ($n)" test "$n" -eq 1000
# Each worker counts the rules it tests in its own row; -s rules -v shows their sum: every
# one of the 1,000 SYNs, whichever worker took it, tested the rule that passed it.
n=$($BIN/xpfctl --socket $SOCK -s rules -v | grep -A1 'port = 7100' | grep -oE 'Evaluations: +[0-9]+' | grep -oE '[0-9]+$')
check "-s rules -v: the TCP rule's evaluations are both workers' ($n >= 1000)" test "${n:-0}" -ge 1000
n=$(c python3 "$DIR/client.py" udp 7200 100)
check "100 UDP flows all answered ($n)" test "$n" -eq 100
n=$(c python3 "$DIR/client.py" tcp 7300 20)
check "a port the rules block gets no connection (negative control: $n of 20)" test "$n" -eq 0
off=$(info 'd["forwarding"]["handed_off"]')
in=$(info 'd["forwarding"]["handed_in"]')
check "frames of the other worker's flows were handed to it ($off handed off, $in taken)" test "$off" -gt 0 -a "$off" -eq "$in"
check "no hand-off queue overflowed" test "$(info 'd["forwarding"]["handoff_full"]')" -eq 0
q=$(info 'sum(1 for s in d["sockets"] if s["rx"] > 0)')
check "frames came in on several queues ($q sockets received)" test "$q" -ge 3
if [[ $IO == packet ]]; then
    check "packet mode: each interface's frames shared by the workers' sockets ($(grep -c 'AF_PACKET (TPACKET_V2 rings), worker' "$DIR/xpfd.log") sockets)" \
        test "$(grep -c 'AF_PACKET (TPACKET_V2 rings), worker' "$DIR/xpfd.log")" -eq 4
    inst=$(info 'd["forwarding"]["fast"]["installed"]')
    kern=$(info 'd["skb_fast_path"]["forwarded"] + d["skb_fast_path"]["forwarded_neighbour"]')
    check "packet mode: flows went into the tables ($inst) and the kernel forwarded their packets ($kern)" \
        test "$inst" -gt 1000 -a "$kern" -gt 1000
elif [[ ${#FAST[@]} -gt 0 ]]; then
    inst=$(info 'd["forwarding"]["fast"]["installed"]')
    kern=$($BIN/xpfctl --socket $SOCK -s info | awk -F'  +' '/forwarded in the kernel/ {s += $NF} END {print s+0}')
    check "--fastpath: flows went into the tables ($inst) and the steering program forwarded their packets ($kern)" \
        test "$inst" -gt 1000 -a "$kern" -gt 1000
fi
# Translation with two workers: the same traffic leaves as the firewall's address. Replies
# come to that address, on any queue; the hand-off owns them by their destination port (each
# worker hands out only ports of its own residue), so they reach the worker of their flow.
sed 's/^pass out on fs$/pass out on fs\nmatch out on fs inet from 10.0.1.0\/24 nat-to 10.0.2.1/' "$DIR/pf.conf" >"$DIR/nat.conf"
# Queues load with two workers (their rates: scripts/shaper.sh).
{ cat "$DIR/pf.conf"; printf 'queue root on fs bandwidth 40M\nqueue a parent root bandwidth 10M default\n'; } >"$DIR/q.conf"
check "two workers: a ruleset with queues loads, and -s queue shows them" \
    bash -c "$BIN/xpfctl --socket $SOCK -f '$DIR/q.conf' && $BIN/xpfctl --socket $SOCK -s queue | grep -q '^queue a on fs parent root bandwidth 10M'"
check "-f a ruleset with nat-to (two workers)" $BIN/xpfctl --socket $SOCK -f "$DIR/nat.conf"
n=$(c python3 "$DIR/client.py" tcp 7100 1000)
check "nat-to: 1,000 TCP connections from 32 addresses all succeed ($n)" test "$n" -eq 1000
n=$(c python3 "$DIR/client.py" udp 7200 100)
check "nat-to: 100 UDP flows all answered ($n)" test "$n" -eq 100
# Replies in pieces: 3,000-byte datagrams echoed back through the translation. A reply's first
# piece is owned by its port; the later ones carry none and follow the first.
n=$(c python3 -c "
import socket, concurrent.futures as cf
def one(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.%d' % (10 + i % 32), 0)); s.settimeout(1)
    msg = bytes([i]) * 3000
    for _ in range(3):
        try:
            s.sendto(msg, ('10.0.2.2', 7200))
            if s.recvfrom(4000)[0] == msg:
                return True
        except OSError:
            pass
    return False
with cf.ThreadPoolExecutor(32) as ex:
    print(sum(ex.map(one, range(64))))")
check "nat-to: 64 UDP datagrams of 3,000 bytes echoed back in pieces, all whole ($n)" test "$n" -eq 64
x=$($BIN/xpfctl --socket $SOCK -s states | grep -c ' 10\.0\.2\.1:[0-9]* (10\.0\.1\.[0-9]*:[0-9]*) -> 10\.0\.2\.2:7[12]00 ')
check "they left translated to 10.0.2.1 ($x translated states)" test "$x" -ge 1000
n=$(c python3 "$DIR/client.py" tcp 7300 20)
check "nat-to: the blocked port still gets no connection ($n of 20)" test "$n" -eq 0
# Protocols without ports through the same nat-to: GRE from the 32 clients, each to a server
# address of its own (one far end per flow: many-to-one without ports takes one flow per far
# end). Translated by address alone, so a reply to 10.0.2.1 names neither the client nor a
# worker; the hand-off owns such flows crossing fs by their far end, both ways. ESP, which no
# rule passes, is the negative control.
for i in $(seq 10 41); do ip -n ${P}server addr add 10.0.2.$i/24 dev s0; done
ip netns exec ${P}server python3 scripts/raw.py echo 47 &
GRE_ECHO=$!
ip netns exec ${P}server python3 scripts/raw.py echo 50 &
ESP_ECHO=$!
sed 's/^pass out on fs$/pass in on fc inet proto gre\npass out on fs/' "$DIR/nat.conf" >"$DIR/gre.conf"
check "-f nat-to with GRE passed in (two workers)" $BIN/xpfctl --socket $SOCK -f "$DIR/gre.conf"
n=$(c python3 scripts/raw.py send 47 32 "$(seq -s, -f 10.0.1.%g 10 41)" "$(seq -s, -f 10.0.2.%g 10 41)")
check "nat-to: 32 GRE flows from 32 addresses all echoed ($n)" test "$n" -eq 32
x=$($BIN/xpfctl --socket $SOCK -s states | grep -c ' gre 10\.0\.2\.1 (10\.0\.1\.[0-9]*) -> 10\.0\.2\.[0-9]* ')
check "they left translated to 10.0.2.1 ($x translated GRE states)" test "$x" -eq 32
n=$(c python3 scripts/raw.py send 50 8 "$(seq -s, -f 10.0.1.%g 10 41)" "$(seq -s, -f 10.0.2.%g 10 41)")
check "nat-to: ESP, which no rule passes, gets no echo ($n of 8)" test "$n" -eq 0
kill $GRE_ECHO $ESP_ECHO 2>/dev/null
for i in $(seq 10 41); do ip -n ${P}server addr del 10.0.2.$i/24 dev s0; done
# binat-to with two workers: each client address maps onto a public one of its own, host by
# host (10.0.1.N is 10.0.2.64+N, ports kept). Replies, and connections from the outside to
# the public addresses, are owned by the flow they map back to, on whichever queue they come.
for i in $(seq 10 41); do ip -n ${P}fw addr add 10.0.2.$((64 + i))/32 dev fs; done
# The pings from outside below: an echo request carries no port; its reply from the inside
# host finds no rule to pass it on fc, only the request's state, on the request's worker.
cat > "$DIR/binat.conf" <<'CONF'
block all
pass in on fc inet proto tcp to 10.0.2.2 port 7100
pass in on fc inet proto udp to 10.0.2.2 port 7200
pass out on fs
match on fs inet from 10.0.1.0/26 to any binat-to 10.0.2.64/26
pass in on fs inet proto tcp to 10.0.2.64/26 port 7400
pass in on fs inet proto icmp to 10.0.2.64/26 icmp-type echoreq
pass out on fc inet proto { tcp icmp } to 10.0.1.0/26
pass in on fs inet proto tcp to 10.0.2.1 port 8080 rdr-to { 10.0.1.10, 10.0.1.11 } port 7401 round-robin
CONF
c python3 -c "
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 7400)); s.listen(256)
def echo(k):
    with k:
        k.sendall(k.recv(100))
while True:
    k, _ = s.accept()
    threading.Thread(target=echo, args=(k,), daemon=True).start()
" &
ECHO_IN=$!
# The forwarding's targets answer with their own address.
c python3 -c "
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 7401)); s.listen(256)
def me(k):
    with k:
        k.recv(100); k.sendall(k.getsockname()[0].encode())
while True:
    k, _ = s.accept()
    threading.Thread(target=me, args=(k,), daemon=True).start()
" &
ME_IN=$!
for i in $(seq 3 10); do ip -n ${P}server addr add 10.0.2.$i/32 dev s0; done
check "-f a ruleset with binat-to (two workers)" $BIN/xpfctl --socket $SOCK -f "$DIR/binat.conf"
n=$(c python3 "$DIR/client.py" tcp 7100 1000)
check "binat-to: 1,000 TCP connections from 32 addresses all succeed ($n)" test "$n" -eq 1000
n=$(c python3 "$DIR/client.py" udp 7200 100)
check "binat-to: 100 UDP flows all answered ($n)" test "$n" -eq 100
x=$($BIN/xpfctl --socket $SOCK -s states | python3 -c "
import re, sys
ok = bad = 0
for m in re.finditer(r' 10\.0\.2\.(\d+):(\d+) \(10\.0\.1\.(\d+):(\d+)\) -> 10\.0\.2\.2:7[12]00 ', sys.stdin.read()):
    pub, pp, ins, ip = map(int, m.groups())
    if pub == 1: continue  # the nat-to above's states
    if pub == 64 + ins and pp == ip: ok += 1
    else: bad += 1
print(ok, bad)")
check "each left as its own public address and port ($x: mapped, other)" test "${x% *}" -ge 1000 -a "${x#* }" -eq 0
n=$(ip netns exec ${P}server python3 -c "
import socket, concurrent.futures as cf
def one(i):
    try:
        s = socket.create_connection(('10.0.2.%d' % (74 + i % 32), 7400), timeout=3)
        s.sendall(b'in %d' % i); ok = s.recv(100) == b'in %d' % i; s.close(); return ok
    except OSError:
        return False
with cf.ThreadPoolExecutor(50) as ex:
    print(sum(ex.map(one, range(200))))")
check "binat-to in: 200 connections from outside to the 32 public addresses reach their hosts ($n)" test "$n" -eq 200
n=$(for i in $(seq 10 41); do ip netns exec ${P}server ping -c 2 -i 0.2 -W 2 10.0.2.$((64 + i)) & done 2>/dev/null | grep -c ' 2 received')
check "binat-to in: pings from outside to the 32 public addresses all answered ($n of 32)" test "$n" -eq 32
n=$(c python3 "$DIR/client.py" tcp 7300 20)
check "binat-to: the blocked port still gets no connection ($n of 20)" test "$n" -eq 0
# A port forwarding to targets chosen per flow (round-robin over two hosts): the replies,
# from the targets, are owned by the flow's public address, as its first packets are.
x=$(ip netns exec ${P}server python3 -c "
import socket, collections, concurrent.futures as cf
def one(i):
    try:
        s = socket.create_connection(('10.0.2.1', 8080), timeout=3, source_address=('10.0.2.%d' % (3 + i % 8), 0))
        s.sendall(b'x'); d = s.recv(100).decode(); s.close(); return d
    except OSError:
        return None
with cf.ThreadPoolExecutor(50) as ex:
    got = collections.Counter(ex.map(one, range(200)))
print(sum(v for k, v in got.items() if k), len([k for k in got if k]))")
check "rdr-to round-robin over two hosts: 200 connections from 8 outside addresses all answered, by both ($x: answered, hosts)" \
    test "${x% *}" -eq 200 -a "${x#* }" -eq 2
kill $ECHO_IN $ME_IN 2>/dev/null
# Translations that remember per inside host, with two workers: endpoint-independent UDP (a
# client socket keeps its public address and port towards every destination) and
# sticky-address (a client keeps its pool address for all its connections, to every server).
# The hand-off keeps every flow of one of the rule's hosts on one worker, the one that
# remembers; by the address hash alone a client's flows to several servers meet both.
cat > "$DIR/hosts.conf" <<'CONF'
block all
pass in on fc inet proto tcp to port 7203
pass in on fc inet proto udp to port 7202
pass out on fs
match out on fs inet proto udp from 10.0.1.0/24 nat-to 10.0.2.1 endpoint-independent
match out on fs inet proto tcp from 10.0.1.0/24 nat-to { 10.0.2.80, 10.0.2.81 } round-robin sticky-address
CONF
# Each server address answers with the address and port it saw, over UDP and TCP.
ip netns exec ${P}server python3 -c "
import socket, threading
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind(('0.0.0.0', 7203)); t.listen(256)
def tcp():
    while True:
        k, a = t.accept()
        with k:
            k.sendall(('%s:%d' % a).encode())
threading.Thread(target=tcp, daemon=True).start()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 7202))
while True:
    d, a = s.recvfrom(100); s.sendto(('%s:%d' % a).encode(), a)
" &
WHO=$!
check "-f a ruleset with endpoint-independent and sticky-address (two workers)" \
    bash -c "$BIN/xpfctl --socket $SOCK -f '$DIR/hosts.conf' && $BIN/xpfctl --socket $SOCK -F states >/dev/null"
x=$(c python3 -c "
import socket, concurrent.futures as cf
def one(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.%d' % (10 + i % 32), 0)); s.settimeout(1)
    seen = []
    for dst in ('10.0.2.2', '10.0.2.3', '10.0.2.4'):
        for _ in range(3):
            try:
                s.sendto(b'who', (dst, 7202)); seen.append(s.recvfrom(100)[0].decode()); break
            except OSError:
                pass
    return seen
with cf.ThreadPoolExecutor(50) as ex:
    got = list(ex.map(one, range(100)))
print(sum(len(g) == 3 for g in got), sum(len(g) == 3 and len(set(g)) == 1 and g[0].startswith('10.0.2.1:') for g in got))")
check "endpoint-independent: 100 client sockets each seen by 3 servers as one public address and port ($x: answered, one mapping)" \
    test "$x" = "100 100"
x=$(c python3 -c "
import socket, collections, concurrent.futures as cf
def one(i):
    for _ in range(3):
        try:
            s = socket.create_connection(('10.0.2.%d' % (2 + i // 32 % 4), 7203), timeout=3, source_address=('10.0.1.%d' % (10 + i % 32), 0))
            d = s.recv(100).decode(); s.close()
            if d:
                return (i % 32, d.split(':')[0])
        except OSError:
            pass
with cf.ThreadPoolExecutor(50) as ex:
    got = [g for g in ex.map(one, range(640)) if g]
pub = collections.defaultdict(set)
for c, a in got:
    pub[c].add(a)
print(len(got), sum(len(v) == 1 for v in pub.values()), len(set().union(*pub.values())) if pub else 0)")
check "sticky-address: 640 connections from 32 clients to 4 servers, each client seen as one pool address, both in use ($x: answered, clients with one, addresses)" \
    test "$x" = "640 32 2"
n=$(c python3 "$DIR/client.py" tcp 7300 20)
check "endpoint-independent and sticky-address: the blocked port still gets no connection ($n of 20)" test "$n" -eq 0
# Many hosts behind one address keeping their ports (static-port), with two workers: each
# host's flows are owned by their source port, the worker their replies to the address (by
# their destination port) come to.
cat > "$DIR/static.conf" <<'CONF'
block all
pass in on fc inet proto tcp to port 7203
pass in on fc inet proto udp to port 7202
pass in on fc inet proto icmp icmp-type echoreq
pass out on fs
match out on fs inet from 10.0.1.0/24 nat-to 10.0.2.1 static-port
CONF
check "-f a ruleset with nat-to static-port from a network (two workers)" \
    bash -c "$BIN/xpfctl --socket $SOCK -f '$DIR/static.conf' && $BIN/xpfctl --socket $SOCK -F states >/dev/null"
x=$(c python3 -c "
import socket, concurrent.futures as cf
def udp(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.0.1.%d' % (10 + i % 32), 20000 + i)); s.settimeout(1)
    for _ in range(3):
        try:
            s.sendto(b'who', ('10.0.2.2', 7202)); return s.recvfrom(100)[0].decode() == '10.0.2.1:%d' % (20000 + i)
        except OSError:
            pass
def tcp(i):
    for _ in range(3):
        try:
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('10.0.1.%d' % (10 + i % 32), 21000 + i))
            s.settimeout(3); s.connect(('10.0.2.%d' % (2 + i % 3), 7203)); d = s.recv(100).decode(); s.close()
            if d:
                return d == '10.0.2.1:%d' % (21000 + i)
        except OSError:
            pass
with cf.ThreadPoolExecutor(50) as ex:
    u = list(ex.map(udp, range(100))); t = list(ex.map(tcp, range(300)))
print(sum(g is not None for g in u), sum(g is True for g in u), sum(g is not None for g in t), sum(g is True for g in t))")
check "static-port: 100 UDP flows and 300 connections from 32 clients answered, each seen as 10.0.2.1 with its own port ($x: UDP answered, kept; TCP answered, kept)" \
    test "$x" = "100 100 300 300"
n=$(c python3 "$DIR/client.py" tcp 7300 20)
check "static-port: the blocked port still gets no connection ($n of 20)" test "$n" -eq 0
# Eight clients ping the server with one identifier (as Windows' ping does): the first keeps
# it, the others get others, and every reply finds its client.
x=$(c python3 -c "
import socket, struct, time
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
socks = []
for i in range(8):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.bind(('10.0.1.%d' % (10 + i), 0)); s.settimeout(0.2)
    socks.append(s)
got = set()
for _ in range(3):
    for i, s in enumerate(socks):
        if i not in got:
            m = struct.pack('!BBHHH', 8, 0, 0, 1, i + 1) + b'xpf!'
            s.sendto(m[:2] + struct.pack('!H', csum(m)) + m[4:], ('10.0.2.2', 0))
    end = time.time() + 1
    while time.time() < end and len(got) < 8:
        for i, s in enumerate(socks):
            try:
                d = s.recv(100)
            except OSError:
                continue
            t, _, _, ident, seq = struct.unpack('!BBHHH', d[20:28])
            if t == 0 and ident == 1 and seq == i + 1 and d[12:16] == bytes([10, 0, 2, 2]):
                got.add(i)
print(len(got))")
check "static-port: eight clients' pings with one identifier all answered ($x of 8)" test "$x" -eq 8
kill $WHO 2>/dev/null
# IPv6 with two workers: the client network's prefix translated onto another (binat-to,
# host part kept) under `block all`: no rule passes neighbour advertisements in, so the
# firewall resolves the server and the clients by its solicitations' states; they ask for
# the firewall by rule.
for i in $(seq 10 41); do ip -n ${P}client addr add fd00:1::$i/64 dev c0 nodad; done
cat > "$DIR/v6.conf" <<'CONF'
block all
pass in on fc inet6 proto icmp6 icmp6-type { echoreq, neighbrsol }
pass in on fs inet6 proto icmp6 icmp6-type neighbrsol
pass in on fc inet6 proto udp to fd00:2::2 port 7200
pass out on fs
pass out on fc inet6 proto icmp6 icmp6-type neighbrsol
match out on fs inet6 from fd00:1::/64 to any binat-to fd00:2:0:1::/64
CONF
# The server answers each datagram with the address it came from.
ip netns exec ${P}server python3 -c "
import socket
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(('fd00:2::2', 7200))
while True:
    d, a = s.recvfrom(100); s.sendto(a[0].encode(), a)
" &
WHO6=$!
ip -n ${P}fw -6 neigh flush dev fs
check "-f an IPv6 ruleset with binat-to (two workers)" \
    bash -c "$BIN/xpfctl --socket $SOCK -f '$DIR/v6.conf' && $BIN/xpfctl --socket $SOCK -F states >/dev/null"
udp6() { # udp6 PORT: "answered mapped" of 100 UDP flows from 32 client addresses
    c python3 -c "
import socket, concurrent.futures as cf
def one(i):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(('fd00:1::%d' % (10 + i % 32), 0)); s.settimeout(1)
    for _ in range(3):
        try:
            s.sendto(b'who', ('fd00:2::2', $1)); return s.recvfrom(100)[0].decode() == 'fd00:2:0:1::%d' % (10 + i % 32)
        except OSError:
            pass
    return None
with cf.ThreadPoolExecutor(50) as ex:
    got = list(ex.map(one, range(100)))
print(sum(g is not None for g in got), sum(g is True for g in got))"
}
x=$(udp6 7200)
check "IPv6 binat-to: 100 UDP flows from 32 addresses answered, each seen as its address in the other prefix ($x: answered, mapped)" \
    test "$x" = "100 100"
n=$(for i in $(seq 10 17); do c ping -6 -c 2 -i 0.2 -W 2 -I fd00:1::$i fd00:2::2 & done 2>/dev/null | grep -c ' 2 received')
check "IPv6 binat-to: pings from 8 addresses all answered ($n of 8)" test "$n" -eq 8
x=$(udp6 7201)
check "IPv6: a port the rules block gets no answer ($x: answered, mapped)" test "$x" = "0 0"
kill $WHO6 2>/dev/null
sed 's/from 10.0.1.0\/24 nat-to 10.0.2.1 endpoint-independent/nat-to 10.0.2.1 endpoint-independent/' "$DIR/hosts.conf" >"$DIR/anyhost.conf"
out=$($BIN/xpfctl --socket $SOCK -f "$DIR/anyhost.conf" 2>&1)
check "endpoint-independent from any is refused with FILE:LINE (two workers: its hosts unnamed)" \
    bash -c 'echo "$1"; grep -q "anyhost.conf:5: endpoint-independent and sticky-address with several workers" <<<"$1"' _ "$out"
# What two workers cannot share is refused at its line: many hosts behind one address keeping
# their ports, from any (the hand-off cannot know its hosts).
sed 's/^pass out on fs$/pass out on fs\nmatch out on fs inet nat-to 10.0.2.1 static-port/' "$DIR/pf.conf" >"$DIR/anystatic.conf"
out=$($BIN/xpfctl --socket $SOCK -f "$DIR/anystatic.conf" 2>&1)
check "nat-to static-port from any onto one address is refused with FILE:LINE (two workers)" \
    bash -c 'echo "$1"; grep -q "anystatic.conf:6: static-port from many hosts onto fewer addresses with several workers" <<<"$1"' _ "$out"
# A many-to-one nat-to of every protocol on no interface: which end of a GRE flow is the far
# one cannot be told.
sed 's/^pass out on fs$/pass out on fs\nmatch out inet from 10.0.1.0\/24 nat-to 10.0.2.1/' "$DIR/pf.conf" >"$DIR/anyif.conf"
out=$($BIN/xpfctl --socket $SOCK -f "$DIR/anyif.conf" 2>&1)
check "nat-to of protocols without ports on no interface is refused with FILE:LINE (two workers)" \
    bash -c 'echo "$1"; grep -q "anyif.conf:6: nat-to onto fewer addresses of protocols without ports (GRE, ESP, ...) with several workers needs the rule on an interface" <<<"$1"' _ "$out"
echo "workers: $PASS passed, $FAIL failed"
[[ $FAIL -eq 0 ]]
