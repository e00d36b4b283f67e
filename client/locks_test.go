package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestOwnerHolderListForceRelease: the client carries the owner, the
// reentrant holder and the wait's outcome as lock.Client does, and lists
// and force-releases through the server.
func TestOwnerHolderListForceRelease(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	ctx := t.Context()
	prefix := testenv.Name(t) + ":"

	a, err := c.TryAcquire(ctx, prefix+"a", 5*time.Second, lock.WithOwner("job 7 on host-a"), lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.TryAcquire(ctx, prefix+"a", 5*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != a.ID() || again.Token() != a.Token() || again.Count() != 2 {
		t.Fatalf("reentered: id %s token %d count %d; want %s, %d, 2", again.ID(), again.Token(), again.Count(), a.ID(), a.Token())
	}
	st, err := c.Inspect(ctx, prefix+"a")
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != prefix+"a" || st.Owner != "job 7 on host-a" || st.Holder != "" || st.Count != 2 || st.Token != a.Token() {
		t.Fatalf("Inspect: %+v; want the owner and count 2, and no holder (the server never shows it)", st)
	}

	// A waiter that gives up learns how long it waited and its place.
	_, err = c.Acquire(ctx, prefix+"a", 5*time.Second, lock.WithWait(300*time.Millisecond))
	var we *lock.WaitError
	if !errors.As(err, &we) || !errors.Is(err, lock.ErrNotAcquired) || we.Waited < 300*time.Millisecond || we.Position != 1 || we.Name != prefix+"a" {
		t.Fatalf("Acquire after its wait: %v (%+v); want a *lock.WaitError with position 1", err, we)
	}

	for i := range 3 {
		if _, err := c.TryAcquire(ctx, fmt.Sprintf("%sb%d", prefix, i), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	seen, cursor := map[string]bool{}, ""
	for range 10 {
		page, err := c.List(ctx, prefix, 2, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Locks {
			seen[s.Name] = true
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if len(seen) != 4 || !seen[prefix+"a"] || !seen[prefix+"b2"] {
		t.Fatalf("listed %v, want the 4 locks under %s", seen, prefix)
	}
	if _, err := c.List(ctx, prefix, 0, ""); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("List with limit 0: %v", err)
	}

	removed, err := c.ForceRelease(ctx, prefix+"a")
	if err != nil {
		t.Fatal(err)
	}
	if !removed.Held || removed.Token != a.Token() || removed.Owner != "job 7 on host-a" {
		t.Fatalf("ForceRelease answered %+v", removed)
	}
	if err := a.Refresh(ctx, 5*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("refresh of a force-released lease: %v, want lock.ErrLost", err)
	}
	if st, err := c.ForceRelease(ctx, prefix+"a"); err != nil || st.Held {
		t.Fatalf("ForceRelease of a free lock: %+v, %v; want Held false and no error", st, err)
	}
	next, err := c.TryAcquire(ctx, prefix+"a", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= a.Token() {
		t.Fatalf("token %d after force-release, not above %d", next.Token(), a.Token())
	}
	if err := next.Release(context.WithoutCancel(ctx)); err != nil {
		t.Fatal(err)
	}
}

// TestForceReleaseThroughAWrongURL: the 404 of a path the server does not
// have is no "not held". Before, a client whose base URL had a wrong path
// (the server is not under /elsewhere) was told every lock was free by
// ForceRelease, and held it stayed.
func TestForceReleaseThroughAWrongURL(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	name := testenv.Name(t)
	held, err := newClient(t, f.url).TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.WithoutCancel(ctx))
	st, err := newClient(t, f.url+"/elsewhere").ForceRelease(ctx, name)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Field != api.FieldPath {
		t.Fatalf("ForceRelease through a base URL with a wrong path: %+v, %v; want the 404 on the path", st, err)
	}
}
