package postgres_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/internal/faultproxy"
)

// TestCommitWhoseAnswerIsLost: InTx's COMMIT reached the server, which
// committed, and the connection was cut before its answer came back. The
// error said "postgres: commit: conn closed", the same as for a commit
// that never happened (pgx calls that error safe to retry), and a caller that ran the write again on that
// error applied it twice (the fence admits the same token again, so it
// cannot tell). It now matches ErrCommitUnknown and says the write may
// have been applied; IsRetryable is false.
func TestCommitWhoseAnswerIsLost(t *testing.T) {
	pool := testPool(t)
	f, schema := newFence(t, pool)
	table := ident(schema, "acct")
	mustExec(t, pool, "CREATE TABLE "+table+" (id int PRIMARY KEY)")

	proxy, port := postgresProxy(t, pool)
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(port)
	cfg.MaxConns = 1
	viaProxy, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(viaProxy.Close)
	pf, err := postgres.NewFence(viaProxy, postgres.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}

	fired := proxy.LoseReply([]byte("commit"))
	err = pf.InTx(t.Context(), "acct-1", 5, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES (1)")
		return err
	})
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatalf("the proxy saw no COMMIT; InTx: %v", err)
	}
	if !errors.Is(err, postgres.ErrCommitUnknown) || postgres.IsRetryable(err) {
		t.Fatalf("InTx with its commit's answer lost: %v (retryable %v), want ErrCommitUnknown, not retryable", err, postgres.IsRetryable(err))
	}
	if !strings.Contains(err.Error(), "may have been applied") {
		t.Errorf("error %q does not say the write may have been applied", err)
	}
	// Why: the server did commit.
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after the commit whose answer was lost: %d, %v; want 1", n, err)
	}
	if h, err := f.Highest(t.Context(), "acct-1"); err != nil || h != 5 {
		t.Fatalf("highest token %d, %v; want 5", h, err)
	}
}

// postgresProxy is a faultproxy in front of pool's server, closed by
// t.Cleanup, and the port it listens on (127.0.0.1).
func postgresProxy(t *testing.T, pool *pgxpool.Pool) (*faultproxy.Proxy, int) {
	t.Helper()
	cc := pool.Config().ConnConfig
	proxy, err := faultproxy.New(net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	_, p, _ := net.SplitHostPort(proxy.Addr())
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return proxy, port
}
