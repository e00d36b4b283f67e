package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Client acquires leases from a LeaseStore.
type Client struct {
	store LeaseStore

	mu     sync.Mutex
	leases map[*Lease]struct{}
	closed bool
}

// New returns a client of store. Close releases the leases it still holds;
// it does not close the store.
func New(store LeaseStore) (*Client, error) {
	if store == nil {
		return nil, errors.New("lock: nil lease store")
	}
	return &Client{store: store, leases: make(map[*Lease]struct{})}, nil
}

// Store returns the client's lease store.
func (c *Client) Store() LeaseStore { return c.store }

// Option configures one Acquire or TryAcquire.
type Option func(*acquireOpts)

type acquireOpts struct {
	retry     RetryStrategy
	wait      time.Duration
	keepAlive bool
	detached  bool
}

// WithRetry sets the fallback strategy for waiters that miss a release
// notification. Default for Acquire: ExponentialBackoff(4ms, 256ms) with no
// limit but the wait budget and the context.
func WithRetry(s RetryStrategy) Option { return func(o *acquireOpts) { o.retry = s } }

// WithWait bounds how long Acquire waits for a held lock before it returns
// ErrNotAcquired. Default 0: wait until the context ends.
func WithWait(d time.Duration) Option { return func(o *acquireOpts) { o.wait = d } }

// WithKeepAlive makes the lease refresh itself every TTL/3 until Release.
// Default off: the lease is lost at its validity deadline unless refreshed.
func WithKeepAlive() Option { return func(o *acquireOpts) { o.keepAlive = true } }

// WithDetached returns a lease with no goroutine and no keep-alive, not
// tracked by the client: Done closes only when Release or Refresh finds it
// lost, not at the deadline. For servers that hand the lease id to a remote
// holder, who refreshes and releases it by id (RefreshID, ReleaseID).
// Default off.
func WithDetached() Option { return func(o *acquireOpts) { o.detached = true } }

// TryAcquire makes one attempt: it returns ErrNotAcquired at once when the
// lock is held.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o := acquireOpts{retry: NoRetry()}
	for _, f := range opts {
		f(&o)
	}
	o.retry, o.wait = NoRetry(), 0
	return c.acquire(ctx, name, ttl, o)
}

// Acquire blocks until it holds the lease of name, the context ends (an
// error matching ctx.Err()), or the wait budget runs out (ErrNotAcquired).
// Waiters wake on the holder's release or when its lease expires.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o := acquireOpts{retry: ExponentialBackoff(4*time.Millisecond, 256*time.Millisecond)}
	for _, f := range opts {
		f(&o)
	}
	if o.wait < 0 {
		return nil, fmt.Errorf("lock: wait %s: want >= 0", o.wait)
	}
	return c.acquire(ctx, name, ttl, o)
}

func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, o acquireOpts) (*Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return nil, err
	}
	if o.retry == nil {
		o.retry = NoRetry()
	}
	if o.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.wait, errWaitBudget)
		defer cancel()
	}
	var (
		notify   <-chan struct{}
		stopWait func()
		busy     error // the last attempt's reason it did not get the lease
	)
	defer func() {
		if stopWait != nil {
			stopWait()
		}
	}()
	for {
		if err := c.checkOpen(); err != nil {
			return nil, err
		}
		l, err := c.attempt(ctx, name, ttl, o)
		if err == nil {
			return l, nil
		}
		var held *HeldError
		if !errors.As(err, &held) && !errors.Is(err, ErrLost) && !errors.Is(err, errNoValidity) {
			return nil, c.fail(ctx, name, err, busy)
		}
		busy = err
		d := o.retry.NextBackoff()
		if d <= 0 {
			return nil, notAcquired(name, busy)
		}
		if notify == nil {
			// Subscribe, then try once more at once: a release between the
			// attempt and the subscription would otherwise be missed. The
			// subscription may take no longer than this round's backoff: a
			// backend that cannot confirm it now (a pub/sub connection being
			// re-established) leaves the waiter to the retry strategy, and
			// the next round subscribes again (docs/design.md, defect 2).
			wctx, cancel := context.WithTimeout(ctx, d)
			notify, stopWait, err = c.store.Watch(wctx, name)
			if err != nil {
				if errors.Is(err, ErrClosed) {
					cancel()
					return nil, c.fail(ctx, name, err, busy)
				}
				<-wctx.Done() // the rest of this round's backoff: never a busy loop
			}
			cancel()
			if ctx.Err() != nil {
				return nil, c.fail(ctx, name, ctx.Err(), busy)
			}
			continue
		}
		if held != nil && held.Remaining > 0 && held.Remaining < d {
			d = held.Remaining
		}
		t := time.NewTimer(d)
		select {
		case <-notify:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, c.fail(ctx, name, ctx.Err(), busy)
		}
		t.Stop()
	}
}

var (
	errWaitBudget = errors.New("lock: wait budget ran out")
	errNoValidity = errors.New("lock: lease granted with no validity left")
)

// fail explains why an acquisition stopped. The end of the wait budget is
// ErrNotAcquired only if an attempt found the lease taken; if the store never
// answered in time, that is the error. Every other context error matches
// ctx.Err().
func (c *Client) fail(ctx context.Context, name string, err, busy error) error {
	if ctx.Err() != nil && context.Cause(ctx) == errWaitBudget {
		if busy != nil {
			return fmt.Errorf("%w: %q still held when the wait budget ran out", ErrNotAcquired, name)
		}
		return fmt.Errorf("lock: acquire %q: the lease store did not answer within the wait budget: %w", name, err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("lock: acquire %q: %w", name, ctx.Err())
	}
	return fmt.Errorf("lock: acquire %q: %w", name, err)
}

// notAcquired is ErrNotAcquired with the last attempt's reason.
func notAcquired(name string, busy error) error {
	var held *HeldError
	if errors.As(busy, &held) {
		return fmt.Errorf("%w: %q is held", ErrNotAcquired, name)
	}
	return fmt.Errorf("%w: %q: %v", ErrNotAcquired, name, busy)
}

// attempt is one pass of the acquisition protocol (docs/design.md,
// "Acquisition protocol").
func (c *Client) attempt(ctx context.Context, name string, ttl time.Duration, o acquireOpts) (*Lease, error) {
	id, err := newLeaseID()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	g, err := c.store.Acquire(ctx, name, id, ttl)
	if err != nil {
		return nil, err
	}
	return c.adopt(ctx, name, id, g, start, o)
}

// Adopt makes a Lease of a lease taken elsewhere, for example through a
// fenced server's API: g is what was granted and start when the request
// was sent, so that validity = g.TTL - elapsed - Drift. The client's store
// refreshes and releases it by its lease id. Options as for Acquire
// (WithKeepAlive, WithDetached). A lease with no validity left is released
// and Adopt returns ErrNotAcquired.
func (c *Client) Adopt(ctx context.Context, name, leaseID string, g Grant, start time.Time, opts ...Option) (*Lease, error) {
	var o acquireOpts
	for _, f := range opts {
		f(&o)
	}
	if err := validateID(name, leaseID); err != nil {
		return nil, err
	}
	if g.Token == 0 || g.TTL <= 0 {
		return nil, fmt.Errorf("lock: adopt %q: a grant needs a token and a TTL, got %d and %s", name, g.Token, g.TTL)
	}
	l, err := c.adopt(ctx, name, leaseID, g, start, o)
	if errors.Is(err, errNoValidity) {
		return nil, fmt.Errorf("%w: %q: %v", ErrNotAcquired, name, err)
	}
	return l, err
}

func (c *Client) adopt(ctx context.Context, name, id string, g Grant, start time.Time, o acquireOpts) (*Lease, error) {
	validity := g.TTL - time.Since(start) - Drift(g.TTL)
	if validity <= 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = c.store.Release(rctx, name, id) // the lease expires anyway; releasing only frees it sooner
		return nil, errNoValidity
	}
	l := newLease(ctx, c, name, id, g, start, o.keepAlive && !o.detached)
	if o.detached {
		return l, nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.Release(context.WithoutCancel(ctx))
		return nil, ErrClosed
	}
	c.leases[l] = struct{}{}
	c.mu.Unlock()
	l.start()
	return l, nil
}

func (c *Client) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
	c.mu.Unlock()
}

// Close releases every lease the client still holds and waits for their
// keep-alive goroutines. Later calls return ErrClosed. Close is idempotent.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	leases := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	var errs []error
	for _, l := range leases {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Inspect reports who holds name.
func (c *Client) Inspect(ctx context.Context, name string) (State, error) {
	if err := ValidateName(name); err != nil {
		return State{}, err
	}
	return c.store.Inspect(ctx, name)
}

// RefreshID refreshes the lease of name held by leaseID, for a holder that
// has only the lease id (see WithDetached). ttl must be valid. ErrLost if
// leaseID does not hold the lease.
func (c *Client) RefreshID(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	if err := validateID(name, leaseID); err != nil {
		return Grant{}, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return Grant{}, err
	}
	return c.store.Refresh(ctx, name, leaseID, ttl)
}

// ReleaseID releases the lease of name held by leaseID. ErrLost if leaseID
// does not hold it.
func (c *Client) ReleaseID(ctx context.Context, name, leaseID string) error {
	if err := validateID(name, leaseID); err != nil {
		return err
	}
	return c.store.Release(ctx, name, leaseID)
}

// ErrInvalidLeaseID: a lease id that this package cannot have issued.
var ErrInvalidLeaseID = errors.New("lock: invalid lease id")

func validateID(name, leaseID string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if len(leaseID) != 32 {
		return fmt.Errorf("%w: %d characters; want 32 hex digits", ErrInvalidLeaseID, len(leaseID))
	}
	if _, err := hex.DecodeString(leaseID); err != nil {
		return fmt.Errorf("%w: want 32 hex digits", ErrInvalidLeaseID)
	}
	return nil
}

// newLeaseID returns 128 random bits in hex.
func newLeaseID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("lock: lease id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
