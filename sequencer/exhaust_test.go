package sequencer_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// TestRaiseFloorRefusesAMinLeavingTooFewTokens: a min above MaxMinToken
// (2^62), as a typo with extra digits gives, is refused and the floor is
// left as it was. Taken, it left one token or none below 2^63, for good:
// nothing lowers a floor (docs/design.md, "Keys and tokens").
func TestRaiseFloorRefusesAMinLeavingTooFewTokens(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	prefix := "/" + testenv.Name(t) + "/"
	for _, min := range []fence.Token{9223372036854775805, sequencer.MaxMinToken + 1} {
		_, err := sequencer.RaiseFloor(ctx, cli, prefix, min)
		if !errors.Is(err, sequencer.ErrMinTokenTooHigh) {
			t.Fatalf("RaiseFloor(%d): %v; want ErrMinTokenTooHigh", uint64(min), err)
		}
		for _, want := range []string{"2^62", "nothing lowers a floor", "the highest token your resources have seen"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("RaiseFloor(%d): %q; want it to say %q", uint64(min), err, want)
			}
		}
		if f, err := sequencer.ReadFloor(ctx, cli, prefix); err != nil || f.Offset != 0 {
			t.Fatalf("floor after a refused RaiseFloor(%d): %+v, %v; want none set", uint64(min), f, err)
		}
	}
	f, err := sequencer.RaiseFloor(ctx, cli, prefix, sequencer.MaxMinToken)
	if err != nil || f.Next <= sequencer.MaxMinToken {
		t.Fatalf("RaiseFloor(MaxMinToken): %+v, %v", f, err)
	}
	// The bound is on what the caller asks: a floor already above it is
	// raised still (here by the clock, and by the tokens issued).
	if g, err := sequencer.RaiseFloor(ctx, cli, prefix, 0); err != nil || g.Next <= f.Next {
		t.Fatalf("RaiseFloor(0) above MaxMinToken: %+v, %v; want it raised above %d", g, err, uint64(f.Next))
	}
}

// TestPingSaysTokensAreExhausted: once no token is left below 2^63, Ping
// (GET /readyz) says so as ErrTokensExhausted, as Next does, rather than
// ready. A process that has seen a token at 2^63-1 issues no lower one,
// even once the floor in etcd is lower again (a replaced cluster): its
// Ping says to restart it; a new process serves.
func TestPingSaysTokensAreExhausted(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	prefix := "/" + testenv.Name(t) + "/"
	if _, err := sequencer.RaiseFloorAnyMin(ctx, cli, prefix, fence.MaxToken-5); err != nil {
		t.Fatal(err)
	}
	s := newSeq(t, cli, sequencer.WithPrefix(prefix))
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with tokens left: %v", err)
	}
	for i := 0; ; i++ {
		_, err := s.Next(ctx, "n")
		if errors.Is(err, sequencer.ErrTokensExhausted) {
			break
		}
		if err != nil || i == 10 {
			t.Fatalf("call %d: %v; want tokens, then ErrTokensExhausted", i, err)
		}
	}
	if err := s.Ping(ctx); !errors.Is(err, sequencer.ErrTokensExhausted) {
		t.Fatalf("Ping once every token is issued: %v; want ErrTokensExhausted", err)
	}
	if f, err := sequencer.ReadFloor(ctx, cli, prefix); err != nil || !f.Exhausted() {
		t.Fatalf("ReadFloor once every token is issued: %+v (Exhausted %v), %v; want Exhausted", f, f.Exhausted(), err)
	}

	// The floor set low again by hand, as on a cluster replaced and raised.
	if _, err := cli.Put(ctx, prefix+"floor", "1000"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(ctx, "n"); !errors.Is(err, sequencer.ErrTokensExhausted) {
		t.Fatalf("Next of the process that saw 2^63-1, floor lowered: %v; want ErrTokensExhausted", err)
	}
	err := s.Ping(ctx)
	if !errors.Is(err, sequencer.ErrTokensExhausted) || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("Ping of the process that saw 2^63-1, floor lowered: %v; want ErrTokensExhausted saying to restart it", err)
	}
	fresh := newSeq(t, cli, sequencer.WithPrefix(prefix))
	if err := fresh.Ping(ctx); err != nil {
		t.Fatalf("Ping of a new process: %v", err)
	}
	if _, err := fresh.Next(ctx, "n"); err != nil {
		t.Fatalf("Next of a new process: %v", err)
	}
}

// TestFloorSaysWhetherATokenWasIssued: ReadFloor and RaiseFloor say
// whether any token was issued under the prefix (its counter key exists),
// so that `fenced admin` can tell a prefix fenced never served.
func TestFloorSaysWhetherATokenWasIssued(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ctx := t.Context()
	prefix := "/" + testenv.Name(t) + "/"
	if f, err := sequencer.ReadFloor(ctx, cli, prefix); err != nil || f.Issued {
		t.Fatalf("ReadFloor of a new prefix: %+v, %v; want Issued false", f, err)
	}
	if f, err := sequencer.RaiseFloor(ctx, cli, prefix, 0); err != nil || f.Issued {
		t.Fatalf("RaiseFloor of a new prefix: %+v, %v; want Issued false", f, err)
	}
	if _, err := newSeq(t, cli, sequencer.WithPrefix(prefix)).Next(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	if f, err := sequencer.ReadFloor(ctx, cli, prefix); err != nil || !f.Issued || f.Exhausted() {
		t.Fatalf("ReadFloor after a token: %+v, %v; want Issued, not Exhausted", f, err)
	}
	if f, err := sequencer.RaiseFloor(ctx, cli, prefix, 0); err != nil || !f.Issued {
		t.Fatalf("RaiseFloor after a token: %+v, %v; want Issued", f, err)
	}
}
