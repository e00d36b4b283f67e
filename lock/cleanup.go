package lock

import (
	"context"
	"sync"
	"time"

	"github.com/fenced/fenced/internal/clock"
)

// cleanupTimeout bounds a best-effort cleanup after a failed call: the
// release of a lease abandoned, a reentry taken off. An abandon that got
// no answer tries again, each attempt so bounded (abandon).
const cleanupTimeout = time.Second

// maxAbandonsRetrying bounds the abandons trying again at once: in an
// outage every failed acquisition starts one, and those past the bound
// make their one attempt only (their lease expires anyway). It bounds the
// etcd store's goroutines abandoning too (EtcdStore.abandon), where
// those past it wait their turn.
const maxAbandonsRetrying = 64

// cleanups are a store's goroutines of best-effort cleanups that outlive
// the failed call that started them (afterwards); the store's Close waits
// for them (close). RedisStore and RedlockStore embed it (defects 126,
// 127, 145). The zero value is ready.
type cleanups struct {
	// closed, under mu: Close has begun, and a cleanup runs on its
	// caller's goroutine. life ends then too: abandons stop trying again.
	mu       sync.Mutex
	closed   bool
	retrying int
	life     context.Context
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// abandonWindow is how long an abandon that gets no answer tries again:
// the attempt's TTL (a lease it took before the store stopped answering
// is over by then), at least 10 s, so that one the store runs late (a
// Redis paused past the attempt's end) meets the abandon when the store
// is back; at most a minute.
func abandonWindow(ttl time.Duration) time.Duration {
	return min(max(ttl, 10*time.Second), time.Minute)
}

// abandon runs a failed acquisition's release of its lease (or another
// cleanup of the same kind: a granted waiter's leave of the queues that did
// not grant it, RedlockStore.leaveQueues), free, which reports whether the
// store answered: on the caller's goroutine, once,
// bounded by cleanupTimeout past the caller's end, when inLine (its order
// against the acquisition's next request matters, and an attempt sent
// again later could come after that request); else on a goroutine of the
// store, trying again until the store answers, for up to window
// (defect 145). Once Close has begun it runs once, on the caller's
// goroutine.
//
// Only for a cleanup whose order does not matter when not inLine: one that
// only frees sooner what would expire anyway, and that no later call can
// be hurt by coming before it.
func (c *cleanups) abandon(ctx context.Context, inLine bool, window time.Duration, free func(context.Context) error) {
	once := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		return free(ctx)
	}
	c.mu.Lock()
	inLine = inLine || c.closed
	if !inLine {
		c.wg.Add(1)
		if c.life == nil {
			c.life, c.stop = context.WithCancel(context.Background())
		}
	}
	life := c.life
	c.mu.Unlock()
	if inLine {
		_ = once()
		return
	}
	go func() {
		defer c.wg.Done()
		if once() == nil || !c.retry() {
			return
		}
		defer c.retried()
		end := time.Now().Add(window)
		for pause := 50 * time.Millisecond; time.Now().Before(end); pause = min(2*pause, time.Second) {
			if !clock.Sleep(life, pause) || once() == nil {
				return
			}
		}
	}()
}

// retry reports whether an abandon may try again (under the bound), and
// counts it; retried uncounts it.
func (c *cleanups) retry() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.retrying >= maxAbandonsRetrying {
		return false
	}
	c.retrying++
	return true
}

func (c *cleanups) retried() {
	c.mu.Lock()
	c.retrying--
	c.mu.Unlock()
}

// close has the cleanups started from now on run on their callers'
// goroutines, stops the abandons trying again, and waits for those
// running, each bounded by cleanupTimeout. It is idempotent.
func (c *cleanups) close() {
	c.mu.Lock()
	c.closed = true
	if c.stop != nil {
		c.stop()
	}
	c.mu.Unlock()
	c.wg.Wait()
}
