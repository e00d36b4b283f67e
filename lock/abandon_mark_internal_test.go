package lock

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// fixedToken is a sequencer for tests whose tokens do not matter.
type fixedToken struct{}

func (fixedToken) Next(context.Context, string) (fence.Token, error) { return 1, nil }

// internalRedisStore is a RedisStore on rdb with fixed tokens, closed with
// the test.
func internalRedisStore(t *testing.T, rdb redis.UniversalClient) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(rdb, fixedToken{}, WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// resendGate holds every connection its client dials once lost is closed,
// until open is: go-redis sends a pipeline whose reply was lost again on
// a new connection, which then waits here.
type resendGate struct {
	lost <-chan struct{}
	open chan struct{}
}

func (g *resendGate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-g.lost:
			select {
			case <-g.open:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		default:
		}
		return next(ctx, network, addr)
	}
}

func (g *resendGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *resendGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A pipeline of several callers is bounded by the latest of their
// deadlines (redispipe.go), and go-redis sends it again, whole, after its
// reply was lost. So an acquire script whose reply was lost can run a
// second time after its caller gave up and its abandon freed what the
// first run took. The abandon left its abandoned:<lease id> mark only when
// it found no trace of the lease: here it found and deleted it, and the
// second run took the lock again, for its whole TTL, known to nobody
// (docs/design.md, defect 172). The abandon now leaves its mark whatever
// it finds, and the second run takes nothing.
func TestAcquireSentAgainAfterItsAbandonTakesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	direct := testenv.Redis(t)
	px, err := faultproxy.New(testenv.RedisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	id, err := newLeaseID()
	if err != nil {
		t.Fatal(err)
	}
	// The take's reply is lost; go-redis's resend, 100 ms later, dials
	// a connection that waits at the gate.
	fired := px.LoseReply([]byte(id))
	gate := &resendGate{lost: fired, open: make(chan struct{})}
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true,
		MinRetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	rdb.AddHook(gate)
	t.Cleanup(func() { rdb.Close() })
	s := internalRedisStore(t, rdb)
	other, err := NewRedisStore(direct, fixedToken{}, WithRedisPrefix(s.prefix)) // the abandon, on another connection
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	for _, sc := range []*redis.Script{acquireScript, inspectScript} {
		if err := sc.Load(ctx, direct).Err(); err != nil {
			t.Fatal(err)
		}
	}

	name := testenv.Name(t)
	const ttl = 30 * time.Second
	k := s.keys(name)
	take := scriptCall{script: acquireScript, keys: []string{k[kLease], k[kToken], k[kQueue], k[kPlaces], s.abandonedKey(name, id)},
		args: []any{id, ttl.Milliseconds(), "", int64(0), "", ""}}
	inspect := scriptCall{script: inspectScript, keys: s.keys(name + "-other")}
	// Two callers' calls in one pipeline: the take, whose caller gives
	// up, and an inspect, whose caller waits longer: the batch's context
	// is the inspect's.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	sent := make(chan []*redis.Cmd, 1)
	go func() { sent <- s.send(bctx, []scriptCall{take, inspect}) }()
	select {
	case <-fired:
	case cmds := <-sent:
		t.Fatalf("sent without loss: %v %v", cmds[0].Err(), cmds[1].Err())
	}
	// The take's caller gave up: its Acquire abandons the attempt, which
	// Redis runs before the resend.
	if err := other.abandonLease(ctx, name, id, ttl); err != nil {
		t.Fatal(err)
	}
	if n, err := direct.Exists(ctx, k[kLease]).Result(); err != nil || n != 0 {
		t.Fatalf("after the abandon the lease key exists: %d, %v", n, err)
	}
	close(gate.open)
	cmds := <-sent
	v, err := cmds[0].Slice()
	if err != nil {
		t.Fatalf("the take sent again: %v", err)
	}
	if got, _ := direct.Get(ctx, k[kLease]).Result(); got == id {
		pttl, _ := direct.PTTL(ctx, k[kLease]).Result()
		t.Fatalf("the take sent again after its abandon released it (answer %v) holds the lock, known to nobody, for %s more", v, pttl.Round(time.Millisecond))
	}
	if fmt.Sprint(v) != "[2 0 -1]" {
		t.Fatalf("the take sent again answered %v; want [2 0 -1], abandoned", v)
	}
}

// An abandon leaves its mark in every branch of the release script where
// the attempt's take, run again, could take or extend anything: the lease
// freed, a hold of it counted down (the other freed later), released
// before (the last record, or only the released ids), or no trace at
// all. The take then runs again with the same arguments, as go-redis
// sends it, and takes nothing.
func TestAbandonLeavesItsMarkWhateverItFinds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := internalRedisStore(t, testenv.Redis(t))
	const ttl = 30 * time.Second
	release := func(t *testing.T, name, id string) {
		t.Helper()
		if err := s.Release(ctx, name, id, ""); err != nil {
			t.Fatalf("release of %s: %v", id, err)
		}
	}
	cases := []struct {
		name string
		// between runs between the first take and the abandon; after,
		// between the abandon and the take run again.
		between, after func(t *testing.T, name, id string)
	}{
		{name: "no trace"},
		{name: "held"},
		{
			name: "held twice",
			between: func(t *testing.T, name, id string) {
				// The grant confirmed for a holder, who reenters it.
				if ok, err := s.confirm(ctx, AcquireRequest{Name: name, LeaseID: id, Holder: "h"}, 7); err != nil || !ok {
					t.Fatalf("confirm: %v, %v", ok, err)
				}
				again, err := newLeaseID()
				if err != nil {
					t.Fatal(err)
				}
				if r, err := s.take(ctx, AcquireRequest{Name: name, LeaseID: again, TTL: ttl, Holder: "h"}); err != nil || !r.reentry || r.count != 2 {
					t.Fatalf("reentry: %+v, %v", r, err)
				}
			},
			after: func(t *testing.T, name, id string) { release(t, name, id) }, // the other hold
		},
		{name: "released", between: func(t *testing.T, name, id string) { release(t, name, id) }},
		{
			name: "released, 16 handovers since",
			between: func(t *testing.T, name, id string) {
				release(t, name, id)
				for range 16 {
					next, err := newLeaseID()
					if err != nil {
						t.Fatal(err)
					}
					if r, err := s.take(ctx, AcquireRequest{Name: name, LeaseID: next, TTL: ttl}); err != nil || !r.ok {
						t.Fatalf("handover: %+v, %v", r, err)
					}
					release(t, name, next)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := testenv.Name(t)
			id, err := newLeaseID()
			if err != nil {
				t.Fatal(err)
			}
			req := AcquireRequest{Name: name, LeaseID: id, TTL: ttl}
			if c.name != "no trace" {
				if r, err := s.take(ctx, req); err != nil || !r.ok {
					t.Fatalf("the first run of the take: %+v, %v", r, err)
				}
			}
			if c.between != nil {
				c.between(t, name, id)
			}
			if err := s.abandonLease(ctx, name, id, ttl); err != nil {
				t.Fatal(err)
			}
			if c.after != nil {
				c.after(t, name, id)
			}
			r, err := s.take(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if r.ok || r.reentry || r.inProgress {
				t.Fatalf("the take run again after its abandon: %+v; want nothing taken", r)
			}
			if got, err := s.rdb.Get(ctx, s.keys(name)[kLease]).Result(); err == nil && got == id {
				t.Fatal("the abandoned attempt's lease id holds the lock")
			}
		})
	}
}
