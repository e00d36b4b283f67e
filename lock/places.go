package lock

import (
	"context"
	"sync"
	"time"

	"github.com/fenced/fenced/internal/clock"
)

// keptPlaces are the queue places of acquisitions made of several calls,
// each with the same WithWaiter id (a server serving a remote waiter's
// requests, each of which waits a while). A call that ends without the
// lock keeps its place for the next call; a place no call has used for
// its waiter TTL is given up, as an in-process waiter's place is when its
// Acquire ends (docs/design.md, "A place across requests").
type keptPlaces struct {
	store LeaseStore
	ttl   time.Duration
	// expiring: the store's places expire by themselves a waiter TTL
	// after the last attempt that used them, wherever it came from
	// (placesExpirer): an idle one is not given up here, for its waiter's
	// next call may be using it through another client (another fenced
	// server) already.
	expiring bool

	life context.Context // ends at close: leaves after a failure stop trying
	stop context.CancelFunc

	mu     sync.Mutex
	m      map[placeID]*keptPlace
	closed bool
	later  int            // leaveLater's goroutines running
	wg     sync.WaitGroup // leaves in progress
}

type placeID struct{ name, waiter string }

type keptPlace struct {
	calls int         // calls in progress with this place
	final bool        // a call said it was the last: the place goes when the calls end
	timer *time.Timer // set while idle: gives the place up when it fires
}

func newKeptPlaces(store LeaseStore, ttl time.Duration) *keptPlaces {
	life, stop := context.WithCancel(context.Background())
	_, expiring := store.(placesExpirer)
	return &keptPlaces{store: store, ttl: ttl, expiring: expiring, life: life, stop: stop, m: map[placeID]*keptPlace{}}
}

// placesExpirer is a LeaseStore whose queue places live in the store,
// shared by every client of it, and expire a waiter TTL after the last
// attempt that used them (RedisStore, RedlockStore). A client that gave
// such a place up when its own calls had left it idle for the waiter TTL,
// or at Close, took it from under the waiter's next call through another
// client: a waiter that moved to another fenced server (a drain, a
// rolling restart, a load balancer) went to the back of the queue
// (docs/design.md, defect 193).
type placesExpirer interface{ placesExpire() }

func (*RedisStore) placesExpire()   {}
func (*RedlockStore) placesExpire() {}

// begin marks a call using the place: it is not given up meanwhile.
func (k *keptPlaces) begin(name, waiter string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id := placeID{name, waiter}
	p := k.m[id]
	if p == nil {
		p = &keptPlace{}
		k.m[id] = p
	}
	p.calls++
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// end marks the call done. A place whose call got the lock is gone (the
// grant took it from the queue); one that did not is kept for the next
// call, for the waiter TTL, unless the call was the last (final) or the
// client is closing.
func (k *keptPlaces) end(name, waiter string, acquired, final bool) {
	k.mu.Lock()
	id := placeID{name, waiter}
	p := k.m[id]
	p.calls--
	// A final call that ends while another of the same waiter runs (one
	// whose caller gave up, still waiting here) marks the place: it goes
	// when the last call ends, not 3 s later (docs/design.md, defect 134).
	p.final = p.final || final
	switch {
	case p.calls > 0:
		k.mu.Unlock()
		return
	case acquired:
		delete(k.m, id)
		k.mu.Unlock()
		return
	case p.final || k.closed && !k.expiring:
		// Given up before the call returns, so that the caller's answer
		// finds the queue without it.
		delete(k.m, id)
		k.mu.Unlock()
		k.leave(context.Background(), id)
		return
	case k.expiring:
		// The store expires it, unless the waiter's next call, here or
		// through another client, uses it first.
		delete(k.m, id)
		k.mu.Unlock()
		return
	}
	defer k.mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(k.ttl, func() {
		k.mu.Lock()
		if k.m[id] != p || p.timer != t {
			k.mu.Unlock()
			return // a call came back, or close gave the place up
		}
		delete(k.m, id)
		k.wg.Add(1)
		k.mu.Unlock()
		defer k.wg.Done()
		k.leave(context.Background(), id)
	})
	p.timer = t
}

// leave gives a place up; a store that cannot be reached lets it expire.
func (k *keptPlaces) leave(ctx context.Context, id placeID) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = k.store.Leave(ctx, id.name, id.waiter)
}

// maxLeavesLater bounds leaveLater's goroutines: in an outage every failed
// acquisition asks for one, and past this many the places are left to
// expire.
const maxLeavesLater = 64

// leaveLater gives up, off the caller's path, the place of an acquisition
// that ended with neither the lock nor a "held" answer: its last attempt
// may have joined the queue with no answer to say so (a reply lost, the
// call cut off), and the store would keep that place ahead of every later
// waiter, a free lock going to nobody, until it expired (docs/design.md,
// defect 95). It tries until the store answers or the place would have
// expired anyway.
func (k *keptPlaces) leaveLater(name, waiter string) {
	k.mu.Lock()
	if k.closed || k.later >= maxLeavesLater {
		k.mu.Unlock()
		return
	}
	k.later++
	k.wg.Add(1)
	k.mu.Unlock()
	go func() { // owned by close, which stops k.life and waits
		defer k.wg.Done()
		defer func() {
			k.mu.Lock()
			k.later--
			k.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(k.life, k.ttl)
		defer cancel()
		for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
			if k.store.Leave(ctx, name, waiter) == nil || !clock.Sleep(ctx, pause) {
				return
			}
		}
	}()
}

// close gives up every idle place of a store whose places do not expire,
// all at once (one at a time, a store that did not answer took a second
// each: a server with many waiters outlived its shutdown grace), and
// waits for leaves in progress.
func (k *keptPlaces) close(ctx context.Context) {
	k.mu.Lock()
	k.closed = true
	var idle []placeID
	for id, p := range k.m {
		if p.calls == 0 {
			if p.timer != nil {
				p.timer.Stop()
			}
			idle = append(idle, id)
			delete(k.m, id)
		}
	}
	k.mu.Unlock()
	if !k.expiring {
		var wg sync.WaitGroup
		for _, id := range idle {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k.leave(ctx, id)
			}()
		}
		wg.Wait()
	}
	k.stop()
	k.wg.Wait()
}
