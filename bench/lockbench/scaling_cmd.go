package lockbench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// WriteScaling prints a scaling run's two tables.
func WriteScaling(w io.Writer, rep *ScalingReport) error {
	cfg := rep.Config
	fsync := "fsync ON"
	if cfg.NoFsync {
		fsync = "fsync OFF"
	}
	fmt.Fprintf(w, "lockbench scaling: embedded etcd (1 member, %s), Redis at %s; %s, GOMAXPROCS %d, %d CPUs; load average %s\n",
		fsync, cfg.RedisAddr, runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), rep.Load)
	if len(rep.Clients) > 0 {
		fmt.Fprintf(w, "\nconcurrent clients, each its own lock name, acquire+release for %s per point (TTL %s; CPU: this process, which runs the embedded etcd too, plus Redis)\n", cfg.Window, DefaultConfig().TTL)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "impl\tclients\tops/s\tp50\tp99\tcpu/op\terrors\t")
		for _, p := range rep.Clients {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t\n", p.Impl, p.Clients, p.OpsPerSec(), benchkit.MS(p.P50), benchkit.MS(p.P99), benchkit.US(p.CPUPerOp()), p.Errors)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Held) > 0 {
		fmt.Fprintf(w, "\nlocks held at once, each kept alive (fenced: a refresh per lock every TTL/3; etcd Mutex: 64 sessions, one lease keep-alive each), TTL %s, measured over %s;\n"+
			"CPU above idle (%.1f ms/s with nothing held); memory: this process's Go heap and stacks (clients and the embedded etcd), Redis used_memory, etcd db in use\n",
			cfg.HeldTTL, cfg.HeldWindow, ms(rep.IdleCPU))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "impl\theld\ttaking them\tcpu ms/s\tcpu/lock/s\tallocs/lock/s\tprocess B/lock\tRedis B/lock\tetcd B/lock\terrors\t")
		for _, p := range rep.Held {
			proc, rb, eb := p.BytesPerLock()
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%.1f\t%.0f\t%.0f\t%.0f\t%d\t\n", p.Impl, p.Held, p.Acquire.Round(time.Millisecond),
				ms(p.CPUPerSec()), perLock(p.CPUPerLockSec()), p.AllocsPerLockSec(), proc, rb, eb, p.Errors)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, p := range rep.Clients {
		if p.FirstErr != nil {
			fmt.Fprintf(w, "%s, %d clients: first error: %v\n", p.Impl, p.Clients, p.FirstErr)
		}
	}
	for _, p := range rep.Held {
		if p.FirstErr != nil {
			fmt.Fprintf(w, "%s, %d held: first error: %v\n", p.Impl, p.Held, p.FirstErr)
		}
	}
	return nil
}

// perLock formats a small CPU duration per lock per second.
func perLock(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fµs", us(d))
}

// ScalingCommand is the scaling program (bench/cmd/scaling):
//
//	go run ./cmd/scaling [-clients 1,8,64,256,1024] [-window 2s] [-held 10,...,100000] [-held-ttl 30s]
//	                     [-held-window 10s] [-only impl,impl] [-svg dir] [-short] [-fsync on|off] [-cpuprofile file]
//
// Flags also come from FENCED_SCALING_<FLAG>.
func ScalingCommand(ctx context.Context, args []string, out, logw io.Writer) error {
	def := DefaultScalingConfig()
	fs := flag.NewFlagSet("scaling", flag.ContinueOnError)
	fs.SetOutput(logw)
	redisAddr := fs.String("redis", benchkit.RedisDefault(), "Redis address (default $FENCED_TEST_REDIS, else 127.0.0.1:6379)")
	clients := fs.String("clients", ints(def.Clients), "client counts of the first sweep, comma-separated (empty: skip it)")
	window := fs.Duration("window", def.Window, "how long each point of the client sweep runs")
	held := fs.String("held", ints(def.Held), "held-lock counts of the second sweep, comma-separated (empty: skip it)")
	heldTTL := fs.Duration("held-ttl", def.HeldTTL, "TTL of the held locks (>= 2s)")
	heldWindow := fs.Duration("held-window", def.HeldWindow, "how long the CPU of keeping them is measured (at least TTL/3, one keep-alive round)")
	only := fs.String("only", "", "comma-separated implementations (default all): "+strings.Join(ScalingImpls, ","))
	svgDir := fs.String("svg", "", "write scaling-clients.svg and scaling-held.svg into this directory")
	short := fs.Bool("short", false, "a quick run: -clients 1,8,64 -window 300ms -held 10,100,1000 -held-window 2s -held-ttl 6s unless given")
	fsync := fs.String("fsync", "on", `embedded etcd fsync: "on" or "off"`)
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	set, err := benchkit.Parse(fs, args, "FENCED_SCALING_")
	if err != nil {
		return err
	}
	if *short {
		for k, v := range map[string]string{"clients": "1,8,64", "window": "300ms", "held": "10,100,1000", "held-window": "2s", "held-ttl": "6s"} {
			if !set[k] {
				fs.Set(k, v)
			}
		}
	}
	cfg := ScalingConfig{RedisAddr: *redisAddr, Window: *window, HeldTTL: *heldTTL, HeldWindow: *heldWindow, Progress: logw}
	if cfg.Clients, err = parseInts("-clients", *clients); err != nil {
		return err
	}
	if cfg.Held, err = parseInts("-held", *held); err != nil {
		return err
	}
	switch *fsync {
	case "on":
	case "off":
		cfg.NoFsync = true
	default:
		return fmt.Errorf("-fsync %q: want on or off", *fsync)
	}
	if *only != "" {
		for _, n := range strings.Split(*only, ",") {
			cfg.Only = append(cfg.Only, strings.TrimSpace(n))
		}
	}
	stopProfile, err := benchkit.StartCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	rep, err := RunScaling(ctx, cfg)
	if err != nil {
		return err
	}
	if err := WriteScaling(out, rep); err != nil {
		return err
	}
	if *svgDir != "" {
		paths, err := WriteScalingSVGs(*svgDir, rep)
		if err != nil {
			return err
		}
		fmt.Fprintf(logw, "scaling: wrote %s\n", strings.Join(paths, ", "))
	}
	fmt.Fprintf(logw, "scaling: run took %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func parseInts(flagName, s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s %q: want positive integers separated by commas", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}
