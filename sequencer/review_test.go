package sequencer_test

import (
	"errors"
	"testing"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// TestNoTokenAboveMaxToken: tokens stay in 1 to fence.MaxToken. A
// RaiseFloor whose next token would pass MaxToken fails, and an issuer
// whose next revision would pass it returns an error, never a token a
// fence refuses as invalid.
func TestNoTokenAboveMaxToken(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	for _, min := range []fence.Token{fence.MaxToken - 1, fence.MaxToken - 2} {
		f, err := sequencer.RaiseFloor(ctx, cli, "/max-a/", min)
		if err == nil && f.Next > fence.MaxToken {
			t.Errorf("RaiseFloor(%d): next token %d, above MaxToken %d; want an error", uint64(min), uint64(f.Next), uint64(fence.MaxToken))
		}
	}
	// A floor that leaves room for a few tokens only.
	f, err := sequencer.RaiseFloor(ctx, cli, "/max-b/", fence.MaxToken-5)
	if err != nil {
		t.Fatalf("RaiseFloor(MaxToken-5): %v", err)
	}
	s := newSeq(t, cli, sequencer.WithPrefix("/max-b/"))
	for i := range 10 {
		tok, err := s.Next(ctx, "n")
		if err != nil {
			if !errors.Is(err, sequencer.ErrTokensExhausted) || i == 0 {
				t.Fatalf("call %d: %v; want tokens, then ErrTokensExhausted", i, err)
			}
			return
		}
		if tok > fence.MaxToken || tok < f.Next {
			t.Fatalf("call %d: token %d; want %d to %d or an error", i, uint64(tok), uint64(f.Next), uint64(fence.MaxToken))
		}
	}
	t.Fatal("10 tokens issued above a floor 5 below MaxToken")
}
