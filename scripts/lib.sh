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

# Stops xpfd ($XPFD) and everything running in the namespaces, removes them, $DIR and $SOCK;
# installed for EXIT and the usual signals.
lab_down() {
    [[ -n ${XPFD:-} ]] && kill "$XPFD" 2>/dev/null && wait "$XPFD" 2>/dev/null
    local n
    for n in client server far fw; do ip netns pids "${P}$n" 2>/dev/null | xargs -r kill 2>/dev/null; done
    scripts/topo.sh down "$P"
    rm -rf "$DIR" "$SOCK"
}
trap lab_down EXIT INT TERM
