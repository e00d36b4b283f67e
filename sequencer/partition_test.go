package sequencer_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// TestPingAndTokensWithAMemberCutOff: with one etcd member of three cut
// off from the others (testenv.Isolate) and known to have no leader, a
// client of all three still gets tokens and a ready answer every time: a
// readiness probe that failed a third of the time would take a healthy
// fenced out of service. Before, a third of the Txns failed "no leader"
// (defect 107).
func TestPingAndTokensWithAMemberCutOff(t *testing.T) {
	t.Parallel()
	members, peers := testenv.EtcdClusterProxied(t, 3)
	cli := testenv.ClusterClient(t, members)
	seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
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
