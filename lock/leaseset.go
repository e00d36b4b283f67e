package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// LeaseKeeper refreshes and releases leases by lease id: all that a Lease
// needs of the place its lease is held. Every LeaseStore is one; package
// client's keeper goes through a fenced server's API.
type LeaseKeeper interface {
	// Refresh extends the lease if leaseID still holds it, and returns its
	// token and the TTL it now has. ErrLost if not held. seq orders the
	// refreshes of one lease (NextRefreshSeq; 0 for none): the store
	// applies none below the highest it applied and answers
	// ErrOutOfOrder instead, so a refresh that arrives late cannot undo a
	// later one. The same seq sent again applies again.
	Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (Grant, error)
	// Release deletes the lease if leaseID holds it; a reentrant holder's
	// lease loses one hold, and is deleted by its last. ErrLost if not
	// held; releasing again by the lease id that released it succeeds. op
	// identifies this release across its retries (NewReleaseID; "" draws
	// one): a release sent again with the same op takes off no second
	// hold, where one without could free a lock another hold still has.
	// An ErrLost the keeper cannot tell from the answer to a release of
	// the lease applied earlier carries ErrMaybeReleased.
	//
	// An error of either that marks ErrCannotSend says that the request
	// did not reach the store and will not if sent again: a keep-alive
	// gives its lease up at once, and Release counts it as not applied.
	Release(ctx context.Context, name, leaseID, op string) error
}

var _ LeaseKeeper = LeaseStore(nil)

// LeaseSet holds the leases kept through one LeaseKeeper: it makes Leases
// of leases granted elsewhere (Adopt), tracks those that are not detached,
// and releases the ones still held on Close. A Client has one over its
// store; package client has one over a fenced server's API.
type LeaseSet struct {
	keeper LeaseKeeper

	mu     sync.Mutex
	leases map[*Lease]struct{}
	closed bool
}

// NewLeaseSet returns an empty set of leases kept through k.
func NewLeaseSet(k LeaseKeeper) (*LeaseSet, error) {
	if k == nil {
		return nil, errors.New("lock: nil lease keeper")
	}
	return &LeaseSet{keeper: k, leases: make(map[*Lease]struct{})}, nil
}

// Adopt makes a Lease of a lease granted elsewhere, for example by a fenced
// server: g is what was granted and start when the request was sent, so
// that validity = g.TTL - elapsed - Drift. The set's keeper refreshes and
// releases it by its lease id. Options: WithKeepAlive or WithDetached;
// the others do not apply (the lease is already held) and are an error. A lease
// with no validity left is released, and Adopt returns an error matching
// ErrTTLTooShort and ErrNotAcquired.
func (s *LeaseSet) Adopt(ctx context.Context, name, leaseID string, g Grant, start time.Time, opts ...Option) (*Lease, error) {
	o, err := ResolveOptions(false, opts...)
	if err != nil {
		return nil, err
	}
	if o.Wait != 0 || o.Retry != nil {
		return nil, fmt.Errorf("%w: WithWait and WithRetry do not apply to Adopt: the lease is already held", ErrInvalidOption)
	}
	if o.Owner != "" || o.Holder != "" || o.Unfair || o.Waiter != "" || o.Final {
		return nil, fmt.Errorf("%w: WithOwner, WithHolder, WithUnfair, WithWaiter and WithFinal do not apply to Adopt: they shape an acquisition, and the lease is already held; give them where it is acquired", ErrInvalidOption)
	}
	if err := validateID(name, leaseID); err != nil {
		return nil, err
	}
	if g.Token == 0 || g.TTL <= 0 {
		return nil, fmt.Errorf("lock: adopt %q: a grant needs a token and a TTL, got %d and %s", name, g.Token, g.TTL)
	}
	if o.Detached {
		// A detached lease is not the set's, but Close's "later adoptions
		// return ErrClosed" holds for it too; it stays the caller's to
		// release (docs/design.md, defect 217). adopt checks the others,
		// and releases them.
		if err := s.checkOpen(); err != nil {
			return nil, err
		}
	}
	return s.adopt(ctx, name, leaseID, g, start, o, g.Reused)
}

// adopt makes the Lease; reused is whether the grant is a hold that existed
// before the acquisition (Lease.Reused).
func (s *LeaseSet) adopt(ctx context.Context, name, id string, g Grant, start time.Time, o AcquireOptions, reused bool) (*Lease, error) {
	took := time.Since(start)
	if validity := g.TTL - took - Drift(g.TTL); validity <= 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = s.keeper.Release(rctx, name, id, "") // the lease expires anyway; releasing only frees it sooner
		return nil, &ttlTooShortError{name: name, ttl: g.TTL, took: took, drift: Drift(g.TTL)}
	}
	l := newLease(ctx, s, name, id, g, start, o.KeepAlive)
	l.reused = reused
	if o.Detached {
		return l, nil
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Release(context.WithoutCancel(ctx))
		return nil, ErrClosed
	}
	s.leases[l] = struct{}{}
	s.mu.Unlock()
	l.start()
	return l, nil
}

func (s *LeaseSet) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

func (s *LeaseSet) forget(l *Lease) {
	s.mu.Lock()
	delete(s.leases, l)
	s.mu.Unlock()
}

// closeReleases is how many leases Close releases at once. A release may
// take more than a round trip (package client's pauses and asks again
// while a server is away), and one after another they would take that
// many times as long, or use up ctx before the last ones are sent.
const closeReleases = 16

// Close releases every lease of the set still held, closeReleases at a
// time, and waits for their keep-alive refreshes in flight. Later
// adoptions return ErrClosed. Close is idempotent.
func (s *LeaseSet) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	leases := make([]*Lease, 0, len(s.leases))
	for l := range s.leases {
		leases = append(leases, l)
	}
	s.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	slots := make(chan struct{}, closeReleases)
	for _, l := range leases {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
