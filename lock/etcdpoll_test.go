package lock_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// TestEtcdWaitersBehindTheHeadAreAnsweredByReads: a fair waiter behind the
// head of a queue attempts once a second only to learn its place (its key
// lives on a session the store renews), so while it stays behind it is
// answered by a read, not a create: 256 waiters on one lock were 256 Raft
// writes a second (docs/design.md, "Waiting"). The head's attempts stay
// creates; a waiter told it is now the head takes the lock once it is free;
// one whose place is gone joins again; a closed store says so.
func TestEtcdWaitersBehindTheHeadAreAnsweredByReads(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	ctx, name := t.Context(), testenv.Name(t)
	holder := newID(t)
	if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: holder, TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	attempt := func(waiter string) (lock.Grant, int, error) {
		t.Helper()
		g, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: 5 * time.Second, Waiter: waiter, WaiterTTL: 10 * time.Second})
		var held *lock.HeldError
		if errors.As(err, &held) {
			return g, held.Position, nil
		}
		return g, 0, err
	}
	wantPlace := func(what, waiter string, want int) {
		t.Helper()
		if _, pos, err := attempt(waiter); err != nil || pos != want {
			t.Fatalf("%s: place %d (%v), want %d", what, pos, err, want)
		}
	}
	w := []string{newID(t), newID(t), newID(t)}
	for i, id := range w {
		wantPlace("joining", id, i+1)
	}

	before := s.Stats()
	for range 3 {
		wantPlace("the second waiter again", w[1], 2)
		wantPlace("the third waiter again", w[2], 3)
	}
	after := s.Stats()
	if txns, reads := after.Txns-before.Txns, after.Reads-before.Reads; txns != 0 || reads != 6 {
		t.Fatalf("6 attempts of waiters behind the head: %d write Txns and %d reads, want 0 and 6", txns, reads)
	}
	wantPlace("the head again", w[0], 1)
	if txns := s.Stats().Txns - after.Txns; txns != 1 {
		t.Fatalf("an attempt of the head: %d write Txns, want 1 (a create)", txns)
	}

	// The head leaves: the second learns it heads the queue, and takes
	// the lock once it is free.
	if err := s.Leave(ctx, name, w[0]); err != nil {
		t.Fatal(err)
	}
	wantPlace("the second, now the head", w[1], 1)
	if err := s.Release(ctx, name, holder, ""); err != nil {
		t.Fatal(err)
	}
	g, pos, err := attempt(w[1])
	if err != nil || g.Token == 0 {
		t.Fatalf("the head's attempt on the free lock: place %d, %v; want the lock", pos, err)
	}

	// The third waiter's place goes (as when its session lease expired):
	// its next attempt joins the queue again rather than report a place it
	// lost.
	if _, err := cli.Delete(ctx, sequencer.NewKeyspace(prefix).QueuePrefix(name), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	second := newID(t)
	wantPlace("another waiter joining", second, 1)
	if _, pos, err := attempt(w[2]); err != nil || pos != 0 {
		t.Fatalf("the waiter whose place went: place %d (%v), want none known (the create finds it gone)", pos, err)
	}
	wantPlace("the waiter whose place went, joining again", w[2], 2)
	reads := s.Stats().Reads
	wantPlace("the waiter joined again, behind", w[2], 2)
	if s.Stats().Reads != reads+1 {
		t.Fatal("the waiter joined again behind the head was not answered by a read")
	}

	// A closed store says so to a waiter behind the head too, though etcd
	// would answer its read (docs/design.md, defect 259).
	s.Close()
	if _, pos, err := attempt(w[2]); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("the waiter behind, after Close: place %d, %v; want ErrClosed", pos, err)
	}
}
