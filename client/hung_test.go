package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Servers that stop answering: a partition that delivers nothing, a
// SIGSTOPped or wedged process. The connection stays open and no answer
// comes, so only the client's own bounds end the wait.

// behindProxy puts a fault proxy in front of the server at url and returns
// the proxy and the URL to reach the server through it. p.Hold(true) makes
// the server stop answering; p.LoseReply loses an answer.
func behindProxy(t *testing.T, url string) (*faultproxy.Proxy, string) {
	t.Helper()
	p, err := faultproxy.New(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, "http://" + p.Addr()
}

// proxied is a client of the fixture's server through a fault proxy, and
// the proxy.
func (f *fixture) proxied(t *testing.T) (*faultproxy.Proxy, *client.Client) {
	t.Helper()
	p, u := behindProxy(t, f.url)
	return p, newClient(t, u)
}

// wantFree fails the test unless name is free, saying when.
func (f *fixture) wantFree(t *testing.T, name, when string) {
	t.Helper()
	if st, err := f.locks.Inspect(t.Context(), name); err != nil || st.Held {
		t.Fatalf("%s: %+v, %v; want free", when, st, err)
	}
}

// hang makes the server behind p stop answering until the test ends.
func hang(t *testing.T, p *faultproxy.Proxy) {
	p.Hold(true)
	t.Cleanup(func() { p.Hold(false) }) // before the client's Close, which releases through it
}

// TestAcquireWaitBudgetHoldsWhenTheServerStopsAnswering: Acquire with a
// WithWait budget of 1s, against the only server, which stops answering.
// The caller's context has no deadline of its own within the test's
// scale: only a watchdog, far later. Acquire must return after the budget
// and the answer grace, with an error matching client.ErrNoAnswer: not
// lock.ErrNotAcquired (nobody said the lock is held), and not the
// context's DeadlineExceeded (the caller's context did not end).
func TestAcquireWaitBudgetHoldsWhenTheServerStopsAnswering(t *testing.T) {
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	c := newClient(t, url)
	name := testenv.Name(t)
	if _, err := c.Inspect(t.Context(), name); err != nil { // a connection to reuse, then the hang
		t.Fatal(err)
	}
	hang(t, p)

	const budget, slack = time.Second, 3 * time.Second
	watchdog := budget + client.DefaultAnswerGrace + 15*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), watchdog)
	defer cancel()
	start := time.Now()
	_, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWait(budget))
	took := time.Since(start)
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a %v budget returned only when the %v watchdog ended, after %v: %v", budget, watchdog, took.Round(time.Millisecond), err)
	}
	if !errors.Is(err, client.ErrNoAnswer) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("err = %v; want one matching client.ErrNoAnswer and not lock.ErrNotAcquired", err)
	}
	if limit := budget + client.DefaultAnswerGrace + slack; took > limit {
		t.Fatalf("Acquire with a %v budget returned after %v; want within %v", budget, took.Round(time.Millisecond), limit)
	}
	t.Logf("returned after %v: %v", took.Round(time.Millisecond), err)
}

// TestAcquireWithoutBudgetEndsWhenTheServerStopsAnswering: with neither a
// WithWait budget nor a context deadline, each request still must be
// answered within the wait it asked for (WithMaxRequestWait) and the
// grace; a server that stops answering ends the Acquire with
// client.ErrNoAnswer rather than holding it for ever.
func TestAcquireWithoutBudgetEndsWhenTheServerStopsAnswering(t *testing.T) {
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	const wait, grace = 300 * time.Millisecond, 300 * time.Millisecond
	c := newClient(t, url, client.WithMaxRequestWait(wait), client.WithAnswerGrace(grace))
	hang(t, p)

	ctx, cancel := context.WithCancel(t.Context())
	watchdog := time.AfterFunc(20*time.Second, cancel) // no deadline: ctx.Deadline reports none
	defer watchdog.Stop()
	start := time.Now()
	_, err := c.Acquire(ctx, testenv.Name(t), 5*time.Second)
	if ctx.Err() != nil {
		t.Fatalf("Acquire without a budget returned only when the watchdog cancelled it, after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if !errors.Is(err, client.ErrNoAnswer) {
		t.Fatalf("err = %v; want one matching client.ErrNoAnswer", err)
	}
}

// TestAcquireMovesOnFromAServerThatStopsAnswering: two servers, the first
// stops answering. A waiting Acquire whose budget spans several requests
// gives the first its request's wait and the grace, then asks the second
// for the wait that is left, and gets the lease from it.
func TestAcquireMovesOnFromAServerThatStopsAnswering(t *testing.T) {
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	c := newClient(t, url+","+f.url, client.WithMaxRequestWait(500*time.Millisecond), client.WithAnswerGrace(500*time.Millisecond))
	hang(t, p)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a watchdog
	defer cancel()
	l, err := c.Acquire(ctx, testenv.Name(t), 5*time.Second, lock.WithWait(15*time.Second))
	if err != nil {
		t.Fatalf("Acquire with a healthy second server: %v", err)
	}
	defer l.Release(t.Context())
}

// TestKeepAliveMovesOnFromAServerThatStopsAnswering: a client of two
// servers holds a kept-alive lease through the first, which then stops
// answering; the second is healthy. A keep-alive refresh's context ends
// at the lease's deadline; each server has only its share of it, so the
// hung first cannot use it all and the second refreshes the lease. It
// must survive three TTLs.
func TestKeepAliveMovesOnFromAServerThatStopsAnswering(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	c := newClient(t, url+","+f.url) // the hung one first
	ctx := t.Context()
	const ttl = 3 * time.Second
	l, err := c.TryAcquire(ctx, testenv.Name(t), ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	hang(t, p)
	select {
	case <-l.Done():
		t.Fatalf("lease lost %v after its grant, with a healthy second server: %v", time.Since(l.Started()).Round(time.Millisecond), l.Err())
	case <-time.After(3 * ttl):
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release through the second server: %v", err)
	}
}

// TestReleaseMovesOnFromAServerThatStopsAnswering: a release with a
// deadline, first sent to a server that stops answering, has the second
// server release the lease within that deadline.
func TestReleaseMovesOnFromAServerThatStopsAnswering(t *testing.T) {
	f := newFixture(t)
	p, url := behindProxy(t, f.url)
	c := newClient(t, url+","+f.url)
	name := testenv.Name(t)
	l, err := c.TryAcquire(t.Context(), name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	hang(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release with a 2s deadline and a healthy second server: %v", err)
	}
	if st, err := f.locks.Inspect(t.Context(), name); err != nil || st.Held {
		t.Fatalf("after the release: %+v, %v; want not held", st, err)
	}
}
