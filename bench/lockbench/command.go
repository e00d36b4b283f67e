package lockbench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// Command is the lockbench program (bench/cmd/lockbench): it parses args,
// runs the comparison and prints its table to out, progress to logw.
//
//	go run ./cmd/lockbench [-duration 3s] [-iterations 2000] [-rounds 3] [-redis 127.0.0.1:6379] [-short]
//	                       [-fsync on|off|both] [-inflight N] [-unfair=false] [-expirers N] [-only impl,impl] [-cpuprofile file]
//
// Every flag can also be set from the environment as FENCED_LOCKBENCH_<FLAG>
// (dashes as underscores); the Redis address defaults to $FENCED_TEST_REDIS,
// else 127.0.0.1:6379. A flag on the command line wins.
func Command(ctx context.Context, args []string, out, logw io.Writer) error {
	def := DefaultConfig()
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(logw)
	redisAddr := fs.String("redis", benchkit.RedisDefault(), "Redis address (default $FENCED_TEST_REDIS, else 127.0.0.1:6379)")
	duration := fs.Duration("duration", def.Duration, "duration of the throughput and the hot-name scenario, each, per implementation")
	iterations := fs.Int("iterations", def.Iterations, "uncontended acquire+release pairs per implementation")
	rounds := fs.Int("rounds", def.Rounds, "rounds: each runs every implementation once, the order rotating; figures are over all rounds")
	short := fs.Bool("short", false, "a quick run: -duration 500ms -iterations 100 -rounds 1 unless given")
	ttl := fs.Duration("ttl", def.TTL, "lease TTL of every implementation (>= 2s: etcd)")
	clients := fs.Int("clients", def.Clients, "throughput scenario: clients, each on its own lock name")
	contenders := fs.Int("contenders", def.Contenders, "hot-name scenario: clients on one lock name")
	fsync := fs.String("fsync", "on", `embedded etcd fsync: "on" (honest), "off" (UnsafeNoFsync) or "both" (two tables)`)
	expirers := fs.Int("expirers", def.Expirers, "expiry scenario: holders that walk away from their locks at once, each with a waiter (0: skip it)")
	unfair := fs.Bool("unfair", true, "also run fenced's rows with lock.WithUnfair, to show what fair waiting costs")
	inflight := fs.Int("inflight", 0, "also run fenced/redis with sequencer.WithInflight(N) and fenced/etcd with lock.WithEtcdInflight(N); 0: only the defaults (1 and 2)")
	only := fs.String("only", "", "comma-separated implementations to run (default all): "+strings.Join(names, ","))
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	set, err := benchkit.Parse(fs, args, "FENCED_LOCKBENCH_")
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
	cfg.RedisAddr, cfg.TTL, cfg.Clients, cfg.Contenders, cfg.Inflight = *redisAddr, *ttl, *clients, *contenders, *inflight
	cfg.NoUnfair, cfg.Expirers = !*unfair, *expirers
	cfg.Progress = logw
	if *only != "" {
		for _, n := range strings.Split(*only, ",") {
			cfg.Only = append(cfg.Only, strings.TrimSpace(n))
		}
	}
	var fsyncs []bool // NoFsync values
	switch *fsync {
	case "on":
		fsyncs = []bool{false}
	case "off":
		fsyncs = []bool{true}
	case "both":
		fsyncs = []bool{false, true}
	default:
		return fmt.Errorf("-fsync %q: want on, off or both", *fsync)
	}

	stopProfile, err := benchkit.StartCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	for _, noFsync := range fsyncs {
		cfg.NoFsync = noFsync
		start := time.Now()
		rep, err := Run(ctx, cfg)
		if err != nil {
			return err
		}
		if err := Write(out, rep); err != nil {
			return err
		}
		fmt.Fprintf(logw, "lockbench: run took %s\n", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

var names = []string{EtcdMutex, RedisLock, Redsync, FencedRedis, FencedRedis + Unfair, FencedEtcd, FencedEtcd + Unfair}
