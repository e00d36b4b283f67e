package lock

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced/fenced/internal/testenv"
)

// etcdStore is an etcd lease store on a fresh embedded etcd, under a
// prefix of its own, and its etcd client; closed with the test.
func etcdStore(t *testing.T) (*EtcdStore, *clientv3.Client) {
	t.Helper()
	_, cli := testenv.Etcd(t)
	s, err := NewEtcdStore(cli, WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cli
}

// etcdClient is a lock.Client over a fresh etcdStore, and the store;
// closed with the test.
func etcdClient(t *testing.T) (*Client, *EtcdStore) {
	t.Helper()
	s, _ := etcdStore(t)
	c, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	return c, s
}

// The etcd store's List reads every lock as of one revision. A lock that
// changed hands between its read of the lock keys and its read of their
// info (a key of its own until 2026-12-04; now their counts) was listed
// with the first holder's lease id and the next holder's owner (and token
// offset and count).
func TestEtcdListIsOneSnapshot(t *testing.T) {
	c, s := etcdClient(t)
	ctx := t.Context()
	name := testenv.Name(t)
	first, err := c.Acquire(ctx, name, 5*time.Second, WithOwner("first"))
	if err != nil {
		t.Fatal(err)
	}
	var second *Lease
	listedHook = func() {
		listedHook = nil
		if err := first.Release(ctx); err != nil {
			t.Error(err)
		}
		if second, err = c.Acquire(ctx, name, 5*time.Second, WithOwner("second")); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { listedHook = nil })
	page, err := s.List(ctx, ListRequest{Prefix: name, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if second == nil {
		t.Fatal("the lock did not change hands during List")
	}
	if len(page.Locks) != 1 {
		t.Fatalf("listed %+v, want the one lock", page.Locks)
	}
	got := page.Locks[0]
	if got.LeaseID != first.ID() || got.Owner != "first" || got.Token != first.Token() {
		t.Fatalf("listed lease %s owner %q token %d; want the first holder's as read: %s %q %d (the second is %s %q %d)",
			got.LeaseID, got.Owner, got.Token, first.ID(), "first", first.Token(), second.ID(), "second", second.Token())
	}
}
