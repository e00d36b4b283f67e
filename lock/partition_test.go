package lock_test

import (
	"context"
	"errors"
	"slices"
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

// cutOffAFollower cuts a member that does not lead off from the others
// (testenv.Isolate) and returns once it knows it has no leader, and when
// that was seen.
func cutOffAFollower(t *testing.T, members []*sequencer.Embedded, peers []*faultproxy.Proxy) (k int, noLeader time.Time) {
	k = slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return !m.IsLeader() })
	t.Cleanup(testenv.Isolate(members, peers, k))
	alone := testenv.EtcdClient(t, members[k].ClientURL())
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st, err := alone.Status(ctx, members[k].ClientURL())
		return err == nil && st.Leader == 0
	})
	return k, time.Now()
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
	k, _ := cutOffAFollower(t, members, peers)
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
