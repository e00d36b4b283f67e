package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// Defect 145: a Redis paused past an acquisition's end runs its acquire
// script when it resumes, after the abandon the failed call started, which
// had found no lease to free. The lease the script took then held the
// lock, known to nobody, for its whole TTL (30 s here).
func TestAcquireRunLateTakesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) ([]*testenv.RedisProc, lock.LeaseStore)
	}{
		{"redis", func(t *testing.T) ([]*testenv.RedisProc, lock.LeaseStore) {
			r := testenv.StartRedis(t)
			return []*testenv.RedisProc{r}, newRedisStore(t, boundedClient(t, r), newSequencer(t))
		}},
		{"redlock", func(t *testing.T) ([]*testenv.RedisProc, lock.LeaseStore) {
			procs := []*testenv.RedisProc{testenv.StartRedis(t), testenv.StartRedis(t), testenv.StartRedis(t)}
			clients := make([]redis.UniversalClient, len(procs))
			for i, p := range procs {
				clients[i] = boundedClient(t, p)
			}
			s, err := lock.NewRedlockStore(clients, newSequencer(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return procs, s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			procs, s := tc.start(t)
			c, other := newClient(t, s), newClient(t, s)
			ctx := t.Context()
			name := testenv.Name(t)
			// The scripts loaded, the connections made, the first token
			// taken: the attempt below is sent at once.
			warmUp(t, s)
			for _, p := range procs {
				p.Stop()
			}
			paused := true
			defer func() {
				if paused {
					for _, p := range procs {
						p.Cont()
					}
				}
			}()
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := c.Acquire(actx, name, 30*time.Second)
			cancel()
			if err == nil {
				t.Fatal("acquired from a paused Redis")
			}
			// The fault's length: longer than an abandon's one attempt
			// (a second), which gets no answer either.
			time.Sleep(2 * time.Second)
			for _, p := range procs {
				p.Cont()
			}
			paused = false
			resumed := time.Now()
			testenv.WaitUntil(t, 5*time.Second, func() bool {
				l, err := other.TryAcquire(ctx, name, time.Second)
				if err != nil {
					return false
				}
				return l.Release(ctx) == nil
			})
			t.Logf("free %s after Redis resumed", time.Since(resumed).Round(time.Millisecond))
		})
	}
}

// boundedClient is a client of r whose calls end with their context.
func boundedClient(t *testing.T, r *testenv.RedisProc) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// Defect 145, the order that needs the mark: the abandon runs first and
// finds no lease; the attempt's script, run after it, takes nothing, and
// the lock stays free for others.
func TestAbandonedAttemptTakesNothing(t *testing.T) {
	t.Parallel()
	s := redisBackend(t).store.(*lock.RedisStore)
	ctx := t.Context()
	name, id := testenv.Name(t), newID(t)
	if err := s.AbandonLease(ctx, name, id, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if g, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: id, TTL: 30 * time.Second}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the abandoned attempt's acquire, run late: %+v, %v; want not acquired", g, err)
	}
	if st, err := s.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the abandoned attempt ran: %+v, %v; want free", st, err)
	}
	g, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: time.Second})
	if err != nil {
		t.Fatalf("another attempt on the free lock: %v", err)
	}
	if err := s.Release(ctx, name, g.LeaseID, ""); err != nil {
		t.Fatal(err)
	}
}

// Defect 145, an abandon with no answer: the acquire script ran, its reply
// was lost, and Redis refused connections for longer than the abandon's
// one attempt, which failed; the lease then held the lock, known to
// nobody, for its TTL. The abandon tries again until Redis answers.
func TestAbandonTriesAgainUntilRedisAnswers(t *testing.T) {
	t.Parallel()
	pr := newProxiedRedis(t)
	c := newClient(t, pr.store)
	ctx := t.Context()
	name := testenv.Name(t)
	warmUp(t, pr.store)
	lost := pr.proxy.LoseReplyAndRefuse([]byte(scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/acquire.lua")))
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.TryAcquire(actx, name, 30*time.Second)
	cancel()
	<-lost
	if err == nil {
		t.Fatal("acquired with the acquire's reply lost and Redis refused")
	}
	lease := pr.prefix + "{" + name + "}:lease"
	if n, err := pr.direct.Exists(ctx, lease).Result(); err != nil || n != 1 {
		t.Fatalf("lease key: %d, %v; want the lost attempt's", n, err)
	}
	// The fault's length: longer than the abandon's one attempt.
	time.Sleep(1500 * time.Millisecond)
	pr.proxy.Refuse(false)
	testenv.WaitUntil(t, 5*time.Second, func() bool {
		n, err := pr.direct.Exists(ctx, lease).Result()
		return err == nil && n == 0
	})
}
