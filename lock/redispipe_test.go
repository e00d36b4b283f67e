package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// Concurrent callers' script calls share pipelines, and each still gets
// its own answer: 48 clients acquire and release their own names, and
// every grant, refusal and release is the right one.
func TestRedisCallsSharePipelines(t *testing.T) {
	t.Parallel()
	s := newRedisStore(t, testenv.Redis(t), newSequencer(t))
	c := newClient(t, s)
	base := testenv.Name(t)
	const clients, rounds = 48, 20
	errs := make(chan error, clients*rounds)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s-%d", base, i)
			for range rounds {
				l, err := c.TryAcquire(t.Context(), name, 5*time.Second)
				if err != nil {
					errs <- fmt.Errorf("%s: acquire: %w", name, err)
					return
				}
				// Held: another lease id of the same name is refused.
				if _, err := c.TryAcquire(t.Context(), name, 5*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
					errs <- fmt.Errorf("%s: a second acquire while held: %v, want held", name, err)
				}
				if st, err := c.Inspect(t.Context(), name); err != nil || st.LeaseID != l.ID() || st.Token != l.Token() {
					errs <- fmt.Errorf("%s: inspect %+v, %v; want lease %s token %d", name, st, err, l.ID(), l.Token())
				}
				if err := l.Release(t.Context()); err != nil {
					errs <- fmt.Errorf("%s: release: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := s.Stats()
	if st.Pipelines == 0 || st.Pipelined < 2*st.Pipelines {
		t.Errorf("%+v: no script calls shared a pipeline", st)
	}
	t.Logf("%d script calls, %d of them in %d pipelines", st.Calls, st.Pipelined, st.Pipelines)
}

// A pipeline sends scripts by their SHA; a Redis that does not know one
// (restarted, failed over, or flushed) answers NOSCRIPT, and the call is
// sent again with the script itself, not failed.
func TestRedisPipelineAfterScriptFlush(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	s := newRedisStore(t, rdb, newSequencer(t))
	c := newClient(t, s)
	base := testenv.Name(t)
	for attempt := 0; ; attempt++ {
		if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		before := s.Stats()
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.TryAcquire(t.Context(), fmt.Sprintf("%s-%d-%d", base, attempt, i), 5*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if err := l.Release(t.Context()); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("after SCRIPT FLUSH: %v", err)
		}
		if s.Stats().Pipelines > before.Pipelines {
			return // a pipeline met the flushed scripts, and every call succeeded
		}
		if attempt == 20 {
			t.Fatal("no pipeline in 20 rounds of 32 concurrent callers")
		}
	}
}

// A call returns when its context ends while Redis hangs (frozen with
// SIGSTOP), whether it sends the pipeline or waits for one: several
// callers at once, each with its own deadline.
func TestRedisCallsEndWithTheirContextWhileRedisHangs(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	// The go-redis default (calls bounded by its read timeout) and
	// ContextTimeoutEnabled (a lone call then runs on its caller's
	// goroutine, bounded by its context).
	for _, tc := range []struct {
		name string
		rdb  *redis.Client
	}{
		{"default", r.Client()},
		{"context-timeouts", redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = tc.rdb.Close() }) // a second Close of the default client only errs
			s := newRedisStore(t, tc.rdb, newSequencer(t))
			base := testenv.Name(t)
			id := "0123456789abcdef0123456789abcdef"
			if _, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: base, LeaseID: id, TTL: 30 * time.Second}); err != nil {
				t.Fatal(err)
			}
			r.Stop()
			defer r.Cont()
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d := time.Duration(200+50*i) * time.Millisecond
					ctx, cancel := context.WithTimeout(t.Context(), d)
					defer cancel()
					t0 := time.Now()
					_, err := s.Refresh(ctx, base, id, 30*time.Second, 0)
					if took := time.Since(t0); err == nil || took > d+time.Second {
						t.Errorf("refresh with a %s deadline while Redis hung: %v after %s", d, err, took.Round(time.Millisecond))
					}
				}()
			}
			wg.Wait()
			// A lone call, the case that may run on the caller's goroutine.
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			t0 := time.Now()
			if _, err := s.Refresh(ctx, base, id, 30*time.Second, 0); err == nil || time.Since(t0) > 1200*time.Millisecond {
				t.Errorf("a lone refresh with a 200ms deadline while Redis hung: %v after %s", err, time.Since(t0).Round(time.Millisecond))
			}
		})
	}
}
