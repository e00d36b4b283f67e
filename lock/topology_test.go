package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

func newSequencer(t testing.TB) *sequencer.Etcd {
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	return seq
}

func newRedisStore(t *testing.T, rdb redis.UniversalClient, seq sequencer.Sequencer) *lock.RedisStore {
	s, err := lock.NewRedisStore(rdb, seq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestRedisCluster runs locks on a three-master Redis Cluster. Each lock's
// two keys and its scripts must land in one slot (the {name} hash tag), or
// the scripts fail with CROSSSLOT.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	nodes := testenv.StartRedisCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr, nodes[1].Addr, nodes[2].Addr}})
	t.Cleanup(func() { rdb.Close() })
	s := newRedisStore(t, rdb, newSequencer(t))
	c := newClient(t, s)

	slots := map[int64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		name := fmt.Sprint("cluster-lock-", i)
		slot, err := rdb.ClusterKeySlot(t.Context(), "fenced:{"+name+"}:lease").Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot*3/16384] = true // which third of the slot space: one per master
		wg.Add(1)
		go func() {
			defer wg.Done()
			var prev fence.Token
			for j := 0; j < 5; j++ {
				l, err := c.Acquire(context.Background(), name, time.Second, lock.WithWait(10*time.Second))
				if err != nil {
					errs <- err
					return
				}
				if l.Token() <= prev {
					errs <- fmt.Errorf("%s: token %d after %d", name, l.Token(), prev)
				}
				prev = l.Token()
				if err := l.Release(context.Background()); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(slots) < 2 {
		t.Fatalf("all names hashed to one master; the test does not span the cluster")
	}

	// A waiter wakes on release through the cluster's pub/sub.
	ws := &watchSignal{LeaseStore: s, watching: make(chan struct{})}
	c2 := newClient(t, ws)
	a, err := c2.Acquire(t.Context(), "cluster-wake", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c2.Acquire(context.Background(), "cluster-wake", time.Second, lock.WithRetry(lock.LinearBackoff(time.Hour)), lock.WithWait(15*time.Second))
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	<-ws.watching
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter on the cluster: %v", err)
	}
}

// TestRedisSentinel takes locks through a Sentinel-discovered master.
func TestRedisSentinel(t *testing.T) {
	master := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, master)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { rdb.Close() })
	c := newClient(t, newRedisStore(t, rdb, newSequencer(t)))
	a, err := c.Acquire(t.Context(), "sentinel-lock", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(t.Context(), "sentinel-lock", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	if v, err := master.Client().Get(t.Context(), "fenced:{sentinel-lock}:lease").Result(); err != nil || v != a.ID() {
		t.Fatalf("lease on the master: %q, %v; want %s", v, err, a.ID())
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// checkFencedAfterSplit is guarantee 3 after guarantee 2 broke: both holders
// think they hold the lock, and the resource's fence admits only the later.
func checkFencedAfterSplit(t *testing.T, a, b *lock.Lease) {
	t.Helper()
	if a.Err() != nil || time.Now().After(a.Deadline()) {
		t.Fatalf("the first holder no longer thinks it holds the lock (%v): the test shows nothing", a.Err())
	}
	if b.Token() <= a.Token() {
		t.Fatalf("second holder's token %d, want > %d", b.Token(), a.Token())
	}
	resource := fence.NewMemoryStore()
	if err := resource.Admit(t.Context(), "account", b.Token()); err != nil {
		t.Fatal(err)
	}
	if err := resource.Admit(t.Context(), "account", a.Token()); !fence.IsStale(err) {
		t.Fatalf("the first holder's late write: %v, want stale", err)
	}
}

// TestRedisRestartForgetsLease: a Redis without persistence restarts and
// forgets the lease, so two holders hold at once (guarantee 2 is
// best-effort); the tokens still order them.
func TestRedisRestartForgetsLease(t *testing.T) {
	r := testenv.StartRedis(t)
	seq := newSequencer(t)
	c := newClient(t, newRedisStore(t, r.Client(), seq))
	a, err := c.Acquire(t.Context(), "restart", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	b, err := c.TryAcquire(t.Context(), "restart", 30*time.Second)
	if err != nil {
		t.Fatalf("after the restart the lease should be free: %v", err)
	}
	checkFencedAfterSplit(t, a, b)
}

// TestRedisFailoverLosesLease: the replica is paused (SIGSTOP) and cut off
// so it misses the lease write, the master dies, the replica is promoted: a second
// holder gets the lease while the first still holds it.
func TestRedisFailoverLosesLease(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedis(t)
	replica := testenv.StartReplica(t, master)
	rc := replica.Client()
	seq := newSequencer(t)
	before := newClient(t, newRedisStore(t, master.Client(), seq))
	// Freeze the replica and cut its link, so that nothing of the lease can
	// reach it (not even through its socket buffer) before the master dies.
	replica.Stop()
	if err := master.Client().ClientKillByFilter(t.Context(), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	a, err := before.Acquire(t.Context(), "failover", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	master.Kill()
	replica.Cont()
	if err := rc.ReplicaOf(t.Context(), "NO", "ONE").Err(); err != nil {
		t.Fatalf("promote the replica: %v", err)
	}
	after := newClient(t, newRedisStore(t, rc, seq))
	b, err := after.TryAcquire(t.Context(), "failover", 30*time.Second)
	if err != nil {
		t.Fatalf("the promoted replica never saw the lease, so it should be free: %v", err)
	}
	checkFencedAfterSplit(t, a, b)
}

// TestEtcdLeaderChangeDelaysExpiry measures how long a lock whose holder
// stopped refreshing stays taken, with a steady etcd leader and when the
// leader is lost right after the grant, in two cases: the holder's
// process lives on (its store deletes the lock at its deadline), and the
// holder's process died (the lock goes when its session lease expires, and
// etcd renews every lease with its full TTL when a new leader takes over).
// The leader is lost by cutting it off from its peers, not by Close: that
// is etcd's graceful shutdown, which keeps the member leading while it
// waits up to the request timeout for open client streams, and the test
// timed that wait (docs/design.md, "Operating under faults", reports the
// figures). The test checks that the lock is freed in every case.
func TestEtcdLeaderChangeDelaysExpiry(t *testing.T) {
	const ttl = time.Second
	// freed runs one case on a fresh three-member cluster with etcd's
	// default timing, and returns how long after its TTL the lock was free.
	freed := func(loseLeader, processDies bool) time.Duration {
		members, peers := testenv.EtcdClusterProxied(t, 3)
		cli := testenv.ClusterClient(t, members)
		waiterStore, err := lock.NewEtcdStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		defer waiterStore.Close()
		waiters := newClient(t, waiterStore)
		s, err := lock.NewEtcdStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		holder := newClient(t, s)
		name := testenv.Name(t)
		start := time.Now()
		if _, err := holder.Acquire(t.Context(), name, ttl, lock.WithDetached()); err != nil { // nobody refreshes it
			t.Fatal(err)
		}
		if processDies {
			s.Close() // its deadlines are no longer enforced, its session no longer renewed
		}
		if loseLeader {
			k := slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return m.IsLeader() })
			if k < 0 {
				t.Fatal("no leader")
			}
			defer testenv.Isolate(members, peers, k)()
		}
		// etcd answers "no leader" while it elects one: the wait budget
		// rides that out.
		next, err := waiters.Acquire(t.Context(), name, ttl, lock.WithWait(60*time.Second))
		if err != nil {
			t.Fatalf("the lock was not freed (leader lost %v, holder's process died %v): %v", loseLeader, processDies, err)
		}
		next.Release(t.Context())
		return time.Since(start) - ttl
	}
	stopped, stoppedFailover := freed(false, false), freed(true, false)
	died, diedFailover := freed(false, true), freed(true, true)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	t.Logf("a %s lock nobody refreshes is freed after its TTL by: holder alive %s (leader lost: %s); holder's process dead %s (leader lost: %s)",
		ttl, r(stopped), r(stoppedFailover), r(died), r(diedFailover))
}

// TestRedisSentinelFailover: the master dies, Sentinel promotes its
// replica, and the store follows it with no restart. A lease the replica
// had seen is still held there: its holder refreshes it, nobody else gets
// the lock, and after its release the next grant has a higher token.
// (A lease the replica had not seen is lost: TestRedisFailoverLosesLease.)
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedis(t)
	replica := testenv.StartReplica(t, master)
	rc := replica.Client()
	sentinel := testenv.StartSentinel(t, master)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { rdb.Close() })
	seq := newSequencer(t)
	c := newClient(t, newRedisStore(t, rdb, seq))
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key := "fenced:{" + name + "}:lease"
	testenv.WaitUntil(t, 10*time.Second, func() bool { return rc.Get(t.Context(), key).Val() == a.ID() })

	master.Kill()
	var errs []string
	testenv.WaitUntil(t, 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err := a.Refresh(ctx, 30*time.Second)
		if err != nil && len(errs) < 5 {
			errs = append(errs, err.Error())
		}
		return err == nil
	})
	t.Logf("refresh errors during the failover (first 5): %q", errs)
	if role, err := rc.Do(t.Context(), "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("the replica's role after the failover: %v, %v; want master", role, err)
	}
	other := newClient(t, newRedisStore(t, rdb, seq))
	if _, err := other.TryAcquire(t.Context(), name, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another TryAcquire while the lease lives on the new master: %v, want ErrNotAcquired", err)
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatalf("release on the new master: %v", err)
	}
	b, err := other.TryAcquire(t.Context(), name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after the failover, want > %d", b.Token(), a.Token())
	}
	if err := b.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
