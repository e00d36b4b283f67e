package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced/fenced/fence"
)

// Lease is a held lock: a lease in the store and the fencing token it was
// granted. Pass Token to the protected resource with every write; the
// resource, not the lease, is what stops a late writer.
//
// The lease is valid until Deadline. Done is closed, and Context cancelled,
// once, when the lease is lost (a refresh finds it taken or gone, the
// deadline passes without a refresh, or keep-alive's refresh cannot be
// sent: ErrCannotSend) or released. Err says which, and is
// the check to make right before a write: it reads the clock, where Done
// waits for the lease's timer (see Err).
type Lease struct {
	set   *LeaseSet // refreshes and releases it, and tracks it
	name  string
	id    string
	token fence.Token
	count int // releases to go when granted
	// reused: the grant is a hold that existed before the acquisition.
	reused bool

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	started  time.Time // when the request of the last grant or refresh was sent
	ttl      time.Duration
	deadline time.Time
	next     time.Time // when keep-alive refreshes next

	// releasing serialises Release calls. Under it: halted once the first
	// began (lostBefore is what the lease had lost by then), released once
	// one was decided: the store released the lease, or said it was lost.
	releasing  sync.Mutex
	halted     bool
	lostBefore error
	released   bool
	releaseID  string // drawn by the first Release, sent by every one
	unanswered bool   // a Release failed without an answer: it may have been applied

	// refreshing serialises refreshes, so that the deadline set last is
	// that of the refresh Redis applied last.
	refreshing sync.Mutex

	keepAlive bool
	stopCtx   context.Context // cancelled by halt: ends a refresh in flight
	stop      context.CancelFunc
	// The keep-alive and the expiry run on a timer's callbacks, not on a
	// goroutine of the lease's own: a held lock costs a timer, not a
	// stack. Under mu: timer is nil for a detached lease; ticking while a
	// callback runs (one at a time); stopped once halted, lost or
	// released. wg counts the callback running, for halt.
	timer   *time.Timer
	ticking bool
	stopped bool
	wg      sync.WaitGroup
	// A keep-alive refresh in flight is given up at attemptEnd, half the
	// time left to the deadline, by abandon, and sent again: a backend
	// that holds it unanswered (an etcd member cut off from its peers
	// holds it for etcd's 7 s request timeout) must not hold it past the
	// deadline (defect 108). Under mu; abandoned says the last was.
	attemptEnd time.Time
	abandon    context.CancelFunc
	abandoned  bool
}

// newLease is a lease granted g by a request sent at start.
func newLease(ctx context.Context, set *LeaseSet, name, id string, g Grant, start time.Time, keepAlive bool) *Lease {
	l := &Lease{set: set, name: name, id: id, token: g.Token, count: max(g.Count, 1), keepAlive: keepAlive}
	l.grantedLocked(start, g.TTL)
	// The lease outlives the acquiring call's cancellation but keeps its
	// values, and carries its token for fence.Transport.
	l.ctx, l.cancel = context.WithCancelCause(fence.WithToken(context.WithoutCancel(ctx), g.Token))
	l.stopCtx, l.stop = context.WithCancel(l.ctx)
	return l
}

// Name is the lock name.
func (l *Lease) Name() string { return l.name }

// ID is the lease id: 128 random bits in hex, known only to the holder.
func (l *Lease) ID() string { return l.id }

// Token is the fencing token granted with the lease.
func (l *Lease) Token() fence.Token { return l.token }

// Reused reports whether the acquisition was handed a hold that existed
// before it, with the token issued then, rather than a new grant: its
// holder's reentry (WithHolder; Count > 1), or, for a waiter that asks
// again (WithWaiter), the grant made for its earlier request whose answer
// was lost. A fenced server counts only the others as tokens issued.
func (l *Lease) Reused() bool { return l.reused }

// Count is how many releases the lock took to be freed when this lease was
// granted: 1, or more when a reentrant holder (WithHolder) acquired a lock
// it held.
func (l *Lease) Count() int { return l.count }

// TTL is the TTL the store really granted. It is the TTL asked for, or
// shorter when the store cannot vouch for more (an etcd session whose
// renewals fail).
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Started is when the request of the lease's grant, or of its last
// refresh, was sent: its validity runs from then.
func (l *Lease) Started() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

// Deadline is when the lease stops being valid unless refreshed: the TTL
// from Started, less the drift allowance.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed when the lease is lost or released. At the deadline it is
// closed by the lease's timer, which runs only when the process does: a
// holder paused past its deadline (SIGSTOP, a GC pause, swap) may find
// Done still open for a moment after it resumes. A channel cannot read the
// clock; Err does: call it right before a write.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context is cancelled when the lease is lost or released, as Done is
// closed. It carries the token (fence.FromContext). Its Err applies
// Lease.Err's check of the deadline first, and context.Cause on it is what
// the lease lost to. Contexts derived from it (context.WithTimeout, ...)
// are cancelled with it, but their own Err does not read the clock: check
// Err on this one, or the lease's, before a write. It reports no deadline:
// a keep-alive lease's moves, and context.WithTimeout under a parent whose
// deadline is sooner sets no timer of its own (see leaseContext).
func (l *Lease) Context() context.Context { return (*leaseContext)(l) }

// Err is nil while the lease is held, then ErrReleased, ErrExpired, or an
// error matching ErrLost.
//
// It reads the clock: once the deadline has passed, the lease is lost
// (ErrExpired) when Err is called, as the lease's timer would lose it
// (Done closes, the keep-alive stops), though the timer has not run yet: a
// holder paused past its deadline (SIGSTOP, GC, swap) is told by the first
// Err after it resumes, not some time later, while another may already
// hold the lock (defect 169). Call it right before each write. A nil Err
// is no promise the write arrives in time: the fencing token checked at
// the resource (Token) is what makes a late write harmless.
//
// A detached lease (WithDetached) has no timer, and its remote holder
// refreshes it by lease id without moving its Deadline here: it is lost
// only when Refresh or Release finds it lost, as ever.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		if !l.overdue() {
			return nil
		}
		l.lose(ErrExpired) // once: the timer's later loss changes nothing
	}
	return context.Cause(l.ctx)
}

// overdue reports whether the deadline of a lease with a timer (not
// detached) has passed. It reads the deadline under mu, as Deadline does.
func (l *Lease) overdue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.timer != nil && !time.Now().Before(l.deadline)
}

// leaseContext is the Lease as its Context: a conversion, no allocation.
// Done and Value are the lease's context's, so that context.Cause and
// fence.FromContext find its cancelCtx and its token, and contexts derived
// from it join its cancellation directly. Err checks the deadline first
// (Lease.Err). Deadline is the lease context's (none), not the lease's:
// the lease's moves later with each refresh, and context.WithDeadline
// under a parent that reports a sooner deadline sets no timer of its own,
// trusting the parent to end by then: a context.WithTimeout(ctx, time.Minute)
// under a keep-alive lease would never time out.
type leaseContext Lease

func (c *leaseContext) lease() *Lease                           { return (*Lease)(c) }
func (c *leaseContext) Deadline() (deadline time.Time, ok bool) { return c.ctx.Deadline() }
func (c *leaseContext) Done() <-chan struct{}                   { return c.ctx.Done() }
func (c *leaseContext) Value(key any) any                       { return c.ctx.Value(key) }

// Err is context.Canceled once the lease is lost or released, checking the
// deadline first as Lease.Err does; context.Cause says why.
func (c *leaseContext) Err() error {
	c.lease().Err()
	return c.ctx.Err()
}

func (c *leaseContext) String() string { return "lock.Lease(" + c.name + ").Context" }

// Refresh extends the lease to ttl from now; 0 keeps the current TTL. It
// returns ErrLost, and the lease is lost, if the lease id no longer holds
// the lease.
//
// After a refresh the validity is the TTL the store granted, less drift,
// from the moment the refresh was sent, whether that is later or earlier
// than before: a shorter refresh shortens it, and keep-alive follows the
// new TTL (docs/design.md, defect 1). A refresh answered after the lease
// was lost (its deadline passed while the refresh was on its way, or it
// was released) returns Err: the lease stays lost, though the store may
// have extended it; Release frees it there. One asked for once the
// deadline has passed is not sent: it returns ErrExpired, as Err does. A
// refresh that fails for another reason than ErrLost (no answer, a backend
// error) may still have been applied: the validity then ends no later than
// the refresh would have made it end, so a shorter one that failed
// shortens it too (defect 100), and a longer one leaves it as it was. Each refresh carries a
// sequence number (NextRefreshSeq): one that reaches the store after a
// later one was applied is not applied (ErrOutOfOrder), so a refresh that
// failed cannot shorten the lease after a later one extended it (defect
// 102).
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl != 0 {
		if err := ValidateTTL(ttl); err != nil {
			return err
		}
	}
	l.refreshing.Lock()
	defer l.refreshing.Unlock()
	if err := l.Err(); err != nil {
		return err
	}
	if ttl == 0 {
		// Read after the refresh before this one is done: one to another
		// TTL in flight would be undone by the TTL of before (defect 101).
		ttl = l.TTL()
	}
	start := time.Now()
	// Numbered, so that the store never applies it after a later one if
	// it is delayed on its way past its caller's giving up (defect 102).
	g, err := l.set.keeper.Refresh(ctx, l.name, l.id, ttl, NextRefreshSeq())
	if err != nil {
		if errors.Is(err, ErrLost) {
			l.lose(ErrLost)
			if e := l.Err(); !errors.Is(e, ErrLost) {
				return e // released (or expired) before the answer: Err says so
			}
			return err
		}
		// The store may have applied it and the answer been lost: a
		// shorter TTL then ends the lease sooner there (defect 100).
		l.mu.Lock()
		if dl := start.Add(ttl - Drift(ttl)); dl.Before(l.deadline) {
			l.deadline = dl
			l.rearmLocked()
		}
		deadline := l.deadline
		l.mu.Unlock()
		if !time.Now().Before(deadline) {
			l.lose(ErrExpired)
		}
		return err
	}
	l.mu.Lock()
	l.grantedLocked(start, g.TTL)
	l.rearmLocked()
	deadline := l.deadline
	l.mu.Unlock()
	if !time.Now().Before(deadline) {
		l.lose(ErrExpired) // a reply later than the validity it granted
	}
	// The lease may have been lost while the refresh was on its way (its
	// deadline passed first, or Release): Done closed once and stays
	// closed, and the refresh does not make it held again.
	return l.Err()
}

// grantedLocked sets the schedule of a grant of ttl by a request sent at
// start: valid until the TTL less drift, refreshed by keep-alive at TTL/3.
func (l *Lease) grantedLocked(start time.Time, ttl time.Duration) {
	l.started, l.ttl = start, ttl
	l.deadline = start.Add(ttl - Drift(ttl))
	l.next = start.Add(ttl / 3)
}

// Release deletes the lease if it is still held and wakes waiters. It
// returns ErrLost if the lease had been lost before (ErrExpired too once
// its deadline had passed, whether or not its timer had run: Err): a write
// made under it may have overlapped another holder's. From the first call the lease is
// no longer the caller's (Done is closed, Err is ErrReleased), but when
// the store could not be told (an outage, ctx's end), the lock stays held
// there until its TTL: Release may be called again, and sends the release
// again (by the lease id, which is safe). Its "lost" then counts as
// released before the deadline only when the store cannot tell it from the
// answer to the earlier call's release (ErrMaybeReleased): a lease lost
// before, to a Redis restart say, is still ErrLost. A release that cannot
// be sent (ErrCannotSend) says the lock stays held until its TTL runs out,
// and is no attempt that may have been applied. Once a release was
// decided, a later one returns nil.
func (l *Lease) Release(ctx context.Context) error {
	l.releasing.Lock()
	defer l.releasing.Unlock()
	if l.released {
		return nil
	}
	if !l.halted {
		l.halted = true
		l.halt()
		l.lostBefore = l.Err()
		// Released from here on, before the store is told: a Refresh of
		// the caller's that reaches the store after the release, and hears
		// "lost" before Release returns, must find the lease released, not
		// lose it (docs/design.md, defect 215).
		l.lose(ErrReleased)
	}
	if l.releaseID == "" {
		// One id for every call: a release sent again after a failure
		// whose outcome was not known takes off no second hold of a
		// reentrant lock (defect 29).
		id, err := newLeaseID()
		if err != nil {
			return err
		}
		l.releaseID = id
	}
	err := l.set.keeper.Release(ctx, l.name, l.id, l.releaseID)
	if errors.Is(err, ErrLost) && time.Now().Before(l.Deadline()) &&
		(errors.Is(err, ErrSentAgain) || l.unanswered && errors.Is(err, ErrMaybeReleased)) {
		// An earlier attempt got no answer, and may have released it:
		// another fenced node behind the same URL or the next of a
		// client's knows nothing of it (ErrSentAgain), or the store has
		// forgotten it (ErrMaybeReleased). A "lost" the store is sure of
		// is not forgiven: the lease went before (a Redis restart, a
		// failover, a force-release), and another may have held the lock.
		// Over a fenced server's API too: its 410 says which (docs/design.md,
		// defect 190).
		err = nil
	}
	notSent := errors.Is(err, ErrCannotSend)
	if notSent && !l.unanswered {
		// Nothing reached the store, now or before: the lock is held
		// there, by nobody, until its TTL runs out.
		err = fmt.Errorf("lock: %q not released: the release cannot be sent, and the lock stays held in the store until its TTL runs out: %w", l.name, err)
	}
	// A release that was not sent was not applied: it is no attempt whose
	// "lost" answer, later, may be its own doing.
	l.unanswered = l.unanswered || err != nil && !errors.Is(err, ErrLost) && !notSent
	l.lose(ErrReleased)
	l.set.forget(l)
	if lb := l.lostBefore; lb != nil && !errors.Is(lb, ErrReleased) {
		l.released = true
		return lb
	}
	l.released = err == nil || errors.Is(err, ErrLost)
	return err
}

func (l *Lease) lose(cause error) { l.cancel(cause) }

// cannotRefreshError is the loss of a keep-alive lease whose refresh
// cannot be sent (ErrCannotSend): it matches ErrLost and the keeper's
// error, and says that the store still holds the lock.
type cannotRefreshError struct{ err error }

func (e *cannotRefreshError) Error() string {
	return "lock: lease lost: the keep-alive gave it up before its deadline, as its refresh cannot be sent (" + e.err.Error() +
		"); the lock stays held in the store until its TTL runs out"
}

func (e *cannotRefreshError) Unwrap() []error { return []error{ErrLost, e.err} }

// errLostMaybeReleased is ErrLost with ErrMaybeReleased.
var errLostMaybeReleased = fmt.Errorf("%w (%w)", ErrLost, ErrMaybeReleased)

// expireIfDue loses the lease if its deadline has passed.
func (l *Lease) expireIfDue() {
	deadline, _ := l.schedule()
	if !time.Now().Before(deadline) {
		l.lose(ErrExpired)
	}
}

// halt stops the timer and waits for a callback in flight, whose
// refresh it cancels.
func (l *Lease) halt() {
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	abandon := l.abandon
	l.mu.Unlock()
	l.stop()
	if abandon != nil {
		abandon()
	}
	l.wg.Wait()
}

// start arms the timer of a tracked lease; it is disarmed, and the lease
// forgotten by its set, when the lease is lost or released.
func (l *Lease) start() {
	l.mu.Lock()
	l.timer = time.AfterFunc(l.wakeInLocked(), l.tick)
	l.mu.Unlock()
	context.AfterFunc(l.ctx, func() {
		l.mu.Lock()
		l.stopped = true
		l.timer.Stop()
		abandon := l.abandon // a refresh in flight
		l.mu.Unlock()
		if abandon != nil {
			abandon()
		}
		l.set.forget(l)
	})
}

// wakeInLocked is how long until the next thing to do: the deadline, or
// the keep-alive's refresh before it.
func (l *Lease) wakeInLocked() time.Duration {
	wake := l.deadline
	if l.keepAlive && l.next.Before(wake) {
		wake = l.next
	}
	return time.Until(wake)
}

// rearmLocked moves the timer to a schedule that changed, unless the lease
// is stopped; while a callback runs (it rearms as it ends), to the deadline.
func (l *Lease) rearmLocked() {
	switch {
	case l.timer == nil || l.stopped:
	case l.ticking:
		// The callback's refresh waits, and the timer with it waits for
		// the end of its attempt or the deadline (step): one that moved
		// sooner (a refresh to a shorter TTL, or a failed one, defect 100)
		// must end the lease then.
		l.timer.Reset(time.Until(l.attemptEndLocked()))
	default:
		l.timer.Reset(l.wakeInLocked())
	}
}

// schedule is the validity deadline and the next keep-alive refresh.
func (l *Lease) schedule() (deadline, next time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline, l.next
}

// tick is the timer's callback. One runs at a time: a second, started
// while the first refreshes, is the deadline (step set the timer to it):
// it loses the lease if the deadline has passed, and the first rearms.
func (l *Lease) tick() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	if l.ticking {
		// The refresh's attempt is over: give it up. Before the deadline
		// it is sent again, and the timer waits for the deadline
		// meanwhile; at the deadline the lease is lost.
		abandon := l.abandon
		l.abandon = nil
		if abandon != nil && time.Now().Before(l.deadline) {
			l.abandoned = true
			l.timer.Reset(time.Until(l.deadline))
		}
		l.mu.Unlock()
		if abandon != nil {
			abandon()
		}
		l.expireIfDue()
		return
	}
	l.ticking = true
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	again := l.step()
	l.mu.Lock()
	l.ticking = false
	if again {
		l.rearmLocked()
	}
	l.mu.Unlock()
}

// step declares the lease lost when its deadline has passed, and refreshes
// it when keep-alive is on and a refresh is due. A refresh that fails for
// another reason than loss (network) is tried again soon, until the
// deadline, as Consul's monitorLock does; one that cannot be sent
// (ErrCannotSend: no refresh will be, whatever the time left) loses the
// lease at once, as Consul's does after an error it cannot retry. It
// reports whether the lease still needs its timer.
func (l *Lease) step() bool {
	if l.Err() != nil {
		return false
	}
	now := time.Now()
	deadline, next := l.schedule()
	if !now.Before(deadline) {
		l.lose(ErrExpired)
		return false
	}
	if !l.keepAlive || now.Before(next) {
		return true
	}
	// While the refresh runs, the timer waits for the end of its attempt,
	// half the time left: there the attempt is given up (its context
	// cancelled) and the refresh sent again, up to the deadline. At the
	// deadline the lease is lost, which also ends the attempt (as halt and
	// any other loss do), even if the keeper does not honour ctx (a call
	// stuck in a batch another caller leads): the holder must learn it
	// lost the lock before anyone else can take it. The lease's own timer
	// does it, rather than a context's deadline and an AfterFunc of each
	// refresh: they were a tenth of a held lock's CPU. And the attempt is
	// no child of stopCtx, which would keep a map of children for every
	// lease held (300 bytes a lock): those three cancel it themselves.
	attempt, abandon := context.WithCancel(context.WithoutCancel(l.stopCtx))
	defer abandon()
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	// Not under 50 ms: near the deadline, halving again and again would
	// send a flurry of attempts none of which has time to be answered.
	end := now.Add(max(deadline.Sub(now)/2, minAttempt))
	if end.After(deadline) {
		end = deadline
	}
	l.attemptEnd, l.abandon, l.abandoned = end, abandon, false
	l.timer.Reset(time.Until(end))
	l.mu.Unlock()
	err := l.Refresh(refreshCtx{attempt, end}, 0)
	l.mu.Lock()
	abandoned := l.abandoned
	l.attemptEnd, l.abandon, l.abandoned = time.Time{}, nil, false
	l.mu.Unlock()
	switch {
	case err == nil: // Refresh moved the schedule
	case l.Err() != nil:
		return false
	case errors.Is(err, ErrCannotSend):
		// Not sent, and no refresh will be until something outside the
		// lease changes (a certificate): tried again until the deadline,
		// it only hid from the holder, until then, that its lease was
		// over. Given up now: the holder stops sooner, never later.
		l.lose(&cannotRefreshError{err: err})
		return false
	case abandoned:
		// Unanswered in its time: at once, in the half left.
		l.mu.Lock()
		l.next = time.Now()
		l.mu.Unlock()
	default:
		// Transient: try again soon, but not in a busy loop.
		l.mu.Lock()
		l.next = time.Now().Add(min(l.ttl/10, time.Second))
		l.mu.Unlock()
	}
	return true
}

// attemptEndLocked is when the timer must fire while a refresh is in
// flight: the end of its attempt, or the deadline if that comes first.
func (l *Lease) attemptEndLocked() time.Time {
	if l.abandon != nil && l.attemptEnd.Before(l.deadline) {
		return l.attemptEnd
	}
	return l.deadline
}

// minAttempt is the least time a keep-alive refresh's attempt is given
// before it is sent again, if the deadline leaves that much.
const minAttempt = 50 * time.Millisecond

// refreshCtx is a keep-alive refresh's context: its attempt's, which the
// lease's timer ends at the attempt's end (step), and that end, for the
// keeper's calls to pass on (go-redis's socket deadlines, gRPC's).
type refreshCtx struct {
	context.Context
	deadline time.Time
}

func (c refreshCtx) Deadline() (time.Time, bool) { return c.deadline, true }
