// Package calls ends a client's calls in progress when the client closes:
// a call that waits (for a held lock, a backoff, a long poll) returns at
// once rather than at its next attempt, and Close waits for it to return.
package calls

import (
	"context"
	"errors"
	"sync"
)

// Set counts the calls in progress of one owner. Its zero value is ready;
// it must not be copied.
type Set struct {
	mu     sync.Mutex
	closed error              // the cause, once closed
	calls  map[*call]struct{} // in progress
	idle   chan struct{}      // closed when calls empties after Close
}

// call is one call in progress: how Close ends it.
type call struct{ cancel context.CancelCauseFunc }

// Begin counts a call and returns ctx, ended also by Close with its cause,
// and end, to call when the call returns. After Close it returns the cause.
func (s *Set) Begin(ctx context.Context) (context.Context, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &call{cancel}
	s.mu.Lock()
	if s.closed != nil {
		s.mu.Unlock()
		cancel(nil)
		return nil, nil, s.closed
	}
	if s.calls == nil {
		s.calls = make(map[*call]struct{})
	}
	s.calls[c] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		cancel(nil)
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.calls, c)
		if len(s.calls) == 0 && s.idle != nil {
			select {
			case <-s.idle:
			default:
				close(s.idle)
			}
		}
	}, nil
}

// Close ends every call in progress with cause and makes later Begins
// return it; a later Close keeps the first cause. Wait waits for the calls.
func (s *Set) Close(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed != nil {
		return
	}
	s.closed = cause
	s.idle = make(chan struct{})
	if len(s.calls) == 0 {
		close(s.idle)
	}
	for c := range s.calls {
		c.cancel(cause)
	}
}

// Wait waits, after Close, until every call has returned, or ctx ends
// (then ctx.Err()); calls that have all returned are nil, whatever ctx.
func (s *Set) Wait(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	if idle == nil {
		return errors.New("calls: Wait before Close")
	}
	// Idle first: when both are ready a select picks at random, and a
	// Close with nothing running failed half the time with an ended ctx.
	select {
	case <-idle:
		return nil
	default:
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ended is Close's cause if it ended ctx (from Begin), else nil.
func (s *Set) Ended(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	s.mu.Lock()
	cause := s.closed
	s.mu.Unlock()
	if cause != nil && context.Cause(ctx) == cause {
		return cause
	}
	return nil
}
