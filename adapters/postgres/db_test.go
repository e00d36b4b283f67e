package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// testDSN returns the test database: FENCED_TEST_POSTGRES, else
// DATABASE_URL, else a local server with trust auth.
func testDSN() string {
	for _, k := range []string{"FENCED_TEST_POSTGRES", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return defaultDSN
}

// testPool connects to the test database, failing (not skipping) the test
// when it is unreachable: these tests are the adapter's proof.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return poolAt(t, testDSN())
}

// poolAt connects to the database at dsn, as testPool does.
func poolAt(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("test database DSN %q: %v", dsn, err)
	}
	cfg.MaxConns = 20
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("Postgres is unreachable at %s: %v\n"+
			"These tests need a real Postgres. Start one with trust auth and a database named test, e.g.\n"+
			"  docker run -d --name fenced-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust -e POSTGRES_DB=test postgres:16\n"+
			"or `service postgresql start` and `createdb -U postgres test`,\n"+
			"or point FENCED_TEST_POSTGRES (or DATABASE_URL) at another server.", dsn, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testSchema returns a fresh, unused schema name and drops the schema when
// the test ends, so that tests can run in parallel and again. The schema
// is not created: Migrate creates it.
func testSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails, per crypto/rand
	name := "fenced_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		// t.Context is done by now; cleanup needs its own.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// mustExec runs SQL the test needs for its setup.
func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }
