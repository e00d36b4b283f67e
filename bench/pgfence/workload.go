package pgfence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// connect opens a pool of size conns; syncCommit "off" sets
// synchronous_commit off on every connection, which takes the WAL flush out
// of the commit and so shows the CPU cost of the guard.
func connect(ctx context.Context, dsn string, conns int, syncCommit string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), int32(conns)
	if syncCommit != "" {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = syncCommit
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("postgres at %s is unreachable (start one with trust auth and a database named test, or set FENCED_TEST_POSTGRES): %w", dsn, err)
	}
	return pool, nil
}

// workload is a table of rows, each written by one client at a time, and
// the guards for it, in a schema of its own.
type workload struct {
	pool    *pgxpool.Pool
	schema  string
	rows    int
	fence   *postgres.Fence
	col     *postgres.Column
	update  string // UPDATE accounts SET balance = balance + 1 WHERE id = $1
	inline  string // the same, carrying the column guard
	funcSQL string // SELECT <schema>.fence_admit($1, $2)
	// the table guard in the UPDATE itself: a data-modifying CTE, which
	// runs to completion, admits first and locks the fence row.
	tableInline string
	tokens      atomic.Uint64
}

func setup(ctx context.Context, pool *pgxpool.Pool, rows int) (*workload, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails, per crypto/rand
	w := &workload{pool: pool, schema: "pgfence_bench_" + hex.EncodeToString(b), rows: rows}
	schema := pgx.Identifier{w.schema}.Sanitize()
	accounts := pgx.Identifier{w.schema, "accounts"}.Sanitize()
	w.update = "UPDATE " + accounts + " SET balance = balance + 1 WHERE id = $1"
	w.inline = "UPDATE " + accounts + " SET balance = balance + 1, fence_token = $2 WHERE id = $1 AND fence_token <= $2"
	w.funcSQL = "SELECT " + schema + ".fence_admit($1, $2)"
	w.tableInline = "WITH admit AS (INSERT INTO " + pgx.Identifier{w.schema, "fence_tokens"}.Sanitize() + " AS f (resource, token) VALUES ($2, $3)" +
		" ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token RETURNING 1)" +
		" UPDATE " + accounts + " SET balance = balance + 1 WHERE id = $1 AND EXISTS (SELECT FROM admit)"

	var err error
	if w.fence, err = postgres.NewFence(pool, postgres.WithSchema(w.schema)); err != nil {
		return nil, err
	}
	if err := w.fence.Migrate(ctx); err != nil {
		return nil, err
	}
	for _, q := range []string{
		"CREATE TABLE " + accounts + " (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)",
		"INSERT INTO " + accounts + " (id) SELECT generate_series(0, $1::int - 1)",
	} {
		var args []any
		if q[0] == 'I' {
			args = []any{rows}
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			return nil, errors.Join(err, w.drop(ctx))
		}
	}
	if w.col, err = postgres.NewColumn(pool, "accounts", "id", postgres.WithSchema(w.schema)); err != nil {
		return nil, errors.Join(err, w.drop(ctx))
	}
	if err := w.col.AddColumn(ctx); err != nil {
		return nil, errors.Join(err, w.drop(ctx))
	}
	// Warm up: every fence row exists and every page is in the cache, so
	// that no mode pays for first writes.
	for id := range rows {
		if err := w.fence.Admit(ctx, resource(id), fence.Token(w.tokens.Add(1))); err != nil {
			return nil, errors.Join(err, w.drop(ctx))
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+accounts); err != nil {
		return nil, errors.Join(err, w.drop(ctx))
	}
	return w, nil
}

func (w *workload) drop(ctx context.Context) error {
	_, err := w.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{w.schema}.Sanitize()+" CASCADE")
	return err
}

func resource(id int) string { return fmt.Sprint("account-", id) }

// A mode runs one transaction that adds 1 to row id's balance with token
// tok, guarded or not.
type mode struct {
	name string
	desc string
	run  func(ctx context.Context, w *workload, id int, tok fence.Token) error
}

var allModes = []mode{
	{"Unguarded", "BEGIN; UPDATE; COMMIT (the baseline)", func(ctx context.Context, w *workload, id int, _ fence.Token) error {
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, w.update, id)
			return err
		})
	}},
	{"Column", "Column.InTx: admit (UPDATE of fence_token), then the UPDATE", func(ctx context.Context, w *workload, id int, tok fence.Token) error {
		return w.col.InTx(ctx, id, tok, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, w.update, id)
			return err
		})
	}},
	{"ColumnInline", "the UPDATE itself carries the guard; Column.Rejected on 0 rows", func(ctx context.Context, w *workload, id int, tok fence.Token) error {
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, w.inline, id, int64(tok))
			if err == nil && tag.RowsAffected() == 0 {
				err = w.col.Rejected(ctx, tx, id, tok)
			}
			return err
		})
	}},
	{"Table", "Fence.InTx: admit (fence-table upsert), then the UPDATE", func(ctx context.Context, w *workload, id int, tok fence.Token) error {
		return w.fence.InTx(ctx, resource(id), tok, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, w.update, id)
			return err
		})
	}},
	{"TableInline", "hand-written: WITH admit AS (upsert) UPDATE ... AND EXISTS (admit)", func(ctx context.Context, w *workload, id int, tok fence.Token) error {
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, w.tableInline, id, resource(id), int64(tok))
			if err == nil && tag.RowsAffected() == 0 {
				err = fmt.Errorf("row %d not written with token %d", id, tok)
			}
			return err
		})
	}},
	{"TableSQLFunc", "SELECT fence_admit(resource, token), then the UPDATE", func(ctx context.Context, w *workload, id int, tok fence.Token) error {
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, w.funcSQL, resource(id), int64(tok)); err != nil {
				return postgres.MapError(err)
			}
			_, err := tx.Exec(ctx, w.update, id)
			return err
		})
	}},
	{"RoundTrip", "control, no guard: SELECT 1, then the UPDATE", func(ctx context.Context, w *workload, id int, _ fence.Token) error {
		return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, w.update, id)
			return err
		})
	}},
}

// client c of n writes only rows with id%n == c, so rows are never
// contended and tokens, drawn from one sequence, only grow per row: what
// is measured is the cost of the guard, not waits for row locks.
type client struct {
	w    *workload
	ids  []int
	next int
}

func newClient(w *workload, c, n int) *client {
	cl := &client{w: w}
	for id := c; id < w.rows; id += n {
		cl.ids = append(cl.ids, id)
	}
	return cl
}

func (c *client) do(ctx context.Context, m mode) error {
	id := c.ids[c.next%len(c.ids)]
	c.next++
	return m.run(ctx, c.w, id, fence.Token(c.w.tokens.Add(1)))
}
