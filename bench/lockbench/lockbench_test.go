package lockbench_test

import (
	"bytes"
	"context"
	"os"
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
	want := []string{lockbench.EtcdMutex, lockbench.RedisLock, lockbench.Redsync, lockbench.FencedRedis, lockbench.FencedRedis + lockbench.Unfair, lockbench.FencedRedis + " (inflight 16)", lockbench.FencedEtcd, lockbench.FencedEtcd + lockbench.Unfair}
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
		if r.Errors > 0 {
			t.Logf("%s: %d errors, the first: %v", r.Impl, r.Errors, r.FirstErr)
		}
	}
	var buf bytes.Buffer
	if err := lockbench.Write(&buf, rep); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
}
