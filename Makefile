# Targets: test (the README's test command) and the benchmarks of the
# nested module bench (every program there is bench/cmd/X over package
# bench/X; each needs Redis on 127.0.0.1:6379 or $FENCED_TEST_REDIS and
# Postgres as the tests do):
#   bench          lock comparison (bench/cmd/lockbench); BENCHFLAGS, e.g. BENCHFLAGS='-short'
#   bench-http     HTTP API against the SDK (bench/cmd/httpbench); BENCHFLAGS too
#   bench-pg       the Postgres fence's cost (bench/cmd/pgfence); BENCHFLAGS too
#   compare        every lock scheme under every fault, checked (bench/cmd/compare):
#                  the table, docs/compare/results.{md,json} and the charts; the JSON last
#   compare-short  the same with small counts, as CI runs it; fails if fenced broke
# COMPAREFLAGS passes flags to compare, e.g. COMPAREFLAGS='-faults pause -schemes redislock,fenced/redis'.

.PHONY: test bench bench-http bench-pg compare compare-short

test:
	go test -race ./...

bench:
	cd bench && go run ./cmd/lockbench $(BENCHFLAGS)

bench-http:
	cd bench && go run ./cmd/httpbench $(BENCHFLAGS)

bench-pg:
	cd bench && go run ./cmd/pgfence $(BENCHFLAGS)

compare:
	cd bench && go run ./cmd/compare -out ../docs/compare $(COMPAREFLAGS)

compare-short:
	cd bench && go run ./cmd/compare -short $(COMPAREFLAGS)
