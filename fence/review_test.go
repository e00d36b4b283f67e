package fence_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
)

// TestMiddlewareWaitEndsWithTheRequest: a request that waits for another
// request of the same resource to finish its handler stops waiting when
// its own context ends (its client went away, the server's timeout): it
// is answered at once and never admitted, rather than holding its
// goroutine, and its place behind the handler, for as long as that
// handler runs.
func TestMiddlewareWaitEndsWithTheRequest(t *testing.T) {
	store := fence.NewMemoryStore()
	entered, unblock := make(chan struct{}), make(chan struct{})
	defer close(unblock)
	var calls atomic.Int32
	h := fence.Middleware(store, func(*http.Request) string { return "res" })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-unblock // a slow write
		}
	}))
	req := func(ctx context.Context, tok fence.Token) *http.Request {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/res", nil)
		fence.SetHeader(r.Header, tok)
		return r
	}
	go h.ServeHTTP(httptest.NewRecorder(), req(context.Background(), 5))
	<-entered

	ctx, cancel := context.WithCancel(context.Background())
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, req(ctx, 6))
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a request whose context ended still waited for the handler of another request of its resource")
	}
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("status %d; want 503", rec.Code)
	}
	if hi := store.Highest("res"); hi != 5 {
		t.Errorf("highest token %d; want 5: the request that gave up was admitted", hi)
	}
}

// TestParseErrorsSayWhatIsAllowed: every token ParseToken refuses is
// answered with what it would take (1 to MaxToken), in the error and in the
// 400 that Middleware writes from it, and the error still matches
// ErrInvalidToken. "-1" and "0" were told only what they were not.
func TestParseErrorsSayWhatIsAllowed(t *testing.T) {
	allowed := strconv.FormatUint(uint64(fence.MaxToken), 10)
	for _, in := range []string{"-1", "+1", "abc", "1.5", "0x10", " 1", "0", "00000000000000000000", "", "123456789012345678901", "9223372036854775808"} {
		_, err := fence.ParseToken(in)
		if !errors.Is(err, fence.ErrInvalidToken) {
			t.Fatalf("ParseToken(%q) = %v, want ErrInvalidToken", in, err)
		}
		if !strings.Contains(err.Error(), allowed) {
			t.Errorf("ParseToken(%q): %q does not say what is allowed (1 to %s)", in, err, allowed)
		}
	}
	h := fence.Middleware(fence.NewMemoryStore(), func(*http.Request) string { return "r" })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a request with an invalid token reached the handler")
	}))
	for _, in := range []string{"-1", "0"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, "/r", nil)
		req.Header.Set(fence.Header, in)
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), allowed) {
			t.Errorf("Middleware, header %q: %d %s; want a 400 that says what is allowed", in, rec.Code, strings.TrimSpace(rec.Body.String()))
		}
	}
}

// lateWrites runs n writers at once, with the tokens 1 to n in a scrambled
// order. guard admits a writer's token and, if it is admitted, calls write,
// which yields a few times (a GC pause, a page fault: anything between the
// check and the write) and then records the token. lateWrites returns how
// many recorded writes landed after a write with a higher token, of how
// many.
func lateWrites(n int, guard func(i int, tok fence.Token, write func())) (late, total int) {
	var mu sync.Mutex
	var wrote []fence.Token
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := fence.Token(1 + (i*7919)%n) // 7919 is prime: a permutation of 1 to n
			<-start
			guard(i, tok, func() {
				for range i % 4 {
					runtime.Gosched()
				}
				mu.Lock()
				wrote = append(wrote, tok)
				mu.Unlock()
			})
		}()
	}
	close(start)
	wg.Wait()
	var max fence.Token
	for _, tok := range wrote {
		if tok < max {
			late++
		}
		max = maxTok(max, tok)
	}
	return late, len(wrote)
}

// TestMemoryStoreDoWritesInTokenOrder: the review's workload, through Do.
// With Admit and then the write, which was all MemoryStore offered outside
// HTTP, admitted writes landed after writes with higher tokens; Do holds
// the resource's turn from the admit to the end of the write.
func TestMemoryStoreDoWritesInTokenOrder(t *testing.T) {
	for round := range 50 {
		store := fence.NewMemoryStore()
		late, total := lateWrites(400, func(_ int, tok fence.Token, write func()) {
			err := store.Do(context.Background(), "one", tok, func(context.Context) error {
				write()
				return nil
			})
			if err != nil && !fence.IsStale(err) {
				t.Errorf("Do(%d) = %v, want nil or stale", tok, err)
			}
		})
		if late > 0 || total == 0 {
			t.Fatalf("round %d: %d of %d admitted writes landed after a write with a higher token", round, late, total)
		}
	}
}

type writeKey struct{}

// TestMemoryStoreDoAndMiddlewareSerialiseTogether: writes through Do and
// through two Middleware values over the same MemoryStore take their turns
// together; a Middleware with turns of its own would let a request's write
// land between a Do's admit and its write, or the other way round.
func TestMemoryStoreDoAndMiddlewareSerialiseTogether(t *testing.T) {
	for round := range 50 {
		store := fence.NewMemoryStore()
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Context().Value(writeKey{}).(func())()
		})
		one := func(*http.Request) string { return "one" }
		a, b := fence.Middleware(store, one)(handler), fence.Middleware(store, one)(handler)
		late, total := lateWrites(400, func(i int, tok fence.Token, write func()) {
			if i%2 == 0 {
				err := store.Do(context.Background(), "one", tok, func(context.Context) error {
					write()
					return nil
				})
				if err != nil && !fence.IsStale(err) {
					t.Errorf("Do(%d) = %v, want nil or stale", tok, err)
				}
				return
			}
			h := a
			if i%4 == 3 {
				h = b
			}
			rec := httptest.NewRecorder()
			req := httptest.NewRequestWithContext(context.WithValue(context.Background(), writeKey{}, write), http.MethodPut, "/one", nil)
			fence.SetHeader(req.Header, tok)
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK && rec.Code != http.StatusConflict {
				t.Errorf("token %d: %d %s, want 200 or 409", tok, rec.Code, rec.Body)
			}
		})
		if late > 0 || total == 0 {
			t.Fatalf("round %d: %d of %d admitted writes landed after a write with a higher token", round, late, total)
		}
	}
}

// doneAsked is a context that says when Done is first asked for: Do asks
// for it when it has to wait for the resource's turn.
type doneAsked struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func (c *doneAsked) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// TestMemoryStoreDoGivesUpWithContext: a Do that waits for another of its
// resource returns its context's error when the context ends, is not
// admitted, and runs no write; so does one whose context had already ended.
func TestMemoryStoreDoGivesUpWithContext(t *testing.T) {
	store := fence.NewMemoryStore()
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- store.Do(context.Background(), "res", 5, func(context.Context) error {
			close(entered)
			<-release // a slow write
			return nil
		})
	}()
	<-entered

	ctx, cancel := context.WithCancel(context.Background())
	wctx := &doneAsked{Context: ctx, asked: make(chan struct{})}
	var wrote atomic.Bool
	second := make(chan error, 1)
	go func() {
		second <- store.Do(wctx, "res", 6, func(context.Context) error {
			wrote.Store(true)
			return nil
		})
	}()
	select {
	case <-wctx.asked: // waiting for the turn
	case err := <-second:
		close(release)
		<-first
		t.Fatalf("a Do for a resource whose write was under way returned %v at once, not waiting for its turn", err)
	case <-time.After(10 * time.Second):
		close(release)
		<-first
		<-second
		t.Fatal("a Do that waited for its resource's turn never watched its context")
	}
	cancel()
	var err error
	select {
	case err = <-second:
		close(release)
	case <-time.After(10 * time.Second):
		t.Error("a Do whose context ended still waited for the write of another")
		close(release)
		err = <-second
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a Do whose context ended while it waited = %v, want context.Canceled", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first Do = %v", err)
	}

	if err := store.Do(ctx, "res", 7, func(context.Context) error {
		wrote.Store(true)
		return nil
	}); !errors.Is(err, context.Canceled) {
		t.Errorf("Do with an ended context = %v, want context.Canceled", err)
	}
	if wrote.Load() {
		t.Error("a Do whose context ended ran its write")
	}
	if hi := store.Highest("res"); hi != 5 {
		t.Errorf("highest %d, want 5: a Do that gave up was admitted", hi)
	}
}

// TestMemoryStoreDoRunsOnlyAdmittedWrites: a stale or invalid token runs no
// write and returns Admit's error; an admitted one runs its write with the
// token in its context and returns the write's error.
func TestMemoryStoreDoRunsOnlyAdmittedWrites(t *testing.T) {
	ctx := context.Background()
	store := fence.NewMemoryStore()
	if err := store.Admit(ctx, "res", 9); err != nil {
		t.Fatal(err)
	}
	never := func(context.Context) error {
		t.Error("Do ran the write of a token it did not admit")
		return nil
	}
	err := store.Do(ctx, "res", 7, never)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Resource != "res" || se.Token != 7 || se.Highest != 9 {
		t.Errorf("Do(7) after 9 = %v, want a *StaleError {res 7 9}", err)
	}
	if err := store.Do(ctx, "res", 0, never); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("Do(0) = %v, want ErrInvalidToken", err)
	}

	failed := errors.New("the write failed")
	err = store.Do(ctx, "res", 10, func(ctx context.Context) error {
		if tok, ok := fence.FromContext(ctx); !ok || tok != 10 {
			t.Errorf("the write's context carries token %d, %v; want 10", tok, ok)
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Errorf("Do(10) = %v, want the write's error", err)
	}
	if hi := store.Highest("res"); hi != 10 {
		t.Errorf("highest %d, want 10: an admitted token stays admitted whatever its write returned", hi)
	}
}

// TestTimeoutHandlerOutsideMiddleware: the placement Middleware's doc asks
// for. The TimeoutHandler answers the first request at its timeout while
// Middleware keeps that request's turn until its write has ended, so the
// next holder is not admitted in between; it gives up at its own timeout.
func TestTimeoutHandlerOutsideMiddleware(t *testing.T) {
	store := fence.NewMemoryStore()
	var mu sync.Mutex
	var wrote []fence.Token
	started, finish := make(chan struct{}), make(chan struct{})
	innerDone := make(chan struct{})
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := fence.FromContext(r.Context())
		if tok == 5 {
			defer close(innerDone)
			close(started)
			<-finish // the write is under way
		}
		mu.Lock()
		wrote = append(wrote, tok)
		mu.Unlock()
	})
	h := http.TimeoutHandler(fence.Middleware(store, func(*http.Request) string { return "r" })(inner), 50*time.Millisecond, "timeout")
	serve := func(tok fence.Token) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, "/r", nil)
		fence.SetHeader(req.Header, tok)
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	c5 := make(chan int, 1)
	go func() { c5 <- serve(5) }()
	<-started
	code5 := <-c5     // answered at the timeout; the write goes on
	code7 := serve(7) // waits for the turn, then its own timeout: not admitted
	close(finish)
	<-innerDone
	if code5 != http.StatusServiceUnavailable || code7 != http.StatusServiceUnavailable {
		t.Errorf("token 5 answered %d, token 7 %d; want both 503 from the TimeoutHandler", code5, code7)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(wrote) != 1 || wrote[0] != 5 {
		t.Errorf("writes %v, want [5]: token 7 gave up waiting", wrote)
	}
	if hi := store.Highest("r"); hi != 5 {
		t.Errorf("highest %d, want 5: token 7 gave up waiting and was not admitted", hi)
	}
}

// TestTransportKeepsAHeaderUnderAnySpelling: header names are
// case-insensitive. A request that has its Fencing-Token under another
// spelling of the name (copied from another map, as HTTP/2 spells it) has
// one; Transport added a second, and the resource answered 400. An empty
// one under another spelling is replaced, not sent beside the token.
func TestTransportKeepsAHeaderUnderAnySpelling(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Values(fence.Header)
	}))
	defer srv.Close()
	c := &http.Client{Transport: &fence.Transport{}}
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"5", []string{"5"}},
		{"", []string{"7"}},
	} {
		got = nil
		req, err := http.NewRequestWithContext(fence.WithToken(t.Context(), 7), http.MethodPut, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header["fencing-token"] = []string{tc.value}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !slices.Equal(got, tc.want) {
			t.Errorf("request with fencing-token %q and a context token 7: server saw %q, want %q", tc.value, got, tc.want)
		}
		//lint:ignore SA1008 the non-canonical key is what the test is about
		if len(req.Header) != 1 || req.Header["fencing-token"][0] != tc.value {
			t.Errorf("Transport changed the caller's request: %v", req.Header)
		}
	}
}
