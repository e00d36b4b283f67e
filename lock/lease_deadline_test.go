package lock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
)

// Defect 169: a lease whose deadline passed said so only once its timer's
// callback ran. A holder paused past its deadline (SIGSTOP, GC, swap) that
// checked Err right after it resumed raced that callback, and could see
// nil while another held the lock. Err, and its Context's Err, now read
// the clock.

// deadlineKeeper grants every refresh and release, and counts them.
type deadlineKeeper struct {
	mu                  sync.Mutex
	refreshes, releases int
}

func (k *deadlineKeeper) Refresh(_ context.Context, _, _ string, ttl time.Duration, _ uint64) (Grant, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refreshes++
	return Grant{Token: 7, TTL: ttl, Count: 1}, nil
}

func (k *deadlineKeeper) Release(context.Context, string, string, string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.releases++
	return nil
}

func (k *deadlineKeeper) counts() (refreshes, releases int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.refreshes, k.releases
}

// stalledLease adopts a lease of a 1 s TTL granted 500 ms ago, keep-alive
// off, stops its timer as a process paused before it fired would find it
// (its callback not run), and waits until its deadline has passed. A
// machine so loaded that the timer fired first (in the half second left)
// gets another lease, up to five times.
func stalledLease(t *testing.T, opts ...Option) (*Lease, *LeaseSet, *deadlineKeeper) {
	t.Helper()
	for range 5 {
		k := &deadlineKeeper{}
		s, err := NewLeaseSet(k)
		if err != nil {
			t.Fatal(err)
		}
		id, err := newLeaseID()
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Adopt(t.Context(), "deadline", id, Grant{Token: 7, TTL: time.Second, Count: 1}, time.Now().Add(-500*time.Millisecond), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release(context.Background()) })
		l.mu.Lock()
		stopped := l.timer == nil || l.timer.Stop()
		l.mu.Unlock()
		if stopped {
			return waitPastDeadline(t, l), s, k
		}
	}
	t.Fatal("the lease's timer fired before the test could stop it, five times")
	return nil, nil, nil
}

// waitPastDeadline waits until l's deadline has passed, and checks that
// Done is still open (its timer stopped).
func waitPastDeadline(t *testing.T, l *Lease) *Lease {
	t.Helper()
	time.Sleep(time.Until(l.Deadline()) + 5*time.Millisecond)
	select {
	case <-l.Done():
		t.Fatal("Done closed with the timer stopped")
	default:
	}
	return l
}

func doneNow(l *Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// TestLeaseDeadlineErrWithoutTimer: past the deadline, the first Err says
// ErrExpired though the timer has not run, and loses the lease on the
// timer's path: Done closes at once, the set forgets it, Release reports
// the loss (a write under it may have overlapped another holder's).
func TestLeaseDeadlineErrWithoutTimer(t *testing.T) {
	t.Parallel()
	l, s, k := stalledLease(t)
	past := time.Since(l.Deadline())
	if err := l.Err(); !errors.Is(err, ErrExpired) {
		t.Fatalf("Err %v past the deadline: %v; want ErrExpired", past, err)
	}
	if !doneNow(l) {
		t.Fatal("Err said ErrExpired, Done still open")
	}
	if err := l.Err(); !errors.Is(err, ErrExpired) {
		t.Fatalf("Err again: %v", err)
	}
	if err := l.Context().Err(); err != context.Canceled {
		t.Fatalf("Context().Err(): %v; want context.Canceled", err)
	}
	if err := context.Cause(l.Context()); !errors.Is(err, ErrExpired) {
		t.Fatalf("context.Cause: %v; want ErrExpired", err)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		_, tracked := s.leases[l]
		s.mu.Unlock()
		if !tracked {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the set still tracks the lost lease")
		}
	}
	l.mu.Lock()
	stopped := l.stopped
	l.mu.Unlock()
	if !stopped {
		t.Error("the lost lease's timer is not stopped")
	}
	if err := l.Release(t.Context()); !errors.Is(err, ErrExpired) {
		t.Errorf("Release of a lease lost at its deadline: %v; want ErrExpired", err)
	}
	if _, releases := k.counts(); releases != 1 {
		t.Errorf("%d releases sent; want 1 (it frees the lock sooner)", releases)
	}
}

// TestLeaseDeadlineContext: the lease's Context applies the same check in
// its Err, and is otherwise the lease's context: its token, its cause, one
// value, no deadline of its own (a keep-alive lease's moves: a
// WithTimeout under it must keep its own timer), and contexts derived from
// it end with it.
func TestLeaseDeadlineContext(t *testing.T) {
	t.Parallel()
	l, _, _ := stalledLease(t)
	ctx := l.Context()
	if ctx != l.Context() {
		t.Error("Context() is not one value")
	}
	if tok, ok := fence.FromContext(ctx); !ok || tok != 7 {
		t.Errorf("fence.FromContext: %d, %v; want 7", tok, ok)
	}
	if dl, ok := ctx.Deadline(); ok {
		t.Errorf("Context().Deadline() = %v, true; want none", dl)
	}
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	after := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() { close(after) })
	defer stopAfter()
	if doneNow(l) || child.Err() != nil {
		t.Fatal("lost before anyone asked, with the timer stopped")
	}
	if err := ctx.Err(); err != context.Canceled {
		t.Fatalf("Context().Err() %v past the deadline: %v; want context.Canceled", time.Since(l.Deadline()), err)
	}
	if err := context.Cause(ctx); !errors.Is(err, ErrExpired) {
		t.Errorf("context.Cause: %v; want ErrExpired", err)
	}
	if err := l.Err(); !errors.Is(err, ErrExpired) {
		t.Errorf("Err after Context().Err(): %v", err)
	}
	if !doneNow(l) {
		t.Error("Done still open")
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Error("a context derived from Context() was not cancelled with the lease")
	}
	select {
	case <-after:
	case <-time.After(5 * time.Second):
		t.Error("context.AfterFunc on Context() did not run")
	}
	if err := context.Cause(child); !errors.Is(err, ErrExpired) {
		t.Errorf("context.Cause of a derived context: %v", err)
	}
	if tok, ok := fence.FromContext(child); !ok || tok != 7 {
		t.Errorf("fence.FromContext of a derived context: %d, %v", tok, ok)
	}
}

// TestLeaseDeadlineContextTimeout: a timeout under a held keep-alive
// lease's Context is the timeout's, though the lease's deadline is sooner.
func TestLeaseDeadlineContextTimeout(t *testing.T) {
	t.Parallel()
	s, err := NewLeaseSet(&deadlineKeeper{})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := newLeaseID()
	l, err := s.Adopt(t.Context(), "deadline", id, Grant{Token: 7, TTL: 300 * time.Millisecond, Count: 1}, time.Now(), WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	ctx, cancel := context.WithTimeout(l.Context(), time.Second)
	defer cancel()
	select {
	case <-ctx.Done():
		if l.Err() != nil {
			t.Fatalf("the keep-alive lease was lost: %v", l.Err())
		}
		if ctx.Err() != context.DeadlineExceeded {
			t.Fatalf("ended by %v", ctx.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a 1 s timeout under a kept-alive lease's Context never ended (deadline now in %v)", time.Until(l.Deadline()))
	}
}

// TestLeaseDeadlineRefreshAfterDeadline: a refresh of a lease past its
// deadline is not sent: the lease is lost, and another may hold the lock.
func TestLeaseDeadlineRefreshAfterDeadline(t *testing.T) {
	t.Parallel()
	l, _, k := stalledLease(t)
	if err := l.Refresh(t.Context(), 0); !errors.Is(err, ErrExpired) {
		t.Fatalf("Refresh past the deadline: %v; want ErrExpired", err)
	}
	if refreshes, _ := k.counts(); refreshes != 0 {
		t.Errorf("%d refreshes sent past the deadline", refreshes)
	}
	if !doneNow(l) {
		t.Error("Done still open")
	}
}

// TestLeaseDeadlineDetached: a detached lease's remote holder refreshes it
// by lease id, without moving its Deadline here: as documented
// (WithDetached), its deadline does not end it.
func TestLeaseDeadlineDetached(t *testing.T) {
	t.Parallel()
	l, _, _ := stalledLease(t, WithDetached())
	if err := l.Err(); err != nil {
		t.Errorf("a detached lease past its local deadline: %v; want nil", err)
	}
	if err := l.Context().Err(); err != nil {
		t.Errorf("a detached lease's Context past its local deadline: %v; want nil", err)
	}
	if doneNow(l) {
		t.Error("a detached lease's Done closed at its local deadline")
	}
}

// pausedHolder is the child process of TestLeaseDeadlinePausedHolder: it
// holds a kept-alive lease of a 1 s TTL and, like any holder, checks Err
// before each "write" (every millisecond), until the lease is lost. It
// prints each Err that said nil though the deadline had passed before the
// call (and was not moved by a refresh meanwhile), and the first non-nil.
func pausedHolder() {
	time.AfterFunc(30*time.Second, func() { os.Exit(3) }) // an orphan ends
	s, _ := NewLeaseSet(&deadlineKeeper{})
	id, _ := newLeaseID()
	l, err := s.Adopt(context.Background(), "paused", id, Grant{Token: 7, TTL: time.Second, Count: 1}, time.Now(), WithKeepAlive())
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	fmt.Println("HELD")
	for {
		dl := l.Deadline()
		now := time.Now()
		err := l.Err()
		if err != nil {
			fmt.Printf("LOST expired=%v done=%v past_deadline_by=%v err=%v\n", errors.Is(err, ErrExpired), doneNow(l), now.Sub(dl), err)
			os.Exit(0)
		}
		if !now.Before(dl) && l.Deadline().Equal(dl) {
			fmt.Printf("NIL past_deadline_by=%v\n", now.Sub(dl))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseDeadlinePausedHolder pauses a real holder process (SIGSTOP)
// past its lease's deadline and resumes it (SIGCONT): the first Err it
// reads past the deadline must be ErrExpired, in every run. Before the
// fix, some runs read nil first, until the timer's callback ran.
func TestLeaseDeadlinePausedHolder(t *testing.T) {
	if os.Getenv("FENCED_TEST_PAUSED_HOLDER") != "" {
		pausedHolder()
		return
	}
	runs, bad := 10, 0
	for run := range runs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseDeadlinePausedHolder$")
		cmd.Env = append(os.Environ(), "FENCED_TEST_PAUSED_HOLDER=1")
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		if !sc.Scan() || sc.Text() != "HELD" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child: %q", sc.Text())
		}
		time.Sleep(200 * time.Millisecond) // a refresh or so
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // past the 1 s TTL
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		var nils []string
		last := ""
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "NIL") {
				nils = append(nils, sc.Text())
			}
			last = sc.Text()
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("run %d: child: %v (last: %s)", run, err, last)
		}
		if !strings.HasPrefix(last, "LOST expired=true done=true") {
			t.Errorf("run %d: the child's end: %q; want ErrExpired with Done closed", run, last)
		}
		t.Logf("run %d: %d nil Errs past the deadline; %s", run, len(nils), last)
		if len(nils) > 0 {
			bad++
			t.Logf("  first: %s", nils[0])
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d runs: the paused holder's Err said nil after its deadline", bad, runs)
	}
}
