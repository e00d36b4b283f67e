package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced/fenced/fence"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Leader election (docs/design.md, "Leader election"). An election is a
// lock on etcd held by its leader: a candidate campaigns by waiting for the
// lock in the fair queue, leads while it holds the lease, and its term is
// the lease's token. Every new term has a higher token than every term
// before it, so a fenced resource rejects the late writes of a leader that
// was deposed (paused, partitioned) once the next one has written.

// ErrElectionStore: elections need the etcd lease store. A Redis lease can
// be forgotten by a failover, and a term must not be.
var ErrElectionStore = errors.New("lock: elections need the etcd lease store (EtcdStore): a Redis failover can forget a leader's lease, and two candidates would then lead at once")

// Elector holds elections: *Client with an EtcdStore in this process, and
// *client.Client through a fenced server whose leases are in etcd.
type Elector interface {
	// Elect campaigns and returns when the caller leads; see Client.Elect.
	Elect(ctx context.Context, name, value string, ttl time.Duration, opts ...Option) (*Lease, error)
	// Observe reports who leads, and every change; see Client.Observe.
	Observe(ctx context.Context, name string) (<-chan Leader, error)
}

var _ Elector = (*Client)(nil)

// Leader is who leads an election, as Observe sees it.
type Leader struct {
	Name    string
	Leading bool        // false: nobody leads now
	Value   string      // the leader's value, given to Elect ("" for none)
	Token   fence.Token // the leader's term; 0 when nobody leads
}

// Elect campaigns in election name and returns when the caller leads it:
// the Lease is the leadership. Lease.Token is the term, to pass with every
// write to a fenced resource; Lease.Done closes when leadership is lost
// (the lease lost or expired); Lease.Release resigns and lets the next
// candidate lead. value (a label of 1 to MaxLabelLen bytes of printable UTF-8,
// or "" for none) is what Observe shows of the leader, such as its
// address.
//
// Candidates are served in the order they began to campaign. The lease is
// kept alive unless WithDetached is given (for a server whose remote
// candidate refreshes it by id); WithWait bounds the campaign
// (ErrNotAcquired when it runs out) and WithRetry tunes the fallback, as
// for Acquire. WithUnfair, WithOwner and WithHolder do not apply. The
// election's name is a lock name: Inspect, List and ForceRelease see the
// leader as the holder (with the value as owner), and ForceRelease deposes
// it.
//
// Elect needs an EtcdStore: with any other store it returns an error
// matching ErrElectionStore.
func (c *Client) Elect(ctx context.Context, name, value string, ttl time.Duration, opts ...Option) (*Lease, error) {
	if _, err := c.etcd(); err != nil {
		return nil, err
	}
	o, err := ResolveElectOptions(value, opts...)
	if err != nil {
		return nil, err
	}
	if o.Retry == nil {
		o.Retry = ExponentialBackoff(4*time.Millisecond, 256*time.Millisecond)
	}
	return c.acquire(ctx, name, ttl, o)
}

// ResolveElectOptions checks Elect's value and options and returns the
// acquisition that campaigns: fair, with value as its owner label, kept
// alive unless detached. For other implementations of Elect (package
// client).
func ResolveElectOptions(value string, opts ...Option) (AcquireOptions, error) {
	o, err := ResolveOptions(false, opts...)
	switch {
	case err != nil:
		return o, err
	case o.Unfair:
		return o, fmt.Errorf("%w: WithUnfair does not apply to Elect: candidates are served in the order they began to campaign", ErrInvalidOption)
	case o.Owner != "":
		return o, fmt.Errorf("%w: WithOwner does not apply to Elect: the value is the leader's label", ErrInvalidOption)
	case o.Holder != "":
		return o, fmt.Errorf("%w: WithHolder does not apply to Elect: a leader campaigning again would share its term", ErrInvalidOption)
	}
	if value != "" {
		if err := ValidateLabel(value); err != nil {
			return o, fmt.Errorf("%w: election value: %v", ErrInvalidOption, err)
		}
	}
	o.Owner = value
	o.KeepAlive = !o.Detached
	return o, nil
}

// Observe reports who leads election name: first who leads now, then every
// change (a new leader, or nobody). The channel is closed when ctx ends or
// the client closes; cancel ctx to stop observing. A change that comes and
// goes while the receiver is busy may be missed, but never the latest
// state. When etcd loses its leader or the connection, Observe waits and
// watches again.
//
// Observe needs an EtcdStore (ErrElectionStore otherwise). It returns an
// error if it cannot read the first state.
func (c *Client) Observe(ctx context.Context, name string) (<-chan Leader, error) {
	s, err := c.etcd()
	if err != nil {
		return nil, err
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	ctx, end, err := c.calls.Begin(ctx) // Close ends the observer too
	if err != nil {
		return nil, fmt.Errorf("lock: observe %q: %w", name, err)
	}
	ch, err := s.observe(ctx, name, end)
	if err != nil {
		end()
	}
	return ch, err
}

// etcd is the client's store if it can hold elections.
func (c *Client) etcd() (*EtcdStore, error) {
	s, ok := c.store.(*EtcdStore)
	if !ok {
		return nil, fmt.Errorf("%w; this client's store is %T", ErrElectionStore, c.store)
	}
	return s, nil
}

// Electable reports whether c's store can hold elections (an EtcdStore).
func (c *Client) Electable() bool {
	_, err := c.etcd()
	return err == nil
}

// LeaderOf is the leader that state st shows.
func LeaderOf(st State) Leader {
	if !st.Held {
		return Leader{Name: st.Name}
	}
	return Leader{Name: st.Name, Leading: true, Value: st.Owner, Token: st.Token}
}

// observe watches the lock key of name (puts and deletions) from etcd's
// current revision and reads the state after every change: a watch begun
// before the first read misses nothing. Its goroutine calls done as it
// returns.
func (s *EtcdStore) observe(ctx context.Context, name string, done func()) (<-chan Leader, error) {
	wch, cancel, err := s.watchAll(ctx, name)
	if err != nil {
		return nil, err
	}
	st, err := s.Inspect(ctx, name)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan Leader)
	go func() { // owned by ctx
		defer done()
		defer close(out)
		defer func() { cancel() }()
		last := LeaderOf(st)
		pending := true // last has not been delivered
		for {
			var send chan<- Leader
			if pending {
				send = out
			}
			select {
			case <-ctx.Done():
				return
			case send <- last:
				pending = false
				continue
			case _, ok := <-wch:
				if !ok { // etcd lost its leader or the connection: watch again
					cancel()
					cancel = func() {}
					if !untilOK(ctx, func() error {
						w, c, err := s.watchAll(ctx, name)
						if err == nil {
							wch, cancel = w, c
						}
						return err
					}) {
						return
					}
				}
			}
			if !untilOK(ctx, func() (err error) {
				st, err = s.Inspect(ctx, name)
				return err
			}) {
				return
			}
			if l := LeaderOf(st); l != last {
				last, pending = l, true
			}
		}
	}()
	return out, nil
}

// watchAll watches every change of name's lock key from etcd's current
// revision; it returns once etcd has confirmed the watch.
func (s *EtcdStore) watchAll(ctx context.Context, name string) (clientv3.WatchChan, context.CancelFunc, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.ks.LockKey(name), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil {
			cancel()
			err := wr.Err()
			if err == nil {
				err = errors.New("watch channel closed")
			}
			return nil, nil, backendErr("etcd", "watch", err)
		}
	case <-ctx.Done():
		cancel()
		return nil, nil, ctx.Err()
	}
	return wch, cancel, nil
}
