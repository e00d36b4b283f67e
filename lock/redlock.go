package lock

import (
	"context"
	"errors"
	"fmt"
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

// RedlockStore holds a lease on a majority of independent Redis nodes
// (Redlock), so that a minority of them failing frees no lock. It takes one
// token per grant from the sequencer, like RedisStore, and runs the same
// steps on each node (take, confirm, release: safe to run twice); the
// token, not the quorum, is what keeps a resource safe when a majority
// restarts without persistence or a pause outlives the lease.
//
// A node that may have lost leases it took takes no lease, and extends
// none, until every lease it may have forgotten is over: the longest TTL
// of the other nodes' <prefix>horizon keys (of as many as it takes:
// recover), read when it is first found without a <prefix>epoch key set
// by the very server process that answers (RecoveringError meanwhile;
// docs/design.md, defects 103, 178, 201). The epoch names that process's
// run_id, new at each start and a replica's own: so a restart, with or
// without persistence, a failover to a replica (Sentinel, or an address
// moved), and a flush all make the node wait. Persistence
// does not shorten the wait: an RDB snapshot, an AOF fsynced every second
// or a replica that lagged still has the epoch, written long before, but
// may miss the latest leases, and voting at once would hand a lease held
// on a bare majority with the node to a second holder. An epoch written
// before it named a run_id counts as none: each node waits once after an
// upgrade. The wait needs all but a majority less one of the other nodes
// to answer, so a new deployment with a node down takes no lock until it
// answers. A holder whose lease was on a bare majority with the node
// loses it. A Redlock with a node that is a Cluster or Ring client keeps
// no epochs and is not covered.
//
// Each node call is bounded by the node timeout, so a dead node costs at
// most that much per operation (a List, which makes a call per lock, that
// much per call). Give the clients ContextTimeoutEnabled, as RedisStore
// asks: without it a caller still stops waiting for a node at the node
// timeout (every call but one is a script, which goes through the node's
// pipelines, and a Watch stops waiting for a subscription), but List's
// SCAN waits out go-redis's read timeout.
type RedlockStore struct {
	nodes       []*RedisStore
	seq         sequencer.Sequencer
	quorum      int
	nodeTimeout time.Duration

	// cleanups are the best-effort cleanups that outlive the failed
	// acquisition that started them (abandon, cleanup.go); Close waits
	// for them.
	cleanups
}

var _ LeaseStore = (*RedlockStore)(nil)

// NodeError is the failure of one Redlock node, by its index in the list
// given to NewRedlockStore.
type NodeError struct {
	Node int
	Err  error
}

func (e *NodeError) Error() string { return fmt.Sprintf("node %d: %v", e.Node, e.Err) }

// Unwrap returns the cause.
func (e *NodeError) Unwrap() error { return e.Err }

// QuorumError says that fewer than a majority of the nodes answered. It
// unwraps to each failed node's *NodeError.
type QuorumError struct {
	Op          string
	OK, Need, N int
	Nodes       []error // *NodeError, one per failed node
}

func (e *QuorumError) Error() string {
	return fmt.Sprintf("lock: Redlock %s: quorum not reached: %d of %d nodes answered, %d needed: %v", e.Op, e.OK, e.N, e.Need, errors.Join(e.Nodes...))
}

// Unwrap returns the nodes' errors.
func (e *QuorumError) Unwrap() []error { return e.Nodes }

// RedlockOption configures a RedlockStore.
type RedlockOption func(*RedlockStore) error

// WithNodeTimeout bounds each call to one node. Default 50ms; allowed 1ms
// to 10s. Keep it well below the TTL: the time it takes counts against
// the lease's validity.
func WithNodeTimeout(d time.Duration) RedlockOption {
	return func(s *RedlockStore) error {
		if d < time.Millisecond || d > 10*time.Second {
			return fmt.Errorf("lock: node timeout %s: want 1ms to 10s", d)
		}
		s.nodeTimeout = d
		return nil
	}
}

// NewRedlockStore returns a store on independent Redis nodes (at least 3,
// an odd number is best) with tokens from seq. Keys are as in RedisStore,
// on every node. Close stops the notification subscribers; it does not
// close the clients or seq.
//
// The nodes must be distinct Redis servers: a majority that is one server
// twice is lost with that server. NewRedlockStore refuses two nodes it can
// tell share a server, naming both, by what the clients were given (it
// asks no server, so that it works while a minority is down):
//
//   - a *redis.Client: its network and address (Options().Addr). Not its
//     database: two databases of one server fail together. In a TCP
//     address the hosts localhost, 127.0.0.1, ::1 and an empty host are
//     taken as one (this machine's loopback), IP addresses are compared as
//     addresses and host names without regard to case; other names are
//     not resolved, so two names of one host, or a proxy in front of a
//     node, go unseen.
//   - a *redis.ClusterClient or *redis.Ring: each of its addresses
//     (ClusterOptions.Addrs, the seeds; RingOptions.Addrs, the shards),
//     refused if another node has one of them. Two seed lists that do not
//     overlap may still reach one cluster.
//   - a Sentinel failover client (redis.NewFailoverClient), or any other
//     implementation: only the same client given twice. Its master's
//     address is known only once it has asked the sentinels.
func NewRedlockStore(nodes []redis.UniversalClient, seq sequencer.Sequencer, opts ...RedlockOption) (*RedlockStore, error) {
	if len(nodes) < 3 {
		return nil, fmt.Errorf("lock: Redlock needs at least 3 independent Redis nodes, got %d", len(nodes))
	}
	if seq == nil {
		return nil, errors.New("lock: NewRedlockStore needs a sequencer")
	}
	if err := distinctServers(nodes); err != nil {
		return nil, err
	}
	s := &RedlockStore{seq: seq, quorum: len(nodes)/2 + 1, nodeTimeout: 50 * time.Millisecond}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	for i, rdb := range nodes {
		n, err := NewRedisStore(rdb, seq)
		if err != nil {
			return nil, fmt.Errorf("lock: Redlock node %d: %w", i, err)
		}
		n.callTimeout = s.nodeTimeout
		s.nodes = append(s.nodes, n)
	}
	// A Cluster's or Ring's keys of a node live on several servers, and a
	// script takes keys of one slot: such a node keeps no epoch or
	// horizon, and without every node's horizon no node can recover.
	for _, rdb := range nodes {
		if _, one := rdb.(*redis.Client); !one {
			return s, nil
		}
	}
	for _, n := range s.nodes {
		n.epochKey, n.horizonKey = n.prefix+"epoch", n.prefix+"horizon"
	}
	return s, nil
}

// outcome is what one operation did on every node.
type outcome struct {
	op   string
	errs []error // per node: nil, a *NodeError, or a non-node error such as ErrLost
}

// each runs f on every node at once, each call bounded by the node timeout.
// A backend failure of a node is recorded as its *NodeError.
func (s *RedlockStore) each(ctx context.Context, op string, f func(ctx context.Context, i int, n *RedisStore) error) outcome {
	o := outcome{op: op, errs: make([]error, len(s.nodes))}
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, s.nodeTimeout)
			defer cancel()
			o.errs[i] = f(nctx, i, n)
		}()
	}
	wg.Wait()
	return o
}

// count is how many nodes succeeded, and how many said err (errors.Is).
func (o outcome) count(err error) (ok, is int) {
	for _, e := range o.errs {
		switch {
		case e == nil:
			ok++
		case err != nil && errors.Is(e, err):
			is++
		}
	}
	return ok, is
}

// nodeFailed reports whether a node failed without an answer (its reply
// may be lost).
func (o outcome) nodeFailed() bool {
	for _, e := range o.errs {
		var ne *NodeError
		if errors.As(e, &ne) {
			return true
		}
	}
	return false
}

// errNotOnNode is a node's answer that the lease is not held there. It is
// not ErrLost, which a minority of such answers does not decide: the lease
// may be on a majority that did not all answer (defect 99).
var errNotOnNode = errors.New("the lease is not held on this node")

// quorumErr is the error of an operation that did not reach a majority
// for lack of answers. It matches none of the nodes' answers that the
// lease is lost there: undecided, it is not ErrLost.
func (s *RedlockStore) quorumErr(o outcome) error {
	ok, _ := o.count(nil)
	q := &QuorumError{Op: o.op, OK: ok, Need: s.quorum, N: len(s.nodes)}
	for i, e := range o.errs {
		if e != nil {
			var ne *NodeError
			switch {
			case errors.Is(e, ErrLost):
				ne = &NodeError{Node: i, Err: errNotOnNode}
			case !errors.As(e, &ne):
				ne = &NodeError{Node: i, Err: e}
			}
			q.Nodes = append(q.Nodes, ne)
		}
	}
	return backendErr("redlock", o.op, q)
}

func nodeErr(i int, err error) error {
	if err == nil {
		return nil
	}
	return &NodeError{Node: i, Err: err}
}

// Acquire implements LeaseStore: the lease on a majority, one token, and a
// confirm on a majority. Fair waiters queue on every node, and a granted
// one leaves the queues of the nodes that did not grant it
// (leaveQueues); a holder that reenters must do so on a majority.
func (s *RedlockStore) Acquire(ctx context.Context, req AcquireRequest) (Grant, error) {
	takes := make([]taken, len(s.nodes))
	var recovered atomic.Bool // a node that lost its data may take leases now
	take := func(ctx context.Context, i int, n *RedisStore) error {
		t, err := n.take(ctx, req)
		if err == nil && t.fresh {
			var wait time.Duration
			if wait, err = s.recover(ctx, i); err == nil {
				if wait == 0 {
					recovered.Store(true)
				}
				t.held = wait
			}
		}
		if err != nil {
			return nodeErr(i, err)
		}
		if t.recovering {
			return &NodeError{Node: i, Err: &RecoveringError{Wait: t.held}}
		}
		if t.inProgress {
			return &NodeError{Node: i, Err: ErrInProgress}
		}
		takes[i] = t
		if t.reentry {
			return errReentered
		}
		if !t.ok {
			return &HeldError{Remaining: t.held, Position: t.position}
		}
		return nil
	}
	o := s.each(ctx, "acquire", take)
	if ok, _ := o.count(nil); ok < s.quorum && recovered.Load() {
		// Nodes that had never held a lock (fenced's first acquisition on
		// them) are set to take leases at once: ask again. Not at once in
		// take: another node's horizon would then count this very lease.
		o = s.each(ctx, "acquire", take)
	}
	if _, re := o.count(errReentered); re >= s.quorum {
		if ok, _ := o.count(nil); ok > 0 || o.nodeFailed() {
			// The attempt took a lease of its own where the lock was
			// free, and may have where a node did not answer: the
			// holder's lease is the grant, and nobody would release
			// that one (docs/design.md, defect 204).
			s.abandon(ctx, req, false)
		}
		s.leaveQueues(ctx, req, o)
		return s.reentered(req, takes, o), nil
	}
	if ok, _ := o.count(nil); ok < s.quorum {
		s.abandon(ctx, req, false)
		if _, re := o.count(errReentered); re > 0 || o.nodeFailed() {
			s.unreenter(ctx, req)
		}
		if err := ctx.Err(); err != nil {
			return Grant{}, err
		}
		// Held somewhere: wait like any waiter. Held nowhere: the nodes
		// did not answer, which waiting will not fix.
		var held *HeldError
		pos := 0 // the waiter's best place on any node, 1 where the lock was its to take
		for i, err := range o.errs {
			if errors.Is(err, ErrNotAcquired) && (held == nil || takes[i].held < held.Remaining) {
				held = &HeldError{Remaining: takes[i].held}
			}
			p := takes[i].position
			if err == nil && req.Waiter != "" {
				p = 1
			}
			if (err == nil || errors.Is(err, ErrNotAcquired)) && p > 0 && (pos == 0 || p < pos) {
				pos = p
			}
		}
		if held == nil {
			return Grant{}, s.quorumErr(o)
		}
		// A waiter at the head of one node's queue keeps the retry
		// strategy's pace: heads that disagree are settled by attempts,
		// not by notifications (see Client.acquire).
		held.Position = pos
		return Grant{}, held
	}
	tok, err := s.seq.Next(ctx, req.Name)
	if err != nil {
		s.abandon(ctx, req, false)
		return Grant{}, backendErr("etcd", "token", err)
	}
	confirmed := s.each(ctx, "confirm", func(ctx context.Context, i int, n *RedisStore) error {
		ok, err := n.confirm(ctx, req, tok)
		if err != nil {
			return nodeErr(i, err)
		}
		if !ok {
			return ErrLost
		}
		return nil
	})
	if ok, _ := confirmed.count(nil); ok < s.quorum {
		s.abandon(ctx, req, true)
		return Grant{}, ErrLost
	}
	s.leaveQueues(ctx, req, o)
	return Grant{Token: tok, TTL: req.TTL, LeaseID: req.LeaseID, Count: 1}, nil
}

var errReentered = errors.New("lock: reentered")

// RecoveringError is a Redlock node's answer while it sits out after it
// may have lost leases (a restart, with or without persistence, a failover
// to a replica, a flush): it takes no lease until every lease it may have
// forgotten is over, Wait from now (0: not known yet). Until then the
// lease it forgot may still be held on a bare majority with it, which
// another client could otherwise complete with this node and a free one
// (docs/design.md, defect 103).
type RecoveringError struct {
	Wait time.Duration
}

func (e *RecoveringError) Error() string {
	if e.Wait <= 0 {
		return "may have lost leases (restarted, failed over or flushed): it takes no lease until enough of the other nodes say how long their leases last"
	}
	return fmt.Sprintf("may have lost leases (restarted, failed over or flushed): it takes no lease for %s more, until every lease it may have forgotten is over", e.Wait.Round(time.Millisecond))
}

// recover sets node i, which may have lost leases, to take leases again
// once every lease it may have forgotten is over: after the longest
// horizon of the other nodes (each outlives every lease its node took).
// The epoch it sets names the node's server process (recover.lua). A
// forgotten lease is on a majority with node i; the horizon of one of
// that majority's others must be read, so all but quorum-1 of the other
// nodes must answer; any that many will do, so it reads no more once
// they have: a node that does not answer then leaves the epoch write the
// rest of the node timeout, which the read of a frozen node used to use
// up (docs/design.md, defect 201). On nodes that never held a lock the
// wait is 0. It returns the wait, or a RecoveringError when it cannot set
// it.
func (s *RedlockStore) recover(ctx context.Context, i int) (time.Duration, error) {
	need := len(s.nodes) - s.quorum + 1
	// Reads the caller may leave when it cancels them (LeaveOnCancel):
	// none runs on this goroutine, where a client could hold it to its
	// deadline or past (groupcommit; defect 202).
	rctx, enough := context.WithCancel(groupcommit.LeaveOnCancel(ctx))
	defer enough()
	var (
		mu       sync.Mutex
		answered int
		wait     time.Duration
		wg       sync.WaitGroup
	)
	for j, n := range s.nodes {
		if j != i {
			wg.Go(func() {
				ms, err := n.pttl(rctx, n.horizonKey)
				if err != nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				answered, wait = answered+1, max(wait, time.Duration(ms)*time.Millisecond)
				if answered == need {
					enough()
				}
			})
		}
	}
	wg.Wait()
	if answered < need {
		return 0, &RecoveringError{}
	}
	if wait > 0 {
		// The nodes' clocks may run at different rates, as a validity allows.
		wait += Drift(wait)
	}
	if err := s.nodes[i].run(ctx, recoverScript, []string{s.nodes[i].epochKey}, wait.Milliseconds()).Err(); err != nil {
		return 0, &RecoveringError{} // it sits out until the next acquisition sets the epoch
	}
	return wait, nil
}

// reentered grants a lease its holder took again on a majority. Each
// node's script extended the lease (never shortened it) as it counted the
// reentry: no second step that could fail after the count went up and
// leave the holder's last release short of freeing the lock (defect 19).
func (s *RedlockStore) reentered(req AcquireRequest, takes []taken, o outcome) Grant {
	var t taken
	for i, err := range o.errs {
		if errors.Is(err, errReentered) {
			t = takes[i]
			break
		}
	}
	return Grant{Token: t.token, TTL: req.TTL, LeaseID: t.leaseID, Count: t.count}
}

// abandon frees req's lease, on every node that took it, when the
// acquisition did not get it: too few nodes took it (contention, or nodes
// that did not answer), its token could not be taken, or too few nodes
// confirmed it (confirmed). It is so that others need not wait for the
// lease to expire (it expires anyway). As in RedisStore.abandon, only
// req's attempt knows its lease id and a release of it changes nothing
// else, so the release need not come before the caller's error: it runs
// on a goroutine of the store (afterwards), and the error returns when
// the acquisition is decided, not after the nodes answered the release
// (up to the node timeout, or cleanupTimeout, later: defect 127). A node
// that does not answer is asked again, and one that runs the attempt's
// acquire script late then takes nothing (RedisStore.abandonLease, defect
// 145).
//
// But a confirm (confirmed) records, on each node where it ran (its reply
// lost or not), the grant for a remote acquisition (Rejoin), whose next
// request those nodes hand that very lease (acquire.lua), as a reentry,
// and a majority of them as a grant: a release after that request would
// free the lock under the holder it was handed to. Then the release comes
// first, as in RedisStore.abandon, each node bounded by the node timeout
// and all by cleanupTimeout past the caller's end.
func (s *RedlockStore) abandon(ctx context.Context, req AcquireRequest, confirmed bool) {
	// Nodes that answered are not asked again.
	answered := make([]bool, len(s.nodes))
	s.cleanups.abandon(ctx, confirmed && req.Rejoin != "", abandonWindow(req.TTL), func(ctx context.Context) error {
		o := s.each(ctx, "abandon", func(ctx context.Context, i int, n *RedisStore) error {
			if answered[i] {
				return nil
			}
			if err := n.abandonLease(ctx, req.Name, req.LeaseID, req.TTL); err != nil {
				return nodeErr(i, err)
			}
			answered[i] = true
			return nil
		})
		return errors.Join(o.errs...)
	})
}

// leaveQueues gives up, after a grant (or a reentry) to a fair waiter,
// its place in the queue of every node that did not grant it: one where
// another lease held the lock queued it, and one that did not answer may
// have. A node that grants the lock, or counts a reentry, takes the
// waiter's place off itself (acquire.lua); the others kept it for the
// waiter TTL, at the head of their queue, where it took the lock from
// every later fair waiter: with a node down, the free lock went to nobody
// for 3.5 s (docs/design.md, "Fair waiting", and defect 203). A leave by
// the head of a free lock's queue wakes the next waiter (leave.lua).
// The leave is best-effort and only frees sooner what expires anyway: it
// runs as abandon's release does, on a goroutine of the store, asking a
// node that does not answer again for up to the waiter TTL.
func (s *RedlockStore) leaveQueues(ctx context.Context, req AcquireRequest, o outcome) {
	if req.Waiter == "" {
		return
	}
	done := make([]bool, len(s.nodes)) // no place there, or left
	queued := false
	for i, err := range o.errs {
		done[i] = !mayHavePlace(err)
		queued = queued || !done[i]
	}
	if !queued {
		return
	}
	s.cleanups.abandon(ctx, false, req.WaiterTTL, func(ctx context.Context) error {
		o := s.each(ctx, "leave", func(ctx context.Context, i int, n *RedisStore) error {
			if done[i] {
				return nil
			}
			if err := n.Leave(ctx, req.Name, req.Waiter); err != nil {
				return nodeErr(i, err)
			}
			done[i] = true
			return nil
		})
		return errors.Join(o.errs...)
	})
}

// mayHavePlace reports whether a node's answer to a fair attempt, err,
// may have left the waiter a place in its queue: it said held, or gave no
// answer. A grant and a reentry take the place off; a node recovering, or
// an attempt in progress, is answered before the queue is looked at.
func mayHavePlace(err error) bool {
	var (
		ne  *NodeError
		rec *RecoveringError
	)
	switch {
	case err == nil, errors.Is(err, errReentered):
		return false
	case errors.Is(err, ErrNotAcquired):
		return true
	}
	return errors.As(err, &ne) && !errors.As(ne.Err, &rec) && !errors.Is(ne.Err, ErrInProgress)
}

// unreenter takes off, on every node, the hold that req's acquire scripts
// may have counted as a reentry that the store did not grant (a node's
// reply lost, or too few nodes reentered): see RedisStore.unreenter. Like
// it, and unlike abandon's release, it runs before the failed acquire
// returns, for its order matters: the holder's release, or an attempt
// sent again with the same mark, that came first would leave the holder
// one release short, as RedisStore.unreenter says. The nodes run at once,
// each bounded by cleanupTimeout (RedisStore.unreenter's own, not the
// node timeout): up to cleanupTimeout past the caller's end in all.
func (s *RedlockStore) unreenter(ctx context.Context, req AcquireRequest) {
	if req.Holder == "" {
		return
	}
	s.each(context.WithoutCancel(ctx), "unreenter", func(ctx context.Context, _ int, n *RedisStore) error {
		n.unreenter(ctx, req)
		return nil
	})
}

// lostOrQuorum decides an operation that did not reach a majority: ErrLost
// when enough nodes said so that no majority can hold the lease, else the
// quorum error.
func (s *RedlockStore) lostOrQuorum(o outcome) error {
	if _, lost := o.count(ErrLost); lost > len(s.nodes)-s.quorum {
		return ErrLost
	}
	return s.quorumErr(o)
}

// Refresh implements LeaseStore: the lease must still be on a majority.
// A node that applied a later refresh first answers ErrOutOfOrder, which
// counts against the majority; a majority of them is ErrOutOfOrder.
func (s *RedlockStore) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (Grant, error) {
	toks := make([]fence.Token, len(s.nodes))
	o := s.each(ctx, "refresh", func(ctx context.Context, i int, n *RedisStore) error {
		g, err := n.Refresh(ctx, name, leaseID, ttl, seq)
		toks[i] = g.Token
		if errors.Is(err, ErrLost) || errors.Is(err, ErrOutOfOrder) {
			return err
		}
		return nodeErr(i, err)
	})
	if ok, _ := o.count(nil); ok < s.quorum {
		if _, late := o.count(ErrOutOfOrder); late >= s.quorum {
			return Grant{}, ErrOutOfOrder
		}
		return Grant{}, s.lostOrQuorum(o)
	}
	var tok fence.Token
	for i, err := range o.errs {
		if err == nil && toks[i] > tok {
			tok = toks[i]
		}
	}
	return Grant{Token: tok, TTL: ttl, LeaseID: leaseID}, nil
}

// Release implements LeaseStore: it deletes the lease wherever it is.
// ErrLost if it was on fewer than a majority of nodes.
//
// Each node answers as RedisStore.Release does: released, "not held" for
// certain (the node remembers every release of the lease id it made, and
// made none), or "not held, and it may have been yours" (ErrMaybeReleased:
// its memory of releases is full). The lease was lost before for certain
// only when more nodes than a minority are certain: the nodes that may
// have held it until a release of it (those that said released or maybe,
// or did not answer) are then fewer than a majority, so no majority held
// it when its first release was sent. Otherwise an earlier attempt of this
// release, whose answer was lost, may have released it on a majority that
// has since forgotten: ErrLost carries ErrMaybeReleased, which
// Lease.Release forgives after such an attempt, as on one node. Counting
// a "maybe" as certain would tell a holder that released in time that
// another may have written beside it; counting every mixed answer as
// maybe would forgive a lease that was on one node only.
func (s *RedlockStore) Release(ctx context.Context, name, leaseID, op string) error {
	if op == "" {
		var err error
		if op, err = newLeaseID(); err != nil {
			return err
		}
	}
	o := s.each(ctx, "release", func(ctx context.Context, i int, n *RedisStore) error {
		lost, err := n.release(ctx, name, leaseID, op)
		if err != nil {
			return nodeErr(i, err)
		}
		return lost
	})
	if ok, _ := o.count(nil); ok >= s.quorum {
		return nil
	}
	err := s.lostOrQuorum(o)
	if errors.Is(err, ErrLost) && !s.lostForCertain(o) {
		return errLostMaybeReleased
	}
	return err
}

// lostForCertain reports whether more nodes than a minority answered a
// release "not held" for certain, without ErrMaybeReleased (Release).
func (s *RedlockStore) lostForCertain(o outcome) bool {
	_, lost := o.count(ErrLost)
	_, maybe := o.count(ErrMaybeReleased)
	return lost-maybe > len(s.nodes)-s.quorum
}

// Inspect implements LeaseStore: held when a majority agree on a lease id.
// The waiters are the most any node counts.
func (s *RedlockStore) Inspect(ctx context.Context, name string) (State, error) {
	states := make([]State, len(s.nodes))
	o := s.each(ctx, "inspect", func(ctx context.Context, i int, n *RedisStore) error {
		st, err := n.Inspect(ctx, name)
		states[i] = st
		return nodeErr(i, err)
	})
	if ok, _ := o.count(nil); ok < s.quorum {
		return State{}, s.quorumErr(o)
	}
	free := State{Name: name}
	votes := map[string]int{}
	for i, st := range states {
		if o.errs[i] != nil {
			continue
		}
		if st.Waiters > free.Waiters {
			free.Waiters, free.OldestWait = st.Waiters, st.OldestWait
		}
		free.LastToken = max(free.LastToken, st.LastToken)
		if st.Held {
			if votes[st.LeaseID]++; votes[st.LeaseID] >= s.quorum {
				st.Waiters, st.OldestWait = free.Waiters, free.OldestWait
				return st, nil
			}
		}
	}
	return free, nil
}

// Leave implements LeaseStore: the waiter leaves every node's queue.
func (s *RedlockStore) Leave(ctx context.Context, name, waiter string) error {
	o := s.each(ctx, "leave", func(ctx context.Context, i int, n *RedisStore) error { return nodeErr(i, n.Leave(ctx, name, waiter)) })
	if ok, _ := o.count(nil); ok < s.quorum {
		return s.quorumErr(o) // its place expires on the others anyway
	}
	return nil
}

// ForceRelease implements LeaseStore: the lease goes from every node.
// With a token, each node removes the lease only if its token is that one,
// atomically there; the lock was held by the token if any node removed it,
// and by another if a majority say so.
func (s *RedlockStore) ForceRelease(ctx context.Context, name string, token fence.Token) (State, error) {
	before, err := s.Inspect(ctx, name)
	if err != nil {
		return State{}, err
	}
	removed := make([]State, len(s.nodes))
	o := s.each(ctx, "force-release", func(ctx context.Context, i int, n *RedisStore) error {
		st, err := n.ForceRelease(ctx, name, token)
		removed[i] = st
		if errors.Is(err, ErrHeldByOther) {
			return err // an answer, not a node's failure
		}
		return nodeErr(i, err)
	})
	answered, others := 0, map[fence.Token]int{}
	var gone *State
	for i, e := range o.errs {
		var he *HeldByOtherError
		switch {
		case e == nil:
			answered++
			if removed[i].Held && gone == nil {
				gone = &removed[i]
			}
		case errors.As(e, &he):
			answered++
			others[he.Token]++
		}
	}
	if answered < s.quorum {
		return State{}, s.quorumErr(o)
	}
	if token == 0 {
		return before, nil
	}
	if gone != nil {
		if before.Held && before.LeaseID == gone.LeaseID {
			return before, nil // with the owner, count and waiters a majority showed
		}
		return *gone, nil
	}
	for tok, n := range others {
		if n >= s.quorum {
			return State{}, &HeldByOtherError{Name: name, Token: tok, Want: token}
		}
	}
	// Free, or held by another on a minority only: not held.
	return State{Name: name}, nil
}

// List implements LeaseStore: each node's locks in turn, each checked to
// be held on a majority; a lock also on an earlier node was listed with
// that node's. The cursor is the node and that node's own cursor.
func (s *RedlockStore) List(ctx context.Context, req ListRequest) (ListPage, error) {
	node, inner := 0, ""
	if req.Cursor != "" {
		n, c, ok := strings.Cut(req.Cursor, ":")
		i, err := strconv.Atoi(n)
		if !ok || err != nil || i < 0 || i >= len(s.nodes) {
			return ListPage{}, fmt.Errorf("%w: %q: want the next_cursor a previous page returned", ErrInvalidCursor, req.Cursor)
		}
		node, inner = i, c
	}
	var page ListPage
	// down: nodes that did not answer in this call, which it asks no more:
	// each question would cost the node timeout again, for every lock.
	down := make([]bool, len(s.nodes))
	for node < len(s.nodes) {
		p, err := s.nodes[node].List(ctx, ListRequest{Prefix: req.Prefix, Limit: req.Limit - len(page.Locks), Cursor: inner})
		if err != nil && !errors.Is(err, ErrInvalidCursor) {
			// A node that does not answer: its locks are on a majority of the others.
			p, down[node] = ListPage{}, true
		} else if err != nil {
			return ListPage{}, err
		}
		for _, st := range p.Locks {
			if s.onEarlierNode(ctx, node, st.Name, down) {
				continue
			}
			if q, err := s.Inspect(ctx, st.Name); err == nil && q.Held {
				page.Locks = append(page.Locks, q)
			}
		}
		if p.Next != "" {
			page.Next = fmt.Sprintf("%d:%s", node, p.Next)
			return page, nil
		}
		node, inner = node+1, ""
		if len(page.Locks) >= req.Limit && node < len(s.nodes) {
			page.Next = fmt.Sprintf("%d:", node)
			return page, nil
		}
	}
	return page, nil
}

// onEarlierNode reports whether a node before node holds a lease of name,
// and so listed it already. A node down (in this List) listed nothing: it
// is not asked, and one that does not answer is down from then on.
func (s *RedlockStore) onEarlierNode(ctx context.Context, node int, name string, down []bool) bool {
	for i := 0; i < node; i++ {
		if down[i] {
			continue
		}
		nctx, cancel := s.nodes[i].callContext(ctx)
		ms, err := s.nodes[i].pttl(nctx, s.nodes[i].keys(name)[kLease])
		cancel()
		if err != nil {
			down[i] = true
		} else if ms != -2 {
			return true
		}
	}
	return false
}

// Ping implements LeaseStore: a majority must answer.
func (s *RedlockStore) Ping(ctx context.Context) error {
	o := s.each(ctx, "ping", func(ctx context.Context, i int, n *RedisStore) error { return nodeErr(i, n.Ping(ctx)) })
	if ok, _ := o.count(nil); ok < s.quorum {
		return s.quorumErr(o)
	}
	return nil
}

// Watch implements LeaseStore: a release published on any node wakes the
// waiter. Nodes subscribe at once, each within the node timeout; those
// that cannot are skipped while a majority can.
func (s *RedlockStore) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	stops := make([]func(), len(s.nodes))
	o := s.each(ctx, "watch", func(ctx context.Context, i int, n *RedisStore) error {
		stop, err := n.n.watchInto(ctx, n.channel(name), ch, waiter)
		stops[i] = stop
		return nodeErr(i, err)
	})
	stopAll := func() {
		for _, stop := range stops {
			if stop != nil {
				stop()
			}
		}
	}
	if ok, _ := o.count(nil); ok < s.quorum {
		stopAll()
		return nil, nil, s.quorumErr(o)
	}
	return ch, stopAll, nil
}

// Close stops every node's notification subscriber and waits for the
// cleanups that failed acquisitions left running (abandon), each bounded
// by cleanupTimeout. It is idempotent.
func (s *RedlockStore) Close() error {
	var errs []error
	for _, n := range s.nodes {
		errs = append(errs, n.Close())
	}
	s.cleanups.close()
	return errors.Join(errs...)
}
