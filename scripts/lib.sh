# Shared by the scripts that run xpfd in topo.sh's namespaces (synflood.sh,
# workers.sh): source it after setting P (the namespaces' prefix), SOCK and DIR.

# needs NAME TOOL...: root and every tool, or exit naming what is missing.
needs() {
    local name=$1 t
    shift
    [[ $(id -u) -eq 0 ]] || { echo "$name: needs root"; exit 1; }
    for t in "$@"; do
        command -v "$t" >/dev/null || { echo "$name: '$t' is missing (scripts/deps.sh installs it)"; exit 1; }
    done
}

# Stops what runs in the namespaces (iperf3 daemons among them: a namespace deleted under a
# daemon leaves it running, out of reach).
ns_stop() {
    local n
    for n in client server far fw; do ip netns pids "${P}$n" 2>/dev/null | xargs -r kill 2>/dev/null; done
}

# Stops xpfd ($XPFD) and everything running in the namespaces, removes them, $DIR and $SOCK;
# installed for EXIT and the usual signals.
lab_down() {
    # A daemon that does not stop within 10 s is killed (and the run fails on the checks
    # that saw it hang, not here).
    if [[ -n ${XPFD:-} ]] && kill "$XPFD" 2>/dev/null; then
        for _ in $(seq 100); do kill -0 "$XPFD" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$XPFD" 2>/dev/null
        wait "$XPFD" 2>/dev/null
    fi
    ns_stop
    scripts/topo.sh down "$P"
    [[ -n ${KEEP:-} ]] || rm -rf "$DIR" "$SOCK"
}
trap lab_down EXIT INT TERM
