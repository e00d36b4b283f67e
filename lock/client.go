package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/fenced/fenced/internal/calls"
	"github.com/fenced/fenced/internal/clock"
)

// Client acquires leases from a LeaseStore. It implements Locker.
type Client struct {
	store  LeaseStore
	set    *LeaseSet   // the leases it holds, kept through store
	places *keptPlaces // the queue places of acquisitions made of several calls
	// calls are the acquisitions in progress, which Close ends (cause
	// ErrClosed) and waits for.
	calls calls.Set
}

// New returns a client of store. Close releases the leases it still holds;
// it does not close the store.
func New(store LeaseStore) (*Client, error) {
	if store == nil {
		return nil, errors.New("lock: nil lease store")
	}
	set, err := NewLeaseSet(store)
	if err != nil {
		return nil, err
	}
	return &Client{store: store, set: set, places: newKeptPlaces(store, DefaultWaiterTTL)}, nil
}

// Store returns the client's lease store.
func (c *Client) Store() LeaseStore { return c.store }

// TryAcquire makes one attempt: it returns ErrNotAcquired at once when the
// lock is held.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := ResolveOptions(true, opts...)
	if err != nil {
		return nil, err
	}
	o.Retry = NoRetry()
	return c.acquire(ctx, name, ttl, o)
}

// Acquire blocks until it holds the lease of name, the context ends (an
// error matching ctx.Err()), or the wait budget runs out (ErrNotAcquired).
// Waiters wake on the holder's release or when its lease expires.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := ResolveOptions(false, opts...)
	if err != nil {
		return nil, err
	}
	if o.Retry == nil {
		o.Retry = ExponentialBackoff(4*time.Millisecond, 256*time.Millisecond)
	}
	return c.acquire(ctx, name, ttl, o)
}

func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, o AcquireOptions) (*Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return nil, err
	}
	ctx, end, err := c.calls.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	began := time.Now()
	o.Retry = fresh(o.Retry) // this acquisition's count, whoever else shares the value
	unbudgeted := ctx
	if o.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.Wait, errWaitBudget)
		defer cancel()
	}
	req := AcquireRequest{Name: name, TTL: ttl, Owner: o.Owner, Holder: o.Holder}
	if !o.Unfair {
		// A place in the queue, the same across this acquisition's attempts.
		var err error
		if req.Waiter = o.Waiter; req.Waiter == "" {
			if req.Waiter, err = newLeaseID(); err != nil {
				return nil, err
			}
		}
		req.WaiterTTL = DefaultWaiterTTL
	}
	req.Rejoin = o.Waiter                 // the caller may ask again after a lost answer (WithWaiter)
	kept := req.Rejoin != "" && !o.Unfair // and a fair one's place outlives this call
	// pause is the retry strategy's next backoff, 0 to give up; a fair
	// waiter's stays under a third of its place's TTL, so that it keeps it.
	pause := func() time.Duration {
		d := o.Retry.NextBackoff()
		if d > 0 && req.Waiter != "" {
			d = min(d, req.WaiterTTL/3)
		}
		return d
	}
	var (
		notify   <-chan struct{}
		stopWait func()
		// A subscription being made: its Watch's answer, and what ends it.
		subscribing     chan subscribed
		stopSubscribing context.CancelFunc
		busy            error // the last answer's reason it did not get the lease
		down            error // the last attempt's transient backend error, if it had no answer
		acquired        bool
	)
	if kept {
		c.places.begin(name, req.Waiter)
	}
	defer func() {
		if subscribing != nil {
			stopSubscribing()
			if w := <-subscribing; w.err == nil {
				w.stop()
			}
		}
		if stopWait != nil {
			stopWait()
		}
		if kept {
			// A final call gives the place up if the lock was held when
			// the call ended by itself: not after an outage, nor when its
			// caller's context ended (over HTTP, a cut connection), which
			// its caller may ride out by asking again (docs/design.md,
			// defect 241).
			c.places.end(name, req.Waiter, acquired, o.Final && busy != nil && unbudgeted.Err() == nil)
			return
		}
		switch {
		case req.Waiter == "" || acquired:
		case busy != nil:
			// Give up the place, so that those behind need not wait for it
			// to expire.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = c.store.Leave(lctx, name, req.Waiter)
		default:
			// No answer said whether the last attempt joined the queue:
			// give up a place it may have, without holding up the error.
			c.places.leaveLater(name, req.Waiter)
		}
	}()
	for {
		if err := c.set.checkOpen(); err != nil {
			return nil, err
		}
		actx, cancel := attemptContext(unbudgeted, ctx)
		l, err := c.attempt(actx, req, o)
		cancel()
		if err == nil {
			acquired = true
			return l, nil
		}
		var held *HeldError
		if !errors.As(err, &held) && !errors.Is(err, ErrLost) && !errors.Is(err, ErrTTLTooShort) {
			if !outage(ctx, err) {
				if down != nil && (ctx.Err() != nil || pastDeadline(ctx)) {
					// The budget ended while the store was down: that, not
					// a held lock, is why the acquisition failed.
					return nil, c.fail(ctx, name, down, nil, began)
				}
				return nil, c.fail(ctx, name, err, busy, began)
			}
			down = err
			d := pause()
			if d <= 0 {
				return nil, c.fail(ctx, name, err, nil, began)
			}
			if !clock.Sleep(ctx, d) {
				return nil, c.fail(ctx, name, down, nil, began)
			}
			continue
		}
		// A grant with no validity left is retried too: a later attempt
		// may be faster.
		busy, down = err, nil
		d := pause()
		if d <= 0 {
			return nil, notAcquired(name, busy)
		}
		if notify == nil && subscribing == nil {
			// Subscribe, and once the subscription is confirmed try once
			// more at once: a release between the attempt and the
			// subscription would otherwise be missed. Until it is, the
			// waiter keeps the retry strategy's pace, so a free lock is
			// taken within the strategy's bound, notifications or not (a
			// pub/sub connection being re-established: docs/design.md,
			// defect 2). The subscription is not cut at a round's end:
			// etcd confirms a client's watches one at a time, and
			// waiters that gave up theirs after a 4 ms backoff and asked
			// again queued ever more of them, 80 to 200 ms each (defect
			// 252).
			sctx, cancel := context.WithCancel(ctx)
			ch := make(chan subscribed, 1)
			go func() { // owned by this call: ended and awaited as it returns
				n, stop, err := c.store.Watch(sctx, name, req.Waiter)
				ch <- subscribed{n, stop, err}
			}()
			subscribing, stopSubscribing = ch, cancel
		}
		switch {
		case held != nil && held.Position > 1 && notify != nil:
			// Behind others in the queue, a waiter cannot take the lock
			// before the places ahead go, and it is woken when they do
			// (its name is published, or the place ahead is watched): it
			// attempts only to keep its place, every third of its life,
			// not at the strategy's pace, which with hundreds of waiters
			// was most of the store's load (docs/design.md, "Waiting").
			d = req.WaiterTTL / 3
		case held != nil && held.Remaining > 0 && held.Remaining < d:
			d = held.Remaining
		}
		t := time.NewTimer(d)
	round:
		for {
			select {
			case w := <-subscribing:
				subscribing = nil
				stopSubscribing()
				if w.err != nil {
					if errors.Is(w.err, ErrClosed) {
						t.Stop()
						return nil, c.fail(ctx, name, w.err, busy, began)
					}
					continue // the rest of this round: never a busy loop; the next subscribes again
				}
				notify, stopWait = w.ch, w.stop
				break round // confirmed: try once more at once
			case _, open := <-notify:
				if !open {
					// The subscription ended by itself (etcd lost its
					// leader): the next round subscribes again, or a
					// waiter behind the head would never be woken again
					// in this acquisition (docs/design.md, defect 251).
					stopWait()
					notify, stopWait = nil, nil
				}
				break round
			case <-t.C:
				break round
			case <-ctx.Done():
				t.Stop()
				return nil, c.fail(ctx, name, ctx.Err(), busy, began)
			}
		}
		t.Stop()
	}
}

// subscribed is what a store's Watch answered.
type subscribed struct {
	ch   <-chan struct{}
	stop func()
	err  error
}

// attemptFloor is the least time an attempt has to finish, whatever is
// left of the wait budget.
const attemptFloor = time.Second

// attemptContext is the context of one attempt: the wait budget's (budget,
// derived from parent), or, if that ends sooner than attemptFloor from now,
// parent's with that deadline. The budget bounds waiting for a holder, not
// the store's answer: a budget shorter than one round trip to the store cut
// every attempt on a free lock, which read as the store not answering
// (docs/design.md, defect 83).
func attemptContext(parent, budget context.Context) (context.Context, context.CancelFunc) {
	dl, ok := budget.Deadline()
	if floor := time.Now().Add(attemptFloor); budget != parent && ok && dl.Before(floor) {
		return context.WithDeadline(parent, floor)
	}
	return budget, func() {}
}

// outage reports whether an attempt's err is a backend briefly unavailable
// (see transient) that the acquisition may wait out: it has a deadline (a
// wait budget or the context's), not yet passed by the clock (an error at
// the deadline is the deadline's, see fail). One without a deadline fails
// at once rather than hang unseen on a backend that is down
// (docs/design.md, "Riding out an outage").
func outage(ctx context.Context, err error) bool {
	_, bounded := ctx.Deadline()
	return bounded && ctx.Err() == nil && !pastDeadline(ctx) && transient(err)
}

// pastDeadline: ctx has a deadline, and the clock has passed it.
func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

var errWaitBudget = errors.New("lock: wait budget ran out")

// fail explains why an acquisition stopped. The end of the wait budget is
// a *WaitError (ErrNotAcquired) only if an attempt found the lease taken;
// if the store never answered in time, that is the error. Every other
// context error matches ctx.Err().
func (c *Client) fail(ctx context.Context, name string, err, busy error, began time.Time) error {
	if c.calls.Ended(ctx) != nil {
		return fmt.Errorf("lock: acquire %q: %w", name, ErrClosed)
	}
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && pastDeadline(ctx) {
		// The store saw the deadline pass (go-redis with
		// ContextTimeoutEnabled ends a call at it by the clock) before the
		// context's own timer marked ctx done; that is due now. Without
		// the wait, the end of a wait budget read as a backend failure.
		<-ctx.Done()
	}
	if ctx.Err() != nil && context.Cause(ctx) == errWaitBudget {
		if errors.Is(busy, ErrTTLTooShort) {
			// Nobody held the lock at the last attempt: "still held"
			// would send the caller after a holder that is not there.
			return busy
		}
		if busy != nil {
			we := &WaitError{Name: name, Waited: time.Since(began)}
			var held *HeldError
			if errors.As(busy, &held) {
				we.Position = held.Position
			}
			return we
		}
		return fmt.Errorf("lock: acquire %q: the lease store did not answer within the wait budget: %w", name, err)
	}
	if ctx.Err() != nil && (err == nil || !errors.Is(err, ctx.Err())) {
		return fmt.Errorf("lock: acquire %q: %w", name, ctx.Err())
	}
	// err is the store's (and, if ctx ended, matches ctx.Err()): keep it,
	// so that a *BackendError still says which backend did not answer.
	return fmt.Errorf("lock: acquire %q: %w", name, err)
}

// WaitError is ErrNotAcquired after a wait: the lock was still held when
// the wait budget ran out. It says how long the caller waited and, for a
// fair waiter, its place in the queue then (1 at the head; 0 unknown).
type WaitError struct {
	Name     string
	Waited   time.Duration
	Position int
}

func (e *WaitError) Error() string {
	if e.Position > 0 {
		return fmt.Sprintf("lock: not acquired: %q still held after waiting %s; this waiter was number %d in the queue", e.Name, e.Waited.Round(time.Millisecond), e.Position)
	}
	return fmt.Sprintf("lock: not acquired: %q still held when the wait budget ran out after %s", e.Name, e.Waited.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrNotAcquired) true.
func (e *WaitError) Is(target error) bool { return target == ErrNotAcquired }

// notAcquired is ErrNotAcquired with the last attempt's reason; a grant
// with no validity left says so as it is (ErrTTLTooShort), not "held".
func notAcquired(name string, busy error) error {
	if errors.Is(busy, ErrTTLTooShort) {
		return busy
	}
	var held *HeldError
	if errors.As(busy, &held) {
		return fmt.Errorf("%w: %q is held", ErrNotAcquired, name)
	}
	return fmt.Errorf("%w: %q: %v", ErrNotAcquired, name, busy)
}

// attempt is one pass of the acquisition protocol (docs/design.md,
// "Acquisition protocol"), with a new lease id.
func (c *Client) attempt(ctx context.Context, req AcquireRequest, o AcquireOptions) (*Lease, error) {
	id, err := newLeaseID()
	if err != nil {
		return nil, err
	}
	req.LeaseID = id
	start := time.Now()
	g, err := c.store.Acquire(ctx, req)
	if err != nil {
		// ErrLost at confirm may be a force-release, but once the attempt
		// took the TTL less its drift, no grant could have had validity
		// left either: a longer TTL is what helps. (A restore is no
		// longer one: the stores ask again, defect 231.)
		if took := time.Since(start); errors.Is(err, ErrLost) && took >= req.TTL-Drift(req.TTL) {
			return nil, &ttlTooShortError{name: req.Name, ttl: req.TTL, took: took, drift: Drift(req.TTL)}
		}
		return nil, err
	}
	if g.LeaseID != "" {
		id = g.LeaseID // a reentrant holder's lease, or a lost answer's grant
	}
	return c.set.adopt(ctx, req.Name, id, g, start, o, id != req.LeaseID)
}

// Adopt makes a Lease of a lease taken elsewhere, for example through a
// fenced server's API, kept through this client's store: see
// LeaseSet.Adopt.
func (c *Client) Adopt(ctx context.Context, name, leaseID string, g Grant, start time.Time, opts ...Option) (*Lease, error) {
	return c.set.Adopt(ctx, name, leaseID, g, start, opts...)
}

// Close releases every lease the client still holds and waits for their
// keep-alive goroutines, and gives up the queue places kept between calls
// (WithWaiter). An acquisition still in progress (Acquire, TryAcquire,
// Elect) returns ErrClosed at once, whether it is waiting for a held lock
// or for the store: it leaves its place in the queue and takes nothing, and
// Close waits for it to return, or for ctx to end; so does an Observe,
// whose channel closes. Later acquisitions and Observes return ErrClosed.
// Close is idempotent.
func (c *Client) Close(ctx context.Context) error {
	c.calls.Close(ErrClosed)
	err := c.set.Close(ctx)
	if werr := c.calls.Wait(ctx); werr != nil {
		err = errors.Join(err, fmt.Errorf("lock: close: acquisitions still returning: %w", werr))
	}
	c.places.close(ctx)
	return err
}

// Inspect reports who holds name, and who waits.
func (c *Client) Inspect(ctx context.Context, name string) (State, error) {
	if err := ValidateName(name); err != nil {
		return State{}, err
	}
	return c.store.Inspect(ctx, name)
}

// List returns one page of the locks held now whose names start with
// prefix: at most limit (1 to MaxListLimit), from cursor ("" for the
// first page; then the previous page's Next).
func (c *Client) List(ctx context.Context, prefix string, limit int, cursor string) (ListPage, error) {
	if err := ValidateNamePrefix(prefix); err != nil {
		return ListPage{}, err
	}
	if limit < 1 || limit > MaxListLimit {
		return ListPage{}, fmt.Errorf("%w: limit %d: want 1 to %d", ErrInvalidOption, limit, MaxListLimit)
	}
	return c.store.List(ctx, ListRequest{Prefix: prefix, Limit: limit, Cursor: cursor})
}

// ForceRelease deletes the lease of name whoever holds it, and wakes the
// next waiter: an operator's act, for a holder known to be gone. The
// holder learns of it at its next refresh (ErrLost), or not at all if it
// never refreshes; its token still fences its late writes. It returns the
// state the lock had (Held false if nobody held it).
//
// With IfToken(t) it releases the lock only if the grant holding it has
// token t, checked atomically with the delete; a lock held by another
// grant is a *HeldByOtherError (ErrHeldByOther) and stays held. That is
// the form to use when the answer may be lost and the call made again:
// an unconditional force-release made twice removes the waiter the first
// one woke as well.
func (c *Client) ForceRelease(ctx context.Context, name string, opts ...ForceOption) (State, error) {
	if err := ValidateName(name); err != nil {
		return State{}, err
	}
	o, err := ResolveForceOptions(opts...)
	if err != nil {
		return State{}, err
	}
	return c.store.ForceRelease(ctx, name, o.Token)
}

// RefreshID refreshes the lease of name held by leaseID, for a holder that
// has only the lease id (see WithDetached). ttl must be valid. ErrLost if
// leaseID does not hold the lease. seq orders the lease's refreshes
// (NextRefreshSeq, or the caller's own increasing numbers; 0 for none):
// ErrOutOfOrder if the store applied a higher one first.
func (c *Client) RefreshID(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (Grant, error) {
	if err := validateID(name, leaseID); err != nil {
		return Grant{}, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return Grant{}, err
	}
	return c.store.Refresh(ctx, name, leaseID, ttl, seq)
}

// ReleaseID releases the lease of name held by leaseID. ErrLost if leaseID
// does not hold it. op identifies the release across its retries, as
// LeaseKeeper.Release says: give the same one to each call that repeats a
// release whose outcome was not known (NewReleaseID), or "" for a release
// that will not be repeated.
func (c *Client) ReleaseID(ctx context.Context, name, leaseID, op string) error {
	if err := validateID(name, leaseID); err != nil {
		return err
	}
	if op != "" {
		if err := ValidateReleaseID(op); err != nil {
			return err
		}
	}
	return c.store.Release(ctx, name, leaseID, op)
}

// UnhandedReleaser is a LeaseStore that can release a grant unless another
// request of its acquisition was handed it (AcquireRequest.Rejoin): a
// server whose client went away frees the grant it made, where a copy of
// the request may already have been handed it, through this server or
// another (docs/design.md, defect 153). RedisStore and EtcdStore are; a
// store that wraps one should pass the method on.
type UnhandedReleaser interface {
	// ReleaseUnhanded releases leaseID's grant of name if no other
	// request was handed it: true if it did; false, and nothing changed,
	// if it was handed, or is not held by leaseID, or the store cannot
	// tell (then it keeps it).
	ReleaseUnhanded(ctx context.Context, name, leaseID string) (bool, error)
}

// UnhandedUnreenterer is UnhandedReleaser for a holder's reentry: a server
// whose client went away takes off the hold the reentry counted, where a
// copy of the request may already have been handed it (docs/design.md,
// defect 183). RedisStore and EtcdStore are; a store that wraps one
// should pass the method on. An interface of its own, so that a wrapper
// written for UnhandedReleaser alone still passes that one on.
type UnhandedUnreenterer interface {
	// UnreenterUnhanded takes off the hold that a reentry of leaseID's
	// lock by the remote acquisition waiter (AcquireRequest.Rejoin)
	// counted, if no other request of that acquisition was handed it:
	// true if it did; false, and nothing changed, if it was handed, or
	// counted no hold, or is the holder's last, or leaseID no longer holds
	// the lock.
	UnreenterUnhanded(ctx context.Context, name, leaseID, waiter string) (bool, error)
}

// ReleaseUnhanded releases the grant of name that leaseID holds, unless
// another request of its acquisition was handed it (UnhandedReleaser).
// With a store that cannot tell, it releases nothing: false.
func (c *Client) ReleaseUnhanded(ctx context.Context, name, leaseID string) (bool, error) {
	if err := validateID(name, leaseID); err != nil {
		return false, err
	}
	u, ok := c.store.(UnhandedReleaser)
	if !ok {
		return false, nil
	}
	return u.ReleaseUnhanded(ctx, name, leaseID)
}

// UnreenterUnhanded takes off the hold that a reentry of name by the
// remote acquisition waiter counted for leaseID's lock, unless another
// request of the acquisition was handed it (UnhandedUnreenterer). With a
// store that cannot tell, it takes off nothing: false.
func (c *Client) UnreenterUnhanded(ctx context.Context, name, leaseID, waiter string) (bool, error) {
	if err := validateID(name, leaseID); err != nil {
		return false, err
	}
	if err := ValidateWaiter(waiter); err != nil {
		return false, err
	}
	u, ok := c.store.(UnhandedUnreenterer)
	if !ok {
		return false, nil
	}
	return u.UnreenterUnhanded(ctx, name, leaseID, waiter)
}

// NewReleaseID returns a fresh release id (LeaseKeeper.Release): 128
// random bits in hex.
func NewReleaseID() (string, error) { return newLeaseID() }

// ValidateReleaseID checks a release id: 32 lowercase hex digits. Its
// error matches ErrInvalidLeaseID.
func ValidateReleaseID(op string) error {
	if err := checkID128(op); err != nil {
		return releaseIDError{err}
	}
	return nil
}

// releaseIDError is a release id refused: it matches ErrInvalidLeaseID, as
// before, and names the release id, where wrapping the sentinel read "lock:
// invalid lease id: release id: …" (docs/design.md, defect 209).
type releaseIDError struct{ err error }

func (e releaseIDError) Error() string { return "lock: invalid release id: " + e.err.Error() }
func (e releaseIDError) Unwrap() error { return ErrInvalidLeaseID }

// ErrInvalidLeaseID: a lease id that this package cannot have issued.
var ErrInvalidLeaseID = errors.New("lock: invalid lease id")

func validateID(name, leaseID string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := checkID128(leaseID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidLeaseID, err)
	}
	return nil
}

// checkID128 checks an id of 128 random bits in hex, as lease ids, waiters
// and release ids are: 32 lowercase hex digits, as newLeaseID draws them
// (and every client of fenced). The stores compare ids as strings, so an
// uppercase spelling of a lease id is another id: it used to pass here and
// then lose the lease it named (a refresh answered lost, a release id that
// took a second hold off, a waiter that lost its grant), docs/design.md,
// defect 125. It is refused instead, with what was wrong.
func checkID128(id string) error {
	const want = "want 32 lowercase hex digits (0-9 a-f)"
	if len(id) != 32 {
		return fmt.Errorf("%d characters; %s", len(id), want)
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			return fmt.Errorf("uppercase %q at byte %d; %s: ids compare as strings, so an uppercase spelling is another id", c, i, want)
		default:
			return fmt.Errorf("not hex: %q at byte %d; %s", c, i, want)
		}
	}
	return nil
}

// newLeaseID returns 128 random bits in hex.
func newLeaseID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("lock: lease id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
