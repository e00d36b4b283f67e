package compare

import "time"

// Scheme ids, the rows of the table.
const (
	Naive        = "naive"
	Redislock    = "redislock"
	RedisIncr    = "redislock+incr"
	Redsync      = "redsync"
	EtcdMutex    = "etcd-mutex"
	EtcdMutexRev = "etcd-mutex+rev"
	PGRowLock    = "pg-rowlock"
	FencedRedis  = "fenced/redis"
	FencedEtcd   = "fenced/etcd"
	FencedRedlk  = "fenced/redlock"
)

// Where a scheme keeps its lease.
const (
	leaseRedis  = "redis"  // one Redis node
	leaseRedis5 = "redis5" // five independent Redis nodes (Redlock)
	leaseEtcd   = "etcd"
	leasePG     = "postgres"
)

// How a scheme's holders write to the ledger.
const (
	writePlain   = "plain"   // no token: the lock is all there is
	writeFenced  = "fenced"  // the token admitted by adapters/postgres before the read and the write
	writeRowLock = "rowlock" // one transaction: SELECT ... FOR UPDATE, read, write, COMMIT
)

// scheme is one way of taking a lock, as its users use it.
type scheme struct {
	ID    string
	Title string // one line for the table's legend
	Lease string
	Write string
	// Etcd: the scheme needs etcd (its lease, or its tokens).
	Etcd bool
	// Fenced: one of fenced's own stores; the CI gate applies.
	Fenced bool
	// Token: where the token comes from, "" for none.
	Token string
}

var schemes = []scheme{
	{ID: Naive, Title: "SET NX PX, refreshed by PEXPIRE and released by DEL, neither checking the owner; no token", Lease: leaseRedis, Write: writePlain},
	{ID: Redislock, Title: "bsm/redislock on one Redis: Obtain, Refresh every TTL/3, Release; no token", Lease: leaseRedis, Write: writePlain},
	{ID: RedisIncr, Title: "bsm/redislock plus a Redis INCR counter as the token (Redisson's FencedLock), checked by the same fence", Lease: leaseRedis, Write: writeFenced, Token: "redis INCR"},
	{ID: Redsync, Title: "go-redsync/redsync (Redlock) over five independent Redis nodes, Extend every TTL/3; no token", Lease: leaseRedis5, Write: writePlain},
	{ID: EtcdMutex, Title: "etcd concurrency.Mutex on a Session (keep-alive), the usual way; no token", Lease: leaseEtcd, Write: writePlain, Etcd: true},
	{ID: EtcdMutexRev, Title: "etcd concurrency.Mutex with its key's create revision as the token, checked by the same fence", Lease: leaseEtcd, Write: writeFenced, Etcd: true, Token: "etcd create revision"},
	{ID: PGRowLock, Title: "Postgres SELECT ... FOR UPDATE of a lock row in the writer's own transaction", Lease: leasePG, Write: writeRowLock},
	{ID: FencedRedis, Title: "fenced, leases in one Redis, tokens from the etcd sequencer, fence in Postgres", Lease: leaseRedis, Write: writeFenced, Etcd: true, Fenced: true, Token: "fenced"},
	{ID: FencedEtcd, Title: "fenced, leases and tokens in etcd (lock.EtcdStore), fence in Postgres", Lease: leaseEtcd, Write: writeFenced, Etcd: true, Fenced: true, Token: "fenced"},
	{ID: FencedRedlk, Title: "fenced, Redlock leases over five Redis nodes (lock.RedlockStore), tokens from etcd, fence in Postgres", Lease: leaseRedis5, Write: writeFenced, Etcd: true, Fenced: true, Token: "fenced"},
}

func schemeByID(id string) (scheme, bool) {
	for _, s := range schemes {
		if s.ID == id {
			return s, true
		}
	}
	return scheme{}, false
}

// redisNodes is how many Redis nodes the scheme's lease needs.
func (s scheme) redisNodes() int {
	switch s.Lease {
	case leaseRedis:
		return 1
	case leaseRedis5:
		return 5
	}
	return 0
}

// ttl is the lease TTL a scheme's holders ask for. etcd leases have whole
// seconds; Redis leases are short so that faults resolve quickly.
func (s scheme) ttl(short bool) time.Duration {
	if s.Lease == leaseEtcd {
		return time.Second
	}
	if short {
		return 500 * time.Millisecond
	}
	return 800 * time.Millisecond
}
