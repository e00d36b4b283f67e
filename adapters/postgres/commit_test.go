package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// acctFence returns a migrated Fence in a fresh schema, with a table acct
// there for the writes it guards, and that table's quoted name.
func acctFence(t *testing.T, pool *pgxpool.Pool) (*postgres.Fence, string, string) {
	t.Helper()
	f, schema := newFence(t, pool)
	table := ident(schema, "acct")
	mustExec(t, pool, "CREATE TABLE "+table+" (id int PRIMARY KEY)")
	return f, schema, table
}

// insertOne is an InTx function that writes one row.
func insertOne(table string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES (1)")
		return err
	}
}

// committed returns how many rows table has and the highest token of
// resource, once every transaction that wrote to table has ended: the SHARE
// lock waits for a COMMIT still running.
func committed(t *testing.T, pool *pgxpool.Pool, f *postgres.Fence, table, resource string) (int, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.Highest(ctx, resource)
	if err != nil {
		t.Fatal(err)
	}
	return n, uint64(h)
}

func wantUnknown(t *testing.T, err error, sqlstate string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.Is(err, postgres.ErrCommitUnknown) || postgres.IsRetryable(err) || !errors.As(err, &pe) || pe.Code != sqlstate {
		t.Fatalf("InTx = %v, want ErrCommitUnknown (not retryable) with SQLSTATE %s kept", err, sqlstate)
	}
}

// TestCommitLostBehindPgBouncer: PgBouncer, not the client, lost the
// server connection after COMMIT reached the server, which committed. The
// client got PgBouncer's own error, FATAL "server conn crashed?" (SQLSTATE
// 08P01), which was taken for the server's answer: a rollback. It now
// matches ErrCommitUnknown.
func TestCommitLostBehindPgBouncer(t *testing.T) {
	pool := testPool(t)
	f, schema, table := acctFence(t, pool)
	proxy, port := postgresProxy(t, pool)
	pf := bouncerFence(t, schema, startPgBouncerTo(t, "127.0.0.1", port, ""))

	fired := proxy.LoseReply([]byte("commit"))
	err := pf.InTx(t.Context(), "acct-1", 5, insertOne(table))
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatalf("the proxy saw no COMMIT; InTx: %v", err)
	}
	wantUnknown(t, err, "08P01")
	wantCommitted(t, pool, f, table) // why: the server did commit
}

// TestCommitTimedOutByPgBouncer: PgBouncer's query_timeout fired while a
// COMMIT ran (a deferred constraint trigger stands for a slow fsync or a
// synchronous replica), and its FATAL "query timeout" (08P01) was taken
// for a rollback; the COMMIT went on and committed. It now matches
// ErrCommitUnknown.
func TestCommitTimedOutByPgBouncer(t *testing.T) {
	pool := testPool(t)
	f, schema, table := acctFence(t, pool)
	slow := ident(schema, "slow")
	mustExec(t, pool, "CREATE FUNCTION "+slow+"() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_sleep(2); RETURN NULL; END$$")
	mustExec(t, pool, "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON "+table+" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "+slow+"()")
	pf := bouncerFence(t, schema, startPgBouncerTo(t, "", 0, "query_timeout = 1"))

	err := pf.InTx(t.Context(), "acct-1", 5, insertOne(table))
	wantUnknown(t, err, "08P01")
	wantCommitted(t, pool, f, table)
}

// bouncerFence is a Fence of schema through the PgBouncer at dsn, in pgx's
// exec mode, as the docs advise behind a pooler.
func bouncerFence(t *testing.T, schema, dsn string) *postgres.Fence {
	t.Helper()
	f, err := postgres.NewFence(poolAt(t, dsn+"&default_query_exec_mode=exec"), postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// wantCommitted fails unless InTx's write of "acct-1" with token 5 was
// committed: one row, and 5 the highest token.
func wantCommitted(t *testing.T, pool *pgxpool.Pool, f *postgres.Fence, table string) {
	t.Helper()
	if n, h := committed(t, pool, f, table, "acct-1"); n != 1 || h != 5 {
		t.Fatalf("after the commit: %d rows, highest token %d; want 1 and 5", n, h)
	}
}

// TestCommitNotSentAfterContextEnds: the context ended as fn returned, so
// pgconn did not send the COMMIT ("context already done"), and InTx said
// the write may have been applied. Nothing was sent: it is a rollback,
// with the context's error.
func TestCommitNotSentAfterContextEnds(t *testing.T) {
	pool := testPool(t)
	f, _, table := acctFence(t, pool)
	ctx, cancel := context.WithCancel(t.Context())
	err := f.InTx(ctx, "r", 5, func(ctx context.Context, tx pgx.Tx) error {
		err := insertOne(table)(ctx, tx)
		cancel() // the request's deadline passes as fn returns
		return err
	})
	if errors.Is(err, postgres.ErrCommitUnknown) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("InTx = %v, want a rollback matching context.Canceled, not ErrCommitUnknown", err)
	}
	if n, h := committed(t, pool, f, table, "r"); n != 0 || h != 0 {
		t.Fatalf("after InTx: %d rows, highest token %d; want nothing committed", n, h)
	}
}

// TestSessionEndedBeforeCommit: the server ended the session (here
// pg_terminate_backend; idle_in_transaction_session_timeout is the same)
// after fn's statements and before COMMIT. Its FATAL error (57P01) is read
// only when COMMIT is sent, but it came before: the transaction rolled
// back, and the error does not match ErrCommitUnknown, though a FATAL
// answer to COMMIT itself does.
func TestSessionEndedBeforeCommit(t *testing.T) {
	pool := testPool(t)
	f, _, table := acctFence(t, pool)
	ctx := t.Context()
	err := f.InTx(ctx, "r", 5, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertOne(table)(ctx, tx); err != nil {
			return err
		}
		var pid int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		var gone bool // waits until the backend has exited
		if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&gone); err != nil || !gone {
			t.Errorf("pg_terminate_backend: %v, %v", gone, err)
		}
		return nil
	})
	var pe *pgconn.PgError
	if errors.Is(err, postgres.ErrCommitUnknown) || !errors.As(err, &pe) || pe.Code != "57P01" {
		t.Fatalf("InTx = %v, want SQLSTATE 57P01, not ErrCommitUnknown", err)
	}
	if n, h := committed(t, pool, f, table, "r"); n != 0 || h != 0 {
		t.Fatalf("after InTx: %d rows, highest token %d; want nothing committed", n, h)
	}
}

// TestRowsLeftOpenAtCommit: fn returned nil with the rows of a tx.Query
// still open, so the connection was busy reading them. The check for a
// session ended before COMMIT took the unread rows for a message from the
// server, failed to read them with pgconn's "conn busy", and InTx said the
// session had ended before COMMIT. The session was alive: the error now
// names fn's open rows and says the transaction rolled back, as it does
// (COMMIT cannot be sent on a busy connection, and pgx closes it).
func TestRowsLeftOpenAtCommit(t *testing.T) {
	pool := testPool(t)
	f, _, table := acctFence(t, pool)
	err := f.InTx(t.Context(), "r", 5, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertOne(table)(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 100000) g") // rows not closed
		return err
	})
	if err == nil || strings.Contains(err.Error(), "session ended") || !strings.Contains(err.Error(), "rows") ||
		!strings.Contains(err.Error(), "rolled back") || errors.Is(err, postgres.ErrCommitUnknown) || postgres.IsRetryable(err) {
		t.Fatalf("InTx = %v, want an error that names the open rows and a rollback (not a session ended, not unknown, not retryable)", err)
	}
	if n, h := committed(t, pool, f, table, "r"); n != 0 || h != 0 {
		t.Fatalf("after InTx: %d rows, highest token %d; want nothing committed", n, h)
	}
}

// TestConnClosedBeforeCommit: the session ended under a statement of fn
// (here pg_terminate_backend, then a statement that fails with FATAL
// 57P01), and fn returned nil all the same. pgx had closed the connection,
// so COMMIT was never sent, but Commit's "conn closed" read as a COMMIT
// whose answer was lost: ErrCommitUnknown. It is a rollback, and running
// the transaction again may succeed.
func TestConnClosedBeforeCommit(t *testing.T) {
	pool := testPool(t)
	f, _, table := acctFence(t, pool)
	err := f.InTx(t.Context(), "r", 5, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertOne(table)(ctx, tx); err != nil {
			return err
		}
		terminate(t, pool, tx)
		_, _ = tx.Exec(ctx, "SELECT 1") // fails, and fn ignores it
		return nil
	})
	if err == nil || errors.Is(err, postgres.ErrCommitUnknown) || !strings.Contains(err.Error(), "rolled back") || !postgres.IsRetryable(err) {
		t.Fatalf("InTx = %v (retryable %v), want a rollback that is retryable, not ErrCommitUnknown", err, postgres.IsRetryable(err))
	}
	if n, h := committed(t, pool, f, table, "r"); n != 0 || h != 0 {
		t.Fatalf("after InTx: %d rows, highest token %d; want nothing committed", n, h)
	}
}

// terminate ends tx's session with pg_terminate_backend, from pool, and
// waits until its backend has exited.
func terminate(t *testing.T, pool *pgxpool.Pool, tx pgx.Tx) {
	t.Helper()
	ctx := t.Context()
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var gone bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&gone); err != nil || !gone {
		t.Fatalf("pg_terminate_backend: %v, %v", gone, err)
	}
}
