package lock

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// A fair waiter on etcd watches the place just ahead of its own. If that
// place's key is deleted and created again (its store reuses the slot for a
// later waiter) between the waiter choosing it and watching it, the waiter
// must see the place as gone. Before, it watched the later waiter's key,
// which is behind it, and only its backoff (up to 256 ms a round) woke it:
// with the lock free, the whole queue behind it waited too.
func TestEtcdWatchSeesAReusedPlaceAsGone(t *testing.T) {
	s, cli := etcdStore(t)
	ctx := t.Context()
	name := testenv.Name(t)
	attempt := func(waiter string) error {
		id, err := newLeaseID()
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Acquire(ctx, AcquireRequest{Name: name, LeaseID: id, TTL: 5 * time.Second, Waiter: waiter, WaiterTTL: DefaultWaiterTTL})
		return err
	}
	if err := attempt(""); err != nil { // the holder
		t.Fatal(err)
	}
	ahead, behind := strings.Repeat("a", 32), strings.Repeat("b", 32)
	for _, w := range []string{ahead, behind} {
		var held *HeldError
		if err := attempt(w); !errors.As(err, &held) {
			t.Fatalf("waiter %s: %v, want a place in the queue", w[:1], err)
		}
	}
	var (
		mu     sync.Mutex
		reused string
	)
	watchTargetHook = func(key string) {
		mu.Lock()
		defer mu.Unlock()
		if reused != "" || key == s.ks.LockKey(name) {
			return
		}
		reused = key
		// The place ahead ends, and a later waiter takes its slot: the
		// same key, created again.
		if _, err := cli.Delete(ctx, key); err != nil {
			t.Error(err)
		}
		if _, err := cli.Put(ctx, key, strconv.FormatInt(time.Now().UnixMilli(), 10)); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { watchTargetHook = nil })
	ch, stop, err := s.Watch(ctx, name, behind)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mu.Lock()
	key := reused
	mu.Unlock()
	if key == "" {
		t.Fatal("the waiter behind did not choose the place ahead to watch")
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("no signal in 5 s after the place ahead (%s) was reused by a later waiter", key)
	}
}
