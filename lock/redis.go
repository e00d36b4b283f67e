package lock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/groupcommit"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/prelude.lua
	preludeLua string
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
	//go:embed scripts/force.lua
	forceLua string
	//go:embed scripts/leave.lua
	leaveLua string
	//go:embed scripts/ready.lua
	readyLua string
	//go:embed scripts/unreenter.lua
	unreenterLua string
	//go:embed scripts/recover.lua
	recoverLua string
	//go:embed scripts/pttl.lua
	pttlLua string

	acquireScript   = redis.NewScript(preludeLua + acquireLua)
	confirmScript   = redis.NewScript(confirmLua)
	refreshScript   = redis.NewScript(refreshLua)
	releaseScript   = redis.NewScript(preludeLua + releaseLua)
	inspectScript   = redis.NewScript(preludeLua + inspectLua)
	forceScript     = redis.NewScript(preludeLua + forceLua)
	leaveScript     = redis.NewScript(preludeLua + leaveLua)
	readyScript     = redis.NewScript(readyLua)
	unreenterScript = redis.NewScript(preludeLua + unreenterLua)
	recoverScript   = redis.NewScript(preludeLua + recoverLua)
	pttlScript      = redis.NewScript(pttlLua)
)

// RedisStore keeps leases in Redis and takes tokens from a Sequencer. Any
// redis.UniversalClient works: a single node, Sentinel (a failover client)
// or Cluster. A lock's keys share the hash tag {name}, so they live in one
// Cluster slot and its scripts run on one node. Redis 5 or later. On a
// Cluster the store's pipelines go to each master's own client, so hooks on
// the ClusterClient see only its lone calls: add hooks to the nodes
// (OnNewNode). A call that meets its slot on the move is sent again, and
// one that gets no answer has the client read the cluster's layout again,
// as after a failover (redispipe.go).
//
// Give the client ContextTimeoutEnabled (redis.Options and friends): without
// it go-redis bounds each call by its own read and write timeouts, not by
// the context, and a wait budget cannot cut a call to a Redis that hangs.
// With it, a lone script call also runs on its caller's goroutine, without
// a hand-off to the pipeline's goroutine (about 150 us less per uncontended
// acquire+release here; redispipe.go).
//
// Keys, under the prefix and the hash tag {name}:
//
//	lease   the lease id, with the lease's expiry
//	token   a hash beside it: t the token, o the owner, h the holder, c the count
//	last    the lease id released last and its token, for as long as that
//	        lease had left (a retried release succeeds; Inspect's LastToken);
//	        after a force-release, "forced:<the call's nonce>:" before them
//	queue   fair waiters by arrival (a sorted set)
//	places  fair waiters by when their place expires (a sorted set)
//	released  the lease ids released lately, the last 16, newest first (a
//	        list, living as long as the longest lease it names had left): a
//	        release sent again after the next holder came and went still
//	        succeeds
//	abandoned:<lease id>  an attempt its caller gave up, whose acquire
//	        script Redis may yet run: it then takes nothing (for the
//	        attempt's TTL; abandonLease)
//
// and <prefix>ready, which Ping writes for a minute (scripts/ready.lua); a
// Redlock node of one server also keeps <prefix>epoch and <prefix>horizon
// (RedlockStore).
//
// A release, a force-release, and a leave by the waiter at the head of the
// queue of a free lock publish on <prefix>{name}:released the id of the
// waiter now at the head, once expired places are dropped (publish_head in
// scripts/prelude.lua); that waiter alone then tries. No key outlives
// its lease or its longest waiter's place. Every script is safe to run
// twice, as go-redis does after a lost reply (docs/design.md, defect 4).
// Concurrent script calls share pipelines (redispipe.go); Stats counts
// them.
type RedisStore struct {
	rdb    redis.UniversalClient
	seq    sequencer.Sequencer
	prefix string
	n      notifier
	pipe   groupcommit.Committer[scriptCall] // script calls share pipelines (redispipe.go)
	// masterPipes, on a Cluster, is a committer per master (address to
	// *groupcommit.Committer[scriptCall]): a master that hangs holds its
	// own slots only (masterPipe).
	masterPipes sync.Map
	// callTimeout, when set (a Redlock node), bounds each call of a List,
	// which makes one per key: a bound on the whole would fail long pages.
	callTimeout time.Duration
	// epochKey and horizonKey, "" but on a Redlock node of one server:
	// <prefix>epoch and <prefix>horizon, so that after it may have lost
	// leases (a restart, a failover, a flush) it takes no lease, and
	// extends none, until every lease it may have forgotten is over
	// (RedlockStore.recover).
	epochKey, horizonKey string

	calls, pipelines, pipelined atomic.Uint64

	// cleanups are the best-effort cleanups that outlive the failed call
	// that started them (afterwards, cleanup.go); Close waits for them.
	cleanups
}

var _ LeaseStore = (*RedisStore)(nil)

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore) error

// WithRedisPrefix sets the key prefix. Default "fenced:". See
// ValidateRedisPrefix.
func WithRedisPrefix(p string) RedisOption {
	return func(s *RedisStore) error {
		if err := ValidateRedisPrefix(p); err != nil {
			return err
		}
		s.prefix = p
		return nil
	}
}

// ValidateRedisPrefix checks a Redis key prefix: not empty, and without
// "{" or "}". A lock's keys share the hash tag {name}, which keeps them in
// one Redis Cluster slot for its scripts; a brace in the prefix would come
// first and change the tag: "{}" made every script fail with CROSSSLOT,
// and "{app}" put every lock on one master (docs/design.md, defect 200).
func ValidateRedisPrefix(p string) error {
	switch {
	case p == "":
		return errors.New("lock: empty Redis key prefix; want one such as fenced: or app-a:")
	case strings.ContainsAny(p, "{}"):
		return fmt.Errorf("lock: Redis key prefix %q has a brace; want none: a lock's {name} must be its keys' first hash tag, so that they share a Redis Cluster slot (use one such as fenced: or app-a:)", p)
	}
	return nil
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
	s.initPipe()
	return s, nil
}

// Keys of a lock, in the order the scripts take them.
const (
	kLease = iota
	kToken
	kLast
	kQueue
	kPlaces
	kReleased
)

// keySuffixes name a lock's keys, after its prefix and {name}:.
var keySuffixes = [...]string{kLease: "lease", kToken: "token", kLast: "last", kQueue: "queue", kPlaces: "places", kReleased: "released"}

func (s *RedisStore) keys(name string) []string {
	// One string holds them all, cut into the six: three allocations on
	// every call of a pair and every refresh, where there were eight.
	base := s.prefix + "{" + name + "}:"
	var b strings.Builder
	b.Grow(len(keySuffixes) * (len(base) + len("released")))
	for _, x := range keySuffixes {
		b.WriteString(base)
		b.WriteString(x)
	}
	all := b.String()
	k := make([]string, len(keySuffixes))
	for i, x := range keySuffixes {
		n := len(base) + len(x)
		k[i], all = all[:n], all[n:]
	}
	return k
}

func (s *RedisStore) channel(name string) string { return s.prefix + "{" + name + "}:released" }

// The steps of the protocol on one Redis, shared with RedlockStore.

// taken is what the acquire script found.
type taken struct {
	ok bool // this lease id holds the lease now
	// recovering: a Redlock node that may have lost leases takes none for
	// held more (fresh: until RedlockStore.recover says how long).
	recovering, fresh bool
	reentry           bool          // the holder held it already: leaseID, token, count say how
	inProgress        bool          // an earlier request of the acquisition took it, unconfirmed yet
	leaseID           string        // reentry
	token             fence.Token   // reentry
	count             int           // reentry
	held              time.Duration // not ok: the holder's remaining TTL, 0 if unknown
	position          int           // not ok: the waiter's place in the queue, 1 at the head; 0 if none
}

// take is step 2: the lease if it is free (and the waiter's turn), or a
// place in the queue.
func (s *RedisStore) take(ctx context.Context, req AcquireRequest) (taken, error) {
	k := s.keys(req.Name)
	keys := append(make([]string, 0, 7), k[kLease], k[kToken], k[kQueue], k[kPlaces], s.abandonedKey(req.Name, req.LeaseID))
	if s.epochKey != "" {
		keys = append(keys, s.epochKey, s.horizonKey)
	}
	v, err := s.run(ctx, acquireScript, keys, req.LeaseID, req.TTL.Milliseconds(),
		req.Waiter, req.WaiterTTL.Milliseconds(), req.Holder, req.Rejoin, s.channel(req.Name)).Slice()
	if err != nil {
		return taken{}, err
	}
	code, _ := v[0].(int64)
	switch code {
	case 0:
		return taken{ok: true}, nil
	case 1:
		t := taken{reentry: true, count: int(asInt(v[3]))}
		t.leaseID, _ = v[1].(string)
		tok, _ := strconv.ParseUint(asString(v[2]), 10, 64)
		t.token = fence.Token(tok)
		return t, nil
	case 3:
		wait := asInt(v[1])
		return taken{recovering: true, fresh: wait < 0, held: time.Duration(max(wait, 0)) * time.Millisecond}, nil
	case 4:
		return taken{inProgress: true, held: time.Duration(asInt(v[1])) * time.Millisecond}, nil
	}
	return taken{held: time.Duration(asInt(v[1])) * time.Millisecond, position: int(asInt(v[2])) + 1}, nil
}

// confirm is step 4: record the token if the lease is still leaseID's.
func (s *RedisStore) confirm(ctx context.Context, req AcquireRequest, tok fence.Token) (ok bool, err error) {
	pttl, err := s.run(ctx, confirmScript, s.keys(req.Name)[:2], req.LeaseID, uint64(tok), req.Owner, req.Holder, req.Rejoin).Int64()
	return err == nil && pttl >= 0, err
}

// release deletes the lease if leaseID holds it or was the last to; a
// reentrant holder's release only counts down, once per op (the script
// keeps the last few: a release sent again counts nothing). Without an op
// it draws one, which go-redis sends again with the script. lost is the
// script's "not held" (releaseLost), err the call's failure.
func (s *RedisStore) release(ctx context.Context, name, leaseID, op string) (lost, err error) {
	n, err := s.runRelease(ctx, name, leaseID, op, s.keys(name))
	if err != nil {
		return nil, err
	}
	return releaseLost(n), nil
}

// releaseLost is the error of the release script's answer n: nil when it
// released or counted down (1, 2); ErrLost when the lease is not held and
// Redis remembers every release of it that could have freed it (0): it
// was lost before; ErrLost with ErrMaybeReleased when Redis may have
// forgotten that this lease id's own release freed it (4: 16 handovers
// since), which Lease.Release forgives after an attempt that got no
// answer.
func releaseLost(n int64) error {
	switch n {
	case 0:
		return ErrLost
	case 4:
		return errLostMaybeReleased
	}
	return nil
}

// runRelease runs the release script (scripts/release.lua) with keys and
// the arguments after its first three, drawing the call's op if "".
func (s *RedisStore) runRelease(ctx context.Context, name, leaseID, op string, keys []string, more ...any) (int64, error) {
	if op == "" {
		var err error
		if op, err = newLeaseID(); err != nil {
			return 0, err
		}
	}
	return s.run(ctx, releaseScript, keys, append([]any{leaseID, s.channel(name), op}, more...)...).Int64()
}

// ReleaseUnhanded implements UnhandedReleaser: the release script, told
// to leave a grant that acquire.lua handed to another request of its
// acquisition, or that is held more than once.
func (s *RedisStore) ReleaseUnhanded(ctx context.Context, name, leaseID string) (bool, error) {
	n, err := s.runRelease(ctx, name, leaseID, "", s.keys(name), "", "1")
	if err != nil {
		return false, backendErr("redis", "release", err)
	}
	return n == 1, nil
}

// UnreenterUnhanded implements UnhandedUnreenterer: unreenter.lua, told to
// leave a hold that acquire.lua found counted for a copy of the request
// (another attempt of the same acquisition), or of a lease no longer
// leaseID's.
func (s *RedisStore) UnreenterUnhanded(ctx context.Context, name, leaseID, waiter string) (bool, error) {
	k := s.keys(name)
	n, err := s.run(ctx, unreenterScript, []string{k[kToken], k[kLease]}, "w"+waiter, "1", leaseID).Int64()
	if err != nil {
		return false, backendErr("redis", "release", err)
	}
	return n == 1, nil
}

// abandonedKey marks leaseID's attempt abandoned (abandonLease).
func (s *RedisStore) abandonedKey(name, leaseID string) string {
	return s.prefix + "{" + name + "}:abandoned:" + leaseID
}

// abandonLease is the release of an attempt that failed without knowing
// whether its acquire script ran: it frees the lease if the attempt took
// it, and if it finds no trace of it, marks the attempt abandoned for its
// TTL, so that the script, if it runs yet (a paused Redis, a link that
// held it), takes nothing (defect 145).
func (s *RedisStore) abandonLease(ctx context.Context, name, leaseID string, ttl time.Duration) error {
	_, err := s.runRelease(ctx, name, leaseID, "", append(s.keys(name), s.abandonedKey(name, leaseID)), max(ttl.Milliseconds(), 1))
	return err
}

// Acquire implements LeaseStore: SET NX PX (or the queue's turn), a token
// from the sequencer, and the confirm script.
func (s *RedisStore) Acquire(ctx context.Context, req AcquireRequest) (Grant, error) {
	t, err := s.take(ctx, req)
	if err != nil {
		// The SET, or a reentry's count, may have happened with its reply
		// lost: free it if so.
		s.abandon(ctx, req, false)
		s.unreenter(ctx, req)
		return Grant{}, backendErr("redis", "acquire", err)
	}
	switch {
	case t.reentry:
		// The script extended the lease (never shortened it) with the
		// count: no second step that could fail after the count went up.
		return Grant{Token: t.token, TTL: req.TTL, LeaseID: t.leaseID, Count: t.count}, nil
	case t.inProgress:
		return Grant{}, ErrInProgress
	case !t.ok:
		return Grant{}, &HeldError{Remaining: t.held, Position: t.position}
	}
	tok, err := s.seq.Next(ctx, req.Name)
	if err != nil {
		s.abandon(ctx, req, false)
		return Grant{}, backendErr("etcd", "token", err)
	}
	ok, err := s.confirm(ctx, req, tok)
	if err != nil {
		s.abandon(ctx, req, true)
		return Grant{}, backendErr("redis", "confirm", err)
	}
	if !ok {
		// The lease expired or went while the token was taken; if it is
		// still this attempt's (its token hash said another token), free
		// it rather than hold the lock, known to nobody, for its TTL.
		s.abandon(ctx, req, false)
		return Grant{}, ErrLost
	}
	return Grant{Token: tok, TTL: req.TTL, LeaseID: req.LeaseID, Count: 1}, nil
}

// abandon frees req's lease, whose token could not be taken or confirmed,
// so that others need not wait for it to expire (it expires anyway). Only
// req's attempt knows its lease id, and a release of it changes nothing
// else, so the release need not come before the caller's error: it runs
// on a goroutine of the store, and the error returns when the caller's
// context ends, not up to cleanupTimeout later (defect 126). Redis may run
// the acquire script after that (paused, or its request held on the way):
// the abandon marks the attempt so that the script then takes nothing, and
// tries again until Redis answers (abandonLease, cleanups.abandon; defect
// 145).
//
// But a confirm that failed (confirmed) may have run, its reply lost, and
// recorded the grant for a remote acquisition (Rejoin), whose next request
// is handed that very lease (acquire.lua): a release after that request
// would free the lock under the holder it was handed to. Then the release
// comes first, as before, bounded by cleanupTimeout past the caller's end.
func (s *RedisStore) abandon(ctx context.Context, req AcquireRequest, confirmed bool) {
	s.cleanups.abandon(ctx, confirmed && req.Rejoin != "", abandonWindow(req.TTL), func(ctx context.Context) error {
		return s.abandonLease(ctx, req.Name, req.LeaseID, req.TTL)
	})
}

// unreenter takes off the hold that req's acquire script may have counted
// as a reentry, its reply lost and the call failed (scripts/unreenter.lua).
// Unlike abandon's release it runs before the failed acquire returns, up
// to cleanupTimeout past the caller's end, for its order matters: a
// release by the holder that came first would count the lock down to the
// one hold that unreenter never takes off, the lock then held by nobody
// until its TTL; and an attempt sent again with the same mark (req.mark:
// the waiter's) that came first would find its hold counted already,
// which unreenter then takes off: one release short of its holds. A
// remote acquisition's copy, sent through another process that this
// order does not reach, marks the hold handed, and unreenter leaves such
// a hold (defect 214).
func (s *RedisStore) unreenter(ctx context.Context, req AcquireRequest) {
	if req.Holder == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = s.run(ctx, unreenterScript, s.keys(req.Name)[kToken:kToken+1], req.mark()).Err() // it expires anyway
}

// Refresh implements LeaseStore.
func (s *RedisStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (Grant, error) {
	keys := s.keys(name)[:2]
	if s.horizonKey != "" {
		keys = []string{keys[0], keys[1], s.horizonKey, s.epochKey}
	}
	tok, err := s.run(ctx, refreshScript, keys, leaseID, ttl.Milliseconds(), seq).Int64()
	if errors.Is(err, redis.Nil) {
		return Grant{}, ErrLost
	}
	if err != nil {
		return Grant{}, backendErr("redis", "refresh", err)
	}
	if tok < 0 {
		return Grant{}, ErrOutOfOrder
	}
	return Grant{Token: fence.Token(tok), TTL: ttl, LeaseID: leaseID}, nil
}

// Release implements LeaseStore. Releasing a lease that this lease id
// already released, while it would still have been valid, succeeds. A
// reentrant holder's lease is freed by its last release. ErrLost when not
// held (releaseLost says when Redis cannot tell whether it was this lease
// id's own release that freed it).
func (s *RedisStore) Release(ctx context.Context, name, leaseID, op string) error {
	lost, err := s.release(ctx, name, leaseID, op)
	if err != nil {
		return backendErr("redis", "release", err)
	}
	return lost
}

// Leave implements LeaseStore.
func (s *RedisStore) Leave(ctx context.Context, name, waiter string) error {
	k := s.keys(name)
	if err := s.run(ctx, leaveScript, []string{k[kQueue], k[kPlaces], k[kLease]}, waiter, s.channel(name)).Err(); err != nil {
		return backendErr("redis", "leave", err)
	}
	return nil
}

// Inspect implements LeaseStore.
func (s *RedisStore) Inspect(ctx context.Context, name string) (State, error) {
	v, err := s.run(ctx, inspectScript, s.keys(name)).Slice()
	if err != nil {
		return State{}, backendErr("redis", "inspect", err)
	}
	return parseInspect(name, v), nil
}

// parseInspect reads the inspect script's answer.
func parseInspect(name string, v []any) State {
	st := State{Name: name, Waiters: int(asInt(v[6]))}
	now := asInt(v[8]) * 1000 // µs, as arrivals are
	if oldest := asInt(v[7]); st.Waiters > 0 && oldest > 0 && now >= oldest {
		st.OldestWait = time.Duration(now-oldest) * time.Microsecond
	}
	id := asString(v[0])
	if id == "" {
		if id, tok, ok := strings.Cut(asString(v[9]), " "); ok && id != "" {
			n, _ := strconv.ParseUint(tok, 10, 64)
			st.LastToken = fence.Token(n)
		}
		return st
	}
	// A lease about to expire has a PTTL of 0 ms: it is still held, so
	// Remaining is never 0 for a held lock.
	st.Held, st.LeaseID, st.Remaining, st.Count = true, id, time.Millisecond, 1
	if ms := asInt(v[1]); ms > 0 {
		st.Remaining = time.Duration(ms) * time.Millisecond
	}
	n, _ := strconv.ParseUint(asString(v[2]), 10, 64)
	st.Token = fence.Token(n)
	st.Owner, st.Holder = asString(v[3]), asString(v[4])
	if c := asInt(v[5]); c > 0 {
		st.Count = int(c)
	}
	return st
}

// ForceRelease implements LeaseStore.
func (s *RedisStore) ForceRelease(ctx context.Context, name string, token fence.Token) (State, error) {
	before, err := s.Inspect(ctx, name)
	if err != nil {
		return State{}, err
	}
	// The nonce lets the script, sent again after a lost reply, find what
	// its first run removed rather than remove the next holder.
	nonce, err := newLeaseID()
	if err != nil {
		return State{}, err
	}
	want := ""
	if token != 0 {
		want = token.String()
	}
	v, err := s.run(ctx, forceScript, s.keys(name), s.channel(name), nonce, want).Slice()
	if err != nil {
		return State{}, backendErr("redis", "force-release", err)
	}
	if asString(v[0]) == "" && v[1] != nil {
		n, _ := strconv.ParseUint(asString(v[1]), 10, 64)
		return State{}, &HeldByOtherError{Name: name, Token: fence.Token(n), Want: token}
	}
	if id := asString(v[0]); id != before.LeaseID {
		// Released or taken over between the two calls: report what was removed.
		before = State{Name: name}
		if id != "" {
			n, _ := strconv.ParseUint(asString(v[1]), 10, 64)
			before = State{Name: name, Held: true, LeaseID: id, Token: fence.Token(n), Count: 1}
		}
	}
	return before, nil
}

// List implements LeaseStore by scanning for lease keys with SCAN; the
// page cursor says where the scan stopped. On a Cluster every master is
// scanned in turn, so a lock whose slot moves to a master already scanned
// (a reshard), or whose master fails over, between two pages may be missed
// or listed twice: no SCAN spans masters.
func (s *RedisStore) List(ctx context.Context, req ListRequest) (ListPage, error) {
	nodes, err := s.scanNodes(ctx)
	if err != nil {
		return ListPage{}, backendErr("redis", "list", err)
	}
	at, err := parseListCursor(req.Cursor, len(nodes))
	if err != nil {
		return ListPage{}, err
	}
	match := globEscape(s.prefix) + "{" + globEscape(req.Prefix) + "*}:lease"
	var page ListPage
	for at.node < len(nodes) {
		sctx, cancel := s.callContext(ctx)
		keys, next, err := nodes[at.node].Scan(sctx, at.cursor, match, int64(max(req.Limit, 100))).Result()
		cancel()
		if err != nil {
			return ListPage{}, backendErr("redis", "list", err)
		}
		// A SCAN call's keys come in no order, and a page may end inside
		// them: the next page scans from the same cursor again and goes on
		// after the last name this one looked at. By name, not by
		// position, so that a lock released meanwhile shifts nothing.
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = strings.TrimSuffix(strings.TrimPrefix(k, s.prefix+"{"), "}:lease")
		}
		slices.Sort(names)
		last := at.after
		for _, name := range names {
			if name <= at.after {
				continue // looked at by the page before
			}
			if len(page.Locks) == req.Limit {
				page.Next = listCursor{node: at.node, cursor: at.cursor, after: last}.String()
				return page, nil
			}
			last = name
			ictx, cancel := s.callContext(ctx)
			st, err := s.Inspect(ictx, name)
			cancel()
			if err != nil {
				return ListPage{}, err
			}
			if st.Held {
				page.Locks = append(page.Locks, st)
			}
		}
		at = listCursor{node: at.node, cursor: next}
		if next == 0 {
			at.node++
		}
		if len(page.Locks) == req.Limit && at.node < len(nodes) {
			page.Next = at.String()
			return page, nil
		}
	}
	return page, nil
}

// pttl is key's PTTL in ms (-2: no such key), read through the pipelines
// (scripts/pttl.lua).
func (s *RedisStore) pttl(ctx context.Context, key string) (int64, error) {
	return s.run(ctx, pttlScript, []string{key}).Int64()
}

// callContext is ctx bounded by the store's callTimeout, if it has one.
func (s *RedisStore) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.callTimeout == 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.callTimeout)
}

// listCursor is where a List stopped: a node, its SCAN cursor, and the
// last name of that SCAN call's keys already looked at ("" for none).
type listCursor struct {
	node   int
	cursor uint64
	after  string
}

func (c listCursor) String() string { return fmt.Sprintf("%d-%d-%s", c.node, c.cursor, c.after) }

// parseListCursor reads a cursor of List; "" is the start.
func parseListCursor(c string, nodes int) (listCursor, error) {
	if c == "" {
		return listCursor{}, nil
	}
	var at listCursor
	parts := strings.SplitN(c, "-", 3)
	var errs [3]error
	if len(parts) == 3 {
		at.node, errs[0] = strconv.Atoi(parts[0])
		at.cursor, errs[1] = strconv.ParseUint(parts[1], 10, 64)
		if at.after = parts[2]; at.after != "" {
			errs[2] = ValidateName(at.after)
		}
	}
	if len(parts) != 3 || errs[0] != nil || errs[1] != nil || errs[2] != nil || at.node < 0 || at.node >= nodes {
		return listCursor{}, fmt.Errorf("%w: %q: want the next_cursor a previous page returned", ErrInvalidCursor, c)
	}
	return at, nil
}

// scanNodes are the Redis servers a List scans: every master of a Cluster,
// in address order so that a cursor names the same one; else the client.
func (s *RedisStore) scanNodes(ctx context.Context) ([]redis.UniversalClient, error) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return []redis.UniversalClient{s.rdb}, nil
	}
	var (
		mu      sync.Mutex
		masters []*redis.Client
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		masters = append(masters, c)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(masters, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	nodes := make([]redis.UniversalClient, len(masters))
	for i, m := range masters {
		nodes[i] = m
	}
	return nodes, err
}

// globEscape quotes the glob characters of a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func asInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func asString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// Ping implements LeaseStore: Redis takes a write (ready.lua says which
// refusals that finds), and the sequencer answers if it can be pinged.
func (s *RedisStore) Ping(ctx context.Context) error {
	if err := s.run(ctx, readyScript, []string{s.prefix + "ready"}).Err(); err != nil {
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
// waits on it. A fair waiter is woken only by a release that names it (or
// names nobody).
func (s *RedisStore) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	return s.n.watch(ctx, s.channel(name), waiter)
}

// Close stops the notification subscriber and waits for the cleanups that
// failed calls left running (abandon), each bounded by a second. It is
// idempotent.
func (s *RedisStore) Close() error {
	err := s.n.close()
	s.cleanups.close()
	return err
}
