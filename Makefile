# tidemark — see README.md.
#   make demo    start the local services and run the end-to-end demo (SOURCE=mysql: from MySQL 9.7)
#   make test    start local MariaDB + PostgreSQL + Kafka, then gofmt check, go mod tidy check,
#                go vet, staticcheck, go test -race: every package but the two end-to-end ones
#                in parallel (those that tail MariaDB after binlog), then integration/ and
#                integration/nemesis alone, one after the other
#                (they share one MariaDB and some purge its binlogs or restart the servers)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

SERVICES := scripts/services.sh
# Exports TIDEMARK_TEST_* for the running local services; use on the same recipe line.
WITH_ENV := eval "$$($(SERVICES) env)"

.PHONY: build services test test-unit test-e2e staticcheck test-reliability test-long nemesis soak fmt-check tidy-check vet demo bench bench-fallback bench-peers bench-snapshot bench-pg-shapes bench-beside bench-25 bench-apply peer-tools down status clean

build:
	go build -ldflags "-X main.version=$$(git describe --tags --always --dirty 2>/dev/null || echo dev) -X main.commit=$$(git rev-parse HEAD 2>/dev/null)" -o bin/tidemark ./cmd/tidemark

services:
	$(SERVICES) up

fmt-check:
	@unformatted="$$(find . \( -name .git -o -name .data -o -name bin -o -name testdata \) -prune -o -name '*.go' -print | xargs -r gofmt -l)"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi

# go.mod and go.sum must be what `go mod tidy` makes of them (prints the difference otherwise).
tidy-check:
	go mod tidy -diff

vet:
	go vet ./...

# staticcheck at a pinned version, fetched (once, then from the module cache) through the Go
# module proxy like any module: no other network.
STATICCHECK_VERSION := v0.8.2
staticcheck:
	go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# The end-to-end packages run alone: their tests purge and reset the shared MariaDB's binlogs
# (failover, fallback, rel_purge, mariadb: RESET MASTER) and restart the servers (F3, F4).
# binlog's XA tests leave a transaction prepared across other tests' start positions, and a
# tailer that starts between an XA PREPARE and its XA COMMIT stops, rightly (it cannot read
# that transaction's rows): that failed cmd/tidemark's TestDemo beside it. So the packages
# whose tests tail MariaDB (TAIL_PKGS) run after binlog, in parallel with each other. The
# other packages' tests are safe side by side: they write their own random databases, schemas
# and topics, take random replication server_ids (testenv.ServerID), rotate binlogs or change
# binlog_expire_logs_seconds only under the named lock tidemark_test_binlog_expire, never
# purge, and expect no quiet server.
E2E_PKGS := tidemark/integration tidemark/integration/nemesis
TAIL_PKGS := tidemark/cmd/tidemark tidemark/verify

# Prerequisites run left to right: services up, gofmt check, go mod tidy check, go vet,
# staticcheck; then the tests.
test: services fmt-check tidy-check vet staticcheck
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-e2e

# Every package but the end-to-end ones, in parallel (go test's default -p, the number of CPUs):
# first binlog with the packages that tail no MariaDB, then TAIL_PKGS.
test-unit:
	$(WITH_ENV) && go test -race -count=1 -timeout 40m $$(go list ./... | grep -vxF $(foreach p,$(E2E_PKGS) $(TAIL_PKGS),-e $(p)))
	$(WITH_ENV) && go test -race -count=1 -timeout 40m $(TAIL_PKGS)

# The end-to-end packages, one at a time.
test-e2e:
	$(WITH_ENV) && go test -race -count=1 -p 1 -timeout 40m $(E2E_PKGS)

# The reliability suite alone (quick profiles, the same as in `make test`), verbose, with
# each scenario's figures appended to bin/reliability.jsonl (docs/RELIABILITY.md).
REL_TESTS := TestF[0-9]|TestI6|TestBadConfig|TestCanary|TestTableWithoutKey|TestHostile|TestTemporal|TestHotKey|TestInvariantChecks
test-reliability: services
	mkdir -p bin
	$(WITH_ENV) && TIDEMARK_REL_REPORT=$(CURDIR)/bin/reliability.jsonl \
		go test -count=1 -p 1 -timeout 40m -run '$(REL_TESTS)' -v ./integration/

# Long profiles of the reliability suite (200 kills, 1M-row transaction, more restarts): the
# tests named *Long, which skip unless TIDEMARK_LONG=1. Figures go to bin/reliability-long.jsonl.
test-long: services
	mkdir -p bin
	$(WITH_ENV) && TIDEMARK_LONG=1 TIDEMARK_REL_REPORT=$(CURDIR)/bin/reliability-long.jsonl \
		go test -count=1 -p 1 -timeout 90m -run 'Long$$' -v ./integration/

# The nemesis (integration/nemesis, docs/RELIABILITY.md): replay one campaign exactly, or run
# fresh random seeds until DURATION is up and print the table (campaigns, faults by kind, DDL
# statements, rows compared, failures with their seeds). make test runs the CI seed set.
SEED ?= 1
DURATION ?= 30m
nemesis: services
	$(WITH_ENV) && NEMESIS_SEEDS=$(SEED) go test -count=1 -timeout 60m -run 'TestNemesis$$' -v ./integration/nemesis/

soak: services
	mkdir -p bin
	$(WITH_ENV) && NEMESIS_SOAK=$(DURATION) go test -count=1 -timeout 0 -run 'TestNemesis$$' -v ./integration/nemesis/ 2>&1 | tee bin/soak.log

# SOURCE=mysql runs it against the real MySQL 9.7 instead of MariaDB.
SOURCE ?= mariadb
demo: services
	$(WITH_ENV) && go run ./cmd/tidemark demo -source $(SOURCE)

# Measures tidemark against its ceilings, three runs on one backlog (medians), and writes its
# section of docs/PERFORMANCE.md. The lag (T3) needs track_commit_timestamp=on, which
# scripts/services.sh sets when it starts PostgreSQL.
bench: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench

# Catch-up of a table with 0.1% changed versus a full reload, three runs each, at 1M rows
# (FALLBACK_ROWS=10000000 for the 10M-row variant); writes its section of docs/PERFORMANCE.md.
FALLBACK_ROWS ?= 1000000
bench-fallback: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench -fallback $(FALLBACK_ROWS)

# pgloader (Debian's package, installed here when missing) versus tidemark's first-run snapshot
# on the same 1M-row table, back to back, three runs, both copies checked with tidemark verify;
# writes its section of docs/PERFORMANCE.md.
bench-peers: services peer-tools
	$(WITH_ENV) && go run ./cmd/tidemark-bench -peers 1000000

# The peers of bench-peers and bench-25: Debian's pgloader, pg_chameleon 2.0 in a venv.
peer-tools:
	command -v pgloader >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgloader; }
	test -x .data/chameleon/bin/chameleon || { /usr/bin/python3 -m venv .data/chameleon && \
		.data/chameleon/bin/pip install -q 'pg_chameleon>=2.0,<2.1'; }

# The first-run snapshot of a 1M-row table at snapshot.parallelism 1, 2 and 4, each against the
# COPY ceiling measured right before it, three runs (SNAP_ROWS to change the size); writes its
# section of docs/PERFORMANCE.md.
SNAP_ROWS ?= 1000000
bench-snapshot: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench -snapshot-parallel $(SNAP_ROWS)

# PostgreSQL's share of the first-run snapshot: tidemark's copy of the SNAP_ROWS-row peers table
# loaded by one COPY into its target layout and into the peers' (doc text, no _tm_ columns, the
# key after the load), three interleaved runs; writes its section of docs/PERFORMANCE.md.
bench-pg-shapes: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench -pg-shapes $(SNAP_ROWS)

# The lag of a busy small table while a BESIDE_ROWS-row table (5M; 1000000 for a quick run) is
# snapshotted beside the stream (tidemark resync while tidemark run streams), against the same
# writer's lag with no snapshot in the same run, three runs; BESIDE_TOPOLOGY=fanout runs it with
# target.kafka beside PostgreSQL. Writes its section of docs/PERFORMANCE.md.
BESIDE_ROWS ?= 5000000
BESIDE_TOPOLOGY ?= postgres
bench-beside: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench -beside -beside-rows $(BESIDE_ROWS) -beside-topology $(BESIDE_TOPOLOGY)

# Issue 25's Targets table: bench-beside (BESIDE_ROWS), bench-peers with three drains,
# bench-snapshot, the Kafka tailer's K/D of bench-apply and bench-fallback at 1M, one after the
# other, each writing its own section, then the table with now/target/verdict (section
# targets-25 of docs/PERFORMANCE.md). ROWS=10000000 adds the peers (with peak RSS) and R7 at 10M
# rows (25+ minutes more).
ROWS ?= 0
bench-25: services peer-tools
	$(WITH_ENV) && go run ./cmd/tidemark-bench -targets25 -beside-rows $(BESIDE_ROWS) -long-rows $(ROWS)

# The scale-out topology: the Kafka tailer (K/D) and 1, 2 and 3 appliers against `tidemark run`
# straight into PostgreSQL; writes its section of docs/SCALE-OUT.md. The tailer alone, profiled:
# go run ./cmd/tidemark-bench -apply 100000 -appliers 0 -runs 1 -tailer-profile /tmp/p -out ''
bench-apply: services
	$(WITH_ENV) && go run ./cmd/tidemark-bench -apply 100000 -runs 3

down:
	$(SERVICES) down

status:
	$(SERVICES) status

# Removes build output and stops the local services, deleting their data (.data/).
clean:
	rm -rf bin
	$(SERVICES) reset
