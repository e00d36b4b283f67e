package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced/fenced/adapters/postgres"
)

// TestMigrationSQLWithoutBeginRaces: the script's DO statement run alone,
// as a tool that drops the BEGIN and COMMIT lines runs it, while another
// copy holds the advisory lock and then commits. At READ COMMITTED it
// waits and finds everything applied. At REPEATABLE READ its snapshot was
// taken before the lock, so it missed the versions the other copy recorded
// and failed with a duplicate key on fence_schema_version; it now refuses
// at once, saying to run it at READ COMMITTED.
func TestMigrationSQLWithoutBeginRaces(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		iso     string
		wantErr bool
	}{{"read committed", false}, {"repeatable read", true}} {
		t.Run(c.iso, func(t *testing.T) {
			ctx := t.Context()
			pool := testPool(t)
			schema := testSchema(t, pool)
			script := migrationSQL(t, postgres.WithSchema(schema))
			header, rest, ok := strings.Cut(script, "BEGIN ISOLATION LEVEL READ COMMITTED;\n")
			doStmt, _, ok2 := strings.Cut(rest, "\nCOMMIT;\n")
			if !ok || !ok2 {
				t.Fatalf("the script has no BEGIN and COMMIT lines:\n%s", script)
			}

			first := connect(t)
			tx, err := first.Begin(ctx) // READ COMMITTED, as the script's BEGIN
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, doStmt); err != nil {
				t.Fatal(err)
			}

			second := connect(t)
			if _, err := second.Exec(ctx, "SET default_transaction_isolation = '"+c.iso+"'"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := second.Exec(ctx, header+doStmt)
				done <- err
			}()
			// Commit the first copy once the second waits for the lock, or
			// has ended.
			var err2 error
			ended := false
			for !ended {
				select {
				case err2 = <-done:
					ended = true
				default:
					var waiting bool
					if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)",
						second.PgConn().PID()).Scan(&waiting); err != nil {
						t.Fatal(err)
					}
					if waiting {
						if err := tx.Commit(ctx); err != nil {
							t.Fatal(err)
						}
						err2 = <-done
						ended = true
					} else {
						time.Sleep(5 * time.Millisecond) // polling another session's state
					}
				}
			}
			if err := tx.Commit(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatal(err)
			}

			if !c.wantErr {
				if err2 != nil {
					t.Fatalf("the DO statement alone at %s, racing another copy: %v", c.iso, err2)
				}
				if got := versions(t, pool, schema); len(got) != 2 {
					t.Fatalf("versions recorded: %v, want 2", got)
				}
				return
			}
			var pe *pgconn.PgError
			if !errors.As(err2, &pe) || pe.Code != "25000" || !strings.Contains(pe.Message, "READ COMMITTED") {
				t.Fatalf("the DO statement alone at %s = %v, want SQLSTATE 25000 saying to run it at READ COMMITTED", c.iso, err2)
			}
		})
	}
}

// connect opens a connection of its own to the test database.
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), testDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
