package sequencer_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// onAProxiedCluster is a sequencer with a client of every member of a
// three-member cluster whose members reach each other through proxies.
func onAProxiedCluster(t *testing.T) ([]*sequencer.Embedded, []*faultproxy.Proxy, *sequencer.Etcd) {
	members, peers := testenv.EtcdClusterProxied(t, 3)
	seq, err := sequencer.NewEtcd(testenv.ClusterClient(t, members), sequencer.WithPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	return members, peers, seq
}

// TestPingAndTokensWithAMemberCutOff: with one etcd member of three cut
// off from the others (testenv.Isolate) and known to have no leader, a
// client of all three still gets tokens and a ready answer every time: a
// readiness probe that failed a third of the time would take a healthy
// fenced out of service. Before, a third of the Txns failed "no leader"
// (defect 107).
func TestPingAndTokensWithAMemberCutOff(t *testing.T) {
	t.Parallel()
	members, peers, seq := onAProxiedCluster(t)
	k, _ := testenv.CutOffAFollower(t, members, peers)
	for i := range 30 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if err := seq.Ping(ctx); err != nil {
			t.Fatalf("ping %d, member %d cut off: %v", i, k, err)
		}
		if _, err := seq.Next(ctx, "n"); err != nil {
			t.Fatalf("token %d, member %d cut off: %v", i, k, err)
		}
		cancel()
	}
}

// TestPingWhileACutMemberNotices: in the second after a member is cut off
// from its peers, before it notices it has no leader, it takes reads and
// holds them. A readiness check sent there must still answer within a
// probe's bound (fenced's --ready-timeout, 800 ms): the read is sent again
// to another member (defect 109). Before, a ping that met the member
// failed at the bound, and a probe took a healthy fenced out of service.
func TestPingWhileACutMemberNotices(t *testing.T) {
	t.Parallel()
	members, peers, seq := onAProxiedCluster(t)
	k := slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return !m.IsLeader() })
	alone := testenv.EtcdClient(t, members[k].ClientURL())
	t.Cleanup(testenv.Isolate(members, peers, k))
	pings := 0
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 800*time.Millisecond)
		err := seq.Ping(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ping %d, member %d cut off and not yet aware: %v", pings, k, err)
		}
		pings++
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		st, err := alone.Status(ctx, members[k].ClientURL())
		cancel()
		if err == nil && st.Leader == 0 {
			break
		}
	}
	t.Logf("%d pings answered before member %d noticed it was cut off", pings, k)
}

// TestReadsSayNoLeader: a member that lost its quorum refuses reads for
// want of a leader. Asked through a client of that member alone (an
// embedded member's node, `fenced admin floor` given one endpoint), the
// readiness check and the floor read must say so at once, not time out:
// clientv3's own Get sends the refused Range again until the caller's
// deadline, and the operator learned "context deadline exceeded" (defect
// 109).
func TestReadsSayNoLeader(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	if _, err := sequencer.RaiseFloor(t.Context(), cli, "", 0); err != nil { // a floor to read
		t.Fatal(err)
	}
	members[1].Close()
	members[2].Close()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := cli.Status(t.Context(), members[0].ClientURL())
		return err == nil && st.Leader == 0
	})
	for what, read := range map[string]func(context.Context) error{
		"ping":       func(ctx context.Context) error { return sequencer.PingEtcd(ctx, cli, "/x") },
		"read floor": func(ctx context.Context) error { _, err := sequencer.ReadFloor(ctx, cli, ""); return err },
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		t0 := time.Now()
		err := read(ctx)
		took := time.Since(t0)
		cancel()
		if !errors.Is(err, rpctypes.ErrNoLeader) || took > 2*time.Second {
			t.Errorf("%s without a leader: %v after %s; want etcd's no-leader error at once", what, err, took.Round(time.Millisecond))
		}
	}
}
