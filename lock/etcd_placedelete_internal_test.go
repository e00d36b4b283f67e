package lock

import (
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defect 168: the deletes of a place (Leave, and the store's deletes of
// orphaned places) were unconditional, so one that committed late, after
// the slot's key was made again by the store's next waiter, deleted that
// waiter's place. deletePlaces deletes a key only at the create revision
// it was given, or, where it was given none (a join whose reply was lost),
// at the one it reads first. Here a delete at the place's old revision
// stands for the late one: it must leave the key made again alone.
func TestEtcdPlaceDeletedOnlyAtItsRevision(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s, err := NewEtcdStore(cli, WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	sk := slotKey{"lock", 0}
	key := s.queueKey(sk.name, sk.slot)
	put := func() int64 {
		resp, err := cli.Put(ctx, key, "1")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	exists := func() (int64, bool) {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0, false
		}
		return resp.Kvs[0].CreateRevision, true
	}
	var dealt []slotKey
	done := func(d []slotKey) { dealt = append(dealt, d...) }

	old := put()
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	again := put() // the next waiter's place, at the same key

	// The late delete of the first place: it deletes nothing.
	if err := s.deletePlaces(ctx, []slotKey{sk}, []int64{old}, done); err != nil {
		t.Fatal(err)
	}
	if rev, ok := exists(); !ok || rev != again {
		t.Fatalf("after a delete at revision %d: key at %d, present %v; want the place made at %d kept", old, rev, ok, again)
	}
	// Its own delete, and one whose revision is read first, delete it.
	if err := s.deletePlaces(ctx, []slotKey{sk}, []int64{again}, done); err != nil {
		t.Fatal(err)
	}
	if _, ok := exists(); ok {
		t.Fatal("a delete at the place's own revision left it")
	}
	put()
	if err := s.deletePlaces(ctx, []slotKey{sk}, []int64{0}, done); err != nil {
		t.Fatal(err)
	}
	if _, ok := exists(); ok {
		t.Fatal("a delete whose revision was read first left the place")
	}
	// A key found gone is dealt with too.
	if err := s.deletePlaces(ctx, []slotKey{sk}, []int64{0}, done); err != nil {
		t.Fatal(err)
	}
	if len(dealt) != 4 {
		t.Fatalf("dealt with %d deletes, want 4", len(dealt))
	}

	// Many orphans, some known, some not, across Txns of the store's
	// bound (two operations each).
	s.maxOps.Store(4)
	var keys []slotKey
	var revs []int64
	for i := range 7 {
		k := slotKey{"many", i}
		resp, err := cli.Put(ctx, s.queueKey(k.name, k.slot), "1")
		if err != nil {
			t.Fatal(err)
		}
		rev := resp.Header.Revision
		if i%2 == 0 {
			rev = 0
		}
		keys, revs = append(keys, k), append(revs, rev)
	}
	dealt = nil
	if err := s.deletePlaces(ctx, keys, revs, done); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, s.ks.QueuePrefix("many"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 || len(dealt) != 7 {
		t.Fatalf("%d places left of 7, %d dealt with", resp.Count, len(dealt))
	}
}
