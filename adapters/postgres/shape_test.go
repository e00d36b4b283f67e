package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// A table of the fence table's name that was there before is kept by
// CREATE TABLE IF NOT EXISTS: Migrate and the migration script refuse one
// that cannot be a fence table, and migrate nothing, rather than report
// success and leave every admit to fail. One made by hand in the right
// shape is used.
func TestMigrateRefusesATableOfAnotherShape(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	for _, c := range []struct {
		name, columns, want string
	}{
		{"accounts", "id int PRIMARY KEY, balance bigint", `it has no text column "resource"`},
		{"nullable", "resource text PRIMARY KEY, token bigint", `it has no bigint NOT NULL column "token"`},
		{"no key", "resource text NOT NULL, token bigint NOT NULL", `"resource" is not a unique key on its own`},
		{"wide key", "resource text, token bigint NOT NULL, PRIMARY KEY (resource, token)", `"resource" is not a unique key on its own`},
		{"made by hand", "resource text PRIMARY KEY, token bigint NOT NULL", ""},
	} {
		for _, how := range []string{"Migrate", "script"} {
			schema := testSchema(t, pool)
			mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
			mustExec(t, pool, "CREATE TABLE "+ident(schema, c.name)+" ("+c.columns+")")
			opts := []postgres.Option{postgres.WithSchema(schema), postgres.WithTable(c.name)}
			f, err := postgres.NewFence(pool, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if how == "Migrate" {
				err = f.Migrate(ctx)
				if c.want != "" && !errors.Is(err, postgres.ErrInvalidOption) {
					t.Errorf("%s, %s: %v, want ErrInvalidOption", c.name, how, err)
				}
			} else {
				err = runScript(ctx, migrationSQL(t, opts...))
			}
			if c.want == "" {
				if err != nil {
					t.Fatalf("%s, %s: %v", c.name, how, err)
				}
				if err := f.Admit(ctx, "r", 2); err != nil {
					t.Fatal(err)
				}
				wantStale(t, f.Admit(ctx, "r", 1), "r", 1, 2)
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "not a fence table") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s, %s: %v, want %q", c.name, how, err, c.want)
			}
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'fence_schema_version'", schema).Scan(&n); err != nil || n != 0 {
				t.Errorf("%s, %s: the refused migration left %d version tables (%v)", c.name, how, n, err)
			}
		}
	}
}

// The table that records the migrations cannot also be the fence table.
func TestFenceTableIsNotTheVersionTable(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	if _, err := postgres.NewFence(pool, postgres.WithTable("fence_schema_version")); !errors.Is(err, postgres.ErrInvalidName) {
		t.Errorf("NewFence: %v, want ErrInvalidName", err)
	}
	if _, err := postgres.MigrationSQL(postgres.WithTable("fence_schema_version")); !errors.Is(err, postgres.ErrInvalidName) {
		t.Errorf("MigrationSQL: %v, want ErrInvalidName", err)
	}
}

// Names are quoted, never pasted: one that holds "{{", even a placeholder
// of the templates, is as good as any other.
func TestNamesWithBraces(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	f, schema := newFence(t, pool, postgres.WithTable("{{schema}} {{x"))
	if err := f.Admit(ctx, "r", 2); err != nil {
		t.Fatal(err)
	}
	wantStale(t, f.Admit(ctx, "r", 1), "r", 1, 2)
	if _, err := postgres.MigrationSQL(postgres.WithSchema(schema), postgres.WithTable("{{schema}} {{x")); err != nil {
		t.Fatal(err)
	}

	mustExec(t, pool, "CREATE TABLE "+ident(schema, "rows{{1}}")+" (id int PRIMARY KEY)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "rows{{1}}")+" VALUES (1)")
	col, err := postgres.NewColumn(pool, "rows{{1}}", "id", postgres.WithSchema(schema), postgres.WithFenceColumn("{{fence_column}}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := col.AddColumn(ctx); err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, pgx.Tx) error { return nil }
	if err := col.InTx(ctx, 1, 4, ok); err != nil {
		t.Fatal(err)
	}
	wantStale(t, col.InTx(ctx, 1, 3, ok), "rows{{1}}/1", 3, 4)
}

// ADD COLUMN IF NOT EXISTS keeps a column of the fence column's name
// whatever it is. AddColumn refuses one that cannot hold tokens, and a NULL
// token found anyway is named as the cause, not as a failed scan.
func TestAddColumnRefusesAColumnThatCannotHoldTokens(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	schema := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
	for table, c := range map[string]struct{ column, want string }{
		"nullable": {"fence_token bigint", "it may be NULL"},
		"text":     {"fence_token text NOT NULL DEFAULT ''", "it is text, not bigint"},
		"good":     {"fence_token bigint NOT NULL DEFAULT 0", ""},
	} {
		mustExec(t, pool, "CREATE TABLE "+ident(schema, table)+" (id int PRIMARY KEY, "+c.column+")")
		col, err := postgres.NewColumn(pool, table, "id", postgres.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		err = col.AddColumn(ctx)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", table, err)
			}
			continue
		}
		if !errors.Is(err, postgres.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidOption saying %q", table, err, c.want)
		}
	}

	mustExec(t, pool, "INSERT INTO "+ident(schema, "nullable")+" VALUES (1, NULL)")
	col, err := postgres.NewColumn(pool, "nullable", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	err = col.InTx(ctx, 1, 5, func(context.Context, pgx.Tx) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "is NULL, which admits no token") || fence.IsStale(err) {
		t.Fatalf("InTx on a NULL fence column: %v", err)
	}
}

// A resource name PostgreSQL text cannot hold is the caller's error,
// ErrInvalidResource, which fence.Middleware answers 400: as any other
// database error it was a 503, which a client may retry, in vain.
func TestResourceTextCannotHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	f, _ := newFence(t, pool)
	for _, res := range []string{"a\x00b", "a\xffb"} {
		errs := map[string]error{"Admit": f.Admit(ctx, res, 5), "InTx": f.InTx(ctx, res, 5, nil)}
		_, errs["Highest"] = f.Highest(ctx, res)
		if tx, err := pool.Begin(ctx); err == nil {
			errs["AdmitTx"] = f.AdmitTx(ctx, tx, res, 5)
			_ = tx.Rollback(ctx)
		}
		for name, err := range errs {
			if !errors.Is(err, fence.ErrInvalidResource) {
				t.Errorf("%s(%q): %v, want fence.ErrInvalidResource", name, res, err)
			}
		}
	}
	h := fence.Middleware(f, func(r *http.Request) string { return r.URL.Path })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for path, want := range map[string]int{"/items/a": 200, "/items/a%00b": 400, "/items/a%FFb": 400} {
		req := httptest.NewRequest("PUT", path, nil)
		req.Header.Set(fence.Header, "5")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%s: %d %s, want %d", path, rec.Code, rec.Body, want)
		}
	}
}

// A name too long for the fence table's primary key (SQLSTATE 54000) is the
// caller's error too: retrying it, as a 503 invites, fails the same way
// forever. Random hex barely compresses, so 4000 characters stay above the
// btree's 2704-byte limit; 4000 repeated letters compress and fit.
func TestResourceTooLongForTheIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	f, schema := newFence(t, pool)
	b := make([]byte, 2000)
	_, _ = rand.Read(b) // never fails, per crypto/rand
	long := hex.EncodeToString(b)

	errs := map[string]error{"Admit": f.Admit(ctx, long, 5), "InTx": f.InTx(ctx, long, 5, nil)}
	if tx, err := pool.Begin(ctx); err == nil {
		errs["AdmitTx"] = f.AdmitTx(ctx, tx, long, 5)
		_ = tx.Rollback(ctx)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT "+ident(schema)+".fence_admit($1, 5)", long)
		return err
	})
	errs["fence_admit with MapError"] = postgres.MapError(err)
	for name, err := range errs {
		if !errors.Is(err, fence.ErrInvalidResource) || postgres.IsRetryable(err) {
			t.Errorf("%s: %v, want fence.ErrInvalidResource, not retryable", name, err)
			continue
		}
		if !strings.Contains(err.Error(), "hash") {
			t.Errorf("%s: %q does not suggest hashing a long name", name, err)
		}
		if name != "fence_admit with MapError" && !strings.Contains(err.Error(), "4000 bytes") {
			t.Errorf("%s: %q does not give the name's length", name, err)
		}
	}
	if err := f.Admit(ctx, strings.Repeat("a", 4000), 5); err != nil {
		t.Errorf("a long name that compresses below the limit: %v", err)
	}
	// The same limit in a table of the caller's is the caller's own error,
	// not an invalid resource: MapError leaves it alone.
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "notes")+" (k text PRIMARY KEY)")
	_, err = pool.Exec(ctx, "INSERT INTO "+ident(schema, "notes")+" VALUES ($1)", long)
	if err == nil || postgres.MapError(err) != err {
		t.Errorf("MapError of a 54000 raised outside fence_admit: %v, want it unchanged", postgres.MapError(err))
	}

	h := fence.Middleware(f, func(r *http.Request) string { return r.URL.Path[1:] })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest("PUT", "/"+long, nil)
	req.Header.Set(fence.Header, "5")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid_argument") {
		t.Errorf("Middleware: %d %.300s, want 400 invalid_argument", rec.Code, rec.Body)
	}
}

type accountID string

// A Column key that PostgreSQL text cannot hold is ErrInvalidResource, as a
// Fence's resource name is, and the error shows it quoted, not raw. A []byte
// key with a NUL byte is fine for a bytea key column.
func TestColumnKeyTextCannotHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	schema := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "notes")+" (k text PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "blobs")+" (k bytea PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "blobs")+" VALUES ('\\x610062', 0)")
	col, err := postgres.NewColumn(pool, "notes", "k", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, pgx.Tx) error { return nil }
	for _, key := range []any{"a\x00b", "a\xffb", accountID("a\x00b"), []byte("a\x00b"), []byte("a\xffb")} {
		errs := map[string]error{"InTx": col.InTx(ctx, key, 5, ok)}
		for _, m := range []string{"AdmitTx", "Rejected"} {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m == "AdmitTx" {
				errs[m] = col.AdmitTx(ctx, tx, key, 5)
			} else {
				errs[m] = col.Rejected(ctx, tx, key, 5)
			}
			_ = tx.Rollback(ctx)
		}
		for name, err := range errs {
			if !errors.Is(err, fence.ErrInvalidResource) {
				t.Errorf("%s(%q): %v, want fence.ErrInvalidResource", name, key, err)
			} else if msg := err.Error(); strings.ContainsRune(msg, 0) || !utf8.ValidString(msg) {
				t.Errorf("%s(%q): message %q holds the key's bytes raw", name, key, msg)
			}
		}
	}
	blobs, err := postgres.NewColumn(pool, "blobs", "k", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := blobs.InTx(ctx, []byte("a\x00b"), 5, ok); err != nil {
		t.Errorf("a []byte key with a NUL byte for a bytea key column: %v", err)
	}
}
