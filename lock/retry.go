package lock

import (
	"math/rand/v2"
	"sync"
	"time"
)

// RetryStrategy says how long a waiter may sleep before it tries again when
// no release notification arrives. NextBackoff returns 0 to give up.
// Waiters wake earlier on a release notification or when the holder's lease
// expires; the strategy only bounds the wait when both are missed.
//
// The strategies of this package count per acquisition: one value may be
// given to WithRetry for any number of acquisitions, at once or one after
// another, and each starts from the beginning (LimitRetry's count,
// ExponentialBackoff's interval). A strategy of your own is used as given:
// if it keeps state, give each acquisition its own.
type RetryStrategy interface {
	NextBackoff() time.Duration
}

// freshStrategy is a strategy that keeps state, and makes a copy of itself
// as it was new.
type freshStrategy interface {
	fresh() RetryStrategy
}

// fresh returns s as new for one acquisition: a strategy shared by several
// (an option value kept in a variable) would otherwise carry its count or
// interval from one to the next.
func fresh(s RetryStrategy) RetryStrategy {
	if f, ok := s.(freshStrategy); ok {
		return f.fresh()
	}
	return s
}

type noRetry struct{}

func (noRetry) NextBackoff() time.Duration { return 0 }

// NoRetry gives up after the first attempt.
func NoRetry() RetryStrategy { return noRetry{} }

type linear time.Duration

func (l linear) NextBackoff() time.Duration { return time.Duration(l) }

// LinearBackoff waits the same interval every time.
func LinearBackoff(d time.Duration) RetryStrategy { return linear(d) }

type exponential struct {
	mu            sync.Mutex
	min, cur, max time.Duration
}

func (e *exponential) fresh() RetryStrategy { return &exponential{min: e.min, cur: e.min, max: e.max} }

// ExponentialBackoff waits min, then twice as long each time up to max, with
// up to 25% random jitter so that waiters do not retry in step.
func ExponentialBackoff(min, max time.Duration) RetryStrategy {
	if min <= 0 {
		min = time.Millisecond
	}
	if max < min {
		max = min
	}
	return &exponential{min: min, cur: min, max: max}
}

func (e *exponential) NextBackoff() time.Duration {
	e.mu.Lock()
	d := e.cur
	// cur <= max, so doubling it when it is at most max/2 stays within
	// max and cannot overflow (with a max near math.MaxInt64 it did, and
	// the next call panicked in rand.Int64N).
	if e.cur > e.max/2 {
		e.cur = e.max
	} else {
		e.cur *= 2
	}
	e.mu.Unlock()
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

type limited struct {
	mu   sync.Mutex
	s    RetryStrategy
	max  int
	left int
}

// LimitRetry gives up after max retries of s, in each acquisition.
func LimitRetry(s RetryStrategy, max int) RetryStrategy { return &limited{s: s, max: max, left: max} }

func (l *limited) fresh() RetryStrategy { return &limited{s: fresh(l.s), max: l.max, left: l.max} }

func (l *limited) NextBackoff() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left <= 0 {
		return 0
	}
	l.left--
	return l.s.NextBackoff()
}
