package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestLostForceReleaseAnswerIsNotSentAgain: a force-release is not safe to
// repeat. Its answer lost, a second DELETE deleted whatever held the lock
// then: the waiter the first one woke, which had just taken it, so two
// leases were force-released for one call; or, if the waiter was not yet
// there, it found the lock free and ForceRelease said "not held" of a lock
// it had released. Now the lost answer is an error that says the lock may
// have been released, and nothing is sent again.
func TestLostForceReleaseAnswerIsNotSentAgain(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	pr, c := f.proxied(t)
	name := testenv.Name(t)
	if _, err := f.locks.TryAcquire(ctx, name, time.Minute, lock.WithDetached()); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *lock.Lease
		err error
	}
	next := make(chan result, 1)
	go func() {
		l, err := f.locks.Acquire(ctx, name, time.Minute, lock.WithDetached(), lock.WithWait(30*time.Second))
		next <- result{l, err}
	}()
	waitsLonger(t, c, name, 0, next)

	fired := pr.LoseReply([]byte("DELETE /v1/locks/"))
	st, err := c.ForceRelease(ctx, name)
	<-fired
	r := <-next // woken by the force-release
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	defer r.l.Release(context.WithoutCancel(ctx))
	if err == nil || !strings.Contains(err.Error(), "may have released the lock") {
		t.Errorf("ForceRelease whose answer was lost: %+v, %v; want an error saying the lock may have been released", st, err)
	}
	if now, ierr := f.locks.Inspect(ctx, name); ierr != nil || !now.Held || now.Token != r.l.Token() {
		t.Fatalf("the next holder (token %d) after one force-release: %+v, %v; want it still held: the DELETE was sent again", r.l.Token(), now, ierr)
	}
}

// TestObserveEndsWhenTheServerStopsAnswering: Observe's first request, a
// read of who leads now, was bounded by the caller's context alone, and
// that context is the whole observation's: a caller could not bound the
// first request without ending the observation, and against a server
// that took it and never answered, Observe never returned (fenced elect
// --observe hung). It is now bounded as a request that asks for no wait:
// the answer grace, and the error matches client.ErrNoAnswer.
func TestObserveEndsWhenTheServerStopsAnswering(t *testing.T) {
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	c := newClient(t, url, client.WithAnswerGrace(300*time.Millisecond))
	hang(t, p)

	ctx, cancel := context.WithCancel(t.Context())
	watchdog := time.AfterFunc(20*time.Second, cancel) // no deadline: the observation's context has none
	defer watchdog.Stop()
	ch, err := c.Observe(ctx, testenv.Name(t))
	if ctx.Err() != nil {
		t.Fatalf("Observe returned only when the watchdog cancelled it: %v, %v", ch, err)
	}
	if !errors.Is(err, client.ErrNoAnswer) {
		t.Fatalf("Observe against a server that does not answer: %v, %v; want an error matching client.ErrNoAnswer", ch, err)
	}
}
