// Package benchkit holds what the benchmark programs share: their main,
// run ids, percentiles, CPU and load readings, error counting, number
// formats, and flags from the environment.
package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RunID is 8 random hex digits that keep one run's keys apart from another's.
func RunID() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Loadavg is the 1-, 5- and 15-minute load averages, "?" where unknown:
// other work on the machine skews every figure.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// Percentile is the nearest-rank p-th percentile; it sorts d.
func Percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := (len(d)*p + 99) / 100 // ceil(n*p/100)
	return d[max(i-1, 0)]
}

// Errs counts failed operations and keeps the first.
type Errs struct {
	mu    sync.Mutex
	n     int
	first error
}

// Add counts err.
func (e *Errs) Add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if e.first == nil {
		e.first = err
	}
}

// TooMany stops a scenario that fails over and over.
func (e *Errs) TooMany() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n >= 100
}

// Result is the count and the first error.
func (e *Errs) Result() (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n, e.first
}

// MS formats d in milliseconds, "-" for 0.
func MS(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

// US formats d in microseconds, "-" when unknown.
func US(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

// RedisDefault is $FENCED_TEST_REDIS, else 127.0.0.1:6379.
func RedisDefault() string {
	if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// FromEnv sets every flag not given on the command line from
// <prefix><FLAG>, the flag's name in upper case with - as _.
func FromEnv(fs *flag.FlagSet, prefix string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs error
	fs.VisitAll(func(f *flag.Flag) {
		env := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] {
			if err := fs.Set(f.Name, v); err != nil {
				errs = errors.Join(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errs
}

// Parse parses args, then the environment (FromEnv with envPrefix), refuses
// positional arguments, and returns the flags given either way: -short
// keeps a quick run's value only for a flag not given.
func Parse(fs *flag.FlagSet, args []string, envPrefix string) (given map[string]bool, err error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := FromEnv(fs, envPrefix); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given, nil
}

// Main is the main of every benchmark program: run gets the arguments,
// stdout and stderr and a context that ends on ^C or SIGTERM; an error is
// printed (not flag.ErrHelp, which the flag package has explained) and
// the exit status is 1.
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		os.Exit(1)
	}
}

// PostgresDefault is $FENCED_TEST_POSTGRES, else $DATABASE_URL, else the
// local test database.
func PostgresDefault() string {
	for _, k := range []string{"FENCED_TEST_POSTGRES", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// StartCPUProfile writes a CPU profile of the rest of the run to path (for
// go tool pprof); stop ends it. An empty path profiles nothing.
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
