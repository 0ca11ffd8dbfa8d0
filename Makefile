# bmdb's build. Every target works on a fresh Debian machine with Go: the
# tools are installed at pinned versions into .bin/, and PostgreSQL is
# installed from apt and started on a free local port when no DSN is given.

SQLC_VERSION        := v1.31.1
STATICCHECK_VERSION := v0.8.2
BIN                 := $(CURDIR)/.bin
SQLC                := $(BIN)/sqlc-$(SQLC_VERSION)
STATICCHECK         := $(BIN)/staticcheck-$(STATICCHECK_VERSION)

# The test command of README.md and .ci/run: every package (saying first
# if the browser tests will skip, which go test does not show), the
# standalone example module (also in cockroach mode, as bmdbtest lets an
# application's tests run), then the core, worker, bmdbtest and chaos
# tests again in cockroach mode (internal/testing/crdbmode: bmdb's
# CockroachDB code paths on PostgreSQL, with CockroachDB's errors injected
# and its locking and migrations per version; ambiguous commits only for
# the chaos run, whose checker tolerates them), as the newest release it
# models and as the oldest (23.2, whose migration files run as one
# transaction).
# BMDB_TEST_DSN, when set, names the server to test against (PostgreSQL or
# CockroachDB) instead of a throwaway one.
#
# TEST_STEPS are the go test invocations, in order, each a name and a
# command (one line each; no single quotes inside): scripts/run-steps runs
# every one whatever the others did, then prints a line per step (passed
# or FAILED, and its duration) and fails if any failed.
GO_TEST    := go test -race -count=1 -timeout 20m
TEST_STEPS := \
	'every package' '$(GO_TEST) ./...' \
	'examples/burnin (a module of its own)' 'cd examples/burnin && $(GO_TEST) ./...' \
	'examples/burnin, cockroach mode' 'cd examples/burnin && BMDB_TEST_COCKROACH=retry=0.02 $(GO_TEST) .' \
	'cockroach mode 25.2: bmdb, worker, bmdbtest' 'BMDB_TEST_COCKROACH=retry=0.02,version=25.2 $(GO_TEST) ./bmdb/ ./worker/ ./bmdbtest/' \
	'cockroach mode 23.2: bmdb, migrations, bmdbtest' 'BMDB_TEST_COCKROACH=retry=0.02,version=23.2 $(GO_TEST) ./bmdb/ ./migrations/ ./bmdbtest/' \
	'cockroach mode: chaos' 'BMDB_TEST_COCKROACH=retry=0.02,ambiguous=0.01 $(GO_TEST) ./cmd/bmdb-chaos/'
BROWSER_CHECK := command -v chromium || command -v chromium-browser || command -v google-chrome || \
	echo "== web: the browser tests (TestBrowser*) will SKIP: no chromium on PATH (apt-get install chromium) ==" >&2

.PHONY: all demo test generate verify lint check bench bench-durable bench-matrix clean

all: check

# DEMO_FLAGS: the demo serves its fleet pages on a free local port (the URL
# is printed first) and works slowly enough, ~20 s, to watch machines move.
# KEEP=1 keeps the pages (and the database) up after the run, until Ctrl-C.
DEMO_FLAGS ?= --http-addr 127.0.0.1:0 --work-duration 600ms $(if $(KEEP),--keep-serving)

## demo: run the example worker fleet against a throwaway local PostgreSQL
## (or the database in BMDB_DSN); make demo KEEP=1 keeps its fleet pages
## serving after the run, until interrupted, and prints the database's DSN
## as an export BMDB_DSN=... line for bmdbctl.
demo:
	@WITH_PG_QUIET=1 scripts/with-pg BMDB_DSN go run ./cmd/worker-example $(DEMO_FLAGS)

## test: run every test with the race detector against a throwaway
## PostgreSQL (or the server in BMDB_TEST_DSN), then the core, worker, bmdbtest and
## chaos tests in cockroach mode; every step runs, even after a failure, and
## a summary says which failed.
test:
	@{ $(BROWSER_CHECK); } >/dev/null
	scripts/with-pg BMDB_TEST_DSN scripts/run-steps $(TEST_STEPS)

# The sqlc configurations: bmdb's (model/, internal/store/), the demo
# pipeline's (cmd/worker-example/pipeline/pipelinedb/) and the standalone
# application module's (examples/burnin/burnindb/, whose schema starts with
# its committed copy of bmdb's, examples/burnin/bmdb_schema.sql).
SQLC_DIRS := . cmd/worker-example/pipeline examples/burnin
BMDB_SCHEMA := cd examples/burnin && go tool bmdb-schema

## generate: regenerate the sqlc code of bmdb (model/, internal/store/ from
## migrations/ and queries/) and of the example applications, after
## rewriting examples/burnin/bmdb_schema.sql (cmd/bmdb-schema).
generate: $(SQLC)
	$(BMDB_SCHEMA) > bmdb_schema.sql.tmp && mv bmdb_schema.sql.tmp bmdb_schema.sql
	for d in $(SQLC_DIRS); do (cd $$d && $(SQLC) generate) || exit 1; done

## verify: fail if any committed sqlc output, or examples/burnin's copy of
## bmdb's schema, differs from what generate would write.
verify: $(SQLC)
	@$(BMDB_SCHEMA) | diff -u bmdb_schema.sql - || { echo "examples/burnin/bmdb_schema.sql is stale: run make generate"; exit 1; }
	for d in $(SQLC_DIRS); do (cd $$d && $(SQLC) diff) || exit 1; done
	@echo "sqlc output is up to date"

## lint: gofmt, go vet and staticcheck.
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(STATICCHECK) ./...
	cd bench && go vet ./... && $(STATICCHECK) ./...
	cd examples/burnin && go vet ./... && $(STATICCHECK) ./...

## check: everything CI checks.
check: verify lint test

## bench: the bench's tests, then the quick benchmarks (a few minutes:
## floor vs bmdb vs River, scale, contention, issue 39's matrix at M=1000,
## go test -bench) against a throwaway PostgreSQL (or the one in BMDB_DSN).
## The full run is in bench/README.md.
bench:
	scripts/with-pg BMDB_DSN sh -c 'cd bench && BMDB_TEST_DSN="$$BMDB_DSN" go test -count=1 -run "^Test" . && go run . -quick && BMDB_TEST_DSN="$$BMDB_DSN" go test -run "^$$" -bench . -benchtime 300x'

## bench-durable: the throughput tables and the matrix (quick) again on a
## cluster with PostgreSQL's durable settings (fsync, synchronous_commit on), which
## favour neither the system that commits least nor the one that commits most.
bench-durable:
	PG_DURABLE=1 scripts/with-pg BMDB_DSN sh -c 'cd bench && go run . -quick -only table,matrix'

## bench-matrix: issue 39's matrix in full (M=6000, three rounds), on a
## throwaway cluster with fsync off, then on a durable one: the run behind
## bench/README.md's figures (about an hour on a 2-core machine).
bench-matrix:
	scripts/with-pg BMDB_DSN sh -c 'cd bench && go run . -only matrix'
	PG_DURABLE=1 scripts/with-pg BMDB_DSN sh -c 'cd bench && go run . -only matrix'

$(SQLC):
	mkdir -p $(BIN)/sqlc.tmp
	GOBIN=$(BIN)/sqlc.tmp go install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
	mv $(BIN)/sqlc.tmp/sqlc $@ && rmdir $(BIN)/sqlc.tmp

$(STATICCHECK):
	mkdir -p $(BIN)/staticcheck.tmp
	GOBIN=$(BIN)/staticcheck.tmp go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/staticcheck.tmp/staticcheck $@ && rmdir $(BIN)/staticcheck.tmp

clean:
	rm -rf $(BIN)
