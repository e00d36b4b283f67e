package sequencer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defect 3: a full batch must never exceed what etcd accepts in one Txn
// (--max-txn-ops, 128 by default). Before the fix a batch of 127 names or
// more failed as a whole, and every caller in it got the error.
func TestFullBatchNeverFails(t *testing.T) {
	_, cli := testenv.Etcd(t) // etcd's default --max-txn-ops, 128
	s := newSeq(t, cli, sequencer.WithMaxBatch(1000))
	const callers = 2000
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := make(chan struct{})
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := s.Next(t.Context(), fmt.Sprint("n-", i)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d callers failed, first: %v", len(errs), callers, errs[0])
	}
	st := s.Stats()
	if st.Grants != callers || st.Txns >= callers {
		t.Fatalf("stats %+v: want %d grants in fewer Txns (batched)", st, callers)
	}
	t.Logf("%d grants in %d Txns", st.Grants, st.Txns)
}

// Hazard: a library user on a fresh cluster must not get tokens from 1
// again; the sequencer sets the floor itself.
func TestSequencerSetsTheFloorOnAFreshCluster(t *testing.T) {
	_, cli := testenv.Etcd(t)
	before := fence.Token(time.Now().UnixMicro())
	s := newSeq(t, cli)
	tok, err := s.Next(t.Context(), "n")
	if err != nil {
		t.Fatal(err)
	}
	if tok <= before {
		t.Fatalf("first token on a fresh cluster %d: want above the clock floor %d", tok, before)
	}
}

// Hazard: ReadFloor with "" reads the default prefix's floor, as RaiseFloor
// and EnsureFloor write it.
func TestReadFloorDefaultPrefix(t *testing.T) {
	_, cli := testenv.Etcd(t)
	raised, err := sequencer.RaiseFloor(t.Context(), cli, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := sequencer.ReadFloor(t.Context(), cli, "")
	if err != nil || f.Offset != raised.Offset {
		t.Fatalf("ReadFloor(\"\"): %+v, %v; RaiseFloor(\"\") set offset %d", f, err, raised.Offset)
	}
	f, err = sequencer.ReadFloor(t.Context(), cli, sequencer.DefaultPrefix)
	if err != nil || f.Offset != raised.Offset {
		t.Fatalf("ReadFloor(DefaultPrefix): %+v, %v", f, err)
	}
}

// Bounded state: tokens for many distinct names leave no key per name.
func TestNoKeyPerName(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	keys := func() int64 {
		r, err := cli.Get(t.Context(), "", clientv3.WithFromKey(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	if _, err := s.Next(t.Context(), "warm"); err != nil {
		t.Fatal(err)
	}
	base := keys()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				if _, err := s.Next(context.Background(), fmt.Sprint("order-", w, "-", i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := keys(); n != base {
		t.Fatalf("etcd holds %d keys after 1600 names, %d before: a key per name", n, base)
	}
}
