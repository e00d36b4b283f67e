package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// TestConcurrentReadModifyWrite has many writers with interleaved tokens do
// a read-modify-write (read the row in Go, write it back changed) on a few
// rows, in both modes and under READ COMMITTED and SERIALIZABLE. Each write
// adds its token to the row's balance and appends it to the row's log, an
// array in the guarded row, so the row itself records the order in which
// writes committed. Without serialisation per row, writes would be lost;
// without the fence, a stale writer would append a lower token after a
// higher one.
func TestConcurrentReadModifyWrite(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"table", "column"} {
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.Serializable} {
			t.Run(fmt.Sprintf("%s/%s", mode, iso), func(t *testing.T) {
				t.Parallel()
				testReadModifyWrite(t, testDSN(), mode, iso)
			})
		}
	}
}

func testReadModifyWrite(t *testing.T, dsn string, mode string, iso pgx.TxIsoLevel) {
	const (
		workers   = 16
		perWorker = 40
		rows      = 3
		maxTries  = 500 // per write, for serialization failures
	)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second) // a deadlock fails here
	defer cancel()
	pool := poolAt(t, dsn)
	schema := testSchema(t, pool)
	opts := []postgres.Option{postgres.WithSchema(schema), postgres.WithTxOptions(pgx.TxOptions{IsoLevel: iso})}

	data := ident(schema, "data")
	// guard runs fn in a transaction guarded for row id with token tok.
	var guard func(ctx context.Context, id int, tok fence.Token, fn func(context.Context, pgx.Tx) error) error
	switch mode {
	case "table":
		f, err := postgres.NewFence(pool, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, "CREATE TABLE "+data+" (id int PRIMARY KEY, balance bigint NOT NULL, log bigint[] NOT NULL)")
		guard = func(ctx context.Context, id int, tok fence.Token, fn func(context.Context, pgx.Tx) error) error {
			return f.InTx(ctx, fmt.Sprint("data-", id), tok, fn)
		}
	case "column":
		mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
		mustExec(t, pool, "CREATE TABLE "+data+" (id int PRIMARY KEY, balance bigint NOT NULL, log bigint[] NOT NULL)")
		col, err := postgres.NewColumn(pool, "data", "id", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := col.AddColumn(ctx); err != nil {
			t.Fatal(err)
		}
		guard = func(ctx context.Context, id int, tok fence.Token, fn func(context.Context, pgx.Tx) error) error {
			return col.InTx(ctx, id, tok, fn)
		}
	}
	for id := range rows {
		mustExec(t, pool, "INSERT INTO "+data+" (id, balance, log) VALUES ($1, 0, '{}')", id)
	}

	type result struct {
		id      int
		tok     fence.Token
		stale   bool
		highest fence.Token
		tries   int
		err     error
	}
	results := make([][]result, workers)
	var seq atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(iso[0])))
			for range perWorker {
				// Tokens come from one sequence, as from the sequencer, and
				// reach the rows in whatever order the scheduler picks; one
				// write in four comes from a "paused holder" whose token is
				// older, so it often arrives after a higher one.
				tok := seq.Add(1)
				if rng.IntN(4) == 0 {
					tok -= min(tok-1, uint64(rng.IntN(2*workers)))
				}
				r := result{id: rng.IntN(rows), tok: fence.Token(tok)}
				write := func(ctx context.Context, tx pgx.Tx) error {
					var balance int64
					var log []int64
					if err := tx.QueryRow(ctx, "SELECT balance, log FROM "+data+" WHERE id = $1", r.id).Scan(&balance, &log); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "UPDATE "+data+" SET balance = $2, log = $3 WHERE id = $1",
						r.id, balance+int64(r.tok), append(log, int64(r.tok)))
					return err
				}
				for r.tries = 1; ; r.tries++ {
					r.err = guard(ctx, r.id, r.tok, write)
					if !postgres.IsRetryable(r.err) || r.tries == maxTries {
						break
					}
				}
				var se *fence.StaleError
				if errors.As(r.err, &se) {
					r.stale, r.highest, r.err = true, se.Highest, nil
				}
				results[w] = append(results[w], r)
			}
		})
	}
	wg.Wait()

	committed := make([][]int64, rows)
	var nStale, nRetries int
	for _, rs := range results {
		for _, r := range rs {
			nRetries += r.tries - 1
			switch {
			case r.err != nil:
				t.Fatalf("write of token %d to row %d after %d tries: %v", r.tok, r.id, r.tries, r.err)
			case r.stale:
				nStale++
			default:
				committed[r.id] = append(committed[r.id], int64(r.tok))
			}
		}
	}
	for _, rs := range results {
		for _, r := range rs {
			if r.stale && (r.highest <= r.tok || !slices.Contains(committed[r.id], int64(r.highest))) {
				t.Errorf("token %d on row %d rejected with highest %d, which is not a higher committed token", r.tok, r.id, r.highest)
			}
		}
	}
	t.Logf("%d writes committed, %d stale, %d retried transactions", workers*perWorker-nStale, nStale, nRetries)

	for id := range rows {
		var balance int64
		var log []int64
		if err := pool.QueryRow(t.Context(), "SELECT balance, log FROM "+data+" WHERE id = $1", id).Scan(&balance, &log); err != nil {
			t.Fatal(err)
		}
		// Commit order, as recorded in the row, never goes back in tokens.
		for i := 1; i < len(log); i++ {
			if log[i] < log[i-1] {
				t.Fatalf("row %d: token %d committed after token %d: %v", id, log[i], log[i-1], log)
			}
		}
		// The row is what a serial replay of the committed writes, in
		// token order, produces: nothing lost, nothing extra.
		want := slices.Clone(committed[id])
		slices.Sort(want)
		var wantBalance int64
		for _, tok := range want {
			wantBalance += tok
		}
		if !slices.Equal(log, want) || balance != wantBalance {
			t.Fatalf("row %d = balance %d, log %v; serial replay gives balance %d, log %v", id, balance, log, wantBalance, want)
		}
	}
}
