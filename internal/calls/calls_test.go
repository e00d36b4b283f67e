package calls

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errShut = errors.New("shut")

// TestCloseEndsAndWaits: Close ends a call in progress with its cause and
// returns only once the call has; later Begins get the cause.
func TestCloseEndsAndWaits(t *testing.T) {
	var s Set
	ctx, end, err := s.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	go func() { // the call: waits until its context ends
		<-ctx.Done()
		if got := s.Ended(ctx); got != errShut {
			t.Errorf("Ended = %v, want %v", got, errShut)
		}
		close(returned)
		end()
	}()
	s.Close(errShut)
	if err := s.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before the call did")
	}
	if _, _, err := s.Begin(t.Context()); err != errShut {
		t.Errorf("Begin after Close: %v, want %v", err, errShut)
	}
	s.Close(errors.New("again"))
	if _, _, err := s.Begin(t.Context()); err != errShut {
		t.Errorf("Begin after a second Close: %v, want the first cause %v", err, errShut)
	}
}

// TestCallerEndsItsOwn: a call whose own context ends is not Close's, and
// a Close that waits for a call that does not return ends at its ctx.
func TestCallerEndsItsOwn(t *testing.T) {
	var s Set
	parent, cancel := context.WithCancel(t.Context())
	ctx, end, err := s.Begin(parent)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if ctx.Err() == nil || s.Ended(ctx) != nil {
		t.Errorf("the caller's cancel: ctx.Err %v, Ended %v; want ended, not by Close", ctx.Err(), s.Ended(ctx))
	}
	cctx, ccancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer ccancel()
	s.Close(errShut)
	if err := s.Wait(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a call that has not returned: %v, want its ctx's deadline", err)
	}
	end()
	if err := s.Wait(t.Context()); err != nil {
		t.Errorf("Wait once it returned: %v", err)
	}
}

// TestWaitWithNothingRunning: Wait with an ended ctx, once every call has
// returned (or none began), is nil. It selected on both at once and Go
// picks at random among the ready: half of the Closes of a client with
// nothing running said acquisitions were still returning.
func TestWaitWithNothingRunning(t *testing.T) {
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	for i := range 200 {
		var s Set
		if i%2 == 1 { // a call that returned before Close
			_, end, err := s.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			end()
		}
		s.Close(errShut)
		if err := s.Wait(ended); err != nil {
			t.Fatalf("Wait %d with nothing running and an ended ctx: %v", i, err)
		}
	}
}
