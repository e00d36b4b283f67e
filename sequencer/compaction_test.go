package sequencer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/sequencer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEmbeddedCompactsItsHistory: a member keeps only CompactionRetention
// of history. With a second of it, and writes going on, a read at the
// first revision comes to be refused as compacted (with the hour the
// member kept before, not for an hour).
func TestEmbeddedCompactsItsHistory(t *testing.T) {
	ctx := context.Background()
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{Dir: t.TempDir(), UnsafeNoFsync: true, CompactionRetention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	first, err := cli.Put(ctx, "k", "0")
	if err != nil {
		t.Fatal(err)
	}
	// The compactor compacts to a revision it noted a retention ago, and
	// only while revisions move: write until the first is gone.
	waitFor(t, func() bool {
		if _, err := cli.Put(ctx, "k", "1"); err != nil {
			t.Fatal(err)
		}
		_, err := cli.Get(ctx, "k", clientv3.WithRev(first.Header.Revision))
		if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			t.Fatal(err)
		}
		return err != nil
	})
}

// TestEmbedRefusesANegativeRetention: a negative retention is a mistake,
// not the default.
func TestEmbedRefusesANegativeRetention(t *testing.T) {
	_, err := sequencer.StartEmbedded(context.Background(), sequencer.EmbedConfig{Dir: t.TempDir(), CompactionRetention: -time.Minute})
	if err == nil || !strings.Contains(err.Error(), "compaction retention -1m0s: want > 0 (0 means 1m0s)") {
		t.Fatalf("err %v, want the retention refused with what is allowed", err)
	}
}
