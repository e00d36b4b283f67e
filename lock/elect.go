package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced/fenced/fence"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
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
// watches again. Beside the watch it reads who leads every second, so an
// etcd member that stops answering while the others serve delays it by
// about that much (docs/design.md, defect 194).
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

// observeReread is how often an observer reads who leads beside its
// watch (docs/design.md, defect 194). All the WithRequireLeader watches
// of one etcd client share one gRPC stream, on one member: when the link
// to that member is held (the member stopped, or the link silently
// dropping), no event, no "no leader" cancel and no confirmation of a new
// watch comes while the other members answer. The reads go round such a
// member (etcdkv.Hedge), so the observer shows who leads within a read
// interval and a hedge. One read of the lock key a second, an observer.
const observeReread = time.Second

// observe reads who leads name, then watches the lock key (puts and
// deletions) from the revision after that read, and reads again after
// every change, and every observeReread: a watch that etcd confirms late,
// or whose events stop coming, delays the observer by a read interval at
// most (docs/design.md, defect 194). Nothing waits for etcd to confirm a
// watch. Its goroutine calls done as it returns.
func (s *EtcdStore) observe(ctx context.Context, name string, done func()) (<-chan Leader, error) {
	last, rev, err := s.leaderNow(ctx, name)
	if err != nil {
		return nil, err
	}
	out := make(chan Leader)
	go func() { // owned by ctx
		defer done()
		defer close(out)
		opened, cancel := s.watchFrom(ctx, name, rev+1)
		defer func() {
			if cancel != nil {
				cancel()
			}
		}()
		var wch clientv3.WatchChan // nil until etcd confirms the watch
		reread := time.NewTicker(observeReread)
		defer reread.Stop()
		pending := true // last has not been delivered
		for {
			var send chan<- Leader
			if pending {
				send = out
			}
			tick := false
			select {
			case <-ctx.Done():
				return
			case send <- last:
				pending = false
				continue
			case wch = <-opened:
				opened = nil
				continue
			case _, ok := <-wch:
				if !ok {
					// etcd lost its leader or the connection, or compacted
					// the revision: watch again from the revision of the
					// next tick's read (cancel nil till then), not at once:
					// a member without a leader ends a watch as it comes.
					cancel()
					opened, wch, cancel = nil, nil, nil
				}
			case <-reread.C:
				tick = true
			}
			l, r, err := s.leaderNow(ctx, name)
			if err != nil {
				continue // read again at the next tick
			}
			if cancel == nil && tick {
				opened, cancel = s.watchFrom(ctx, name, r+1)
			}
			if l != last {
				last, pending = l, true
			}
		}
	}()
	return out, nil
}

// leaderNow reads who leads name, and the revision it read at: one read
// of the lock key, hedged (etcdkv).
func (s *EtcdStore) leaderNow(ctx context.Context, name string) (Leader, int64, error) {
	resp, err := s.kv.Get(clientv3.WithRequireLeader(ctx), s.ks.LockKey(name))
	if err != nil {
		return Leader{}, 0, backendErr("etcd", "inspect", err)
	}
	lk, held, err := s.ks.ParseLock((*pb.RangeResponse)(resp), nil)
	if err != nil {
		return Leader{}, 0, backendErr("etcd", "inspect", err)
	}
	st := State{Name: name}
	if held {
		st.Held, st.Owner, st.Token = true, lk.Owner, lk.Token
	}
	return LeaderOf(st), resp.Header.Revision, nil
}

// watchFrom watches every change of name's lock key from revision rev.
// clientv3's Watch returns only once etcd has confirmed the watch, which
// a held member never does, so it is called aside: the channel comes on
// opened when etcd confirms it (or closed, when the watch ends first).
// cancel ends the watch; a watch cancelled before it came never comes.
func (s *EtcdStore) watchFrom(ctx context.Context, name string, rev int64) (opened <-chan clientv3.WatchChan, cancel context.CancelFunc) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	ch := make(chan clientv3.WatchChan, 1)
	go func() { // ends with wctx at the latest
		ch <- s.cli.Watch(wctx, s.ks.LockKey(name), clientv3.WithRev(rev))
	}()
	return ch, cancel
}
