package groupcommit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/groupcommit"
	"github.com/fenced/fenced/internal/testenv"
)

// Defect 170: a batch whose callers had all left was committed on a
// context of its own (Context: 10 s in the etcd store) by a runner nobody
// waited for, so it outlived its owner's Close by up to that timeout, and
// a write of a caller that had left could be applied after Close. Now
// every batch's context derives from the committer's life, and Close ends
// that life and waits for the commits in progress.
func TestCloseEndsAndWaitsForItsCommits(t *testing.T) {
	before := testenv.Goroutines()
	ended := make(chan error, 16)
	entered := make(chan struct{}, 16)
	c := &groupcommit.Committer[int]{Inline: true}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		ctx, cancel := groupcommit.Context(batch, time.Minute)
		defer cancel()
		entered <- struct{}{}
		<-ctx.Done() // a hung backend, whose client ends a call with its context
		ended <- ctx.Err()
		for _, r := range batch {
			r.Done(nil, ctx.Err())
		}
	}
	c.Slots = 1
	// A caller that leaves at 100 ms, and five queued behind its commit,
	// whose shared batch goes out then, and who leave at 300 ms: nobody
	// waits for it any more.
	var wg sync.WaitGroup
	first, cancelFirst := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancelFirst)
	wg.Go(func() {
		if _, err := c.Do(first, "", 0); !errors.Is(err, context.Canceled) {
			t.Errorf("first caller: %v, want context.Canceled", err)
		}
	})
	<-entered
	for i := range 5 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := c.Do(ctx, "", i+1); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("caller %d: %v, want its context's end", i+1, err)
			}
		})
	}
	wg.Wait() // every caller left; the shared batch still commits
	select {
	case <-entered:
	case <-time.After(time.Second):
		t.Fatal("the shared batch was not committed")
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first commit: %v, want its caller's cancellation", err)
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-ended:
		t.Fatalf("the shared batch ended before Close: %v", err)
	default:
	}
	began := time.Now()
	c.Close()
	took := time.Since(began)
	if took > time.Second {
		t.Errorf("Close took %v", took)
	}
	// The shared batch's commit has ended, with the committer's life.
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the shared batch ended with %v, want context.Canceled (the committer's life)", err)
		}
	default:
		t.Error("Close returned before the commit in progress ended")
	}
	// A runner's goroutine returns just after its Done, which Close waits
	// for: give it a moment to exit (CI saw one runnable there).
	var left []string
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		if left = newGroupcommitGoroutines(before); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("%d goroutine(s) of the committer still running 1s after Close:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
	// Closed: later requests fail at once, and nothing is committed.
	if _, err := c.Do(context.Background(), "", 99); !errors.Is(err, groupcommit.ErrClosed) {
		t.Errorf("Do after Close: %v, want ErrClosed", err)
	}
	select {
	case <-entered:
		t.Error("a request was committed after Close")
	default:
	}
	c.Close() // idempotent
}

// Requests pending when the owner's Life ends fail with its cause, as do
// later ones; those being committed end with it.
func TestLifeEndsPendingAndLaterRequests(t *testing.T) {
	errOwner := errors.New("owner closed")
	life, end := context.WithCancelCause(context.Background())
	entered := make(chan struct{})
	c := &groupcommit.Committer[int]{Slots: 1, Life: life}
	c.Commit = func(batch []*groupcommit.Request[int]) {
		ctx, cancel := groupcommit.Context(batch, time.Minute)
		defer cancel()
		if batch[0].Arg == 0 {
			close(entered)
		}
		<-ctx.Done()
		for _, r := range batch {
			r.Done(nil, ctx.Err())
		}
	}
	res := make(chan error, 3)
	for i := range 3 {
		go func() {
			if i > 0 {
				<-entered // queued behind the first batch, in its one slot
			}
			_, err := c.Do(context.Background(), "", i)
			res <- err
		}()
	}
	<-entered
	time.Sleep(50 * time.Millisecond) // the other two queue up
	end(errOwner)
	for range 3 {
		select {
		case err := <-res:
			if !errors.Is(err, errOwner) && !errors.Is(err, context.Canceled) {
				t.Errorf("a request when the life ended: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request still waiting 5 s after the committer's life ended")
		}
	}
	if _, err := c.Do(context.Background(), "", 9); !errors.Is(err, errOwner) {
		t.Errorf("Do after the life ended: %v, want its cause", err)
	}
	c.Close()
}

// newGroupcommitGoroutines lists the goroutines running groupcommit's
// code that were not in before.
func newGroupcommitGoroutines(before map[string]bool) []string {
	var left []string
	for _, g := range testenv.GoroutinesIn("groupcommit.(*Committer") {
		id, _, _ := strings.Cut(g, " [")
		if !before[id] {
			left = append(left, g)
		}
	}
	return left
}
