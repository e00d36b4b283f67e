package lock

import (
	"cmp"
	"context"
	"time"

	"github.com/fenced/fenced/fence"
)

// LeaseStore holds leases and hands out their tokens. RedisStore,
// RedlockStore and EtcdStore implement it. Callers validate names, TTLs,
// owners and holders before calling.
type LeaseStore interface {
	LeaseKeeper
	// Acquire makes one attempt at the lease of req.Name for req.LeaseID,
	// and takes a token for it (steps 2 to 4 of the acquisition protocol).
	// It returns a *HeldError (ErrNotAcquired) when another holder has the
	// lease, or another waiter is ahead in the queue, and ErrLost when the
	// lease was lost while the token was being taken.
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)
	// Watch returns a channel that receives a value when the lease of name
	// may have become free for waiter ("" for an unfair waiter, which any
	// release wakes). The subscription is active when Watch returns. stop
	// ends it. The channel is closed if the subscription ends by itself
	// (etcd lost its leader): the caller subscribes again.
	Watch(ctx context.Context, name, waiter string) (ch <-chan struct{}, stop func(), err error)
	// Leave gives up waiter's place in name's queue.
	Leave(ctx context.Context, name, waiter string) error
	// Inspect reports who holds name now, and who waits.
	Inspect(ctx context.Context, name string) (State, error)
	// List returns held locks in pages.
	List(ctx context.Context, req ListRequest) (ListPage, error)
	// ForceRelease deletes the lease of name whoever holds it (an
	// operator's act) and wakes the next waiter. It returns the state the
	// lock had; Held is false if nobody held it. A token other than 0
	// makes it conditional: only a grant with that token is removed, and
	// a lock held by another is a *HeldByOtherError, checked atomically
	// with the delete.
	ForceRelease(ctx context.Context, name string, token fence.Token) (State, error)
	// Ping checks that the backends answer and take writes: readiness.
	Ping(ctx context.Context) error
}

// AcquireRequest is one attempt at a lease.
type AcquireRequest struct {
	Name    string
	LeaseID string        // 128 random bits in hex, new for every attempt
	TTL     time.Duration // validated
	// Owner is a label for people, shown by Inspect and List; "" for none.
	Owner string
	// Waiter is the caller's place in the lock's queue, the same across
	// the attempts of one acquisition: the lock goes to the waiter that
	// has waited longest. "" takes a free lock whoever waits (unfair, as
	// TryAcquire does).
	Waiter string
	// WaiterTTL is how long a waiter's place lasts without another attempt;
	// a waiter that gave up or died leaves the queue when it runs out. The
	// etcd store keeps a place on its session instead: it lasts until the
	// waiter leaves (the store deletes it later if etcd does not answer
	// then) or the process dies and the session expires.
	WaiterTTL time.Duration
	// Rejoin is the id a grant records for a caller that may ask again
	// after a grant whose answer it never got (a fenced server's caller,
	// WithWaiter): an attempt with that id that finds the grant gets the
	// same lease again (its lease id and token, extended to TTL, its count
	// unchanged) instead of waiting behind it (docs/design.md, "A lost
	// answer"). A fair waiter's is its Waiter, which then keeps its place
	// across calls; an unfair attempt's names it alone. "" records none.
	Rejoin string
	// Holder is the holder's identity for reentrancy: an attempt by the
	// holder that holds the lock now gets its lease and token again, and
	// the lock counts one more release to go. "" is not reentrant.
	Holder string
}

// Grant is a lease held: its token and the TTL it has.
type Grant struct {
	Token fence.Token
	TTL   time.Duration // the TTL the store really granted, counted from before the request was sent
	// LeaseID is the lease id that holds the lock: the attempt's, or, when
	// a holder reentered a lock it held (Count > 1), the lease id it holds
	// it by.
	LeaseID string
	// Count is how many releases the lock takes to be freed: 1, or more
	// for a reentrant holder.
	Count int
	// Reused is for Adopt: the grant is a hold that existed before the
	// acquisition that got it (Lease.Reused), as a fenced server says of
	// its grants. Stores leave it false.
	Reused bool
}

// State is a lock's state as Inspect sees it.
type State struct {
	Name      string
	Held      bool
	LeaseID   string
	Token     fence.Token
	Remaining time.Duration // how long the lease has left; at least 1ms while held, 0 when free
	Owner     string        // the owner label given at acquisition
	Holder    string        // the reentrant holder's identity
	Count     int           // releases to go: 1, or more for a reentrant holder
	// LastToken, for a free lock, is the token of the lease that held it
	// last, while the store still remembers (until that lease's TTL would
	// have run out); 0 when it does not.
	LastToken fence.Token
	// Waiters is how many wait in its queue; OldestWait how long the one
	// at the head has waited.
	Waiters    int
	OldestWait time.Duration
}

// mark is what a reentry's count records the hold under, so that a
// request sent again finds it counted (defect 42): the acquisition's id
// (Rejoin, else its Waiter) with a "w", or the attempt's lease id.
func (r AcquireRequest) mark() string {
	if id := cmp.Or(r.Rejoin, r.Waiter); id != "" {
		return "w" + id
	}
	return r.LeaseID
}

// ListRequest asks for one page of held locks.
type ListRequest struct {
	Prefix string // lock names that start with it; "" for all
	Limit  int    // at most this many; validated, 1 to MaxListLimit
	Cursor string // from the previous page's Next; "" for the first page
}

// ListPage is one page of held locks, in no promised order. Next is the
// cursor of the next page, "" after the last. A lock held while all the
// pages are read is listed; one acquired or released meanwhile may be
// missed or listed twice. So may one held all along on a Redis Cluster
// whose slots move or whose masters fail over between the pages: each
// master is scanned in turn (RedisStore.List).
type ListPage struct {
	Locks []State
	Next  string
}

// MaxListLimit bounds ListRequest.Limit.
const MaxListLimit = 1000
