package lock

import (
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// A session that a later acquisition of its TTL class replaced (its
// renewals had failed for a while, so it was not known to outlive a new
// TTL) is still renewed while something is on it: a fair waiter's place
// joined on it stays for as long as the waiter waits (defect 12). Before,
// the store renewed only the session its class's map named, the old one
// expired in etcd, and the waiter's place went with it.
func TestEtcdReplacedSessionIsStillRenewed(t *testing.T) {
	c, s := etcdClient(t)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := c.Acquire(ctx, name, 30*time.Second) // a session of another class
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, name, time.Second, WithWait(20*time.Second))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := s.Inspect(ctx, name)
		return err == nil && st.Waiters == 1
	})
	// The place's session, as after renewals that failed for a while:
	// not known to be valid any longer, the next try due soon.
	var old *session
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		old = s.sessions[sessionTTL(time.Second)]
		if old == nil || old.renewing {
			return false
		}
		old.validUntil, old.nextRenew = time.Now(), time.Now().Add(200*time.Millisecond)
		return true
	})
	id, _ := newLeaseID()
	if _, err := s.Acquire(ctx, AcquireRequest{Name: testenv.Name(t), LeaseID: id, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	replaced := s.sessions[sessionTTL(time.Second)] != old
	s.mu.Unlock()
	if !replaced {
		t.Fatal("the acquisition did not take a new session: the test does not exercise a replaced one")
	}
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		s.mu.Lock()
		renewed := old.validUntil.After(time.Now())
		// The waiter tries again a few times a second, and an attempt
		// joins on the class's session of the moment: once its place
		// moved onto the new one, nothing is left on the old to renew.
		moved := old.users == 0
		s.mu.Unlock()
		if renewed || moved {
			return true
		}
		if r, err := s.cli.TimeToLive(ctx, old.id); err != nil || r.TTL < 0 {
			t.Fatalf("the replaced session, with a waiter's place on it, expired (TTL %v, %v): never renewed again", r.TTL, err)
		}
		return false
	})
	if st, err := s.Inspect(ctx, name); err != nil || st.Waiters != 1 {
		t.Fatalf("after the session was replaced: %+v, %v; want the waiter still in the queue", st, err)
	}
	holder.Release(ctx)
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
}
