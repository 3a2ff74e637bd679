#!/usr/bin/env bash
# Translation scenarios: xpfd between the client's network (fc, 10.0.1.0/24, inside) and the
# server's (fs, 10.0.2.0/24, outside), translating with the firewall's own address on fs as
# a campus firewall does with its public one. Real clients, default host settings.
#   client 10.0.1.2 -- [fc] xpfd [fs 10.0.2.1, 10.0.2.50, 10.0.2.51] -- server 10.0.2.2 -- far 10.0.3.2
# Each check prints ok/FAIL; the last line is the tally. Needs root; cleans up after itself.
# xpfd in XDP mode (--io xdp); IO=packet: the same with xpfd in packet mode (AF_PACKET; its tcx program sends replies to
# the translation addresses to xpfd).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
P=xn-
SOCK=/run/xpf-nat.sock
CTL="$BIN/xpfctl --socket $SOCK"
DIR=$(mktemp -d /tmp/xpf-nat.XXXX)
LOG=$DIR/xpfd.log
. scripts/lib.sh
needs nat ip iperf3 tcpdump traceroute python3 nfcapd nfdump

. scripts/check.sh
c() { ip netns exec ${P}client "$@"; }
s() { ip netns exec ${P}server "$@"; }
# peer HOST-NS PROTO ADDR PORT [SRCPORT]: what the far end saw of us ("ip port").
peer() {
    ip netns exec ${P}$1 python3 - "$2" "$3" "$4" "${5:-0}" <<'PY'
import socket, sys
proto, addr, port, sport = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, kind)
s.settimeout(3)
if sport:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", sport))
s.connect((addr, port))
if proto == "udp":
    s.send(b"?")
print(s.recv(100).decode().strip())
PY
}
in_range() { local p; p=$(cut -d' ' -f2 <<<"$1"); [[ $p -ge $2 && $p -le $3 ]]; }
export -f peer in_range c s
export P

cat > "$DIR/pf.conf" <<'CONF'
in_if = "fc"
out_if = "fs"
table <pub> { 10.0.2.50 10.0.2.51 }
# Every state's flow to the collector (pflow), NAT44 events included.
set state-defaults pflow
block all
# The inside goes out as the firewall's (first) address; the last matching rule's
# translation applies, as in pf: UDP to port 9999 gets a range three ports wide
# (exhaustion), and connections to 10.0.2.3 the pool of two addresses.
match out on $out_if inet from 10.0.1.0/24 nat-to (fs:0)
match out on $out_if inet proto udp from 10.0.1.0/24 to any port 9999 nat-to (fs:0) port 50001:50003
match out on $out_if inet from 10.0.1.0/24 to 10.0.2.3 nat-to <pub> round-robin
pass in on $in_if
pass out on $out_if
pass out on $in_if
# A port forwarding: the firewall's port 8022 is the client's 7000.
pass in on $out_if inet proto tcp to ($out_if) port 8022 rdr-to 10.0.1.2 port 7000
pass in on $out_if inet proto tcp to ($out_if) port 5201 rdr-to 10.0.1.2
# The firewall answers pings on its outside address (its own traffic, not translated).
pass in on $out_if inet proto icmp to 10.0.2.1 icmp-type echoreq
# ESP to the firewall's address is the client's (a protocol without ports, forwarded whole).
pass in on $out_if inet proto esp to ($out_if) rdr-to 10.0.1.2
CONF

scripts/topo.sh up $P
# More outside addresses on the firewall: a pool of two, and one for binat-to.
for a in 10.0.2.50 10.0.2.51 10.0.2.60; do ip -n ${P}fw addr add $a/32 dev fs; done
ip -n ${P}server addr add 10.0.2.3/32 dev s0
s python3 scripts/peer.py 0.0.0.0 7000 >/dev/null 2>&1 &
s python3 scripts/peer.py :: 7001 >/dev/null 2>&1 &
s python3 scripts/peer.py 0.0.0.0 9999 >/dev/null 2>&1 &
s iperf3 -s -D --bind 10.0.2.2 >/dev/null
# A UDP echo of whole datagrams (3,000 bytes go and come back as fragments), noting who sent.
s python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 7005))
while True:
    d, a = s.recvfrom(65535)
    open('$DIR/echo-peer', 'w').write(a[0] + ' ' + str(a[1]) + ' ' + str(len(d)))
    s.sendto(d, a)
" >/dev/null 2>&1 &
c python3 scripts/peer.py 10.0.1.2 7000 >/dev/null 2>&1 &
s python3 scripts/raw.py echo 47 >/dev/null 2>&1 &
c python3 scripts/raw.py echo 50 >/dev/null 2>&1 &
c python3 scripts/peer.py fd00:1::2 7000 >/dev/null 2>&1 &
mkdir -p "$DIR/flows"
ip netns exec ${P}fw nfcapd -w "$DIR/flows" -b 127.0.0.1 -p 2056 -t 3600 >"$DIR/nfcapd.log" 2>&1 &
NFCAPD=$!
IOARG=(--io "${IO:-xdp}")
ip netns exec ${P}fw $BIN/xpfd -f "$DIR/pf.conf" -i fc -i fs --socket $SOCK --pflow 127.0.0.1:2056 "${IOARG[@]}" 2>"$LOG" &
XPFD=$!
for _ in $(seq 100); do $CTL -s memory >/dev/null 2>&1 && break; sleep 0.1; done
check "xpfd starts with translation rules" $CTL -s memory
sleep 0.5

# Outbound: the server sees the firewall's address and a port of the range.
check "TCP out through nat-to: the server sees 10.0.2.1:50001-65535" \
    bash -c "r=\$(peer client tcp 10.0.2.2 7000) && echo \"\$r\" && [[ \$r == '10.0.2.1 '* ]] && in_range \"\$r\" 50001 65535"
check "UDP out through nat-to: the server sees 10.0.2.1" \
    bash -c "r=\$(peer client udp 10.0.2.2 7000) && echo \"\$r\" && [[ \$r == '10.0.2.1 '* ]]"
check "a 3,000-byte UDP datagram through nat-to and back: fragments translated both ways" bash -c "
    c python3 -c \"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(bytes(range(256)) * 11 + bytes(184), ('10.0.2.2', 7005))
d = s.recv(65535); print(len(d)); sys.exit(0 if len(d) == 3000 else 1)\" && cat $DIR/echo-peer && grep -qE '^10\.0\.2\.1 [0-9]+ 3000$' $DIR/echo-peer"
# pflow's NAT44 events as FreeBSD sends them, read by nfdump: the inside source, the
# translated one.
sleep 0.5
kill -TERM $NFCAPD; wait $NFCAPD 2>/dev/null
check "pflow: nfdump lists the NAT44 session events (the client as 10.0.2.1) of the flows through nat-to" bash -c "
    nfdump -R $DIR/flows -q -o nel 2>&1 | tee /dev/stderr > $DIR/nel.txt
    grep -qE 'TCP +10\.0\.1\.2:[0-9]+ +-> +10\.0\.2\.2:7000 +10\.0\.2\.1:[0-9]+ +-> +10\.0\.2\.2:7000' $DIR/nel.txt &&
    grep -qE 'UDP +10\.0\.1\.2:[0-9]+ +-> +10\.0\.2\.2:7000 +10\.0\.2\.1:[0-9]+ +-> +10\.0\.2\.2:7000' $DIR/nel.txt"
check "ping through nat-to" c ping -c 2 -W 2 -i 0.2 10.0.2.2
check "the server saw the echo requests from 10.0.2.1" bash -c "
    s timeout 5 tcpdump -n -i s0 -c 1 icmp[icmptype]==icmp-echo 2>/dev/null >$DIR/dump & sleep 1
    c ping -c 2 -W 2 -i 0.2 10.0.2.2 >/dev/null; wait; cat $DIR/dump; grep -q 'IP 10.0.2.1 > 10.0.2.2' $DIR/dump"
check "-s states shows the translation as pfctl does" \
    bash -c "$CTL -s states | tee /dev/stderr | grep -E 'all tcp 10\.0\.2\.1:[0-9]+ \(10\.0\.1\.2:[0-9]+\) -> 10\.0\.2\.2:7000'"
# Negative controls: the inside is not reachable from outside except by the forwarding, and
# untranslated inside addresses never leave.
check "outside cannot reach the inside host directly" refused peer server tcp 10.0.1.2 7000
check "no packet leaves with the inside address" bash -c "
    s timeout 4 tcpdump -n -i s0 -c 1 src net 10.0.1.0/24 2>/dev/null >$DIR/dump2 & sleep 1
    peer client tcp 10.0.2.2 7000 >/dev/null; peer client udp 10.0.2.2 7000 >/dev/null; wait; ! grep -q 'IP 10.0.1' $DIR/dump2"

# Protocols without ports: translated by their addresses alone; their replies to the
# firewall's own address go to xpfd, not to the host.
check "GRE through nat-to: echoed back to the client" test "$(c python3 scripts/raw.py send 47 1 10.0.1.2 10.0.2.2)" -eq 1
check "-s states shows it translated to 10.0.2.1, named gre as pfctl does" \
    bash -c "$CTL -s states | tee /dev/stderr | grep -E 'all gre 10\.0\.2\.1 \(10\.0\.1\.2\) -> 10\.0\.2\.2 '"
check "rdr-to: ESP to the firewall's address reaches the client and its echo comes back" \
    test "$(s python3 scripts/raw.py send 50 1 10.0.2.2 10.0.2.1)" -eq 1
check "ESP straight to the inside address is blocked (the client would echo it)" \
    test "$(s python3 scripts/raw.py send 50 1 10.0.2.2 10.0.1.2)" -eq 0

# Port forwarding to the inside.
check "rdr-to: the firewall's port 8022 reaches the client's 7000, which sees the server" \
    bash -c "r=\$(peer server tcp 10.0.2.1 8022) && echo \"\$r\" && [[ \$r == '10.0.2.2 '* ]]"
check "rdr-to does not open other ports of the firewall" refused peer server tcp 10.0.2.1 8023

# The firewall's own traffic to its translation address still works (given back to the
# kernel), and its rules still decide it.
check "the firewall answers a ping on its outside address" s ping -c 2 -W 2 -i 0.2 10.0.2.1
check "and a 3,000-byte one (its fragments reassembled by xpfd, given back to the host)" s ping -c 2 -W 2 -i 0.2 -s 3000 10.0.2.1
check "the firewall's own UDP port stays closed (blocked by its rules)" refused peer server udp 10.0.2.1 50100
if [[ ${IO:-} == packet ]]; then
    skb() { $CTL -s info --json | python3 -c "import json,sys; print(json.load(sys.stdin)['skb_fast_path']['$1'])"; }
    check "packet mode: the tcx program sent the replies to translation targets to xpfd ($(skb nat_local))" test "$(skb nat_local)" -gt 0
    check "packet mode: and let by what xpfd gave back to the host ($(skb given_back))" test "$(skb given_back)" -gt 0
fi

# ICMP errors come back translated into the inside host's view.
check "port unreachable through nat-to reaches the client as ECONNREFUSED" ip netns exec ${P}client python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.connect(('10.0.2.2', 7999)); s.send(b'x')
try:
    s.recv(10); raise SystemExit('an answer?')
except ConnectionRefusedError:
    pass"
check "traceroute through nat-to sees the router beyond and the far host" bash -c "
    c traceroute -n -q 1 -w 2 -m 4 10.0.3.2 | tee /dev/stderr | grep -q ' 10.0.2.2 ' && c traceroute -n -q 1 -w 2 -m 4 10.0.3.2 | grep -q ' 10.0.3.2 '"

# A pool drawn from a table, round-robin.
check "nat-to <pub> round-robin: two connections leave from the two addresses" bash -c "
    a=\$(peer client tcp 10.0.2.3 7000); b=\$(peer client tcp 10.0.2.3 7000); echo \"\$a / \$b\"
    [[ \${a%% *} != \${b%% *} ]] && [[ \${a%% *} == 10.0.2.5[01] ]] && [[ \${b%% *} == 10.0.2.5[01] ]]"

# Exhaustion: three ports for UDP to port 9999; the fourth and fifth flows are refused and
# counted, the daemon stays responsive.
check "three UDP flows get the three ports of a small range" bash -c "
    for sp in 41001 41002 41003; do r=\$(peer client udp 10.0.2.2 9999 \$sp) || exit 1; echo \"\$r\"; in_range \"\$r\" 50001 50003 || exit 1; done"
check "a fourth flow is refused (no port left)" refused peer client udp 10.0.2.2 9999 41004
check "xpfd logs the refusal at the pool's rule (FILE:LINE), once a minute" bash -c "
    n=\$(grep -n 'port 9999 nat-to' $DIR/pf.conf | cut -d: -f1)
    ! peer client udp 10.0.2.2 9999 41006 >/dev/null 2>&1
    sleep 1
    grep -E \"nat-to of $DIR/pf.conf:\$n: [0-9]+ new flows refused, no port left\" $LOG && [[ \$(grep -c 'new flows refused' $LOG) == 1 ]]"
check "-s info counts it under translate and 'no port left'" bash -c "
    $CTL -s info | tee /dev/stderr | grep -E '^  no port left +[1-9]' && $CTL -s info | grep -E '^  translate +[1-9]'"
check "xpfctl -s all answers while the pool is exhausted" $CTL -s all
# -F states gives every port back at once, each held for 120 s: with none fresh left in the
# range, a new flow gets one before its hold (counted) rather than being refused.
check "-F states gives every port back: none in use, a new flow gets one before its hold" bash -c "
    $CTL -F states >/dev/null && $CTL -s info | tee /dev/stderr | grep -E '^  source ports in use +0\$' &&
    r=\$(peer client udp 10.0.2.2 9999 41005) && echo \"\$r\" && in_range \"\$r\" 50001 50003 &&
    $CTL -s info | grep -E '^  ports before their hold +[1-9]'"

check "iperf3 TCP through nat-to (2 s)" bash -c "c iperf3 -c 10.0.2.2 -t 2 -J >$DIR/iperf.json; python3 -c \"
import json; d = json.load(open('$DIR/iperf.json')); b = d['end']['sum_received']['bits_per_second']; print(b); assert b > 1e6\""

# The fast path (on by default) translates established flows in the kernel: xpfd writes a
# translated flow's rewrite (addresses, ports, the checksums' differences) with its entries,
# and the program rewrites its packets both ways.
if [[ ${IO:-} != packet ]]; then
    # XDP mode: the kernel redirects XDP frames into a veth only when the veth's peer runs
    # NAPI (GRO on): a setting of the end hosts, which xpfd cannot reach from its namespace.
    # This section turns it on at the client and the server (off again after it) and gives
    # xpfd's probe of its egresses (every 10 s) the time to see it.
    c ethtool -K c0 gro on >/dev/null
    s ethtool -K s0 gro on >/dev/null
    for _ in $(seq 130); do
        grep -q 'fc: takes redirected frames' "$LOG" && grep -q 'fs: takes redirected frames' "$LOG" && break
        sleep 0.1
    done
fi
kern() { $CTL -s info | awk -F'  +' '/translated in the kernel/ {s += $NF} END {print s+0}'; }
t0=$(kern)
s timeout 25 tcpdump -n -i s0 -c 1 src net 10.0.1.0/24 2>/dev/null >$DIR/dump3 &
DUMP=$!
sleep 1
check "fast path: 300 MB by TCP through nat-to (iperf3 -n 300M), all of it received" bash -c "
    c timeout 30 iperf3 -c 10.0.2.2 -n 300M -J >$DIR/fast.json; python3 -c \"
import json; d = json.load(open('$DIR/fast.json')); r = d['end']['sum_received']['bytes']; print(r); assert r >= 300e6\""
c timeout 40 iperf3 -s -1 --bind 10.0.1.2 >/dev/null 2>&1 &
sleep 0.5
check "fast path: 300 MB by TCP through the port forwarding (rdr-to), all of it received" bash -c "
    s timeout 30 iperf3 -c 10.0.2.1 -n 300M -J >$DIR/fast-rdr.json; python3 -c \"
import json; d = json.load(open('$DIR/fast-rdr.json')); r = d['end']['sum_received']['bytes']; print(r); assert r >= 300e6\""
check "fast path: 2,000 UDP datagrams through nat-to and back, all intact" c python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.connect(('10.0.2.2', 7005))
for i in range(2000):
    d = bytes((i + j) % 251 for j in range(1 + i % 1400))
    s.send(d)
    assert s.recv(2048) == d, i"
check "fast path: ping through nat-to, 20 replies of 20" bash -c "
    c ping -c 20 -i 0.05 -W 2 10.0.2.2 | tee /dev/stderr | grep -q ' 20 received'"
kill $DUMP 2>/dev/null; wait $DUMP 2>/dev/null
check "fast path: no packet left with an inside address meanwhile (the control)" bash -c "cat $DIR/dump3; ! grep -q 'IP 10.0.1' $DIR/dump3"
t1=$(kern)
# At least the datagrams both ways after their flow's first two (a TCP segment of 64 KB that
# packet mode forwards whole counts once).
check "fast path: the kernel translated most of them ($((t1 - t0)) packets)" test $((t1 - t0)) -gt 3990
if [[ ${IO:-} == packet ]]; then
    check "fast path: no rewrite failed in the tcx program" test "$(skb rewrite_failed)" -eq 0
else
    c ethtool -K c0 gro off >/dev/null
    s ethtool -K s0 gro off >/dev/null
fi

# binat-to, both ways and both families (IPv6 as prefix translation), and hairpin: a member
# reaching the port forwarding by the public address.
cat > "$DIR/binat.conf" <<'CONF'
in_if = "fc"
out_if = "fs"
block all
pass quick inet6 proto icmp6 icmp6-type { neighbrsol, neighbradv }
pass in on $in_if
pass out on $out_if
pass out on $in_if
match on $out_if inet from 10.0.1.2 to any binat-to 10.0.2.60
pass in on $out_if inet proto tcp to 10.0.2.60 port 7000
match on $out_if inet6 from fd00:1::/64 to any binat-to fd00:2:0:1::/64
pass in on $out_if inet6 proto tcp to fd00:2:0:1::/64 port 7000
pass in on $in_if inet proto tcp from 10.0.1.0/24 to (fs:0) port 8022 rdr-to 10.0.1.2 port 7000
match out on $in_if inet proto tcp from 10.0.1.0/24 to 10.0.1.2 port 7000 received-on $in_if nat-to (fc:0)
CONF
check "-f a ruleset with binat-to" $CTL -f "$DIR/binat.conf"
check "binat-to out: the server sees 10.0.2.60 and the client's own port" \
    bash -c "r=\$(peer client tcp 10.0.2.2 7000 41555) && echo \"\$r\" && [[ \$r == '10.0.2.60 41555' ]]"
check "binat-to in: 10.0.2.60:7000 is the client's 7000" \
    bash -c "r=\$(peer server tcp 10.0.2.60 7000) && echo \"\$r\" && [[ \$r == '10.0.2.2 '* ]]"
check "binat-to in opens only what the rules pass" refused peer server tcp 10.0.2.60 7001
check "IPv6 binat-to out: the server sees the outside prefix" \
    bash -c "r=\$(peer client tcp fd00:2::2 7001) && echo \"\$r\" && [[ \$r == 'fd00:2:0:1::2 '* ]]"
check "IPv6 binat-to in: the outside prefix reaches the inside host" \
    bash -c "r=\$(peer server tcp fd00:2:0:1::2 7000) && echo \"\$r\" && [[ \$r == 'fd00:2::2 '* ]]"
check "hairpin: the client reaches the port forwarding by the public address" \
    bash -c "r=\$(peer client tcp 10.0.2.1 8022) && echo \"\$r\" && [[ \$r == '10.0.1.1 '* ]]"

# FreeBSD's dialect, as pfSense and OPNsense write it: translation rules first (the first
# that matches wins, `no nat` ends the search), then the filter rules, which see the packet
# translated; `rdr pass` skips them, a translation rule's tag reaches them.
cat > "$DIR/freebsd.conf" <<'CONF'
in_if = "fc"
out_if = "fs"
nat-anchor "natearly/*"
nat-anchor "natrules/*"
no nat on $out_if inet from 10.0.1.0/24 to 10.0.2.3
nat on $out_if inet proto udp from 10.0.1.0/24 to any port 9999 -> 10.0.2.50 map-e-portset 6/8/0x34
nat on $out_if inet from 10.0.1.0/24 to any -> 10.0.2.50 port 1024:65535
rdr-anchor "relayd/*"
rdr on $out_if inet proto tcp from any to 10.0.2.50 port 8022 tag FWD -> 10.0.1.2 port 7000
rdr pass on $out_if inet proto tcp from any to 10.0.2.51 port 8023 -> 10.0.1.2 port 7003
rdr on $out_if inet proto tcp from any to 10.0.2.51 port 8024 -> 10.0.1.2 port 7003
anchor "relayd/*"
block all
pass in on $in_if
pass out on $in_if
pass out on $out_if inet from 10.0.2.50 to any
pass in on $out_if inet proto tcp from any to 10.0.1.2 port 7000 tagged FWD
CONF
c python3 scripts/peer.py 10.0.1.2 7003 >/dev/null 2>&1 &
check "-f a FreeBSD ruleset (nat, no nat, rdr, rdr pass, anchors)" $CTL -f "$DIR/freebsd.conf"
check "-s nat prints the translation rules as pfctl does" bash -c "$CTL -s nat | tee /dev/stderr | grep -qxF \
    'nat on fs inet from 10.0.1.0/24 to any -> 10.0.2.50 port 1024:65535'"
check "nat on: the server sees 10.0.2.50:1024-65535 (the filter passed the translated source)" \
    bash -c "r=\$(peer client tcp 10.0.2.2 7000) && echo \"\$r\" && [[ \$r == '10.0.2.50 '* ]] && in_range \"\$r\" 1024 65535"
check "no nat: untranslated, the filter blocks it" refused peer client tcp 10.0.2.3 7000
# MAP-E (RFC 7597): the source ports of the set 6/8/0x34 only (252 of them; the next rule's
# range would give one of them by chance once in 256 flows).
check "map-e-portset 6/8/0x34: three UDP flows leave from ports of the set, printed as pfctl" bash -c "
    $CTL -s nat | grep -qF -- '-> 10.0.2.50 map-e-portset 6/8/52' || exit 1
    for sp in 41011 41012 41013; do r=\$(peer client udp 10.0.2.2 9999 \$sp) || exit 1; echo \"\$r\"; p=\${r#* }
        [[ \${r%% *} == 10.0.2.50 ]] && (( (p >> 10) != 0 && ((p >> 2) & 255) == 0x34 )) || exit 1; done"
check "rdr on ... tag: 10.0.2.50:8022 is the client's 7000, passed by 'tagged'" \
    bash -c "r=\$(peer server tcp 10.0.2.50 8022) && echo \"\$r\" && [[ \$r == '10.0.2.2 '* ]]"
check "the client's 7000 straight from outside has no tag: blocked" refused peer server tcp 10.0.1.2 7000
check "rdr pass: 10.0.2.51:8023 reaches the client's 7003, which no filter rule passes" \
    bash -c "r=\$(peer server tcp 10.0.2.51 8023) && echo \"\$r\" && [[ \$r == '10.0.2.2 '* ]]"
check "rdr without pass to the same 7003: the filter blocks it" refused peer server tcp 10.0.2.51 8024

# Endpoint-independent mapping (RFC 4787 REQ-1): one UDP socket, two servers, one public
# address and port; a socket the option does not cover gets a port per destination.
cat > "$DIR/ei.conf" <<'CONF'
table <pub> { 10.0.2.50 10.0.2.51 }
block all
pass in on fc
pass out on fc
pass out on fs
nat on fs inet proto udp from 10.0.1.0/24 port 41000:41999 to any -> 10.0.2.50 port 1024:65535 endpoint-independent
nat on fs inet proto tcp from 10.0.1.0/24 to 10.0.2.3 -> <pub> round-robin sticky-address
nat on fs inet from 10.0.1.0/24 to any -> 10.0.2.50 port 1024:65535
CONF
two_servers() {
    c python3 - "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.bind(("", int(sys.argv[1])))
seen = []
for dst in ("10.0.2.2", "10.0.2.3"):
    s.sendto(b"?", (dst, 7000))
    seen.append(s.recvfrom(100)[0].decode().strip())
print(" / ".join(seen))
sys.exit(0 if seen[0] == seen[1] else 1)
PY
}
export -f two_servers
check "-f a ruleset with endpoint-independent" $CTL -f "$DIR/ei.conf"
check "endpoint-independent: both servers see one address and port for one socket" two_servers 41005
check "without it, each server sees another port (the control)" refused two_servers 42005
check "-s info counts the reused mapping" bash -c "$CTL -s info | grep -E 'endpoint-independent reuses +[1-9]'"
# The same round-robin pool as above, sticky: the client keeps its first address.
check "round-robin sticky-address: three connections leave from one address" bash -c "
    a=\$(peer client tcp 10.0.2.3 7000); b=\$(peer client tcp 10.0.2.3 7000); c=\$(peer client tcp 10.0.2.3 7000)
    echo \"\$a / \$b / \$c\"; [[ \${a%% *} == 10.0.2.5[01] && \${a%% *} == \${b%% *} && \${b%% *} == \${c%% *} ]] ||
    { $CTL -s states | grep -F 10.0.2.3:7000 | tail -4
      $CTL -s info | grep -E 'state-mismatch|out of window|reused|translate|no port|collisions'; false; }"
# A sticky source is a source node, as in pf: listed with the address it keeps, killed by
# -K (a second -K names that address) and by -F Sources.
check "-s Sources: the sticky source, the address it keeps, its states (OpenBSD's pfctl line)" bash -c "
    $CTL -s Sources | tee /dev/stderr |
    grep -E '^10\.0\.1\.2 nat-to 10\.0\.2\.5[01] \( states [1-9][0-9]*, connections 0, rate 0\.0/0s \)\$'"
check "-K source -K another address leaves it; -K source -K its address kills it" bash -c "
    kept=\$($CTL -s Sources | sed -nE 's/^10\.0\.1\.2 nat-to (10\.0\.2\.5[01]) .*/\\1/p')
    other=10.0.2.5\$(( \${kept##*.} == 50 ? 1 : 0 )); echo \"kept \$kept, other \$other\"
    $CTL -K 10.0.1.2 -K \$other | tee /dev/stderr | grep -q 'killed 0 src nodes' &&
    $CTL -K 10.0.1.2 -K \$kept | tee /dev/stderr | grep -q 'killed 1 src nodes from 1 sources and 1 destinations' &&
    ! $CTL -s Sources | grep -q nat-to"
check "-F Sources clears a sticky source made again" bash -c "
    peer client tcp 10.0.2.3 7000 >/dev/null && $CTL -s Sources | grep -q '^10\.0\.1\.2 nat-to' &&
    $CTL -F Sources | grep -q 'source tracking entries cleared' && ! $CTL -s Sources | grep -q nat-to"

# A family-less nat-to on the outside interface translates both families (to fs's first
# address of each); the link's own messages (neighbour discovery, MLD, what comes from a
# link-local address or :: and goes to a link-scoped group) never leave the link and go as
# they are. A new address on fs makes the firewall's kernel send its MLD report and its
# duplicate address detection from :: out through the rule.
cat > "$DIR/link.conf" <<'CONF'
block all
match out on fs nat-to (fs:0)
pass out
pass in on fc
pass in on fs inet6 proto icmp6
CONF
check "-f a family-less nat-to on fs" $CTL -f "$DIR/link.conf"
check "family-less nat-to: IPv6 leaves as fd00:2::1" \
    bash -c "r=\$(peer client tcp fd00:2::2 7001) && echo \"\$r\" && [[ \$r == 'fd00:2::1 '* ]]"
check "family-less nat-to: the firewall's neighbour discovery and MLD on fs leave untranslated, none refused" bash -c "
    t0=\$($CTL -s info | awk '\$1 == \"translate\" {print \$2}')
    ip -n ${P}fw -6 neigh flush dev fs; ip -n ${P}server -6 neigh flush dev s0
    ip -n ${P}fw addr add fd00:2::99/64 dev fs
    for _ in \$(seq 30); do ip -n ${P}fw -6 addr show dev fs | grep 'fd00:2::99' | grep -q tentative || break; sleep 0.2; done
    s ping -6 -c 2 -W 2 -i 0.2 fd00:2::99 >/dev/null && s ping -6 -c 2 -W 2 -i 0.2 fd00:2::1 >/dev/null || exit 1
    $CTL -s states | grep -E 'ipv6-icmp .*\[(13[3-6]|143)\]' | tee $DIR/link-states
    grep -q '^all ipv6-icmp :: *\[[0-9]*\] -> ' $DIR/link-states && grep -q '\[143\]' $DIR/link-states &&
    ! grep -q '(' $DIR/link-states && [[ \$($CTL -s info | awk '\$1 == \"translate\" {print \$2}') == \$t0 ]]"
check "family-less nat-to: TCP from the outside to the inside host stays blocked" refused peer server tcp fd00:1::2 7000

# Refused where it cannot be kept.
printf 'pass out on fs nat-to 10.0.2.1 - 10.0.2.5\n' > "$DIR/range.conf"
check "a translation target xpf does not enforce (an address range) is refused with FILE:LINE" \
    bash -c "! $CTL -f $DIR/range.conf 2>$DIR/err; cat $DIR/err; grep -q 'range.conf:1:' $DIR/err"

[[ $fail -gt 0 ]] && sed "s/^/     xpfd: /" "$LOG" | tail -20
echo "nat: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
