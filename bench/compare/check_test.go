package compare

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// The checkers are tested on histories with a violation planted, and on
// the same histories without it.

// hist builds a history: grants as (holder, worker, inv, ok, end, token),
// attempts as given.
func hist(grants []grant, attempts ...attempt) history {
	return history{Grants: grants, Attempts: attempts, End: 1000}
}

func write(holder string, w int, tok uint64, inv, ret int64, out string, commit int64) attempt {
	return attempt{Kind: evWrite, Worker: w, Holder: holder, Token: tok, Inv: inv, Ret: ret, Outcome: out, Commit: commit}
}

func TestCheckStaleWriteAdmittedWithoutToken(t *testing.T) {
	// A holds from 10; paused; B acquires at 30 (after A's grant) and writes;
	// A's late write lands after B's.
	grants := []grant{
		{Worker: 1, Holder: "A", Inv: 5, OK: 10, End: 80},
		{Worker: 2, Holder: "B", Inv: 25, OK: 30, End: 50},
	}
	h := hist(grants, write("B", 2, 0, 35, 40, outAdmitted, 1), write("A", 1, 0, 60, 70, outAdmitted, 2))
	c := check(h, false)
	if c.StaleAdmitted != 1 || c.Overlaps != 1 {
		t.Fatalf("planted: %+v, want 1 stale write admitted and 1 overlap", c)
	}
	if reg, mu := linearizable(h, false); reg != "no" || mu != "" {
		t.Fatalf("planted: register %q mutex %q, want no and none", reg, mu)
	}
	// Without the fault: A writes and releases before B acquires.
	grants[0].End = 20
	h = hist(grants, write("A", 1, 0, 12, 15, outAdmitted, 1), write("B", 2, 0, 35, 40, outAdmitted, 2))
	if c := check(h, false); c != (counts{}) {
		t.Fatalf("clean: %+v", c)
	}
	if reg, _ := linearizable(h, false); reg != "yes" {
		t.Fatalf("clean: register %q", reg)
	}
}

func TestCheckFencedRejection(t *testing.T) {
	grants := []grant{
		{Worker: 1, Holder: "A", Inv: 5, OK: 10, End: 80, Token: 5},
		{Worker: 2, Holder: "B", Inv: 25, OK: 30, End: 50, Token: 7},
	}
	rejected := write("A", 1, 5, 60, 70, outRejected, 0)
	rejected.Highest = 7
	h := hist(grants, write("B", 2, 7, 35, 40, outAdmitted, 1), rejected)
	c := check(h, true)
	if c.StaleAdmitted != 0 || c.StaleRejected != 1 || c.CurrentRejected != 0 || c.TokensBad != 0 {
		t.Fatalf("%+v, want 1 stale rejected and nothing else", c)
	}
	if reg, mu := linearizable(h, true); reg != "yes" || mu != "yes" {
		t.Fatalf("register %q mutex %q", reg, mu)
	}
	// Planted: the fence admitted the stale token.
	h.Attempts[1].Outcome = outAdmitted
	h.Attempts[1].Commit = 2
	if c := check(h, true); c.StaleAdmitted != 1 {
		t.Fatalf("planted: %+v, want 1 stale write admitted", c)
	}
	if reg, _ := linearizable(h, true); reg != "no" {
		t.Fatalf("planted: register %q, want no", reg)
	}
}

func TestCheckRepeatedAndBackwardTokens(t *testing.T) {
	// B acquires after A completed, with A's token again (a counter that
	// forgot); C after B with a smaller one.
	grants := []grant{
		{Worker: 1, Holder: "A", Inv: 5, OK: 10, End: 20, Token: 9},
		{Worker: 2, Holder: "B", Inv: 25, OK: 30, End: 40, Token: 9},
		{Worker: 3, Holder: "C", Inv: 45, OK: 50, End: 60, Token: 3},
	}
	rej := write("C", 3, 3, 52, 55, outRejected, 0)
	rej.Highest = 9
	h := hist(grants, write("A", 1, 9, 12, 15, outAdmitted, 1), write("B", 2, 9, 32, 35, outAdmitted, 2), rej)
	c := check(h, true)
	if c.TokensBad != 3 || c.CurrentRejected != 1 {
		t.Fatalf("%+v, want 3 bad tokens (A and B share one, C went back) and 1 current holder rejected", c)
	}
	if _, mu := linearizable(h, true); mu != "no" {
		t.Fatalf("mutex %q, want no", mu)
	}
	// Concurrent grants may come in any token order.
	grants = []grant{
		{Worker: 1, Holder: "A", Inv: 5, OK: 30, End: 40, Token: 9},
		{Worker: 2, Holder: "B", Inv: 6, OK: 20, End: 25, Token: 8},
	}
	if _, mu := linearizable(hist(grants), true); mu != "yes" {
		t.Fatalf("concurrent grants: mutex %q, want yes", mu)
	}
}

func TestCheckUnknownOutcome(t *testing.T) {
	grants := []grant{
		{Worker: 1, Holder: "A", Inv: 5, OK: 10, End: 20, Token: 5},
		{Worker: 2, Holder: "B", Inv: 25, OK: 30, End: 50, Token: 7},
	}
	// A's write never completed: it may have landed before B's or not at all.
	h := hist(grants, write("A", 1, 5, 12, math.MaxInt64, outUnknown, 0), write("B", 2, 7, 35, 40, outAdmitted, 1))
	if reg, _ := linearizable(h, true); reg != "yes" {
		t.Fatalf("register %q, want yes", reg)
	}
	if c := check(h, true); c.Unknown != 1 {
		t.Fatalf("%+v, want 1 unknown outcome counted", c)
	}
	// A rejection that no admitted token explains is not linearizable.
	rej := write("B", 2, 7, 35, 40, outRejected, 0)
	h = hist(grants, write("A", 1, 5, 12, 15, outAdmitted, 1), rej)
	if reg, _ := linearizable(h, true); reg != "no" {
		t.Fatalf("unexplained rejection: register %q, want no", reg)
	}
}

// TestCheckLedgerLostUpdate plants a lost update in a real ledger.
func TestCheckLedgerLostUpdate(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, benchkit.PostgresDefault())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := "cmp_test_" + time.Now().Format("150405000")
	if err := createLedger(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	defer dropLedger(context.Background(), pool, schema)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	a1, a2, _ := readAccounts(ctx, conn, 1, 2)
	do := func(id string, f, t2 account) {
		t.Helper()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			return writeTransfer(ctx, tx, transfer{id: id, worker: 1, holder: id, from: f, to: t2, amount: 10})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	do("x", a1, a2) // both read the opening balances...
	do("y", a1, a2) // ...and y overwrites x
	a, err := checkLedger(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if a.LostUpdates != 1 || a.ReplayMatches || a.ok() {
		t.Fatalf("planted lost update: %+v", a)
	}
	b1, b2, _ := readAccounts(ctx, conn, 1, 2)
	do("z", b1, b2)
	if a, _ = checkLedger(ctx, pool, schema); a.LostUpdates != 1 || a.commits["z"] != 3 {
		t.Fatalf("a clean transfer after it: %+v", a)
	}
}
