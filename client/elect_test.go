package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdServer is a fenced API server in this process whose leases are in a
// real (embedded) etcd: elections need it.
func etcdServer(t *testing.T) string {
	t.Helper()
	return etcdFixture(t).serve(t, server.Config{})
}

// etcdFixture is a fixture whose lock client keeps its leases in a real
// (embedded) etcd; serve starts API servers over it.
func etcdFixture(t *testing.T) *fixture {
	t.Helper()
	_, cli := testenv.Etcd(t)
	return etcdFixtureOn(t, cli)
}

// etcdFixtureOn is etcdFixture with a store of its own on cli's etcd, as
// one of several fenced nodes is.
func etcdFixtureOn(t *testing.T, cli *clientv3.Client) *fixture {
	t.Helper()
	store, err := lock.NewEtcdStore(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	locks, err := lock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close(context.Background()) })
	return &fixture{locks: locks}
}

// TestElect: two candidates through the server; the first leads and keeps
// its term alive past its first deadline; the second waits across several requests
// (a 200ms request wait) and leads after the first resigns, with a higher
// term; an observer sees both, with their values.
func TestElect(t *testing.T) {
	t.Parallel()
	url := etcdServer(t)
	a := newClient(t, url)
	b := newClient(t, url, client.WithMaxRequestWait(200*time.Millisecond))
	name := testenv.Name(t)
	ctx := t.Context()

	obs, err := b.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	first, err := a.Elect(ctx, name, "host-a:8080", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); !l.Leading || l.Value != "host-a:8080" || l.Token != first.Token() {
		t.Fatalf("observed %+v; want host-a:8080 with term %d", l, first.Token())
	}
	won := make(chan *lock.Lease, 1)
	failed := make(chan error, 1)
	go func() {
		l, err := b.Elect(context.Background(), name, "host-b:8080", 2*time.Second, lock.WithWait(30*time.Second))
		if err != nil {
			failed <- err
			return
		}
		won <- l
	}()
	// The leader keeps its term through keep-alive, past the deadline its
	// first grant had.
	granted := first.Deadline()
	select {
	case <-first.Done():
		t.Fatalf("the leader lost its term: %v", first.Err())
	case l := <-won:
		t.Fatalf("a second leader (term %d) while the first leads", l.Token())
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(time.Until(granted) + 300*time.Millisecond):
	}
	if first.Err() != nil || !first.Deadline().After(granted) {
		t.Fatalf("the leader's term was not kept alive: Err %v, deadline %s after %s", first.Err(), first.Deadline(), granted)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var second *lock.Lease
	select {
	case second = <-won:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the second candidate did not lead after the resignation")
	}
	defer second.Release(context.Background())
	if second.Token() <= first.Token() {
		t.Fatalf("term %d after %d", second.Token(), first.Token())
	}
	// A campaign request whose wait ended while its grant was being
	// written leaves a term that nobody learnt of, which the store then
	// releases: observers may see it lead, briefly, before the term the
	// candidate got from its next request.
	for {
		l := testenv.Next(t, obs)
		if !l.Leading {
			continue
		}
		if l.Value != "host-b:8080" || l.Token > second.Token() || l.Token <= first.Token() {
			t.Fatalf("observed %+v; want host-b:8080 with term %d", l, second.Token())
		}
		if l.Token == second.Token() {
			break
		}
	}
}

// TestElectOnRedisServer: a server whose leases are in Redis refuses
// elections, and the client says so with lock.ErrElectionStore.
func TestElectOnRedisServer(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	if _, err := c.Elect(t.Context(), "e", "v", time.Second); !errors.Is(err, lock.ErrElectionStore) {
		t.Fatalf("Elect: %v", err)
	}
	if _, err := c.Observe(t.Context(), "e"); !errors.Is(err, lock.ErrElectionStore) {
		t.Fatalf("Observe: %v", err)
	}
	if _, err := c.Elect(t.Context(), "e", "v", time.Second, lock.WithUnfair()); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Elect WithUnfair: %v", err)
	}
}

// TestObserveAsksForLessWhenTheServerRefusesItsWait: a server whose
// --max-wait (10s) is shorter than the client's request wait
// (DefaultMaxRequestWait, 30s) refuses the long poll with 400 on wait_ms.
// Observe must ask for less until the server accepts, and so report the
// next leader, rather than send the refused poll again for ever while the
// channel shows the first state.
func TestObserveAsksForLessWhenTheServerRefusesItsWait(t *testing.T) {
	f := etcdFixture(t)
	url := f.serve(t, server.Config{MaxWait: 10 * time.Second})
	c := newClient(t, url) // the default request wait
	name := testenv.Name(t)
	ctx := t.Context()
	obs, err := c.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	leader, err := f.locks.Elect(ctx, name, "host-a", 5*time.Second) // another candidate, in the server's process
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Release(context.Background())
	select {
	case l, ok := <-obs:
		if !ok || !l.Leading || l.Value != "host-a" || l.Token != leader.Token() {
			t.Fatalf("observed %+v (open %v); want host-a with term %d", l, ok, leader.Token())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Observe reported no change 5s after host-a took term %d", leader.Token())
	}
}

// TestObserveClosesAfterAFinalRefusal: once the server refuses the long
// poll with an answer that sending it again cannot change (403 here, as
// after a token lost its permission), the channel is closed although ctx
// lives, and Observe called again says why. Before, the poll was sent
// again for ever and the channel showed a leader that may be long gone.
func TestObserveClosesAfterAFinalRefusal(t *testing.T) {
	f := etcdFixture(t)
	srv, err := server.New(server.Config{Locks: f.locks})
	if err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			injected(w, http.StatusForbidden, "forbidden", "injected: this token may not observe this election")
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	c := newClient(t, hs.URL, client.WithMaxRequestWait(200*time.Millisecond))
	name := testenv.Name(t)
	ctx := t.Context()
	obs, err := c.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	refuse.Store(true)
	select {
	case l, ok := <-obs:
		if ok {
			t.Fatalf("observed %+v after the server refused; want the channel closed", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the channel is still open 10s after the server began to refuse every long poll with 403")
	}
	if ctx.Err() != nil {
		t.Fatal("ctx ended")
	}
	_, err = c.Observe(ctx, name)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Fatalf("Observe again: %v; want the server's 403", err)
	}
}

// TestElectWithAShorterMaxWait: a campaign goes through the same requests
// as an Acquire, so a server whose --max-wait (400ms) is shorter than the
// client's request wait (DefaultMaxRequestWait, 30s) refused every campaign
// with 400 on wait_ms, even of an election nobody led. The client now asks
// for the server's maximum (max_wait_ms): the first candidate leads, and
// the second waits across requests of that length until it resigns.
func TestElectWithAShorterMaxWait(t *testing.T) {
	f := etcdFixture(t)
	url := f.serve(t, server.Config{MaxWait: 400 * time.Millisecond})
	a := newClient(t, url) // the default request wait
	b := newClient(t, url)
	name := testenv.Name(t)
	ctx := t.Context()

	first, err := a.Elect(ctx, name, "host-a", 5*time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("an election nobody leads, a server with --max-wait 400ms: %v", err)
	}
	type result struct {
		l   *client.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := b.Elect(context.Background(), name, "host-b", 5*time.Second, lock.WithWait(time.Minute))
		done <- result{l, err}
	}()
	waitsLonger(t, a, name, time.Second, done) // longer than two requests
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the second candidate, after host-a resigned: %v", r.err)
	}
	defer r.l.Release(context.Background())
	if r.l.Token() <= first.Token() {
		t.Errorf("host-b's term %d, want above host-a's %d", r.l.Token(), first.Token())
	}
}

// TestCloseEndsObserve: Close ends an Observe as it ends a waiting
// Acquire: the channel closes, Close waits for its goroutine, and a later
// Observe returns lock.ErrClosed. Before, the goroutine went on sending
// long polls through the closed client until the caller's ctx ended (never,
// with context.Background()).
func TestCloseEndsObserve(t *testing.T) {
	c, err := client.New(etcdServer(t))
	if err != nil {
		t.Fatal(err)
	}
	testenv.CloseEndsObserve(t, c, lock.ErrClosed)
}
