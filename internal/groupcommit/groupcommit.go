// Package groupcommit batches concurrent requests into shared commits. A
// request that finds a commit slot free starts the slot's runner, a
// goroutine that commits everything pending, batch after batch, and ends
// when nothing is; requests that arrive meanwhile join the next batch.
// Before it takes each batch the runner yields the processor once, so that
// callers it has just answered, and others ready to run, can add their
// next requests to it (with 64 clients on Redis leases it cut CPU per
// acquire+release from 65-71 to 54-55 us, in larger pipelines).
// Callers only wait for their result, so each returns when its context
// ends, whatever its batch is doing: a commit bounded by its own timeout
// (a hung backend) does not hold a caller past the caller's deadline.
//
// No timer holds a request back. A request that finds a slot free takes
// the slot's first batch itself, after the same yield. If that batch is
// the request alone, its context can end only at a deadline (or never),
// and the Committer is Inline, the caller commits it on its own goroutine,
// bounded by its context (Context): it still returns by its deadline, and
// it saves the hand-off to a runner and back, 30-50 us per call on an idle
// process (docs/design.md, "A lone call commits itself"). Any other first
// batch goes to a runner: a shared batch must not hold a caller, and a
// context that can be cancelled before its deadline must let its caller
// leave at once even if the backend's client does not watch for
// cancellation (go-redis does not). Which contexts can is not known from
// the context alone: one without a deadline that can be cancelled, and
// one marked LeaveOnCancel, go to a runner (docs/design.md, defect 197).
//
// A commit that goes unanswered for Stall (if set) gives its slot to the
// next batch: one request a backend holds (an etcd member cut off from
// its peers holds what it took for etcd's request timeout) then holds
// only its own callers.
//
// A Committer lives as long as its owner: every batch's context (Context)
// derives from its lifetime (Life), and Close ends that lifetime and
// waits for the commits in progress, so that no batch outlives the owner's
// Close (docs/design.md, defect 170).
package groupcommit

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// Request is one caller's part of a batch. Key, if not empty, keeps two
// requests with the same key out of one batch. Commit sets the result with
// Done.
type Request[T any] struct {
	Key string
	Arg T
	// Ctx is the caller's context. A batch of one has no other caller,
	// and may be committed on its caller's goroutine: Commit must end it
	// when Ctx ends (Context does that).
	Ctx context.Context

	life  context.Context // its committer's (Context derives from it)
	done  chan struct{}   // closed by Done
	state int             // pending, batched or gone; under mu
	value any
	err   error
}

const (
	pending = iota // in the queue
	batched        // taken into a batch
	gone           // its caller left before it was batched
)

// Done sets the request's result. Commit calls it exactly once per request
// of its batch.
func (r *Request[T]) Done(value any, err error) {
	r.value, r.err = value, err
	close(r.done)
}

// Committer commits batches of requests. The zero value is not usable:
// set Commit.
type Committer[T any] struct {
	// Commit commits one batch and calls Done on each of its requests. A
	// batch of more than one is shared, and its callers may leave: it must
	// not depend on any one caller's context. A batch of one must end when
	// its caller's context does. Context gives both.
	Commit func(batch []*Request[T])
	// Slots is how many batches may be committed at once; 0 means 1.
	Slots int
	// Inline lets a lone request be committed on its caller's goroutine
	// (see the package doc). Set it only if Commit's backend client ends a
	// call at its context's deadline: etcd's does; go-redis's only with
	// ContextTimeoutEnabled.
	Inline bool
	// Stall, if not 0, frees the slot of a commit still running after
	// Stall for the next batch, which then goes out beside it: a backend
	// that holds one request without an answer (an etcd member cut off
	// from its peers holds it until etcd's request timeout, 7 s by
	// default) must not hold every later request of the process too
	// (docs/design.md, defect 108). The stalled commit's callers still
	// wait for it, or for their contexts. At most MaxStalled commits a
	// slot are so set aside at once: a backend slow for everyone (an
	// overloaded etcd) then gets a few more batches in flight, not a new
	// one every Stall.
	Stall time.Duration
	// Life, if set before the first Do, is the committer's lifetime: its
	// owner's, ended by the owner's Close. Context derives every batch's
	// context from it, so a commit in progress ends with it, and once it
	// ends Do refuses new requests and pending ones fail, with its cause
	// (context.Cause). Close ends it too. Nil: until Close.
	Life context.Context

	mu       sync.Mutex
	life     context.Context         // Life's, or Background's; ended by Close
	end      context.CancelCauseFunc // ends life
	closed   bool                    // Close was called: no commit starts any more
	commits  sync.WaitGroup          // goroutines committing or about to (runners, inline callers): Close waits for them
	maxBatch int                     // 0: no bound
	queue    []*Request[T]
	running  int // slots with a runner
	stalled  int // commits that gave their slots up (Stall) and still run
}

// MaxStalled bounds the commits a slot that gave their slot up (Stall)
// and still run.
const MaxStalled = 4

// ErrClosed is Do's error once the committer was closed, if its Life had
// not ended with a cause of its own.
var ErrClosed = errors.New("groupcommit: closed")

// initLocked sets up the committer's lifetime at its first use. Called
// with mu.
func (c *Committer[T]) initLocked() {
	if c.life != nil {
		return
	}
	parent := c.Life
	if parent == nil {
		parent = context.Background()
	}
	c.life, c.end = context.WithCancelCause(parent)
}

// endedLocked is the cause of the end of the committer's life, or nil
// while it lives. Called with mu.
func (c *Committer[T]) endedLocked() error {
	c.initLocked()
	if c.closed || c.life.Err() != nil {
		return context.Cause(c.life)
	}
	return nil
}

// Close ends the committer's life (Life): the contexts of commits in
// progress end (Context), pending requests fail, and later ones fail at
// once. It waits for every commit in progress, runners and callers
// committing their lone requests, which end as soon as their Commit
// returns. It is idempotent; concurrent calls all wait.
func (c *Committer[T]) Close() {
	c.mu.Lock()
	c.initLocked()
	c.closed = true
	c.end(ErrClosed) // no effect if Life ended already, with its own cause
	c.mu.Unlock()
	c.commits.Wait()
}

// SetMaxBatch bounds later batches; 0 means no bound. A store that refuses
// a batch as too large can lower it.
func (c *Committer[T]) SetMaxBatch(n int) {
	c.mu.Lock()
	c.maxBatch = n
	c.mu.Unlock()
}

// MaxBatch is the bound of batches.
func (c *Committer[T]) MaxBatch() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxBatch
}

// Do adds a request to the next batch and returns its result once the
// batch is committed. If ctx ends first, Do returns ctx.Err(): a request
// already in a batch may still be committed, and its result is dropped.
func (c *Committer[T]) Do(ctx context.Context, key string, arg T) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if err := c.endedLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	r := &Request[T]{Key: key, Arg: arg, Ctx: ctx, life: c.life, done: make(chan struct{})}
	c.queue = append(c.queue, r)
	if c.running >= max(c.Slots, 1) {
		c.mu.Unlock()
		return c.wait(ctx, r)
	}
	// A slot is free: this caller takes its first batch, after the
	// runner's yield, so that others runnable now can join it. Close
	// waits for what it commits or hands to a runner (commits).
	c.running++
	c.commits.Add(1)
	c.mu.Unlock()
	runtime.Gosched()
	batch := c.take()
	switch {
	case len(batch) == 0:
		// Other runners took everything, this request too; take freed
		// the slot.
	case c.Inline && len(batch) == 1 && batch[0] == r && endsOnlyAtDeadline(ctx):
		// Alone: commit it here, bounded by its own context.
		if !c.commit(batch) {
			break // stalled: the slot has passed on
		}
		c.mu.Lock()
		if len(c.queue) > 0 {
			c.goRun(nil) // the slot passes to a runner for what came meanwhile
		} else {
			c.running--
		}
		c.mu.Unlock()
	default:
		c.goRun(batch) // owned by the slot: it ends when nothing is pending
	}
	c.commits.Done() // committed, or handed to a runner: what is left is waiting
	return c.wait(ctx, r)
}

// wait returns r's result, or ctx.Err() if ctx ends first. A result in
// by the time ctx has ended is returned: select picks at random among
// ready cases, and would drop it half the time (defect 232).
func (c *Committer[T]) wait(ctx context.Context, r *Request[T]) (any, error) {
	select {
	case <-r.done:
		return r.value, r.err
	case <-ctx.Done():
		select {
		case <-r.done:
			return r.value, r.err
		default:
		}
		c.mu.Lock()
		if r.state == pending {
			r.state = gone // no batch takes it
		}
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// endsOnlyAtDeadline is whether ctx cannot be cancelled before its
// deadline, if it has one, or its caller may as well return by its
// deadline. A context derived from one that can be cancelled (a
// WithTimeout of a WithCancel) counts, unless it is marked LeaveOnCancel:
// the context package does not say which parent can end it, and most
// cancellations (a client that went away) have nobody waiting for the
// answer.
func endsOnlyAtDeadline(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	if _, ok := ctx.Deadline(); !ok {
		return false
	}
	return ctx.Value(leaveOnCancelKey{}) == nil
}

type leaveOnCancelKey struct{}

// LeaveOnCancel marks ctx, and every context derived from it, as one
// whose cancellation before its deadline must let its caller leave at
// once: a Committer never commits a request of it on the caller's
// goroutine (Inline), where a backend client that honours only deadlines
// (go-redis) would hold the caller until the deadline; it goes to a
// runner, and the caller waits for it and leaves when ctx ends. A wait
// that fenced's drain ends (server's waitContext) is one: its client,
// still listening, must hear "shutting down" at once to ask another node,
// not when the hung call's deadline passes (docs/design.md, defect 197).
func LeaveOnCancel(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaveOnCancelKey{}, true)
}

// Context is a context to commit batch with, bounded by timeout and by
// its committer's life (Life, Close): a batch of one is also bounded by
// its caller's context, a larger batch (shared by callers who may leave)
// by no caller's.
func Context[T any](batch []*Request[T], timeout time.Duration) (context.Context, context.CancelFunc) {
	life := context.Background()
	if len(batch) > 0 && batch[0].life != nil {
		life = batch[0].life
	}
	if len(batch) != 1 {
		return context.WithTimeout(life, timeout)
	}
	ctx, cancel := context.WithTimeout(batch[0].Ctx, timeout)
	if life.Done() == nil {
		return ctx, cancel
	}
	stop := context.AfterFunc(life, cancel)
	return ctx, func() { stop(); cancel() }
}

// goRun starts a runner for the slot its caller holds or passes on. The
// caller is counted in commits (a runner, an inline caller, or a commit
// whose Stall passed while it runs), so the count is above 0 and Close's
// Wait may run meanwhile.
func (c *Committer[T]) goRun(batch []*Request[T]) {
	c.commits.Add(1)
	go func() {
		defer c.commits.Done()
		c.run(batch)
	}()
}

// run holds a slot: it commits batch, if any, and then batches until
// none is pending, and frees the slot.
func (c *Committer[T]) run(batch []*Request[T]) {
	for {
		if len(batch) > 0 && !c.commit(batch) {
			return // stalled: the slot has passed on
		}
		// Let the callers just answered, and others runnable now, add
		// their next requests to the next batch.
		runtime.Gosched()
		if batch = c.take(); len(batch) == 0 {
			return
		}
	}
}

// commit commits batch in the caller's slot. If Stall passes first, it
// frees the slot (and starts a runner in it if requests are pending), and
// reports that the caller holds no slot any more.
func (c *Committer[T]) commit(batch []*Request[T]) (holdsSlot bool) {
	if c.Stall <= 0 {
		c.Commit(batch)
		return true
	}
	var done, stalled bool // under mu
	t := time.AfterFunc(c.Stall, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if done || c.stalled >= MaxStalled*max(c.Slots, 1) {
			return
		}
		stalled = true
		c.stalled++
		if len(c.queue) > 0 {
			c.goRun(nil) // the slot passes to a runner for what is pending
		} else {
			c.running--
		}
	})
	c.Commit(batch)
	if t.Stop() {
		return true // the callback will not run
	}
	c.mu.Lock() // it ran, or runs: under mu, it sees done or has set stalled
	defer c.mu.Unlock()
	done = true
	if stalled {
		c.stalled--
	}
	return !stalled
}

// take removes the next batch from the queue: up to maxBatch requests with
// distinct keys, in arrival order, dropping those whose callers left. When
// nothing is pending it frees the caller's slot, under the same lock that a
// new request checks the slots with.
func (c *Committer[T]) take() []*Request[T] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.endedLocked(); err != nil {
		// Closed: nothing more is committed, and what is pending fails.
		for _, q := range c.queue {
			if q.state == pending {
				q.state = batched
				q.Done(nil, err)
			}
		}
		c.queue = nil
		c.running--
		return nil
	}
	var (
		batch []*Request[T]
		rest  = make([]*Request[T], 0, len(c.queue))
		seen  map[string]bool
	)
	for _, q := range c.queue {
		switch {
		case q.state == gone:
			continue
		case c.maxBatch > 0 && len(batch) >= c.maxBatch, q.Key != "" && seen[q.Key]:
			rest = append(rest, q)
			continue
		}
		if q.Key != "" {
			if seen == nil {
				seen = make(map[string]bool)
			}
			seen[q.Key] = true
		}
		q.state = batched
		batch = append(batch, q)
	}
	c.queue = rest
	if len(batch) == 0 {
		c.running--
	}
	return batch
}
