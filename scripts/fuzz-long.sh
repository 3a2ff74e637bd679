#!/usr/bin/env bash
# The fuzz campaign: each target RUNS executions (libFuzzer -runs) from its corpus in
# fuzz/corpus/TARGET (kept in the repository), then the corpus minimized (-merge=1) so that
# only inputs adding coverage stay. Prints per target: executions, coverage (edges), features,
# corpus size, and whether it crashed (the artifact is in fuzz/artifacts/TARGET).
# usage: fuzz-long.sh RUNS TARGET...   (FUZZ_MAX_SECONDS=N also stops each target after N s)
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
runs=${1:?runs}; shift
rc=0
for t in "$@"; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -runs="$runs" ${FUZZ_MAX_SECONDS:+-max_total_time=$FUZZ_MAX_SECONDS} -print_final_stats=1 >"$log" 2>&1
    r=$?
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    secs=$(grep -E '^stat::' "$log" >/dev/null && grep -oE 'DONE|Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)
    # Minimize: merge the corpus into a fresh directory, keep that.
    mkdir -p "corpus/$t.min"
    RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t.min" "corpus/$t" -- -merge=1 >/dev/null 2>&1 && { rm -rf "corpus/$t"; mv "corpus/$t.min" "corpus/$t"; } || rm -rf "corpus/$t.min"
    n=$(ls "corpus/$t" | wc -l)
    if [[ $r -ne 0 ]]; then
        echo "fuzz $t: CRASHED after ${execs:-?} executions (coverage ${cov:-?}); see fuzz/artifacts/$t"
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5
        rc=1
    else
        echo "fuzz $t: ${execs:-?} executions, coverage ${cov:-?} edges, ${ft:-?} features, corpus $n inputs, no crash ${secs}"
    fi
    rm -f "$log"
done
exit $rc
