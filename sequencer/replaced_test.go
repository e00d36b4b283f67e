package sequencer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// Defect 159: a sequencer that runs while etcd is replaced by a new, empty
// cluster kept the floor (offset, mod revision) it had read from the old
// one. The new cluster's floor, set by its first Txn or by the documented
// step, is its first write: mod revision 2 again, as the old one's if never
// raised. The guard ModRevision(floor) == 2 held, and the running process
// issued tokens with the old cluster's offset, below those another process
// had issued on the new cluster.
func TestReplacedClusterFloorOfTheSameModRevision(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		step      string
		oldGrants int // grants by another process on the old cluster, after the running one's
	}{{"auto EnsureFloor", 0}, {"admin raise-floor", 0}, {"admin raise-floor", 200}} {
		step := c.step
		t.Run(fmt.Sprintf("%s, %d old grants", step, c.oldGrants), func(t *testing.T) {
			t.Parallel()
			e1, direct := testenv.Etcd(t)
			ctx := t.Context()
			p, pcli := testenv.EtcdThroughProxy(t, e1)
			running := newSeq(t, pcli) // a fenced that stays up
			old, err := running.Next(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if c.oldGrants > 0 { // an idle fenced node follows the others' grants
				busy := newSeq(t, direct)
				for range c.oldGrants {
					if _, err := busy.Next(ctx, "x"); err != nil {
						t.Fatal(err)
					}
				}
				busy.Close()
			}
			r1, err := direct.Get(ctx, "/fenced/floor")
			if err != nil {
				t.Fatal(err)
			}

			// etcd is replaced by a new, empty cluster at the same address.
			testenv.StopEtcdBehind(p, e1, direct)
			e2, cli2 := testenv.Etcd(t)
			if step == "admin raise-floor" {
				if _, err := sequencer.RaiseFloor(ctx, cli2, "", 0); err != nil {
					t.Fatal(err)
				}
			}
			// Another fenced, started on the new cluster, grants "x" 20 times.
			other := newSeq(t, cli2)
			var max fence.Token
			for range 20 + c.oldGrants {
				tok, err := other.Next(ctx, "x")
				if err != nil {
					t.Fatal(err)
				}
				max = tok
			}
			r2, err := cli2.Get(ctx, "/fenced/floor")
			if err != nil {
				t.Fatal(err)
			}
			if r1.Kvs[0].ModRevision != r2.Kvs[0].ModRevision {
				t.Fatalf("the floors' mod revisions differ (%d, %d): the test no longer sets up the coincidence", r1.Kvs[0].ModRevision, r2.Kvs[0].ModRevision)
			}
			t.Logf("old floor key: value %s modrev %d; new floor key: value %s modrev %d", r1.Kvs[0].Value, r1.Kvs[0].ModRevision, r2.Kvs[0].Value, r2.Kvs[0].ModRevision)

			// The running fenced now reaches the new cluster.
			testenv.PointAt(p, e2)
			tok, err := running.Next(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("running fenced: token %d before the replacement; other fenced on the new cluster: up to %d; running fenced after: %d", uint64(old), uint64(max), uint64(tok))
			if tok <= max {
				t.Fatalf("token %d for \"x\" is not above %d, granted for \"x\" on the new cluster before this call began (by %d)", uint64(tok), uint64(max), uint64(max-tok))
			}
			running.Close()
			other.Close()
		})
	}
}

// Defect 160: a follower counted the revisions it saw on the counter key
// with the floor offset it had cached, not the one they were issued with.
// After a RaiseFloor it took no part in (here with a --min-token above the
// clock, as the docs advise), its highest token seen was far below the
// real one, and the floor it raised itself on noticing a restore was too
// low: it then issued tokens below those issued before the restore.
func TestFollowerCountsOthersTokensWithTheirOffset(t *testing.T) {
	t.Parallel()
	e, direct := testenv.Etcd(t)
	ctx := t.Context()
	p, pcli := testenv.EtcdThroughProxy(t, e)
	running := newSeq(t, pcli) // a fenced that runs through the restore
	if _, err := running.Next(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	other := newSeq(t, testenv.EtcdClient(t, e.ClientURL()))
	if _, err := other.Next(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	snap := testenv.SaveEtcdSnapshot(t, e)
	// The operator raises the floor with the highest token resources have seen.
	min := fence.Token(uint64(time.Now().UnixMicro()) + 1e12)
	if _, err := sequencer.RaiseFloor(ctx, direct, "", min); err != nil {
		t.Fatal(err)
	}
	var max fence.Token
	for range 20 {
		tok, err := other.Next(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		max = tok
	}
	// Wait until the running process has seen every counter write.
	r, err := direct.Get(ctx, "/fenced/counter")
	if err != nil {
		t.Fatal(err)
	}
	lastRev := r.Kvs[0].ModRevision
	testenv.WaitUntil(t, 10*time.Second, func() bool { return running.Highest() >= sequencer.Token(lastRev, 0) })
	t.Logf("highest issued: %d; the running process believes the highest is %d", uint64(max), uint64(running.Highest()))

	other.Close()
	testenv.StopEtcdBehind(p, e, direct)
	e2 := testenv.RestoreEtcd(t, snap)
	testenv.PointAt(p, e2)
	// Its first calls may meet the connections cut.
	var tok fence.Token
	testenv.WaitUntil(t, 20*time.Second, func() bool {
		tok, err = running.Next(ctx, "x")
		return err == nil
	})
	t.Logf("running process after the restore: token %d", uint64(tok))
	if tok <= max {
		t.Fatalf("token %d for \"x\" after the restore, not above %d issued for \"x\" before it (short by %d)", uint64(tok), uint64(max), uint64(max-tok))
	}
	running.Close()
}
