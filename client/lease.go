package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

// Lease is a lock held through a fenced server: the same shape as
// lock.Lease, so that code can move between the embedded lock package and
// the service. Pass Token to the protected resource with every write; the
// resource, not the lease, is what stops a late writer.
//
// The lease is valid until Deadline. Done is closed, and Context cancelled,
// once, when the lease is lost (a refresh is answered 410 lost, or the
// deadline passes without a successful refresh) or released. Err says
// which: lock.ErrLost, lock.ErrExpired or lock.ErrReleased.
type Lease struct {
	c     *Client
	name  string
	id    string
	token fence.Token

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	ttl      time.Duration // granted by the server
	askTTL   time.Duration // asked for; what a refresh with ttl 0 asks again
	deadline time.Time
	released bool

	keepAlive bool
	poke      chan struct{} // the deadline moved
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

// Name is the lock name.
func (l *Lease) Name() string { return l.name }

// ID is the lease id: 128 random bits in hex, known only to the holder.
func (l *Lease) ID() string { return l.id }

// Token is the fencing token granted with the lease.
func (l *Lease) Token() fence.Token { return l.token }

// TTL is the TTL the server really granted, which may be longer than asked
// (an etcd lease store rounds up to whole seconds).
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Deadline is when the lease stops being valid unless refreshed: the TTL
// from when the acquire or refresh request was sent, less the drift
// allowance (1% of the TTL + 2ms).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context is cancelled when the lease is lost or released. It carries the
// token (fence.FromContext) and the values of the acquiring call's context.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held, then lock.ErrReleased,
// lock.ErrExpired, or an error matching lock.ErrLost.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Refresh extends the lease to ttl from now; 0 asks for the TTL of the last
// acquire or refresh. It returns an error matching lock.ErrLost, and the
// lease is lost, if the server answers that the lease id no longer holds
// the lease. Other failures (network, 503) leave the lease as it was.
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		l.mu.Lock()
		ttl = l.askTTL
		l.mu.Unlock()
	}
	if err := lock.ValidateTTL(ttl); err != nil {
		return err
	}
	if ttl%time.Millisecond != 0 {
		return fmt.Errorf("%w: %s; want whole milliseconds", lock.ErrInvalidTTL, ttl)
	}
	if err := l.Err(); err != nil {
		return err
	}
	start := time.Now()
	var a leaseAnswer
	err := l.c.do(ctx, http.MethodPost, lockPath(l.name, "refresh"), refreshBody{LeaseID: l.id, TTLMs: ttl.Milliseconds()}, &a)
	if err != nil {
		if errors.Is(err, lock.ErrLost) {
			l.lose(lock.ErrLost)
		}
		return fmt.Errorf("client: refresh %q: %w", l.name, err)
	}
	if a.TTLMs <= 0 {
		return fmt.Errorf("client: refresh %q: the server's answer has no ttl_ms", l.name)
	}
	got := time.Duration(a.TTLMs) * time.Millisecond
	l.mu.Lock()
	l.ttl, l.askTTL = got, ttl
	if d := start.Add(got - lock.Drift(got)); d.After(l.deadline) {
		l.deadline = d
	}
	l.mu.Unlock()
	select {
	case l.poke <- struct{}{}:
	default:
	}
	return nil
}

// Release stops the keep-alive, deletes the lease if it is still held and
// wakes waiters. It returns an error matching lock.ErrLost if the lease had
// been lost before: a write made under it may have overlapped another
// holder's. Releasing twice returns nil.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.mu.Unlock()
	l.halt()
	lostBefore := l.Err()
	err := l.c.do(ctx, http.MethodPost, lockPath(l.name, "release"), releaseBody{LeaseID: l.id}, nil)
	l.lose(lock.ErrReleased)
	l.c.forget(l)
	if lostBefore != nil && !errors.Is(lostBefore, lock.ErrReleased) {
		return lostBefore
	}
	if err != nil {
		return fmt.Errorf("client: release %q: %w", l.name, err)
	}
	return nil
}

func (l *Lease) lose(cause error) { l.cancel(cause) }

// halt stops the monitor goroutine and waits for it.
func (l *Lease) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// monitor is the lease's one goroutine, owned by the lease: Release (or the
// client's Close) stops it and waits for it. It refreshes every TTL/3 when
// keep-alive is on, and declares the lease lost when a refresh is answered
// lost or the deadline passes. A refresh that fails for another reason
// (network, 503) is retried until the deadline.
func (l *Lease) monitor() {
	defer l.wg.Done()
	defer l.c.forget(l)
	next := time.Now()
	if l.keepAlive {
		next = next.Add(l.TTL() / 3)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wake := l.Deadline()
		if l.keepAlive && next.Before(wake) {
			wake = next
		}
		timer.Reset(time.Until(wake))
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-l.poke:
			timer.Stop()
			continue
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(l.Deadline()) {
			l.lose(lock.ErrExpired)
			return
		}
		if !l.keepAlive || now.Before(next) {
			continue
		}
		ctx, cancel := context.WithDeadline(l.ctx, l.Deadline())
		err := l.Refresh(ctx, 0)
		cancel()
		switch {
		case err == nil:
			next = time.Now().Add(l.TTL() / 3)
		case l.Err() != nil:
			return
		default:
			// Transient: try again soon, but not in a busy loop.
			next = time.Now().Add(min(l.TTL()/10, time.Second))
		}
	}
}
