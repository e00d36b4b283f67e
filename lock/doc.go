// Package lock takes leases and fencing tokens.
//
// A [Lease] pairs a lease, which makes contention cheap and orderly, with a
// fencing token, which makes it safe: pass [Lease.Token] to the protected
// resource with every write and let the resource reject stale tokens (see
// package fence and adapters/postgres). A lease alone cannot stop a holder
// that pauses past its TTL, or a Redis failover that forgets the lease, from
// writing late; the token checked by the resource can.
//
//	store, _ := lock.NewRedisStore(rdb, seq) // or lock.NewEtcdStore(etcdClient)
//	client, _ := lock.New(store)
//	lease, err := client.Acquire(ctx, "invoice-42", 10*time.Second, lock.WithKeepAlive())
//	if err != nil { … }
//	defer lease.Release(ctx)
//	err = db.Write(lease.Context(), lease.Token(), …) // the resource admits the token
//
// # Acquisition
//
// [Client.Acquire] follows the protocol in docs/design.md: a random 128-bit lease
// id; the lease (Redis SET NX PX); a token from the sequencer (an etcd Txn
// revision); a confirm script that checks the lease is still this lease id
// and records the token beside it; then validity = TTL - elapsed - drift
// (1% of the TTL + 2ms). A lease lost while its token was taken is
// abandoned and the acquisition tries again. With [EtcdStore] the lease and
// the token are one etcd Txn.
//
// A waiter does not poll: it subscribes to release notifications (Redis
// pub/sub published by the release script, or an etcd watch) and also wakes
// when the holder's lease would expire. The [RetryStrategy] only bounds the
// sleep when both are missed. [Client.TryAcquire] makes one attempt.
//
// # Losing a lease
//
// A lease is valid until [Lease.Deadline]. With [WithKeepAlive] a timer
// refreshes it every TTL/3 (a held lease has no goroutine of its own; a
// refresh runs on the timer's callback). A refresh that fails is tried
// again soon, and one unanswered in half the time left to the deadline is
// given up and sent again at once, so that a backend holding one request
// (an etcd member cut off from its peers, a dead TCP connection) does not
// cost the lease. When a refresh finds the lease
// taken or gone, or the deadline passes without a successful refresh,
// [Lease.Done] closes and [Lease.Context] is cancelled, once; [Lease.Err]
// says why ([ErrLost], [ErrExpired]). A refresh whose [LeaseKeeper] says it
// cannot be sent ([ErrCannotSend]: package client's, on a TLS certificate
// refused) is not tried again: the lease is lost at once, with that error,
// though the store holds it until its TTL runs out. [Lease.Release] closes them with
// [ErrReleased].
//
// # Options
//
// [WithWait], [WithRetry], [WithKeepAlive] and [WithDetached] configure one
// acquisition. An option that does not apply is an error matching
// [ErrInvalidOption], never silently dropped: WithWait or WithRetry with
// TryAcquire (one attempt), WithDetached with WithKeepAlive.
// [ResolveOptions] is that check, for other implementations of [Locker].
//
// # The same code against a fenced server
//
// [Locker] is Acquire and TryAcquire with these options. [*Client]
// implements it over a lease store in this process; *client.Client (package
// client) over a fenced server's HTTP API, with the same *[Lease]. Code that
// takes a Locker moves between the two unchanged.
//
// # Leases held elsewhere
//
// A server that hands the lease id to a remote holder acquires with
// [WithDetached] (no goroutine per lease) and serves refresh and release by
// id ([Client.RefreshID], [Client.ReleaseID]). The other way round, a
// [LeaseSet] gives a lease taken elsewhere this package's Lease, with its
// validity, keep-alive and Done: a Lease needs only a [LeaseKeeper], which
// refreshes and releases by lease id (package client's goes through the
// API).
//
// # Force-release
//
// [Client.ForceRelease] is an operator's act: it deletes a lock whoever
// holds it and wakes the next waiter. With [IfToken] it deletes the lock
// only if the grant holding it has that token, checked atomically with the
// delete, else it returns a [*HeldByOtherError] ([ErrHeldByOther]) naming
// the token that holds it. Only that form is safe to make again when the
// first call's outcome is unknown (a lost answer, a 503 from a fenced
// server): made twice, an unconditional force-release also removes the
// waiter the first one woke.
//
// # Errors
//
// Invalid names and TTLs (a TTL is [MinTTL] to [MaxTTL] in whole
// milliseconds, [ValidateTTL]) are rejected with [ErrInvalidName] and
// [ErrInvalidTTL] before any key is touched. A held lock is
// [ErrNotAcquired]; a refresh or release by a lease id that no longer holds
// the lease is [ErrLost]. When the context ends, the error matches ctx.Err().
// A backend that failed or did not answer is a [*BackendError]. An Acquire
// with a deadline (WithWait, or the context's) tries again after errors of
// a backend that is briefly unavailable (etcd without a leader, a Redis
// restarting, loading or failing over, a dropped connection) until the
// deadline, and then returns the backend's error; one without a deadline,
// and TryAcquire, return it at once (docs/design.md, "Riding out an
// outage").
//
// # Leader election
//
// [Client.Elect] campaigns in an election on an [EtcdStore] and returns the
// leadership as a Lease whose token is the leader's term; [Client.Observe]
// reports who leads. An election is the lock of its name held by the
// leader (docs/design.md, "Leader election"). [Elector] is what *Client and
// *client.Client share.
//
// # Stores
//
// [RedisStore] works with any redis.UniversalClient: a single node, Sentinel
// or Cluster (a lock's keys share the hash tag {name}). [RedlockStore] holds
// the lease on a majority of independent Redis nodes, so a minority of them
// can fail or restart empty without freeing it (a restarted node takes no
// lease until every lease it may have forgotten is over; a holder whose
// lease was on a bare majority with it loses it); [NewRedlockStore] refuses
// two nodes it can tell are one server. [EtcdStore] needs nothing but
// etcd: it enforces each lock's deadline itself, to the millisecond, and
// keeps its locks on a session lease per TTL class.
//
// Concurrent calls share round trips, with no timer holding a call back:
// tokens and [EtcdStore]'s creates and deletes are group-committed into
// shared Txns (two in flight by default, [WithEtcdInflight]), and
// [RedisStore]'s script calls into shared pipelines. A lone call is one
// round trip, and every call returns when its context ends, whatever the
// round trip it shares is doing.
//
// Whatever the store, leases
// are best-effort (a failover, a restart without persistence or a pause past
// the TTL can let two holders overlap); the tokens still order them.
package lock
