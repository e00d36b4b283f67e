package lock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// PipelineAcquireAndRefresh sends, in one pipeline and in this order, an
// acquire of name by a new lease id and a refresh of leaseID to ttl, and
// returns their answers: two calls of one lock whose keys may live on two
// Cluster masters at once (defect 105).
func (s *RedisStore) PipelineAcquireAndRefresh(ctx context.Context, name, leaseID string, ttl time.Duration) (acquire, refresh *redis.Cmd) {
	k := s.keys(name)
	cmds := s.send(ctx, []scriptCall{
		{acquireScript, []string{k[kLease], k[kToken], k[kQueue], k[kPlaces], s.abandonedKey(name, "lease-never-granted")}, []any{"lease-never-granted", ttl.Milliseconds(), "", 0, "", 0}},
		{refreshScript, k[:2], []any{leaseID, ttl.Milliseconds(), 0}},
	})
	return cmds[0], cmds[1]
}

// AbandonLease is abandonLease: the release of an attempt that failed
// without knowing whether its acquire script ran (defect 145).
func (s *RedisStore) AbandonLease(ctx context.Context, name, leaseID string, ttl time.Duration) error {
	return s.abandonLease(ctx, name, leaseID, ttl)
}

// AbandonedFor is abandonedFor: how long an abandoned attempt's etcd mark
// lasts at least, which internal/chaos holds the marks left in etcd to.
const AbandonedFor = abandonedFor

// MarkReuse is markReuse: how long an etcd store puts abandoned marks on
// one lease (defect 212).
const MarkReuse = markReuse

// MaxAbandonsRetrying is maxAbandonsRetrying: the most abandons a store
// tries again at once.
const MaxAbandonsRetrying = maxAbandonsRetrying

// UnreenterFailed runs what store s does when req's reentry failed without
// its answer: the take-off of a hold its script or Txn may have counted.
func UnreenterFailed(ctx context.Context, s LeaseStore, req AcquireRequest, holderLease string) {
	switch s := s.(type) {
	case *RedisStore:
		s.unreenter(ctx, req)
	case *EtcdStore:
		s.unreenter(ctx, req.Name, holderLease, req.mark())
	default:
		panic("UnreenterFailed: not a RedisStore or EtcdStore")
	}
}
