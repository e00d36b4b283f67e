package httpbench_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/bench/httpbench"
)

// TestRun runs both paths through both scenarios, briefly, on each lease
// store, and checks only that each path completed operations and that
// sequential acquisitions of one name, alternating the paths, got strictly
// increasing tokens. Timing decides nothing here.
func TestRun(t *testing.T) {
	for _, store := range []string{httpbench.StoreRedis, httpbench.StoreEtcd} {
		t.Run(store, func(t *testing.T) {
			cfg := httpbench.ShortConfig()
			cfg.Store = store
			cfg.Iterations = 20
			cfg.Duration = 200 * time.Millisecond
			if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
				cfg.RedisAddr = a
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rep, err := httpbench.Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{httpbench.SDK, httpbench.HTTP, httpbench.Bare, httpbench.Floor} {
				r := rep.Find(path)
				if r == nil {
					t.Fatalf("no result for %s", path)
				}
				if r.Uncontended == 0 || r.Ops == 0 {
					t.Errorf("%s completed %d uncontended and %d throughput operations; want some of each (first error: %v)",
						path, r.Uncontended, r.Ops, r.FirstErr)
				}
				// Under load: the pairs timed, and the HTTP paths' handlers.
				if r.PairTime <= 0 || (r.HandlerTime > 0) != (path != httpbench.SDK) || r.HandlerTime >= r.PairTime {
					t.Errorf("%s: pairs %s, handlers %s under load: want both over HTTP, handlers less, pairs only in the SDK path", path, r.PairTime, r.HandlerTime)
				}
				// The split: each request timed, and the HTTP paths' requests
				// seen by their server's handler.
				for _, st := range []httpbench.Step{r.Acquire, r.Release} {
					served := st.ToServer > 0 && st.InServer > 0 && st.Back > 0
					if st.Call <= 0 || served != (path != httpbench.SDK) {
						t.Errorf("%s: split %+v: want a call time, and parts only over HTTP", path, st)
					}
				}
			}
			if len(rep.Checks) != cfg.Checks {
				t.Fatalf("%d check acquisitions, want %d", len(rep.Checks), cfg.Checks)
			}
			paths := map[string]bool{}
			for i, c := range rep.Checks {
				paths[c.Path] = true
				if c.Token == 0 || (i > 0 && c.Token <= rep.Checks[i-1].Token) {
					t.Errorf("check %d (%s): token %d after %d, want strictly increasing", i, c.Path, c.Token, rep.Checks[max(i-1, 0)].Token)
				}
			}
			if !paths[httpbench.SDK] || !paths[httpbench.HTTP] {
				t.Errorf("check acquisitions by %v, want both paths", paths)
			}
			var buf bytes.Buffer
			if err := httpbench.Write(&buf, rep); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"Bound for any request-per-operation HTTP API", "HTTP above the SDK, per pair: the transport", "HTTP bare÷SDK", "under load", "in the handlers"} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("the report lacks %q", want)
				}
			}
			t.Log("\n" + buf.String())
		})
	}
}

// TestOnly measures the paths -only names, and still checks the tokens of
// SDK and HTTP.
func TestOnly(t *testing.T) {
	cfg := httpbench.ShortConfig()
	cfg.Iterations, cfg.Rounds, cfg.Duration = 10, 1, 100*time.Millisecond
	if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
		cfg.RedisAddr = a
	}
	cfg.Only = []string{httpbench.PathNamed("floor"), httpbench.PathNamed("sdk")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := httpbench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rep.Results {
		got = append(got, r.Path)
	}
	if strings.Join(got, ",") != httpbench.SDK+","+httpbench.Floor {
		t.Errorf("paths measured %q, want SDK and HTTP floor", got)
	}
	if len(rep.Checks) != cfg.Checks {
		t.Errorf("%d check acquisitions, want %d", len(rep.Checks), cfg.Checks)
	}
	cfg.Only = []string{"HTTP2"}
	if _, err := httpbench.Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), `only "HTTP2"`) {
		t.Errorf("-only HTTP2: err %v, want it refused by name", err)
	}
}
