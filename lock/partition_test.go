package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// storesOnACluster is a lock client of each store over a three-member etcd
// cluster whose members reach each other through proxies: etcd leases, and
// Redis leases with tokens from that cluster.
func storesOnACluster(t *testing.T) (members []*sequencer.Embedded, peers []*faultproxy.Proxy, names []string, clients []*lock.Client) {
	members, peers = testenv.EtcdClusterProxied(t, 3)
	cli := testenv.ClusterClient(t, members)
	seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	return members, peers, []string{"etcd leases", "Redis leases"}, []*lock.Client{
		newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))),
		newClient(t, newRedisStore(t, testenv.Redis(t), seq)),
	}
}

// pair takes a new lock, refreshes it and releases it.
func pair(ctx context.Context, t *testing.T, c *lock.Client, refresh bool) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l, err := c.TryAcquire(ctx, testenv.Name(t), 5*time.Second)
	if err != nil {
		return err
	}
	if refresh {
		err = l.Refresh(ctx, 5*time.Second)
	}
	return errors.Join(err, l.Release(ctx))
}

// TestEtcdMemberCutOffFromItsPeers: one etcd member of three is cut off
// from the other two, both ways, while this client still reaches all
// three. The two keep a quorum; the third has no leader and refuses what
// is sent to it ("no leader"). Nothing of it may show: locks of both
// stores are taken, refreshed and released. Before, every Txn and write
// the client's balancer gave that member failed, whether it took tokens
// (every store) or leases (etcd): a third of the pairs or all of them
// (defect 107).
func TestEtcdMemberCutOffFromItsPeers(t *testing.T) {
	t.Parallel() // an election to wait out: a second or two
	members, peers, names, clients := storesOnACluster(t)
	k, _ := testenv.CutOffAFollower(t, members, peers)
	for i, c := range clients {
		const pairs = 60
		failed := 0
		for range pairs {
			if err := pair(t.Context(), t, c, true); err != nil {
				if failed == 0 {
					t.Errorf("%s, member %d cut off: %v", names[i], k, err)
				}
				failed++
			}
		}
		if failed > 0 {
			t.Errorf("%s: %d of %d acquire, refresh and release failed", names[i], failed, pairs)
		}
	}
}

// TestEtcdMemberCutOffUnderLoad: the member is cut off while locks are
// taken and released without pause, so it takes requests before it
// notices it has no leader, and holds them unanswered for etcd's request
// timeout (6 s with this cluster's timing). Those requests' callers wait
// for it, and fail "request timed out" (a write etcd cannot say it did
// not apply); nothing else may wait for them. Before, the stores' and the
// sequencer's batches waited behind a batch so held, so every lock call
// of the process stopped for those seconds, and a lock kept alive whose
// refresh was so held was lost at its deadline (defect 108). Now a batch
// unanswered for etcdkv.Stall no longer holds the next, and a keep-alive
// refresh unanswered in half the time left is sent again.
func TestEtcdMemberCutOffUnderLoad(t *testing.T) {
	t.Parallel() // etcd's request timeout to wait out: 6 s
	members, peers, names, clients := storesOnACluster(t)
	kept := make([]*lock.Lease, len(clients))
	for i, c := range clients {
		var err error
		if kept[i], err = c.Acquire(t.Context(), testenv.Name(t), 3*time.Second, lock.WithKeepAlive()); err != nil {
			t.Fatal(err)
		}
	}

	// Eight callers a store, each with at most one pair in flight; since
	// records when that pair began (0: none in flight).
	const callers = 8
	type failure struct {
		began time.Time
		err   error
	}
	var (
		since    [2][callers]atomic.Int64
		mu       sync.Mutex
		failures [2][]failure
		wg       sync.WaitGroup
	)
	ctx, stop := context.WithCancel(t.Context())
	for i, c := range clients {
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					began := time.Now()
					since[i][g].Store(began.UnixNano())
					err := pair(context.WithoutCancel(ctx), t, c, false)
					since[i][g].Store(0)
					if err != nil {
						mu.Lock()
						failures[i] = append(failures[i], failure{began, err})
						mu.Unlock()
					}
				}
			}()
		}
	}
	k, noLeader := testenv.CutOffAFollower(t, members, peers)

	// Each store's prober makes pairs while callers' pairs begun before
	// the member knew it had no leader are still held by it.
	var probers sync.WaitGroup
	held := make([]int, len(clients))
	for i, c := range clients {
		probers.Add(1)
		go func() {
			defer probers.Done()
			for range 20 {
				if err := pair(t.Context(), t, c, true); err != nil {
					t.Errorf("%s, member %d cut off, with pairs held by it: %v", names[i], k, err)
					return
				}
			}
			for g := range callers {
				if b := since[i][g].Load(); b != 0 && b < noLeader.UnixNano() {
					held[i]++
				}
			}
		}()
	}
	probers.Wait()
	stop()
	wg.Wait()
	t.Logf("member %d cut off: 20 pairs of each store done while %v of its %d callers' pairs were held by it (etcd leases, Redis leases)", k, held, callers)
	if held[0]+held[1] == 0 {
		t.Errorf("no pair begun before the cut member knew it had no leader was still held by it once the probers were done: the probers waited for them, or it held none")
	}

	for i := range clients {
		for _, f := range failures[i] {
			// Pairs the member held may fail: what it took it answers
			// with a timeout, after which a Redis lease may be gone.
			if f.began.After(noLeader) {
				t.Errorf("%s: a pair begun %v after member %d knew it had no leader failed: %v", names[i], f.began.Sub(noLeader), k, f.err)
			}
		}
		if st, err := clients[i].Inspect(t.Context(), kept[i].Name()); err != nil || st.LeaseID != kept[i].ID() || kept[i].Err() != nil {
			t.Errorf("%s: the lock kept alive across the cut: %+v, %v, Err %v", names[i], st, err, kept[i].Err())
		}
	}
}
