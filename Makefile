# Targets: test (the README's test command) and bench (lock comparison,
# bench/cmd/lockbench; needs Redis on 127.0.0.1:6379 or $FENCED_TEST_REDIS).
# BENCHFLAGS passes flags to lockbench, e.g. make bench BENCHFLAGS='-short'.
# bench-http: HTTP API against the SDK (bench/cmd/httpbench), same Redis; BENCHFLAGS too.

.PHONY: test bench bench-http

test:
	go test -race ./...

bench:
	cd bench && go run ./cmd/lockbench $(BENCHFLAGS)

bench-http:
	cd bench && go run ./cmd/httpbench $(BENCHFLAGS)
