package main_test

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
)

// psql runs psql on the test database with input on stdin and returns its
// exit status, stdout and stderr. Errors are verbose, so that they carry
// their SQLSTATE.
func psql(t *testing.T, input string) (int, string, string) {
	t.Helper()
	if _, err := exec.LookPath("psql"); err != nil {
		t.Fatalf("psql is not installed (apt-get install postgresql-client): %v", err)
	}
	cmd := exec.Command("psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-d", testenv.PostgresDSN())
	cmd.Stdin = strings.NewReader(input)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("psql: %v", err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// pgSchema returns a new schema name, dropped when the test ends.
func pgSchema(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := "fenced_cli_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if code, _, stderr := psql(t, "DROP SCHEMA IF EXISTS "+s+" CASCADE;"); code != 0 {
			t.Errorf("drop schema %s: %s", s, stderr)
		}
	})
	return s
}

// TestPgSQLWithPsql installs the fence with psql alone, twice, and uses
// fence_admit from plain SQL as a writer in any language would.
func TestPgSQLWithPsql(t *testing.T) {
	t.Parallel()
	schema := pgSchema(t)
	code, script, stderr := run(t, nil, "admin", "pg-sql", "--schema", schema)
	if code != 0 || !strings.HasPrefix(script, "-- fenced:") || !strings.Contains(script, "BEGIN ISOLATION LEVEL READ COMMITTED;") {
		t.Fatalf("pg-sql: exit %d, stderr %s, script:\n%s", code, stderr, script)
	}
	for i, want := range []string{"applied migration 0002_fence_admit", "is up to date (2 migrations)"} {
		code, _, stderr := psql(t, script)
		if code != 0 || !strings.Contains(stderr, want) {
			t.Fatalf("psql run %d: exit %d, want a notice %q:\n%s", i+1, code, want, stderr)
		}
	}

	admit := func(resource string, tok int64) (int, string, string) {
		return psql(t, "SELECT "+schema+".fence_admit('"+resource+"', "+itoa(tok)+");")
	}
	for _, c := range []struct {
		what     string
		resource string
		tok      int64
	}{
		{"a first token", "account-42", 1796211888717416},
		{"a higher token (advance)", "account-42", 1796211888717420},
		{"the same token (equal)", "account-42", 1796211888717420},
		{"a new resource", "account-43", 5},
		{"the largest token", "account-44", 1<<63 - 1},
	} {
		code, out, stderr := admit(c.resource, c.tok)
		if code != 0 || strings.TrimSpace(out) != itoa(c.tok) {
			t.Fatalf("%s: fence_admit('%s', %d): exit %d, %q %s", c.what, c.resource, c.tok, code, out, stderr)
		}
	}
	code, _, stderr = admit("account-42", 1796211888717416)
	if code != 3 || !strings.Contains(stderr, `ERROR:  SF001: fence: stale token 1796211888717416 for "account-42": highest admitted is 1796211888717420`) {
		t.Fatalf("stale token: exit %d, want 3 and SQLSTATE SF001:\n%s", code, stderr)
	}
	code, _, stderr = admit("account-45", 0)
	if code != 3 || !strings.Contains(stderr, "22023") {
		t.Fatalf("token 0: exit %d, want 3 and SQLSTATE 22023:\n%s", code, stderr)
	}

	// The admit guards the write of its transaction: the stale writer's
	// insert never lands.
	code, _, stderr = psql(t, "CREATE TABLE "+schema+".ledger (entry text);")
	if code != 0 {
		t.Fatal(stderr)
	}
	write := func(entry string, tok int64) (int, string) {
		code, _, stderr := psql(t, "BEGIN;\nSELECT "+schema+".fence_admit('account-42', "+itoa(tok)+");\n"+
			"INSERT INTO "+schema+".ledger VALUES ('"+entry+"');\nCOMMIT;")
		return code, stderr
	}
	if code, stderr := write("new holder", 1796211888717421); code != 0 {
		t.Fatalf("write with the highest token: exit %d %s", code, stderr)
	}
	if code, stderr := write("paused holder", 1796211888717416); code != 3 || !strings.Contains(stderr, "SF001") {
		t.Fatalf("write with a stale token: exit %d %s", code, stderr)
	}
	if _, out, _ := psql(t, "SELECT string_agg(entry, ',') FROM "+schema+".ledger;"); strings.TrimSpace(out) != "new holder" {
		t.Fatalf("ledger holds %q, want only the new holder's entry", out)
	}

	// pg-migrate on a schema that psql migrated changes nothing.
	_, before, _ := psql(t, "SELECT version, applied_at FROM "+schema+".fence_schema_version ORDER BY 1;")
	code, out, stderr := run(t, []string{"FENCED_DATABASE_URL=" + testenv.PostgresDSN()}, "admin", "pg-migrate", "--schema", schema)
	if code != 0 || !strings.Contains(out, "migrated") {
		t.Fatalf("pg-migrate after psql: exit %d %q %s", code, out, stderr)
	}
	if _, after, _ := psql(t, "SELECT version, applied_at FROM "+schema+".fence_schema_version ORDER BY 1;"); after != before {
		t.Fatalf("pg-migrate after psql changed the versions: %q, then %q", before, after)
	}
}

// TestPgMigrate applies the migrations with pg-migrate and checks that the
// script then finds nothing to do.
func TestPgMigrate(t *testing.T) {
	t.Parallel()
	schema := pgSchema(t)
	code, out, stderr := run(t, nil, "admin", "pg-migrate", "--database-url", testenv.PostgresDSN(), "--schema", schema, "--table", "fence")
	if code != 0 || !strings.Contains(out, `schema "`+schema+`" has the fence table "fence"`) {
		t.Fatalf("pg-migrate: exit %d %q %s", code, out, stderr)
	}
	_, script, _ := run(t, []string{"FENCED_SCHEMA=" + schema, "FENCED_TABLE=fence"}, "admin", "pg-sql")
	if code, _, stderr := psql(t, script); code != 0 || !strings.Contains(stderr, "is up to date") || strings.Contains(stderr, "applied migration") {
		t.Fatalf("psql after pg-migrate: exit %d %s", code, stderr)
	}
	if code, out, stderr := psql(t, "SELECT "+schema+".fence_admit('r', 7);"); code != 0 || strings.TrimSpace(out) != "7" {
		t.Fatalf("fence_admit: exit %d %q %s", code, out, stderr)
	}
	// Another table in the same schema is refused, by both.
	code, _, stderr = run(t, nil, "admin", "pg-migrate", "--database-url", testenv.PostgresDSN(), "--schema", schema)
	if code != 1 || !strings.Contains(stderr, `already has the fence table "fence", not "fence_tokens"`) {
		t.Fatalf("pg-migrate of another table: exit %d %s", code, stderr)
	}
	_, script, _ = run(t, nil, "admin", "pg-sql", "--schema", schema)
	if code, _, stderr := psql(t, script); code != 3 || !strings.Contains(stderr, "already has the fence table fence, not fence_tokens") {
		t.Fatalf("psql of another table: exit %d %s", code, stderr)
	}
}

// TestPgMigrateRefusesAReadOnlyServer: pg-migrate against a read-only
// server (a hot-standby replica; here PGOPTIONS sets
// default_transaction_read_only) reported success once the migrations were
// applied, though every admit there then failed. It fails, and says why.
func TestPgMigrateRefusesAReadOnlyServer(t *testing.T) {
	t.Parallel()
	schema := pgSchema(t)
	if code, out, stderr := run(t, nil, "admin", "pg-migrate", "--database-url", testenv.PostgresDSN(), "--schema", schema); code != 0 {
		t.Fatalf("pg-migrate: exit %d %q %s", code, out, stderr)
	}
	code, out, stderr := run(t, []string{"PGOPTIONS=-c default_transaction_read_only=on"},
		"admin", "pg-migrate", "--database-url", testenv.PostgresDSN(), "--schema", schema)
	if code != 1 || strings.Contains(out, "migrated") || !strings.Contains(stderr, "read-only") || !strings.Contains(stderr, "SQLSTATE 25006") {
		t.Fatalf("pg-migrate of a read-only server: exit %d %q %s; want exit 1 and an error saying it is read-only", code, out, stderr)
	}
}

func TestPgAdminErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{nil, []string{"admin", "pg-migrate"}, 2, "--database-url is required"},
		{nil, []string{"admin", "pg-migrate", "--database-url", "postgres://u:secret@h:notaport/db"}, 2, "--database-url: cannot parse"},
		{[]string{"FENCED_DATABASE_URL=nonsense"}, []string{"admin", "pg-migrate"}, 2, "--database-url"},
		{nil, []string{"admin", "pg-migrate", "--database-url", "postgres://postgres@127.0.0.1:5432/test", "--timeout", "0s"}, 2, "--timeout"},
		{nil, []string{"admin", "pg-migrate", "--database-url", "postgres://postgres@127.0.0.1:5432/test", "--schema", ""}, 2, "--schema"},
		{nil, []string{"admin", "pg-sql", "--schema", "a$b"}, 2, "--schema"},
		{nil, []string{"admin", "pg-sql", "--table", strings.Repeat("t", 64)}, 2, "--table"},
		{nil, []string{"admin", "pg-sql", "extra"}, 2, `unexpected argument "extra"`},
		{nil, []string{"admin", "pg-sql", "--database-url", "x"}, 2, "--database-url"},
		{nil, []string{"admin", "pg-migrate", "--database-url", "postgres://postgres@" + strings.TrimPrefix(testenv.FreeURL(t), "http://") + "/test"}, 1, "Postgres at 127.0.0.1:"},
	} {
		code, _, stderr := run(t, c.env, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s (env %v): exit %d, stderr %q; want exit %d and %q", strings.Join(c.args, " "), c.env, code, stderr, c.code, c.want)
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("fenced %s: stderr shows the password: %s", strings.Join(c.args, " "), stderr)
		}
	}
	code, out, _ := run(t, nil, "admin", "--help")
	if code != 0 || !strings.Contains(out, "pg-sql") || !strings.Contains(out, "pg-migrate") {
		t.Errorf("admin --help: exit %d %q", code, out)
	}
	code, out, _ = run(t, nil, "admin", "pg-migrate", "--help")
	if code != 0 || !strings.Contains(out, "$FENCED_DATABASE_URL") {
		t.Errorf("admin pg-migrate --help: exit %d %q", code, out)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestPgMigrateForeignTableNamesFlags: pg-migrate on a schema whose table
// of the fence's name is not a fence table says to give another --table
// or --schema: the flags an operator has, not the Go options the adapter
// names for SDK users (WithTable, WithSchema).
func TestPgMigrateForeignTableNamesFlags(t *testing.T) {
	t.Parallel()
	schema := pgSchema(t)
	if code, _, stderr := psql(t, "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".fence_tokens (id int);"); code != 0 {
		t.Fatalf("create the foreign table: %s", stderr)
	}
	code, _, stderr := run(t, nil, "admin", "pg-migrate", "--database-url", testenv.PostgresDSN(), "--schema", schema)
	if code != 1 || !strings.Contains(stderr, "is not a fence table") || !strings.Contains(stderr, "(--table)") || !strings.Contains(stderr, "(--schema)") ||
		strings.Contains(stderr, "WithTable") || strings.Contains(stderr, "WithSchema") {
		t.Fatalf("pg-migrate on a foreign fence_tokens: exit %d, stderr %q; want exit 1 naming --table and --schema, not the Go options", code, stderr)
	}
}
