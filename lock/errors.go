package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/fenced/fenced/fence"
)

var (
	// ErrNotAcquired: another holder has the lease and the wait budget (or
	// the retry strategy) ran out, or TryAcquire found it held; or the
	// last grant had no validity left (ErrTTLTooShort).
	ErrNotAcquired = errors.New("lock: not acquired")
	// ErrLost: this lease id does not hold the lease (it expired, was
	// released, or was taken over). Refresh and Release return it; a lost
	// lease's Err returns it.
	ErrLost = errors.New("lock: lease lost")
	// ErrExpired: the validity deadline passed without a successful refresh.
	// It matches ErrLost too.
	ErrExpired = fmt.Errorf("%w: validity deadline passed without a refresh", ErrLost)
	// ErrReleased is a released lease's Err.
	ErrReleased = errors.New("lock: lease released")
	// ErrInvalidName: the lock name breaks the rules (see ValidateName).
	ErrInvalidName = errors.New("lock: invalid lock name")
	// ErrInvalidTTL: the TTL is outside MinTTL to MaxTTL.
	ErrInvalidTTL = errors.New("lock: invalid ttl")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("lock: client closed")
	// ErrInvalidCursor: a List cursor this store did not return.
	ErrInvalidCursor = errors.New("lock: invalid list cursor")
	// ErrSentAgain marks an error of a LeaseKeeper's Release that answers
	// the request sent again after an earlier attempt got no answer, and
	// so may have been applied (package client's, when one fenced server
	// released the lease and lost its answer and another found it gone).
	// Lease.Release counts ErrLost with it, answered before the lease's
	// deadline, as released: before its deadline nothing but a release or
	// a force-release takes a lease away (docs/design.md, defect 97).
	ErrSentAgain = errors.New("lock: sent again after an attempt that got no answer")
	// ErrMaybeReleased marks a LeaseKeeper's ErrLost from Release that
	// the store cannot tell from the answer to a release of the lease
	// applied earlier, its answer lost: the Redis store's memory of
	// released lease ids was full (scripts/release.lua), the etcd store's
	// is one per lock and in its own process; a fenced server's 410 says
	// so (maybe_released) or, from an older server, says nothing.
	// Lease.Release forgives it after an attempt that got no answer,
	// before the deadline; an ErrLost without it is a loss (docs/design.md,
	// defects 173, 190). A LeaseKeeper of another kind marks its unsure
	// ErrLost so too.
	ErrMaybeReleased = errors.New("lock: the store cannot tell whether an earlier release of this lease freed it")
	// ErrCannotSend marks an error of a LeaseKeeper's Refresh or Release
	// whose request did not reach the store and will not if sent again,
	// until something outside the lease changes: package client's when
	// the TLS handshake with the fenced server fails on a certificate
	// (client.ErrCertificate, client.ErrClientCertificate). Nothing was
	// applied. A keep-alive refresh that fails so gives the lease up at
	// once, before its deadline, rather than trying again until then: its
	// Err matches ErrLost and the keeper's error, and says the lock stays
	// held in the store until its TTL runs out. Lease.Release that fails
	// so says the same, and does not count as an attempt that may have
	// been applied (docs/design.md, "Keep-alive").
	ErrCannotSend = errors.New("lock: the request cannot be sent to the store")
	// ErrOutOfOrder: the store did not apply a refresh because it had
	// applied a later one of the same lease first (a higher sequence
	// number): the lease stays as the later refresh left it, still held.
	// A refresh delayed on its way, after its caller gave up on it, must
	// not shorten a lease a later refresh extended (docs/design.md,
	// defect 102).
	ErrOutOfOrder = errors.New("lock: refresh out of order: a later refresh of this lease was applied first")
	// ErrInProgress: an earlier request of this remote acquisition (the same
	// AcquireRequest.Rejoin) has taken the lease and is still taking its
	// token, through this store or another: asked again in a moment, the
	// acquisition is handed that grant (or finds the lock free, if the
	// earlier request failed). It passes: the lock client tries again
	// within its budget, and the server answers 503 (docs/design.md, defect
	// 158).
	ErrInProgress = errors.New("lock: an earlier request of this acquisition is still taking the lock")
	// ErrTTLTooShort: the acquisition's last grant came back with no
	// validity left (its TTL less the time the grant took and the clock
	// drift kept, see Drift), so it was released: nobody holds the lock,
	// and a longer TTL is what helps. It matches ErrNotAcquired too, and is
	// not a *HeldError. The server answers it with 503, not 409 held.
	ErrTTLTooShort = errors.New("lock: the lease's TTL ran out before it was granted")
)

// ttlTooShortError is ErrTTLTooShort (and ErrNotAcquired) with the numbers
// that say how much longer a TTL the caller needs.
type ttlTooShortError struct {
	name  string
	ttl   time.Duration // the TTL granted
	took  time.Duration // from the attempt's start to the grant
	drift time.Duration // kept for clock drift (Drift)
}

func (e *ttlTooShortError) Error() string {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("lock: %q not acquired: its lease's TTL (%s) ran out before it was granted (the grant took %s, with %s kept for clock drift); ask for a TTL several times that",
		e.name, e.ttl, r(e.took), r(e.drift))
}

// Is makes errors.Is true for ErrTTLTooShort and ErrNotAcquired: callers
// that test only ErrNotAcquired keep working.
func (e *ttlTooShortError) Is(target error) bool {
	return target == ErrTTLTooShort || target == ErrNotAcquired
}

// HeldError is returned by a LeaseStore's Acquire when another holder has
// the lease. It matches ErrNotAcquired. Remaining is how long the holder's
// lease has left when the store knows it, else 0; waiters use it to try
// again when the lease expires rather than later.
type HeldError struct {
	Remaining time.Duration
	// Position is the waiter's place in the lock's queue, 1 at the head;
	// 0 for an unfair attempt, or when the store does not say.
	Position int
}

func (e *HeldError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("lock: not acquired: held for another %s", e.Remaining)
	}
	return "lock: not acquired: held"
}

// Is makes errors.Is(err, ErrNotAcquired) true.
func (e *HeldError) Is(target error) bool { return target == ErrNotAcquired }

// BackendError is a lease store's backend (Redis or etcd) that failed or
// did not answer in time. It says which backend and which operation, and
// unwraps to the cause: a context error still matches ctx.Err(). The
// server answers it with 503 unavailable.
type BackendError struct {
	Backend string // "redis", "etcd" or "redlock"
	Op      string // "acquire", "token", "confirm", "refresh", "release", "inspect", "watch" or "ping"
	Err     error
}

func (e *BackendError) Error() string {
	return "lock: " + e.Backend + " " + e.Op + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *BackendError) Unwrap() error { return e.Err }

func backendErr(backend, op string, err error) error {
	return &BackendError{Backend: backend, Op: op, Err: err}
}

// ErrHeldByOther: a ForceRelease with IfToken found the lock held by a
// grant with another token, and released nothing.
var ErrHeldByOther = errors.New("lock: held by another grant")

// HeldByOtherError is returned by ForceRelease with IfToken(Want) when the
// lock is held by a grant whose token is not Want: nothing was released.
// It matches ErrHeldByOther. Token is the token of the grant that holds the
// lock now; 0 for a Redis lease whose acquisition has not recorded its
// token yet.
type HeldByOtherError struct {
	Name  string
	Token fence.Token // the token that holds the lock now
	Want  fence.Token // the token IfToken named
}

func (e *HeldByOtherError) Error() string {
	if e.Token == 0 {
		return fmt.Sprintf("lock: %q is held by a grant that has no token yet, not by token %d: nothing was released", e.Name, e.Want)
	}
	return fmt.Sprintf("lock: %q is held by token %d, not by token %d: nothing was released", e.Name, e.Token, e.Want)
}

// Is makes errors.Is(err, ErrHeldByOther) true.
func (e *HeldByOtherError) Is(target error) bool { return target == ErrHeldByOther }
