package lock

import (
	"context"
	"sync"
	"time"
)

// cleanupTimeout bounds a best-effort cleanup after a failed call: the
// release of a lease abandoned, a reentry taken off.
const cleanupTimeout = time.Second

// cleanups are a store's goroutines of best-effort cleanups that outlive
// the failed call that started them (afterwards); the store's Close waits
// for them (close). RedisStore and RedlockStore embed it (defects 126,
// 127). The zero value is ready.
type cleanups struct {
	// closed, under mu: Close has begun, and a cleanup runs on its
	// caller's goroutine.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// afterwards runs a best-effort cleanup of a failed call, bounded by
// cleanupTimeout and not by ctx (which may be what ended), on a goroutine
// of the store, which Close waits for: the caller's error need not wait
// for it. Once Close has begun it runs on the caller's goroutine.
//
// Only for a cleanup whose order does not matter: one that only frees
// sooner what would expire anyway, and that no later call can be hurt by
// coming before it.
func (c *cleanups) afterwards(ctx context.Context, cleanup func(context.Context)) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if closed {
		defer cancel()
		cleanup(ctx)
		return
	}
	go func() {
		defer c.wg.Done()
		defer cancel()
		cleanup(ctx)
	}()
}

// abandon runs a failed acquisition's release of its lease, free: on the
// caller's goroutine, bounded by cleanupTimeout past the caller's end, when
// inLine (its order against the acquisition's next request matters), else
// afterwards.
func (c *cleanups) abandon(ctx context.Context, inLine bool, free func(context.Context)) {
	if !inLine {
		c.afterwards(ctx, free)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	free(ctx)
}

// close has the cleanups started from now on run on their callers'
// goroutines, and waits for those running, each bounded by
// cleanupTimeout. It is idempotent.
func (c *cleanups) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
