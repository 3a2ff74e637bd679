# xpf: `make demo` runs the main job, `make test` runs every test. Both install what is missing.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release

.PHONY: all deps build demo test failover lab bench-real bench-synflood bench-shaper bench bench-states bench-hashsize bench-insert bench-resize bench-rules bench-reload bench-nat bench-workers fuzz fuzz-long fmt clean

all: build

deps:
	@scripts/deps.sh

build: deps
	$(CARGO) build --release --workspace

# The main job: xpfd filtering real traffic between network namespaces (scripts/demo.sh).
demo: build
	scripts/demo.sh

# The quick benches run first so that they print their figures on every CI run (they assert
# nothing about speed); the test suite runs last.
test: build
	$(BIN)/xpf-bench states --quick --json
	$(BIN)/xpf-bench hashsize --quick
	$(BIN)/xpf-bench insert --quick
	$(BIN)/xpf-bench rules --quick
	$(CARGO) test --release -p xpf-conf --test pfctl_regress -- --nocapture --exact pfctl_regress_tally 2>&1 | grep -E '^(pf|pfail|selfpf)[: ]'
	scripts/test.sh
	scripts/scenario.sh
	IO=packet scripts/scenario.sh
	scripts/nat.sh
	IO=packet scripts/nat.sh
	scripts/observe.sh
	IO=packet scripts/observe.sh
	scripts/shaper.sh
	IO=packet scripts/shaper.sh
	scripts/workers.sh
	FASTPATH=1 scripts/workers.sh
	IO=packet scripts/workers.sh
	scripts/failover.sh 8 14 --key
	WORKERS=2 scripts/failover.sh 8 14 --key
	FASTPATH=1 scripts/failover.sh 8 14 --key
	WORKERS=2 NAT=1 scripts/failover.sh 8 14 --key
	IO=packet scripts/failover.sh 8 14 --key
	IDLE=1000000 NAT=1 scripts/failover.sh 8 30 --key
	FLUSH=1 scripts/failover.sh 8 14 --key
	$(BIN)/xpf-bench lab --quick

# The firewall pair: keepalived moves the addresses, the standby carries the flows (~30 s;
# also run by `make test`).
failover: build
	scripts/failover.sh 8 14 --key

# A spoofed SYN flood at the generator's full rate while 100 TCP flows run: xpfd (synproxy,
# syncookies adaptive) against the kernel (conntrack, nftables synproxy), in one run (~3 min).
bench-synflood: build
	scripts/synflood.sh

# The full experiments (several minutes each); figures go to bench-results/out/.
bench: bench-states bench-hashsize bench-insert bench-resize bench-rules bench-nat bench-workers

bench-states: build
	$(BIN)/xpf-bench states

bench-hashsize: build
	$(BIN)/xpf-bench hashsize

bench-insert: build
	$(BIN)/xpf-bench insert

bench-resize: build
	$(BIN)/xpf-bench resize

# Translation in the engine: established and new flows with and without nat-to, at 10K, 1M
# and 10M states; the port allocator's cost by occupancy.
bench-nat: build
	$(BIN)/xpf-bench nat

bench-rules: build
	$(BIN)/xpf-bench rules

# Reloads under load: the 1.6M-rule campus loaded again and a member's anchor replaced while
# iperf3 and ping run through xpfd; table deltas of 100,000 and a million entries.
bench-reload: build
	bash scripts/reload-lab.sh

# The shaper lab: 24,000 member queues under one root, xpfd against tc HTB in the same run:
# throughput at saturation, each member's rate, an idle member's ping, CPU per Gbit/s (~10 min).
bench-shaper: build
	$(BIN)/xpf-bench lab --shaper 24000 --runs 2 --seconds 30
	$(BIN)/xpf-bench shaper --runs 5

bench-workers: build
	$(BIN)/xpf-bench states --workers 2 --points 9800,1M,10M --out bench-results/out/states-2w-shard
	$(BIN)/xpf-bench states --workers 2 --mode shared --points 9800,1M,10M --no-baseline --out bench-results/out/states-2w-shared

# libFuzzer on the packet path, synproxy handshakes, the pcap reader, the pf.conf parser and received sync frames, FUZZ_SECONDS each (default 60).
FUZZ_SECONDS ?= 60
fuzz: deps
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for t in packet synproxy pcap pfconf sync; do RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; done

# The campaign: each target FUZZ_RUNS executions (default 10M) from its corpus in fuzz/corpus/,
# which is kept in the repository and minimized after the run (scripts/fuzz-long.sh).
FUZZ_RUNS ?= 10000000
fuzz-long: deps
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	scripts/fuzz-long.sh $(FUZZ_RUNS) packet synproxy pcap pfconf sync

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean

# xpfd against the kernel (nftables + conntrack) in network namespaces, point by point.
lab: build
	$(BIN)/xpf-bench lab

# Real clients (iperf3, ping under load) through xpfd and through nftables + conntrack, the
# same policy, alternated, on the hosts' default settings (xpf-bench real; crates/bench/src/real.rs).
bench-real: build
	$(BIN)/xpf-bench real --io xdp
	$(BIN)/xpf-bench real --io xdp --fastpath
	$(BIN)/xpf-bench real --io packet --fastpath --out bench-results/out/real-packet
