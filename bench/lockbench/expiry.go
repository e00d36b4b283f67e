package lockbench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// expiry: the handover of a lock whose holder stopped refreshing. Expirers
// names at once, each with a holder that takes it with ExpiryTTL through
// Impl.Abandon and walks away, and a waiter that asks for it right after
// with the implementation's ordinary waiting Lock. The handover is from
// the holder's TTL running out (counted from before its request, the
// earliest the store can free it) to the waiter's Lock returning.
func expiry(ctx context.Context, cfg Config, impl Impl, res *Result, e *benchkit.Errs) error {
	if impl.Abandon == nil || cfg.Expirers == 0 {
		return nil
	}
	ls, err := newLockers(ctx, impl, cfg.Expirers)
	if err != nil {
		return err
	}
	defer closeLockers(ls)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got []time.Duration
	)
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("bench-expiry-%d-%d", i, len(res.handovers))
			t0 := time.Now()
			if err := impl.Abandon(ctx, name, cfg.ExpiryTTL); err != nil {
				e.Add(fmt.Errorf("expiry: holder: %w", err))
				return
			}
			lctx, cancel := context.WithTimeout(ctx, cfg.ExpiryTTL+opTimeout)
			defer cancel()
			unlock, err := l.Lock(lctx, name)
			if err != nil {
				e.Add(fmt.Errorf("expiry: waiter: %w", err))
				return
			}
			d := time.Since(t0) - cfg.ExpiryTTL
			if err := unlock(lctx); err != nil {
				e.Add(fmt.Errorf("expiry: waiter: release: %w", err))
			}
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.handovers = append(res.handovers, got...)
	return ctx.Err()
}
