// Package pgfence measures the transactions per second of an UPDATE guarded
// by the Postgres adapter's column and fence-table modes against the same
// UPDATE unguarded, and prints them side by side.
//
//	cd bench && go run ./cmd/pgfence [-clients 16] [-rows 1024] [-duration 1s] [-rounds 10] [-modes Unguarded,Column,...] [-synchronous-commit on|off]
//
// The modes take turns in short slices, in an order that rotates each
// round, and the overhead is the median over rounds against the baseline
// of the same round, so that load from other processes on the machine
// affects every mode alike. Each client writes its own rows, so the numbers
// measure the guard and not waits for row locks.
//
// Every flag can also be set from the environment as FENCED_PGFENCE_<FLAG>
// (dashes as underscores). The database is FENCED_TEST_POSTGRES, else
// DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test.
package pgfence

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// Command is the pgfence program (bench/cmd/pgfence): it parses args, runs
// the modes and prints the table to out; logw gets flag errors.
func Command(ctx context.Context, args []string, out, logw io.Writer) error {
	fs := flag.NewFlagSet("pgfence", flag.ContinueOnError)
	fs.SetOutput(logw)
	dsnFlag := fs.String("dsn", benchkit.PostgresDefault(), "Postgres DSN")
	clients := fs.Int("clients", 16, "parallel clients, one pool connection each")
	rows := fs.Int("rows", 1024, "rows in the table, split between the clients")
	duration := fs.Duration("duration", time.Second, "time per mode per round")
	rounds := fs.Int("rounds", 10, "rounds; the modes take turns in each, in a rotating order, so that drift and background load hit them alike")
	only := fs.String("modes", "", "comma-separated modes to run (default all); the first is the baseline")
	syncCommit := fs.String("synchronous-commit", "", `synchronous_commit for the connections: "" (server default), "on" or "off"`)
	if _, err := benchkit.Parse(fs, args, "FENCED_PGFENCE_"); err != nil {
		return err
	}
	if *clients < 1 || *rows < *clients || *duration <= 0 || *rounds < 1 {
		return fmt.Errorf("want clients >= 1, rows >= clients, duration > 0, rounds >= 1")
	}

	modes := allModes
	if *only != "" {
		modes = nil
		for _, name := range strings.Split(*only, ",") {
			i := slices.IndexFunc(allModes, func(m mode) bool { return m.name == name })
			if i < 0 {
				return fmt.Errorf("no mode %q", name)
			}
			modes = append(modes, allModes[i])
		}
	}

	pool, err := connect(ctx, *dsnFlag, *clients, *syncCommit)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := setup(ctx, pool, *rows)
	if err != nil {
		return err
	}
	defer func() {
		// ctx may be done (interrupt); the schema must still go.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := w.drop(dctx); derr != nil {
			fmt.Fprintln(logw, "pgfence: drop schema:", derr)
		}
	}()

	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d clients, %d rows, %d rounds of %v per mode, synchronous_commit=%s, GOMAXPROCS=%d\n\n",
		*clients, *rows, *rounds, *duration, sc, runtime.GOMAXPROCS(0))

	// rates[i][r] is mode i's tx/s in round r.
	rates := make([][]float64, len(modes))
	txs := make([]int64, len(modes))
	elapsed := make([]time.Duration, len(modes))
	// Warm up every mode once, untimed.
	for _, m := range modes {
		if _, _, err := measure(ctx, w, m, *clients, *duration/4); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	for r := range *rounds {
		for k := range modes {
			i := (k + r) % len(modes)
			n, d, err := measure(ctx, w, modes[i], *clients, *duration)
			if err != nil {
				return fmt.Errorf("%s: %w", modes[i].name, err)
			}
			txs[i] += n
			elapsed[i] += d
			rates[i] = append(rates[i], float64(n)/d.Seconds())
		}
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\ttx/s\toverhead\tround range\twhat one transaction does")
	for i, m := range modes {
		rate := float64(txs[i]) / elapsed[i].Seconds()
		if i == 0 {
			fmt.Fprintf(tw, "%s\t%.0f\t-\t\t%s\n", m.name, rate, m.desc)
			continue
		}
		// Overhead in each round against the baseline of the same round,
		// so that background load that comes and goes cancels out.
		over := make([]float64, *rounds)
		for r := range over {
			over[r] = (rates[0][r]/rates[i][r] - 1) * 100
		}
		slices.Sort(over)
		fmt.Fprintf(tw, "%s\t%.0f\t%+.1f%%\t%+.0f%% .. %+.0f%%\t%s\n", m.name, rate, median(over), over[0], over[len(over)-1], m.desc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, "\noverhead: median over rounds of (baseline tx/s / mode tx/s - 1), i.e. extra time per transaction")
	return err
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// measure runs m from n clients for d and returns the transactions done.
func measure(ctx context.Context, w *workload, m mode, n int, d time.Duration) (int64, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(d)
	counts := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range n {
		wg.Go(func() {
			cl := newClient(w, c, n)
			for time.Now().Before(deadline) {
				if err := cl.do(ctx, m); err != nil {
					errs[c] = err
					cancel() // stop the others: the run is void
					return
				}
				counts[c]++
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	var total int64
	for _, k := range counts {
		total += k
	}
	return total, took, errors.Join(errs...)
}
