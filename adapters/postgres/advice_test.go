package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// wantAdvice fails unless err keeps the server's SQLSTATE code (callers
// match it with errors.As) and says each of advice.
func wantAdvice(t *testing.T, what string, err error, code string, advice ...string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Errorf("%s = %v, want SQLSTATE %s kept", what, err, code)
		return
	}
	for _, a := range advice {
		if !strings.Contains(err.Error(), a) {
			t.Errorf("%s = %v: does not say %q", what, err, a)
		}
	}
}

func noop(context.Context, pgx.Tx) error { return nil }

// TestConfigurationErrorsSayWhatToDo: errors of a setup that cannot work
// said what failed and not what to do: a fence never migrated (42P01 on
// fence_tokens), a Column whose fence column was never added (42703), a
// Column on a table outside public that only search_path found (42P01 on
// "public.acct").
func TestConfigurationErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()
	schema := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
	f, err := postgres.NewFence(pool, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	migrate := []string{"Migrate", "fenced admin pg-migrate"}
	wantAdvice(t, "Admit before Migrate", f.Admit(ctx, "r", 5), "42P01", migrate...)
	wantAdvice(t, "InTx before Migrate", f.InTx(ctx, "r", 5, noop), "42P01", migrate...)
	_, err = f.Highest(ctx, "r")
	wantAdvice(t, "Highest before Migrate", err, "42P01", migrate...)

	mustExec(t, pool, "CREATE TABLE "+ident(schema, "acct")+" (id int PRIMARY KEY)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "acct")+" VALUES (1)")
	c, err := postgres.NewColumn(pool, "acct", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	wantAdvice(t, "Column.InTx without the fence column", c.InTx(ctx, 1, 5, noop), "42703", "AddColumn", "WithFenceColumn")

	// The table is found by search_path, but a Column names its schema.
	sp := poolWith(t, pool, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = schema })
	c2, err := postgres.NewColumn(sp, "acct", "id")
	if err != nil {
		t.Fatal(err)
	}
	wantAdvice(t, "Column.InTx on a table outside public", c2.InTx(ctx, 1, 5, noop), "42P01", "WithSchema")
}

// TestReadOnlyServer: every transaction on the connection is read-only
// (default_transaction_read_only here, as on a hot-standby replica). Admits
// failed with 25006 and no word of why, and Migrate returned nil once the
// migrations were applied, so fenced admin pg-migrate against a replica
// reported success while every admit then failed. Admits now say they
// reached a read-only server, and Migrate refuses.
func TestReadOnlyServer(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()
	_, schema := newFence(t, pool)
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "acct")+" (id int PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "acct")+" VALUES (1, 0)")
	ro := poolWith(t, pool, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on" })
	f, err := postgres.NewFence(ro, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	c, err := postgres.NewColumn(ro, "acct", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	wantAdvice(t, "Admit", f.Admit(ctx, "r", 5), "25006", "read-only", "primary")
	wantAdvice(t, "Fence.InTx", f.InTx(ctx, "r", 5, noop), "25006", "read-only", "primary")
	wantAdvice(t, "Column.InTx", c.InTx(ctx, 1, 5, noop), "25006", "read-only", "primary")

	for _, s := range []string{schema, schema + "_new"} { // migrated, and not
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident(s)+" CASCADE") })
		f, err := postgres.NewFence(ro, postgres.WithSchema(s))
		if err != nil {
			t.Fatal(err)
		}
		wantAdvice(t, "Migrate of schema "+s, f.Migrate(ctx), "25006", "read-only", "primary")
	}
}
