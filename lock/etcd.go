package lock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fenced/fenced/sequencer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore keeps leases in etcd, the zero-dependency default: one Txn
// creates the lock key if absent, attached to an etcd lease, and the token
// is that Txn's revision (plus the floor offset, recorded beside the key so
// that the token never changes). Steps 2 to 4 of the protocol collapse
// into that Txn; see docs/design.md, "etcd leases".
//
// etcd leases have whole-second TTLs and a minimum of about 1.5 times the
// election timeout: a TTL the server cannot honour is rounded up, and
// Grant.TTL (Lease.TTL) says what the lease really has. Refresh renews the
// lease for its own TTL; etcd cannot change a lease's TTL.
//
// Every request fails fast when the etcd member has no leader, rather than
// waiting out the caller's timeout.
type EtcdStore struct {
	cli    *clientv3.Client
	ks     sequencer.Keyspace
	issuer *sequencer.Issuer
}

var _ LeaseStore = (*EtcdStore)(nil)

// EtcdOption configures an EtcdStore.
type EtcdOption func(*etcdConfig) error

type etcdConfig struct {
	prefix string
	log    *slog.Logger
}

// WithEtcdPrefix sets the key prefix. Default sequencer.DefaultPrefix
// ("/fenced/"); use the sequencer's, so that RaiseFloor applies to both.
func WithEtcdPrefix(p string) EtcdOption {
	return func(c *etcdConfig) error {
		if p == "" {
			return errors.New("lock: empty etcd key prefix")
		}
		c.prefix = p
		return nil
	}
}

// WithEtcdLogger sets where the store warns that etcd went back in time
// (see sequencer.Issuer). Default slog.Default().
func WithEtcdLogger(l *slog.Logger) EtcdOption {
	return func(c *etcdConfig) error {
		if l == nil {
			return errors.New("lock: nil logger")
		}
		c.log = l
		return nil
	}
}

// NewEtcdStore returns a store on cli. On a cluster with no token floor the
// store sets one at its first acquisition (see sequencer.Issuer).
func NewEtcdStore(cli *clientv3.Client, opts ...EtcdOption) (*EtcdStore, error) {
	if cli == nil {
		return nil, errors.New("lock: nil etcd client")
	}
	c := etcdConfig{prefix: sequencer.DefaultPrefix, log: slog.Default()}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	ks := sequencer.NewKeyspace(c.prefix)
	return &EtcdStore{cli: cli, ks: ks, issuer: sequencer.NewIssuer(cli, ks, c.log)}, nil
}

// Acquire implements LeaseStore.
func (s *EtcdStore) Acquire(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	// A held lock should cost a local read, not a lease grant and revoke
	// (two Raft writes). The read is serializable, so it may be stale; the
	// Txn below decides.
	if r, err := s.cli.Get(ctx, s.ks.LockKey(name), clientv3.WithCountOnly(), clientv3.WithSerializable()); err != nil {
		return Grant{}, backendErr("etcd", "acquire", err)
	} else if r.Count > 0 {
		return Grant{}, &HeldError{}
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	// An etcd lease that expires (or is revoked) between its grant and the
	// Txn makes the Txn fail with "lease not found": grant a new one.
	for attempt := 0; ; attempt++ {
		lg, err := s.cli.Grant(ctx, secs)
		if err != nil {
			return Grant{}, backendErr("etcd", "acquire", err)
		}
		_, tok, ok, err := s.issuer.Issue(ctx, []clientv3.Cmp{s.ks.LockFree(name)},
			func(offset uint64) []clientv3.Op { return s.ks.PutLock(name, leaseID, lg.ID, offset) })
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt < 2:
			continue
		case errors.Is(err, sequencer.ErrRestored):
			// The key was created with a token that does not exceed an
			// earlier one: free it and let the client try again.
			s.revoke(ctx, lg.ID)
			return Grant{}, ErrLost
		case err != nil:
			s.revoke(ctx, lg.ID)
			return Grant{}, backendErr("etcd", "acquire", err)
		case !ok:
			s.revoke(ctx, lg.ID)
			// No remaining-time hint: the watch sees the key deleted on expiry.
			return Grant{}, &HeldError{}
		}
		return Grant{Token: tok, TTL: time.Duration(lg.TTL) * time.Second}, nil
	}
}

// revoke frees an etcd lease that holds no lock.
func (s *EtcdStore) revoke(ctx context.Context, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id) // it expires anyway
}

// Refresh implements LeaseStore. The TTL cannot change: it returns the
// lease's own. The token is the one granted, whatever the floor is now.
func (s *EtcdStore) Refresh(ctx context.Context, name, leaseID string, _ time.Duration) (Grant, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	resp, err := s.cli.Txn(ctx).If(s.ks.LockHeldBy(name, leaseID)).Then(s.ks.GetLock(name)...).Commit()
	if err != nil {
		return Grant{}, backendErr("etcd", "refresh", err)
	}
	if !resp.Succeeded {
		return Grant{}, ErrLost
	}
	st, held, err := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
	if err != nil {
		return Grant{}, backendErr("etcd", "refresh", err)
	}
	if !held {
		return Grant{}, ErrLost
	}
	ka, err := s.cli.KeepAliveOnce(ctx, st.Lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return Grant{}, ErrLost
	}
	if err != nil {
		return Grant{}, backendErr("etcd", "refresh", err)
	}
	return Grant{Token: st.Token, TTL: time.Duration(ka.TTL) * time.Second}, nil
}

// Release implements LeaseStore. Deleting the key wakes the waiters'
// watches. The released lease id is then recorded on the lock's own etcd
// lease instead of revoking it (one Raft write either way), so that
// releasing again, until the lock would have expired, succeeds.
func (s *EtcdStore) Release(ctx context.Context, name, leaseID string) error {
	ctx = clientv3.WithRequireLeader(ctx)
	resp, err := s.cli.Txn(ctx).If(s.ks.LockHeldBy(name, leaseID)).
		Then(s.ks.DeleteLock(name)...).
		Else(clientv3.OpGet(s.ks.ReleasedKey(name))).Commit()
	if err != nil {
		return backendErr("etcd", "release", err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && string(kvs[0].Value) == leaseID {
			return nil // released by this lease id already
		}
		return ErrLost
	}
	if prev := resp.Responses[0].GetResponseDeleteRange().PrevKvs; len(prev) == 1 && prev[0].Lease != 0 {
		// The lease may be gone already; the record is only a courtesy.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = s.cli.Txn(mctx).Then(s.ks.MarkReleased(name, leaseID, clientv3.LeaseID(prev[0].Lease))).Commit()
	}
	return nil
}

// Inspect implements LeaseStore.
func (s *EtcdStore) Inspect(ctx context.Context, name string) (State, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	resp, err := s.cli.Txn(ctx).Then(s.ks.GetLock(name)...).Commit()
	if err != nil {
		return State{}, backendErr("etcd", "inspect", err)
	}
	lk, held, err := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
	if err != nil {
		return State{}, backendErr("etcd", "inspect", err)
	}
	if !held {
		return State{}, nil
	}
	st := State{Held: true, LeaseID: lk.LeaseID, Token: lk.Token}
	if lk.Lease != 0 {
		if ttl, err := s.cli.TimeToLive(ctx, lk.Lease); err == nil && ttl.TTL > 0 {
			st.Remaining = time.Duration(ttl.TTL) * time.Second
		}
	}
	return st, nil
}

// Ping implements LeaseStore: a linearizable read, which needs a leader.
func (s *EtcdStore) Ping(ctx context.Context) error {
	if _, err := s.cli.Get(clientv3.WithRequireLeader(ctx), s.ks.FloorKey()); err != nil {
		return backendErr("etcd", "ping", err)
	}
	return nil
}

// Watch implements LeaseStore with an etcd watch on the lock key; it
// returns once etcd has confirmed the watch.
func (s *EtcdStore) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	wch := s.cli.Watch(wctx, s.ks.LockKey(name), clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
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
	ch := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by stop
		defer wg.Done()
		for range wch {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		// The watch ended (etcd lost its leader, or stop): a deletion may
		// have been missed, so wake the waiter to look for itself.
		select {
		case ch <- struct{}{}:
		default:
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	return ch, stop, nil
}
