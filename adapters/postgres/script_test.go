package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// runScript runs a migration script as psql would: the whole text in one
// simple-protocol query, on a connection of its own.
func runScript(ctx context.Context, script string) error {
	conn, err := pgx.Connect(ctx, testDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, script) // no arguments: the simple protocol, many statements
	return err
}

func migrationSQL(t *testing.T, opts ...postgres.Option) string {
	t.Helper()
	s, err := postgres.MigrationSQL(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// catalog describes what the migrations made in schema, with the schema's
// name replaced by SCHEMA, so that two schemas can be compared.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	queries := []string{
		`SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')
		 FROM information_schema.columns WHERE table_schema = $1 ORDER BY 1, ordinal_position`,
		`SELECT c.relname, con.conname, pg_get_constraintdef(con.oid)
		 FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
		 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1, 2`,
		`SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
		        p.provolatile::text, l.lanname, p.prosrc
		 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
		 WHERE n.nspname = $1 ORDER BY 1`,
		`SELECT c.relname, i.relname, pg_get_indexdef(i.oid)
		 FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
		 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1, 2`,
	}
	var out []string
	for _, q := range queries {
		rows, err := pool.Query(t.Context(), q, schema)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.ReplaceAll(fmt.Sprint(vals...), schema, "SCHEMA"))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// versions returns the rows of a schema's fence_schema_version.
func versions(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT version, name, fence_table, applied_at FROM "+
		ident(schema, "fence_schema_version")+" ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var (
		v           int
		name, table string
		at          time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&v, &name, &table, &at}, func() error {
		out = append(out, fmt.Sprintf("%d %s %s %s", v, name, table, at.Format(time.RFC3339Nano)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMigrationSQLMatchesMigrate checks that the script makes exactly what
// Migrate makes, and that each recognises the other's work.
func TestMigrationSQLMatchesMigrate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)

	byScript := testSchema(t, pool)
	script := migrationSQL(t, postgres.WithSchema(byScript))
	for range 2 {
		if err := runScript(ctx, script); err != nil {
			t.Fatalf("script: %v", err)
		}
	}
	_, byMigrate := newFence(t, pool)

	got, want := catalog(t, pool, byScript), catalog(t, pool, byMigrate)
	if len(want) < 5 || !slices.Equal(got, want) {
		t.Fatalf("the script made\n%s\nMigrate made\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	strip := func(vs []string) []string { // without applied_at
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = v[:strings.LastIndexByte(v, ' ')]
		}
		return out
	}
	if got, want := strip(versions(t, pool, byScript)), strip(versions(t, pool, byMigrate)); !slices.Equal(got, want) || len(got) != 2 {
		t.Fatalf("versions recorded by the script %q, by Migrate %q", got, want)
	}

	// Migrate after the script, and the script after Migrate, change nothing.
	before := versions(t, pool, byScript)
	f, err := postgres.NewFence(pool, postgres.WithSchema(byScript))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if after := versions(t, pool, byScript); !slices.Equal(before, after) {
		t.Fatalf("Migrate after the script changed the versions: %q, then %q", before, after)
	}
	before = versions(t, pool, byMigrate)
	if err := runScript(ctx, migrationSQL(t, postgres.WithSchema(byMigrate))); err != nil {
		t.Fatal(err)
	}
	if after := versions(t, pool, byMigrate); !slices.Equal(before, after) {
		t.Fatalf("the script after Migrate changed the versions: %q, then %q", before, after)
	}

	// The Go adapter and the script's fence_admit share the fence table.
	if err := f.Admit(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	var got5 int64
	if err := pool.QueryRow(ctx, "SELECT "+ident(byScript)+".fence_admit('r', 6)").Scan(&got5); err != nil || got5 != 6 {
		t.Fatalf("fence_admit('r', 6) = %d, %v", got5, err)
	}
	wantStale(t, f.Admit(ctx, "r", 5), "r", 5, 6)
}

// TestMigrationSQLConcurrent runs copies of the script and Migrate at the
// same time on a new schema: the advisory lock makes them take turns, so
// every one succeeds and each migration is applied once. Without the lock,
// concurrent CREATE TABLE IF NOT EXISTS of one table fails.
func TestMigrationSQLConcurrent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	schema := testSchema(t, pool)
	script := migrationSQL(t, postgres.WithSchema(schema))
	const scripts = 6
	errs := make([]error, scripts+1)
	var wg sync.WaitGroup
	for i := range scripts {
		wg.Go(func() { errs[i] = runScript(ctx, script) })
	}
	wg.Go(func() {
		conn, err := pgx.Connect(ctx, testDSN())
		if err != nil {
			errs[scripts] = err
			return
		}
		defer conn.Close(context.Background())
		f, err := postgres.NewFence(conn, postgres.WithSchema(schema))
		if err == nil {
			err = f.Migrate(ctx)
		}
		errs[scripts] = err
	})
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
	if v := versions(t, pool, schema); len(v) != 2 {
		t.Fatalf("versions %q, want 2", v)
	}
}

func TestMigrationSQLOtherTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	_, schema := newFence(t, pool)
	err := runScript(ctx, migrationSQL(t, postgres.WithSchema(schema), postgres.WithTable("other")))
	if err == nil || !strings.Contains(err.Error(), `already has the fence table fence_tokens, not other`) {
		t.Fatalf("script for another table in a migrated schema: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'other'", schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the failed script left %d tables named other (%v)", n, err)
	}
}

// TestMigrationSQLOddNames renders names that would do harm if pasted into
// the script: quotes, a backslash, and a newline that would end a comment.
func TestMigrationSQLOddNames(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	schema := testSchema(t, pool) + "\nDROP TABLE x; -- it's \\ \"odd\""
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident(schema)+" CASCADE")
	})
	table := `Fence 'tokens'` + "\n; --"
	opts := []postgres.Option{postgres.WithSchema(schema), postgres.WithTable(table)}
	script := migrationSQL(t, opts...)
	for range 2 {
		if err := runScript(ctx, script); err != nil {
			t.Fatalf("script: %v\n%s", err, script)
		}
	}
	f, err := postgres.NewFence(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Admit(ctx, "r", 2); err != nil {
		t.Fatal(err)
	}
	wantStale(t, f.Admit(ctx, "r", 1), "r", 1, 2)
	if v := versions(t, pool, schema); len(v) != 2 || !strings.Contains(v[0], table) {
		t.Fatalf("versions %q", v)
	}
}

func TestMigrationSQLInvalid(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []postgres.Option
		want error
	}{
		{"empty schema", []postgres.Option{postgres.WithSchema("")}, postgres.ErrInvalidName},
		{"long table", []postgres.Option{postgres.WithTable(strings.Repeat("n", 64))}, postgres.ErrInvalidName},
		{"dollar in schema", []postgres.Option{postgres.WithSchema("a$b")}, postgres.ErrInvalidName},
		{"fence column", []postgres.Option{postgres.WithFenceColumn("x")}, postgres.ErrInvalidOption},
		{"nil option", []postgres.Option{nil}, postgres.ErrInvalidOption},
	} {
		if s, err := postgres.MigrationSQL(c.opts...); !errors.Is(err, c.want) || s != "" {
			t.Errorf("%s: %q, %v; want %v", c.name, s, err, c.want)
		}
	}
}
