# Targets:
#   test           the README's test command
#   lint           staticcheck (pinned) over the three modules, with staticcheck.conf;
#                  lint-main over the main module only, as CI runs it
#   install        go install ./cmd/fenced with the version stamped in
#   dist           static binaries (CGO_ENABLED=0) of fenced for PLATFORMS into
#                  DIST, named fenced-VERSION-OS-ARCH, with SHA256SUMS;
#                  make dist PLATFORMS=linux/amd64 builds one
# and the benchmarks of the nested module bench (every program there is
# bench/cmd/X over package bench/X; each needs Redis on 127.0.0.1:6379 or
# $FENCED_TEST_REDIS and Postgres as the tests do):
#   bench          lock comparison (bench/cmd/lockbench); BENCHFLAGS, e.g. BENCHFLAGS='-short'
#   bench-http     HTTP API against the SDK (bench/cmd/httpbench); BENCHFLAGS too
#   bench-pg       the Postgres fence's cost (bench/cmd/pgfence); BENCHFLAGS too
#   bench-scaling  how cost grows with clients and with held locks (bench/cmd/scaling):
#                  the tables, and bench/scaling-clients.svg and bench/scaling-held.svg
#   compare        every lock scheme under every fault, checked (bench/cmd/compare):
#                  the table, docs/compare/results.{md,json} and the charts; the JSON last
#   compare-short  the same with small counts, as CI runs it; fails if fenced broke
# COMPAREFLAGS passes flags to compare, e.g. COMPAREFLAGS='-faults pause -schemes redislock,fenced/redis'.
#
# VERSION defaults to git describe (a tag, or the commit), else "dev"; fenced
# version and the startup log say it.

STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2

VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
DIST      ?= dist
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: test lint lint-main install dist bench bench-http bench-pg bench-scaling compare compare-short

test:
	go test -race ./...

lint: lint-main
	cd bench && $(STATICCHECK) ./...
	cd tools/oapi && $(STATICCHECK) ./...

lint-main:
	$(STATICCHECK) ./...

install:
	go install -trimpath -ldflags "$(LDFLAGS)" ./cmd/fenced

dist:
	@mkdir -p $(DIST)
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/fenced-$(VERSION)-$$os-$$arch; \
		echo "building $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(LDFLAGS)" -o $$out ./cmd/fenced; \
	done
	@cd $(DIST) && if command -v sha256sum >/dev/null; then sha256sum fenced-$(VERSION)-*; \
		else shasum -a 256 fenced-$(VERSION)-*; fi > SHA256SUMS
	@echo "$(DIST)/SHA256SUMS:" && cat $(DIST)/SHA256SUMS

bench:
	cd bench && go run ./cmd/lockbench $(BENCHFLAGS)

bench-http:
	cd bench && go run ./cmd/httpbench $(BENCHFLAGS)

bench-pg:
	cd bench && go run ./cmd/pgfence $(BENCHFLAGS)

bench-scaling:
	cd bench && go run ./cmd/scaling -svg . $(BENCHFLAGS)

compare:
	cd bench && go run ./cmd/compare -out ../docs/compare $(COMPAREFLAGS)

compare-short:
	cd bench && go run ./cmd/compare -short $(COMPAREFLAGS)
