package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fenced/fenced/fence"
)

// Locker takes leases: *Client with a lease store in this process, and
// *client.Client through a fenced server. Code written against Locker moves
// between the two unchanged; both honour the same Options, resolved by
// ResolveOptions, and return the same *Lease.
type Locker interface {
	// Acquire blocks until it holds the lease of name, the context ends, or
	// the WithWait budget runs out (ErrNotAcquired).
	Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error)
	// TryAcquire makes one attempt: ErrNotAcquired at once when the lock is
	// held.
	TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error)
}

var _ Locker = (*Client)(nil)

// Option configures one Acquire or TryAcquire. An option that does not
// apply to the call it is given to is an error (ErrInvalidOption), not
// silently dropped.
type Option func(*acquireOpts)

type acquireOpts struct {
	retry     RetryStrategy
	retrySet  bool
	wait      time.Duration
	waitSet   bool
	keepAlive bool
	detached  bool
	unfair    bool
	owner     string
	ownerSet  bool
	holder    string
	holderSet bool
	waiter    string
	waiterSet bool
	final     bool
	nilOption bool
}

// WithRetry sets the fallback strategy for waiters that miss a release
// notification. Default for Acquire: ExponentialBackoff(4ms, 256ms) with no
// limit but the wait budget and the context. A fair waiter behind others in
// the queue attempts every third of its place's life instead (see
// DefaultWaiterTTL): it cannot take the lock before those ahead, and is
// woken when they go. Each acquisition starts this
// package's strategies afresh, so one value may serve many (see
// RetryStrategy). Acquire only: TryAcquire makes one attempt, and a fenced
// server (package client) does the waiting itself.
func WithRetry(s RetryStrategy) Option {
	return func(o *acquireOpts) { o.retry, o.retrySet = s, true }
}

// WithWait bounds how long Acquire waits for a held lock before it returns
// ErrNotAcquired, and for a backend that is briefly unavailable (see the
// package doc, Errors). Default 0: wait until the context ends. An attempt
// that started within it has at least a second to finish (the context still
// bounds it), so that a budget shorter than a round trip to the store still
// takes a free lock. Acquire only.
func WithWait(d time.Duration) Option {
	return func(o *acquireOpts) { o.wait, o.waitSet = d, true }
}

// WithKeepAlive makes the lease refresh itself every TTL/3 until Release.
// Default off: the lease is lost at its validity deadline unless refreshed.
// Not with WithDetached.
func WithKeepAlive() Option { return func(o *acquireOpts) { o.keepAlive = true } }

// WithDetached returns a lease with no timer and no keep-alive, not
// tracked by the client: Done closes only when Release or Refresh finds it
// lost, not at the deadline. For servers that hand the lease id to a remote
// holder, who refreshes and releases it by id (RefreshID, ReleaseID).
// Default off. Not with WithKeepAlive.
func WithDetached() Option { return func(o *acquireOpts) { o.detached = true } }

// WithUnfair makes Acquire wait without a place in the lock's queue: it
// takes the lock whenever it finds it free, whoever has waited longer, as
// TryAcquire does. Default off: a waiting Acquire is fair, and the waiter
// that has waited longest gets the lock next. Acquire only.
func WithUnfair() Option { return func(o *acquireOpts) { o.unfair = true } }

// WithWaiter gives a fair acquisition made of several calls one place in
// the lock's queue: every call with the same id (32 lowercase hex digits, 128 random
// bits new for each acquisition, as a lease id) waits in that place, and a
// call that ends without the lock keeps it for the next call instead of
// giving it up. A place no call has used for DefaultWaiterTTL is given up:
// with Redis leases the store expires it, and a call through another
// Client over the same Redis (another fenced server) keeps it meanwhile;
// with etcd leases, where places are per store, this Client gives it up,
// and at Close.
// For a server serving a remote waiter whose wait spans several requests
// (the API's "waiter"); without it each call queues anew, behind everyone
// who came meanwhile. The id names one acquisition: a call that finds the
// lock granted, or a reentry (WithHolder) counted, under it gets that grant
// again, its count unchanged, so a request sent again after a lost answer
// takes one hold, not two. With TryAcquire or WithUnfair the id names the
// acquisition only: it has no place in the queue, and a request sent again
// after a lost answer gets the grant the first one made instead of finding
// the lock held, by a lease nobody knows of, until its TTL.
func WithWaiter(id string) Option {
	return func(o *acquireOpts) { o.waiter, o.waiterSet = id, true }
}

// WithFinal says that this call is the last of its WithWaiter acquisition
// (the API's "final": the remote waiter's wait ends with it): if it ends
// without the lock, the place is given up at once rather than kept for a
// next call that will not come, which would hold a free lock from those
// behind it for DefaultWaiterTTL. Only with WithWaiter, on a fair
// acquisition.
func WithFinal() Option {
	return func(o *acquireOpts) { o.final = true }
}

// WithOwner stores a label with the lease, shown by Inspect, List and the
// server's GET: who holds the lock, for people (a host, a job). 1 to
// MaxLabelLen bytes of printable UTF-8. Default none.
func WithOwner(label string) Option {
	return func(o *acquireOpts) { o.owner, o.ownerSet = label, true }
}

// WithHolder makes the acquisition reentrant for holder, an identity of the
// caller's choosing (a worker id, a request id; never a goroutine id): an
// Acquire by the holder that holds the lock now gets the same lease id and
// token at once, and the lock is freed by as many releases as it was
// acquired. 1 to MaxLabelLen bytes of printable UTF-8. Default: not reentrant.
//
// The holder is a credential, as good as the lease id: whoever knows it can
// reenter, and so gets the lease id and can release the lock. Where callers
// do not trust each other (a shared fenced server), make it unguessable (a
// random id per process) and never log it; the server's API never shows it.
func WithHolder(id string) Option {
	return func(o *acquireOpts) { o.holder, o.holderSet = id, true }
}

// MaxLabelLen bounds owner labels and holder identities.
const MaxLabelLen = 128

// DefaultWaiterTTL is how long a fair waiter's place lasts without another
// attempt: a waiter that died leaves the queue within it. Waiters attempt
// at least every third of it, and those behind the head of the queue that
// often and no more.
const DefaultWaiterTTL = 3 * time.Second

// ErrInvalidOption: an option that does not apply to the call, or an
// invalid value. The message says what is allowed.
var ErrInvalidOption = errors.New("lock: invalid option")

// AcquireOptions are the options of one acquisition, resolved and checked
// by ResolveOptions: what another implementation of Locker needs to honour
// them as Client does.
type AcquireOptions struct {
	// Try is true for TryAcquire: one attempt.
	Try bool
	// Wait is WithWait's budget; 0 waits until the context ends.
	Wait time.Duration
	// Retry is WithRetry's strategy; nil when it was not given (Client then
	// uses its default).
	Retry RetryStrategy
	// KeepAlive and Detached are WithKeepAlive and WithDetached.
	KeepAlive, Detached bool
	// Unfair is WithUnfair; TryAcquire is always unfair.
	Unfair bool
	// Owner and Holder are WithOwner's label and WithHolder's identity.
	Owner, Holder string
	// Waiter is WithWaiter's place id; "" gives each call a place of its
	// own.
	Waiter string
	// Final is WithFinal: the place goes with this call.
	Final bool
}

// ResolveOptions applies opts for Acquire (try false) or TryAcquire (try
// true). It returns an error matching ErrInvalidOption for an option that
// does not apply (WithWait or WithRetry with TryAcquire, WithFinal without
// a place in the queue), for WithDetached with WithKeepAlive, and for
// invalid values (a negative wait, a nil strategy or one of this package's
// with arguments out of range, a waiter id that is not 32 lowercase hex
// digits, a nil Option).
func ResolveOptions(try bool, opts ...Option) (AcquireOptions, error) {
	var o acquireOpts
	for _, f := range opts {
		if f == nil {
			o.nilOption = true
			continue
		}
		f(&o)
	}
	r := AcquireOptions{Try: try, Wait: o.wait, Retry: o.retry, KeepAlive: o.keepAlive, Detached: o.detached,
		Unfair: o.unfair || try, Owner: o.owner, Holder: o.holder, Waiter: o.waiter, Final: o.final}
	switch {
	case o.nilOption:
		return r, fmt.Errorf("%w: a nil Option", ErrInvalidOption)
	case try && o.waitSet:
		return r, fmt.Errorf("%w: WithWait does not apply to TryAcquire, which makes one attempt; use Acquire with WithWait to wait up to a bound", ErrInvalidOption)
	case try && o.retrySet:
		return r, fmt.Errorf("%w: WithRetry does not apply to TryAcquire, which makes one attempt; use Acquire to wait", ErrInvalidOption)
	case o.wait < 0:
		return r, fmt.Errorf("%w: WithWait(%s): want >= 0 (0 waits until the context ends)", ErrInvalidOption, o.wait)
	case o.retrySet && o.retry == nil:
		return r, fmt.Errorf("%w: WithRetry(nil): want a strategy, such as ExponentialBackoff(4*time.Millisecond, 256*time.Millisecond)", ErrInvalidOption)
	case checkStrategy(o.retry) != nil:
		return r, fmt.Errorf("%w: WithRetry: %v", ErrInvalidOption, checkStrategy(o.retry))
	case try && o.unfair:
		return r, fmt.Errorf("%w: WithUnfair does not apply to TryAcquire, which takes a free lock whoever waits", ErrInvalidOption)
	case o.ownerSet && ValidateLabel(o.owner) != nil:
		return r, fmt.Errorf("%w: WithOwner: %v", ErrInvalidOption, ValidateLabel(o.owner))
	case o.holderSet && ValidateLabel(o.holder) != nil:
		return r, fmt.Errorf("%w: WithHolder: %v", ErrInvalidOption, ValidateLabel(o.holder))
	case o.final && r.Unfair:
		return r, fmt.Errorf("%w: WithFinal applies to a fair acquisition with WithWaiter: an unfair one (TryAcquire, WithUnfair) has no place in the queue to give up", ErrInvalidOption)
	case o.final && !o.waiterSet:
		return r, fmt.Errorf("%w: WithFinal applies with WithWaiter: a call without it has a place of its own, given up when the call ends", ErrInvalidOption)
	case o.waiterSet && ValidateWaiter(o.waiter) != nil:
		return r, fmt.Errorf("%w: WithWaiter: %v", ErrInvalidOption, ValidateWaiter(o.waiter))
	case o.keepAlive && o.detached:
		return r, fmt.Errorf("%w: WithDetached and WithKeepAlive together: a detached lease has no goroutine to keep it alive; its remote holder refreshes it by lease id (RefreshID). Give one of them", ErrInvalidOption)
	}
	return r, nil
}

// NewWaiterID returns a fresh WithWaiter id: 128 random bits in hex, as a
// lease id. For other implementations of Locker (package client).
func NewWaiterID() (string, error) { return newLeaseID() }

// ValidateWaiter checks a WithWaiter id: 32 lowercase hex digits.
func ValidateWaiter(id string) error {
	if err := checkID128(id); err != nil {
		return fmt.Errorf("%v (128 random bits, new for each acquisition)", err)
	}
	return nil
}

// ValidateLabel checks an owner label or a holder identity: 1 to
// MaxLabelLen bytes of printable UTF-8.
func ValidateLabel(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty; want 1 to %d bytes of printable UTF-8", MaxLabelLen)
	case len(s) > MaxLabelLen:
		return fmt.Errorf("%d bytes; want at most %d", len(s), MaxLabelLen)
	case !utf8.ValidString(s):
		return errors.New("not UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("has %q; want printable characters", r)
		}
	}
	return nil
}

// ForceOption configures one ForceRelease. As with Option, an invalid one
// is an error (ErrInvalidOption).
type ForceOption func(*forceOpts)

type forceOpts struct {
	token     fence.Token
	tokenSet  bool
	nilOption bool
}

// IfToken makes ForceRelease conditional: it releases the lock only if the
// grant holding it has token t (1 to fence.MaxToken), and otherwise
// returns a *HeldByOtherError (another grant holds it) or the state of a
// free lock, releasing nothing. Unlike an unconditional force-release, one
// with IfToken is safe to send again after an answer that never came: the
// second finds grant t gone and removes nobody else. Default: release the
// lock whoever holds it.
func IfToken(t fence.Token) ForceOption {
	return func(o *forceOpts) { o.token, o.tokenSet = t, true }
}

// ForceOptions are the options of one ForceRelease, as
// ResolveForceOptions resolves them: for packages (such as client) that
// offer ForceRelease with the same options.
type ForceOptions struct {
	// Token is IfToken's token; 0 releases the lock whoever holds it.
	Token fence.Token
}

// ResolveForceOptions applies opts. It returns an error matching
// ErrInvalidOption for a nil ForceOption and for IfToken with a token
// outside 1 to fence.MaxToken.
func ResolveForceOptions(opts ...ForceOption) (ForceOptions, error) {
	var o forceOpts
	for _, f := range opts {
		if f == nil {
			o.nilOption = true
			continue
		}
		f(&o)
	}
	switch {
	case o.nilOption:
		return ForceOptions{}, fmt.Errorf("%w: a nil ForceOption", ErrInvalidOption)
	case o.tokenSet && (o.token == 0 || o.token > fence.MaxToken):
		return ForceOptions{}, fmt.Errorf("%w: IfToken(%d): want the token of the grant to release, 1 to %d", ErrInvalidOption, uint64(o.token), fence.MaxToken)
	}
	return ForceOptions{Token: o.token}, nil
}
