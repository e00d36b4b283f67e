package httpbench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// Command is the httpbench program (bench/cmd/httpbench): it parses args,
// runs the measurement and prints its table to out, progress to logw.
//
//	go run ./cmd/httpbench [-store redis|etcd] [-duration 3s] [-iterations 1000] [-rounds 3] [-clients 64]
//	                       [-redis 127.0.0.1:6379] [-only SDK,HTTP] [-short] [-cpuprofile f]
//
// Every flag can also be set from the environment as FENCED_HTTPBENCH_<FLAG>
// (dashes as underscores); the Redis address defaults to $FENCED_TEST_REDIS,
// else 127.0.0.1:6379. A flag on the command line wins.
func Command(ctx context.Context, args []string, out, logw io.Writer) error {
	def := DefaultConfig()
	fs := flag.NewFlagSet("httpbench", flag.ContinueOnError)
	fs.SetOutput(logw)
	store := fs.String("store", def.Store, "lease store: redis (leases in Redis, tokens from etcd) or etcd")
	redisAddr := fs.String("redis", benchkit.RedisDefault(), "Redis address (default $FENCED_TEST_REDIS, else 127.0.0.1:6379)")
	duration := fs.Duration("duration", def.Duration, "duration of the throughput scenario, per path per round")
	iterations := fs.Int("iterations", def.Iterations, "uncontended acquire+release pairs per path, in all")
	rounds := fs.Int("rounds", def.Rounds, "rounds: each runs both paths once, the order rotating")
	clients := fs.Int("clients", def.Clients, "throughput scenario: goroutines, each on its own lock name")
	short := fs.Bool("short", false, "a quick run: -duration 300ms -iterations 50 -rounds 2 unless given")
	only := fs.String("only", "", "measure only these paths, comma-separated: sdk, http, bare, floor (default all; the check runs on SDK and HTTP)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (client, server and embedded etcd: one process) to this file")
	set, err := benchkit.Parse(fs, args, "FENCED_HTTPBENCH_")
	if err != nil {
		return err
	}

	cfg := def
	if *short {
		cfg = ShortConfig()
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
	if *only != "" {
		for _, p := range strings.Split(*only, ",") {
			cfg.Only = append(cfg.Only, PathNamed(strings.TrimSpace(p)))
		}
	}

	stopProfile, err := benchkit.StartCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	rep, err := Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := Write(out, rep); err != nil {
		return err
	}
	fmt.Fprintf(logw, "httpbench: run took %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}
