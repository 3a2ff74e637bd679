# The checks' tally, shared by the scenario scripts: source it after setting DIR (a scratch
# directory). `check NAME CMD...` prints ok or FAIL (with the command's last output lines) and
# counts; `refused CMD...` succeeds when CMD fails (a negative control).
pass=0; fail=0
check() {
    local name=$1; shift
    if "$@" >"$DIR/out" 2>&1; then echo "ok   $name"; pass=$((pass + 1));
    else echo "FAIL $name"; sed 's/^/     /' "$DIR/out" | tail -15; fail=$((fail + 1)); fi
}
refused() { ! "$@"; }
