package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Locker takes leases: *Client with a lease store in this process, and
// *client.Client through a fenced server. Code written against Locker moves
// between the two unchanged; both honour the same Options, resolved by
// ResolveOptions, and return the same *Lease.
type Locker interface {
	// Acquire blocks until it holds the lease of name, the context ends, or
	// the WithWait budget runs out (ErrNotAcquired).
	Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error)
	// TryAcquire makes one attempt: ErrNotAcquired at once when the lock is
	// held.
	TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error)
}

var _ Locker = (*Client)(nil)

// Option configures one Acquire or TryAcquire. An option that does not
// apply to the call it is given to is an error (ErrInvalidOption), not
// silently dropped.
type Option func(*acquireOpts)

type acquireOpts struct {
	retry     RetryStrategy
	retrySet  bool
	wait      time.Duration
	waitSet   bool
	keepAlive bool
	detached  bool
	nilOption bool
}

// WithRetry sets the fallback strategy for waiters that miss a release
// notification. Default for Acquire: ExponentialBackoff(4ms, 256ms) with no
// limit but the wait budget and the context. Acquire only: TryAcquire
// makes one attempt, and a fenced server (package client) does the waiting
// itself.
func WithRetry(s RetryStrategy) Option {
	return func(o *acquireOpts) { o.retry, o.retrySet = s, true }
}

// WithWait bounds how long Acquire waits for a held lock before it returns
// ErrNotAcquired. Default 0: wait until the context ends. Acquire only.
func WithWait(d time.Duration) Option {
	return func(o *acquireOpts) { o.wait, o.waitSet = d, true }
}

// WithKeepAlive makes the lease refresh itself every TTL/3 until Release.
// Default off: the lease is lost at its validity deadline unless refreshed.
// Not with WithDetached.
func WithKeepAlive() Option { return func(o *acquireOpts) { o.keepAlive = true } }

// WithDetached returns a lease with no goroutine and no keep-alive, not
// tracked by the client: Done closes only when Release or Refresh finds it
// lost, not at the deadline. For servers that hand the lease id to a remote
// holder, who refreshes and releases it by id (RefreshID, ReleaseID).
// Default off. Not with WithKeepAlive.
func WithDetached() Option { return func(o *acquireOpts) { o.detached = true } }

// ErrInvalidOption: an option that does not apply to the call, or an
// invalid value. The message says what is allowed.
var ErrInvalidOption = errors.New("lock: invalid option")

// AcquireOptions are the options of one acquisition, resolved and checked
// by ResolveOptions: what another implementation of Locker needs to honour
// them as Client does.
type AcquireOptions struct {
	// Try is true for TryAcquire: one attempt.
	Try bool
	// Wait is WithWait's budget; 0 waits until the context ends.
	Wait time.Duration
	// Retry is WithRetry's strategy; nil when it was not given (Client then
	// uses its default).
	Retry RetryStrategy
	// KeepAlive and Detached are WithKeepAlive and WithDetached.
	KeepAlive, Detached bool
}

// ResolveOptions applies opts for Acquire (try false) or TryAcquire (try
// true). It returns an error matching ErrInvalidOption for an option that
// does not apply (WithWait or WithRetry with TryAcquire), for WithDetached
// with WithKeepAlive, and for invalid values (a negative wait, a nil
// strategy, a nil Option).
func ResolveOptions(try bool, opts ...Option) (AcquireOptions, error) {
	var o acquireOpts
	for _, f := range opts {
		if f == nil {
			o.nilOption = true
			continue
		}
		f(&o)
	}
	r := AcquireOptions{Try: try, Wait: o.wait, Retry: o.retry, KeepAlive: o.keepAlive, Detached: o.detached}
	switch {
	case o.nilOption:
		return r, fmt.Errorf("%w: a nil Option", ErrInvalidOption)
	case try && o.waitSet:
		return r, fmt.Errorf("%w: WithWait does not apply to TryAcquire, which makes one attempt; use Acquire with WithWait to wait up to a bound", ErrInvalidOption)
	case try && o.retrySet:
		return r, fmt.Errorf("%w: WithRetry does not apply to TryAcquire, which makes one attempt; use Acquire to wait", ErrInvalidOption)
	case o.wait < 0:
		return r, fmt.Errorf("%w: WithWait(%s): want >= 0 (0 waits until the context ends)", ErrInvalidOption, o.wait)
	case o.retrySet && o.retry == nil:
		return r, fmt.Errorf("%w: WithRetry(nil): want a strategy, such as ExponentialBackoff(4*time.Millisecond, 256*time.Millisecond)", ErrInvalidOption)
	case o.keepAlive && o.detached:
		return r, fmt.Errorf("%w: WithDetached and WithKeepAlive together: a detached lease has no goroutine to keep it alive; its remote holder refreshes it by lease id (RefreshID). Give one of them", ErrInvalidOption)
	}
	return r, nil
}
