# Targets: test (the README's test command) and bench (lock comparison,
# bench/cmd/lockbench; needs Redis on 127.0.0.1:6379 or $FENCED_TEST_REDIS).
# BENCHFLAGS passes flags to lockbench, e.g. make bench BENCHFLAGS='-short'.

.PHONY: test bench

test:
	go test -race ./...

bench:
	cd bench && go run ./cmd/lockbench $(BENCHFLAGS)
