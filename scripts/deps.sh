#!/usr/bin/env bash
# Installs what the build, the tests and the benches need and the machine lacks.
# Debian's packages through apt-get (as root); everything else comes with cargo.
set -euo pipefail

need=()
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox)   # the benches' PNG plots
command -v cc >/dev/null 2>&1 || need+=(gcc)                # libfuzzer-sys, cc-using crates
command -v ip >/dev/null 2>&1 || need+=(iproute2)           # the pf.conf conformance test's network namespace

if ! command -v cargo >/dev/null 2>&1; then
    echo "deps: cargo is not installed; xpf needs Rust 1.95 (rustup)" >&2
    exit 1
fi

if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
        exit 1
    fi
    echo "deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
