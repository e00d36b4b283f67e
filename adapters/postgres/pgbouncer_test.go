package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/internal/freeport"
)

// TestBehindPgBouncer runs the adapter's tests through PgBouncer in
// transaction pooling mode, as many production databases are reached:
// each transaction may run on another server connection, so nothing
// session-scoped (a prepared statement, SET, a session advisory lock, a
// temporary table) carries from one transaction to the next, and the
// adapter must keep everything it relies on inside the transaction. With
// two server connections for all of a test's clients, transactions of
// different clients take turns on the same connections. pgx runs in the two
// query modes that need no named prepared statements, as the package doc
// tells users to set.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	dsn := startPgBouncer(t)
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dsn := dsn + "&default_query_exec_mode=" + mode
			t.Run("FenceAdmit", func(t *testing.T) { testFenceAdmit(t, dsn) })
			t.Run("ColumnAdmit", func(t *testing.T) { testColumnAdmit(t, dsn) })
			t.Run("SQLFunction", func(t *testing.T) { testSQLFunction(t, dsn) })
			t.Run("MigrateConcurrent", func(t *testing.T) { testMigrateConcurrent(t, dsn) })
			for _, m := range []string{"table", "column"} {
				t.Run("ReadModifyWrite/"+m, func(t *testing.T) { testReadModifyWrite(t, dsn, m, pgx.ReadCommitted) })
			}
		})
	}
	t.Run("StatementCacheAdvice", func(t *testing.T) {
		t.Parallel()
		testStatementCacheAdvice(t, strings.Replace(dsn, "/fenced?", "/fenced_one?", 1))
	})
}

// TestStatementPoolingCannotGuard pins what the package doc says of
// PgBouncer in statement mode: every transaction of more than one
// statement fails at BEGIN (FATAL 08P01), so InTx, Column.InTx and Migrate
// do; Admit, one statement, works, and is only a check.
func TestStatementPoolingCannotGuard(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	_, schema := newFence(t, pool)
	mustExec(t, pool, "CREATE TABLE "+ident(schema, "acct")+" (id int PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0)")
	mustExec(t, pool, "INSERT INTO "+ident(schema, "acct")+" VALUES (1)")
	p := poolAt(t, startPgBouncerTo(t, "", 0, "pool_mode = statement")+"&default_query_exec_mode=exec")
	f, err := postgres.NewFence(p, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	c, err := postgres.NewColumn(p, "acct", "id", postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, err := range map[string]error{
		"Migrate":     f.Migrate(ctx),
		"Fence.InTx":  f.InTx(ctx, "r", 5, noop),
		"Column.InTx": c.InTx(ctx, 1, 5, noop),
	} {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "08P01" || !strings.Contains(err.Error(), "statement pooling") || postgres.IsRetryable(err) {
			t.Errorf("%s through statement pooling = %v, want PgBouncer's 08P01, not retryable", name, err)
		}
	}
	if err := f.Admit(ctx, "r", 5); err != nil {
		t.Fatalf("Admit through statement pooling: %v", err)
	}
}

// testStatementCacheAdvice: with pgx's default query mode, which prepares
// named statements per connection, two clients of a pooler in transaction
// mode with one server connection prepare the same statement on it, and
// the second is refused. The adapter's error says what to change.
func testStatementCacheAdvice(t *testing.T, dsn string) {
	ctx := t.Context()
	_, schema := newFence(t, poolAt(t, dsn+"&default_query_exec_mode=exec"))
	var errs []error
	for range 2 {
		conn, err := pgx.Connect(ctx, dsn) // pgx's default: cache_statement
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		fc, err := postgres.NewFence(conn, postgres.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		errs = append(errs, fc.Admit(ctx, "r", 1))
	}
	if errs[0] != nil {
		t.Fatalf("first client's admit: %v", errs[0])
	}
	err := errs[1]
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P05" || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Fatalf("second client's admit = %v, want SQLSTATE 42P05 with the advice to set default_query_exec_mode", err)
	}
}

// startPgBouncer starts pgbouncer in transaction pooling mode in front of
// the test database, on a free loopback port, with two server connections,
// and returns a DSN through it. It fails (never skips) when pgbouncer is
// not installed: CI installs it. The process is stopped when the test ends.
func startPgBouncer(t *testing.T) string {
	t.Helper()
	return startPgBouncerTo(t, "", 0, "")
}

// startPgBouncerTo is startPgBouncer with the server at host:port instead
// of the test database's (when host is not empty; a fault proxy, say) and
// extra lines for the [pgbouncer] section.
func startPgBouncerTo(t *testing.T, host string, port int, extra string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/pgbouncer") // Debian's, off a user's PATH
	}
	if err != nil {
		t.Fatalf("pgbouncer is not installed (apt-get install pgbouncer): %v", err)
	}
	target, err := pgconn.ParseConfig(testDSN())
	if err != nil {
		t.Fatalf("test database DSN: %v", err)
	}
	// The config must be readable by the user pgbouncer runs as: it
	// refuses to run as root, so as root it is started with -u nobody.
	dir, err := os.MkdirTemp("", "fenced-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if host == "" {
		host, port = target.Host, int(target.Port)
	}
	server := fmt.Sprintf("host=%s port=%d dbname=%s user=%s",
		connValue(host), port, connValue(target.Database), connValue(target.User))
	if target.Password != "" {
		server += " password=" + connValue(target.Password)
	}
	for try := 1; ; try++ {
		listen, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(dir, "pgbouncer.ini")
		ini := fmt.Sprintf(`[databases]
fenced = %[1]s
fenced_one = %[1]s pool_size=1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[2]d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 500
logfile =
pidfile =
%[3]s
`, server, listen, extra)
		if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
			t.Fatal(err)
		}
		dsn := fmt.Sprintf("postgres://fenced@127.0.0.1:%d/fenced?sslmode=disable", listen)
		out, err := runPgBouncer(t, bin, conf, dsn)
		if err == nil {
			return dsn
		}
		if try == 3 || !strings.Contains(out, "Address already in use") {
			t.Fatalf("%v; its log:\n%s", err, out)
		}
	}
}

// runPgBouncer starts pgbouncer with conf and waits until dsn connects
// through it to the database. On failure it returns pgbouncer's log.
func runPgBouncer(t *testing.T, bin, conf, dsn string) (string, error) {
	t.Helper()
	args := []string{conf}
	if os.Geteuid() == 0 {
		args = []string{"-u", "nobody", conf}
	}
	log, err := os.CreateTemp("", "fenced-pgbouncer-log-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close(); os.Remove(log.Name()) })
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}
	readLog := func() string { b, _ := os.ReadFile(log.Name()); return string(b) }
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgconn.Connect(ctx, dsn)
		if err == nil {
			err = conn.Exec(ctx, "SELECT 1").Close()
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			t.Cleanup(stop)
			return "", nil
		}
		select {
		case <-done:
			return readLog(), fmt.Errorf("pgbouncer exited at start")
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return readLog(), fmt.Errorf("no connection through pgbouncer within 10s: %w", err)
		}
		time.Sleep(10 * time.Millisecond) // polling a process that is starting
	}
}

// connValue quotes v for a libpq-style connection string, as pgbouncer's
// [databases] section reads them.
func connValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
