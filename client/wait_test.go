package client_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// tokensIssued reads fenced_tokens_issued_total from a server's metrics.
func tokensIssued(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^fenced_tokens_issued_total (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no fenced_tokens_issued_total in the metrics")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestWaitLongerThanTTL: a waiter that waited on the server longer than
// the TTL it asked for keeps the lease it was granted. Its validity runs
// from the granting attempt (the server says how long it waited first),
// not from when the request was sent, which would make the grant look
// expired on arrival: the client released it and queued again, and in a
// queue every waiter did so in turn (seen: `fenced elect` with a 5s TTL
// behind a paused leader took its term twice).
func TestWaitLongerThanTTL(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := c.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before := tokensIssued(t, f.url)
	got := make(chan *lock.Lease, 1)
	failed := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), name, 300*time.Millisecond, lock.WithWait(30*time.Second))
		if err != nil {
			failed <- err
			return
		}
		got <- l
	}()
	for { // the waiter has waited longer than its TTL
		st, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Waiters == 1 && st.OldestWait > time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	releasing := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l *lock.Lease
	select {
	case l = <-got:
	case err := <-failed:
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if n := tokensIssued(t, f.url) - before; n != 1 {
		t.Fatalf("%d tokens issued for one waiting acquire: the client gave back its grant and queued again", n)
	}
	// Granted after the release began, for 300ms less drift.
	if !l.Deadline().After(releasing.Add(200 * time.Millisecond)) {
		t.Fatalf("the lease's deadline is %s after the release began; a 300ms grant made after it lasts longer", l.Deadline().Sub(releasing))
	}
}
