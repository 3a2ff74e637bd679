#!/usr/bin/env bash
# Runs the whole test suite and closes with one tally over every test binary, so that the last
# line says how many tests ran in all (cargo's own last line is that of its last binary).
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --release --workspace --lib --bins --tests "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } } END { print p+0, f+0 }' "$log")
echo
echo "tests: $passed passed, $failed failed"
if [[ $rc -ne 0 ]]; then
    exit "$rc"
fi
# The fuzz targets live outside the workspace (cargo-fuzz builds them with sanitizers): they
# must still compile against the crates as they are now, or `make fuzz` breaks unseen.
if ! (cd "$(dirname "$0")/../fuzz" && cargo check --quiet --bins); then
    echo "the fuzz targets do not compile against the current crates" >&2
    exit 1
fi
echo "fuzz targets: compile"

if [[ $passed -eq 0 ]]; then
    echo "no test ran" >&2
    exit 1
fi
