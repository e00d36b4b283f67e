package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
)

// fixture is a fenced API server in this process over a real Redis lease
// store and a real (embedded) etcd sequencer.
type fixture struct {
	locks    *lock.Client
	url      string
	failing  atomic.Bool  // when set, every request is answered 503
	acquires atomic.Int64 // acquire requests received
	answered atomic.Int64 // and whose handler returned

	mu     sync.Mutex
	grants []string // the bodies of the acquire answers with status 200, as sent
}

// granted returns the bodies of the acquire answers sent with status 200.
func (f *fixture) granted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.grants)
}

// teeWriter keeps a copy of what a handler writes.
type teeWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }

func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOf(t, func(s lock.LeaseStore) lock.LeaseStore { return s })
}

// newFixtureOf is newFixture with the Redis store wrapped by wrap.
func newFixtureOf(t *testing.T, wrap func(lock.LeaseStore) lock.LeaseStore) *fixture {
	t.Helper()
	rdb := testenv.Redis(t)
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	store, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	locks, err := lock.New(wrap(store))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{locks: locks}
	f.url = f.serve(t, server.Config{MaxTTL: time.Minute})
	return f
}

// serve starts another API server over the fixture's lock client.
func (f *fixture) serve(t *testing.T, cfg server.Config) string {
	t.Helper()
	cfg.Locks = f.locks
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.failing.Load() {
			http.Error(w, `{"error":{"code":"unavailable","message":"injected"}}`, http.StatusServiceUnavailable)
			return
		}
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/acquire") {
			srv.ServeHTTP(w, r)
			return
		}
		f.acquires.Add(1)
		tw := &teeWriter{ResponseWriter: w}
		srv.ServeHTTP(tw, r)
		f.answered.Add(1)
		if tw.status == http.StatusOK {
			f.mu.Lock()
			f.grants = append(f.grants, tw.body.String())
			f.mu.Unlock()
		}
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// releaseBehindBack releases a lease by its id with a raw HTTP call, as
// another process that learned the id could.
func releaseBehindBack(t *testing.T, url, name, id string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/locks/"+name+"/release", "application/json", strings.NewReader(`{"lease_id":"`+id+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("release behind the holder's back: HTTP %d", resp.StatusCode)
	}
}

func waitDone(t *testing.T, l *client.Lease, within time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(within):
		t.Fatalf("lease not done within %s", within)
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newClient(t, f.url)

	t.Run("RoundTrip", func(t *testing.T) {
		ctx := t.Context()
		name := testenv.Name(t)
		l, err := c.Acquire(ctx, name, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if l.Name() != name || len(l.ID()) != 32 || l.Token() == 0 || l.TTL() != 5*time.Second || l.Err() != nil {
			t.Fatalf("lease %q %q %d %s %v", l.Name(), l.ID(), l.Token(), l.TTL(), l.Err())
		}
		if d := time.Until(l.Deadline()); d <= 4*time.Second || d > 5*time.Second {
			t.Fatalf("deadline in %s, want just under 5s", d)
		}
		if tok, ok := fence.FromContext(l.Context()); !ok || tok != l.Token() {
			t.Fatalf("lease context carries token %d, %v", tok, ok)
		}
		st, err := c.Inspect(ctx, name)
		if err != nil || !st.Held || st.Token != l.Token() || st.Remaining <= 0 {
			t.Fatalf("inspect held: %+v, %v", st, err)
		}
		before := l.Deadline()
		if err := l.Refresh(ctx, 8*time.Second); err != nil {
			t.Fatal(err)
		}
		if l.TTL() != 8*time.Second || !l.Deadline().After(before) {
			t.Fatalf("after refresh: ttl %s deadline moved %v", l.TTL(), l.Deadline().After(before))
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("second release: %v", err)
		}
		if !errors.Is(l.Err(), lock.ErrReleased) {
			t.Fatalf("Err after release = %v", l.Err())
		}
		if err := l.Refresh(ctx, 0); !errors.Is(err, lock.ErrReleased) {
			t.Fatalf("refresh after release = %v", err)
		}
		if st, err := c.Inspect(ctx, name); err != nil || st.Held {
			t.Fatalf("inspect after release: %+v, %v", st, err)
		}
		l2, err := c.TryAcquire(ctx, name, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l2.Release(ctx)
		if l2.Token() <= l.Token() {
			t.Fatalf("second token %d <= first %d", l2.Token(), l.Token())
		}
	})

	t.Run("Held", func(t *testing.T) {
		ctx := t.Context()
		name := testenv.Name(t)
		l, err := c.Acquire(ctx, name, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		_, err = c.TryAcquire(ctx, name, time.Second)
		var ae *client.APIError
		if !errors.Is(err, lock.ErrNotAcquired) || !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "held" {
			t.Fatalf("TryAcquire of a held lock = %v", err)
		}
		start := time.Now()
		_, err = c.Acquire(ctx, name, time.Second, lock.WithWait(300*time.Millisecond))
		if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("Acquire with a wait budget = %v", err)
		}
		if el := time.Since(start); el < 250*time.Millisecond {
			t.Fatalf("gave up after %s, before the 300ms budget", el)
		}
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = c.Acquire(cctx, name, time.Second)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire until the context ends = %v", err)
		}
	})

	t.Run("WaitForRelease", func(t *testing.T) {
		ctx := t.Context()
		name := testenv.Name(t)
		first, err := c.Acquire(ctx, name, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		type res struct {
			l   *client.Lease
			err error
		}
		got := make(chan res, 1)
		go func() {
			l, err := c.Acquire(ctx, name, time.Second, lock.WithWait(20*time.Second))
			got <- res{l, err}
		}()
		// Whether the waiter's request has reached the server yet or not,
		// it must be granted after the release.
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.l.Release(ctx)
			if r.l.Token() <= first.Token() {
				t.Fatalf("waiter's token %d <= first %d", r.l.Token(), first.Token())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("waiter not granted 15s after the release")
		}
	})

	t.Run("KeepAliveAndLoss", func(t *testing.T) {
		ctx := t.Context()
		name := testenv.Name(t)
		// A TTL of 1 s, refreshed every third of it: at 300 ms a refresh
		// through the API on a loaded CI machine (the race detector, the
		// other packages' tests) once came after the validity ran out.
		l, err := c.Acquire(ctx, name, time.Second, lock.WithKeepAlive())
		if err != nil {
			t.Fatal(err)
		}
		// Outlive the TTL several times: the keep-alive must hold it.
		hold := time.NewTimer(3 * time.Second)
		select {
		case <-l.Done():
			t.Fatalf("lease lost under keep-alive: %v", l.Err())
		case <-hold.C:
		}
		if st, err := c.Inspect(ctx, name); err != nil || !st.Held {
			t.Fatalf("inspect under keep-alive: %+v, %v", st, err)
		}
		releaseBehindBack(t, f.url, name, l.ID())
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), lock.ErrLost) {
			t.Fatalf("Err = %v, want ErrLost", l.Err())
		}
		if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("Release of a lost lease = %v, want ErrLost", err)
		}
	})

	t.Run("ExpiresWithoutKeepAlive", func(t *testing.T) {
		l, err := c.Acquire(t.Context(), testenv.Name(t), 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), lock.ErrExpired) || !errors.Is(l.Err(), lock.ErrLost) {
			t.Fatalf("Err = %v, want ErrExpired", l.Err())
		}
		if time.Now().Before(l.Deadline()) {
			t.Fatal("done before the deadline")
		}
	})

	t.Run("ExpiresWhenServerFails", func(t *testing.T) {
		l, err := c.Acquire(t.Context(), testenv.Name(t), 300*time.Millisecond, lock.WithKeepAlive())
		if err != nil {
			t.Fatal(err)
		}
		f.failing.Store(true)
		defer f.failing.Store(false)
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), lock.ErrExpired) {
			t.Fatalf("Err = %v, want ErrExpired (refreshes failed until the deadline)", l.Err())
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		ctx := t.Context()
		if _, err := c.Acquire(ctx, "a/b", time.Second); !errors.Is(err, lock.ErrInvalidName) {
			t.Fatalf("bad name = %v", err)
		}
		if _, err := c.Inspect(ctx, ""); !errors.Is(err, lock.ErrInvalidName) {
			t.Fatalf("empty name = %v", err)
		}
		if _, err := c.TryAcquire(ctx, "x", time.Millisecond); !errors.Is(err, lock.ErrInvalidTTL) {
			t.Fatalf("1ms ttl = %v", err)
		}
		if _, err := c.Acquire(ctx, "x", time.Second, lock.WithWait(-1)); err == nil {
			t.Fatal("negative wait accepted")
		}
		// Within lock's limits but over this server's MaxTTL (1m): the
		// server's 400 still matches ErrInvalidTTL.
		_, err := c.TryAcquire(ctx, testenv.Name(t), 2*time.Minute)
		var ae *client.APIError
		if !errors.Is(err, lock.ErrInvalidTTL) || !errors.As(err, &ae) || ae.Status != 400 {
			t.Fatalf("ttl over the server's max = %v", err)
		}
	})

	t.Run("Auth", func(t *testing.T) {
		ctx := t.Context()
		tok := "s3cret-token-0123456789"
		toks, err := server.NewTokens(server.Token{Secret: []byte(tok)})
		if err != nil {
			t.Fatal(err)
		}
		url := f.serve(t, server.Config{Tokens: toks})
		var ae *client.APIError
		_, err = newClient(t, url).TryAcquire(ctx, testenv.Name(t), time.Second)
		if !errors.As(err, &ae) || ae.Status != 401 || ae.Code != "unauthenticated" {
			t.Fatalf("no token = %v", err)
		}
		_, err = newClient(t, url, client.WithBearerToken("wrong-token-0123456789")).Inspect(ctx, "x")
		if !errors.As(err, &ae) || ae.Status != 401 {
			t.Fatalf("wrong token = %v", err)
		}
		l, err := newClient(t, url, client.WithBearerToken(tok)).TryAcquire(ctx, testenv.Name(t), time.Second)
		if err != nil {
			t.Fatalf("right token = %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Close", func(t *testing.T) {
		ctx := t.Context()
		c2, err := client.New(f.url)
		if err != nil {
			t.Fatal(err)
		}
		name := testenv.Name(t)
		l, err := c2.Acquire(ctx, name, time.Second, lock.WithKeepAlive())
		if err != nil {
			t.Fatal(err)
		}
		if err := c2.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(l.Err(), lock.ErrReleased) {
			t.Fatalf("lease after Close: %v", l.Err())
		}
		if st, err := c.Inspect(ctx, name); err != nil || st.Held {
			t.Fatalf("lock after Close: %+v, %v", st, err)
		}
		if _, err := c2.TryAcquire(ctx, name, time.Second); !errors.Is(err, lock.ErrClosed) {
			t.Fatalf("TryAcquire after Close = %v", err)
		}
		if err := c2.Close(ctx); err != nil {
			t.Fatalf("second Close = %v", err)
		}
	})

	t.Run("NotAPIAnswer", func(t *testing.T) {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}))
		defer hs.Close()
		_, err := newClient(t, hs.URL).Inspect(t.Context(), "x")
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "" || !strings.Contains(ae.Message, "bad gateway") {
			t.Fatalf("proxy error = %v", err)
		}
	})
}

func TestNewRejects(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:7070", "ftp://x", "http://", "http://a/?q=1"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	// A port out of range was taken, and failed at the first request as
	// "dial tcp: address 99999: invalid port", naming no URL.
	for _, u := range []string{"http://127.0.0.1:99999", "http://127.0.0.1:0", "https://a:7070,http://b:65536"} {
		if _, err := client.New(u); err == nil || !strings.Contains(err.Error(), "want a number from 1 to 65535") {
			t.Errorf("New(%q): %v; want the port refused", u, err)
		}
	}
	// A password in a refused URL was printed in the error (defect 162).
	for _, u := range []string{"http://bob:hunter2@127.0.0.1:7070", "http://bob:hunter2@127.0.0.1:99999", "ftp://bob:hunter2@x:1"} {
		if _, err := client.New(u); err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "bob:xxxxx@") {
			t.Errorf("New(%q): %v; want it refused without the password", u, err)
		}
	}
	bad := [][]client.Option{
		{client.WithBearerToken("")},
		{client.WithBearerToken("has space")},
		{client.WithHTTPClient(nil)},
		{client.WithTLSConfig(nil)},
		{client.WithMaxRequestWait(0)},
		{client.WithHTTPClient(http.DefaultClient), client.WithTLSConfig(&tls.Config{})},
	}
	for i, opts := range bad {
		if _, err := client.New("http://127.0.0.1:1", opts...); err == nil {
			t.Errorf("options %d accepted", i)
		}
	}
}

// TestBearerTokenAsTheServerTakesIt: WithBearerToken refuses what no
// server can hold (server.NewTokens and the token file refuse it), saying
// what is allowed, and takes what one can (docs/design.md, defect 208).
// A token of 15 bytes was taken, and every call then failed 401; "" was
// refused with "client: empty bearer token".
func TestBearerTokenAsTheServerTakesIt(t *testing.T) {
	const want = "want at least 16 bytes of printable ASCII without spaces"
	for _, tok := range []string{"", "fifteen-bytes-x", "has space-0123456789", "tab\t0123456789abcdef", "caf\u00e9-0123456789abcdef"} {
		if _, err := server.NewTokens(server.Token{Secret: []byte(tok)}); err == nil {
			t.Fatalf("server.NewTokens took %q: this test's premise is wrong", tok)
		}
		_, err := client.New("http://127.0.0.1:1", client.WithBearerToken(tok))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("WithBearerToken(%q): %v; want an error saying %q", tok, err, want)
		}
	}
	for _, tok := range []string{"0123456789abcdef", "#a+b/c=d_e-f.g~h!", strings.Repeat("x", 200)} {
		if _, err := server.NewTokens(server.Token{Secret: []byte(tok)}); err != nil {
			t.Fatalf("server.NewTokens(%q): %v: this test's premise is wrong", tok, err)
		}
		if _, err := client.New("http://127.0.0.1:1", client.WithBearerToken(tok)); err != nil {
			t.Errorf("WithBearerToken(%q): %v; the server takes it", tok, err)
		}
	}
}

func TestAPIErrorMatches(t *testing.T) {
	for _, c := range []struct {
		e    *client.APIError
		want error
	}{
		{&client.APIError{Status: 409, Code: api.CodeHeld}, lock.ErrNotAcquired},
		{&client.APIError{Status: 410, Code: api.CodeLost}, lock.ErrLost},
		{&client.APIError{Status: 409, Code: api.CodeOutOfOrder}, lock.ErrOutOfOrder},
		{&client.APIError{Status: 400, Code: api.CodeInvalidArgument, Field: api.FieldName, Message: "whatever the text"}, lock.ErrInvalidName},
		{&client.APIError{Status: 400, Code: api.CodeInvalidArgument, Field: api.FieldTTLMs}, lock.ErrInvalidTTL},
		{&client.APIError{Status: 400, Code: api.CodeInvalidArgument, Field: api.FieldLeaseID}, lock.ErrInvalidLeaseID},
	} {
		if !errors.Is(c.e, c.want) {
			t.Errorf("%v does not match %v", c.e, c.want)
		}
	}
	// By code and field, never by the message.
	for _, e := range []*client.APIError{
		{Status: 503, Code: api.CodeUnavailable},
		{Status: 400, Code: api.CodeInvalidArgument, Message: lock.ErrInvalidName.Error() + ": empty"},
		{Status: 403, Code: api.CodeForbidden, Field: api.FieldName},
	} {
		if errors.Unwrap(e) != nil {
			t.Errorf("%+v matches %v", e, errors.Unwrap(e))
		}
	}
	if msg := (&client.APIError{Status: 409, Code: "held", Message: "m"}).Error(); !strings.Contains(msg, "409") || !strings.Contains(msg, "held") {
		t.Errorf("message %q", msg)
	}
}

// TestShorterRefreshThroughTheAPI: the client's leases are lock.Lease, so a
// shorter refresh shortens their validity too (defect 1 in
// docs/design.md): a second holder cannot acquire while the first still
// believes it holds the lock.
func TestShorterRefreshThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := a.Refresh(t.Context(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := a.Deadline(); d.After(sent.Add(50 * time.Millisecond)) {
		t.Fatalf("deadline %s away after Refresh(50ms)", time.Until(d))
	}
	b, err := c.Acquire(t.Context(), name, time.Second, lock.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(t.Context())
	select {
	case <-a.Done():
	default:
		t.Fatal("a second holder acquired while the first still believes it holds the lock")
	}
}

// A Lease through the API numbers its refreshes (seq), so that fenced
// refuses one that reaches it after a later one (defect 102): a refresh
// numbered before the lease's last one is answered out_of_order and
// leaves the lease as that one made it.
func TestRefreshesThroughTheAPIAreNumbered(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(t.Context())
	before := lock.NextRefreshSeq()
	if err := a.Refresh(t.Context(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"lease_id":%q,"ttl_ms":200,"seq":%d}`, a.ID(), before)
	resp, err := http.Post(f.url+"/v1/locks/"+name+"/refresh", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("a refresh numbered before the lease's last one: HTTP %d; want 409 out_of_order", resp.StatusCode)
	}
	if st, err := c.Inspect(t.Context(), name); err != nil || !st.Held || st.Remaining < 10*time.Second {
		t.Fatalf("after it: %+v, %v; want held with the lease's own refresh's TTL", st, err)
	}
}

// A fenced older than seq refuses the field, as every unknown one: a
// client upgraded before its servers must not lose its leases. The
// refresh goes again without seq, and the next one tries seq again.
func TestRefreshWithoutSeqForAnOlderServer(t *testing.T) {
	f := newFixture(t)
	srv, err := server.New(server.Config{Locks: f.locks})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bodies []string // the refreshes the older server got
	older := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/refresh") {
			srv.ServeHTTP(w, r)
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		if strings.Contains(string(b), `"seq"`) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"invalid_argument","message":"request body: unknown field \"seq\"; allowed are \"lease_id\", \"ttl_ms\""}}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(older.Close)
	c := newClient(t, older.URL)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(t.Context())
	for range 2 {
		if err := a.Refresh(t.Context(), 20*time.Second); err != nil {
			t.Fatalf("refresh through a server that does not know seq: %v", err)
		}
	}
	if a.TTL() != 20*time.Second || time.Until(a.Deadline()) < 19*time.Second {
		t.Fatalf("after the refreshes: TTL %s, deadline %s away; want 20s", a.TTL(), time.Until(a.Deadline()))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 4 {
		t.Fatalf("refresh bodies %q; want each refresh with seq, then without", bodies)
	}
	for i, b := range bodies {
		if with := strings.Contains(b, `"seq"`); with != (i%2 == 0) {
			t.Fatalf("refresh body %d of %q: seq %v", i, bodies, with)
		}
	}
}

// Defect 100 through the API: a shorter refresh that the server applied
// but whose answer was lost, and that could not be sent again (the
// server's address refused connections), shortens the validity all the
// same: the lock the server freed at the shorter TTL is not believed held.
func TestUnansweredShorterRefreshThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	p, c := f.proxied(t)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const short = 200 * time.Millisecond
	lost := p.LoseReplyAndRefuse([]byte("/refresh"))
	sent := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	err = a.Refresh(ctx, short)
	cancel()
	<-lost
	p.Refuse(false)
	if err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("refresh whose answer was lost and that could not be sent again: %v; want an error that is not ErrLost", err)
	}
	if d := a.Deadline(); d.After(sent.Add(short)) {
		t.Fatalf("deadline %s away after an unanswered Refresh(%s)", time.Until(d).Round(time.Millisecond), short)
	}
	b, err := newClient(t, f.url).Acquire(t.Context(), name, time.Second, lock.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(t.Context())
	if time.Now().Before(a.Deadline()) && a.Err() == nil {
		t.Fatal("a second holder acquired while the first still believes it holds the lock")
	}
}

// TestRefreshOvertakenByRelease: lock's test of the same name through a
// fenced server (docs/design.md, defect 215).
func TestRefreshOvertakenByRelease(t *testing.T) {
	var s *locktest.RefreshBehindRelease
	f := newFixtureOf(t, func(st lock.LeaseStore) lock.LeaseStore { s = locktest.NewRefreshBehindRelease(st); return s })
	l, err := newClient(t, f.url).Acquire(t.Context(), testenv.Name(t), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	locktest.CheckRefreshOvertakenByRelease(t, s, l)
}

// TestReusedAsTheSDKSays: a reentry through a fenced server is Reused, as
// it is in the SDK (client.Lease is lock.Lease). Before, the client's
// leases were never Reused: the answer did not say (docs/design.md,
// defect 216).
func TestReusedAsTheSDKSays(t *testing.T) {
	f := newFixture(t)
	for _, locker := range []struct {
		name string
		l    lock.Locker
	}{{"sdk", f.locks}, {"client", newClient(t, f.url)}} {
		t.Run(locker.name, func(t *testing.T) {
			name := testenv.Name(t)
			outer, err := locker.l.Acquire(t.Context(), name, 3*time.Second, lock.WithHolder("w1"))
			if err != nil {
				t.Fatal(err)
			}
			inner, err := locker.l.Acquire(t.Context(), name, 3*time.Second, lock.WithHolder("w1"))
			if err != nil {
				t.Fatal(err)
			}
			if outer.Reused() || !inner.Reused() || inner.Count() != 2 {
				t.Fatalf("outer Reused %v, inner Reused %v with Count %d; want false, true, 2", outer.Reused(), inner.Reused(), inner.Count())
			}
			if err := errors.Join(inner.Release(t.Context()), outer.Release(t.Context())); err != nil {
				t.Fatal(err)
			}
		})
	}
}
