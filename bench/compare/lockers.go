package compare

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// locker is a worker's lock client of one scheme. acquire blocks until it
// holds the lock (or ctx ends); the hold keeps its lease alive the way the
// scheme's users do for a long critical section, until release.
type locker interface {
	acquire(ctx context.Context) (held, error)
	close()
}

// held is one holding of the lock.
type held interface {
	token() uint64 // 0: the scheme has none
	// release ends the holding; lost says the lock was no longer this
	// holder's when it tried.
	release(ctx context.Context) (lost bool, err error)
}

// Lock keys of the peers in Redis and etcd (fenced names its own).
func peerKey(name string) string         { return "cmp:{" + name + "}:lock" }
func incrKey(name string) string         { return "cmp:{" + name + "}:fence" }
func etcdMutexPrefix(name string) string { return "/cmp/mutex/" + name }

// keepAlive runs refresh every period until stop is called; a refresh that
// fails ends it (the holder does not look: its write is what the comparison
// is about).
func keepAlive(period time.Duration, refresh func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				rctx, rcancel := context.WithTimeout(ctx, period)
				err := refresh(rctx)
				rcancel()
				if err != nil {
					return
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// naive: SET NX PX, polled; PEXPIRE to keep it; DEL to release. It never
// checks that the key is still its own.
type naiveLocker struct {
	rdb  *redis.Client
	key  string
	ttl  time.Duration
	poll time.Duration
}

type naiveHeld struct {
	l    *naiveLocker
	stop func()
}

func (l *naiveLocker) acquire(ctx context.Context) (held, error) {
	for {
		ok, err := l.rdb.SetNX(ctx, l.key, "1", l.ttl).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			h := &naiveHeld{l: l}
			h.stop = keepAlive(l.ttl/3, func(ctx context.Context) error { return l.rdb.PExpire(ctx, l.key, l.ttl).Err() })
			return h, nil
		}
		if !clock.Sleep(ctx, l.poll) {
			return nil, ctx.Err()
		}
	}
}

func (l *naiveLocker) close() {}

func (h *naiveHeld) token() uint64 { return 0 }
func (h *naiveHeld) release(ctx context.Context) (bool, error) {
	h.stop()
	n, err := h.l.rdb.Del(ctx, h.l.key).Result()
	return n == 0, err
}

// redislockLocker: bsm/redislock, with an optional INCR token.
type redislockLocker struct {
	rdb  *redis.Client
	c    *redislock.Client
	key  string
	ttl  time.Duration
	poll time.Duration
	incr string // the counter key; "" for no token
}

type redislockHeld struct {
	l    *redislock.Lock
	tok  uint64
	stop func()
}

func (l *redislockLocker) acquire(ctx context.Context) (held, error) {
	lk, err := l.c.Obtain(ctx, l.key, l.ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(l.poll)})
	if err != nil {
		return nil, err
	}
	h := &redislockHeld{l: lk}
	if l.incr != "" {
		n, err := l.rdb.Incr(ctx, l.incr).Result()
		if err != nil {
			_ = lk.Release(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("INCR token: %w", err)
		}
		h.tok = uint64(n)
	}
	h.stop = keepAlive(l.ttl/3, func(ctx context.Context) error { return lk.Refresh(ctx, l.ttl, nil) })
	return h, nil
}

func (l *redislockLocker) close() {}

func (h *redislockHeld) token() uint64 { return h.tok }
func (h *redislockHeld) release(ctx context.Context) (bool, error) {
	h.stop()
	err := h.l.Release(ctx)
	if errors.Is(err, redislock.ErrLockNotHeld) {
		return true, nil
	}
	return false, err
}

// redsyncLocker: Redlock over every node.
type redsyncLocker struct {
	rs  *redsync.Redsync
	key string
	ttl time.Duration
}

type redsyncHeld struct {
	m    *redsync.Mutex
	stop func()
}

func newRedsync(clients []*redis.Client) *redsync.Redsync {
	var pools []redsyncredis.Pool
	for _, c := range clients {
		pools = append(pools, goredis.NewPool(c))
	}
	return redsync.New(pools...)
}

func (l *redsyncLocker) acquire(ctx context.Context) (held, error) {
	m := l.rs.NewMutex(l.key, redsync.WithExpiry(l.ttl), redsync.WithTries(1<<20), redsync.WithRetryDelay(5*time.Millisecond))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	h := &redsyncHeld{m: m}
	h.stop = keepAlive(l.ttl/3, func(ctx context.Context) error {
		ok, err := m.ExtendContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: extend failed")
		}
		return err
	})
	return h, nil
}

func (l *redsyncLocker) close() {}

func (h *redsyncHeld) token() uint64 { return 0 }
func (h *redsyncHeld) release(ctx context.Context) (bool, error) {
	h.stop()
	ok, err := h.m.UnlockContext(ctx)
	if err != nil && !ok {
		// redsync reports a node that no longer had the key as an error;
		// a majority without it means the lock was lost.
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrLockAlreadyExpired) {
			return true, nil
		}
		return false, err
	}
	return !ok, nil
}

// etcdMutexLocker: concurrency.Mutex on a Session that keeps its etcd lease
// alive; a new Session when the old one's lease is gone. With rev, the
// token is the create revision of the Mutex's key, read after Lock.
type etcdMutexLocker struct {
	cli    *clientv3.Client
	prefix string
	secs   int
	rev    bool
	s      *concurrency.Session
}

type etcdMutexHeld struct {
	m   *concurrency.Mutex
	tok uint64
}

func (l *etcdMutexLocker) acquire(ctx context.Context) (held, error) {
	if l.s != nil {
		select {
		case <-l.s.Done(): // its lease expired or was revoked
			l.s.Close()
			l.s = nil
		default:
		}
	}
	if l.s == nil {
		s, err := concurrency.NewSession(l.cli, concurrency.WithTTL(l.secs), concurrency.WithContext(context.Background()))
		if err != nil {
			return nil, fmt.Errorf("etcd session: %w", err)
		}
		l.s = s
	}
	m := concurrency.NewMutex(l.s, l.prefix)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	h := &etcdMutexHeld{m: m}
	if l.rev {
		r, err := l.cli.Get(ctx, m.Key())
		if err == nil && len(r.Kvs) == 0 {
			err = errors.New("the mutex key is gone")
		}
		if err != nil {
			_ = m.Unlock(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("create revision: %w", err)
		}
		h.tok = uint64(r.Kvs[0].CreateRevision)
	}
	return h, nil
}

func (l *etcdMutexLocker) close() {
	if l.s != nil {
		l.s.Orphan() // do not wait on a dead etcd at exit
	}
}

func (h *etcdMutexHeld) token() uint64 { return h.tok }
func (h *etcdMutexHeld) release(ctx context.Context) (bool, error) {
	return false, h.m.Unlock(ctx)
}

// fencedLocker: a lock.Client over one of fenced's stores, with keep-alive.
type fencedLocker struct {
	c       *lock.Client
	name    string
	ttl     time.Duration
	closeFn func()
}

type fencedHeld struct{ l *lock.Lease }

func (l *fencedLocker) acquire(ctx context.Context) (held, error) {
	lease, err := l.c.Acquire(ctx, l.name, l.ttl, lock.WithKeepAlive())
	if err != nil {
		return nil, err
	}
	return fencedHeld{lease}, nil
}

func (h fencedHeld) token() uint64 { return uint64(h.l.Token()) }
func (h fencedHeld) release(ctx context.Context) (bool, error) {
	err := h.l.Release(ctx)
	if errors.Is(err, lock.ErrLost) {
		return true, nil
	}
	return false, err
}

// newFencedLocker builds the store of scheme id.
func newFencedLocker(id, name string, ttl time.Duration, rdbs []*redis.Client, cli *clientv3.Client, etcdPrefix string) (*fencedLocker, error) {
	var closers []func()
	done := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	var store lock.LeaseStore
	switch id {
	case FencedEtcd:
		s, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(etcdPrefix))
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { s.Close() })
		store = s
	case FencedRedis, FencedRedlk:
		seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(etcdPrefix))
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { seq.Close() })
		if id == FencedRedis {
			s, err := lock.NewRedisStore(rdbs[0], seq)
			if err != nil {
				done()
				return nil, err
			}
			closers = append(closers, func() { s.Close() })
			store = s
		} else {
			nodes := make([]redis.UniversalClient, len(rdbs))
			for i, c := range rdbs {
				nodes[i] = c
			}
			s, err := lock.NewRedlockStore(nodes, seq)
			if err != nil {
				done()
				return nil, err
			}
			closers = append(closers, func() { s.Close() })
			store = s
		}
	default:
		return nil, fmt.Errorf("not a fenced scheme: %s", id)
	}
	c, err := lock.New(store)
	if err != nil {
		done()
		return nil, err
	}
	return &fencedLocker{c: c, name: name, ttl: ttl, closeFn: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(ctx)
		done()
	}}, nil
}

func (l *fencedLocker) close() { l.closeFn() }
