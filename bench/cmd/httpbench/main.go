// Command httpbench measures acquire+release over the HTTP API against the
// in-process SDK, in one process and one run, over one lease store, and
// prints one table (see package httpbench).
//
//	go run ./cmd/httpbench [-store redis|etcd] [-duration 3s] [-iterations 1000] [-rounds 3] [-clients 64]
//	                       [-redis 127.0.0.1:6379] [-short]
//
// Every flag can also be set from the environment as FENCED_HTTPBENCH_<FLAG>
// (dashes as underscores); the Redis address defaults to $FENCED_TEST_REDIS,
// else 127.0.0.1:6379. A flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"

	"github.com/fenced/fenced/bench/httpbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "httpbench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out, logw io.Writer) error {
	def := httpbench.DefaultConfig()
	fs := flag.NewFlagSet("httpbench", flag.ContinueOnError)
	fs.SetOutput(logw)
	store := fs.String("store", def.Store, "lease store: redis (leases in Redis, tokens from etcd) or etcd")
	redisAddr := fs.String("redis", benchkit.RedisDefault(), "Redis address (default $FENCED_TEST_REDIS, else 127.0.0.1:6379)")
	duration := fs.Duration("duration", def.Duration, "duration of the throughput scenario, per path per round")
	iterations := fs.Int("iterations", def.Iterations, "uncontended acquire+release pairs per path, in all")
	rounds := fs.Int("rounds", def.Rounds, "rounds: each runs both paths once, the order rotating")
	clients := fs.Int("clients", def.Clients, "throughput scenario: goroutines, each on its own lock name")
	short := fs.Bool("short", false, "a quick run: -duration 300ms -iterations 50 -rounds 2 unless given")
	set, err := benchkit.Parse(fs, args, "FENCED_HTTPBENCH_")
	if err != nil {
		return err
	}

	cfg := def
	if *short {
		cfg = httpbench.ShortConfig()
	}
	if set["duration"] || !*short {
		cfg.Duration = *duration
	}
	if set["iterations"] || !*short {
		cfg.Iterations = *iterations
	}
	if set["rounds"] || !*short {
		cfg.Rounds = *rounds
	}
	cfg.Store, cfg.RedisAddr, cfg.Clients = *store, *redisAddr, *clients
	cfg.Log = logw

	start := time.Now()
	rep, err := httpbench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := httpbench.Write(out, rep); err != nil {
		return err
	}
	fmt.Fprintf(logw, "httpbench: run took %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}
