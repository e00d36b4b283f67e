package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/groupcommit"
)

func TestBatchesAndResults(t *testing.T) {
	for _, slots := range []int{1, 3} {
		t.Run(fmt.Sprint("slots-", slots), func(t *testing.T) {
			var (
				running, maxRunning atomic.Int32
				commits, requests   atomic.Int64
			)
			c := &groupcommit.Committer[int]{Slots: slots}
			c.SetMaxBatch(16)
			c.Commit = func(batch []*groupcommit.Request[int]) {
				n := running.Add(1)
				for {
					m := maxRunning.Load()
					if n <= m || maxRunning.CompareAndSwap(m, n) {
						break
					}
				}
				if len(batch) > 16 {
					t.Errorf("batch of %d over the bound 16", len(batch))
				}
				keys := map[string]bool{}
				for _, r := range batch {
					if keys[r.Key] {
						t.Errorf("key %s twice in one batch", r.Key)
					}
					keys[r.Key] = true
				}
				commits.Add(1)
				requests.Add(int64(len(batch)))
				running.Add(-1)
				for _, r := range batch {
					r.Done(r.Arg*2, nil)
				}
			}
			var wg sync.WaitGroup
			for w := 0; w < 64; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						v, err := c.Do(context.Background(), fmt.Sprint("k", (w+i)%8), w*1000+i)
						if err != nil || v.(int) != 2*(w*1000+i) {
							t.Errorf("Do: %v, %v", v, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if maxRunning.Load() > int32(slots) {
				t.Fatalf("%d commits at once, %d slots", maxRunning.Load(), slots)
			}
			if requests.Load() != 64*200 || commits.Load() >= requests.Load() {
				t.Fatalf("%d requests in %d commits: want every request once, batched", requests.Load(), commits.Load())
			}
			t.Logf("%d requests in %d commits", requests.Load(), commits.Load())
		})
	}
}

// Callers that give up, in the queue or in a batch, leak no slot: later
// callers are still served.
func TestCallersThatLeave(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 100)
	c := &groupcommit.Committer[int]{}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		entered <- struct{}{}
		<-release
		for _, r := range batch {
			r.Done(r.Arg, nil)
		}
	}
	first := make(chan error, 1)
	go func() { _, err := c.Do(context.Background(), "", 1); first <- err }()
	<-entered // the first batch is in flight and blocked
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Do(ctx, "", i); !errors.Is(err, context.Canceled) {
				t.Errorf("a waiter that gave up: %v", err)
			}
		}()
	}
	cancel()
	wg.Wait()
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if v, err := c.Do(context.Background(), "", 7); err != nil || v.(int) != 7 {
			t.Fatalf("after the waiters left: %v, %v", v, err)
		}
	}
}

// The caller whose request is being committed leaves when its context
// ends, without waiting for the commit (which a hung backend can hold for
// the commit's own timeout); the commit still completes, and the slot
// serves later callers.
func TestCallerLeavesItsCommitWithItsContext(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	c := &groupcommit.Committer[int]{}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		if batch[0].Arg == 1 {
			entered <- struct{}{}
			<-release // a hung backend
		}
		for _, r := range batch {
			r.Done(r.Arg, nil)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { _, err := c.Do(ctx, "", 1); res <- err }()
	<-entered
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the caller whose commit hangs: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller waited for its batch's commit after its context ended")
	}
	close(release)
	if v, err := c.Do(context.Background(), "", 2); err != nil || v.(int) != 2 {
		t.Fatalf("after the hung commit: %v, %v", v, err)
	}
}

// A lone request whose context can end only at its deadline (or never) is
// committed on its caller's goroutine, without the hand-off to a runner;
// one whose context can be cancelled earlier goes to a runner, so that
// its caller can leave at once.
func TestLoneRequestCommittedByItsCaller(t *testing.T) {
	timeout, cancelTimeout := context.WithTimeout(context.Background(), time.Minute)
	defer cancelTimeout()
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		inline bool
	}{
		{"background", context.Background(), true},
		{"deadline", timeout, true},
		{"cancellable", cancellable, false},
		{"deadline, leave on cancel", groupcommit.LeaveOnCancel(timeout), false},
		{"background, leave on cancel", groupcommit.LeaveOnCancel(context.Background()), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stack string
			c := &groupcommit.Committer[int]{Slots: 2, Inline: true}
			c.Commit = func(batch []*groupcommit.Request[int]) {
				buf := make([]byte, 8192)
				stack = string(buf[:runtime.Stack(buf, false)])
				for _, r := range batch {
					r.Done(r.Arg, nil)
				}
			}
			if v, err := c.Do(tc.ctx, "k", 5); err != nil || v.(int) != 5 {
				t.Fatalf("Do: %v, %v", v, err)
			}
			if inline := !strings.Contains(stack, "(*Committer[...]).run("); inline != tc.inline {
				t.Fatalf("committed on the caller's goroutine: %v, want %v; stack:\n%s", inline, tc.inline, stack)
			}
		})
	}
}

// TestLeaveOnCancel: a lone request whose context has a deadline and is
// marked LeaveOnCancel goes to a runner, so that its caller leaves as
// soon as the context is cancelled, while a backend that honours only
// deadlines (go-redis) holds the commit; unmarked, it is still committed
// inline. Before, a drained waiter's call was committed inline and its
// caller held until the call's deadline (docs/design.md, defect 197).
func TestLeaveOnCancel(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	committing := make(chan struct{}, 1)
	c := &groupcommit.Committer[int]{Inline: true, Slots: 2} // one for the hung commit
	c.Commit = func(batch []*groupcommit.Request[int]) {
		ctx, cancel := groupcommit.Context(batch, time.Minute)
		defer cancel()
		committing <- struct{}{}
		if batch[0].Arg == 1 {
			// As go-redis: the deadline ends the call, a cancellation
			// does not.
			deadline, _ := ctx.Deadline()
			select {
			case <-hang:
			case <-time.After(time.Until(deadline)):
			}
		}
		batch[0].Done(batch[0].Arg, nil)
	}
	parent, cancelParent := context.WithCancel(context.Background())
	ctx, cancel := context.WithTimeout(groupcommit.LeaveOnCancel(parent), time.Minute)
	defer cancel()
	left := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, "", 1)
		left <- err
	}()
	<-committing
	cancelParent()
	select {
	case err := <-left:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller did not leave when its LeaveOnCancel context was cancelled: its call was committed inline")
	}

	// Unmarked, and marked but without a deadline or with nothing to
	// cancel, a lone request is committed as before (inline or not,
	// TestLoneRequestCommittedByItsCaller): here it is only answered.
	if v, err := c.Do(groupcommit.LeaveOnCancel(context.Background()), "", 2); err != nil || v.(int) != 2 {
		t.Fatalf("after: %v, %v", v, err)
	}
	<-committing
}

// A lone request committed by its caller is bounded by its caller's
// context (Context): the caller returns by its deadline while the backend
// hangs, and the slot serves later callers.
func TestLoneRequestEndsAtItsDeadline(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	c := &groupcommit.Committer[int]{Inline: true}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		ctx, cancel := groupcommit.Context(batch, time.Minute)
		defer cancel()
		if batch[0].Arg == 1 {
			select {
			case <-hang:
			case <-ctx.Done():
				batch[0].Done(nil, ctx.Err())
				return
			}
		}
		for _, r := range batch {
			r.Done(r.Arg, nil)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := c.Do(ctx, "", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a lone request while the backend hangs: %v, want its deadline", err)
	}
	if took := time.Since(t0); took > 10*time.Second {
		t.Fatalf("the caller returned after %s, its deadline was 100ms", took)
	}
	if v, err := c.Do(context.Background(), "", 2); err != nil || v.(int) != 2 {
		t.Fatalf("after: %v, %v", v, err)
	}
}

// TestStalledCommitFreesItsSlot: a commit that hangs (a request held by a
// backend that will not answer it before its own timeout) holds its
// callers, but after Stall no longer holds the only slot: later requests
// are committed beside it, inline or by a runner, and once it returns
// the slot count is what it was (one more request goes through, and a
// second hang again frees the slot). Before, every later request waited
// for the hung commit (defect 108).
func TestStalledCommitFreesItsSlot(t *testing.T) {
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprint("inline-", inline), func(t *testing.T) {
			hanging, hang := make(chan struct{}), make(chan struct{})
			c := &groupcommit.Committer[string]{Slots: 1, Inline: inline, Stall: 20 * time.Millisecond}
			c.Commit = func(batch []*groupcommit.Request[string]) {
				for _, r := range batch {
					if r.Arg == "hang" {
						close(hanging)
						<-hang
					}
				}
				for _, r := range batch {
					r.Done(r.Arg, nil)
				}
			}
			hung := make(chan error, 1)
			go func() {
				_, err := c.Do(context.Background(), "", "hang")
				hung <- err
			}()
			<-hanging
			// Many requests behind it, from several callers at once and
			// then one at a time, all answered while it hangs.
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 20 {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						v, err := c.Do(ctx, "", fmt.Sprint(w, "-", i))
						cancel()
						if err != nil || v != fmt.Sprint(w, "-", i) {
							t.Errorf("a request behind a hung commit: %v, %v", v, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			select {
			case err := <-hung:
				t.Fatalf("the hung commit returned before it was let go: %v", err)
			default:
			}
			close(hang)
			if err := <-hung; err != nil {
				t.Fatal(err)
			}
			if v, err := c.Do(context.Background(), "", "after"); err != nil || v != "after" {
				t.Fatalf("after the hung commit returned: %v, %v", v, err)
			}
		})
	}
}

// TestStallsAreBounded: a backend slow for every commit (an overloaded
// etcd) gets at most MaxStalled set-aside commits a slot beside the one
// in its slot, not a new one every Stall.
func TestStallsAreBounded(t *testing.T) {
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	c := &groupcommit.Committer[int]{Slots: 1, Stall: 5 * time.Millisecond}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		inFlight.Add(-1)
		for _, r := range batch {
			r.Done(r.Arg, nil)
		}
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.Do(context.Background(), "", i); err != nil || v != i {
				t.Errorf("request %d: %v, %v", i, v, err)
			}
		}()
		time.Sleep(2 * time.Millisecond) // requests keep coming while commits hang
	}
	close(release)
	wg.Wait()
	if m := most.Load(); m > 1+groupcommit.MaxStalled {
		t.Fatalf("%d commits in flight at once, want at most %d", m, 1+groupcommit.MaxStalled)
	}
	if m := most.Load(); m < 2 {
		t.Fatalf("%d commits in flight at once: none was set aside", m)
	}
}

// TestResultBeforeTheContextEnds: a result that is in when the caller
// looks is returned, even if the caller's context has ended since. Before,
// Do picked at random between the result and ctx.Err() when both were
// ready, and dropped a committed result half the time (docs/design.md,
// defect 232).
func TestResultBeforeTheContextEnds(t *testing.T) {
	for i := range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c := &groupcommit.Committer[int]{Slots: 1, Inline: true}
		c.Commit = func(batch []*groupcommit.Request[int]) {
			for _, r := range batch {
				r.Done(r.Arg, nil)
			}
			cancel() // the context ends after the result is in
		}
		v, err := c.Do(ctx, "k", i)
		cancel()
		if err != nil || v.(int) != i {
			t.Fatalf("run %d: Do = %v, %v; want its committed result %d", i, v, err, i)
		}
	}
}
