package lockbench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Locker is one client of one implementation. A goroutine of a scenario
// uses its own Locker; Lock blocks in the implementation's natural way until
// it holds name, and the returned unlock releases it.
type Locker interface {
	Lock(ctx context.Context, name string) (unlock func(context.Context) error, err error)
	Close() error
}

// Impl is one lock implementation under test.
type Impl struct {
	Name string
	// Wait says how a blocked Lock waits, for the table's legend.
	Wait string
	// NewLocker returns a client for one goroutine.
	NewLocker func(ctx context.Context) (Locker, error)
	// Close frees what the implementation shares between its lockers.
	Close func() error
	// Abandon takes name with ttl, not kept alive, and walks away from it
	// as a holder that stopped (a crash, a pause) would: the expiry
	// scenario's holder.
	Abandon func(ctx context.Context, name string, ttl time.Duration) error
	// Batches, if set, counts etcd transactions and what they carried so
	// far, BatchItems: the tokens of fenced/redis's sequencer, the lock
	// operations (creates and deletes: two a pair) of fenced/etcd's store.
	Batches    func() (txns, items uint64)
	BatchItems string
	// Hold, if set, takes name and keeps it held, kept alive, until
	// release: the held-locks sweep of the scaling run.
	Hold func(ctx context.Context, name string) (release func(context.Context) error, err error)
}

// Names of the implementations, the columns' references among them.
const (
	EtcdMutex   = "etcd Mutex"
	RedisLock   = "redislock"
	Redsync     = "redsync"
	FencedRedis = "fenced/redis"
	FencedEtcd  = "fenced/etcd"
	// Unfair is the suffix of the rows whose waiters skip the queue
	// (lock.WithUnfair): fairness's cost, side by side.
	Unfair = " (unfair)"
)

// RedislockBackoff is redislock's retry strategy here: redislock has no
// release notification, so a waiter polls SET NX every millisecond.
const RedislockBackoff = time.Millisecond

// lockerFunc adapts a function to Locker for implementations whose lockers
// share everything.
type lockerFunc func(ctx context.Context, name string) (func(context.Context) error, error)

func (f lockerFunc) Lock(ctx context.Context, name string) (func(context.Context) error, error) {
	return f(ctx, name)
}
func (lockerFunc) Close() error { return nil }

// newEtcdMutex: etcd client/v3/concurrency, one Session (and so one etcd
// lease) per locker, a Mutex per lock name; Lock waits on a watch for the
// deletion of the key ahead of it (FIFO).
func newEtcdMutex(cli *clientv3.Client, prefix string, ttl time.Duration) Impl {
	secs := int((ttl + time.Second - 1) / time.Second)
	held := &heldSessions{cli: cli, secs: secs}
	return Impl{
		Name: EtcdMutex,
		Wait: fmt.Sprintf("Mutex.Lock: watch on the key ahead (FIFO); one Session per client, TTL %ds", secs),
		NewLocker: func(ctx context.Context) (Locker, error) {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(secs), concurrency.WithContext(context.WithoutCancel(ctx)))
			if err != nil {
				return nil, fmt.Errorf("etcd session: %w", err)
			}
			return &etcdMutexLocker{s: s, prefix: prefix, mus: make(map[string]*concurrency.Mutex)}, nil
		},
		Abandon: func(ctx context.Context, name string, ttl time.Duration) error {
			// A session of its own, orphaned: its keep-alive stops and its
			// lease, and the key, go when the TTL runs out.
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
			if err != nil {
				return fmt.Errorf("etcd session: %w", err)
			}
			if err := concurrency.NewMutex(s, prefix+name).Lock(ctx); err != nil {
				s.Close()
				return err
			}
			s.Orphan()
			return nil
		},
		Hold: func(ctx context.Context, name string) (func(context.Context) error, error) {
			s, err := held.next(ctx)
			if err != nil {
				return nil, err
			}
			m := concurrency.NewMutex(s, prefix+name)
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return m.Unlock, nil
		},
		Close: held.close,
	}
}

// heldSessions are the sessions etcd's Mutex holds locks on in the
// scaling run: 64, made on first use, each lock on the next in turn;
// their leases keep every key on them alive.
type heldSessions struct {
	cli  *clientv3.Client
	secs int
	mu   sync.Mutex
	all  []*concurrency.Session
	n    int
}

func (h *heldSessions) next(ctx context.Context) (*concurrency.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.all) < 64 {
		s, err := concurrency.NewSession(h.cli, concurrency.WithTTL(h.secs), concurrency.WithContext(context.WithoutCancel(ctx)))
		if err != nil {
			return nil, fmt.Errorf("etcd session: %w", err)
		}
		h.all = append(h.all, s)
	}
	h.n++
	return h.all[h.n%len(h.all)], nil
}

func (h *heldSessions) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var err error
	for _, s := range h.all {
		err = errors.Join(err, s.Close()) // revokes the lease: its keys go with it
	}
	h.all = nil
	return err
}

type etcdMutexLocker struct {
	s      *concurrency.Session
	prefix string
	mus    map[string]*concurrency.Mutex // one goroutine uses a locker
}

func (l *etcdMutexLocker) Lock(ctx context.Context, name string) (func(context.Context) error, error) {
	m := l.mus[name]
	if m == nil {
		m = concurrency.NewMutex(l.s, l.prefix+name)
		l.mus[name] = m
	}
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return m.Unlock, nil
}

func (l *etcdMutexLocker) Close() error { return l.s.Close() }

// newRedislock: bsm/redislock, SET NX PX polled with LinearBackoff.
func newRedislock(rdb *redis.Client, prefix string, ttl time.Duration) Impl {
	c := redislock.New(rdb)
	opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(RedislockBackoff)}
	return Impl{
		Name: RedisLock,
		Wait: fmt.Sprintf("Obtain polls SET NX: LinearBackoff(%s), no notification; TTL %s", RedislockBackoff, ttl),
		NewLocker: func(context.Context) (Locker, error) {
			return lockerFunc(func(ctx context.Context, name string) (func(context.Context) error, error) {
				l, err := c.Obtain(ctx, prefix+name, ttl, opts)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			}), nil
		},
		Abandon: func(ctx context.Context, name string, ttl time.Duration) error {
			_, err := c.Obtain(ctx, prefix+name, ttl, nil)
			return err
		},
		Close: func() error { return nil },
	}
}

// newRedsync: go-redsync/redsync with one node (a goredis/v9 pool) and its
// default retry settings: 32 tries, a random delay of 50 to 250ms between
// them. A LockContext that runs out of tries (ErrFailed) is called again
// until the context ends, so that a waiter waits as long as the others do.
func newRedsync(rdb *redis.Client, prefix string, ttl time.Duration) Impl {
	rs := redsync.New(goredis.NewPool(rdb))
	return Impl{
		Name: Redsync,
		Wait: fmt.Sprintf("Mutex.LockContext polls: defaults, 32 tries, random 50-250ms delay; expiry %s", ttl),
		Abandon: func(ctx context.Context, name string, ttl time.Duration) error {
			return rs.NewMutex(prefix+name, redsync.WithExpiry(ttl), redsync.WithTries(1)).LockContext(ctx)
		},
		NewLocker: func(context.Context) (Locker, error) {
			return lockerFunc(func(ctx context.Context, name string) (func(context.Context) error, error) {
				m := rs.NewMutex(prefix+name, redsync.WithExpiry(ttl))
				for {
					err := m.LockContext(ctx)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return nil, fmt.Errorf("redsync: %w (%w)", err, ctx.Err())
					}
					if !errors.Is(err, redsync.ErrFailed) {
						return nil, err
					}
				}
				return func(ctx context.Context) error {
					ok, err := m.UnlockContext(ctx)
					if err == nil && !ok {
						err = errors.New("redsync: unlock: not held")
					}
					return err
				}, nil
			}), nil
		},
		Close: func() error { return nil },
	}
}

// fencedLocker adapts a fenced lock.Client: one client for every goroutine,
// as an application would share it.
func fencedLocker(c *lock.Client, ttl time.Duration, opts []lock.Option) Locker {
	return lockerFunc(func(ctx context.Context, name string) (func(context.Context) error, error) {
		l, err := c.Acquire(ctx, name, ttl, opts...)
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	})
}

// newFencedRedis: fenced with leases in Redis and tokens from the etcd
// sequencer (group commit). seqOpts are passed to sequencer.NewEtcd.
func newFencedRedis(rdb *redis.Client, cli *clientv3.Client, prefix, etcdPrefix string, ttl time.Duration, label string, unfair bool, seqOpts ...sequencer.Option) (Impl, error) {
	seq, err := sequencer.NewEtcd(cli, append([]sequencer.Option{sequencer.WithPrefix(etcdPrefix)}, seqOpts...)...)
	if err != nil {
		return Impl{}, err
	}
	store, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(prefix))
	if err != nil {
		seq.Close()
		return Impl{}, err
	}
	c, err := lock.New(store)
	if err != nil {
		store.Close()
		seq.Close()
		return Impl{}, err
	}
	name := FencedRedis
	if label != "" {
		name += " " + label
	}
	name, how, opts := fairness(name, unfair)
	return Impl{
		Name:      name,
		Wait:      fmt.Sprintf("Client.Acquire: %s, Redis pub/sub release notification, default retry ExponentialBackoff(4ms, 256ms); TTL %s", how, ttl),
		NewLocker: func(context.Context) (Locker, error) { return fencedLocker(c, ttl, opts), nil },
		Abandon:   abandonFenced(c),
		Hold:      holdFenced(c, ttl),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return errors.Join(c.Close(ctx), store.Close(), seq.Close())
		},
		Batches: func() (uint64, uint64) {
			st := seq.Stats()
			return st.Txns, st.Grants
		},
		BatchItems: "tokens",
	}, nil
}

// newFencedEtcd: fenced with leases in etcd (lock.NewEtcdStore): one Txn
// takes the lease and the token; a waiter watches the lock key.
func newFencedEtcd(cli *clientv3.Client, etcdPrefix string, ttl time.Duration, label string, unfair bool, opts ...lock.EtcdOption) (Impl, error) {
	store, err := lock.NewEtcdStore(cli, append([]lock.EtcdOption{lock.WithEtcdPrefix(etcdPrefix)}, opts...)...)
	if err != nil {
		return Impl{}, err
	}
	c, err := lock.New(store)
	if err != nil {
		return Impl{}, err
	}
	name := FencedEtcd
	if label != "" {
		name += " " + label
	}
	name, how, lopts := fairness(name, unfair)
	return Impl{
		Name:      name,
		Wait:      fmt.Sprintf("Client.Acquire: %s, etcd watch on the lock key, default retry ExponentialBackoff(4ms, 256ms); TTL %s", how, ttl),
		NewLocker: func(context.Context) (Locker, error) { return fencedLocker(c, ttl, lopts), nil },
		Abandon:   abandonFenced(c),
		Hold:      holdFenced(c, ttl),
		Close: func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return errors.Join(c.Close(ctx), store.Close())
		},
		Batches: func() (uint64, uint64) {
			st := store.Stats()
			return st.Txns, st.Ops
		},
		BatchItems: "lock operations (creates and deletes)",
	}, nil
}

// fairness names a fenced row and its acquire options: the default, fair
// (waiters served in arrival order), or unfair (lock.WithUnfair).
func fairness(name string, unfair bool) (string, string, []lock.Option) {
	if unfair {
		return name + Unfair, "WithUnfair (a free lock goes to whoever asks first)", []lock.Option{lock.WithUnfair()}
	}
	return name, "fair (FIFO queue)", nil
}

// abandonFenced takes a fenced lease without keep-alive and never releases
// it.
func abandonFenced(c *lock.Client) func(ctx context.Context, name string, ttl time.Duration) error {
	return func(ctx context.Context, name string, ttl time.Duration) error {
		_, err := c.TryAcquire(ctx, name, ttl)
		return err
	}
}

// holdFenced takes a fenced lease kept alive (a refresh every TTL/3).
func holdFenced(c *lock.Client, ttl time.Duration) func(ctx context.Context, name string) (func(context.Context) error, error) {
	return func(ctx context.Context, name string) (func(context.Context) error, error) {
		l, err := c.TryAcquire(ctx, name, ttl, lock.WithKeepAlive())
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}
