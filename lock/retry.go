package lock

import (
	"fmt"
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

// checkedStrategy is a strategy of this package whose arguments can be
// wrong: ResolveOptions refuses it, rather than Acquire panicking on a nil
// inner strategy or giving up at once on a zero interval.
type checkedStrategy interface {
	check() error
}

// checkStrategy returns what is wrong with s, if it is one of this
// package's strategies (a strategy of your own is used as given).
func checkStrategy(s RetryStrategy) error {
	if c, ok := s.(checkedStrategy); ok {
		return c.check()
	}
	return nil
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

// LinearBackoff waits the same interval every time; d must be positive.
func LinearBackoff(d time.Duration) RetryStrategy { return linear(d) }

func (l linear) check() error {
	if l <= 0 {
		return fmt.Errorf("LinearBackoff(%s): want an interval > 0 (NoRetry gives up at once)", time.Duration(l))
	}
	return nil
}

type exponential struct {
	mu            sync.Mutex
	min, cur, max time.Duration
	bad           error // arguments out of range: ResolveOptions refuses it
}

func (e *exponential) fresh() RetryStrategy {
	return &exponential{min: e.min, cur: e.min, max: e.max, bad: e.bad}
}

func (e *exponential) check() error { return e.bad }

// ExponentialBackoff waits min, then twice as long each time up to max, with
// up to 25% random jitter so that waiters do not retry in step. min must be
// positive and max at least min.
func ExponentialBackoff(min, max time.Duration) RetryStrategy {
	var bad error
	if min <= 0 || max < min {
		bad = fmt.Errorf("ExponentialBackoff(%s, %s): want 0 < min <= max", min, max)
		// Called directly, NextBackoff still needs values it can use.
		min, max = time.Millisecond, time.Millisecond
	}
	return &exponential{min: min, cur: min, max: max, bad: bad}
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

// LimitRetry gives up after max retries of s, in each acquisition; s must
// not be nil and max not negative.
func LimitRetry(s RetryStrategy, max int) RetryStrategy { return &limited{s: s, max: max, left: max} }

func (l *limited) check() error {
	switch {
	case l.s == nil:
		return fmt.Errorf("LimitRetry(nil, %d): want a strategy to limit", l.max)
	case l.max < 0:
		return fmt.Errorf("LimitRetry(s, %d): want max >= 0 retries", l.max)
	}
	if err := checkStrategy(l.s); err != nil {
		return fmt.Errorf("LimitRetry: %v", err)
	}
	return nil
}

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
