package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// workerConfig is what the orchestrator tells a worker on its command line.
// The connection settings come in the environment (DATABASE_URL,
// FENCED_REDIS_ADDR), so that a password does not show in ps.
type workerConfig struct {
	mode        string
	id          int
	schema      string
	lockName    string
	ttl         time.Duration
	etcd        string // fenced: the etcd client URL, when it takes leases with package lock
	databaseURL string
	redisAddr   string
	fencedURL   string // fenced: the fenced service, when it takes leases through it
}

func (c workerConfig) args() []string {
	a := []string{workerCommand, "--mode", c.mode, "--id", fmt.Sprint(c.id), "--schema", c.schema,
		"--lock", c.lockName, "--ttl", c.ttl.String()}
	if c.etcd != "" {
		a = append(a, "--etcd", c.etcd)
	}
	return a
}

// redisOnlyKey is the Redis-only lock's key for a lock name.
func redisOnlyKey(name string) string { return "ledger:{" + name + "}:lock" }

// runWorker is the worker role: it connects, then runs the commands of its
// stdin one at a time until stdin closes.
func runWorker(ctx context.Context, args []string, stdout io.Writer) error {
	var c workerConfig
	fs := flag.NewFlagSet("ledger worker", flag.ContinueOnError)
	fs.StringVar(&c.mode, "mode", "", modeRedisOnly+" or "+modeFenced)
	fs.IntVar(&c.id, "id", 0, "worker number")
	fs.StringVar(&c.schema, "schema", "", "the ledger's schema")
	fs.StringVar(&c.lockName, "lock", "", "lock name")
	fs.DurationVar(&c.ttl, "ttl", 0, "lease TTL")
	fs.StringVar(&c.etcd, "etcd", "", "etcd client URL (fenced)")
	fs.StringVar(&c.databaseURL, "database-url", envOr(defaultDatabaseURL, "DATABASE_URL"), "Postgres URL")
	fs.StringVar(&c.redisAddr, "redis-addr", envOr(defaultRedisAddr, "FENCED_REDIS_ADDR", "REDIS_ADDR"), "Redis address")
	fs.StringVar(&c.fencedURL, "fenced-url", os.Getenv("FENCED_URL"), "fenced service URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.mode != modeRedisOnly && c.mode != modeFenced || c.id <= 0 || c.schema == "" || c.lockName == "" || c.ttl <= 0 ||
		c.mode == modeFenced && c.etcd == "" && c.fencedURL == "" {
		return errors.New("worker: --mode, --id, --schema, --lock, --ttl (and --etcd or FENCED_URL for fenced) are required; the worker role is started by the orchestrator")
	}
	w, err := newWorker(ctx, c)
	if err != nil {
		return err // the orchestrator prefixes a worker's stderr with its number
	}
	defer w.close()

	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(stdout)
	waitGo := func() error {
		if !in.Scan() {
			return fmt.Errorf("stdin closed while paused: %w", errors.Join(in.Err(), io.ErrUnexpectedEOF))
		}
		var cmd command
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil || cmd.Op != opGo {
			return fmt.Errorf("paused: want the command %q, got %q", opGo, in.Text())
		}
		return nil
	}
	for in.Scan() {
		var cmd command
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil || cmd.Op != opTransfer {
			return fmt.Errorf("want a %q command, got %q", opTransfer, in.Text())
		}
		rep, err := w.transfer(ctx, cmd, func(r report) error {
			if err := out.Encode(r); err != nil {
				return err
			}
			return waitGo()
		})
		if err != nil {
			return fmt.Errorf("transfer %s: %w", cmd.Transfer, err)
		}
		if err := out.Encode(rep); err != nil {
			return err
		}
	}
	return in.Err()
}

// worker holds a worker's connections.
type worker struct {
	c    workerConfig
	conn *pgx.Conn
	rdb  *redis.Client

	redisOnly *redisLock // Redis-only mode

	etcd   *clientv3.Client // fenced mode with package lock
	seq    *sequencer.Etcd
	store  *lock.RedisStore
	client locker // a *lock.Client, or a *client.Client of the fenced service
	fence  *postgres.Fence
}

// locker is what the fenced mode takes leases from: the same code whether
// the lease comes from package lock in this process or from a fenced
// server (package client).
type locker interface {
	lock.Locker
	Close(context.Context) error
}

func newWorker(ctx context.Context, c workerConfig) (_ *worker, err error) {
	w := &worker{c: c}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if w.conn, err = connectPostgres(ctx, c.databaseURL, c.schema); err != nil {
		return nil, err
	}
	if w.rdb, err = connectRedis(ctx, c.redisAddr); err != nil {
		return nil, err
	}
	if c.mode == modeRedisOnly {
		w.redisOnly = &redisLock{rdb: w.rdb, key: redisOnlyKey(c.lockName)}
		return w, nil
	}
	// The fence table is in the ledger's schema; the orchestrator migrated it.
	if w.fence, err = postgres.NewFence(w.conn, postgres.WithSchema(c.schema)); err != nil {
		return nil, err
	}
	if c.fencedURL != "" {
		svc, err := client.New(c.fencedURL)
		if err != nil {
			return nil, err
		}
		w.client = svc
		return w, nil
	}
	w.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{c.etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", c.etcd, err)
	}
	if w.seq, err = sequencer.NewEtcd(w.etcd); err != nil {
		return nil, err
	}
	if w.store, err = lock.NewRedisStore(w.rdb, w.seq); err != nil {
		return nil, err
	}
	locks, err := lock.New(w.store)
	if err != nil {
		return nil, err
	}
	w.client = locks
	return w, nil
}

func (w *worker) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if w.client != nil {
		_ = w.client.Close(ctx) // releases a lease still held, after an error
	}
	if w.store != nil {
		_ = w.store.Close()
	}
	if w.seq != nil {
		_ = w.seq.Close()
	}
	if w.etcd != nil {
		_ = w.etcd.Close()
	}
	if w.rdb != nil {
		_ = w.rdb.Close()
	}
	if w.conn != nil {
		_ = w.conn.Close(ctx)
	}
}

// transfer does one transfer: acquire the lock, read both balances, write
// the balances computed from them and log the transfer, release the lock.
// With cmd.Pause it calls paused between the read and the write, with the
// read reported; paused returns when the worker may go on.
//
// The worker does not look at its lease before it writes, on purpose: the
// point is what the database does with a late write. A check in the worker
// narrows the window but cannot close it, since the pause can come right
// after the check.
func (w *worker) transfer(ctx context.Context, cmd command, paused func(report) error) (report, error) {
	if w.c.mode == modeFenced {
		return w.transferFenced(ctx, cmd, paused)
	}
	return w.transferRedisOnly(ctx, cmd, paused)
}

// transferRedisOnly: the lock is all there is. Reads and the write are
// plain Postgres statements.
func (w *worker) transferRedisOnly(ctx context.Context, cmd command, paused func(report) error) (report, error) {
	hold, err := w.redisOnly.acquire(ctx, w.c.ttl)
	if err != nil {
		return report{}, err
	}
	rep, err := w.redisOnlyHeld(ctx, cmd, hold, paused)
	held, rerr := w.redisOnly.release(context.WithoutCancel(ctx), hold)
	if err != nil {
		return rep, err
	}
	if rerr != nil {
		return rep, rerr
	}
	rep.LeaseLost = !held
	return rep, nil
}

func (w *worker) redisOnlyHeld(ctx context.Context, cmd command, hold redisHold, paused func(report) error) (report, error) {
	from, to, err := readAccounts(ctx, w.conn, cmd.From, cmd.To)
	if err != nil {
		return report{}, fmt.Errorf("read balances: %w", err)
	}
	rep := report{Type: reportRead, Transfer: cmd.Transfer, From: from.id, To: to.id,
		FromBalance: from.balance, ToBalance: to.balance, Holder: hold.value}
	if cmd.Pause {
		if err := paused(rep); err != nil {
			return rep, err
		}
	}
	t := transfer{id: cmd.Transfer, worker: w.c.id, from: from, to: to, amount: cmd.Amount,
		acquiredAt: hold.acquired, leaseDeadline: hold.deadline}
	err = pgx.BeginFunc(ctx, w.conn, func(tx pgx.Tx) error { return writeTransfer(ctx, tx, t) })
	if err != nil {
		return rep, fmt.Errorf("write: %w", err)
	}
	rep.Type, rep.Outcome = reportResult, outcomeApplied
	return rep, nil
}

// transferFenced: a lease from fenced, whose token the ledger admits
// through adapters/postgres before it reads and before it writes.
//
// The read is fenced too. Were only the write fenced, a holder with a higher
// token could read, a paused holder with a lower token could then write (its
// token is still the highest the ledger has seen), and the new holder would
// overwrite that write with balances computed before it: a lost update that
// no token check at the write can see. Admitting the token before the read
// makes the new holder's read raise the ledger's highest token, so the late
// write is rejected.
func (w *worker) transferFenced(ctx context.Context, cmd command, paused func(report) error) (report, error) {
	lease, err := w.client.Acquire(ctx, w.c.lockName, w.c.ttl)
	if err != nil {
		return report{}, err
	}
	rep, err := w.fencedHeld(ctx, cmd, lease, time.Now(), paused)
	rerr := lease.Release(context.WithoutCancel(ctx))
	if err != nil {
		return rep, err
	}
	switch {
	case errors.Is(rerr, lock.ErrLost): // also ErrExpired
		rep.LeaseLost = true
	case rerr != nil:
		return rep, rerr
	}
	return rep, nil
}

func (w *worker) fencedHeld(ctx context.Context, cmd command, lease *lock.Lease, acquired time.Time, paused func(report) error) (report, error) {
	resource, tok := w.c.lockName, lease.Token()
	rep := report{Type: reportRead, Transfer: cmd.Transfer, Holder: lease.ID(), Token: uint64(tok)}
	var from, to account
	err := w.fence.InTx(ctx, resource, tok, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		from, to, err = readAccounts(ctx, tx, cmd.From, cmd.To)
		return err
	})
	if stale(err, &rep) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("read balances: %w", err)
	}
	rep.From, rep.To, rep.FromBalance, rep.ToBalance = from.id, to.id, from.balance, to.balance
	if cmd.Pause {
		if err := paused(rep); err != nil {
			return rep, err
		}
	}
	t := transfer{id: cmd.Transfer, worker: w.c.id, from: from, to: to, amount: cmd.Amount,
		token: tok, acquiredAt: acquired, leaseDeadline: lease.Deadline()}
	err = w.fence.InTx(ctx, resource, tok, func(ctx context.Context, tx pgx.Tx) error {
		return writeTransfer(ctx, tx, t)
	})
	if stale(err, &rep) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("write: %w", err)
	}
	rep.Type, rep.Outcome = reportResult, outcomeApplied
	return rep, nil
}

// stale fills rep in and reports true if err rejects a stale token.
func stale(err error, rep *report) bool {
	var se *fence.StaleError
	if !errors.As(err, &se) {
		return false
	}
	rep.Type, rep.Outcome = reportResult, outcomeStale
	rep.Highest, rep.Reason = uint64(se.Highest), se.Error()
	return true
}
