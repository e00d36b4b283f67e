package lock

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/confirm.lua
	confirmLua string
	//go:embed scripts/refresh.lua
	refreshLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/inspect.lua
	inspectLua string

	acquireScript = redis.NewScript(acquireLua)
	confirmScript = redis.NewScript(confirmLua)
	refreshScript = redis.NewScript(refreshLua)
	releaseScript = redis.NewScript(releaseLua)
	inspectScript = redis.NewScript(inspectLua)
)

// RedisStore keeps leases in Redis and takes tokens from a Sequencer. Any
// redis.UniversalClient works: a single node, Sentinel (a failover client)
// or Cluster. A lock's keys share the hash tag {name}, so they live in one
// Cluster slot and its scripts run on one node.
//
// Give the client ContextTimeoutEnabled (redis.Options and friends): without
// it go-redis bounds each call by its own read and write timeouts, not by
// the context, and a wait budget cannot cut a call to a Redis that hangs.
//
// Keys: <prefix>{name}:lease holds the lease id with the lease's expiry,
// <prefix>{name}:token the token beside it, and <prefix>{name}:last the id
// of the lease released last, for as long as that lease had left (so a
// retried release succeeds). The release script publishes on
// <prefix>{name}:released, which waiters subscribe to. No key outlives its
// lease. Every script is safe to run twice, as go-redis does after a lost
// reply (docs/design.md, defect 4).
type RedisStore struct {
	rdb    redis.UniversalClient
	seq    sequencer.Sequencer
	prefix string
	n      notifier
}

var _ LeaseStore = (*RedisStore)(nil)

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore) error

// WithRedisPrefix sets the key prefix. Default "fenced:".
func WithRedisPrefix(p string) RedisOption {
	return func(s *RedisStore) error {
		if p == "" {
			return errors.New("lock: empty Redis key prefix")
		}
		s.prefix = p
		return nil
	}
}

// NewRedisStore returns a store on rdb that takes tokens from seq. Close
// stops its notification subscriber; it does not close rdb or seq.
func NewRedisStore(rdb redis.UniversalClient, seq sequencer.Sequencer, opts ...RedisOption) (*RedisStore, error) {
	if rdb == nil || seq == nil {
		return nil, errors.New("lock: NewRedisStore needs a Redis client and a sequencer")
	}
	s := &RedisStore{rdb: rdb, seq: seq, prefix: "fenced:"}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.n.rdb = rdb
	return s, nil
}

// keys are a lock's keys: lease, token, and the last released lease id.
func (s *RedisStore) keys(name string) []string {
	base := s.prefix + "{" + name + "}:"
	return []string{base + "lease", base + "token", base + "last"}
}

func (s *RedisStore) channel(name string) string { return s.prefix + "{" + name + "}:released" }

// The steps of the protocol on one Redis, shared with RedlockStore.

// take is step 2: SET NX PX. held is the holder's remaining TTL (0 if
// unknown) when another lease id has the lock.
func (s *RedisStore) take(ctx context.Context, name, leaseID string, ttl time.Duration) (ok bool, held time.Duration, err error) {
	ms, err := acquireScript.Run(ctx, s.rdb, s.keys(name)[:1], leaseID, ttl.Milliseconds()).Int64()
	if err != nil {
		return false, 0, err
	}
	if ms >= 0 {
		return false, time.Duration(ms) * time.Millisecond, nil
	}
	return true, 0, nil
}

// confirm is step 4: record the token if the lease is still leaseID's.
func (s *RedisStore) confirm(ctx context.Context, name, leaseID string, tok fence.Token) (ok bool, err error) {
	pttl, err := confirmScript.Run(ctx, s.rdb, s.keys(name)[:2], leaseID, uint64(tok)).Int64()
	return err == nil && pttl >= 0, err
}

// release deletes the lease if leaseID holds it or was the last to.
func (s *RedisStore) release(ctx context.Context, name, leaseID string) (ok bool, err error) {
	n, err := releaseScript.Run(ctx, s.rdb, s.keys(name), leaseID, s.channel(name)).Int64()
	return err == nil && n == 1, err
}

// Acquire implements LeaseStore: SET NX PX, a token from the sequencer, and
// the confirm script.
func (s *RedisStore) Acquire(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	ok, held, err := s.take(ctx, name, leaseID, ttl)
	if err != nil {
		// The SET may have happened with its reply lost: free it if so.
		s.abandon(ctx, name, leaseID)
		return Grant{}, backendErr("redis", "acquire", err)
	}
	if !ok {
		return Grant{}, &HeldError{Remaining: held}
	}
	tok, err := s.seq.Next(ctx, name)
	if err != nil {
		s.abandon(ctx, name, leaseID)
		return Grant{}, backendErr("etcd", "token", err)
	}
	ok, err = s.confirm(ctx, name, leaseID, tok)
	if err != nil {
		s.abandon(ctx, name, leaseID)
		return Grant{}, backendErr("redis", "confirm", err)
	}
	if !ok {
		return Grant{}, ErrLost
	}
	return Grant{Token: tok, TTL: ttl}, nil
}

// abandon frees a lease whose token could not be taken or confirmed, so
// that others need not wait for it to expire.
func (s *RedisStore) abandon(ctx context.Context, name, leaseID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = s.release(ctx, name, leaseID) // it expires anyway
}

// Refresh implements LeaseStore.
func (s *RedisStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	tok, err := refreshScript.Run(ctx, s.rdb, s.keys(name)[:2], leaseID, ttl.Milliseconds()).Uint64()
	if errors.Is(err, redis.Nil) {
		return Grant{}, ErrLost
	}
	if err != nil {
		return Grant{}, backendErr("redis", "refresh", err)
	}
	return Grant{Token: fence.Token(tok), TTL: ttl}, nil
}

// Release implements LeaseStore. Releasing a lease that this lease id
// already released, while it would still have been valid, succeeds.
func (s *RedisStore) Release(ctx context.Context, name, leaseID string) error {
	ok, err := s.release(ctx, name, leaseID)
	if err != nil {
		return backendErr("redis", "release", err)
	}
	if !ok {
		return ErrLost
	}
	return nil
}

// Inspect implements LeaseStore.
func (s *RedisStore) Inspect(ctx context.Context, name string) (State, error) {
	v, err := inspectScript.Run(ctx, s.rdb, s.keys(name)[:2]).Slice()
	if err != nil {
		return State{}, backendErr("redis", "inspect", err)
	}
	id, _ := v[0].(string)
	if id == "" {
		return State{}, nil
	}
	// A lease about to expire has a PTTL of 0 ms: it is still held, so
	// Remaining is never 0 for a held lock.
	st := State{Held: true, LeaseID: id, Remaining: time.Millisecond}
	if ms, ok := v[1].(int64); ok && ms > 0 {
		st.Remaining = time.Duration(ms) * time.Millisecond
	}
	if t, ok := v[2].(string); ok {
		n, err := strconv.ParseUint(t, 10, 64)
		if err == nil {
			st.Token = fence.Token(n)
		}
	}
	return st, nil
}

// Ping implements LeaseStore: Redis, and the sequencer if it can be pinged.
func (s *RedisStore) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return backendErr("redis", "ping", err)
	}
	if p, ok := s.seq.(interface{ Ping(context.Context) error }); ok {
		if err := p.Ping(ctx); err != nil {
			return backendErr("etcd", "ping", err)
		}
	}
	return nil
}

// Watch implements LeaseStore with Redis pub/sub. All waiters of a store
// share one subscriber connection; a channel stays subscribed while anyone
// waits on it.
func (s *RedisStore) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	return s.n.watch(ctx, s.channel(name))
}

// Close stops the notification subscriber. It is idempotent.
func (s *RedisStore) Close() error { return s.n.close() }

// notifier multiplexes release notifications over one PubSub connection.
// Watch returns only once Redis has confirmed the channel's subscription,
// so a release published after it cannot be missed.
//
// go-redis reconnects a dropped PubSub connection by itself and subscribes
// again to every channel it still tracks; confirmations of SUBSCRIBEs sent
// on the dropped connection never arrive. So a subscription waits for any
// confirmation of its channel rather than counting them, stays in the table
// until one arrives even when its waiters left (so the next waiter of the
// name does not wait for a confirmation that was lost), and a confirmation
// of a subscription already active means a reconnect: its waiters are woken,
// since a release published meanwhile was lost (docs/design.md, defect 2).
type notifier struct {
	rdb redis.UniversalClient

	mu     sync.Mutex
	ps     *redis.PubSub
	subs   map[string]*subscription
	closed bool
	wg     sync.WaitGroup
}

type subscription struct {
	waiters   map[chan struct{}]struct{}
	confirmed bool
	active    chan struct{} // closed when Redis first confirms the subscription
}

func (n *notifier) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	stop, err := n.watchInto(ctx, channel, ch)
	if err != nil {
		return nil, nil, err
	}
	return ch, stop, nil
}

// watchInto signals ch (buffered) on every release published on channel,
// until stop is called. Several notifiers may signal one ch.
func (n *notifier) watchInto(ctx context.Context, channel string, ch chan struct{}) (func(), error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	if n.ps == nil {
		n.ps = n.rdb.Subscribe(context.WithoutCancel(ctx))
		n.subs = make(map[string]*subscription)
		msgs := n.ps.ChannelWithSubscriptions()
		n.wg.Add(1)
		go n.dispatch(msgs)
	}
	sub := n.subs[channel]
	if sub == nil {
		sub = &subscription{waiters: make(map[chan struct{}]struct{}), active: make(chan struct{})}
		n.subs[channel] = sub
		// SUBSCRIBE and UNSUBSCRIBE are sent under mu, so they reach Redis
		// in the order the table changes. go-redis tracks the channel even
		// when the send fails, and subscribes it on its next connection:
		// the entry stays until that confirmation comes.
		if err := n.ps.Subscribe(ctx, channel); err != nil {
			n.mu.Unlock()
			return nil, backendErr("redis", "watch", err)
		}
	}
	sub.waiters[ch] = struct{}{}
	n.mu.Unlock()

	var once sync.Once
	stop := func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			delete(sub.waiters, ch)
			n.dropIdle(channel, sub)
		})
	}
	select {
	case <-sub.active:
		return stop, nil
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

// dropIdle unsubscribes a confirmed subscription nobody waits on. An
// unconfirmed one stays until its confirmation arrives. Called with mu.
func (n *notifier) dropIdle(channel string, sub *subscription) {
	if len(sub.waiters) > 0 || !sub.confirmed || n.closed || n.subs[channel] != sub {
		return
	}
	delete(n.subs, channel)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// A failed unsubscribe only leaves a channel nobody listens to.
	_ = n.ps.Unsubscribe(ctx, channel)
}

// dispatch is the notifier's goroutine; close stops it by closing the
// PubSub, which closes msgs.
func (n *notifier) dispatch(msgs <-chan interface{}) {
	defer n.wg.Done()
	for m := range msgs {
		n.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if sub := n.subs[m.Channel]; sub != nil && m.Kind == "subscribe" {
				if !sub.confirmed {
					sub.confirmed = true
					close(sub.active)
					n.dropIdle(m.Channel, sub)
				} else {
					wake(sub) // subscribed again after a reconnect
				}
			}
		case *redis.Message:
			if sub := n.subs[m.Channel]; sub != nil {
				wake(sub)
			}
		}
		n.mu.Unlock()
	}
}

func wake(sub *subscription) {
	for ch := range sub.waiters {
		select {
		case ch <- struct{}{}:
		default: // already signalled
		}
	}
}

func (n *notifier) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	ps := n.ps
	n.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	n.wg.Wait()
	return err
}
