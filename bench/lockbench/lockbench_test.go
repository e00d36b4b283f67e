package lockbench_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/bench/lockbench"
)

// TestRun runs every implementation through every scenario, briefly, and
// checks only that each completed operations and that the hot name never
// had two holders at once. Timing decides nothing here.
func TestRun(t *testing.T) {
	cfg := lockbench.ShortConfig()
	cfg.Iterations = 20
	cfg.Duration = 250 * time.Millisecond
	cfg.Inflight = 16 // the optional row runs too
	cfg.Rounds = 2    // and the rotation
	cfg.Expirers = 2
	if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
		cfg.RedisAddr = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := lockbench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{lockbench.EtcdMutex, lockbench.RedisLock, lockbench.Redsync, lockbench.FencedRedis, lockbench.FencedRedis + lockbench.Unfair, lockbench.FencedRedis + " (inflight 16)", lockbench.FencedEtcd, lockbench.FencedEtcd + lockbench.Unfair, lockbench.FencedEtcd + " (inflight 16)"}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(want))
	}
	for i, r := range rep.Results {
		if r.Impl != want[i] {
			t.Errorf("result %d is %q, want %q", i, r.Impl, want[i])
		}
		if r.Uncontended == 0 || r.Ops == 0 || r.Acquisitions == 0 {
			t.Errorf("%s completed %d uncontended, %d throughput and %d hot-name operations; want some of each (first error: %v)",
				r.Impl, r.Uncontended, r.Ops, r.Acquisitions, r.FirstErr)
		}
		if r.PutP50 <= 0 {
			t.Errorf("%s: no etcd Put measured beside the uncontended pairs", r.Impl)
		}
		if r.Handovers != cfg.Expirers*cfg.Rounds {
			t.Errorf("%s: %d expiry handovers, want %d (first error: %v)", r.Impl, r.Handovers, cfg.Expirers*cfg.Rounds, r.FirstErr)
		}
		if r.Handovers > 0 && r.HandoverP99 > cfg.ExpiryTTL {
			t.Errorf("%s: an abandoned lock was handed over %s after its TTL ran out; it must free within about its TTL", r.Impl, r.HandoverP99)
		}
		if r.Waits != r.Acquisitions {
			t.Errorf("%s: %d waits for %d acquisitions of the hot name, want one each", r.Impl, r.Waits, r.Acquisitions)
		}
		if r.RaftWrites == 0 && r.Impl != lockbench.RedisLock && r.Impl != lockbench.Redsync {
			t.Errorf("%s: the throughput scenario moved etcd's Raft index by 0; every token and etcd lock is a Raft write", r.Impl)
		}
		if r.MaxHolders != 1 {
			t.Errorf("%s: %d holders of the hot name at once, want 1", r.Impl, r.MaxHolders)
		}
		// The group commit's line says what its Txns carried: a token a
		// pair on Redis leases, a create and a delete a pair on etcd
		// leases, which it called tokens (twice the tokens issued).
		if r.Txns > 0 {
			perPair, items := float64(r.Batched)/float64(r.Ops), "tokens"
			lo, hi := 0.9, 1.1
			if strings.HasPrefix(r.Impl, lockbench.FencedEtcd) {
				items, lo, hi = "lock operations (creates and deletes)", 1.8, 2.2
			}
			if r.BatchItems != items || perPair < lo || perPair > hi {
				t.Errorf("%s: %d %s in its Txns for %d pairs (%.2f a pair); want %s, %.1f to %.1f a pair", r.Impl, r.Batched, r.BatchItems, r.Ops, perPair, items, lo, hi)
			}
		}
		switch {
		case r.Errors > 0 && strings.HasPrefix(r.Impl, "fenced"):
			// Nothing here is a fault: an error is a defect (one was a
			// lock freed at the deadline of its name's previous holding).
			t.Errorf("%s: %d errors, the first: %v", r.Impl, r.Errors, r.FirstErr)
		case r.Errors > 0:
			t.Logf("%s: %d errors, the first: %v", r.Impl, r.Errors, r.FirstErr)
		}
	}
	var buf bytes.Buffer
	if err := lockbench.Write(&buf, rep); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
}

// TestScaling runs both sweeps of the scaling run, tiny, and checks that
// every point completed operations without errors and that the curves are
// drawn: one line per implementation in each panel, in well-formed SVG.
func TestScaling(t *testing.T) {
	cfg := lockbench.DefaultScalingConfig()
	cfg.Clients, cfg.Window = []int{1, 4}, 200*time.Millisecond
	cfg.Held, cfg.HeldTTL, cfg.HeldWindow = []int{5, 50}, 3*time.Second, 300*time.Millisecond
	if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
		cfg.RedisAddr = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := lockbench.RunScaling(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := len(lockbench.ScalingImpls)
	if len(rep.Clients) != len(cfg.Clients)*n || len(rep.Held) != len(cfg.Held)*n {
		t.Fatalf("%d client points and %d held points, want %d and %d", len(rep.Clients), len(rep.Held), len(cfg.Clients)*n, len(cfg.Held)*n)
	}
	for _, p := range rep.Clients {
		if p.Ops == 0 || p.Errors > 0 || p.P99 < p.P50 {
			t.Errorf("%s with %d clients: %d ops, p50 %s, p99 %s, %d errors (first: %v)", p.Impl, p.Clients, p.Ops, p.P50, p.P99, p.Errors, p.FirstErr)
		}
	}
	for _, p := range rep.Held {
		if p.Errors > 0 || p.Acquire <= 0 {
			t.Errorf("%s holding %d: took %s, %d errors (first: %v)", p.Impl, p.Held, p.Acquire, p.Errors, p.FirstErr)
		}
		if p.Allocs == 0 { // the process (embedded etcd, keep-alives) always allocates
			t.Errorf("%s holding %d: no allocations counted over the window", p.Impl, p.Held)
		}
	}
	dir := t.TempDir()
	paths, err := lockbench.WriteScalingSVGs(dir, rep)
	if err != nil || len(paths) != 2 {
		t.Fatalf("SVGs %q: %v", paths, err)
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(bytes.NewReader(b))
		lines := 0
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s is not well-formed: %v", path, err)
			}
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
				lines++
			}
		}
		if lines < 2*n { // three panels, one line per implementation; a panel of all-zero values on a log scale may lack some
			t.Errorf("%s has %d lines, want at least %d", path, lines, 2*n)
		}
	}
	var buf bytes.Buffer
	if err := lockbench.WriteScaling(&buf, rep); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
}
