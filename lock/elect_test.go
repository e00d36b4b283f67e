package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Leader election on etcd: Elect, Observe, and the term as a fencing
// token.

// TestElectCandidatesInTurn: three candidates on two stores (two
// processes); one leads, the others wait; the one that gives up leaves the
// queue; a resignation hands the term to the next, with a higher token,
// and an observer sees each leader with its value and term.
func TestElectCandidatesInTurn(t *testing.T) {
	_, cli := testenv.Etcd(t)
	a := newClient(t, newEtcdStore(t, cli))
	b := newClient(t, newEtcdStore(t, cli))
	name := testenv.Name(t)

	obs, err := a.Observe(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading || l.Token != 0 || l.Name != name {
		t.Fatalf("before any campaign: %+v", l)
	}
	first, err := a.Elect(t.Context(), name, "10.0.0.1:8080", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); !l.Leading || l.Value != "10.0.0.1:8080" || l.Token != first.Token() {
		t.Fatalf("observed %+v; want the first leader, token %d", l, first.Token())
	}

	// A candidate that gives up mid-queue, ahead of the one that stays.
	quitter, quit := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := b.Elect(quitter, name, "quitter", 2*time.Second)
		gaveUp <- err
	}()
	testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := a.Inspect(t.Context(), name); return err == nil && st.Waiters == 1 })
	won := make(chan *lock.Lease, 1)
	failed := make(chan error, 1)
	go func() {
		l, err := b.Elect(context.Background(), name, "10.0.0.2:8080", 2*time.Second, lock.WithWait(30*time.Second))
		if err != nil {
			failed <- err
			return
		}
		won <- l
	}()
	testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := a.Inspect(t.Context(), name); return err == nil && st.Waiters == 2 })
	quit()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the candidate that gave up: %v", err)
	}
	select {
	case l := <-won:
		t.Fatalf("a second leader while the first leads: token %d", l.Token())
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	if first.Err() != nil {
		t.Fatalf("the first leader lost its term with no cause: %v", first.Err())
	}

	if err := first.Release(t.Context()); err != nil { // resign
		t.Fatal(err)
	}
	var second *lock.Lease
	select {
	case second = <-won:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting candidate did not lead after the resignation")
	}
	defer second.Release(context.Background())
	if second.Token() <= first.Token() {
		t.Fatalf("term %d after %d", second.Token(), first.Token())
	}
	for {
		l := testenv.Next(t, obs)
		if !l.Leading {
			continue // the moment between the two terms, if it was seen
		}
		if l.Value != "10.0.0.2:8080" || l.Token != second.Token() {
			t.Fatalf("observed %+v; want the second leader, token %d", l, second.Token())
		}
		break
	}
}

// TestElectRefusesRedis: a Redis lease can be forgotten by a failover, so
// an election on one is refused, not weakened.
func TestElectRefusesRedis(t *testing.T) {
	c := newClient(t, redisBackend(t).store)
	if c.Electable() {
		t.Fatal("a Redis store reported electable")
	}
	if _, err := c.Elect(t.Context(), "e", "v", time.Second); !errors.Is(err, lock.ErrElectionStore) {
		t.Fatalf("Elect on Redis: %v", err)
	}
	if _, err := c.Observe(t.Context(), "e"); !errors.Is(err, lock.ErrElectionStore) {
		t.Fatalf("Observe on Redis: %v", err)
	}
}

// TestElectRejectsOptions: options that would break an election, and bad
// values, are errors that say why.
func TestElectRejectsOptions(t *testing.T) {
	_, cli := testenv.Etcd(t)
	c := newClient(t, newEtcdStore(t, cli))
	for _, tc := range []struct {
		value string
		opts  []lock.Option
		want  string
	}{
		{"v", []lock.Option{lock.WithUnfair()}, "WithUnfair"},
		{"v", []lock.Option{lock.WithOwner("x")}, "WithOwner"},
		{"v", []lock.Option{lock.WithHolder("x")}, "WithHolder"},
		{"v", []lock.Option{lock.WithDetached(), lock.WithKeepAlive()}, "WithDetached"},
		{"bad\nvalue", nil, "election value"},
		{strings.Repeat("v", lock.MaxLabelLen+1), nil, "election value"},
	} {
		_, err := c.Elect(t.Context(), "e", tc.value, time.Second, tc.opts...)
		if !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Elect(%q, %d options): %v; want ErrInvalidOption naming %s", tc.value, len(tc.opts), err, tc.want)
		}
	}
	if _, err := c.Elect(t.Context(), "", "v", time.Second); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("empty election name: %v", err)
	}
	if _, err := c.Observe(t.Context(), ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("Observe of an empty name: %v", err)
	}
}

// TestElectDeposedLeaderIsFenced: a leader pauses (all its traffic to etcd
// held, as a SIGSTOP or a partition would), its term runs out, another
// candidate leads and writes; the deposed leader's writes from then on are
// rejected by the fenced resource, whatever it believes.
func TestElectDeposedLeaderIsFenced(t *testing.T) {
	t.Parallel()
	e, direct := testenv.Etcd(t)
	p, paused := testenv.EtcdThroughProxy(t, e)
	a := newClient(t, newEtcdStore(t, paused))
	b := newClient(t, newEtcdStore(t, direct))
	name := testenv.Name(t)
	res := fence.NewMemoryStore()
	ctx := t.Context()

	old, err := a.Elect(ctx, name, "a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Admit(ctx, "res", old.Token()); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	p.Hold(true) // the leader pauses
	defer p.Hold(false)

	t0 := time.Now()
	cur, err := b.Elect(ctx, name, "b", time.Second, lock.WithWait(30*time.Second))
	t.Logf("new leader after %s", time.Since(t0))
	if err != nil {
		t.Fatalf("no new leader while the old one is paused: %v", err)
	}
	defer cur.Release(context.Background())
	if cur.Token() <= old.Token() {
		t.Fatalf("new term %d after %d", cur.Token(), old.Token())
	}
	if err := res.Admit(ctx, "res", cur.Token()); err != nil {
		t.Fatalf("the new leader's first write: %v", err)
	}
	// The deposed leader wakes and writes with the term it had.
	if err := res.Admit(ctx, "res", old.Token()); !fence.IsStale(err) {
		t.Fatalf("the deposed leader's late write: %v; want it rejected as stale", err)
	}
	if got := res.Highest("res"); got != cur.Token() {
		t.Fatalf("highest token %d; want the new term %d", got, cur.Token())
	}
	// Its lease says so too once it looks: the deadline passed unrefreshed.
	select {
	case <-old.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the deposed leader's Done never closed")
	}
	if !errors.Is(old.Err(), lock.ErrLost) {
		t.Fatalf("the deposed leader's Err: %v", old.Err())
	}
}

// TestObserveAcrossCutConnection: an observer whose connection to etcd is
// cut still reports the leaders that follow, once it is back.
func TestObserveAcrossCutConnection(t *testing.T) {
	t.Parallel()
	e, direct := testenv.Etcd(t)
	p, cut := testenv.EtcdThroughProxy(t, e)
	observer := newClient(t, newEtcdStore(t, cut))
	candidates := newClient(t, newEtcdStore(t, direct))
	name := testenv.Name(t)

	obs, err := observer.Observe(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	p.Refuse(true)
	p.CutAll()
	first, err := candidates.Elect(t.Context(), name, "a", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.Refuse(false)
	if l := testenv.Next(t, obs); !l.Leading || l.Token != first.Token() || l.Value != "a" {
		t.Fatalf("after the cut: %+v; want a with term %d", l, first.Token())
	}
	first.Release(t.Context())
	second, err := candidates.Elect(t.Context(), name, "b", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(context.Background())
	for {
		l := testenv.Next(t, obs)
		if !l.Leading {
			continue
		}
		if l.Token != second.Token() || l.Value != "b" {
			t.Fatalf("observed %+v; want b with term %d", l, second.Token())
		}
		break
	}
}

// TestCloseEndsObserve: Close ends an Observe as it ends a waiting Elect:
// the channel closes, Close waits for its goroutine, and a later Observe
// returns ErrClosed. Before, the observer went on watching etcd after its
// client had closed, until the caller's ctx ended (never, with
// context.Background()).
func TestCloseEndsObserve(t *testing.T) {
	_, cli := testenv.Etcd(t)
	testenv.CloseEndsObserve(t, newClient(t, newEtcdStore(t, cli)), lock.ErrClosed)
}
