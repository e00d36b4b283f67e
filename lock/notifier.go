package lock

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier multiplexes release notifications over one PubSub connection.
// Watch returns only once Redis has confirmed the channel's subscription,
// so a release published after it cannot be missed.
//
// go-redis reconnects a dropped PubSub connection by itself and subscribes
// again to every channel it still tracks; confirmations of SUBSCRIBEs sent
// on the dropped connection never arrive. So a subscription waits for any
// confirmation of its channel rather than counting them, stays in the table
// until one arrives even when its waiters left (so the next waiter of the
// name does not wait for a confirmation that was lost), and a confirmation
// of a subscription already active means a reconnect: its waiters are woken,
// since a release published meanwhile was lost (docs/design.md, defect 2).
type notifier struct {
	rdb redis.UniversalClient

	mu     sync.Mutex
	ps     *redis.PubSub
	subs   map[string]*subscription
	closed bool
	wg     sync.WaitGroup
}

type subscription struct {
	waiters   map[chan struct{}]string // the fair waiter each channel is, or ""
	confirmed bool
	active    chan struct{} // closed when Redis first confirms the subscription
}

func (n *notifier) watch(ctx context.Context, channel, waiter string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	stop, err := n.watchInto(ctx, channel, ch, waiter)
	if err != nil {
		return nil, nil, err
	}
	return ch, stop, nil
}

// watchInto signals ch (buffered) on every release published on channel,
// until stop is called; for a fair waiter, only on releases that name it
// or nobody. Several notifiers may signal one ch.
func (n *notifier) watchInto(ctx context.Context, channel string, ch chan struct{}, waiter string) (func(), error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	if n.ps == nil {
		n.ps = n.rdb.Subscribe(context.WithoutCancel(ctx))
		n.subs = make(map[string]*subscription)
		msgs := n.ps.ChannelWithSubscriptions()
		n.wg.Add(1)
		go n.dispatch(msgs)
	}
	sub := n.subs[channel]
	var sent chan error // the outcome of the SUBSCRIBE this call sends, if it sends one
	if sub == nil {
		sub = &subscription{waiters: make(map[chan struct{}]string), active: make(chan struct{})}
		n.subs[channel] = sub
		// The SUBSCRIBE goes out on a goroutine of the notifier, neither
		// under mu nor on the caller's: the first one dials, and a Redis
		// that does not answer holds it for go-redis's timeouts, whatever
		// ctx says on a client without ContextTimeoutEnabled, and every
		// other watcher of the store behind it (5 s where a Redlock node's
		// timeout was 250 ms: docs/design.md, defect 202). UNSUBSCRIBE is
		// sent under mu (dropIdle), and only for a confirmed entry, whose
		// SUBSCRIBE Redis had: so they still reach Redis in the order the
		// table changes. go-redis tracks the channel even when the send
		// fails, and subscribes it on its next connection: the entry stays
		// until that confirmation comes. Close waits for the goroutine,
		// which ends when go-redis returns.
		sent = make(chan error, 1)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			sent <- n.ps.Subscribe(ctx, channel)
		}()
	}
	sub.waiters[ch] = waiter
	n.mu.Unlock()

	var once sync.Once
	stop := func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			delete(sub.waiters, ch)
			n.dropIdle(channel, sub)
		})
	}
	for {
		select {
		case <-sub.active:
			return stop, nil
		case err := <-sent:
			if err != nil {
				stop()
				return nil, backendErr("redis", "watch", err)
			}
			sent = nil // sent: the confirmation is to come
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
	}
}

// dropIdle unsubscribes a confirmed subscription nobody waits on. An
// unconfirmed one stays until its confirmation arrives. Called with mu.
func (n *notifier) dropIdle(channel string, sub *subscription) {
	if len(sub.waiters) > 0 || !sub.confirmed || n.closed || n.subs[channel] != sub {
		return
	}
	delete(n.subs, channel)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// A failed unsubscribe only leaves a channel nobody listens to.
	_ = n.ps.Unsubscribe(ctx, channel)
}

// dispatch is the notifier's goroutine; close stops it by closing the
// PubSub, which closes msgs.
func (n *notifier) dispatch(msgs <-chan interface{}) {
	defer n.wg.Done()
	for m := range msgs {
		n.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if sub := n.subs[m.Channel]; sub != nil && m.Kind == "subscribe" {
				if !sub.confirmed {
					sub.confirmed = true
					close(sub.active)
					n.dropIdle(m.Channel, sub)
				} else {
					wake(sub, "") // subscribed again after a reconnect
				}
			}
		case *redis.Message:
			if sub := n.subs[m.Channel]; sub != nil {
				wake(sub, m.Payload)
			}
		}
		n.mu.Unlock()
	}
}

// wake signals the waiters of a release that names next, the waiter at the
// head of the queue: it, and every unfair waiter. A release that names
// nobody wakes all. "next:<id>" (leave_queue in prelude.lua) is no release:
// the queue moved while the lock is held, and only its new head, <id>,
// need look.
func wake(sub *subscription, next string) {
	only, moved := strings.CutPrefix(next, "next:")
	for ch, waiter := range sub.waiters {
		if moved && waiter != only || !moved && next != "" && waiter != "" && waiter != next {
			continue
		}
		select {
		case ch <- struct{}{}:
		default: // already signalled
		}
	}
}

func (n *notifier) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	ps := n.ps
	n.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	n.wg.Wait()
	return err
}
