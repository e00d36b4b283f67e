package lockbench

import (
	"context"
	"testing"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// deadlineLocker is a lock whose Lock, as go-redis with
// ContextTimeoutEnabled does, reports the context's deadline as soon as it
// passes, by the clock, without waiting for the context's own timer.
type deadlineLocker struct{ sem chan struct{} }

func (d deadlineLocker) Lock(ctx context.Context, _ string) (func(context.Context) error, error) {
	dl, _ := ctx.Deadline()
	t := time.NewTimer(time.Until(dl))
	defer t.Stop()
	select {
	case d.sem <- struct{}{}:
		return func(context.Context) error { <-d.sem; return nil }, nil
	case <-t.C:
		return nil, context.DeadlineExceeded
	}
}

func (deadlineLocker) Close() error { return nil }

// The hot-name scenario does not count as errors the acquisitions that its
// own end interrupted, even when the lock reports the deadline before the
// scenario's context is marked done. Before, a run of fenced/redis counted
// 11 such errors.
func TestHotNameEndIsNotAnError(t *testing.T) {
	sem := make(chan struct{}, 1)
	impl := Impl{Name: "deadline", NewLocker: func(context.Context) (Locker, error) { return deadlineLocker{sem}, nil }}
	cfg := Config{Contenders: 8, Duration: 50 * time.Millisecond}
	var (
		res  Result
		errs benchkit.Errs
	)
	for range 20 {
		if err := hotName(t.Context(), cfg, impl, &res, &errs); err != nil {
			t.Fatal(err)
		}
	}
	if n, first := errs.Result(); n > 0 {
		t.Fatalf("%d errors, the first: %v", n, first)
	}
	if res.Acquisitions == 0 {
		t.Fatal("no acquisitions")
	}
}
