package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/lock"
)

// Elections under the same faults: candidates in every process campaign in
// one election, lead a while (looking before each write whether they still
// lead) and resign, while an observer in every process watches it. Terms
// go into the history as grants, so checkHistory holds them to guarantees
// 1 and 2 as it does locks; checkObserved holds each observer to what
// Observe promises (terms never go back, a leader shown with its own
// value), and once the faults end every observer must show the latest
// state (checkElection).

const candidates = 2 // per process

// observer is what one process's observer of an election saw, in order.
type observer struct {
	who     string
	mu      sync.Mutex
	seen    []lock.Leader
	closed  int           // channels closed while the observation went on
	changed chan struct{} // a send (never blocking) after each sighting
}

func newObserver(who string) *observer {
	return &observer{who: who, changed: make(chan struct{}, 1)}
}

func (o *observer) saw(l lock.Leader) {
	o.mu.Lock()
	o.seen = append(o.seen, l)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

func (o *observer) sightings() []lock.Leader {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.seen)
}

// latest is o's last sighting; ok false: none yet.
func (o *observer) latest() (l lock.Leader, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) == 0 {
		return l, false
	}
	return o.seen[len(o.seen)-1], true
}

// observe watches election name through e until ctx ends, observing again
// when Observe fails (its first read met a fault) or its channel closes.
func observe(ctx context.Context, h *history, e lock.Elector, name string, o *observer) {
	for ctx.Err() == nil {
		ch, err := e.Observe(ctx, name)
		if err != nil {
			if ctx.Err() == nil {
				h.count(outcome("observe", err))
				clock.Sleep(ctx, 50*time.Millisecond)
			}
			continue
		}
		for l := range ch {
			o.saw(l)
		}
		if ctx.Err() == nil { // Observe promises to watch again through faults
			o.mu.Lock()
			o.closed++
			o.mu.Unlock()
		}
	}
}

// campaign is one candidate's campaign, its leadership and its
// resignation, each length random.
func campaign(t *testing.T, ctx context.Context, h *history, e lock.Elector, who, name string, r *rand.Rand) {
	ttl := ttls[r.IntN(len(ttls))]
	wait := time.Duration(r.IntN(1000)) * time.Millisecond
	actx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
	invoked := time.Now()
	l, err := e.Elect(actx, name, who, ttl, lock.WithWait(wait))
	cancel()
	if err != nil {
		h.count(outcome("elect", err))
		return
	}
	h.granted(t, who, name, l, invoked, time.Now())
	h.count("elected")
	// Lead up to two TTLs (the keep-alive holds the lease past the first),
	// until leadership is lost, or until the faults end.
	term := time.NewTimer(time.Duration(r.Int64N(int64(2 * ttl))))
	defer term.Stop()
	write := time.NewTicker(ttl / 10)
	defer write.Stop()
	for leading := true; leading; {
		h.holds(l)
		select {
		case <-write.C:
		case <-term.C:
			leading = false
		case <-l.Done():
			leading = false
		case <-ctx.Done():
			leading = false
		}
	}
	h.holds(l)
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	dl := believed(l, 1)
	err = l.Release(rctx)
	cancel()
	h.answered("resign", l, dl, err)
}

// checkObserved checks one observer's sightings of election name against
// the history: the states it showed never went back (Observe reads
// linearizably, and each term is higher than every term before it), and
// a leader whose grant the history holds was shown with its own value.
//
// A term shown is higher than every term before it, or it repeats the
// sighting just before it: the first sighting of a fresh Observe call
// (observe calls again when a channel closes) is who leads now, which may
// be who led when the last call ended. A term shown again after another
// state went back: once nobody leads, or a later term, that term never
// leads again (docs/design.md, defect 205).
func checkObserved(h *history, name, who string, seen []lock.Leader) (wrong []string) {
	terms := map[fence.Token]*grant{}
	for _, g := range h.grants {
		if g.name == name {
			terms[g.token] = g
		}
	}
	var last fence.Token // the highest term shown
	for i, l := range seen {
		if !l.Leading {
			continue
		}
		switch {
		case l.Token < last:
			wrong = append(wrong, fmt.Sprintf("%s: observer %s showed term %d after term %d", name, who, l.Token, last))
		case l.Token == last && i > 0 && seen[i-1] != l:
			wrong = append(wrong, fmt.Sprintf("%s: observer %s showed term %d leading again after %s", name, who, l.Token, shown(seen[i-1])))
		}
		last = max(last, l.Token)
		if g, ok := terms[l.Token]; ok && g.who != l.Value {
			wrong = append(wrong, fmt.Sprintf("%s: observer %s showed term %d with value %q; that term is %s's", name, who, l.Token, l.Value, g.who))
		}
	}
	return wrong
}

// shown says what sighting l showed.
func shown(l lock.Leader) string {
	if !l.Leading {
		return "nobody leading"
	}
	return fmt.Sprintf("term %d (%q)", l.Token, l.Value)
}

// checkElection checks, once the faults are over, that a new leader and
// its resignation reach every observer (Observe never misses the latest
// state), and then what each observer saw.
func checkElection(t *testing.T, s Setup, h *history, name string, observers []*observer) {
	e := s.Direct.(lock.Elector)
	l, err := e.Elect(t.Context(), name, "final", time.Second, lock.WithWait(maxTTL+lock.DefaultWaiterTTL+3*time.Second))
	if err != nil {
		t.Fatalf("election %s after the faults: %v", name, err)
	}
	want := lock.Leader{Name: name, Leading: true, Value: "final", Token: l.Token()}
	for _, o := range observers {
		shows(t, o, "the leader elected after the faults", func(got lock.Leader) bool { return got == want })
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, o := range observers {
		shows(t, o, "nobody leading after that leader resigned", func(got lock.Leader) bool { return !got.Leading })
	}
	for _, o := range observers {
		seen := o.sightings()
		t.Logf("observer %s: %d sightings", o.who, len(seen))
		for _, w := range checkObserved(h, name, o.who, seen) {
			t.Error(w)
		}
		o.mu.Lock()
		if o.closed > 0 {
			t.Errorf("observer %s: Observe's channel closed %d times while the observation went on", o.who, o.closed)
		}
		o.mu.Unlock()
	}
}

// observeWithin is how long an observer may take to show a change once
// the faults are over: a few of the Go client's long-poll backoffs (1 s
// at most) and etcd's reconnections.
const observeWithin = 10 * time.Second

// shows waits until o's latest sighting satisfies ok.
func shows(t *testing.T, o *observer, what string, ok func(lock.Leader) bool) {
	t.Helper()
	timeout := time.NewTimer(observeWithin)
	defer timeout.Stop()
	for {
		latest, seen := o.latest()
		if seen && ok(latest) {
			return
		}
		select {
		case <-o.changed:
		case <-timeout.C:
			t.Errorf("observer %s did not show %s within %s; its latest sighting (if any: %v) is %+v", o.who, what, observeWithin, seen, latest)
			return
		}
	}
}
