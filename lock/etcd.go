package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced/fenced/sequencer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore keeps leases in etcd, the zero-dependency default: one Txn
// creates the lock key if absent, attached to an etcd lease, and the token
// is that Txn's revision (plus the sequencer's floor offset). Steps 2 to 4
// of the protocol collapse into that Txn.
//
// etcd leases have whole-second TTLs and a minimum of about 1.5 times the
// election timeout: a TTL the server cannot honour is rounded up, and
// Grant.TTL (Lease.TTL) says what the lease really has. Refresh renews the
// lease for its own TTL; etcd cannot change a lease's TTL.
type EtcdStore struct {
	cli    *clientv3.Client
	prefix string
}

var _ LeaseStore = (*EtcdStore)(nil)

// NewEtcdStore returns a store on cli. prefix "" means
// sequencer.DefaultPrefix; use the same prefix as the sequencer so that
// RaiseFloor applies to both.
func NewEtcdStore(cli *clientv3.Client, prefix string) (*EtcdStore, error) {
	if cli == nil {
		return nil, errors.New("lock: nil etcd client")
	}
	if prefix == "" {
		prefix = sequencer.DefaultPrefix
	}
	return &EtcdStore{cli: cli, prefix: prefix}, nil
}

func (s *EtcdStore) key(name string) string { return s.prefix + "locks/" + name }

// Acquire implements LeaseStore.
func (s *EtcdStore) Acquire(ctx context.Context, name, leaseID string, ttl time.Duration) (Grant, error) {
	key := s.key(name)
	// A held lock should cost a local read, not a lease grant and revoke
	// (two Raft writes). The read is serializable, so it may be stale; the
	// Txn below decides.
	if r, err := s.cli.Get(ctx, key, clientv3.WithCountOnly(), clientv3.WithSerializable()); err != nil {
		return Grant{}, fmt.Errorf("lock: etcd: %w", err)
	} else if r.Count > 0 {
		return Grant{}, &HeldError{}
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	lg, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return Grant{}, fmt.Errorf("lock: etcd grant: %w", err)
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, leaseID, clientv3.WithLease(lg.ID)), clientv3.OpGet(sequencer.FloorKey(s.prefix))).
		Commit()
	if err != nil || !resp.Succeeded {
		s.revoke(ctx, lg.ID)
	}
	if err != nil {
		return Grant{}, fmt.Errorf("lock: etcd txn: %w", err)
	}
	if !resp.Succeeded {
		// No remaining-time hint: the watch sees the key deleted on expiry.
		return Grant{}, &HeldError{}
	}
	offset, err := sequencer.ParseFloor(resp.Responses[1].GetResponseRange())
	if err != nil {
		return Grant{}, err
	}
	return Grant{Token: sequencer.Token(resp.Header.Revision, offset), TTL: time.Duration(lg.TTL) * time.Second}, nil
}

// revoke frees an etcd lease that holds no lock.
func (s *EtcdStore) revoke(ctx context.Context, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id) // it expires anyway
}

// Refresh implements LeaseStore. The TTL cannot change: it returns the
// lease's own.
func (s *EtcdStore) Refresh(ctx context.Context, name, leaseID string, _ time.Duration) (Grant, error) {
	key := s.key(name)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", leaseID)).
		Then(clientv3.OpGet(key), clientv3.OpGet(sequencer.FloorKey(s.prefix))).
		Commit()
	if err != nil {
		return Grant{}, fmt.Errorf("lock: etcd txn: %w", err)
	}
	if !resp.Succeeded {
		return Grant{}, ErrLost
	}
	kv := resp.Responses[0].GetResponseRange().Kvs[0]
	offset, err := sequencer.ParseFloor(resp.Responses[1].GetResponseRange())
	if err != nil {
		return Grant{}, err
	}
	ka, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(kv.Lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return Grant{}, ErrLost
	}
	if err != nil {
		return Grant{}, fmt.Errorf("lock: etcd keep-alive: %w", err)
	}
	return Grant{Token: sequencer.Token(kv.CreateRevision, offset), TTL: time.Duration(ka.TTL) * time.Second}, nil
}

// Release implements LeaseStore. Deleting the key wakes the waiters' watches.
func (s *EtcdStore) Release(ctx context.Context, name, leaseID string) error {
	key := s.key(name)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", leaseID)).
		Then(clientv3.OpDelete(key, clientv3.WithPrevKV())).
		Commit()
	if err != nil {
		return fmt.Errorf("lock: etcd txn: %w", err)
	}
	if !resp.Succeeded {
		return ErrLost
	}
	if prev := resp.Responses[0].GetResponseDeleteRange().PrevKvs; len(prev) == 1 && prev[0].Lease != 0 {
		s.revoke(ctx, clientv3.LeaseID(prev[0].Lease))
	}
	return nil
}

// Inspect implements LeaseStore. The token is the key's create revision
// plus today's floor offset.
func (s *EtcdStore) Inspect(ctx context.Context, name string) (State, error) {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.key(name)), clientv3.OpGet(sequencer.FloorKey(s.prefix))).Commit()
	if err != nil {
		return State{}, fmt.Errorf("lock: etcd: %w", err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return State{}, nil
	}
	offset, err := sequencer.ParseFloor(resp.Responses[1].GetResponseRange())
	if err != nil {
		return State{}, err
	}
	st := State{Held: true, LeaseID: string(kvs[0].Value), Token: sequencer.Token(kvs[0].CreateRevision, offset)}
	if kvs[0].Lease != 0 {
		if ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kvs[0].Lease)); err == nil && ttl.TTL > 0 {
			st.Remaining = time.Duration(ttl.TTL) * time.Second
		}
	}
	return st, nil
}

// Ping implements LeaseStore.
func (s *EtcdStore) Ping(ctx context.Context) error {
	if _, err := s.cli.Get(ctx, sequencer.FloorKey(s.prefix)); err != nil {
		return fmt.Errorf("lock: etcd: %w", err)
	}
	return nil
}

// Watch implements LeaseStore with an etcd watch on the lock key; it
// returns once etcd has confirmed the watch.
func (s *EtcdStore) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	wch := s.cli.Watch(wctx, s.key(name), clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil {
			cancel()
			return nil, nil, fmt.Errorf("lock: etcd watch: %v", wr.Err())
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
