package sequencer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newSeq(t *testing.T, cli *clientv3.Client, opts ...sequencer.Option) *sequencer.Etcd {
	t.Helper()
	s, err := sequencer.NewEtcd(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestNextIncreases: every call, a retry included, takes a new token
// larger than the last; the lease store, not the sequencer, keeps the one
// token a lease uses.
func TestNextIncreases(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	ctx := t.Context()
	var prev fence.Token
	for i, name := range []string{"n", "n", "other", "n"} {
		tok, err := s.Next(ctx, name)
		if err != nil || tok <= prev {
			t.Fatalf("call %d (%s): %d, %v; want > %d", i, name, tok, err, prev)
		}
		prev = tok
	}
	if _, err := s.Next(ctx, ""); err == nil {
		t.Fatal("empty name accepted")
	}
}

type grant struct {
	name       string
	tok        fence.Token
	begin, end uint64
}

// checkOrder verifies guarantee 1 on a history: for one name, a grant that
// began after another completed has a larger token, and no token repeats.
func checkOrder(t *testing.T, hist []grant) {
	t.Helper()
	byName := map[string][]grant{}
	for _, g := range hist {
		byName[g.name] = append(byName[g.name], g)
	}
	for name, gs := range byName {
		seen := map[fence.Token]bool{}
		for _, g := range gs {
			if seen[g.tok] {
				t.Fatalf("name %s: token %d issued twice", name, g.tok)
			}
			seen[g.tok] = true
		}
		for _, a := range gs {
			for _, b := range gs {
				if a.end < b.begin && b.tok <= a.tok {
					t.Fatalf("name %s: token %d granted after %d had completed", name, b.tok, a.tok)
				}
			}
		}
	}
}

func TestTokensIncreasePerNameUnderConcurrency(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	const workers, per, names = 48, 40, 6
	var clock atomic.Uint64
	var mu sync.Mutex
	var hist []grant
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				name := fmt.Sprint("name-", (w+i)%names)
				b := clock.Add(1)
				tok, err := s.Next(context.Background(), name)
				e := clock.Add(1)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				hist = append(hist, grant{name, tok, b, e})
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(hist) != workers*per {
		t.Fatalf("%d grants, want %d", len(hist), workers*per)
	}
	checkOrder(t, hist)
	st := s.Stats()
	if st.Grants != uint64(workers*per) {
		t.Fatalf("stats count %d grants, want %d", st.Grants, workers*per)
	}
	t.Logf("%d grants in %d txns", st.Grants, st.Txns)
}

// TestGroupCommitBatches counts transactions against grants: with many
// concurrent callers on distinct names, one transaction carries many grants.
func TestGroupCommitBatches(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli, sequencer.WithInflight(2))
	const workers, per = 64, 30
	var wg sync.WaitGroup
	var failed atomic.Int32
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if _, err := s.Next(context.Background(), fmt.Sprint("gc-", w)); err != nil {
					failed.Add(1)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d callers failed", failed.Load())
	}
	st := s.Stats()
	if st.Grants != workers*per {
		t.Fatalf("grants = %d, want %d", st.Grants, workers*per)
	}
	// With at most 2 transactions in flight and 64 callers, batches must
	// average far more than one grant; 4 leaves room for scheduling noise.
	if st.Txns*4 > st.Grants {
		t.Fatalf("%d grants in %d txns: group commit is not batching", st.Grants, st.Txns)
	}
	t.Logf("%d grants in %d txns (%.1f per txn)", st.Grants, st.Txns, float64(st.Grants)/float64(st.Txns))
}

// TestSameNameNeverSharesATxn sends many concurrent requests for one name:
// each must get its own token, so no two can have shared a transaction.
func TestSameNameNeverSharesATxn(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli, sequencer.WithInflight(1))
	const n = 200
	toks := make([]fence.Token, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tok, err := s.Next(context.Background(), "hot")
			if err == nil {
				toks[i] = tok
			}
		}(i)
	}
	wg.Wait()
	seen := map[fence.Token]bool{}
	for i, tok := range toks {
		if tok == 0 {
			t.Fatalf("request %d failed", i)
		}
		if seen[tok] {
			t.Fatalf("token %d given to two requests for the same name", tok)
		}
		seen[tok] = true
	}
	if st := s.Stats(); st.Txns != n {
		t.Fatalf("%d txns for %d same-name grants, want one each", st.Txns, n)
	}
}

func TestClosedSequencer(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if _, err := s.Next(t.Context(), "n"); !errors.Is(err, sequencer.ErrClosed) {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
}

func TestOptionsRejected(t *testing.T) {
	_, cli := testenv.Etcd(t)
	for _, o := range []sequencer.Option{sequencer.WithMaxBatch(0), sequencer.WithInflight(0), sequencer.WithPrefix(""), sequencer.WithCommitTimeout(0)} {
		if _, err := sequencer.NewEtcd(cli, o); err == nil {
			t.Fatal("invalid option accepted")
		}
	}
	if _, err := sequencer.NewEtcd(nil); err == nil {
		t.Fatal("nil client accepted")
	}
}

func TestNextHonoursContext(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Next(ctx, "n"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context = %v", err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, err := s.Next(ctx, "n"); !errors.Is(err, ctx.Err()) {
		t.Fatalf("Next with an expired context = %v", err)
	}
}

func TestParseEndpoints(t *testing.T) {
	got, err := sequencer.ParseEndpoints("http://a:1, b:2")
	if err != nil || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", " , ", "nohost", "http://", "a:b:c"} {
		if _, err := sequencer.ParseEndpoints(bad); err == nil {
			t.Errorf("ParseEndpoints(%q) accepted", bad)
		}
	}
	// A user and password in an endpoint were taken, and the etcd client
	// connected without them; a refused endpoint's error printed its
	// password (defect 162).
	for _, bad := range []string{"http://bob:hunter2@127.0.0.1:2379", "bob:hunter2@127.0.0.1:2379", "http://bob@127.0.0.1:2379", "ftp://bob:hunter2@h:1", "http://bob:hunter2@h"} {
		_, err := sequencer.ParseEndpoints(bad)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseEndpoints(%q): %v; want it refused without the password", bad, err)
		}
	}
}
