// Package groupcommit batches concurrent requests into shared commits with
// no goroutine of its own and no timer: the caller that finds a commit slot
// free commits everything pending, its own request included, after one
// scheduler yield that lets concurrent callers join; callers that arrive
// while every slot is busy wait, and the batch they form is committed by
// one of them, handed the slot when the commit before it ends.
//
// This is flat combining. Against a dedicated batcher goroutine it saves
// the hand-offs between goroutines on every request, which is most of the
// cost of a lone request on a fast store.
package groupcommit

import (
	"context"
	"runtime"
	"sync"
)

// Request is one caller's part of a batch. Key, if not empty, keeps two
// requests with the same key out of one batch. Commit sets the result with
// Done.
type Request[T any] struct {
	Key string
	Arg T

	done     chan struct{} // closed by Done
	lead     chan struct{} // closed when this waiter is handed a slot
	promoted bool          // lead is closed; under the committer's mu
	state    int           // pending, batched or gone; under mu
	value    any
	err      error
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
	// Commit commits one batch and calls Done on each of its requests. It
	// runs on a caller's goroutine and must not depend on that caller's
	// context: the batch is shared.
	Commit func(batch []*Request[T])
	// Slots is how many batches may be committed at once; 0 means 1.
	Slots int

	mu       sync.Mutex
	maxBatch int // 0: no bound
	queue    []*Request[T]
	running  int
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
	r := &Request[T]{Key: key, Arg: arg, done: make(chan struct{}), lead: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, r)
	if c.running < max(c.Slots, 1) {
		c.running++
		r.promoted = true // it holds a slot: nobody hands it another
		c.mu.Unlock()
		runtime.Gosched() // let callers arriving now join the batch
		c.lead(r)
		return r.value, r.err
	}
	c.mu.Unlock()
	select {
	case <-r.lead:
		c.lead(r)
		return r.value, r.err
	case <-r.done:
		c.passOnIfPromoted(r)
		return r.value, r.err
	case <-ctx.Done():
		c.mu.Lock()
		if r.state == pending {
			r.state = gone // leaders skip it
		}
		c.mu.Unlock()
		c.passOnIfPromoted(r)
		return nil, ctx.Err()
	}
}

// passOnIfPromoted hands on a slot that r was given but will not use.
// Only a pending request is promoted, and none once it is batched or gone,
// so after either the check is final.
func (c *Committer[T]) passOnIfPromoted(r *Request[T]) {
	c.mu.Lock()
	promoted := r.promoted
	c.mu.Unlock()
	if promoted {
		c.handOff()
	}
}

// lead holds a slot: it commits batches until its own request r is done,
// then hands the slot to the oldest waiter, or frees it.
func (c *Committer[T]) lead(r *Request[T]) {
	for {
		select {
		case <-r.done:
			c.handOff()
			return
		default:
		}
		batch := c.take()
		if len(batch) == 0 {
			// r is in a batch of another slot: wait for it, then pass on.
			<-r.done
			c.handOff()
			return
		}
		c.Commit(batch)
	}
}

// take removes the next batch from the queue: up to maxBatch requests with
// distinct keys, in arrival order, dropping those whose callers left.
func (c *Committer[T]) take() []*Request[T] {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	return batch
}

// handOff gives the slot to the oldest pending waiter not yet handed one,
// or frees it.
func (c *Committer[T]) handOff() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.queue {
		if q.state == pending && !q.promoted {
			q.promoted = true
			close(q.lead)
			return
		}
	}
	c.running--
}
