package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/lock"
)

// An operator in every process force-releases, under the same faults, the
// grant it found holding a name, with IfToken: the form that is safe to
// send again when an answer is lost. A force-release deposes its target,
// so that grant's holder may be told "lost" before its deadline and may
// believe it holds the lock after the next holder is granted; checkHistory
// allows both for the grant named, from the moment the force-release was
// first sent, and for no other: a grant with another token must never be
// taken away (IfToken's check is atomic with the delete).

// forcer is what an operator needs: lock.Client and client.Client.
type forcer interface {
	Inspect(ctx context.Context, name string) (lock.State, error)
	ForceRelease(ctx context.Context, name string, opts ...lock.ForceOption) (lock.State, error)
}

// forced is one force-release with IfToken(token), from when it was sent.
type forced struct {
	name  string
	token fence.Token
	sent  time.Time
}

// operate force-releases the holder of a random name now and then until
// ctx ends.
func operate(ctx context.Context, h *history, f forcer, names []string, r *rand.Rand) {
	for clock.Sleep(ctx, time.Duration(r.Int64N(int64(2*time.Second)))) {
		name := names[r.IntN(len(names))]
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := f.Inspect(ictx, name)
		cancel()
		if err != nil || !st.Held || st.Token == 0 {
			h.count(outcome("inspect", err))
			continue
		}
		h.mu.Lock()
		h.forces = append(h.forces, forced{name: name, token: st.Token, sent: time.Now()})
		h.mu.Unlock()
		fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		was, err := f.ForceRelease(fctx, name, lock.IfToken(st.Token))
		cancel()
		h.count(outcome("force", err))
		if err == nil && was.Held && was.Token != st.Token {
			h.mu.Lock()
			h.wrong = append(h.wrong, fmt.Sprintf("%s: force-release if token %d released the grant with token %d", name, st.Token, was.Token))
			h.mu.Unlock()
		}
	}
}

// grantKey names a grant: its lock and token.
type grantKey struct {
	name  string
	token fence.Token
}

// firstForced is when the first force-release of each grant named was
// sent.
func firstForced(forces []forced) map[grantKey]time.Time {
	first := map[grantKey]time.Time{}
	for _, f := range forces {
		k := grantKey{f.name, f.token}
		if at, ok := first[k]; !ok || f.sent.Before(at) {
			first[k] = f.sent
		}
	}
	return first
}
