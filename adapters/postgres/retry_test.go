package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// poolWith is a pool on pool's server with cfg changed by change.
func poolWith(t *testing.T, pool *pgxpool.Pool, change func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	change(cfg)
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// wantRetryable fails unless err is a rollback that IsRetryable reports,
// with SQLSTATE code kept, and running the transaction again succeeds.
func wantRetryable(t *testing.T, err error, code string, again func() error) {
	t.Helper()
	var pe *pgconn.PgError
	if !postgres.IsRetryable(err) || errors.Is(err, postgres.ErrCommitUnknown) || !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("InTx = %v (retryable %v), want retryable with SQLSTATE %s kept", err, postgres.IsRetryable(err), code)
	}
	if err := again(); err != nil {
		t.Fatalf("running the transaction again: %v", err)
	}
}

// TestTimeoutsAreRetryable: a second writer of the resource, on a role with
// lock_timeout or statement_timeout set (as production roles often are),
// waited for the first's row lock in its admit and timed out (SQLSTATE
// 55P03 or 57014). Its transaction rolled back, and running it again once
// the first had committed succeeded, yet IsRetryable said no: it knew only
// 40001 and 40P01.
func TestTimeoutsAreRetryable(t *testing.T) {
	t.Parallel()
	for setting, code := range map[string]string{"lock_timeout": "55P03", "statement_timeout": "57014"} {
		t.Run(setting, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t)
			f, schema := newFence(t, pool)
			// Generous, so that nothing else times out on a loaded machine:
			// the admit waits until the first writer ends, however long.
			p2 := poolWith(t, pool, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams[setting] = "1s" })
			f2, err := postgres.NewFence(p2, postgres.WithSchema(schema))
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			holding, done := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				first <- f.InTx(ctx, "r", 5, func(context.Context, pgx.Tx) error { close(holding); <-done; return nil })
			}()
			<-holding
			err = f2.InTx(ctx, "r", 6, func(context.Context, pgx.Tx) error { return nil })
			close(done)
			if e := <-first; e != nil {
				t.Fatal(e)
			}
			wantRetryable(t, err, code, func() error {
				return f2.InTx(ctx, "r", 6, func(context.Context, pgx.Tx) error { return nil })
			})
		})
	}
}

// TestSessionLostBeforeCommitIsRetryable: the session of InTx's
// transaction ended before COMMIT was sent, idle in the transaction or
// under a statement of fn, directly (pg_terminate_backend, FATAL 57P01)
// or behind PgBouncer, which lost its server connection ("server conn
// crashed?", FATAL 08P01). The transaction rolled back for sure, and
// running it again on another connection succeeded, yet IsRetryable said
// no.
func TestSessionLostBeforeCommitIsRetryable(t *testing.T) {
	t.Parallel()
	t.Run("idle/57P01", func(t *testing.T) {
		t.Parallel()
		pool := testPool(t)
		f, _, table := acctFence(t, pool)
		run := func(end bool) error {
			return f.InTx(t.Context(), "r", 5, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertOne(table)(ctx, tx); err != nil {
					return err
				}
				if end {
					terminate(t, pool, tx)
				}
				return nil
			})
		}
		wantRetryable(t, run(true), "57P01", func() error { return run(false) })
	})
	t.Run("statement/57P01", func(t *testing.T) {
		t.Parallel()
		pool := testPool(t)
		f, _, table := acctFence(t, pool)
		run := func(end bool) error {
			return f.InTx(t.Context(), "r", 5, func(ctx context.Context, tx pgx.Tx) error {
				if end {
					terminate(t, pool, tx)
				}
				return insertOne(table)(ctx, tx)
			})
		}
		wantRetryable(t, run(true), "57P01", func() error { return run(false) })
	})
	t.Run("bouncer/08P01", func(t *testing.T) {
		t.Parallel()
		pool := testPool(t)
		_, schema, table := acctFence(t, pool)
		proxy, port := postgresProxy(t, pool)
		f := bouncerFence(t, schema, startPgBouncerTo(t, "127.0.0.1", port, ""))
		run := func(cut bool) error {
			return f.InTx(t.Context(), "r", 5, func(ctx context.Context, tx pgx.Tx) error {
				if cut {
					proxy.CutAll()
				}
				return insertOne(table)(ctx, tx)
			})
		}
		wantRetryable(t, run(true), "08P01", func() error { return run(false) })
	})
}

// TestCanceledByContextIsNotRetryable: with pgx's cancel-request handling
// of a context, a statement cut short by the caller's context ends with
// the server's 57014, the same SQLSTATE as a statement_timeout; the
// context's error wins, as for pgx's default handling, which closes the
// connection.
func TestCanceledByContextIsNotRetryable(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	_, schema := newFence(t, pool)
	for name, change := range map[string]func(*pgxpool.Config){
		"default": func(*pgxpool.Config) {},
		"cancel request": func(c *pgxpool.Config) {
			c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 10 * time.Second}
			}
		},
	} {
		f, err := postgres.NewFence(poolWith(t, pool, change), postgres.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		err = f.InTx(ctx, "r", 1, func(ctx context.Context, tx pgx.Tx) error {
			cancel()
			_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
			return err
		})
		if !errors.Is(err, context.Canceled) || postgres.IsRetryable(err) {
			t.Errorf("%s: InTx after cancel = %v (retryable %v), want context.Canceled, not retryable", name, err, postgres.IsRetryable(err))
		}
	}
}
