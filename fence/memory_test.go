package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fenced/fenced/fence"
)

func TestMemoryStoreAdmitOrder(t *testing.T) {
	ctx := context.Background()
	s := fence.NewMemoryStore()
	if err := s.Admit(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit(ctx, "r", 5); err != nil {
		t.Fatalf("same token again: %v, want admitted (>=)", err)
	}
	err := s.Admit(ctx, "r", 4)
	var se *fence.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || !fence.IsStale(err) {
		t.Fatalf("Admit(4) after 5 = %v, want a StaleError matching ErrStale", err)
	}
	if se.Resource != "r" || se.Token != 4 || se.Highest != 5 {
		t.Fatalf("StaleError = %+v, want {r 4 5}", *se)
	}
	if err := s.Admit(ctx, "other", 1); err != nil {
		t.Fatalf("resources are independent: %v", err)
	}
	if err := s.Admit(ctx, "r", 0); !errors.Is(err, fence.ErrInvalidToken) || !strings.Contains(err.Error(), "0 means no token") {
		t.Fatalf("Admit(0) = %v, want ErrInvalidToken saying 0 means no token", err)
	}
	// A token above MaxToken, once admitted, would make every real token
	// stale for the resource forever.
	for _, tok := range []fence.Token{fence.MaxToken + 1, math.MaxUint64} {
		if err := s.Admit(ctx, "r", tok); !errors.Is(err, fence.ErrInvalidToken) || !strings.Contains(err.Error(), "9223372036854775807") {
			t.Fatalf("Admit(%d) = %v, want ErrInvalidToken giving the range", tok, err)
		}
	}
	if got := s.Highest("r"); got != 5 {
		t.Fatalf("Highest = %d, want 5", got)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Admit(cctx, "r", 9); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with cancelled ctx = %v", err)
	}
}

// TestMemoryStoreConcurrentHistory admits random tokens from many goroutines
// and checks the recorded history, not only the final value: no admit that
// began after another admit completed may carry a lower token, and every
// rejection names a highest that really was admitted.
func TestMemoryStoreConcurrentHistory(t *testing.T) {
	const (
		workers   = 32
		perWorker = 2000
		resources = 4
	)
	type op struct {
		res        int
		tok        fence.Token
		begin, end uint64 // logical clock
		admitted   bool
		highest    fence.Token
	}
	var clock atomic.Uint64
	s := fence.NewMemoryStore()
	ops := make([][]op, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perWorker; i++ {
				o := op{res: rng.IntN(resources), tok: fence.Token(1 + rng.IntN(5000))}
				o.begin = clock.Add(1)
				err := s.Admit(context.Background(), fmt.Sprint("res-", o.res), o.tok)
				o.end = clock.Add(1)
				var se *fence.StaleError
				switch {
				case err == nil:
					o.admitted = true
				case errors.As(err, &se):
					o.highest = se.Highest
				default:
					panic(err) // not reachable: only stale errors are possible here
				}
				ops[w] = append(ops[w], o)
			}
		}(w)
	}
	wg.Wait()

	var all []op
	for _, o := range ops {
		all = append(all, o...)
	}
	admittedToks := make([]map[fence.Token]bool, resources)
	for i := range admittedToks {
		admittedToks[i] = map[fence.Token]bool{}
	}
	for _, o := range all {
		if o.admitted {
			admittedToks[o.res][o.tok] = true
		}
	}
	// For each resource, sort admitted ops by end and keep a running max; any
	// op that began after an admitted op ended must not be admitted with less.
	for r := 0; r < resources; r++ {
		var adm []op
		for _, o := range all {
			if o.res == r && o.admitted {
				adm = append(adm, o)
			}
		}
		for _, o := range all {
			if o.res != r {
				continue
			}
			if !o.admitted {
				if o.highest <= o.tok {
					t.Fatalf("rejected %d with highest %d: not stale", o.tok, o.highest)
				}
				if !admittedToks[r][o.highest] {
					t.Fatalf("rejection names highest %d, which was never admitted", o.highest)
				}
				continue
			}
			for _, a := range adm {
				if a.end < o.begin && a.tok > o.tok {
					t.Fatalf("resource %d: token %d admitted after %d had been admitted", r, o.tok, a.tok)
				}
			}
		}
		var max fence.Token
		for tok := range admittedToks[r] {
			max = maxTok(max, tok)
		}
		if got := s.Highest(fmt.Sprint("res-", r)); got != max {
			t.Fatalf("resource %d: Highest = %d, want %d", r, got, max)
		}
	}
}

func maxTok(a, b fence.Token) fence.Token {
	if a > b {
		return a
	}
	return b
}

func BenchmarkMemoryStoreAdmit(b *testing.B) {
	s := fence.NewMemoryStore()
	ctx := context.Background()
	names := make([]string, 1024)
	for i := range names {
		names[i] = fmt.Sprint("res-", i)
	}
	var n atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_ = s.Admit(ctx, names[i%len(names)], fence.Token(n.Add(1)))
			i++
		}
	})
}
