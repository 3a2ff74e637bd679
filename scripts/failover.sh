#!/usr/bin/env bash
# The failover scenario: a firewall pair in network namespaces, the virtual addresses moved by
# keepalived (VRRP), states synced by xpfd in pfsync's format (defer mode on). Long TCP transfers run through
# the primary; its xpfd is killed (kill -9); keepalived sees it gone and moves the addresses;
# the standby, which already holds the states (sequence windows included), carries the flows.
#
#   client 10.0.1.2 --[lan bridge]-- fwa lan 10.0.1.11 / fwb lan 10.0.1.12, VIP 10.0.1.1
#   server 10.0.2.2 --[wan bridge]-- fwa wan 10.0.2.11 / fwb wan 10.0.2.12, VIP 10.0.2.1
#   fwa sync 10.0.9.1 ---- fwb sync 10.0.9.2   (pfsync: IP protocol 240, TTL 255)
#
# usage: failover.sh [FLOWS] [SECONDS] [--key]     prints flows carried over and lost
# WORKERS=N: each firewall's legs get N queues and its xpfd N workers (a synced state goes to
# the worker that owns its flow); after the failover, `-k` on the standby must leave the sync
# thread's map of where the old primary's states were placed with them.
# NAT=1: the client's network goes out as the virtual address (`nat-to 10.0.2.1`): the
# standby must carry the translated flows with the same address and ports, its translation
# holding those ports.
# IDLE=N: before the live flows, N idle states on the primary (half-open TCP from a SYN
# flood out of the client's namespace, `xpf-bench flood`), which the standby takes by bulk
# update before the kill, beside the live flows (conntrackd's standby must first commit such
# a cache into the kernel).
# FLUSH=1: no kill; `xpfctl -F states` on the primary instead, with the standby holding the
# flows' states: the primary sends one pfsync clear of the states it created (as pf's
# `pfctl -F states`), not a delete per state, and the standby drops them. The flows die with
# their states (their next segments match no `flags S/SA` rule); the run ends there.
# xpfd runs in XDP mode (--io xdp); IO=packet: in packet mode.
# FASTPATH=1: the flows go on xpfd's fast path (on by default, used towards the interfaces
# that take redirected frames): their segments are forwarded and window-checked by the
# steering program, and a segment comes to xpfd whenever a sync update is due. A veth takes
# redirected frames only when its peer runs NAPI (GRO on): the switches' ports get GRO on (a
# setting of the hosts at the other end; a real switch has none to make). Without it, xpfd
# finds the legs unable and every packet goes through the workers.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOWS=${1:-8}; SECS=${2:-14}; KEY=${3:-}
W=${WORKERS:-1}
FAST=()
[[ ${FASTPATH:-0} == 1 ]] && FAST=(--fastpath 65536)
P=xf-
BIN=${BIN:-$PWD/target/release}
DIR=$(mktemp -d /tmp/xpf-failover.XXXXXX)
PY=/usr/bin/python3
# Every tool this calls (scripts/deps.sh installs them): missing one fails here, by name.
for t in ip keepalived tcpdump bc ethtool; do
    command -v $t >/dev/null || { echo "failover: '$t' is missing (scripts/deps.sh installs it)"; exit 1; }
done

cleanup() {
    for f in "$DIR"/*.pid; do [[ -f $f ]] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    for n in client server lan wan fwa fwb; do ip netns del "${P}$n" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup

for n in client server lan wan fwa fwb; do ip netns add "${P}$n"; ip -n "${P}$n" link set lo up; done
for sw in lan wan; do
    ip -n "${P}$sw" link add br0 type bridge
    ip -n "${P}$sw" link set br0 up
done
# veth: $1 netns, $2 name in it, $3 switch, $4 port name on the switch
plug() {
    local q=1
    [[ $1 == fw* ]] && q=$W
    ip link add "${P}t$4" numtxqueues $q numrxqueues $q type veth peer name "${P}u$4" numtxqueues $q numrxqueues $q
    ip link set "${P}t$4" netns "${P}$1" name "$2"
    ip link set "${P}u$4" netns "${P}$3" name "$4"
    ip -n "${P}$3" link set "$4" master br0 up
    ip -n "${P}$1" link set "$2" up
    if [[ ${#FAST[@]} -gt 0 && $1 == fw* ]]; then ip netns exec "${P}$3" ethtool -K "$4" gro on >/dev/null; fi
}
plug client c0 lan p1
plug fwa lan lan p2
plug fwb lan lan p3
plug server s0 wan p1
plug fwa wan wan p2
plug fwb wan wan p3
ip link add "${P}ya" type veth peer name "${P}yb"
ip link set "${P}ya" netns "${P}fwa" name sync
ip link set "${P}yb" netns "${P}fwb" name sync
ip -n "${P}fwa" link set sync up
ip -n "${P}fwb" link set sync up
ip -n "${P}client" addr add 10.0.1.2/24 dev c0
ip -n "${P}server" addr add 10.0.2.2/24 dev s0
ip -n "${P}fwa" addr add 10.0.1.11/24 dev lan
ip -n "${P}fwa" addr add 10.0.2.11/24 dev wan
ip -n "${P}fwa" addr add 10.0.9.1/24 dev sync
ip -n "${P}fwb" addr add 10.0.1.12/24 dev lan
ip -n "${P}fwb" addr add 10.0.2.12/24 dev wan
ip -n "${P}fwb" addr add 10.0.9.2/24 dev sync
ip -n "${P}client" route add default via 10.0.1.1
ip -n "${P}server" route add default via 10.0.2.1
for f in fwa fwb; do ip netns exec "${P}$f" sysctl -qw net.ipv4.ip_forward=1; done

IDLE=${IDLE:-0}
if [[ $IDLE -gt 0 ]]; then
    # Room for them without adaptive timeouts (which start at 60% of the limit).
    echo "set limit states $((IDLE * 2 + 100000))" >"$DIR/pf.conf"
fi
cat >>"$DIR/pf.conf" <<'EOF'
set skip on lo
block drop all
pass in on lan proto tcp from 10.0.1.0/24 to 10.0.2.2 port 7000 flags S/SA keep state
pass out on wan proto tcp to 10.0.2.2 port 7000 keep state
pass proto icmp
# VRRP between the firewalls: their own traffic goes through the rules too (pf's `pass proto carp`).
pass proto 112
EOF
if [[ ${NAT:-0} == 1 ]]; then
    echo "match out on wan inet from 10.0.1.0/24 nat-to 10.0.2.1" >>"$DIR/pf.conf"
fi
if [[ $IDLE -gt 0 ]]; then
    # The flood's SYNs make one state each (in on lan) and go no further.
    echo "pass in on lan inet proto tcp from 198.18.0.0/15 to 10.0.2.99 port 9 flags S/SA keep state" >>"$DIR/pf.conf"
fi
KEYARG=()
if [[ $KEY == --key ]]; then
    head -c 32 /dev/urandom | base64 >"$DIR/sync.key"
    KEYARG=(--sync-key "$DIR/sync.key")
fi
start_fw() { # $1 netns, $2 peer
    ip netns exec "${P}$1" "$BIN/xpfd" -f "$DIR/pf.conf" -i lan -i wan --socket "$DIR/$1.sock" \
        --workers "$W" --io "${IO:-xdp}" --sync-dev sync --sync-peer "$2" --sync-defer "${KEYARG[@]}" "${FAST[@]}" 2>"$DIR/$1.log" &
    echo $! >"$DIR/$1-xpfd.pid"
}
wait_sock() {
    for _ in $(seq 50); do [[ -S $DIR/$1.sock ]] && break; sleep 0.1; done
    [[ -S $DIR/$1.sock ]] || { cat "$DIR/$1.log"; echo "failover: xpfd on $1 did not start"; exit 1; }
}

# keepalived: VRRPv3 every 200 ms, both addresses in one sync group, the firewall's xpfd
# tracked (a firewall whose filter died must give the addresses up). No periodic gratuitous
# ARP (`vrrp_garp_master_refresh`): a primary whose xpfd has died stays master until its
# track script next runs (up to a second), and a refresh sent in that second, after the
# standby's takeover, pointed the hosts back at the dead firewall until the standby's own
# next refresh; TCP's retransmission backoff made that a 3.2 s pause instead of 0.7.
keepalived_conf() { # $1 fw, $2 priority
    local pid; pid=$(cat "$DIR/$1-xpfd.pid")
    cat <<EOF
global_defs {
    router_id $1
    enable_script_security
    script_user root
}
vrrp_script xpfd {
    script "/bin/kill -0 $pid"
    interval 1
    fall 1
    rise 1
}
vrrp_sync_group pair {
    group { lan wan }
}
vrrp_instance lan {
    state BACKUP
    interface lan
    virtual_router_id 51
    version 3
    priority $2
    advert_int 0.2
    virtual_ipaddress { 10.0.1.1/24 }
    track_script { xpfd }
}
vrrp_instance wan {
    state BACKUP
    interface wan
    virtual_router_id 52
    version 3
    priority $2
    advert_int 0.2
    virtual_ipaddress { 10.0.2.1/24 }
    track_script { xpfd }
}
EOF
}
start_keepalived() { # $1 fw, $2 priority
    keepalived_conf "$1" "$2" >"$DIR/$1-keepalived.conf"
    ip netns exec "${P}$1" keepalived --vrrp --dont-fork --log-console -f "$DIR/$1-keepalived.conf" \
        -p "$DIR/$1-ka-main.pid" -r "$DIR/$1-ka-vrrp.pid" >"$DIR/$1-keepalived.log" 2>&1 &
    echo $! >"$DIR/$1-keepalived.pid"
}
has_vip() { ip -n "${P}$1" -4 addr show dev lan | grep -q 10.0.1.1/ && ip -n "${P}$1" -4 addr show dev wan | grep -q 10.0.2.1/; }

# The primary first, alone; the flows start through it.
start_fw fwa 10.0.9.2
wait_sock fwa
start_keepalived fwa 150
for _ in $(seq 100); do has_vip fwa && break; sleep 0.1; done
has_vip fwa || { cat "$DIR/fwa-keepalived.log"; echo "failover: keepalived did not make fwa master"; exit 1; }
states_of() { XPFD_SOCKET=$DIR/$1.sock "$BIN/xpfctl" -s info | awk '/current entries/ {print $3; exit}'; }
# A row of -s info's sync section, summed over its lines.
sync_count() { XPFD_SOCKET=$DIR/$1.sock "$BIN/xpfctl" -s info | awk -F'  +' -v k="$2" '$2 == k {s += $NF} END {print s+0}'; }
if [[ $IDLE -gt 0 ]]; then
    mac=$(ip -n "${P}fwa" link show lan | awk '/link\/ether/ {print $2}')
    # The generator transmits from an XDP program (test-run frames): a veth passes such frames
    # on only to a peer that runs NAPI. GRO on the client's switch port, the generator's
    # harness (as xpf-bench lab does on its generator's link), not the firewalls'.
    ip netns exec "${P}lan" ethtool -K p1 gro on >/dev/null
    "$BIN/xpf-bench" flood --seconds 60 "${P}client" c0 "$mac" 10.0.2.99 9 >"$DIR/flood.out" 2>&1 &
    FLOOD=$!
    echo $FLOOD >"$DIR/flood.pid"
    t0=$(date +%s.%N)
    for _ in $(seq 600); do [[ $(states_of fwa) -ge $IDLE ]] && break; sleep 0.1; done
    kill "$FLOOD" 2>/dev/null; wait "$FLOOD" 2>/dev/null || true
    n=$(states_of fwa)
    printf 'failover: fwa holds %s idle states (a SYN flood for %.1f s)\n' "$n" "$(echo "$(date +%s.%N) - $t0" | bc -l)"
    [[ $n -ge $IDLE ]] || { echo "failover: FAILED: fwa made $n states, not $IDLE"; exit 1; }
fi
ip netns exec "${P}server" $PY scripts/flows.py server 7000 1000000 &
echo $! >"$DIR/server.pid"
sleep 0.5
ip netns exec "${P}client" $PY scripts/flows.py client 10.0.2.2 7000 "$FLOWS" "$SECS" >"$DIR/flows.out" 2>&1 &
CLIENT=$!
sleep 1.5
established() { ip netns exec "${P}server" ss -Htn state established '( sport = :7000 )' | wc -l; }
t0=$(date +%s.%N)
for _ in $(seq 100); do [[ $(established) -ge $FLOWS ]] && break; sleep 0.1; done
printf 'failover: %s of %s flows established %.1f s after the client started\n' "$(established)" "$FLOWS" "$(echo "$(date +%s.%N) - $t0 + 1.5" | bc -l)"
# The standby joins while the flows run: it gets their states by a bulk update, then follows.
start_fw fwb 10.0.9.1
wait_sock fwb
start_keepalived fwb 100
echo "failover: fwa holds the virtual addresses; fwb joined as standby (sync on 10.0.9.0/24${KEY:+, authenticated})"
if [[ $IDLE -gt 0 ]]; then
    t0=$(date +%s.%N)
    for _ in $(seq 600); do [[ $(states_of fwb) -ge $IDLE ]] && break; sleep 0.1; done
    n=$(states_of fwb)
    printf 'failover: fwb took %s states by bulk update in %.1f s\n' "$n" "$(echo "$(date +%s.%N) - $t0" | bc -l)"
    [[ $n -ge $IDLE ]] || { tail -5 "$DIR/fwb.log"; echo "failover: FAILED: the standby holds $n states, not $IDLE"; exit 1; }
fi
# A capture of the sync link, decoded (tcpdump cannot): frames, none bad.
ip netns exec "${P}fwb" timeout 2 tcpdump -q -U -i sync -w "$DIR/sync.pcap" ip proto 240 2>/dev/null || true
sleep 2
grep -E "bulk update" "$DIR/fwb.log" | sed 's/^/  fwb: /' || true
"$BIN/xpfctl" sync-decode "$DIR/sync.pcap" >"$DIR/decode.txt"
head -4 "$DIR/decode.txt" | cut -c1-160
tail -1 "$DIR/decode.txt"
if ! tail -1 "$DIR/decode.txt" | grep -qE '^[1-9][0-9]* pfsync frame\(s\), 0 bad'; then
    echo "failover: FAILED: no pfsync frames decoded from the sync link"; exit 1
fi
# Defer mode: a new state's first packet (here a ping's) waits for the standby's insert ack.
for _ in 1 2 3; do # three pings, three new states
    ip netns exec "${P}client" ping -c 1 -W 1 10.0.2.2 >/dev/null || { echo "failover: FAILED: ping through fwa"; exit 1; }
done
sleep 1.2 # the counters are published once a second
echo "failover: the primary sent:"
XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -s info | grep -E "frames sent|events lost|send errors|requests answered|insert acks|deferred" || true
if ! XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -s info | grep -qE "released: [1-9][0-9]* acknowledged"; then
    XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s info | sed -n '/^Sync/,$p'
    XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -s states -v | grep -A2 -i icmp
    echo "failover: FAILED: no packet was released by the standby's insert ack (defer mode)"; exit 1
fi
echo "failover: before the kill, the standby holds:"
XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s info | grep -E "Sync|states from peers|states inserted|states updated|bulk update|bad: authentication" || true
fwb_states=$(XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s states | grep -c ':7000' || true)
echo "failover: fwb has $fwb_states states for port 7000 ($FLOWS flows, two states each: in on lan, out on wan)"
if [[ ${FLUSH:-0} == 1 ]]; then
    c0=$(sync_count fwb "states cleared"); d0=$(sync_count fwb "states deleted")
    XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -F states
    sleep 1.5 # the standby's counters are published once a second
    c1=$(sync_count fwb "states cleared"); d1=$(sync_count fwb "states deleted")
    left=$(XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s states | grep -c ':7000' || true)
    kill "$CLIENT" 2>/dev/null || true
    echo "failover: -F states on fwa: fwb cleared $((c1 - c0)) states by the primary's clear, deleted $((d1 - d0)) one by one; $left of its $fwb_states states for port 7000 left"
    if [[ $fwb_states -lt $FLOWS || $left -ne 0 || $((c1 - c0)) -lt $fwb_states ]]; then
        echo "failover: FAILED: the standby did not drop the flushed states by one clear"; exit 1
    fi
    echo "failover: passed"
    trap - EXIT
    disown -a # the daemons are killed next, as at the end below; no job notices
    cleanup
    rm -rf "$DIR"
    exit 0
fi
if [[ ${#FAST[@]} -gt 0 ]]; then
    kern=$(XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -s info | awk -F'  +' '/forwarded in the kernel/ {s += $NF} END {print s+0}')
    XPFD_SOCKET=$DIR/fwa.sock "$BIN/xpfctl" -s info | grep -E "fast-path (TCP flows|TCP judged)" | sed 's/^/  fwa: /'
    echo "failover: fwa's steering program forwarded $kern packets (fast path)"
    [[ $kern -gt 1000 ]] || { echo "failover: FAILED: the fast path forwarded nothing"; exit 1; }
fi
if [[ ${NAT:-0} == 1 ]]; then
    peers=$(ip netns exec "${P}server" ss -Htn state established '( sport = :7000 )' | awk '{print $4}' | sort -u)
    echo "failover: the server's peers: $(echo $peers | tr '\n' ' ')"
    if [[ -z $peers ]] || echo "$peers" | grep -qv '^10\.0\.2\.1:'; then
        ip netns exec "${P}server" ss -tn | head -20
        echo "failover: FAILED: the server sees addresses other than the translation's"; exit 1
    fi
    xlat=$(XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s states | grep -c '10\.0\.2\.1:[0-9]* (10\.0\.1\.2:' || true)
    echo "failover: fwb holds $xlat translated states"
    [[ $xlat -ge $FLOWS ]] || { echo "failover: FAILED: the standby lacks the translated states"; exit 1; }
    # The standby's translation holds the ports those states use: taking over, it hands
    # none of them to a new flow and gives each back when its state ends.
    held=$(sync_count fwb "source ports in use")
    echo "failover: fwb's translation holds $held source ports of the synced flows"
    [[ $held -ge $FLOWS ]] || { echo "failover: FAILED: the standby's allocator knows $held of the $FLOWS synced flows' ports"; exit 1; }
fi
# The standby must have stayed standby: a pair whose standby took the addresses while the
# primary lived (its adverts held up on the way, in the primary's host path or the
# standby's) forwarded through both, and the states diverged.
if grep -q "Entering MASTER" "$DIR/fwb-keepalived.log"; then
    grep -E "MASTER|BACKUP" "$DIR/fwb-keepalived.log" | sed 's/^/  fwb: /'
    echo "failover: FAILED: fwb took the addresses before the kill (the primary's adverts did not reach it)"; exit 1
fi
echo "failover: fwb stayed the standby until the kill (keepalived: no MASTER state)"
echo "failover: kill -9 xpfd on fwa (the primary)"
t0=$(date +%s.%N)
kill -9 "$(cat "$DIR/fwa-xpfd.pid")"
# Reaped at once, as a service manager would: a zombie still answers keepalived's `kill -0`,
# and the primary would go on holding the addresses (its ARP answers too) while its adverts
# die in the queue of the xpfd that is gone.
wait "$(cat "$DIR/fwa-xpfd.pid")" 2>/dev/null || true
for _ in $(seq 100); do has_vip fwb && break; sleep 0.05; done
t1=$(date +%s.%N)
has_vip fwb || { cat "$DIR/fwb-keepalived.log"; echo "failover: fwb never took the addresses"; exit 1; }
printf 'failover: fwb took the virtual addresses %.2f s after the kill\n' "$(echo "$t1 - $t0" | bc -l 2>/dev/null || echo 0)"
rc=0
wait $CLIENT || rc=$?
cat "$DIR/flows.out"
echo "failover: the standby after the failover:"
XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s info | grep -E "state-mismatch|states from peers|stale|unknown" || true
if [[ $IDLE -gt 0 ]]; then
    n=$(states_of fwb)
    echo "failover: fwb holds $n states after the failover"
    [[ $n -ge $IDLE ]] || { echo "failover: FAILED: the idle states did not survive the failover"; rc=1; }
fi
if [[ $W -gt 1 && $rc -eq 0 ]]; then
    # The sync thread knows which worker holds each of the old primary's states; states the
    # workers remove themselves (here `-k`, as expiry does) must leave that map with them.
    p0=$(sync_count fwb "peer states placed"); i0=$(sync_count fwb "states from peers")
    XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -k 10.0.1.2 >/dev/null
    # The deletes go out within a second (sync's flush), the counters are published once a
    # second: up to 5 s for both to move.
    for _ in $(seq 20); do
        sleep 0.25
        p1=$(sync_count fwb "peer states placed"); i1=$(sync_count fwb "states from peers")
        [[ $i1 -lt $i0 && $((p1 - i1)) -le $((p0 - i0)) ]] && break
    done
    echo "failover: -k 10.0.1.2 on fwb: the old primary's states held $i0 -> $i1, placed by the sync thread $p0 -> $p1"
    if [[ $i1 -ge $i0 || $((p1 - i1)) -gt $((p0 - i0)) ]]; then
        XPFD_SOCKET=$DIR/fwb.sock "$BIN/xpfctl" -s info | sed -n '/^Sync/,/bulk update sent/p'
        echo "failover: FAILED: the sync thread kept the placement of states the workers removed"; rc=1
    fi
fi
if [[ $rc -ne 0 ]]; then
    echo "failover: FAILED; logs in $DIR"
    tail -5 "$DIR/fwb.log"
    trap - EXIT
    cleanup
    exit 1
fi
echo "failover: passed"
trap - EXIT
cleanup
rm -rf "$DIR"
