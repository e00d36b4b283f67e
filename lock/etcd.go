package lock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/internal/etcdkv"
	"github.com/fenced/fenced/internal/groupcommit"
	"github.com/fenced/fenced/sequencer"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore keeps leases in etcd, the zero-dependency default. A lock is a
// key created if absent; its token is the revision of the Txn that created
// it (plus the floor offset, recorded beside the key so that the token
// never changes). Steps 2 to 4 of the protocol collapse into that Txn.
// docs/design.md, "etcd leases", explains the design; in short:
//
//   - Keys are attached to a session: one etcd lease per store and TTL
//     class, kept alive by the store, as etcd's concurrency.Session does.
//     No lease is granted or revoked per lock.
//   - Each lock's own deadline is enforced by the store that granted it: a
//     lock not refreshed by its deadline is deleted then (a compare-and-
//     delete), so it frees within its TTL, in milliseconds, while the
//     store's other locks stay alive; if etcd does not answer then, the
//     store tries again until it does. If the store's process dies, its
//     locks free when the session lease expires: within twice the TTL, in
//     whole seconds and at least etcd's minimum lease TTL.
//   - Creates and deletes of different locks share one Txn (group commit),
//     so an acquire plus a release cost at most two Raft writes, and fewer
//     under load. A refresh is a linearizable read, not a write.
//
// Close stops the store's goroutine; it does not revoke the sessions, so
// locks held by remote holders (through a fenced server) stay held until
// their session expires, and another node can take them over on refresh.
type EtcdStore struct {
	cli    *clientv3.Client
	kv     clientv3.KV // cli's, sending a request refused for want of a leader on (etcdkv)
	ks     sequencer.Keyspace
	issuer *sequencer.Issuer
	log    *slog.Logger

	gc     groupcommit.Committer[etcdOp] // creates and deletes
	checks groupcommit.Committer[string] // refreshes' reads of their lock keys

	unfollow func() // stops the issuer's watch of the counter key

	mu       sync.Mutex
	sessions map[int64]*session      // by TTL in seconds
	retired  map[*session]bool       // sessions a later one of their class replaced, renewed while in use
	granting map[int64]chan struct{} // closed when a grant of that class ends
	held     map[string]*holding     // locks this store granted or took over
	released map[string]tombstone    // lease ids released here, for a retried release
	places   map[placeKey]place      // fair waiters' places
	slots    map[string]map[int]bool // queue slots in use, by lock name (see place)
	orphans  map[slotKey]bool        // queue keys to delete off the callers' path (see orphanLocked)
	orphanAt map[slotKey]int64       // their create revisions, where known (see deletePlaces)
	joining  map[slotKey]int         // joins in a Txn in flight, by slot (see joinsSent)
	cleanAt  time.Time               // when to try deleting orphans again
	cleanGap time.Duration           // the wait after the next failure to delete them
	cleaning bool                    // a deleteOrphans runs
	instance string                  // names this store's queue slots
	events   eventHeap               // deadlines and tombstone expiries
	loop     bool                    // the store's goroutine runs
	closed   bool
	wake     chan struct{} // the next event moved earlier
	stop     chan struct{}
	// life bounds the store's own calls to etcd (renewals, deletes it
	// retries, orphans) and its group commits' batches (gc and checks'
	// Life): Close ends it, so that it does not wait them out while etcd
	// hangs.
	life    context.Context
	endLife context.CancelCauseFunc
	wg      sync.WaitGroup // the goroutine and the work it started

	// abandons are the attempts to abandon (abandon), by lease id, with
	// their locks' names; abandoners the goroutines abandoning them, at
	// most maxAbandonsRetrying. Under mu.
	abandons   map[string]string
	abandoners int
	// marking is held (sent to) while an abandoned mark's lease is looked
	// up or granted (markLease); markID and markSent, under it, are the
	// lease marks go on now and when its grant was sent.
	marking  chan struct{}
	markID   clientv3.LeaseID
	markSent time.Time

	txns, ops, sessionGrants, reads atomic.Uint64
	inflight, maxInflight           atomic.Int64 // batches being committed
	// maxOps bounds the operations of the store's other Txns whose size
	// grows with their input (inTxns): the batch bound, lowered when etcd
	// refuses one as too large.
	maxOps atomic.Int64
}

var _ LeaseStore = (*EtcdStore)(nil)

// session is an etcd lease that locks of one TTL class are attached to.
type session struct {
	id      clientv3.LeaseID
	granted time.Duration // the lease's TTL as etcd granted it

	// Under the store's mu:
	validUntil time.Time // when the lease expires at the earliest: the send time of the last renewal that succeeded, plus granted
	nextRenew  time.Time
	renewing   bool
	dead       bool
	users      int // holdings and waiters' places attached: the store renews the session while any are
}

// holding is a lock this store granted (or took over), whose deadline it
// enforces.
type holding struct {
	id       string
	token    fence.Token
	modRev   int64 // the lock key's mod revision as this store last wrote it
	sess     *session
	deadline time.Time // of the last acquire or refresh
	gen      uint64    // bumped when deadline moves: older heap entries are stale

	refreshing int  // refreshes in flight: the deadline is not enforced meanwhile
	expiring   bool // the enforcer is deleting it
	plain      bool // taken with no reentrant holder: it never has a count
	// unsure is a take-over whose reply was lost: modRev is not known,
	// and the deadline deletes the lock if it is on sess (the move
	// committed) or, at prevModRev, still as this store wrote it before.
	unsure     bool
	prevModRev int64
	// holds is the reentrancy count as this store last set it. Above 1, a
	// refresh never moves the deadline earlier: the other holds' validity
	// runs to it (defect 19).
	holds int
	// seq is the highest refresh sequence number this store took for it:
	// a refresh numbered lower arrived late and is not applied (defect
	// 102).
	seq uint64
	// handed: another request of its acquisition was handed it here
	// (handOver): ReleaseUnhanded leaves it.
	handed bool
}

type tombstone struct {
	id    string
	token fence.Token
	until time.Time
}

// etcdOp is one request to the group commit: create or delete a lock.
// Its result is booked by the commit itself, so that a create whose caller
// left still has its deadline enforced.
type etcdOp struct {
	kind     int
	name     string
	id       string
	sess     *session      // create: the session to attach to
	start    time.Time     // create: when the acquisition began here
	ttl      time.Duration // create
	owner    string        // create
	holder   string        // create: reentrant holder
	waiter   string        // create: fair waiter
	rejoinAs string        // create: the id the grant records (AcquireRequest.Rejoin), or ""
	// create: the waiter's queue key (see place), and its slot.
	waiterKey  string
	waiterSlot int
	// create: the waiter's place, the create revision of its queue key; 0
	// when it has none yet, and then waiterSess is the session to join on.
	waiterRev  int64
	waiterSess *session
	// create: the waiter has its place (waiterKey, waiterRev), and joins
	// the queue with it if it has not yet and the lock is taken. An
	// attempt without one asks whether the lock is free and nothing more.
	placed bool
	modRev int64 // expire: only the lock as this store wrote it
	// expire: instead of modRev, only the lock on this etcd lease (a
	// take-over whose reply was lost)
	lease clientv3.LeaseID
	plain bool // delete, expire: the lock has no reentrant holder (holding.plain)
}

const (
	opCreate = iota
	opDelete
	opExpire
)

// createResult is what a create learnt.
type createResult struct {
	token   fence.Token
	modRev  int64
	granted time.Duration
}

// heldResult is what a create that did not take the lock learnt.
type heldResult struct {
	joinedRev  int64    // the waiter's place, if it joined the queue now
	joinedSess *session // the session it joined on
	placeLost  bool     // the waiter's place is gone (its session expired)
	position   int      // the waiter's place in the queue, 1 at the head; 0 unknown
	cur        sequencer.LockState
	curHeld    bool // cur was read (a holder's attempt)
}

// countResult is what a release of a reentrant lock learnt: it counts
// down rather than deletes.
type countResult struct {
	count int
	lease clientv3.LeaseID
	rev   int64    // the count key's mod revision
	ops   []string // the releases that counted it down last
}

func countOf(lk sequencer.LockState) countResult {
	return countResult{count: lk.Count, lease: lk.Lease, rev: lk.CountRev, ops: lk.Ops}
}

var errHeld = errors.New("lock: held")

// errUndeleted marks a create that took its lock with a token etcd's going
// back made too low (sequencer.ErrRestored) and whose lock could not be
// deleted again (answer).
var errUndeleted = errors.New("lock: a lock taken with a token too low was not deleted again")

// EtcdOption configures an EtcdStore.
type EtcdOption func(*etcdConfig) error

type etcdConfig struct {
	prefix   string
	log      *slog.Logger
	maxBatch int
	inflight int
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

// WithEtcdLogger sets where the store warns about etcd: a session lost, or
// etcd's revision going back (see sequencer.Issuer). Default
// slog.Default().
func WithEtcdLogger(l *slog.Logger) EtcdOption {
	return func(c *etcdConfig) error {
		if l == nil {
			return errors.New("lock: nil logger")
		}
		c.log = l
		return nil
	}
}

// WithEtcdMaxBatch bounds how many creates and deletes share one Txn, and
// how many operations the store's other Txns whose size grows with their
// input carry (the deletes of orphaned queue places, List's reads of the
// queues). Default 120, for etcd's default --max-txn-ops of 128 (each
// lock's nested Txn counts against the limit with the batch around it).
// Allowed 1 to 10000. A Txn the server refuses as too large is split in
// halves and the bound halved, so no caller fails because of batching.
func WithEtcdMaxBatch(n int) EtcdOption {
	return func(c *etcdConfig) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("lock: etcd max batch %d: want 1 to 10000", n)
		}
		c.maxBatch = n
		return nil
	}
}

// WithEtcdInflight sets how many Txns of creates and deletes may be in
// flight at once. Default 2: while one is in etcd's fsync or apply, the next
// batch is already on its way, which took 64 clients from about 5,500 to
// 7,000-11,000 acquire+release pairs a second here (bench/README.md). Every
// operation of a batch is a compare-and-swap of its own lock, so batches
// in flight together are ordered by etcd like any two clients' Txns, and a
// token is still the revision of the Txn that took the lock. Allowed 1
// to 64.
func WithEtcdInflight(n int) EtcdOption {
	return func(c *etcdConfig) error {
		if n < 1 || n > 64 {
			return fmt.Errorf("lock: etcd Txns in flight %d: want 1 to 64", n)
		}
		c.inflight = n
		return nil
	}
}

// NewEtcdStore returns a store on cli. On a cluster with no token floor the
// store sets one at its first acquisition (see sequencer.Issuer). Close
// stops the store's goroutine; it does not close cli.
func NewEtcdStore(cli *clientv3.Client, opts ...EtcdOption) (*EtcdStore, error) {
	if cli == nil {
		return nil, errors.New("lock: nil etcd client")
	}
	c := etcdConfig{prefix: sequencer.DefaultPrefix, log: slog.Default(), maxBatch: 120, inflight: 2}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	ks := sequencer.NewKeyspace(c.prefix)
	instance, err := newLeaseID()
	if err != nil {
		return nil, err
	}
	s := &EtcdStore{
		cli: cli, kv: etcdkv.New(cli), ks: ks, issuer: sequencer.NewIssuer(cli, ks, c.log), log: c.log,
		sessions: map[int64]*session{}, retired: map[*session]bool{}, granting: map[int64]chan struct{}{}, held: map[string]*holding{}, released: map[string]tombstone{}, places: map[placeKey]place{},
		slots: map[string]map[int]bool{}, orphans: map[slotKey]bool{}, orphanAt: map[slotKey]int64{}, joining: map[slotKey]int{}, instance: instance,
		abandons: map[string]string{}, marking: make(chan struct{}, 1),
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	s.life, s.endLife = context.WithCancelCause(context.Background())
	s.gc.Commit, s.gc.Slots, s.gc.Inline, s.gc.Stall, s.gc.Life = s.commitCounted, c.inflight, true, etcdkv.Stall, s.life
	s.gc.SetMaxBatch(c.maxBatch)
	s.checks.Commit, s.checks.Inline, s.checks.Stall, s.checks.Life = s.check, true, etcdkv.Stall, s.life
	s.checks.SetMaxBatch(c.maxBatch)
	s.maxOps.Store(int64(c.maxBatch))
	s.unfollow = s.issuer.Follow()
	return s, nil
}

// EtcdStats counts what an EtcdStore sent to etcd.
type EtcdStats struct {
	Txns          uint64 // write Txns committed (each one Raft write)
	Ops           uint64 // creates and deletes they carried
	SessionGrants uint64 // session leases granted (each one Raft write)
	Reads         uint64 // read-only Txns: refreshed locks checked, waiters behind the head answered (no Raft write)
	MaxInflight   int    // the most write Txns of creates and deletes that were in flight at once
}

// Stats returns counters since NewEtcdStore.
func (s *EtcdStore) Stats() EtcdStats {
	return EtcdStats{Txns: s.txns.Load(), Ops: s.ops.Load(), SessionGrants: s.sessionGrants.Load(), Reads: s.reads.Load(),
		MaxInflight: int(s.maxInflight.Load())}
}

// Close stops the store's goroutine and waits for the work it started,
// which it cuts short: a delete the store was retrying is left to the
// session lease, and a batch of creates and deletes still being committed
// (one whose callers left) ends with Close, not after it. Locks still
// held stay in etcd until their session lease expires. Later acquisitions
// and releases fail with ErrClosed. Close is idempotent.
func (s *EtcdStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.endLife(ErrClosed)
	s.mu.Unlock()
	s.unfollow()
	// The group commits' batches commit on contexts derived from life:
	// they end now, and no runner outlives Close (defect 170).
	s.gc.Close()
	s.checks.Close()
	s.wg.Wait()
	return nil
}

type placeKey struct{ name, waiter string }

type slotKey struct {
	name string
	slot int
}

// place is a fair waiter's place in a lock's queue: a queue key named by
// one of this store's slots for that lock, reused by later waiters once
// its waiter is done, and the key's create revision once it joined (0
// before). A key per waiter would leave a deleted key behind for every
// wait, and etcd's index keeps deleted keys until history is compacted (a
// minute with fenced's embedded etcd, an hour when this was found): every
// compare and count over the queue visits them, so a hot lock slowed by the
// hour (docs/design.md, defect 10). A key re-created under the same name
// adds no new key to the index.
//
// A joined place is a user of the session its key is on, so that the store
// renews that session for as long as the waiter waits, even with no lock
// held on it (defect 12).
type place struct {
	slot   int
	rev    int64
	sess   *session // the session its key is on, once joined
	behind bool     // its last attempt found a waiter ahead of it (see pollBehind)
}

// placeLocked is the waiter's place, reserving a slot if it has none.
// Called with mu.
func (s *EtcdStore) placeLocked(pk placeKey) place {
	if p, ok := s.places[pk]; ok {
		return p
	}
	used := s.slots[pk.name]
	if used == nil {
		used = map[int]bool{}
		s.slots[pk.name] = used
	}
	k := 0
	for used[k] {
		k++
	}
	used[k] = true
	p := place{slot: k}
	s.places[pk] = p
	return p
}

// joinedLocked records the place a waiter's attempt joined the queue at,
// on sess. Called with mu.
func (s *EtcdStore) joinedLocked(pk placeKey, rev int64, sess *session) {
	p, ok := s.places[pk]
	if !ok {
		return
	}
	if p.sess != nil {
		p.sess.users--
	}
	p.rev, p.sess = rev, sess
	s.places[pk] = p
	if sess.users++; sess.users == 1 {
		s.poke() // its first user: the store's goroutine renews it from now on
	}
}

// forgetLocked forgets the waiter's place and returns it; its slot stays
// reserved. Called with mu.
func (s *EtcdStore) forgetLocked(pk placeKey) (place, bool) {
	p, ok := s.places[pk]
	if !ok {
		return place{}, false
	}
	delete(s.places, pk)
	if p.sess != nil {
		p.sess.users--
	}
	return p, true
}

// freeSlotLocked frees a slot for later waiters. Called with mu.
func (s *EtcdStore) freeSlotLocked(name string, slot int) {
	delete(s.slots[name], slot)
	if len(s.slots[name]) == 0 {
		delete(s.slots, name)
	}
}

// unplaceLocked forgets the waiter's place, whose key is gone, and frees
// its slot. Called with mu.
func (s *EtcdStore) unplaceLocked(pk placeKey) {
	if p, ok := s.forgetLocked(pk); ok {
		s.freeSlotLocked(pk.name, p.slot)
	}
}

// orphanLocked forgets the waiter's place, whose key may still be in etcd
// (a Leave whose delete failed, a join whose reply was lost), and has the
// store's goroutine delete the key, trying again until it succeeds or the
// store closes, and not before a join of that place still in flight has
// ended (joinsSent). Until then the slot stays reserved, so no later
// waiter's key is deleted in its stead. Left alone, the key would stand ahead of
// every fair waiter of the lock, in every process, for as long as this
// store's session lives (defect 12). The key is deleted only at the
// place's create revision (deletePlaces), known here if it joined.
// Called with mu.
func (s *EtcdStore) orphanLocked(pk placeKey) {
	p, ok := s.forgetLocked(pk)
	if !ok {
		return
	}
	k := slotKey{pk.name, p.slot}
	s.orphans[k] = true
	if p.rev != 0 {
		s.orphanAt[k] = p.rev
	}
	s.startLoopLocked()
	s.poke()
}

// deleteOrphans deletes orphaned queue keys, in Txns within the store's
// bound (deletePlaces); after a failure the store tries again later, the
// wait doubling up to 5 s, so an etcd outage costs one failing call per
// wait, not one per orphan.
func (s *EtcdStore) deleteOrphans(keys []slotKey) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
	defer cancel()
	revs := make([]int64, len(keys))
	s.mu.Lock()
	for i, k := range keys {
		revs[i] = s.orphanAt[k]
	}
	s.mu.Unlock()
	err := s.deletePlaces(clientv3.WithRequireLeader(ctx), keys, revs, func(done []slotKey) {
		s.mu.Lock()
		for _, k := range done {
			delete(s.orphans, k)
			delete(s.orphanAt, k)
			s.freeSlotLocked(k.name, k.slot)
		}
		s.mu.Unlock()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleaning = false
	if err == nil {
		s.cleanGap = 0
		if len(s.orphans) > 0 {
			// Orphaned while this ran: their pokes found it running, and
			// an idle store has nothing else to wake it.
			s.poke()
		}
		return
	}
	s.cleanGap = min(max(2*s.cleanGap, 100*time.Millisecond), 5*time.Second)
	s.cleanAt = time.Now().Add(s.cleanGap)
	s.poke()
}

// deletePlaces deletes the queue keys of places, each only at its create
// revision (revs, 0 where not known: read first), and calls done with
// those dealt with, Txn by Txn, each within the store's bound (inTxns).
//
// A slot's key is reused by the store's next waiter on the lock once the
// slot is freed, and a delete whose answer the store never got may still
// be on its way (a member whose link to the leader holds the forwarded
// proposal, as in defect 147) and commit after the key was made again: an
// unconditional delete then removed the next waiter's place, and the lock
// went to a waiter that came after it (defect 168). Conditional on the
// create revision, a late delete finds another key and deletes nothing.
// A revision read is the key's at the read; an orphan's slot stays
// reserved, and its joins have ended (joinsSent), so no other place can
// be at that key meanwhile. A key found absent is done with.
func (s *EtcdStore) deletePlaces(ctx context.Context, keys []slotKey, revs []int64, done func([]slotKey)) error {
	var unknown []int
	for i, rev := range revs {
		if rev == 0 {
			unknown = append(unknown, i)
		}
	}
	err := s.inTxns(len(unknown), 1, func(from, to int) error {
		ops := make([]clientv3.Op, 0, to-from)
		for _, i := range unknown[from:to] {
			ops = append(ops, clientv3.OpGet(s.queueKey(keys[i].name, keys[i].slot), clientv3.WithKeysOnly()))
		}
		resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		for j, i := range unknown[from:to] {
			revs[i] = -1 // absent: nothing to delete
			if kvs := resp.Responses[j].GetResponseRange().GetKvs(); len(kvs) == 1 {
				revs[i] = kvs[0].CreateRevision
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A nested Txn per key (a compare and a delete): two operations each.
	return s.inTxns(len(keys), 2, func(from, to int) error {
		ops := make([]clientv3.Op, 0, to-from)
		for i := from; i < to; i++ {
			if revs[i] > 0 {
				key := s.queueKey(keys[i].name, keys[i].slot)
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", revs[i])},
					[]clientv3.Op{clientv3.OpDelete(key)}, nil))
			}
		}
		if len(ops) > 0 {
			if _, err := s.kv.Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
		}
		done(keys[from:to])
		return nil
	})
}

// inTxns commits n items of per operations each in Txns of at most the
// store's bound on operations (maxOps, from WithEtcdMaxBatch): etcd refuses
// a larger Txn every time (its --max-txn-ops), so a fixed size above it
// failed for ever. txn commits items [from, to) as one Txn. A Txn etcd
// refuses as too large even so is sent again in halves, and the bound
// halved, as commit does with batches.
func (s *EtcdStore) inTxns(n, per int, txn func(from, to int) error) error {
	for from := 0; from < n; {
		to := min(n, from+max(1, int(s.maxOps.Load())/per))
		err := txn(from, to)
		if errors.Is(err, rpctypes.ErrTooManyOps) && to-from > 1 {
			half := int64((to - from) / 2 * per)
			for m := s.maxOps.Load(); half < m && !s.maxOps.CompareAndSwap(m, half); m = s.maxOps.Load() {
			}
			s.log.Info("etcd refused a Txn as too large; the store's Txns halved", "operations", (to-from)*per, "max_ops", s.maxOps.Load(),
				"hint", "etcd's --max-txn-ops is below fenced's batch bound; raise it or lower the bound (WithEtcdMaxBatch)")
			continue
		}
		if err != nil {
			return err
		}
		from = to
	}
	return nil
}

// queueKey is the key of a place.
func (s *EtcdStore) queueKey(name string, slot int) string {
	return s.ks.QueueKey(name, s.instance+"-"+strconv.Itoa(slot))
}

// Acquire implements LeaseStore. The TTL is honoured to the millisecond:
// the store deletes the lock at its deadline unless refreshed. The
// granted TTL is shorter only when the session lease is not known to live
// that long (renewals failing). A fair waiter's place is a key on a
// session of this store, ordered by its create revision; the lock goes to
// the oldest.
func (s *EtcdStore) Acquire(ctx context.Context, req AcquireRequest) (Grant, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	start := time.Now()
	pk := placeKey{req.Name, req.Waiter}
	var (
		op  etcdOp
		v   any
		err error
	)
	if pos, err := s.pollBehind(ctx, req, pk); err != nil || pos > 0 {
		if err != nil {
			return Grant{}, err
		}
		return Grant{}, &HeldError{Remaining: s.remaining(req.Name), Position: pos}
	}
	for range 3 {
		var sess *session
		if sess, err = s.sessionFor(ctx, req.TTL, start); err != nil {
			return Grant{}, err
		}
		op = s.createOp(req, sess, start)
		v, err = s.gc.Do(ctx, req.Name, op)
		if errors.Is(err, errHeld) && op.waiter != "" && !op.placed {
			// Taken after all: ask again at once, joining the queue this
			// time (or taking the lock, if it was freed meanwhile), before
			// the caller waits, so that it waits in its arrival order.
			s.joinOp(&op)
			v, err = s.gc.Do(ctx, req.Name, op)
		}
		if !errors.Is(err, sequencer.ErrRestored) || errors.Is(err, errUndeleted) {
			break
		}
		// etcd went back: the create took the lock with a token not above
		// one issued before, and was deleted again (answer), queue place
		// and all; the issuer raised the floor. Ask again, as the
		// sequencer does: the lock is free, and a caller told anything
		// else, ErrLost, reported it held (a TryAcquire: "held by another
		// holder"; docs/design.md, defect 231).
		if req.Waiter != "" {
			s.mu.Lock()
			s.unplaceLocked(pk)
			s.mu.Unlock()
		}
	}
	switch {
	case errors.Is(err, errHeld):
		hr, _ := v.(heldResult)
		if req.Waiter != "" {
			s.mu.Lock()
			if hr.joinedRev > 0 {
				s.joinedLocked(pk, hr.joinedRev, hr.joinedSess)
			}
			if hr.placeLost {
				s.unplaceLocked(pk)
			} else if p, ok := s.places[pk]; ok && hr.position > 0 {
				p.behind = hr.position > 1
				s.places[pk] = p
			}
			s.mu.Unlock()
		}
		if op.rejoinAs != "" && hr.curHeld && hr.cur.Waiter == op.rejoinAs {
			// Granted to this acquisition already, the answer lost on its way
			// to the caller: the same lease again, its count unchanged.
			if err := s.handOver(ctx, req.Name, hr.cur.LeaseID); err != nil {
				return Grant{}, err
			}
			g, err := s.Refresh(ctx, req.Name, hr.cur.LeaseID, req.TTL, 0)
			if err != nil {
				// A place this attempt joined stays (see leaveJoined): a
				// waiter that rejoins keeps it across calls, and the lock
				// client gives it up when no call used it for the waiter
				// TTL.
				return Grant{}, err
			}
			_ = s.Leave(ctx, req.Name, req.Waiter) // a place this attempt joined
			return Grant{Token: hr.cur.Token, TTL: g.TTL, LeaseID: hr.cur.LeaseID, Count: hr.cur.Count}, nil
		}
		if req.Holder != "" && hr.curHeld && hr.cur.Holder == req.Holder {
			g, err := s.reenter(ctx, req, hr.cur)
			var held *HeldError
			switch {
			case err == nil && req.Waiter != "":
				// The attempt joined the queue before it knew it held the
				// lock: leave, or the place would stand ahead of every later
				// waiter for as long as this store's session lives.
				_ = s.Leave(ctx, req.Name, req.Waiter)
			case err != nil && !errors.As(err, &held):
				s.leaveJoined(ctx, req, hr)
			}
			return g, err
		}
		return Grant{}, &HeldError{Remaining: s.remaining(req.Name), Position: hr.position}
	case errors.Is(err, errUndeleted):
		// The delete of a create etcd's going back made too low failed,
		// and the store books no such lock, so nothing else would delete
		// it: on a session its other locks keep alive, it would be held by
		// nobody until the process ends (docs/design.md, defect 185).
		// Abandoned, it is deleted until etcd answers; the caller hears
		// that etcd failed, not that the lock is held.
		s.abandon(req.Name, req.LeaseID)
		return Grant{}, backendErr("etcd", "acquire", err)
	case errors.Is(err, sequencer.ErrRestored):
		// Too low three times in a row, each deleted again: etcd keeps
		// going back, or something keeps lowering what it hands out.
		return Grant{}, backendErr("etcd", "acquire", err)
	case err != nil && etcdkv.Refused(err):
		// Refused for want of a leader by every member it went to: nothing
		// of it ran, neither the create nor a join, so there is nothing to
		// abandon, and the place stays for the waiter's next attempt. In
		// an election or a lost quorum a waiter attempts every backoff,
		// and an abandon each was a goroutine, an etcd lease and a mark
		// per attempt (docs/design.md, defect 212).
		return Grant{}, backendErr("etcd", "acquire", err)
	case err != nil:
		// The create may yet commit: free it rather than wait for its
		// deadline.
		s.abandon(req.Name, req.LeaseID)
		if req.Waiter != "" {
			s.mu.Lock()
			if s.places[pk].rev == 0 {
				// No place known, though the attempt may have joined (a
				// reply lost): the caller ends here without leaving.
				s.orphanLocked(pk)
			}
			s.mu.Unlock()
		}
		return Grant{}, backendErr("etcd", "acquire", err)
	}
	if req.Waiter != "" {
		s.mu.Lock()
		s.unplaceLocked(pk) // the create deleted its queue key
		s.mu.Unlock()
	}
	cr := v.(createResult)
	return Grant{Token: cr.token, TTL: cr.granted, LeaseID: req.LeaseID, Count: 1}, nil
}

// pollBehind answers the attempt of a fair waiter that was behind the head
// of the queue at its last attempt by a read (a read-only Txn: a
// linearizable read, no Raft write) for as long as it still is, or the lock
// is held: its position, or 0 when the attempt must go as a create (it may
// take the lock, its place is gone, or it is a holder's or a rejoin's,
// which read the lock's holder). A waiter behind the head attempts once a
// second, and only to learn its place (its key lives on a session the store
// renews): as creates, 256 waiters on one lock were 256 Raft writes a second
// (docs/design.md, "Waiting"). The head's attempts stay creates: it is the
// one that takes the lock when it is freed, and a read first would delay
// each handover by a round trip. Nothing of the read changes etcd, so an
// error is only reported: nothing to abandon, the place stays.
func (s *EtcdStore) pollBehind(ctx context.Context, req AcquireRequest, pk placeKey) (int, error) {
	if req.Waiter == "" || req.Holder != "" || req.Rejoin != "" {
		return 0, nil
	}
	s.mu.Lock()
	p, ok := s.places[pk]
	closed := s.closed
	s.mu.Unlock()
	if closed {
		// The create's way says so (sessionFor); the read would not: etcd
		// answers a closed store (docs/design.md, defect 259).
		return 0, ErrClosed
	}
	if !ok || p.rev == 0 || !p.behind {
		return 0, nil
	}
	key := s.queueKey(req.Name, p.slot)
	resp, err := s.kv.Txn(ctx).If(s.ks.LockFree(req.Name), s.ks.QueueHeadIs(req.Name, p.rev)).
		Else(clientv3.OpGet(key, clientv3.WithCountOnly()),
			clientv3.OpGet(s.ks.QueuePrefix(req.Name), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(p.rev))).
		Commit()
	if err != nil {
		return 0, backendErr("etcd", "acquire", err)
	}
	s.reads.Add(1)
	if resp.Succeeded || resp.Responses[0].GetResponseRange().GetCount() == 0 {
		return 0, nil
	}
	pos := len(resp.Responses[1].GetResponseRange().GetKvs())
	s.mu.Lock()
	if q, ok := s.places[pk]; ok && q.rev == p.rev {
		q.behind = pos > 1
		s.places[pk] = q
	}
	s.mu.Unlock()
	return pos, nil
}

// leaveJoined gives up the place that a fair attempt joined the queue at
// (hr), when the attempt ends with neither the lock nor a held answer (a
// reentry whose count failed): its caller, told of no wait, has no reason
// to leave (the lock client leaves only after a held answer), and a place
// on etcd lasts as long as its store's session, ahead of every later fair
// waiter of the lock, in every process (defect 12). A place an earlier
// attempt joined is the caller's, who got that attempt's held answer; and
// a waiter that rejoins (Rejoin) keeps its place across calls, given up
// by the lock client when no call used it for the waiter TTL. The delete
// does not depend on ctx, which may be what ended, and waits at most 1 s:
// if etcd does not answer, the store's goroutine deletes the key later.
func (s *EtcdStore) leaveJoined(ctx context.Context, req AcquireRequest, hr heldResult) {
	if req.Waiter == "" || req.Rejoin != "" || hr.joinedRev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = s.Leave(ctx, req.Name, req.Waiter)
}

// createOp is an attempt's create; a fair waiter's has its place in the
// queue, if it has one or joins now.
func (s *EtcdStore) createOp(req AcquireRequest, sess *session, start time.Time) etcdOp {
	op := etcdOp{kind: opCreate, name: req.Name, id: req.LeaseID, sess: sess, start: start, ttl: req.TTL,
		owner: req.Owner, holder: req.Holder, waiter: req.Waiter, rejoinAs: req.Rejoin}
	if req.Waiter == "" {
		return op
	}
	pk := placeKey{req.Name, req.Waiter}
	s.mu.Lock()
	_, has := s.places[pk]
	// A first attempt joins the queue in its Txn's Else only where the lock
	// is likely taken: this store holds it, or has other waiters on it.
	// Elsewhere the Else's three operations (the join and two reads) went
	// with every create, run or not, in the request, the Raft entry and
	// etcd's apply: 10% of the throughput of uncontended locks
	// (docs/design.md, "Joining the queue"). Such an attempt reserves no
	// place either.
	join := has || s.held[req.Name] != nil || len(s.slots[req.Name]) > 0
	s.mu.Unlock()
	if join {
		s.joinOp(&op)
	}
	return op
}

// joinOp gives a fair waiter's create its place, reserved now if it has
// none: it joins the queue if the lock is taken.
func (s *EtcdStore) joinOp(op *etcdOp) {
	s.mu.Lock()
	p := s.placeLocked(placeKey{op.name, op.waiter})
	s.mu.Unlock()
	op.placed, op.waiterRev, op.waiterKey, op.waiterSlot = true, p.rev, s.queueKey(op.name, p.slot), p.slot
	// The place rides on the session the lock would: it goes when the
	// waiter leaves, or with its process.
	op.waiterSess = op.sess
}

// reenter counts one more hold of a lock its holder holds, under the lease
// id it holds it by, and extends it to the new TTL. It extends first, and
// never to an earlier deadline (the holds before keep their validity), and
// counts last: a refresh that failed after the count went up left a hold
// nobody knew of, and the lock held after its holder's last release
// (defect 19).
func (s *EtcdStore) reenter(ctx context.Context, req AcquireRequest, cur sequencer.LockState) (Grant, error) {
	g, err := s.refresh(ctx, req.Name, cur.LeaseID, req.TTL, 0, true)
	if err != nil {
		return Grant{}, err
	}
	if reenterStepHook != nil {
		reenterStepHook()
	}
	// The count as read may have changed since: another reentry or
	// release, or the refresh itself, when it moved the lock onto another
	// session (a TTL of another class, or another store's), which rewrites
	// the count key on the lock's new etcd lease. Read it again and count
	// on what is there, as a release does.
	//
	// An acquisition's id (WithWaiter's, or its place's) marks its hold in
	// the count's record, so that a request sent again after a lost answer
	// (a new attempt, with the same id) finds it counted (defect 42); an
	// attempt without one marks it with its own lease id, as on Redis leases. The mark is what
	// a failed attempt takes off again (unreenter).
	op := req.mark()
	for range 8 {
		ops := cur.Ops
		n := cur.Count + 1
		if op != "" {
			switch {
			case !slices.Contains(cur.Ops, op):
				ops = append(slices.Clip(ops), op)
			case req.Rejoin == "" || slices.Contains(cur.Ops, handedMark(op)):
				return Grant{Token: cur.Token, TTL: g.TTL, LeaseID: cur.LeaseID, Count: cur.Count}, nil
			default:
				// Counted by another request of this remote acquisition
				// (etcd's client sends no attempt twice): handed to this
				// one, which the request that counted it, its client
				// gone, may then no longer take off (UnreenterUnhanded,
				// defect 183).
				n, ops = cur.Count, append(slices.Clip(ops), handedMark(op))
			}
		}
		resp, err := s.kv.Txn(ctx).If(append(s.ks.LockHeldBy(req.Name, cur.LeaseID), s.ks.CountAt(req.Name, cur.CountRev))...).
			Then(s.ks.PutCount(req.Name, n, ops, cur.Lease)).Else(s.ks.GetLock(req.Name)...).Commit()
		if err != nil && n == cur.Count {
			// Only the mark: if it did not commit, a copy may still take
			// the hold off, as before the mark.
			return Grant{}, backendErr("etcd", "acquire", err)
		}
		if err != nil {
			// The count may have committed, its reply lost: nobody gets
			// that hold, so take it off before the caller can try again.
			s.unreenter(ctx, req.Name, cur.LeaseID, op)
			return Grant{}, backendErr("etcd", "acquire", err)
		}
		s.txns.Add(1)
		if resp.Succeeded {
			s.setHolds(req.Name, cur.LeaseID, n)
			return Grant{Token: cur.Token, TTL: g.TTL, LeaseID: cur.LeaseID, Count: n}, nil
		}
		st, held, err := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
		if err != nil {
			return Grant{}, backendErr("etcd", "acquire", err)
		}
		if !held || st.LeaseID != cur.LeaseID {
			return Grant{}, &HeldError{} // released meanwhile: the client tries again
		}
		cur = st
	}
	return Grant{}, backendErr("etcd", "acquire", errors.New("the reentrancy count kept changing"))
}

// reenterStepHook, if set (by tests), runs in reenter between its two
// steps.
var reenterStepHook func()

// unreenter takes off the hold that a reentry's count Txn may have counted
// under op (reenter's mark: "w" and its waiter, or its attempt's lease id)
// when the Txn failed, its reply perhaps lost: nobody got that hold, and
// without this the holder's last release left the lock held, by nobody,
// until its deadline. The mark goes with the hold, so that an attempt with
// the same waiter counts its hold anew. The last hold is its holder's (a
// reentry always counts a second one). It runs before the failed acquire
// returns, so that no retry by the caller finds the mark first, and gives
// up after 1 s: a hold it could not take off stays until the lock's
// deadline, and a retry with the same waiter gets it.
func (s *EtcdStore) unreenter(ctx context.Context, name, leaseID, op string) {
	if op == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var (
		resp *clientv3.TxnResponse
		err  error
	)
	for tries := 0; tries < 8; {
		if resp == nil {
			// Read it (again). The connection the reentry's reply was lost
			// with may not be back yet, and etcd's client does not resend
			// a Txn: ask until the budget ends, not once.
			if resp, err = s.kv.Txn(ctx).Then(s.ks.GetLock(name)...).Commit(); err != nil {
				resp = nil
				if !clock.Sleep(ctx, 10*time.Millisecond) {
					return
				}
				continue
			}
		}
		tries++
		s.txns.Add(1)
		st, held, perr := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
		if perr != nil || !held || st.LeaseID != leaseID {
			return // released: a count still on its way fails its compare on the lock
		}
		i := slices.Index(st.Ops, op)
		n, ops := st.Count, st.Ops
		switch {
		case i >= 0 && slices.Contains(st.Ops, handedMark(op)):
			// A copy of the request was handed the hold (reenter): its
			// caller has it; taking it off left the holder one release
			// short (defect 214). As on Redis leases.
			return
		case i >= 0 && st.Count > 1:
			n, ops = st.Count-1, slices.Delete(slices.Clone(st.Ops), i, i+1)
		case i >= 0:
			return // the holder's own hold: never a reentry's
		}
		// Counted: take it off. Not counted (i < 0): the count Txn may still
		// be on its way to etcd (its connection was cut after the request
		// left, and etcd applies what it got), so write the count again as
		// it is: that moves its revision, and the late Txn's compare on it
		// fails.
		resp, err = s.kv.Txn(ctx).If(append(s.ks.LockHeldBy(name, leaseID), s.ks.CountAt(name, st.CountRev))...).
			Then(s.ks.PutCount(name, n, ops, st.Lease)).Else(s.ks.GetLock(name)...).Commit()
		if err == nil && resp.Succeeded {
			s.txns.Add(1)
			if i >= 0 {
				s.setHolds(name, leaseID, n)
			}
			return
		}
		if err != nil {
			// It may have committed: the next read says (the mark goes
			// with the hold).
			resp = nil
		}
	}
}

// handedMark is the mark, in a count's record, of a reentry counted
// under op and since handed to another request of its acquisition
// (reenter): as on Redis leases, "h" and op.
func handedMark(op string) string { return "h" + op }

// UnreenterUnhanded implements UnhandedUnreenterer: unreenter's count
// down, on condition that leaseID still holds the lock, that the count
// holds the reentry's mark, "w" and waiter, and that no copy of the
// request marked it handed since (reenter).
func (s *EtcdStore) UnreenterUnhanded(ctx context.Context, name, leaseID, waiter string) (bool, error) {
	op := "w" + waiter
	resp, err := s.kv.Txn(ctx).Then(s.ks.GetLock(name)...).Commit()
	for range 8 {
		if err != nil {
			return false, backendErr("etcd", "release", err)
		}
		s.txns.Add(1)
		st, held, perr := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
		if perr != nil {
			return false, backendErr("etcd", "release", perr)
		}
		i := slices.Index(st.Ops, op)
		if !held || st.LeaseID != leaseID || i < 0 || st.Count <= 1 || slices.Contains(st.Ops, handedMark(op)) {
			return false, nil
		}
		ops := slices.Delete(slices.Clone(st.Ops), i, i+1)
		resp, err = s.kv.Txn(ctx).If(append(s.ks.LockHeldBy(name, leaseID), s.ks.CountAt(name, st.CountRev))...).
			Then(s.ks.PutCount(name, st.Count-1, ops, st.Lease)).Else(s.ks.GetLock(name)...).Commit()
		if err == nil && resp.Succeeded {
			s.txns.Add(1)
			s.setHolds(name, leaseID, st.Count-1)
			return true, nil
		}
		// Else another reentry or release came between: the Else read what
		// it left.
	}
	return false, backendErr("etcd", "release", errors.New("the reentrancy count kept changing"))
}

// setHolds books the reentrancy count of this store's holding of name.
func (s *EtcdStore) setHolds(name, leaseID string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[name]; h != nil && h.id == leaseID {
		h.holds = n
		if n == 1 {
			h.seq = 0 // as refresh.lua: the hold left numbers its own
		}
	}
}

// abandon releases a lock whose acquisition failed in a way that may have
// created it, off the caller's path, trying until etcd answers: the store
// knows no deadline for a create whose reply was lost, and the lock would
// otherwise stay, held by nobody, for as long as the store's session lives
// (defect 14). Each try waits up to 5 s.
//
// The create may also be committed after the release found nothing: a
// member whose link to the leader held the forwarded proposal hands it on
// later, while the release went to another member. So the abandon first
// marks the attempt (abandonedKey, on markLease), which every create
// compares, and releases after: a create committed before the mark is
// released, one after it takes nothing (defect 147).
//
// The attempt joins the store's abandons, which at most
// maxAbandonsRetrying goroutines work through, as cleanups bound Redis's
// (defect 212): in an outage every failed attempt is one, and a goroutine
// each grew without bound. Unlike a Redis lease, a lock created here never
// expires by itself, so none is dropped: those past the bound wait their
// turn, as a lease id and a name.
func (s *EtcdStore) abandon(name, leaseID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.abandons[leaseID] = name
	if s.abandoners >= maxAbandonsRetrying {
		return // one of them takes it
	}
	s.abandoners++
	s.wg.Add(1)
	go s.abandonAll()
}

// abandonAll abandons the store's abandons one after another, until none
// is left or the store closes.
func (s *EtcdStore) abandonAll() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		var name, leaseID string
		for leaseID, name = range s.abandons {
			break
		}
		if leaseID == "" || s.closed {
			s.abandoners--
			s.mu.Unlock()
			return
		}
		delete(s.abandons, leaseID)
		s.mu.Unlock()
		marked := false
		s.untilAnswered(5*time.Second, func(ctx context.Context) bool {
			// A member without a leader refuses at once, rather than hold
			// the try for its 5 s.
			ctx = clientv3.WithRequireLeader(ctx)
			if !marked {
				lease, err := s.markLease(ctx)
				if err != nil {
					return false
				}
				_, err = s.kv.Txn(ctx).Then(clientv3.OpPut(s.abandonedKey(leaseID), "", clientv3.WithLease(lease))).Commit()
				if errors.Is(err, rpctypes.ErrLeaseNotFound) {
					s.markLost(lease)
				}
				if err != nil {
					return false
				}
				marked = true
			}
			err := s.Release(ctx, name, leaseID, "")
			return err == nil || errors.Is(err, ErrLost) // released, or it was never created
		})
	}
}

// markReuse is how long after sending a mark lease's grant the store puts
// marks on it. The lease lives abandonedFor longer, so every mark on it
// lasts at least abandonedFor; an etcd lease per mark was a Raft write and
// a lease in etcd's lessor for each, a thousand for a thousand HTTP
// waiters whose clients left mid-attempt (defect 212). Kept short so that
// no mark lasts much longer than abandonedFor either (the fault test's
// check allows 5 s more, internal/chaos).
const markReuse = 2 * time.Second

// markLease is the etcd lease for an abandoned mark put now: the store's
// current one, or a new one if that was sent markReuse ago.
func (s *EtcdStore) markLease(ctx context.Context) (clientv3.LeaseID, error) {
	select {
	case s.marking <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-s.marking }()
	if s.markID != 0 && time.Since(s.markSent) < markReuse {
		return s.markID, nil
	}
	// Sent before the grant: etcd counts the lease's TTL from later.
	sent := time.Now()
	lg, err := s.cli.Grant(ctx, int64((abandonedFor+markReuse)/time.Second))
	if err != nil {
		return 0, err
	}
	s.markID, s.markSent = lg.ID, sent
	return lg.ID, nil
}

// markLost forgets the mark lease etcd no longer knows (a cluster
// restored or replaced), so that the next mark gets a new one.
func (s *EtcdStore) markLost(lease clientv3.LeaseID) {
	s.marking <- struct{}{}
	if s.markID == lease {
		s.markID = 0
	}
	<-s.marking
}

// handOver marks leaseID's grant of name handed to another request of its
// acquisition: a write to its key, which every store's ReleaseUnhanded
// compares (the key's mod revision as the store that made the grant wrote
// it), and on this store the holding's handed, since a refresh here
// writes nothing (defect 153). ErrLost if leaseID no longer holds it.
//
// The write moves the key's mod revision, which the deadline's
// compare-and-delete compares. When its reply is lost, the store cannot
// know that revision: it books the holding unsure (unsureLocked), so that
// the deadline still deletes the lock (defect 167).
func (s *EtcdStore) handOver(ctx context.Context, name, leaseID string) error {
	s.mu.Lock()
	if h := s.held[name]; h != nil && h.id == leaseID {
		h.handed = true
	}
	s.mu.Unlock()
	resp, err := s.kv.Txn(ctx).If(s.ks.LockHeldBy(name, leaseID)...).
		Then(clientv3.OpPut(s.ks.LockKey(name), "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease())).Commit()
	if err != nil {
		// It may have committed, its reply lost: the key's mod revision
		// then moved, the deadline's delete at the revision booked would
		// find the lock "no longer as this store wrote it" and let it be,
		// and the lock would stay, held by nobody, on a session the
		// store's other locks keep alive.
		s.mu.Lock()
		if h := s.held[name]; h != nil && h.id == leaseID {
			unsureLocked(h)
		}
		s.mu.Unlock()
		return backendErr("etcd", "acquire", err)
	}
	if !resp.Succeeded {
		return ErrLost
	}
	s.mu.Lock()
	if h := s.held[name]; h != nil && h.id == leaseID {
		if h.unsure {
			// Its session is not known (a take-over whose reply was
			// lost), but its revision is now, on either.
			h.prevModRev = resp.Header.Revision
		} else {
			h.modRev = resp.Header.Revision // as this store wrote it, for its deadline's delete
		}
	}
	s.mu.Unlock()
	return nil
}

// unsureLocked books a holding whose key a write of this store's may have
// changed, unanswered (a hand-over whose reply was lost): its mod revision
// is not known any more. As for a take-over whose reply was lost
// (holdUnsure, defect 55), its deadline deletes the lock if leaseID holds
// it on the holding's session (the write kept the key's etcd lease), or
// at the revision booked before, if the write did not commit; a refresh
// takes the lock over, and so learns what it is; ReleaseUnhanded leaves
// it to its deadline. A holding unsure already stays so. Called with mu.
func unsureLocked(h *holding) {
	if h.unsure {
		return
	}
	h.unsure, h.prevModRev, h.modRev = true, h.modRev, 0
}

// ReleaseUnhanded implements UnhandedReleaser: for a grant this store made
// and holds once, a delete on condition that its key is still as this
// store wrote it (no other store's handOver or take-over since) and that
// no request here was handed it. An unsure holding (a take-over or
// hand-over whose reply was lost) is left to its deadline: its mod
// revision is not known, and a compare on its etcd lease would not see
// another store's hand-over, which keeps the lease.
func (s *EtcdStore) ReleaseUnhanded(ctx context.Context, name, leaseID string) (bool, error) {
	s.mu.Lock()
	h := s.held[name]
	if h == nil || h.id != leaseID || h.handed || h.unsure || h.holds > 1 {
		s.mu.Unlock()
		return false, nil
	}
	op := etcdOp{kind: opExpire, name: name, id: leaseID, modRev: h.modRev, plain: h.plain}
	s.mu.Unlock()
	_, err := s.gc.Do(clientv3.WithRequireLeader(ctx), name, op)
	switch {
	case errors.Is(err, errHeld):
		return false, nil
	case err != nil:
		return false, backendErr("etcd", "release", err)
	}
	s.mu.Lock()
	s.releasedLocked(name, leaseID)
	s.mu.Unlock()
	return true, nil
}

// abandonedFor is how long an abandoned attempt's mark lasts at least (at
// most markReuse more): a create etcd commits later than that takes its
// lock, as before the mark.
const abandonedFor = time.Minute

// abandonedKey marks an attempt whose caller gave up (abandon).
func (s *EtcdStore) abandonedKey(leaseID string) string {
	return s.ks.Prefix() + "abandoned/" + leaseID
}

// untilAnswered calls try, each call bounded by timeout, until it reports
// done or the store closes, pausing 0.1 s after the first failure and
// doubling the pause up to 5 s: for deletes that cannot be left to the
// session lease, which the store's other locks keep alive (defect 14).
func (s *EtcdStore) untilAnswered(timeout time.Duration, try func(ctx context.Context) (done bool)) {
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 5*time.Second) {
		ctx, cancel := context.WithTimeout(s.life, timeout)
		done := try(ctx)
		cancel()
		if done {
			return
		}
		t := time.NewTimer(pause)
		select {
		case <-s.stop:
			t.Stop()
			return // the session lease frees what is left, once nothing renews it
		case <-t.C:
		}
	}
}

// hold records a lock this store now enforces, held holds times, and
// returns the TTL it grants: ttl, or less if the session is not known to
// live that long.
//
// seq is a take-over's refresh sequence number (0 for none). When a later
// refresh of the lease was taken meanwhile, the lock stays on sess, where
// the take-over moved it, but keeps that refresh's deadline, and late
// reports it (defect 102).
func (s *EtcdStore) hold(name, leaseID string, tok fence.Token, modRev int64, sess *session, start time.Time, ttl time.Duration, plain bool, holds int, seq uint64) (granted time.Duration, late bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	granted = min(ttl, sess.validUntil.Sub(start))
	h := &holding{id: leaseID, token: tok, modRev: modRev, sess: sess, deadline: start.Add(granted), plain: plain, holds: holds, seq: seq}
	if old := s.held[name]; old != nil {
		old.sess.users--
		if old.id == leaseID && old.seq > seq {
			h.seq = old.seq
			if late = lateRefresh(seq, old.seq, holds > 1); late {
				h.deadline = old.deadline
			}
		}
	}
	sess.users++
	s.held[name] = h
	s.scheduleLocked(name, h)
	return granted, late
}

// holdUnsure records a take-over whose reply was lost, so that the lock
// is deleted at its deadline if nobody refreshes it: on sess, if the move
// committed, or as this store wrote it before, if it did not. The deadline
// is the later of the refresh's and the one before, which the holder
// counted on. A later refresh takes the lock over again, and so learns
// what it is.
func (s *EtcdStore) holdUnsure(name, leaseID string, sess *session, start time.Time, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	h := &holding{id: leaseID, sess: sess, deadline: start.Add(max(min(ttl, sess.validUntil.Sub(start)), 0)), unsure: true}
	if old := s.held[name]; old != nil {
		if old.id == leaseID {
			h.token, h.prevModRev, h.deadline, h.seq = old.token, old.modRev, later(h.deadline, old.deadline), old.seq
		}
		s.dropLocked(name, old)
	}
	sess.users++
	s.held[name] = h
	s.scheduleLocked(name, h)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// remaining is how long this store's holding of name has left, if it has
// one; 0 otherwise.
func (s *EtcdStore) remaining(name string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[name]; h != nil {
		return max(time.Until(h.deadline), 0)
	}
	return 0
}

// Refresh implements LeaseStore. On the store that granted the lock it is
// a linearizable read and a new local deadline: no Raft write. A store
// that did not grant it (another fenced node, or this one restarted) takes
// it over: it moves the keys onto its own session, one Raft write, and
// enforces the deadline from then on.
//
// The refreshes of a lease are ordered by seq on each store: one whose
// seq is below the highest this store took is not applied
// (ErrOutOfOrder). Refreshes of one lease through several fenced nodes are
// ordered on each node only: ordering them across nodes would take a Raft
// write per refresh (docs/design.md, defect 102).
func (s *EtcdStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (Grant, error) {
	return s.refresh(ctx, name, leaseID, ttl, seq, false)
}

// refresh is Refresh; with keep (or a lock held more than once) it never
// moves the deadline earlier.
func (s *EtcdStore) refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64, keep bool) (Grant, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	start := time.Now()
	sess, err := s.sessionFor(ctx, ttl, start)
	if err != nil {
		return Grant{}, err
	}
	s.mu.Lock()
	h := s.held[name]
	if h != nil && h.id == leaseID {
		if lateRefresh(seq, h.seq, keep || h.holds > 1) {
			s.mu.Unlock()
			return Grant{}, ErrOutOfOrder
		}
		h.seq = max(h.seq, seq)
		if h.expiring || !start.Before(h.deadline) {
			// Its deadline here passed: lost, unless another store took
			// the lock over since (a refresh through another fenced
			// node), whose deadline is the lock's now. Only etcd knows
			// (defect 98).
			s.mu.Unlock()
			return s.refreshPast(ctx, name, h, sess, start, ttl, seq)
		}
		keep = keep || h.holds > 1
		// A refresh that keeps a later deadline stays on its session,
		// which outlives it, whatever the TTL class of the new ttl.
		if h.sess == sess || (keep && !h.sess.dead && !h.sess.validUntil.Before(start.Add(ttl))) {
			h.refreshing++
			s.mu.Unlock()
			g, err := s.refreshHeld(ctx, name, h, start, ttl, seq, keep)
			if !errors.Is(err, errMoved) {
				return g, err
			}
			return s.takeOver(ctx, name, leaseID, sess, start, ttl, seq)
		}
	}
	s.mu.Unlock()
	return s.takeOver(ctx, name, leaseID, sess, start, ttl, seq)
}

// lateRefresh reports whether a refresh numbered seq must not be applied
// because one numbered last was taken before it (defect 102). An
// unnumbered refresh is unordered, and one that keeps the deadline (a
// lock held more than once) cannot shorten the lease, so neither is late.
func lateRefresh(seq, last uint64, keep bool) bool { return seq != 0 && seq < last && !keep }

// refreshPast is the refresh of a lock whose deadline on this store
// passed: lost if etcd has it as this store wrote it (its delete is
// coming), or gone; taken back if another store moved it, as a refresh of
// a lock this store does not hold.
func (s *EtcdStore) refreshPast(ctx context.Context, name string, h *holding, sess *session, start time.Time, ttl time.Duration, seq uint64) (Grant, error) {
	v, err := s.checks.Do(ctx, name, name)
	if err != nil {
		return Grant{}, backendErr("etcd", "refresh", err)
	}
	kv, _ := v.(*mvccpb.KeyValue)
	s.mu.Lock()
	// A take-over whose reply was lost wrote it onto this store's session,
	// or left it as written before (holdUnsure).
	asWritten := kv != nil && (kv.ModRevision == h.modRev ||
		h.unsure && (kv.ModRevision == h.prevModRev || kv.Lease == int64(h.sess.id)))
	s.mu.Unlock()
	if kv == nil || sequencer.LeaseIDOf(kv.Value) != h.id || asWritten {
		return Grant{}, ErrLost
	}
	return s.takeOver(ctx, name, h.id, sess, start, ttl, seq)
}

// errMoved is refreshHeld's answer when the lock is still held by the
// lease id but another store took it over (its mod revision moved): the
// deadline is that store's now, and this one must take it back.
var errMoved = errors.New("lock: moved to another store")

// refreshHeld checks that the lock is still as this store wrote it and
// moves its deadline, unless a later refresh (a higher seq) came while it
// read.
func (s *EtcdStore) refreshHeld(ctx context.Context, name string, h *holding, start time.Time, ttl time.Duration, seq uint64, keep bool) (Grant, error) {
	v, err := s.checks.Do(ctx, name, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	h.refreshing--
	kv, _ := v.(*mvccpb.KeyValue)
	switch {
	case err != nil:
		s.scheduleLocked(name, h) // in case its deadline passed meanwhile
		return Grant{}, backendErr("etcd", "refresh", err)
	case kv == nil || sequencer.LeaseIDOf(kv.Value) != h.id:
		s.dropLocked(name, h)
		return Grant{}, ErrLost
	case kv.ModRevision != h.modRev:
		// A refresh through another store (another fenced node behind
		// a load balancer) moved the lock onto its session. Not lost:
		// forget this store's deadline and take the lock back.
		s.dropLocked(name, h)
		return Grant{}, errMoved
	}
	if lateRefresh(seq, h.seq, keep) {
		s.scheduleLocked(name, h)
		return Grant{}, ErrOutOfOrder
	}
	granted := min(ttl, h.sess.validUntil.Sub(start))
	if granted <= 0 {
		s.scheduleLocked(name, h)
		return Grant{}, backendErr("etcd", "refresh", errors.New("the session lease could not be renewed in time"))
	}
	if d := start.Add(granted); !keep || d.After(h.deadline) {
		h.deadline = d
	}
	s.scheduleLocked(name, h)
	return Grant{Token: h.token, TTL: granted, LeaseID: h.id}, nil
}

// check reads the lock keys of a batch of refreshes in one read-only Txn
// (a linearizable read, no Raft write): many locks kept alive at once cost
// a read per batch, not one each.
func (s *EtcdStore) check(batch []*groupcommit.Request[string]) {
	ctx, cancel := groupcommit.Context(batch, 10*time.Second)
	defer cancel()
	ops := make([]clientv3.Op, len(batch))
	for i, r := range batch {
		ops[i] = clientv3.OpGet(s.ks.LockKey(r.Arg))
	}
	resp, err := s.kv.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
	s.reads.Add(1)
	if errors.Is(err, rpctypes.ErrTooManyOps) && len(batch) > 1 {
		// As for creates and deletes (commit): halve the bound and read
		// each half, so no refresh fails because of batching.
		s.checks.SetMaxBatch(max(1, len(batch)/2))
		cancel()
		s.check(batch[:len(batch)/2])
		s.check(batch[len(batch)/2:])
		return
	}
	for i, r := range batch {
		if err != nil {
			r.Done(nil, err)
			continue
		}
		var kv *mvccpb.KeyValue
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
			kv = kvs[0]
		}
		r.Done(kv, nil)
	}
}

// takeOver moves a lock held by leaseID onto this store's session, keeping
// its value and token, and enforces its deadline from now on. The store
// that enforced it before finds its mod revision changed and lets it be.
func (s *EtcdStore) takeOver(ctx context.Context, name, leaseID string, sess *session, start time.Time, ttl time.Duration, seq uint64) (Grant, error) {
	resp, err := s.kv.Txn(ctx).If(s.ks.LockHeldBy(name, leaseID)...).
		Then(append(s.ks.MoveLock(name, sess.id), s.ks.GetLock(name)...)...).Commit()
	if err != nil {
		// The move may have committed, its reply lost: the lock would
		// then be on this store's session, which the store's other locks
		// keep alive, and the store that enforced its deadline would find
		// it moved and let it be. Enforce a deadline for it here.
		s.holdUnsure(name, leaseID, sess, start, ttl)
		return Grant{}, backendErr("etcd", "refresh", err)
	}
	if !resp.Succeeded {
		s.mu.Lock()
		if h := s.held[name]; h != nil && h.id == leaseID {
			s.dropLocked(name, h)
		}
		s.mu.Unlock()
		return Grant{}, ErrLost
	}
	s.txns.Add(1)
	n := len(resp.Responses)
	st, held, err := s.ks.ParseLock(resp.Responses[n-2].GetResponseRange(), resp.Responses[n-1].GetResponseRange())
	if err != nil || !held {
		return Grant{}, backendErr("etcd", "refresh", fmt.Errorf("the lock vanished in its own Txn: %v", err))
	}
	// The holding keeps the lock's reentrancy count as read: a lock held
	// more than once is never shortened by a refresh of one hold, here as
	// on the store that granted it (defect 19).
	granted, late := s.hold(name, leaseID, st.Token, resp.Header.Revision, sess, start, ttl, st.Holder == "", st.Count, seq)
	if late {
		return Grant{}, ErrOutOfOrder
	}
	return Grant{Token: st.Token, TTL: granted, LeaseID: leaseID}, nil
}

// Release implements LeaseStore. Releasing a lease that this store
// released, while it would still have been valid, succeeds (a retry after
// a lost reply). A reentrant holder's release counts down; the last frees
// the lock.
func (s *EtcdStore) Release(ctx context.Context, name, leaseID, op string) error {
	ctx = clientv3.WithRequireLeader(ctx)
	s.mu.Lock()
	h := s.held[name]
	plain := h != nil && h.id == leaseID && h.plain
	s.mu.Unlock()
	v, err := s.gc.Do(ctx, name, etcdOp{kind: opDelete, name: name, id: leaseID, plain: plain})
	switch {
	case errors.Is(err, errHeld):
		s.mu.Lock()
		defer s.mu.Unlock()
		if h := s.held[name]; h != nil && h.id == leaseID {
			s.dropLocked(name, h)
		}
		if t, ok := s.released[name]; ok && t.id == leaseID && time.Now().Before(t.until) {
			return nil
		}
		// Not sure: the store keeps one tombstone per lock, in its own
		// memory, so a release of this lease id whose answer was lost is
		// forgotten once the next holder's release through this store
		// books its own, and another store never knew it. Lease.Release
		// forgives this "lost" after an attempt that got no answer, as it
		// did before Redis could tell (ErrMaybeReleased).
		return errLostMaybeReleased
	case err != nil:
		s.mu.Lock()
		s.maybeReleasedLocked(name, leaseID)
		s.mu.Unlock()
		return backendErr("etcd", "release", err)
	}
	if cr, ok := v.(countResult); ok {
		return s.countDown(ctx, name, leaseID, op, cr)
	}
	return nil
}

// countDown releases one hold of a reentrant lock: the count goes down,
// and the last release frees it. A release sent again with its id (op)
// finds the id in the count's record and counts nothing (defect 29).
func (s *EtcdStore) countDown(ctx context.Context, name, leaseID, op string, cr countResult) error {
	for range 8 { // a concurrent reentry changes the count: read it again
		if op != "" && slices.Contains(cr.ops, op) {
			return nil
		}
		ops := cr.ops
		if op != "" {
			ops = append(slices.Clip(ops), op)
		}
		then := []clientv3.Op{s.ks.PutCount(name, cr.count-1, ops, cr.lease)}
		if cr.count <= 1 {
			then = s.ks.DeleteLock(name)
		}
		resp, err := s.kv.Txn(ctx).If(append(s.ks.LockHeldBy(name, leaseID), s.ks.CountAt(name, cr.rev))...).
			Then(then...).Else(s.ks.GetLock(name)...).Commit()
		if err != nil {
			if cr.count <= 1 {
				s.mu.Lock()
				s.maybeReleasedLocked(name, leaseID)
				s.mu.Unlock()
			}
			return backendErr("etcd", "release", err)
		}
		s.txns.Add(1)
		if resp.Succeeded {
			if cr.count <= 1 {
				s.mu.Lock()
				s.releasedLocked(name, leaseID)
				s.mu.Unlock()
			} else {
				s.setHolds(name, leaseID, cr.count-1)
			}
			return nil
		}
		st, held, err := s.ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
		if err != nil {
			return backendErr("etcd", "release", err)
		}
		if !held || st.LeaseID != leaseID {
			return errLostMaybeReleased // as Release's, unsure
		}
		cr = countOf(st)
	}
	return backendErr("etcd", "release", errors.New("the reentrancy count kept changing"))
}

// released books a release: the holding goes, and a tombstone remembers
// the lease id until the lock's deadline. Called with mu.
func (s *EtcdStore) releasedLocked(name, leaseID string) {
	h := s.held[name]
	if h == nil || h.id != leaseID {
		return
	}
	s.dropLocked(name, h)
	if h.deadline.After(time.Now()) {
		s.released[name] = tombstone{id: leaseID, token: h.token, until: h.deadline}
		heap.Push(&s.events, event{at: h.deadline, name: name, tomb: true})
		s.startLoopLocked()
	}
}

// maybeReleasedLocked books a release that got no answer: etcd may have
// committed it (its reply lost), and the caller sends it again (etcd's
// client does not, Lease.Release does). Found gone then, the lock was
// released, not lost: a tombstone says so until the lock's deadline, as
// after a release answered. The holding stays, since the lock may still
// be held. Called with mu.
func (s *EtcdStore) maybeReleasedLocked(name, leaseID string) {
	h := s.held[name]
	if h == nil || h.id != leaseID || !h.deadline.After(time.Now()) {
		return
	}
	s.released[name] = tombstone{id: leaseID, token: h.token, until: h.deadline}
	heap.Push(&s.events, event{at: h.deadline, name: name, tomb: true})
	s.startLoopLocked()
}

// Inspect implements LeaseStore. Remaining is the lock's own deadline when
// this store enforces it, else its session lease's remaining TTL (the
// latest the lock can outlive a holder that stopped refreshing); never 0
// while the lock is held. A free lock's LastToken is known to the store
// that released it, until the lease would have run out.
func (s *EtcdStore) Inspect(ctx context.Context, name string) (State, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	resp, err := s.kv.Txn(ctx).Then(append(s.ks.GetLock(name), s.queueOps(name)...)...).Commit()
	if err != nil {
		return State{}, backendErr("etcd", "inspect", err)
	}
	r := func(i int) *pb.RangeResponse { return resp.Responses[i].GetResponseRange() }
	st := State{Name: name}
	st.Waiters, st.OldestWait = parseQueue(r(2), r(3))
	lk, held, err := s.ks.ParseLock(r(0), r(1))
	if err != nil {
		return State{}, backendErr("etcd", "inspect", err)
	}
	if !held {
		s.mu.Lock()
		if t, ok := s.released[name]; ok && time.Now().Before(t.until) {
			st.LastToken = t.token
		}
		s.mu.Unlock()
		return st, nil
	}
	st.Held, st.LeaseID, st.Token, st.Owner, st.Holder, st.Count = true, lk.LeaseID, lk.Token, lk.Owner, lk.Holder, lk.Count
	if st.Remaining, err = s.remainingOf(ctx, name, lk, map[clientv3.LeaseID]time.Duration{}); err != nil {
		return State{}, backendErr("etcd", "inspect", err)
	}
	return st, nil
}

// queueOps read lock name's queue: how many wait, and the place at its
// head, whose value is when it arrived (see parseQueue); opts go to both
// reads (List reads as of a revision).
func (s *EtcdStore) queueOps(name string, opts ...clientv3.OpOption) []clientv3.Op {
	qp := s.ks.QueuePrefix(name)
	return []clientv3.Op{
		clientv3.OpGet(qp, append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}, opts...)...),
		clientv3.OpGet(qp, append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1)}, opts...)...),
	}
}

// parseQueue reads the answers to queueOps: how many wait, and how long
// the one at the head has waited.
func parseQueue(count, head *pb.RangeResponse) (waiters int, oldest time.Duration) {
	if kvs := head.GetKvs(); len(kvs) == 1 {
		if ms, err := strconv.ParseInt(string(kvs[0].Value), 10, 64); err == nil {
			oldest = max(time.Since(time.UnixMilli(ms)), 0)
		}
	}
	return int(count.GetCount()), oldest
}

// remainingOf is how long lock lk has left: its deadline if this store
// enforces it, else its session lease's TTL (looked up once per lease in
// ttls); at least 1ms. A failed look-up is an error, not a lock about to
// expire (defect 111).
func (s *EtcdStore) remainingOf(ctx context.Context, name string, lk sequencer.LockState, ttls map[clientv3.LeaseID]time.Duration) (time.Duration, error) {
	s.mu.Lock()
	h := s.held[name]
	var rem time.Duration
	local := h != nil && h.id == lk.LeaseID
	if local {
		rem = time.Until(h.deadline)
	}
	s.mu.Unlock()
	if !local && lk.Lease != 0 {
		d, ok := ttls[lk.Lease]
		if !ok {
			// Hedged: a member cut off from its peers holds it (defect 109).
			ttl, err := etcdkv.Hedge(ctx, s.cli, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
				return s.cli.TimeToLive(ctx, lk.Lease)
			})
			if err != nil {
				return 0, fmt.Errorf("the TTL of lease %x of lock %q: %w", int64(lk.Lease), name, err)
			}
			d = time.Duration(max(ttl.TTL, 0)) * time.Second // -1: expired, its keys going
			ttls[lk.Lease] = d
		}
		rem = d
	}
	return max(rem, time.Millisecond), nil
}

// listedHook, if set (by tests), runs in List between its read of the
// locks and its read of their counts.
var listedHook func()

// List implements LeaseStore: a range over the lock keys, in name order;
// the cursor is the last name of the page before.
func (s *EtcdStore) List(ctx context.Context, req ListRequest) (ListPage, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	from := s.ks.LockKey(req.Prefix)
	if req.Cursor != "" {
		if err := ValidateName(req.Cursor); err != nil || !strings.HasPrefix(req.Cursor, req.Prefix) {
			return ListPage{}, fmt.Errorf("%w: %q: want the next_cursor a previous page returned", ErrInvalidCursor, req.Cursor)
		}
		from = s.ks.LockKey(req.Cursor) + "\x00"
	}
	end := clientv3.GetPrefixRangeEnd(s.ks.LockKey(req.Prefix))
	locks, err := s.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(req.Limit)))
	if err != nil {
		return ListPage{}, backendErr("etcd", "list", err)
	}
	var page ListPage
	if len(locks.Kvs) == 0 {
		return page, nil
	}
	names := make([]string, len(locks.Kvs))
	for i, kv := range locks.Kvs {
		names[i] = strings.TrimPrefix(string(kv.Key), s.ks.LocksPrefix())
	}
	if listedHook != nil {
		listedHook()
	}
	// The locks' counts and queues as of the same revision as the locks: a
	// lock that changed hands between the reads would otherwise be listed
	// with the next holder's count.
	first, last := names[0], names[len(names)-1]
	rest, err := s.kv.Get(ctx, s.ks.CountKey(first), clientv3.WithRange(s.ks.CountKey(last)+"\x00"), clientv3.WithRev(locks.Header.Revision))
	if err != nil {
		return ListPage{}, backendErr("etcd", "list", err)
	}
	counts := map[string]*mvccpb.KeyValue{}
	for _, kv := range rest.Kvs {
		counts[strings.TrimPrefix(string(kv.Key), s.ks.CountKey(""))] = kv
	}
	ttls := map[clientv3.LeaseID]time.Duration{}
	for i, kv := range locks.Kvs {
		rr := func(kv *mvccpb.KeyValue) *pb.RangeResponse {
			if kv == nil {
				return &pb.RangeResponse{}
			}
			return &pb.RangeResponse{Kvs: []*mvccpb.KeyValue{kv}}
		}
		lk, held, err := s.ks.ParseLock(rr(kv), rr(counts[names[i]]))
		if err != nil || !held {
			continue
		}
		rem, err := s.remainingOf(ctx, names[i], lk, ttls)
		if err != nil {
			return ListPage{}, backendErr("etcd", "list", err)
		}
		page.Locks = append(page.Locks, State{Name: names[i], Held: true, LeaseID: lk.LeaseID, Token: lk.Token,
			Owner: lk.Owner, Holder: lk.Holder, Count: lk.Count, Remaining: rem})
	}
	if err := s.countWaiters(ctx, page.Locks, locks.Header.Revision); err != nil {
		return ListPage{}, err
	}
	if locks.More {
		page.Next = last
	}
	return page, nil
}

// countWaiters fills in the queue of each listed lock, as Inspect does,
// as of revision rev: read-only Txns of queueOps' two ranges per lock,
// within the store's bound (inTxns).
func (s *EtcdStore) countWaiters(ctx context.Context, locks []State, rev int64) error {
	err := s.inTxns(len(locks), 2, func(from, to int) error {
		chunk := locks[from:to]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, st := range chunk {
			ops = append(ops, s.queueOps(st.Name, clientv3.WithRev(rev))...)
		}
		resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		for i := range chunk {
			chunk[i].Waiters, chunk[i].OldestWait = parseQueue(resp.Responses[2*i].GetResponseRange(), resp.Responses[2*i+1].GetResponseRange())
		}
		return nil
	})
	if err != nil {
		return backendErr("etcd", "list", err)
	}
	return nil
}

// ForceRelease implements LeaseStore. With a token, the lock read is
// deleted only if it has that token, and the Txn deletes it only if the
// lease id read still holds it: a lease id's token never changes (its key
// is written once per grant, and the token is that key's create revision
// plus the offset in its value), so the compare on the lease id is the
// compare on the token, in the same Txn as the delete.
func (s *EtcdStore) ForceRelease(ctx context.Context, name string, token fence.Token) (State, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	for range 8 { // a lock that changes hands meanwhile: read it again
		before, err := s.Inspect(ctx, name)
		if err != nil || !before.Held {
			return before, err
		}
		if token != 0 && before.Token != token {
			return State{}, &HeldByOtherError{Name: name, Token: before.Token, Want: token}
		}
		resp, err := s.kv.Txn(ctx).If(s.ks.LockHeldBy(name, before.LeaseID)...).Then(s.ks.DeleteLock(name)...).Commit()
		if err != nil {
			return State{}, backendErr("etcd", "force-release", err)
		}
		if resp.Succeeded {
			s.txns.Add(1)
			s.mu.Lock()
			if h := s.held[name]; h != nil && h.id == before.LeaseID {
				s.dropLocked(name, h)
			}
			if t, ok := s.released[name]; ok && t.id == before.LeaseID {
				delete(s.released, name) // a release that got no answer did not free it: its holder lost it
			}
			s.mu.Unlock()
			return before, nil
		}
	}
	return State{}, backendErr("etcd", "force-release", errors.New("the lock kept changing hands"))
}

// Leave implements LeaseStore: the waiter's queue key goes, deleted only
// at its place's create revision: the key is reused by the store's next
// waiter once the slot is free, and a delete that failed here may still
// commit later (defect 168). A place whose revision is not known (no join
// answered yet) is read first; while its join is in flight, or if the
// delete fails, the store's goroutine deletes it later.
func (s *EtcdStore) Leave(ctx context.Context, name, waiter string) error {
	pk := placeKey{name, waiter}
	s.mu.Lock()
	p, ok := s.places[pk]
	if ok && p.rev == 0 && s.joining[slotKey{name, p.slot}] > 0 {
		// Its join may yet make the key: deleted once the join ended.
		s.orphanLocked(pk)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	if !ok {
		return nil // no place here: never joined, or already gone
	}
	ctx = clientv3.WithRequireLeader(ctx)
	var err error
	if key := s.queueKey(name, p.slot); p.rev != 0 {
		_, err = s.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", p.rev)).Then(clientv3.OpDelete(key)).Commit()
	} else {
		err = s.deletePlaces(ctx, []slotKey{{name, p.slot}}, []int64{0}, func([]slotKey) {})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.orphanLocked(pk)
		return backendErr("etcd", "leave", err)
	}
	s.unplaceLocked(pk)
	return nil
}

// Ping implements LeaseStore: etcd can grant, and a token is left below
// 2^63 (sequencer.Issuer.Ping).
func (s *EtcdStore) Ping(ctx context.Context) error {
	if err := s.issuer.Ping(ctx); err != nil {
		return backendErr("etcd", "ping", err)
	}
	return nil
}

// Watch implements LeaseStore with an etcd watch; it returns once etcd has
// confirmed the watch. A fair waiter with a place behind another watches
// the place just ahead of it, as etcd's Mutex does, so that a release wakes
// the head alone (no thundering herd); when that place goes, the watch
// moves on to the next one ahead, or to the lock key. Anyone else watches
// the lock key.
//
// Every watch starts at etcd's current revision and is followed by a read
// of its key: a watch from a past revision joins etcd's unsynced watchers,
// which it catches up only every 100ms, and a waiter would wake that late
// (the hot-name gap's p99 in the lock benchmark).
func (s *EtcdStore) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	target, err := s.watchTarget(ctx, name, waiter)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	one, stopOne := context.WithCancel(wctx)
	wch, exists, err := s.watchKey(ctx, one, target)
	if err != nil {
		stopOne()
		cancel()
		return nil, nil, err
	}
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by stop
		defer wg.Done()
		// The watch ended (etcd lost its leader, or stop): the waiter looks
		// for itself, and subscribes again (docs/design.md, defect 251).
		defer close(ch)
		lockKey := s.ks.LockKey(name)
		for {
			gone := !exists // went before the watch began
			if gone {
				signal()
			}
			if target.key == lockKey || !gone {
				for wr := range wch {
					if len(wr.Events) == 0 {
						continue
					}
					signal()
					if target.key != lockKey {
						gone = true
						break
					}
				}
			}
			stopOne()
			if !gone || target.key == lockKey || wctx.Err() != nil {
				return // the watch ended: no leader, or stop
			}
			// The place ahead went: watch the next one ahead, or the lock.
			var err error
			if target, err = s.watchTarget(wctx, name, waiter); err != nil {
				return
			}
			one, stopOne = context.WithCancel(wctx)
			if wch, exists, err = s.watchKey(wctx, one, target); err != nil {
				stopOne()
				return
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

// watched is the key a waiter watches, and for a place ahead its create
// revision: a place key is reused by later waiters of its store, so the
// same key created again is not the place that was ahead.
type watched struct {
	key string
	rev int64 // 0 for the lock key: whoever holds it
}

// watchKey watches deletions of target's key from etcd's current revision
// on, under wctx, and then reads whether target still exists: a deletion
// before the watch began is seen by the read, one after by the watch. A
// place ahead deleted and created again by a later waiter before the watch
// began (its slot reused) is gone: the later waiter is behind. ctx bounds
// the wait for etcd's confirmation.
func (s *EtcdStore) watchKey(ctx, wctx context.Context, target watched) (clientv3.WatchChan, bool, error) {
	key := target.key
	wch := s.cli.Watch(wctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil {
			err := wr.Err()
			if err == nil {
				err = errors.New("watch channel closed")
			}
			return nil, false, backendErr("etcd", "watch", err)
		}
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	r, err := s.kv.Get(clientv3.WithRequireLeader(ctx), key, clientv3.WithKeysOnly())
	if err != nil {
		return nil, false, backendErr("etcd", "watch", err)
	}
	return wch, len(r.Kvs) == 1 && (target.rev == 0 || r.Kvs[0].CreateRevision == target.rev), nil
}

// watchTarget is what a waiter watches: the place just ahead of its own,
// or the lock key.
func (s *EtcdStore) watchTarget(ctx context.Context, name, waiter string) (watched, error) {
	s.mu.Lock()
	rev := s.places[placeKey{name, waiter}].rev
	s.mu.Unlock()
	target := watched{key: s.ks.LockKey(name)}
	if waiter != "" && rev != 0 {
		r, err := s.kv.Get(clientv3.WithRequireLeader(ctx), s.ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMaxCreateRev(rev-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
		if err != nil {
			return watched{}, backendErr("etcd", "watch", err)
		}
		if len(r.Kvs) == 1 {
			target = watched{key: string(r.Kvs[0].Key), rev: r.Kvs[0].CreateRevision}
		}
	}
	if watchTargetHook != nil {
		watchTargetHook(target.key)
	}
	return target, nil
}

// watchTargetHook, if set (by tests), runs when a waiter has chosen the key
// to watch, before it watches it.
var watchTargetHook func(key string)

// Sessions.

// sessionTTL is the session lease's TTL for locks of ttl, in seconds:
// twice ttl, so that renewed every third of it a session always has 4/3
// of ttl left, a full ttl for any acquisition with room for a renewal's
// round trip. A dead process's locks free when it expires.
func sessionTTL(ttl time.Duration) int64 {
	return max(1, int64(math.Ceil(2*ttl.Seconds())))
}

// sessionFor returns a live session for locks of ttl that will outlive
// ttl from start, granting one if needed (one Raft write per TTL class,
// not per lock).
func (s *EtcdStore) sessionFor(ctx context.Context, ttl time.Duration, start time.Time) (*session, error) {
	secs := sessionTTL(ttl)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if sess := s.sessions[secs]; sess != nil && !sess.dead && !sess.validUntil.Before(start.Add(ttl)) {
			s.mu.Unlock()
			return sess, nil
		}
		if wait := s.granting[secs]; wait != nil {
			// Another caller is granting this class's session: one grant
			// serves all.
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		s.granting[secs] = done
		s.mu.Unlock()
		sess, err := s.grant(ctx, secs)
		s.mu.Lock()
		delete(s.granting, secs)
		close(done)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if old := s.sessions[secs]; old != nil && !old.dead {
			// Not known to outlive a new TTL (its renewals failed for a
			// while), but what is on it lives as long as it does: a
			// waiter's place, or a lock until it is refreshed onto the new
			// one (or a create still in flight). Keep renewing it while it
			// is in use.
			s.retired[old] = true
		}
		s.sessions[secs] = sess
		s.startLoopLocked()
		s.mu.Unlock()
		if sess.validUntil.Before(start.Add(ttl)) {
			return nil, backendErr("etcd", "acquire", fmt.Errorf("a session lease of %ds was granted too late to cover a %s TTL", secs, ttl))
		}
		return sess, nil
	}
}

// grant grants a session lease of secs seconds. Every caller that needs
// the session waits for it, so it must not wait on one member: a member
// without a leader refuses it at once (and clientv3 sends it to the
// next), and one that took it just before it lost its peers would hold it
// until etcd's request timeout, so an attempt unanswered in etcdkv.Stall,
// then twice that and so on, is given up and the grant sent again
// (defect 108). A grant given up that etcd applied leaves a lease with no
// keys, which expires.
func (s *EtcdStore) grant(ctx context.Context, secs int64) (*session, error) {
	for wait := etcdkv.Stall; ; wait *= 2 {
		sent := time.Now()
		actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), wait)
		lg, err := s.cli.Grant(actx, secs)
		unanswered := errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if err != nil {
			if unanswered {
				continue
			}
			return nil, backendErr("etcd", "acquire", err)
		}
		s.sessionGrants.Add(1)
		granted := time.Duration(lg.TTL) * time.Second
		return &session{id: lg.ID, granted: granted, validUntil: sent.Add(granted), nextRenew: sent.Add(granted / 3)}, nil
	}
}

// renew keeps a session alive: validUntil moves to the renewal's send time
// plus the TTL etcd confirms. A session etcd no longer knows is dead, and
// so is every lock on it: etcd deleted their keys.
func (s *EtcdStore) renew(sess *session) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.life, sess.granted/3)
	defer cancel()
	sent := time.Now()
	ka, err := s.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), sess.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.renewing = false
	switch {
	case err == nil:
		sess.validUntil = sent.Add(time.Duration(ka.TTL) * time.Second)
		sess.nextRenew = sent.Add(sess.granted / 3)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		s.sessionLostLocked(sess)
	default:
		// Try again soon; validUntil bounds what later grants may count on.
		sess.nextRenew = time.Now().Add(min(sess.granted/10, time.Second))
	}
	s.poke()
}

// The store's goroutine: it renews sessions in use and enforces deadlines.

type event struct {
	at   time.Time
	name string
	h    *holding // whose deadline: a later holding of the name has its own
	gen  uint64   // h's gen when scheduled
	tomb bool     // a tombstone's end, not a deadline
}

type eventHeap []event

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// scheduleLocked queues h's deadline. Called with mu.
func (s *EtcdStore) scheduleLocked(name string, h *holding) {
	h.gen++
	heap.Push(&s.events, event{at: h.deadline, name: name, h: h, gen: h.gen})
	s.startLoopLocked()
	s.poke()
}

// dropLocked forgets a holding. Called with mu.
func (s *EtcdStore) dropLocked(name string, h *holding) {
	if s.held[name] == h {
		delete(s.held, name)
		h.sess.users--
	}
	h.gen++ // its queued deadlines are stale
}

func (s *EtcdStore) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *EtcdStore) startLoopLocked() {
	if s.loop || s.closed {
		return
	}
	s.loop = true
	s.wg.Add(1)
	go s.run()
}

func (s *EtcdStore) run() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := s.step(time.Now())
		timer.Reset(time.Until(next))
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// step does what is due at now and returns when to look again.
func (s *EtcdStore) step(now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := now.Add(time.Hour)
	for sess := range s.retired {
		if sess.dead || sess.users <= 0 && !now.Before(sess.validUntil) {
			delete(s.retired, sess) // gone, or unused and past its validity
		}
	}
	renew := func(sess *session) {
		if sess.dead || sess.users == 0 || sess.renewing {
			return
		}
		if !now.Before(sess.nextRenew) {
			sess.renewing = true
			s.wg.Add(1)
			go s.renew(sess)
			return
		}
		if sess.nextRenew.Before(next) {
			next = sess.nextRenew
		}
	}
	for _, sess := range s.sessions {
		renew(sess)
	}
	for sess := range s.retired {
		renew(sess)
	}
	if len(s.orphans) > 0 && !s.cleaning {
		if now.Before(s.cleanAt) {
			if s.cleanAt.Before(next) {
				next = s.cleanAt
			}
		} else {
			keys := make([]slotKey, 0, len(s.orphans))
			for k := range s.orphans {
				if s.joining[k] == 0 { // else after the join (joinsEnded)
					keys = append(keys, k)
				}
			}
			if len(keys) > 0 {
				s.cleaning = true
				s.wg.Add(1)
				go s.deleteOrphans(keys)
			}
		}
	}
	for s.events.Len() > 0 {
		e := s.events[0]
		if now.Before(e.at) {
			if e.at.Before(next) {
				next = e.at
			}
			break
		}
		heap.Pop(&s.events)
		if e.tomb {
			if t, ok := s.released[e.name]; ok && !now.Before(t.until) {
				delete(s.released, e.name)
			}
			continue
		}
		h := s.held[e.name]
		if h == nil || h != e.h || h.gen != e.gen || h.expiring {
			continue // released, refreshed or being expired
		}
		if h.refreshing > 0 {
			// A refresh that began before the deadline decides; look again
			// when it is done (it reschedules).
			continue
		}
		h.expiring = true
		s.wg.Add(1)
		go s.expire(e.name, h)
	}
	return next
}

// expire deletes a lock whose deadline passed without a refresh, if it is
// still as this store wrote it, trying until etcd answers: the session
// lease frees it only if nothing else keeps the session alive, and other
// locks of the store do (defect 14). Refreshes meanwhile find it lost.
func (s *EtcdStore) expire(name string, h *holding) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		s.dropLocked(name, h)
		s.mu.Unlock()
	}()
	warned := false
	s.untilAnswered(10*time.Second, func(ctx context.Context) bool {
		s.mu.Lock() // a hand-over may book it unsure meanwhile (unsureLocked)
		op := etcdOp{kind: opExpire, name: name, id: h.id, modRev: h.modRev, plain: h.plain}
		unsure, prevModRev := h.unsure, h.prevModRev
		if unsure {
			op.lease = h.sess.id
		}
		s.mu.Unlock()
		_, err := s.gc.Do(clientv3.WithRequireLeader(ctx), name, op)
		if errors.Is(err, errHeld) && unsure && prevModRev != 0 {
			// Not on this session (a take-over that did not commit), or
			// held by this lease id there no longer: as written before?
			op.lease, op.modRev = 0, prevModRev
			_, err = s.gc.Do(clientv3.WithRequireLeader(ctx), name, op)
		}
		if err == nil || errors.Is(err, errHeld) {
			return true // deleted, or no longer as this store wrote it
		}
		if !warned {
			warned = true
			s.log.Warn("could not delete an expired lock; trying again until etcd answers", "lock", name, "err", err,
				"hint", "check the network to etcd and etcd's health")
		}
		return false
	})
}

// Group commit of creates and deletes.

// commitCounted is the group commit's Commit: commit, counting the batches
// in flight for Stats.
func (s *EtcdStore) commitCounted(batch []*groupcommit.Request[etcdOp]) {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for m := s.maxInflight.Load(); n > m && !s.maxInflight.CompareAndSwap(m, n); m = s.maxInflight.Load() {
	}
	s.commit(batch)
}

// commit sends one batch as one Txn: a nested Txn per lock, so that each
// succeeds or fails alone. A batch of one is a plain Txn. A batch with
// creates goes through the issuer, which makes their token.
func (s *EtcdStore) commit(batch []*groupcommit.Request[etcdOp]) {
	ctx, cancel := groupcommit.Context(batch, 10*time.Second)
	defer cancel()
	ctx = clientv3.WithRequireLeader(ctx)
	err := s.commitTxn(ctx, batch)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// A session expired before the store knew (a long pause, or a
		// partition): its locks are gone. Give the creates fresh sessions
		// and send the batch once more.
		if batch = s.resession(ctx, batch); len(batch) == 0 {
			return
		}
		err = s.commitTxn(ctx, batch)
	}
	var tooMany bool
	if err != nil {
		tooMany = errors.Is(err, rpctypes.ErrTooManyOps)
	}
	if tooMany && len(batch) > 1 {
		// The server takes fewer operations per Txn than we thought:
		// halve the bound and send each half, so no caller fails.
		s.gc.SetMaxBatch(max(1, len(batch)/2))
		s.log.Info("etcd refused a batch as too large; batches halved", "size", len(batch), "max_batch", max(1, len(batch)/2),
			"hint", "etcd's --max-txn-ops is below fenced's batch bound; raise it or lower the bound (WithEtcdMaxBatch)")
		s.commit(batch[:len(batch)/2])
		s.commit(batch[len(batch)/2:])
		return
	}
	if err != nil {
		for _, r := range batch {
			r.Done(nil, err)
		}
	}
}

// resession marks the sessions of the batch's creates lost and gives each
// create a new one, for its lock and for the queue key it may join;
// creates that cannot get one are answered and dropped.
func (s *EtcdStore) resession(ctx context.Context, batch []*groupcommit.Request[etcdOp]) []*groupcommit.Request[etcdOp] {
	s.mu.Lock()
	for _, r := range batch {
		if r.Arg.kind == opCreate {
			s.sessionLostLocked(r.Arg.sess)
		}
	}
	s.mu.Unlock()
	kept := batch[:0]
	for _, r := range batch {
		if r.Arg.kind == opCreate {
			sess, err := s.sessionFor(ctx, r.Arg.ttl, r.Arg.start)
			if err != nil {
				r.Done(nil, err)
				continue
			}
			r.Arg.sess = sess
			if r.Arg.waiterSess != nil {
				// A queue key on the lost session would fail the Txn
				// again, and every create batched with it (defect 13).
				r.Arg.waiterSess = sess
			}
		}
		kept = append(kept, r)
	}
	return kept
}

// sessionLostLocked marks a session etcd no longer knows, and drops the
// locks on it: etcd deleted their keys. Called with mu.
func (s *EtcdStore) sessionLostLocked(sess *session) {
	if sess.dead {
		return
	}
	s.log.Warn("etcd session lease expired: the locks on it are lost",
		"lease", fmt.Sprintf("%x", int64(sess.id)), "locks", sess.users,
		"hint", "the store could not renew it within its TTL: check the network to etcd and etcd's health")
	sess.dead = true
	for name, h := range s.held {
		if h.sess == sess {
			s.dropLocked(name, h)
		}
	}
}

// commitTxn sends the batch and answers its requests, or returns the error
// of the whole Txn without answering them.
func (s *EtcdStore) commitTxn(ctx context.Context, batch []*groupcommit.Request[etcdOp]) error {
	joins := s.joinsSent(batch)
	defer func() { s.joinsEnded(joins) }()
	creates := 0
	for _, r := range batch {
		if r.Arg.kind == opCreate {
			creates++
		}
	}
	if len(batch) == 1 && creates == 0 {
		return s.commitOne(ctx, batch[0])
	}
	// Every token Txn writes the counter key, which every issuer of the
	// keyspace follows (sequencer.Issuer.Follow); but a batch whose
	// creates all find their locks held writes it not, so that waiters on
	// held locks write nothing and make no revision (docs/design.md,
	// defect 213). A lone create writes it in its own branch, with its
	// lock. Several cannot (etcd refuses two puts of one key in sibling
	// Txns): their batch writes it unless every one of their locks is
	// taken, which etcd decides before it applies anything, as it does a
	// create's own compares; a create takes its lock only if it is free.
	// That batch rides in a Txn of its own, so that those compares count
	// against --max-txn-ops beside it, not on top of it.
	wrapped := creates > 1
	then := func(offset uint64) []clientv3.Op {
		ops := make([]clientv3.Op, len(batch))
		var taken []clientv3.Cmp
		for i, r := range batch {
			t := s.opTxn(r.Arg, offset)
			if r.Arg.kind == opCreate {
				if wrapped {
					taken = append(taken, s.ks.LockTaken(r.Arg.name))
				} else {
					t.then = append(t.then, s.ks.CounterPut(offset))
				}
			}
			ops[i] = clientv3.OpTxn(t.cmps, t.then, t.els)
			if r.Arg.kind == opCreate {
				// An attempt abandoned before etcd committed this takes
				// nothing: no lock, no place in the queue (abandon).
				ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version(s.abandonedKey(r.Arg.id)), "=", 0)}, []clientv3.Op{ops[i]}, nil)
			}
		}
		if !wrapped {
			return ops
		}
		return []clientv3.Op{clientv3.OpTxn(nil, ops, nil), clientv3.OpTxn(taken, nil, []clientv3.Op{s.ks.CounterPut(offset)})}
	}
	parts := func(resp *clientv3.TxnResponse) []*pb.ResponseOp {
		if !wrapped {
			return resp.Responses
		}
		return resp.Responses[0].GetResponseTxn().Responses
	}
	var (
		resp *clientv3.TxnResponse
		tok  fence.Token
		err  error
	)
	if creates > 0 {
		// The token counts only if a create of the batch took its lock:
		// a batch whose creates all found their locks held wrote nothing
		// (or only queue places and deletes) and its revision is no token.
		created := func(resp *clientv3.TxnResponse) bool {
			for i, r := range batch {
				if r.Arg.kind == opCreate {
					if sub := createTxn(parts(resp)[i]); sub != nil && sub.Succeeded {
						return true
					}
				}
			}
			return false
		}
		resp, tok, _, err = s.issuer.Issue(ctx, nil, then, created)
	} else {
		resp, err = s.kv.Txn(ctx).Then(then(0)...).Commit()
	}
	// Ended before anyone is answered: a caller told "held" that leaves at
	// once must find its place deletable, not held back by its own join.
	s.joinsEnded(joins)
	joins = nil
	if err != nil && !errors.Is(err, sequencer.ErrRestored) {
		return err
	}
	s.txns.Add(1)
	s.ops.Add(uint64(len(batch)))
	restored := errors.Is(err, sequencer.ErrRestored)
	resps := parts(resp)
	for i, r := range batch {
		sub := resps[i].GetResponseTxn()
		if r.Arg.kind == opCreate {
			if sub = createTxn(resps[i]); sub == nil {
				// Abandoned: only a Txn sent again after its caller gave up
				// meets its mark, and nobody waits for its answer.
				r.Done(heldResult{}, errHeld)
				continue
			}
		}
		s.answer(ctx, r, sub.Succeeded, sub.Responses, tok, resp.Header.Revision, restored)
	}
	return nil
}

// createTxn is a create's own Txn in the batch's response, inside the
// guard of its abandoned mark; nil if the mark stopped it.
func createTxn(r *pb.ResponseOp) *pb.TxnResponse {
	guard := r.GetResponseTxn()
	if !guard.GetSucceeded() {
		return nil
	}
	return guard.Responses[0].GetResponseTxn()
}

// joinsSent marks the queue joins the batch is about to send as in flight,
// so that the store deletes no orphaned place of theirs before they end: a
// delete that reached etcd before a join let the join make the key again,
// and nobody deleted it then; it stood ahead of every fair waiter of the
// lock, in every process, for as long as the store's session lived
// (defect 82). A join whose caller left before it was sent (its place
// orphaned or forgotten) is not sent. Returns the slots marked.
func (s *EtcdStore) joinsSent(batch []*groupcommit.Request[etcdOp]) []slotKey {
	joins := func(op *etcdOp) bool { return op.kind == opCreate && op.placed && op.waiterRev == 0 }
	if !slices.ContainsFunc(batch, func(r *groupcommit.Request[etcdOp]) bool { return joins(&r.Arg) }) {
		return nil // most batches: no lock taken on the way
	}
	var sent []slotKey
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range batch {
		op := &r.Arg
		if !joins(op) {
			continue
		}
		if p, ok := s.places[placeKey{op.name, op.waiter}]; !ok || p.slot != op.waiterSlot {
			op.placed = false // asks whether the lock is free, and nothing more
			continue
		}
		k := slotKey{op.name, op.waiterSlot}
		s.joining[k]++
		sent = append(sent, k)
	}
	return sent
}

// joinsEnded ends what joinsSent marked, once the Txn has an answer or an
// error: an orphaned place whose join has ended is deleted now.
func (s *EtcdStore) joinsEnded(sent []slotKey) {
	if len(sent) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range sent {
		if s.joining[k]--; s.joining[k] > 0 {
			continue
		}
		delete(s.joining, k)
		if s.orphans[k] {
			s.startLoopLocked()
			s.poke()
		}
	}
}

// commitOne sends a batch of one release or expiry as a plain Txn. (A
// create always goes nested through the issuer: an Else of the issuer's
// Txn also runs when only its floor guard failed, so it must not hold a
// create's queue join.)
func (s *EtcdStore) commitOne(ctx context.Context, r *groupcommit.Request[etcdOp]) error {
	t := s.opTxn(r.Arg, 0)
	resp, err := s.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	if err != nil {
		return err
	}
	s.txns.Add(1)
	s.ops.Add(1)
	s.answer(ctx, r, resp.Succeeded, resp.Responses, 0, resp.Header.Revision, false)
	return nil
}

// opTxnParts is one request's part of a Txn.
type opTxnParts struct {
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

// opTxn is one request's compares and operations. A create of a fair
// waiter takes the lock only if it is free and the waiter heads the queue
// (or the queue is empty and it has no place yet); otherwise it joins the
// queue (if op.placed), or checks that its place is still there. A holder's
// create reads the lock when it is held, to see whether it holds it
// already. A release of a reentrant lock (one with a count) only reads its
// count; the caller counts down.
func (s *EtcdStore) opTxn(op etcdOp, offset uint64) opTxnParts {
	name := op.name
	switch op.kind {
	case opCreate:
		t := opTxnParts{
			cmps: []clientv3.Cmp{s.ks.LockFree(name)},
			then: s.ks.PutLock(name, op.id, op.sess.id, sequencer.LockInfo{Offset: offset, Owner: op.owner, Holder: op.holder, Waiter: op.rejoinAs}),
		}
		switch {
		case op.waiter == "":
		case op.waiterRev == 0:
			t.cmps = append(t.cmps, s.ks.QueueEmpty(name))
			if op.placed {
				// Join: the place, and how many are in the queue with it
				// (its position, as it is the newest).
				t.els = append(t.els, s.ks.JoinQueue(op.waiterKey, op.waiterSess.id, op.start),
					clientv3.OpGet(op.waiterKey),
					clientv3.OpGet(s.ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly()))
			}
		default:
			// Still waiting: is the place there, and which are at or
			// ahead of it. Their keys, not a count: etcd counts a range
			// before its revision filters, so a count-only range said the
			// whole queue's length, and the head thought itself last
			// (etcd-io/etcd#18267; docs/design.md, defect 245).
			t.cmps = append(t.cmps, s.ks.QueueHeadIs(name, op.waiterRev))
			t.then = append(t.then, clientv3.OpDelete(op.waiterKey))
			t.els = append(t.els, clientv3.OpGet(op.waiterKey, clientv3.WithCountOnly()),
				clientv3.OpGet(s.ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(op.waiterRev)))
		}
		if op.holder != "" || op.rejoinAs != "" {
			// Read the lock when it is held: this holder's to reenter, or
			// this waiter's grant whose answer was lost.
			t.els = append(t.els, s.ks.GetLock(name)...)
		}
		return t
	case opExpire:
		del := s.ks.DeleteLock(name)
		if op.plain {
			del = s.ks.DeletePlainLock(name)
		}
		as := clientv3.Compare(clientv3.ModRevision(s.ks.LockKey(name)), "=", op.modRev)
		if op.lease != 0 {
			as = clientv3.Compare(clientv3.LeaseValue(s.ks.LockKey(name)), "=", op.lease)
		}
		return opTxnParts{cmps: append(s.ks.LockHeldBy(name, op.id), as), then: del}
	case opDelete:
		if op.plain {
			// A lock with no reentrant holder is never reentered: no count
			// to check, and no count key to delete.
			return opTxnParts{cmps: s.ks.LockHeldBy(name, op.id), then: s.ks.DeletePlainLock(name)}
		}
		fallthrough
	default:
		return opTxnParts{
			cmps: s.ks.LockHeldBy(name, op.id),
			then: []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{s.ks.NotReentered(name)}, s.ks.DeleteLock(name), s.ks.GetLock(name))},
		}
	}
}

// answer tells a request what its part of the Txn did, and books it: a
// created lock's deadline is enforced from here, even if its caller left.
// resps are the responses of the branch that ran. A create whose token does
// not exceed one issued before (etcd went back) is deleted again and
// answered ErrRestored (with errUndeleted if that delete failed).
func (s *EtcdStore) answer(ctx context.Context, r *groupcommit.Request[etcdOp], ok bool, resps []*pb.ResponseOp, tok fence.Token, rev int64, restored bool) {
	op := r.Arg
	switch {
	case !ok && op.kind == opCreate:
		r.Done(s.heldResult(op, resps), errHeld)
	case !ok:
		r.Done(nil, errHeld)
	case op.kind == opDelete:
		if inner := resps[0].GetResponseTxn(); inner != nil && !inner.Succeeded {
			// Reentrant: the caller counts down.
			lk, _, _ := s.ks.ParseLock(inner.Responses[0].GetResponseRange(), inner.Responses[1].GetResponseRange())
			r.Done(countOf(lk), nil)
			return
		}
		s.mu.Lock()
		s.releasedLocked(op.name, op.id)
		s.mu.Unlock()
		r.Done(nil, nil)
	case op.kind == opExpire:
		r.Done(nil, nil)
	case restored:
		if _, err := s.kv.Txn(ctx).If(s.ks.LockHeldBy(op.name, op.id)...).Then(s.ks.DeleteLock(op.name)...).Commit(); err != nil {
			r.Done(nil, fmt.Errorf("%w: %w: %w", errUndeleted, sequencer.ErrRestored, err))
			return
		}
		r.Done(nil, sequencer.ErrRestored)
	default:
		granted, _ := s.hold(op.name, op.id, tok, rev, op.sess, op.start, op.ttl, op.holder == "", 1, 0)
		r.Done(createResult{token: tok, modRev: rev, granted: granted}, nil)
	}
}

// heldResult reads the Else branch of a create that did not take the lock
// (see opTxn).
func (s *EtcdStore) heldResult(op etcdOp, resps []*pb.ResponseOp) heldResult {
	var hr heldResult
	i := 0
	switch {
	case !op.placed: // no waiter, or one that asked without its place
	case op.waiterRev == 0:
		if kvs := resps[1].GetResponseRange().GetKvs(); len(kvs) == 1 {
			hr.joinedRev, hr.joinedSess = kvs[0].CreateRevision, op.waiterSess
		}
		hr.position = int(resps[2].GetResponseRange().GetCount())
		i = 3
	default:
		hr.placeLost = resps[0].GetResponseRange().GetCount() == 0
		if !hr.placeLost {
			hr.position = len(resps[1].GetResponseRange().GetKvs())
		}
		i = 2
	}
	if (op.holder != "" || op.rejoinAs != "") && len(resps) >= i+2 {
		var err error
		hr.cur, hr.curHeld, err = s.ks.ParseLock(resps[i].GetResponseRange(), resps[i+1].GetResponseRange())
		hr.curHeld = hr.curHeld && err == nil
	}
	return hr
}
