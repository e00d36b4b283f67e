package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// A remote acquisition whose grant was lost asks again with its waiter and
// gets the same lease "extended to the TTL asked for" (docs/design.md, "A
// lost answer"): the lease it is handed counts that TTL from the new
// attempt. On Redis leases the script handed the grant back without
// extending it, so the lock expired at the first grant's TTL while its
// holder counted it valid for the new one.
func TestLostGrantFoundAgainIsExtended(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			ctx := t.Context()
			name := testenv.Name(t)
			const w = "00112233445566778899aabbccddeeff"
			remote := []lock.Option{lock.WithWaiter(w), lock.WithWait(time.Second), lock.WithDetached()}
			if _, err := c.Acquire(ctx, name, 5*time.Second, remote...); err != nil {
				t.Fatal(err)
			}
			again, err := c.Acquire(ctx, name, time.Minute, remote...)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Release(ctx)
			st, err := c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// The store's expiry comes after the holder's deadline: the
			// holder counts from before its request, the store from after.
			if valid := time.Until(again.Deadline()); !st.Held || st.Remaining < valid {
				t.Fatalf("found again with a TTL of 1m: the lock has %s left in the store (held %v), the holder counts it valid for %s",
					st.Remaining, st.Held, valid.Round(time.Millisecond))
			}
		})
	}
}

// newSlowRetryProxiedRedis is a proxiedRedis whose go-redis client waits
// half a second before it sends a command again: time for a test to hold
// the proxy's traffic (Hold) once a reply was lost, act through the
// second store (straight to Redis, the same keys: another fenced server)
// and then let the command sent again through.
func newSlowRetryProxiedRedis(t *testing.T) (*proxiedRedis, *lock.RedisStore) {
	t.Helper()
	pr := newProxiedRedisWith(t, func(o *redis.Options) {
		o.MinRetryBackoff, o.MaxRetryBackoff = 500*time.Millisecond, 500*time.Millisecond
	})
	other, err := lock.NewRedisStore(pr.direct, pr.seq, lock.WithRedisPrefix(pr.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return pr, other
}

// sentAgainHeld runs call on its own goroutine with the reply of its first
// call of the script (its files, as scriptSHA takes them) lost, and
// returns once that reply is lost, with the call go-redis sends again held
// in the proxy: the test acts meanwhile, then resume lets the resend
// through and waits for call to return.
func (pr *proxiedRedis) sentAgainHeld(t *testing.T, call func(), script ...string) (resume func()) {
	t.Helper()
	lost := pr.proxy.LoseReply([]byte(scriptSHA(t, pr.direct, script...)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	<-lost
	pr.proxy.Hold(true)
	return func() {
		pr.proxy.Hold(false)
		<-done
	}
}

// A confirm whose reply is lost is sent again by go-redis, after a
// backoff, and a reentry by the same holder through another server (or
// another client of this one) can come in between. The confirm sent again
// wrote the token hash anew, count 1 included, and so took off the
// reentry's hold: the holder's next release freed the lock under the
// other hold, and another client took it (two holders). A confirm of the
// token already recorded now changes nothing.
func TestConfirmSentAgainKeepsAReentry(t *testing.T) {
	t.Parallel()
	pr, other := newSlowRetryProxiedRedis(t)
	c1, c2, c3 := newClient(t, pr.store), newClient(t, other), newClient(t, other)
	ctx := t.Context()
	name := testenv.Name(t)

	var r struct {
		l   *lock.Lease
		err error
	}
	// The confirm ran and its reply was lost; the one sent again waits.
	resume := pr.sentAgainHeld(t, func() {
		r.l, r.err = c1.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1"))
	}, "scripts/confirm.lua")
	again, err := c2.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil || again.Count() != 2 {
		t.Fatalf("reentry while the first confirm's reply is lost: %v, %v", again, err)
	}
	resume()
	if r.err != nil {
		t.Fatalf("the first acquisition, its confirm sent again: %v", r.err)
	}
	if st, err := c1.Inspect(ctx, name); err != nil || st.Count != 2 {
		t.Errorf("after a grant and a reentry, the confirm sent again: %+v, %v; want count 2", st, err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := c3.TryAcquire(ctx, name, 30*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another client while the first hold (token %d) is valid: %v, %v; want ErrNotAcquired", r.l.Token(), l, err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A force-release whose reply is lost is sent again by go-redis; the
// second run finds the lease gone (the first removed it). The store then
// reported that nobody had held the lock: the operator's DELETE answered
// 404 "not held", and its log line named no removed holder, though the
// holder had been removed.
func TestForceReleaseSentAgainReportsTheHolder(t *testing.T) {
	t.Parallel()
	pr := newProxiedRedis(t)
	c := newClient(t, pr.store)
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := c.Acquire(ctx, name, 30*time.Second, lock.WithOwner("billing"))
	if err != nil {
		t.Fatal(err)
	}
	lost := pr.proxy.LoseReply([]byte(scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/force.lua")))
	st, err := c.ForceRelease(ctx, name)
	<-lost
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.LeaseID != l.ID() || st.Token != l.Token() {
		t.Fatalf("force-release after a lost reply: %+v; want the holder removed, lease %s token %d", st, l.ID(), l.Token())
	}
	if after, err := c.Inspect(ctx, name); err != nil || after.Held || after.LastToken != l.Token() {
		t.Fatalf("after the force-release: %+v, %v; want free, last token %d", after, err, l.Token())
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the removed holder's release: %v, want ErrLost", err)
	}
}

// The same, when the lock changed hands before the force-release was sent
// again: the first run woke the next waiter, which took the lock. The run
// sent again removed that holder too, whom no operator had named, and
// reported it as the one removed.
func TestForceReleaseSentAgainSparesTheNextHolder(t *testing.T) {
	t.Parallel()
	pr, other := newSlowRetryProxiedRedis(t)
	c, next := newClient(t, pr.store), newClient(t, other)
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := c.Acquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		st  lock.State
		err error
	}
	// Removed, and the reply lost; the run sent again waits.
	resume := pr.sentAgainHeld(t, func() { r.st, r.err = c.ForceRelease(ctx, name) }, "scripts/prelude.lua", "scripts/force.lua")
	m, err := next.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatalf("the next holder, after the force-release ran: %v", err)
	}
	resume()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.st.LeaseID != l.ID() {
		t.Errorf("force-release sent again reports lease %q removed; want %s, the one held when it was asked (the next holder is %s)", r.st.LeaseID, l.ID(), m.ID())
	}
	if st, err := next.Inspect(ctx, name); err != nil || st.LeaseID != m.ID() {
		t.Fatalf("after the force-release sent again: %+v, %v; want still held by the next holder %s", st, err, m.ID())
	}
	if err := m.Release(ctx); err != nil {
		t.Fatalf("the next holder's release: %v", err)
	}
}

// A release whose reply is lost is sent again by go-redis. If the lock was
// taken and released by the next holder meanwhile, the release sent again
// read the next holder's record as "not held" (ErrLost).
func TestReleaseSentAgainAfterAHandover(t *testing.T) {
	t.Parallel()
	pr, other := newSlowRetryProxiedRedis(t)
	c, next := newClient(t, pr.store), newClient(t, other)
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := c.Acquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var released error
	// Released, and the reply lost; the release sent again waits.
	resume := pr.sentAgainHeld(t, func() { released = l.Release(ctx) }, "scripts/prelude.lua", "scripts/release.lua")
	m, err := next.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	resume()
	if err := released; err != nil {
		t.Fatalf("a release sent again after the next holder came and went: %v, want success", err)
	}
}

// A reentry whose reply is lost, and whose caller's deadline passes before
// go-redis sends it again, fails; but Redis counted it. The store freed a
// lost plain acquisition's lease at once (abandon) but left the reentry's
// hold: the holder's one release then left the lock held, by nobody, until
// its TTL.
func TestFailedReentryLeavesNoHold(t *testing.T) {
	pr, _ := newSlowRetryProxiedRedis(t)
	c, other := newClient(t, pr.store), newClient(t, pr.store)
	ctx := t.Context()
	name := testenv.Name(t)
	a, err := c.Acquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	lost := pr.proxy.LoseReply([]byte(scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/acquire.lua")))
	// go-redis would send it again after 500 ms: the deadline comes first.
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if l, err := c.TryAcquire(rctx, name, 30*time.Second, lock.WithHolder("worker-1")); err == nil {
		t.Fatalf("the reentry succeeded (count %d): its reply was not lost before its deadline", l.Count())
	}
	<-lost
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the only hold its holder knows of was released: %+v, %v; want free", st, err)
	}
	l, err := other.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatalf("another client after the release: %v", err)
	}
	l.Release(ctx)
}

// The same on Redlock: a reentry whose replies are lost on a majority of
// nodes fails at the node timeout, before go-redis sends it again; the
// nodes had counted it, and the holder's one release left the lock held on
// every node.
func TestRedlockFailedReentryLeavesNoHold(t *testing.T) {
	t.Parallel()
	// go-redis would send a call again after 500 ms: the node timeout
	// (300 ms) ends it first.
	procs, proxies, s := startProxiedRedlock(t, func(o *redis.Options) {
		o.MinRetryBackoff, o.MaxRetryBackoff = 500*time.Millisecond, 500*time.Millisecond
	}, lock.WithNodeTimeout(300*time.Millisecond))
	c, other := newClient(t, s), newClient(t, s)
	ctx := t.Context()
	name := testenv.Name(t)
	a, err := c.Acquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	fired := make([]<-chan struct{}, 2)
	for i := range fired {
		fired[i] = proxies[i].LoseReply([]byte(scriptSHA(t, procs[i].Client(), "scripts/prelude.lua", "scripts/acquire.lua")))
	}
	if l, err := c.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1")); err == nil {
		t.Fatalf("the reentry succeeded (count %d) with its replies lost on two nodes of three", l.Count())
	}
	for _, f := range fired {
		<-f
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the only hold its holder knows of was released: %+v, %v; want free", st, err)
	}
	l, err := other.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatalf("another client after the release: %v", err)
	}
	l.Release(ctx)
}

// Defect 100: a refresh to a shorter TTL that Redis applied but whose
// reply never came back left the holder believing its old, later
// deadline, while Redis freed the lock at the shorter one: another client
// took it and both believed they held it. A refresh that fails for any
// reason but "lost" may have been applied, so the holder's deadline now
// moves as far as it would have (never later).
func TestUnansweredShorterRefreshShortensValidity(t *testing.T) {
	t.Parallel()
	pr, other := newSlowRetryProxiedRedis(t)
	c1, c2 := newClient(t, pr.store), newClient(t, other)
	ctx := t.Context()
	name := testenv.Name(t)
	a, err := c1.Acquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const short = 200 * time.Millisecond
	lost := pr.proxy.LoseReplyAndRefuse([]byte(scriptSHA(t, pr.direct, "scripts/refresh.lua")))
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	err = a.Refresh(rctx, short)
	cancel()
	<-lost
	pr.proxy.Refuse(false)
	if err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("refresh whose reply was lost and whose store refused to reconnect: %v; want an error that is not ErrLost", err)
	}
	if d := a.Deadline(); d.After(sent.Add(short)) {
		t.Fatalf("after an unanswered Refresh(%s) the holder's deadline is %s away; want at most %s from before it was sent",
			short, time.Until(d).Round(time.Millisecond), short)
	}
	// Redis applied it: the lock is free after the shorter TTL.
	b, err := c2.Acquire(ctx, name, time.Second, lock.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if time.Now().Before(a.Deadline()) && a.Err() == nil {
		t.Fatalf("two holders: token %d granted while the holder of token %d believes it holds the lock until %s", b.Token(), a.Token(), a.Deadline())
	}
}
