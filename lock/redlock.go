package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

// RedlockStore holds a lease on a majority of independent Redis nodes
// (Redlock), so that losing a minority of them loses no lease. It takes one
// token per grant from the sequencer, like RedisStore; the token, not the
// quorum, is what keeps a resource safe when a node restarts without
// persistence or a pause outlives the lease.
//
// Each node call is bounded by the node timeout, so a dead node costs at
// most that much per operation.
type RedlockStore struct {
	nodes       []*RedisStore
	seq         sequencer.Sequencer
	quorum      int
	nodeTimeout time.Duration
}

var _ LeaseStore = (*RedlockStore)(nil)

// RedlockOption configures a RedlockStore.
type RedlockOption func(*RedlockStore) error

// WithNodeTimeout bounds each call to one node. Default 50ms; allowed 1ms
// to 10s. Keep it well below the TTL: the time it takes counts against
// the lease's validity.
func WithNodeTimeout(d time.Duration) RedlockOption {
	return func(s *RedlockStore) error {
		if d < time.Millisecond || d > 10*time.Second {
			return fmt.Errorf("lock: node timeout %s: want 1ms to 10s", d)
		}
		s.nodeTimeout = d
		return nil
	}
}

// NewRedlockStore returns a store on independent Redis nodes (at least 3,
// an odd number is best) with tokens from seq. Keys are as in RedisStore,
// on every node. Close stops the notification subscribers; it does not
// close the clients or seq.
func NewRedlockStore(nodes []redis.UniversalClient, seq sequencer.Sequencer, opts ...RedlockOption) (*RedlockStore, error) {
	if len(nodes) < 3 {
		return nil, fmt.Errorf("lock: Redlock needs at least 3 independent Redis nodes, got %d", len(nodes))
	}
	if seq == nil {
		return nil, errors.New("lock: NewRedlockStore needs a sequencer")
	}
	s := &RedlockStore{seq: seq, quorum: len(nodes)/2 + 1, nodeTimeout: 50 * time.Millisecond}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	for i, rdb := range nodes {
		n, err := NewRedisStore(rdb, seq)
		if err != nil {
			return nil, fmt.Errorf("lock: Redlock node %d: %w", i, err)
		}
		s.nodes = append(s.nodes, n)
	}
	return s, nil
}

// each runs f on every node at once, each call bounded by the node timeout,
// and returns the per-node errors in node order.
func (s *RedlockStore) each(ctx context.Context, f func(ctx context.Context, i int, n *RedisStore) error) []error {
	errs := make([]error, len(s.nodes))
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, s.nodeTimeout)
			defer cancel()
			errs[i] = f(nctx, i, n)
		}()
	}
	wg.Wait()
	return errs
}

func count(errs []error) (ok int) {
	for _, err := range errs {
		if err == nil {
			ok++
		}
	}
	return ok
}

// Acquire implements LeaseStore: the lease on a majority, one token, and a
// confirm on a majority.
func (s *RedlockStore) Acquire(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	ms := ttl.Milliseconds()
	remaining := make([]time.Duration, len(s.nodes))
	errs := s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error {
		held, err := acquireScript.Run(ctx, n.rdb, n.keys(name)[:1], leaseID, ms).Int64()
		if err != nil {
			return err
		}
		if held >= 0 {
			remaining[i] = time.Duration(held) * time.Millisecond
			return &HeldError{}
		}
		return nil
	})
	if count(errs) < s.quorum {
		s.abandon(ctx, name, leaseID)
		if err := ctx.Err(); err != nil {
			return Grant{}, err
		}
		// Held somewhere: wait like any waiter. Held nowhere: the nodes
		// did not answer, which waiting will not fix.
		var held *HeldError
		for i, err := range errs {
			if errors.Is(err, ErrNotAcquired) && (held == nil || remaining[i] < held.Remaining) {
				held = &HeldError{Remaining: remaining[i]}
			}
		}
		if held == nil {
			return Grant{}, fmt.Errorf("lock: Redlock: fewer than %d of %d nodes answered: %w", s.quorum, len(s.nodes), errors.Join(errs...))
		}
		return Grant{}, held
	}
	tok, err := s.seq.Next(ctx, name, leaseID)
	if err != nil {
		s.abandon(ctx, name, leaseID)
		return Grant{}, fmt.Errorf("lock: token: %w", err)
	}
	errs = s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error {
		pttl, err := confirmScript.Run(ctx, n.rdb, n.keys(name), leaseID, uint64(tok)).Int64()
		if err == nil && pttl < 0 {
			err = ErrLost
		}
		return err
	})
	if count(errs) < s.quorum {
		s.abandon(ctx, name, leaseID)
		return Grant{}, ErrLost
	}
	return Grant{Token: tok, TTL: ttl}, nil
}

func (s *RedlockStore) abandon(ctx context.Context, name, leaseID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = s.Release(ctx, name, leaseID) // the lease expires anyway
}

// Refresh implements LeaseStore: the lease must still be on a majority.
func (s *RedlockStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	toks := make([]fence.Token, len(s.nodes))
	errs := s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error {
		g, err := n.Refresh(ctx, name, leaseID, ttl)
		toks[i] = g.Token
		return err
	})
	if count(errs) < s.quorum {
		if lost := countIs(errs, ErrLost); lost > len(s.nodes)-s.quorum {
			return Grant{}, ErrLost
		}
		return Grant{}, fmt.Errorf("lock: Redlock refresh: fewer than %d of %d nodes answered: %w", s.quorum, len(s.nodes), errors.Join(errs...))
	}
	var tok fence.Token
	for i, err := range errs {
		if err == nil && toks[i] > tok {
			tok = toks[i]
		}
	}
	return Grant{Token: tok, TTL: ttl}, nil
}

func countIs(errs []error, target error) (n int) {
	for _, err := range errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// Release implements LeaseStore: it deletes the lease wherever it is.
// ErrLost if it was on fewer than a majority of nodes.
func (s *RedlockStore) Release(ctx context.Context, name, leaseID string) error {
	errs := s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error {
		return n.Release(ctx, name, leaseID)
	})
	if count(errs) >= s.quorum {
		return nil
	}
	if countIs(errs, ErrLost) > len(s.nodes)-s.quorum {
		return ErrLost
	}
	return fmt.Errorf("lock: Redlock release: fewer than %d of %d nodes answered: %w", s.quorum, len(s.nodes), errors.Join(errs...))
}

// Inspect implements LeaseStore: held when a majority agree on a lease id.
func (s *RedlockStore) Inspect(ctx context.Context, name string) (State, error) {
	states := make([]State, len(s.nodes))
	errs := s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error {
		st, err := n.Inspect(ctx, name)
		states[i] = st
		return err
	})
	if count(errs) < s.quorum {
		return State{}, fmt.Errorf("lock: Redlock inspect: fewer than %d of %d nodes answered: %w", s.quorum, len(s.nodes), errors.Join(errs...))
	}
	votes := map[string]int{}
	for i, st := range states {
		if errs[i] == nil && st.Held {
			if votes[st.LeaseID]++; votes[st.LeaseID] >= s.quorum {
				return st, nil
			}
		}
	}
	return State{}, nil
}

// Ping implements LeaseStore: a majority must answer.
func (s *RedlockStore) Ping(ctx context.Context) error {
	errs := s.each(ctx, func(ctx context.Context, i int, n *RedisStore) error { return n.Ping(ctx) })
	if count(errs) < s.quorum {
		return fmt.Errorf("lock: Redlock: fewer than %d of %d nodes answered: %w", s.quorum, len(s.nodes), errors.Join(errs...))
	}
	return nil
}

// Watch implements LeaseStore: a release published on any node wakes the
// waiter. Nodes that cannot subscribe are skipped while a majority can.
func (s *RedlockStore) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	var stops []func()
	var errs []error
	for _, n := range s.nodes {
		stop, err := n.n.watchInto(ctx, n.channel(name), ch)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		stops = append(stops, stop)
	}
	stopAll := func() {
		for _, stop := range stops {
			stop()
		}
	}
	if len(stops) < s.quorum {
		stopAll()
		return nil, nil, fmt.Errorf("lock: Redlock watch: %w", errors.Join(errs...))
	}
	return ch, stopAll, nil
}

// Close stops every node's notification subscriber.
func (s *RedlockStore) Close() error {
	var errs []error
	for _, n := range s.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
