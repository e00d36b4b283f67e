package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// appRole creates a login role that may use schema and read and write its
// tables, and nothing more, and returns a pool connected as it. The role
// is dropped when the test ends.
func appRole(t *testing.T, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	role := "fenced_app_" + strings.TrimPrefix(schema, "fenced_test_")
	mustExec(t, pool, "CREATE ROLE "+ident(role)+" LOGIN")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, q := range []string{"DROP OWNED BY " + ident(role), "DROP ROLE " + ident(role)} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	mustExec(t, pool, "GRANT USAGE ON SCHEMA "+ident(schema)+" TO "+ident(role))
	mustExec(t, pool, "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA "+ident(schema)+" TO "+ident(role))
	dsn := strings.Replace(testDSN(), pool.Config().ConnConfig.User+"@", role+"@", 1)
	if !strings.Contains(dsn, role+"@") {
		t.Fatalf("cannot put the role %s into the test DSN %s", role, testDSN())
	}
	return poolAt(t, dsn)
}

// TestMigrateWithoutCreatePrivilege: an application role that may use the
// fence's schema and write its tables, but not create in the schema, ran
// Migrate at start, as the package doc says to, and failed with
// "permission denied for schema" although everything was applied: Migrate
// ran CREATE TABLE IF NOT EXISTS, which needs CREATE on the schema even
// when the table exists. It now creates nothing when nothing is missing;
// when something is, the error says what to do.
func TestMigrateWithoutCreatePrivilege(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()

	_, schema := newFence(t, pool) // migrated by the owner
	f, err := postgres.NewFence(appRole(t, pool, schema), postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(ctx); err != nil {
		t.Fatalf("Migrate, all applied, as a role without CREATE on the schema: %v", err)
	}
	if err := f.Admit(ctx, "r", 5); err != nil {
		t.Fatalf("Admit as that role: %v", err)
	}

	// A schema with nothing migrated yet: the role cannot create the tables.
	fresh := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(fresh))
	f, err = postgres.NewFence(appRole(t, pool, fresh), postgres.WithSchema(fresh))
	if err != nil {
		t.Fatal(err)
	}
	err = f.Migrate(ctx)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("Migrate of a fresh schema without CREATE = %v, want SQLSTATE 42501", err)
	}
	for _, advice := range []string{"as the schema's owner", "fenced admin pg-migrate", "GRANT CREATE ON SCHEMA " + ident(fresh)} {
		if !strings.Contains(err.Error(), advice) {
			t.Errorf("error %q does not say %q", err, advice)
		}
	}
}
