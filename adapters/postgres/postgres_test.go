package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// newFence returns a migrated Fence in a fresh schema.
func newFence(t *testing.T, pool *pgxpool.Pool, opts ...postgres.Option) (*postgres.Fence, string) {
	t.Helper()
	schema := testSchema(t, pool)
	f, err := postgres.NewFence(pool, append([]postgres.Option{postgres.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return f, schema
}

func wantStale(t *testing.T, err error, resource string, tok, highest fence.Token) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || !fence.IsStale(err) {
		t.Fatalf("err = %v, want a *fence.StaleError matching fence.ErrStale", err)
	}
	if se.Resource != resource || se.Token != tok || se.Highest != highest {
		t.Fatalf("StaleError = %+v, want {%s %d %d}", *se, resource, tok, highest)
	}
}

// beginOnly hides everything of a Beginner but BeginTx.
type beginOnly struct{ b postgres.Beginner }

func (b beginOnly) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	return b.b.BeginTx(ctx, opts)
}

func TestFenceAdmit(t *testing.T) {
	t.Parallel()
	testFenceAdmit(t, testDSN())
}

func testFenceAdmit(t *testing.T, dsn string) {
	ctx := t.Context()
	pool := poolAt(t, dsn)
	f, schema := newFence(t, pool)

	if err := f.Admit(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Admit(ctx, "r", 5); err != nil {
		t.Fatalf("same token again: %v, want admitted (>=)", err)
	}
	wantStale(t, f.Admit(ctx, "r", 4), "r", 4, 5)
	if err := f.Admit(ctx, "other", 1); err != nil {
		t.Fatalf("resources are independent: %v", err)
	}
	if h, err := f.Highest(ctx, "r"); err != nil || h != 5 {
		t.Fatalf("Highest(r) = %d, %v; want 5", h, err)
	}
	if h, err := f.Highest(ctx, "never"); err != nil || h != 0 {
		t.Fatalf("Highest(never) = %d, %v; want 0", h, err)
	}
	if err := f.Admit(ctx, "big", math.MaxInt64); err != nil {
		t.Fatalf("token MaxInt64: %v", err)
	}

	// A stale InTx does not call fn.
	called := false
	err := f.InTx(ctx, "r", 3, func(context.Context, pgx.Tx) error { called = true; return nil })
	wantStale(t, err, "r", 3, 5)
	if called {
		t.Fatal("fn called for a stale token")
	}

	// An error from fn rolls back fn's writes and the admit itself.
	boom := errors.New("boom")
	err = f.InTx(ctx, "r", 9, func(ctx context.Context, tx pgx.Tx) error {
		if h, err := f.Highest(ctx, "r"); err != nil || h != 5 {
			t.Errorf("while the admit of 9 is uncommitted, Highest = %d, %v; want 5", h, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	if h, _ := f.Highest(ctx, "r"); h != 5 {
		t.Fatalf("after rollback Highest = %d, want 5", h)
	}

	// A Beginner that cannot run a statement on its own: Admit and Highest
	// use a transaction.
	fb, err := postgres.NewFence(beginOnly{pool}, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	wantStale(t, fb.Admit(ctx, "r", 4), "r", 4, 5)
	if err := fb.Admit(ctx, "r", 6); err != nil {
		t.Fatal(err)
	}
	if h, err := fb.Highest(ctx, "r"); err != nil || h != 6 {
		t.Fatalf("Highest(r) through a transaction = %d, %v; want 6", h, err)
	}

	// After a stale AdmitTx the caller's transaction is still usable.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	wantStale(t, f.AdmitTx(ctx, tx, "r", 2), "r", 2, 6)
	var one int
	if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("transaction unusable after a stale admit: %v", err)
	}
}

func TestColumnAdmit(t *testing.T) {
	t.Parallel()
	testColumnAdmit(t, testDSN())
}

func testColumnAdmit(t *testing.T, dsn string) {
	ctx := t.Context()
	pool := poolAt(t, dsn)
	schema := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "accounts")+" (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "accounts")+" (id) VALUES (1), (2)")
	col, err := postgres.NewColumn(pool, "accounts", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := col.AddColumn(ctx); err != nil {
			t.Fatal(err)
		}
	}

	admit := func(key any, tok fence.Token) error {
		return col.InTx(ctx, key, tok, func(context.Context, pgx.Tx) error { return nil })
	}
	if err := admit(1, 5); err != nil {
		t.Fatal(err)
	}
	if err := admit(1, 5); err != nil {
		t.Fatalf("same token again: %v", err)
	}
	wantStale(t, admit(1, 4), "accounts/1", 4, 5)
	if err := admit(2, 1); err != nil {
		t.Fatalf("rows are independent: %v", err)
	}

	called := false
	err = col.InTx(ctx, 3, 7, func(context.Context, pgx.Tx) error { called = true; return nil })
	if !errors.Is(err, postgres.ErrNoRow) || fence.IsStale(err) || called {
		t.Fatalf("missing row: err = %v (called %v), want ErrNoRow, not stale, fn not called", err, called)
	}
	if !strings.Contains(err.Error(), "no such row") || !strings.Contains(err.Error(), "accounts/3") {
		t.Fatalf("missing row message %q does not say which row", err)
	}

	// The single-statement form and Rejected.
	guarded := "UPDATE " + ident(schema, "accounts") + " SET balance = balance + 1, fence_token = $2 WHERE id = $1 AND fence_token <= $2"
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, c := range []struct {
			key  int
			tok  fence.Token
			want func(error) bool
		}{
			{1, 3, fence.IsStale},
			{9, 3, func(err error) bool { return errors.Is(err, postgres.ErrNoRow) && !fence.IsStale(err) }},
		} {
			tag, err := tx.Exec(ctx, guarded, c.key, int64(c.tok))
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 0 {
				t.Errorf("guarded update of %d with %d affected a row", c.key, c.tok)
			}
			if err := col.Rejected(ctx, tx, c.key, c.tok); !c.want(err) {
				t.Errorf("Rejected(%d, %d) = %v", c.key, c.tok, err)
			}
		}
		if err := col.Rejected(ctx, tx, 1, 6); err == nil || fence.IsStale(err) || errors.Is(err, postgres.ErrNoRow) {
			t.Errorf("Rejected of an admissible token = %v, want an error that is neither stale nor no row", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestColumnRowCreatedWithItsToken: a row the guard has not seen is
// created carrying its creator's token, so that a stale holder's write
// after it is rejected. A row inserted with the column's default, 0,
// admits any token, a stale one too: a holder that got ErrNoRow, which said
// only "no such row", and inserted the row plainly was overwritten by the
// holder before it (docs/design.md, defect 120). ErrNoRow now says to create
// the row with the token, and the guarded insert below is the documented way.
func TestColumnRowCreatedWithItsToken(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := poolAt(t, testDSN())
	schema := testSchema(t, pool)
	mustExec(t, pool, "CREATE SCHEMA "+ident(schema))
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "invoices")+" (id text PRIMARY KEY, body text NOT NULL)")
	col, err := postgres.NewColumn(pool, "invoices", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := col.AddColumn(ctx); err != nil {
		t.Fatal(err)
	}
	// B (token 7) finds no row, and is told how to create it.
	err = col.InTx(ctx, "inv-42", 7, func(context.Context, pgx.Tx) error { return nil })
	if !errors.Is(err, postgres.ErrNoRow) || !strings.Contains(err.Error(), "fence_token = 7") {
		t.Fatalf("missing row: %v; want ErrNoRow saying to create the row with fence_token = 7", err)
	}
	// The guarded insert of doc.go: it creates the row with the token, or
	// writes an existing one only for a token not lower than its own.
	upsert := "INSERT INTO " + ident(schema, "invoices") + " AS i (id, body, fence_token) VALUES ($1, $3, $2) " +
		"ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token WHERE i.fence_token <= EXCLUDED.fence_token"
	write := func(tok fence.Token, body string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, upsert, "inv-42", int64(tok), body)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return col.Rejected(ctx, tx, "inv-42", tok)
			}
			return nil
		})
	}
	if err := write(7, "B"); err != nil {
		t.Fatal(err)
	}
	// A (token 5) wakes from its pause: stale, by either form.
	wantStale(t, write(5, "A (stale)"), "invoices/inv-42", 5, 7)
	wantStale(t, col.InTx(ctx, "inv-42", 5, func(context.Context, pgx.Tx) error { return nil }), "invoices/inv-42", 5, 7)
	var body string
	if err := pool.QueryRow(ctx, "SELECT body FROM "+ident(schema, "invoices")+" WHERE id = 'inv-42'").Scan(&body); err != nil || body != "B" {
		t.Fatalf("row body %q (%v), want B's", body, err)
	}
	// The hazard the docs name: a row inserted with the default admits a
	// stale token.
	mustExec(t, pool, "INSERT INTO "+ident(schema, "invoices")+" (id, body) VALUES ('inv-43', 'B, unguarded')")
	if err := col.InTx(ctx, "inv-43", 5, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("a row inserted with fence_token 0: %v; the docs say it admits any token", err)
	}
}

func TestSQLFunction(t *testing.T) {
	t.Parallel()
	testSQLFunction(t, testDSN())
}

func testSQLFunction(t *testing.T, dsn string) {
	ctx := t.Context()
	pool := poolAt(t, dsn)
	f, schema := newFence(t, pool)

	// sqlAdmit calls fence_admit from plain SQL, as a client in another
	// language would, with the schema on its search_path.
	sqlAdmit := func(resource string, tok int64) (int64, error) {
		var got int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident(schema)); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT fence_admit($1, $2)", resource, tok).Scan(&got)
		})
		return got, err
	}
	for range 2 {
		if got, err := sqlAdmit("r", 5); err != nil || got != 5 {
			t.Fatalf("fence_admit('r', 5) = %d, %v; want 5", got, err)
		}
	}
	_, err := sqlAdmit("r", 3)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != postgres.SQLStateStale {
		t.Fatalf("fence_admit('r', 3) = %v, want SQLSTATE %s", err, postgres.SQLStateStale)
	}
	if want := `fence: stale token 3 for "r": highest admitted is 5`; pe.Message != want {
		t.Fatalf("message %q, want %q", pe.Message, want)
	}
	wantStale(t, postgres.MapError(err), "r", 3, 5)

	// The function and the Go adapter share one fence table.
	if err := f.Admit(ctx, "r", 7); err != nil {
		t.Fatal(err)
	}
	_, err = sqlAdmit("r", 6)
	wantStale(t, postgres.MapError(err), "r", 6, 7)
	odd := `we"ird 'name' resource=x token=1`
	if _, err := sqlAdmit(odd, 10); err != nil {
		t.Fatal(err)
	}
	wantStale(t, f.Admit(ctx, odd, 9), odd, 9, 10)
	_, err = sqlAdmit(odd, 8)
	wantStale(t, postgres.MapError(err), odd, 8, 10)

	// InTx maps a stale fence_admit raised inside fn.
	err = f.InTx(ctx, "outer", 1, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT "+ident(schema)+".fence_admit('r', 2)")
		return err
	})
	wantStale(t, err, "r", 2, 7)

	_, err = sqlAdmit("r", 0)
	if !errors.As(err, &pe) || pe.Code != "22023" {
		t.Fatalf("fence_admit('r', 0) = %v, want SQLSTATE 22023", err)
	}
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	testMigrateConcurrent(t, testDSN())
}

func testMigrateConcurrent(t *testing.T, dsn string) {
	ctx := t.Context()
	pool := poolAt(t, dsn)
	schema := testSchema(t, pool)
	const migrators = 8
	for round := range 2 {
		errs := make([]error, migrators)
		var wg sync.WaitGroup
		for i := range migrators {
			wg.Go(func() {
				// A connection of its own, as another process would have.
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					errs[i] = err
					return
				}
				defer conn.Close(context.Background())
				f, err := postgres.NewFence(conn, postgres.WithSchema(schema))
				if err == nil {
					err = f.Migrate(ctx)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, migrator %d: %v", round, i, err)
			}
		}
	}
	var n int
	err := pool.QueryRow(ctx, "SELECT count(*) FROM "+ident(schema, "fence_schema_version")).Scan(&n)
	if err != nil || n != 2 {
		t.Fatalf("fence_schema_version has %d rows (%v), want 2", n, err)
	}
	var got int64
	if err := pool.QueryRow(ctx, "SELECT "+ident(schema)+".fence_admit('x', 3)").Scan(&got); err != nil || got != 3 {
		t.Fatalf("fence_admit after migrations = %d, %v", got, err)
	}

	// One fence table per schema.
	other, err := postgres.NewFence(pool, postgres.WithSchema(schema), postgres.WithTable("other"))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); !errors.Is(err, postgres.ErrInvalidOption) {
		t.Fatalf("Migrate with another table = %v, want ErrInvalidOption", err)
	}
}

// TestOddNames runs everything with names that need quoting, and that
// would do harm if pasted into SQL.
func TestOddNames(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	schema := testSchema(t, pool) + `"; DROP TABLE x; --`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident(schema)+" CASCADE")
	})
	f, err := postgres.NewFence(pool, postgres.WithSchema(schema), postgres.WithTable(`Fence 'tokens'`))
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
	var got int64
	if err := pool.QueryRow(ctx, "SELECT "+ident(schema)+".fence_admit('r', 3)").Scan(&got); err != nil || got != 3 {
		t.Fatalf("fence_admit = %d, %v", got, err)
	}

	mustExec(t, pool, "CREATE TABLE "+ident(schema, `My "Rows"`)+` ("Key; 1" text PRIMARY KEY, "fence token" bigint NOT NULL DEFAULT 0)`)
	mustExec(t, pool, "INSERT INTO "+ident(schema, `My "Rows"`)+` VALUES ('a', 0)`)
	col, err := postgres.NewColumn(pool, `My "Rows"`, "Key; 1", postgres.WithSchema(schema), postgres.WithFenceColumn("fence token"))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, pgx.Tx) error { return nil }
	if err := col.InTx(ctx, "a", 4, ok); err != nil {
		t.Fatal(err)
	}
	wantStale(t, col.InTx(ctx, "a", 3, ok), `My "Rows"/a`, 3, 4)
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testPool(t)
	long := strings.Repeat("n", 64)
	for _, c := range []struct {
		name string
		opts []postgres.Option
		want error
	}{
		{"empty schema", []postgres.Option{postgres.WithSchema("")}, postgres.ErrInvalidName},
		{"empty table", []postgres.Option{postgres.WithTable("")}, postgres.ErrInvalidName},
		{"long table", []postgres.Option{postgres.WithTable(long)}, postgres.ErrInvalidName},
		{"NUL in schema", []postgres.Option{postgres.WithSchema("a\x00b")}, postgres.ErrInvalidName},
		{"dollar in table", []postgres.Option{postgres.WithTable("a$b")}, postgres.ErrInvalidName},
		{"invalid UTF-8 in schema", []postgres.Option{postgres.WithSchema("a\xffb")}, postgres.ErrInvalidName},
		{"invalid UTF-8 in table", []postgres.Option{postgres.WithTable("a\xffb")}, postgres.ErrInvalidName},
		{"reserved schema", []postgres.Option{postgres.WithSchema("pg_fence")}, postgres.ErrInvalidName},
		{"fence column on a Fence", []postgres.Option{postgres.WithFenceColumn("x")}, postgres.ErrInvalidOption},
		{"read-only", []postgres.Option{postgres.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly})}, postgres.ErrInvalidOption},
		{"nil option", []postgres.Option{nil}, postgres.ErrInvalidOption},
	} {
		if _, err := postgres.NewFence(pool, c.opts...); !errors.Is(err, c.want) {
			t.Errorf("NewFence, %s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := postgres.NewFence(nil); !errors.Is(err, postgres.ErrInvalidOption) {
		t.Errorf("NewFence(nil): %v", err)
	}
	for _, c := range []struct {
		name, table, key string
		opts             []postgres.Option
		want             error
	}{
		{"empty table", "", "id", nil, postgres.ErrInvalidName},
		{"empty key", "t", "", nil, postgres.ErrInvalidName},
		{"empty fence column", "t", "id", []postgres.Option{postgres.WithFenceColumn("")}, postgres.ErrInvalidName},
		{"long key", "t", long, nil, postgres.ErrInvalidName},
		{"key is fence column", "t", "fence_token", nil, postgres.ErrInvalidName},
		{"invalid UTF-8 in table", "t\xff", "id", nil, postgres.ErrInvalidName},
		{"invalid UTF-8 in key", "t", "id\xc3", nil, postgres.ErrInvalidName},
		{"invalid UTF-8 in fence column", "t", "id", []postgres.Option{postgres.WithFenceColumn("f\xff")}, postgres.ErrInvalidName},
		{"table option on a Column", "t", "id", []postgres.Option{postgres.WithTable("x")}, postgres.ErrInvalidOption},
	} {
		if _, err := postgres.NewColumn(pool, c.table, c.key, c.opts...); !errors.Is(err, c.want) {
			t.Errorf("NewColumn, %s: %v, want %v", c.name, err, c.want)
		}
	}
	// '$' is fine in a Column's names: they never enter fence_admit.
	if _, err := postgres.NewColumn(pool, "t$1", "id$"); err != nil {
		t.Errorf("NewColumn with '$': %v", err)
	}
	// Only a schema's "pg_" is reserved, and only in lower case.
	if _, err := postgres.NewFence(pool, postgres.WithSchema("PG_fence"), postgres.WithTable("pg_tokens")); err != nil {
		t.Errorf("NewFence with schema PG_fence and table pg_tokens: %v", err)
	}
	for _, c := range []struct{ schema, want string }{{"a\xffb", "UTF-8"}, {"pg_fence", `"pg_"`}} {
		if _, err := postgres.NewFence(pool, postgres.WithSchema(c.schema)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewFence with schema %q: %v, want an error that mentions %s", c.schema, err, c.want)
		}
	}

	f, err := postgres.NewFence(pool)
	if err != nil {
		t.Fatal(err)
	}
	col, err := postgres.NewColumn(pool, "t", "id")
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, tok := range []fence.Token{0, math.MaxInt64 + 1, math.MaxUint64} {
		for name, err := range map[string]error{
			"Fence.Admit":   f.Admit(ctx, "r", tok),
			"Fence.InTx":    f.InTx(ctx, "r", tok, noop),
			"Column.InTx":   col.InTx(ctx, 1, tok, noop),
			"Fence.AdmitTx": f.AdmitTx(ctx, nil, "r", tok),
		} {
			if !errors.Is(err, fence.ErrInvalidToken) || (tok != 0) != errors.Is(err, postgres.ErrTokenRange) {
				t.Errorf("%s(%d) = %v, want ErrInvalidToken (and ErrTokenRange above MaxInt64)", name, tok, err)
			}
			// The error says what is allowed, as fence.ParseToken's does.
			if err != nil && !strings.Contains(err.Error(), "9223372036854775807") {
				t.Errorf("%s(%d) = %v: does not say what is allowed (1 to 9223372036854775807)", name, tok, err)
			}
		}
	}
}

func TestContextEnds(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	f, _ := newFence(t, pool)
	ctx, cancel := context.WithCancel(t.Context())
	err := f.InTx(ctx, "r", 1, func(ctx context.Context, tx pgx.Tx) error {
		cancel()
		_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("InTx after cancel = %v, want context.Canceled", err)
	}
	cancel()
	if err := f.Admit(ctx, "r", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with an ended context = %v, want context.Canceled", err)
	}
	if h, err := f.Highest(t.Context(), "r"); err != nil || h != 0 {
		t.Fatalf("Highest after cancelled admits = %d, %v; want 0", h, err)
	}
}

func TestMapErrorAndIsRetryable(t *testing.T) {
	t.Parallel()
	stale := &pgconn.PgError{Code: postgres.SQLStateStale, Detail: "token=3 highest=9 resource=a b=c"}
	wantStale(t, postgres.MapError(stale), "a b=c", 3, 9)
	odd := &pgconn.PgError{Code: postgres.SQLStateStale, Detail: "something else"}
	if err := postgres.MapError(odd); !fence.IsStale(err) || !errors.Is(err, odd) {
		t.Fatalf("MapError of an unparsable SF001 = %v, want stale and still the PgError", err)
	}
	other := &pgconn.PgError{Code: "23505"}
	if err := postgres.MapError(other); err != other {
		t.Fatalf("MapError changed a non-fence error: %v", err)
	}
	if postgres.MapError(nil) != nil {
		t.Fatal("MapError(nil) != nil")
	}
	for code, want := range map[string]bool{
		"40001": true, "40P01": true, "55P03": true, "57014": true, // rolled back: conflict, timeout
		"23505": false, postgres.SQLStateStale: false, "25006": false,
	} {
		err := errors.Join(errors.New("wrapped"), &pgconn.PgError{Severity: "ERROR", Code: code})
		if got := postgres.IsRetryable(err); got != want {
			t.Errorf("IsRetryable(%s) = %v, want %v", code, got, want)
		}
	}
	// Not retryable, whatever the code: a session's end outside InTx (the
	// answer to a COMMIT of the caller's may be one), a commit that may
	// have been applied, an error of the caller's ended context.
	for name, err := range map[string]error{
		"FATAL 57P01":           &pgconn.PgError{Severity: "FATAL", Code: "57P01"},
		"FATAL 40001":           &pgconn.PgError{Severity: "FATAL", Code: "40001"},
		"08P01":                 &pgconn.PgError{Severity: "ERROR", Code: "08P01"},
		"ErrCommitUnknown":      fmt.Errorf("%w: %w", postgres.ErrCommitUnknown, &pgconn.PgError{Severity: "ERROR", Code: "40001"}),
		"57014 and ctx's error": fmt.Errorf("%w (%w)", &pgconn.PgError{Severity: "ERROR", Code: "57014"}, context.Canceled),
		"55P03 and deadline":    fmt.Errorf("%w (%w)", &pgconn.PgError{Severity: "ERROR", Code: "55P03"}, context.DeadlineExceeded),
		"not Postgres":          errors.New("x"),
		"nil":                   nil,
	} {
		if postgres.IsRetryable(err) {
			t.Errorf("IsRetryable(%s) = true, want false", name)
		}
	}
}
