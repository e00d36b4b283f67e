package lock

import (
	"context"
	"time"

	"github.com/fenced/fenced/fence"
)

// LeaseStore holds leases and hands out their tokens. RedisStore and
// EtcdStore implement it. Callers validate names and TTLs before calling.
type LeaseStore interface {
	// Acquire makes one attempt at the lease of name for leaseID, and takes
	// a token for it (steps 2 to 4 of the acquisition protocol). It returns
	// a *HeldError (ErrNotAcquired) when another holder has the lease, and
	// ErrLost when the lease was lost while the token was being taken.
	Acquire(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error)
	// Refresh extends the lease if leaseID still holds it, and returns its
	// token and the TTL it now has. ErrLost if not held.
	Refresh(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error)
	// Release deletes the lease if leaseID holds it and notifies waiters.
	// ErrLost if not held.
	Release(ctx context.Context, name, leaseID string) error
	// Watch returns a channel that receives a value when the lease of name
	// may have become free. The subscription is active when Watch returns.
	// stop ends it.
	Watch(ctx context.Context, name string) (ch <-chan struct{}, stop func(), err error)
	// Inspect reports who holds name now.
	Inspect(ctx context.Context, name string) (State, error)
	// Ping checks that the backends answer.
	Ping(ctx context.Context) error
}

// Grant is a lease held: its token and the TTL it has.
type Grant struct {
	Token fence.Token
	TTL   time.Duration // the TTL the store really granted, counted from before the request was sent
}

// State is a lock's state as Inspect sees it.
type State struct {
	Held      bool
	LeaseID   string
	Token     fence.Token
	Remaining time.Duration // how long the lease has left; at least 1ms while held, 0 when free
}
