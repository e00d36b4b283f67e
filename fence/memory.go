package fence

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

const memoryShards = 64

// MemoryStore is an in-process Store, safe for heavy concurrent use. The
// highest token of each resource is an atomic word advanced by
// compare-and-swap; the map from resource to word is split into shards so
// that admits to different resources do not share a lock, and admits to a
// known resource take only a shard's read lock.
//
// Admit alone is a check, not a guard: a write made after Admit returns can
// land after a newer holder's, for nothing stops that holder from being
// admitted in between. Guard a write with [MemoryStore.Do], or with
// [Middleware] over this store; a write to a database needs the check inside
// its own transaction, as the Postgres adapter's admit does (docs/design.md,
// "Where the fence must be").
//
// The zero value is ready to use. Its memory grows with the number of
// distinct resources and is never reclaimed: forgetting a resource would
// forget its highest token.
type MemoryStore struct {
	once   sync.Once
	seed   maphash.Seed
	shards [memoryShards]memoryShard
	locks  keyedMutex // held from the admit to the end of the write, by Do and Middleware
}

type memoryShard struct {
	mu sync.RWMutex
	m  map[string]*atomic.Uint64
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Admit implements Store.
func (s *MemoryStore) Admit(ctx context.Context, resource string, t Token) error {
	// A token above MaxToken, once admitted, would leave every real token
	// stale for the resource forever.
	switch {
	case t == 0:
		return fmt.Errorf("%w: 0 means no token; want 1 to %d", ErrInvalidToken, MaxToken)
	case t > MaxToken:
		return fmt.Errorf("%w: %d is above the largest token; want 1 to %d", ErrInvalidToken, uint64(t), MaxToken)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w := s.word(resource)
	for {
		cur := w.Load()
		switch {
		case uint64(t) < cur:
			return &StaleError{Resource: resource, Token: t, Highest: Token(cur)}
		case uint64(t) == cur:
			return nil
		case w.CompareAndSwap(cur, uint64(t)):
			return nil
		}
	}
}

// Do admits t for resource and, if it is admitted, runs write, returning
// write's error; otherwise it returns Admit's error (one matching ErrStale
// for a stale token) and does not run write. Calls of Do, and requests of a
// Middleware over s, for the same resource run one at a time from the admit
// to the end of write, so that a write admitted with a lower token cannot
// land after one with a higher token. write gets ctx with t in it
// (FromContext). t stays admitted whatever write returns, as with Admit.
//
// A call that waits for another of its resource returns ctx.Err() when ctx
// ends, not admitted. write must be done when it returns (no goroutine of
// it may write later), and must not call Do for the same resource: it would
// wait for itself.
func (s *MemoryStore) Do(ctx context.Context, resource string, t Token, write func(context.Context) error) error {
	unlock, err := s.locks.lock(ctx, resource)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.Admit(ctx, resource, t); err != nil {
		return err
	}
	return write(WithToken(ctx, t))
}

// Highest returns the highest token admitted for resource, or 0.
func (s *MemoryStore) Highest(resource string) Token {
	sh := s.shard(resource)
	sh.mu.RLock()
	w := sh.m[resource]
	sh.mu.RUnlock()
	if w == nil {
		return 0
	}
	return Token(w.Load())
}

func (s *MemoryStore) shard(resource string) *memoryShard {
	s.once.Do(func() { s.seed = maphash.MakeSeed() })
	return &s.shards[maphash.String(s.seed, resource)%memoryShards]
}

func (s *MemoryStore) word(resource string) *atomic.Uint64 {
	sh := s.shard(resource)
	sh.mu.RLock()
	w := sh.m[resource]
	sh.mu.RUnlock()
	if w != nil {
		return w
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w = sh.m[resource]; w == nil {
		if sh.m == nil {
			sh.m = make(map[string]*atomic.Uint64)
		}
		w = new(atomic.Uint64)
		sh.m[resource] = w
	}
	return w
}
