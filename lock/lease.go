package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
)

// Lease is a held lock: a lease in the store and the fencing token it was
// granted. Pass Token to the protected resource with every write; the
// resource, not the lease, is what stops a late writer.
//
// The lease is valid until Deadline. Done is closed, and Context cancelled,
// once, when the lease is lost (a refresh finds it taken or gone, or the
// deadline passes without a refresh) or released. Err says which.
type Lease struct {
	c     *Client
	name  string
	id    string
	token fence.Token

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	released bool

	keepAlive bool
	poke      chan struct{}   // the deadline moved
	stopCtx   context.Context // cancelled by halt: ends the monitor and a refresh in flight
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

func newLease(ctx context.Context, c *Client, name, id string, g Grant, deadline time.Time, keepAlive bool) *Lease {
	l := &Lease{c: c, name: name, id: id, token: g.Token, ttl: g.TTL, deadline: deadline,
		keepAlive: keepAlive, poke: make(chan struct{}, 1)}
	// The lease outlives the acquiring call's cancellation but keeps its
	// values, and carries its token for fence.Transport.
	l.ctx, l.cancel = context.WithCancelCause(fence.WithToken(context.WithoutCancel(ctx), g.Token))
	l.stopCtx, l.stop = context.WithCancel(l.ctx)
	return l
}

// Name is the lock name.
func (l *Lease) Name() string { return l.name }

// ID is the lease id: 128 random bits in hex, known only to the holder.
func (l *Lease) ID() string { return l.id }

// Token is the fencing token granted with the lease.
func (l *Lease) Token() fence.Token { return l.token }

// TTL is the TTL the store really granted, which may be longer than asked
// (etcd leases have whole seconds and a minimum).
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Deadline is when the lease stops being valid unless refreshed: the TTL
// from the start of the acquisition, less the drift allowance.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context is cancelled when the lease is lost or released. It carries the
// token (fence.FromContext).
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held, then ErrReleased, ErrExpired, or an
// error matching ErrLost.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Refresh extends the lease to ttl from now; 0 keeps the current TTL. It
// returns ErrLost, and the lease is lost, if the lease id no longer holds
// the lease.
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = l.TTL()
	}
	if err := ValidateTTL(ttl); err != nil {
		return err
	}
	if err := l.Err(); err != nil {
		return err
	}
	start := time.Now()
	g, err := l.c.store.Refresh(ctx, l.name, l.id, ttl)
	if err != nil {
		if errors.Is(err, ErrLost) {
			l.lose(ErrLost)
		}
		return err
	}
	got := g.TTL
	l.mu.Lock()
	l.ttl = got
	if d := start.Add(got - Drift(got)); d.After(l.deadline) {
		l.deadline = d
	}
	l.mu.Unlock()
	select {
	case l.poke <- struct{}{}:
	default:
	}
	return nil
}

// Release deletes the lease if it is still held and wakes waiters. It
// returns ErrLost if the lease had been lost before: a write made under it
// may have overlapped another holder's. Releasing twice returns nil.
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
	err := l.c.store.Release(ctx, l.name, l.id)
	l.lose(ErrReleased)
	l.c.forget(l)
	if lostBefore != nil && !errors.Is(lostBefore, ErrReleased) {
		return lostBefore
	}
	return err
}

func (l *Lease) lose(cause error) { l.cancel(cause) }

// halt stops the monitor goroutine and waits for it.
func (l *Lease) halt() {
	l.stop()
	l.wg.Wait()
}

func (l *Lease) start() {
	l.wg.Add(1)
	go l.monitor()
}

// monitor is the lease's one goroutine. It refreshes every TTL/3 when
// keep-alive is on, and declares the lease lost when a refresh finds it not
// held or the deadline passes. A refresh that fails for another reason
// (network) is retried until the deadline, as Consul's monitorLock does.
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
		deadline := l.Deadline()
		wake := deadline
		if l.keepAlive && next.Before(wake) {
			wake = next
		}
		timer.Reset(time.Until(wake))
		select {
		case <-l.stopCtx.Done(): // halted, or lost (stopCtx is a child of ctx)
			return
		case <-l.poke:
			timer.Stop()
			continue
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(l.Deadline()) {
			l.lose(ErrExpired)
			return
		}
		if !l.keepAlive || now.Before(next) {
			continue
		}
		ctx, cancel := context.WithDeadline(l.stopCtx, l.Deadline())
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
