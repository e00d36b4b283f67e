package fence_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
