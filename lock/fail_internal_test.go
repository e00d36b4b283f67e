package lock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// lateCtx is a context whose deadline has passed by the clock but which is
// marked done only when its parent is cancelled: the moment between a
// store that ends a call at the deadline itself (go-redis with
// ContextTimeoutEnabled) and the context's own timer.
type lateCtx struct {
	context.Context
	deadline time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// The end of a wait budget is a WaitError even when the store reported the
// deadline before the budget's context was marked done. Before, the caller
// got the store's "context deadline exceeded" as a backend failure (a 503
// over HTTP, not a 409).
func TestWaitBudgetSeenFirstByTheStore(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	ctx := lateCtx{parent, time.Now().Add(-time.Millisecond)}
	go func() {
		time.Sleep(5 * time.Millisecond) // the context's timer, a moment late
		cancel(errWaitBudget)
	}()
	c := &Client{}
	storeErr := backendErr("redis", "acquire", fmt.Errorf("i/o: %w", context.DeadlineExceeded))
	err := c.fail(ctx, "n", storeErr, &HeldError{Position: 2}, time.Now().Add(-time.Second))
	var we *WaitError
	if !errors.As(err, &we) || we.Position != 2 || !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("got %v, want a WaitError at place 2", err)
	}
}
