package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/internal/testenv"
)

// TestLedger builds the program and runs it against the real Redis and
// Postgres (etcd is embedded by the program).
func TestLedger(t *testing.T) {
	t.Parallel()
	testenv.Redis(t) // fails the test, with what to do, if Redis is down
	dsn := testenv.PostgresDSN()
	conn := pgConn(t, dsn)
	bin := build(t)

	// Twice in a row on the same schema: the Redis-only lock lets the
	// paused worker's write through, fenced rejects it and keeps the ledger
	// right; the second run finds nothing left by the first.
	t.Run("both modes twice", func(t *testing.T) {
		schema := "ledger_test_" + randomHex(t)
		t.Cleanup(func() { dropSchema(conn, schema) }) // only if a run failed half way
		var first map[string]modeResult
		for run := 1; run <= 2; run++ {
			ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
			cmd := exec.CommandContext(ctx, bin, "--json", "--workers", "3", "--transfers", "3", "--accounts", "4",
				"--ttl", "1500ms", "--schema", schema, "--database-url", dsn, "--redis-addr", testenv.RedisAddr())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			cancel()
			if err != nil {
				t.Fatalf("run %d: %v\nstdout:\n%s\nstderr:\n%s", run, err, stdout.String(), stderr.String())
			}
			results := map[string]modeResult{}
			sc := bufio.NewScanner(&stdout)
			for sc.Scan() {
				var r modeResult
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatalf("run %d: stdout line %q is not a JSON object: %v", run, sc.Text(), err)
				}
				results[r.Mode] = r
			}
			redisOnly, ok1 := results["redis-only"]
			fenced, ok2 := results["fenced"]
			if !ok1 || !ok2 || len(results) != 2 {
				t.Fatalf("run %d: want one object per mode (redis-only, fenced), got %v\nstderr:\n%s", run, results, stderr.String())
			}
			// The outcome does not depend on timing: exactly the conflicting
			// transfer is lost, and its money with it. That holds while no
			// other worker stalls past its lease: with a TTL of 500 ms one
			// did on a loaded CI machine, and a second transfer was lost.
			// 1.5 s (the pause is twice that) leaves room for such a stall.
			if redisOnly.LostUpdates != 1 || redisOnly.StaleWritesApplied != 1 || redisOnly.PausedWrite != "applied" || redisOnly.InvariantOK ||
				redisOnly.MoneyConserved || redisOnly.BalancesMatchLog || redisOnly.TotalAfter >= redisOnly.TotalBefore {
				t.Errorf("run %d: redis-only: want the paused write applied, one lost update, money lost and the invariant broken; got %+v", run, redisOnly)
			}
			if fenced.StaleWritesRejected < 1 || fenced.LostUpdates != 0 || !fenced.InvariantOK ||
				fenced.PausedWrite != "rejected" || fenced.StaleWritesApplied != 0 || !fenced.MoneyConserved || !fenced.BalancesMatchLog {
				t.Errorf("run %d: fenced: want the paused write rejected and the invariant kept; got %+v", run, fenced)
			}
			for _, r := range results {
				// 3×3 and the conflicting one; more if a slow worker was
				// rejected and tried again.
				if r.TransfersAttempted < 3*3+1 || r.TransfersApplied+r.StaleWritesRejected != r.TransfersAttempted {
					t.Errorf("run %d: %s: %d attempted, %d applied, %d rejected; want at least 10 attempted, each applied or rejected",
						run, r.Mode, r.TransfersAttempted, r.TransfersApplied, r.StaleWritesRejected)
				}
				// By construction: resumed only after the lease was seen gone
				// and the -pause timer (2×TTL) fired.
				if r.LeaseGoneMS <= 0 || r.PauseMS < r.LeaseGoneMS || r.PauseMS < 1000 {
					t.Errorf("run %d: %s: lease seen gone after %dms, frozen %dms; want gone while frozen, frozen ≥ 2×TTL", run, r.Mode, r.LeaseGoneMS, r.PauseMS)
				}
			}
			// The same plan (the default seed) gives the same outcome.
			if first == nil {
				first = results
			} else if a, b := first["redis-only"], results["redis-only"]; a.TotalAfter != b.TotalAfter || a.LostUpdates != b.LostUpdates ||
				a.StaleWritesApplied != b.StaleWritesApplied || a.TransfersApplied != b.TransfersApplied {
				t.Errorf("run %d: redis-only: %+v, then %+v; want the same outcome", run, a, b)
			}
			if t.Failed() {
				t.Logf("stderr of run %d:\n%s", run, stderr.String())
			}
			if schemaExists(t, conn, schema) {
				t.Errorf("run %d: schema %s is still there after the run", run, schema)
			}
			if left := processesOf(t, bin); len(left) > 0 {
				t.Errorf("run %d: processes of %s still running: %v", run, bin, left)
			}
		}
	})

	// The exit status is 0 with the fenced mode alone (it keeps the
	// invariant) and with the Redis-only mode alone (whatever it did).
	for _, mode := range []string{"redis-only", "fenced"} {
		t.Run(mode+" alone", func(t *testing.T) {
			schema := "ledger_test_" + randomHex(t)
			t.Cleanup(func() { dropSchema(conn, schema) })
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--mode", mode, "--workers", "2", "--transfers", "1", "--ttl", "200ms",
				"--schema", schema, "--database-url", dsn, "--redis-addr", testenv.RedisAddr()).CombinedOutput()
			if err != nil {
				t.Fatalf("-mode %s: %v\n%s", mode, err, out)
			}
			if !strings.Contains(string(out), "transfers attempted") || strings.Count(string(out), "invariant") < 2 {
				t.Errorf("-mode %s: no verdict and table in the output:\n%s", mode, out)
			}
			if left := processesOf(t, bin); len(left) > 0 {
				t.Errorf("processes of %s still running: %v", bin, left)
			}
		})
	}
}

func schemaExists(t *testing.T, conn *pgx.Conn, schema string) bool {
	t.Helper()
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func dropSchema(conn *pgx.Conn, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}

// TestLedgerThroughTheService runs the fenced mode through a fenced server
// (package client, as docker-compose.yml's ledger does) instead of package
// lock in this process: the same code, through a lock.Locker.
func TestLedgerThroughTheService(t *testing.T) {
	t.Parallel()
	testenv.Redis(t)
	dsn := testenv.PostgresDSN()
	conn := pgConn(t, dsn)
	bin := build(t)
	url := startFencedDev(t, "--redis-addr", testenv.RedisAddr())
	schema := "ledger_test_" + randomHex(t)
	t.Cleanup(func() { dropSchema(conn, schema) })
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--json", "--mode", "fenced", "--fenced-url", url,
		"--schema", schema, "--database-url", dsn, "--redis-addr", testenv.RedisAddr())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var r modeResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if !r.InvariantOK || r.PausedWrite != "rejected" || r.StaleWritesRejected < 1 {
		t.Fatalf("fenced through the service: %+v\n%s", r, stderr.String())
	}
	// The story tells what was watched: the service, not a key in Redis.
	if log := stderr.String(); !strings.Contains(log, "lease is gone") || !strings.Contains(log, "fenced no longer shows its token holding the lock") {
		t.Fatalf("the story does not say the service showed the lease gone:\n%s", log)
	}
}

// startFencedDev builds fenced and runs fenced dev on a free port until the
// test ends; it returns its URL.
func startFencedDev(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fenced")
	buildArgs := []string{"build", "-o", bin}
	if raceEnabled {
		buildArgs = append(buildArgs, "-race")
	}
	if out, err := exec.CommandContext(t.Context(), "go", append(buildArgs, "../../cmd/fenced")...).CombinedOutput(); err != nil {
		t.Fatalf("go build fenced: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, append([]string{"dev", "--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	done := make(chan struct{})
	go func() { // ends at EOF, when fenced exits
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case first <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		_ = cmd.Wait()
	})
	select {
	case l := <-first:
		url, ok := strings.CutPrefix(l, "fenced listening on ")
		if !ok {
			t.Fatalf("fenced dev's first line %q", l)
		}
		return url
	case <-time.After(60 * time.Second):
		t.Fatal("fenced dev printed nothing in 60s")
	}
	return ""
}

// TestBadSettings: settings that cannot work fail at once with an error
// that says what is wrong and how to fix it, before any worker starts.
func TestBadSettings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-database-url", "postgres://%zz"}, []string{"cannot be parsed", "DATABASE_URL", "postgres://"}},
		{[]string{"-database-url", "postgres://postgres@127.0.0.1:1/test?sslmode=disable"}, []string{"cannot connect to Postgres at 127.0.0.1:1", "DATABASE_URL"}},
		{[]string{"-redis-addr", "127.0.0.1"}, []string{"Redis address", "host:port"}},
		{[]string{"-redis-addr", "127.0.0.1:1"}, []string{"cannot reach Redis at 127.0.0.1:1", "REDIS_ADDR"}},
		{[]string{"-workers", "1"}, []string{"--workers 1"}},
		{[]string{"--accounts", "3"}, []string{"--accounts 3: want 4"}},
		{[]string{"-schema", "public"}, []string{"-schema"}},
		{[]string{"-ttl", "1ms"}, []string{"-ttl"}},
		{[]string{"-mode", "redlock"}, []string{"-mode"}},
		{[]string{"--fenced-url", "127.0.0.1:7070"}, []string{"--fenced-url"}},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		var stdout, stderr bytes.Buffer
		args := append([]string{"-database-url", testenv.PostgresDSN(), "-redis-addr", testenv.RedisAddr()}, tc.args...)
		err := run(ctx, args, &stdout, &stderr)
		cancel()
		if err == nil {
			t.Errorf("%v: no error", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not mention %q", tc.args, err, w)
			}
		}
		if stdout.Len() > 0 {
			t.Errorf("%v: wrote to stdout: %q", tc.args, stdout.String())
		}
	}
}

// build compiles the program into a temporary directory, with -race when
// the test runs with it.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ledger")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.CommandContext(t.Context(), "go", append(args, ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func pgConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("Postgres at %s: %v: start it, or set FENCED_TEST_POSTGRES or DATABASE_URL", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func randomHex(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// processesOf lists the processes running bin (Linux; elsewhere none).
func processesOf(t *testing.T, bin string) []string {
	if runtime.GOOS != "linux" {
		return nil
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, d := range dirs {
		exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe"))
		if err != nil { // not ours to read, or gone
			continue
		}
		if exe == bin {
			pids = append(pids, d.Name())
		}
	}
	return pids
}
