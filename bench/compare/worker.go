package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// workerConfig is what the orchestrator gives a worker, in the environment
// variable envWorker as JSON.
type workerConfig struct {
	ID         int           `json:"id"`
	Scheme     string        `json:"scheme"`
	Lock       string        `json:"lock"`
	Schema     string        `json:"schema"`
	DSN        string        `json:"dsn"`
	TTL        time.Duration `json:"ttl"`
	Redis      []string      `json:"redis,omitempty"` // this worker's proxies of the Redis nodes
	Etcd       []string      `json:"etcd,omitempty"`  // this worker's proxies of the etcd members
	EtcdPrefix string        `json:"etcd_prefix,omitempty"`
	// AcquireTimeout bounds one acquisition; the transfer fails after it.
	AcquireTimeout time.Duration `json:"acquire_timeout"`
}

// runWorker is the worker role: it connects, then runs the transfers its
// stdin sends, one at a time, reporting every operation on stdout.
func runWorker(ctx context.Context, c workerConfig, stdin io.Reader, stdout io.Writer) error {
	w, err := newWorker(ctx, c)
	if err != nil {
		return err
	}
	defer w.close()
	w.out = json.NewEncoder(stdout)

	transfers := make(chan command, 64)
	w.goCh = make(chan struct{}, 1)
	readErr := make(chan error, 1)
	go func() { // the reader: "go" wakes a holder at any time
		defer close(transfers)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			var cmd command
			if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
				readErr <- fmt.Errorf("bad command %q: %w", sc.Text(), err)
				return
			}
			switch cmd.Op {
			case opGo:
				w.goCh <- struct{}{}
			case opTransfer:
				transfers <- cmd
			default:
				readErr <- fmt.Errorf("unknown command %q", sc.Text())
				return
			}
		}
		readErr <- sc.Err()
	}()
	for cmd := range transfers {
		w.transfer(ctx, cmd)
	}
	return <-readErr
}

type worker struct {
	c      workerConfig
	s      scheme
	conn   *pgx.Conn
	rdbs   []*redis.Client
	etcd   *clientv3.Client
	locker locker
	fence  *postgres.Fence

	out   *json.Encoder
	outMu sync.Mutex
	goCh  chan struct{}
	ops   int
	acqs  int
}

func newWorker(ctx context.Context, c workerConfig) (_ *worker, err error) {
	s, ok := schemeByID(c.Scheme)
	if !ok {
		return nil, fmt.Errorf("unknown scheme %q", c.Scheme)
	}
	w := &worker{c: c, s: s}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	pc, err := pgx.ParseConfig(c.DSN)
	if err != nil {
		return nil, err
	}
	pc.RuntimeParams["search_path"] = c.Schema
	if w.conn, err = pgx.ConnectConfig(ctx, pc); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	for _, a := range c.Redis {
		w.rdbs = append(w.rdbs, redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true,
			DialTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}))
	}
	if len(c.Etcd) > 0 {
		w.etcd, err = clientv3.New(clientv3.Config{Endpoints: c.Etcd, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	if s.Write == writeFenced {
		if w.fence, err = postgres.NewFence(w.conn, postgres.WithSchema(c.Schema)); err != nil {
			return nil, err
		}
	}
	const poll = 5 * time.Millisecond // a peer's waiter polls: no release notification
	switch s.ID {
	case Naive:
		w.locker = &naiveLocker{rdb: w.rdbs[0], key: peerKey(c.Lock), ttl: c.TTL, poll: poll}
	case Redislock, RedisIncr:
		l := &redislockLocker{rdb: w.rdbs[0], c: redislock.New(w.rdbs[0]), key: peerKey(c.Lock), ttl: c.TTL, poll: poll}
		if s.ID == RedisIncr {
			l.incr = incrKey(c.Lock)
		}
		w.locker = l
	case Redsync:
		w.locker = &redsyncLocker{rs: newRedsync(w.rdbs), key: peerKey(c.Lock), ttl: c.TTL}
	case EtcdMutex, EtcdMutexRev:
		w.locker = &etcdMutexLocker{cli: w.etcd, prefix: etcdMutexPrefix(c.Lock), secs: int(c.TTL / time.Second), rev: s.ID == EtcdMutexRev}
	case PGRowLock:
		w.locker = nil // the transaction is the lock
	case FencedRedis, FencedEtcd, FencedRedlk:
		if w.locker, err = newFencedLocker(s.ID, c.Lock, c.TTL, w.rdbs, w.etcd, c.EtcdPrefix); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (w *worker) close() {
	if w.locker != nil {
		w.locker.close()
	}
	if w.etcd != nil {
		w.etcd.Close()
	}
	for _, r := range w.rdbs {
		r.Close()
	}
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w.conn.Close(ctx)
	}
}

// emit writes an event; a write error means the orchestrator is gone.
func (w *worker) emit(e event) {
	e.T = time.Now().UnixNano()
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if err := w.out.Encode(e); err != nil {
		fmt.Fprintln(os.Stderr, "cannot report:", err)
		os.Exit(3)
	}
}

// begin reports an operation's invocation and returns a function that
// reports its completion.
func (w *worker) begin(what, transfer, holder string, token uint64) func(outcome string, err error, highest uint64) {
	w.ops++
	op := w.ops
	w.emit(event{Op: op, What: what, Inv: true, Transfer: transfer, Holder: holder, Token: token})
	return func(outcome string, err error, highest uint64) {
		e := event{Op: op, What: what, Transfer: transfer, Holder: holder, Token: token, Outcome: outcome, Highest: highest}
		if err != nil {
			e.Err = err.Error()
		}
		w.emit(e)
	}
}

// waitGo blocks until the orchestrator says "go".
func (w *worker) waitGo(cmd command, holder string, token uint64) {
	w.emit(event{What: evHeld, Transfer: cmd.Transfer, Holder: holder, Token: token})
	<-w.goCh
}

// transfer runs one transfer and reports "done" with its outcome.
func (w *worker) transfer(ctx context.Context, cmd command) {
	outcome, err := w.transferOnce(ctx, cmd)
	e := event{What: evDone, Transfer: cmd.Transfer, Outcome: outcome}
	if err != nil {
		e.Err = err.Error()
	}
	w.emit(e)
}

func (w *worker) transferOnce(ctx context.Context, cmd command) (string, error) {
	w.acqs++
	holder := fmt.Sprintf("w%d#%d", w.c.ID, w.acqs)
	if w.s.Write == writeRowLock {
		return w.transferRowLock(ctx, cmd, holder)
	}
	actx, cancel := context.WithTimeout(ctx, w.c.AcquireTimeout)
	done := w.begin(evAcquire, cmd.Transfer, holder, 0)
	h, err := w.locker.acquire(actx)
	cancel()
	if err != nil {
		done(outFailed, err, 0)
		return outFailed, err
	}
	tok := h.token()
	w.emit(event{Op: w.ops, What: evAcquire, Transfer: cmd.Transfer, Holder: holder, Token: tok, Outcome: outOK})
	outcome, werr := w.held(ctx, cmd, holder, tok)
	rdone := w.begin(evRelease, cmd.Transfer, holder, tok)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	lost, err := h.release(rctx)
	rcancel()
	switch {
	case err != nil:
		rdone(outUnknown, err, 0)
	case lost:
		rdone(outLost, nil, 0)
	default:
		rdone(outOK, nil, 0)
	}
	return outcome, werr
}

// held is the critical section: read, (hold,) write.
func (w *worker) held(ctx context.Context, cmd command, holder string, tok uint64) (string, error) {
	var from, to account
	var err error
	if w.s.Write == writeFenced {
		done := w.begin(evRead, cmd.Transfer, holder, tok)
		err = w.fence.InTx(ctx, resource, fence.Token(tok), func(ctx context.Context, tx pgx.Tx) error {
			from, to, err = readAccounts(ctx, tx, cmd.From, cmd.To)
			return err
		})
		if out, hi := outcomeOf(err); out != outAdmitted {
			done(out, err, hi)
			return out, nil
		}
		done(outAdmitted, nil, 0)
	} else if from, to, err = readAccounts(ctx, w.conn, cmd.From, cmd.To); err != nil {
		return outUnknown, fmt.Errorf("read: %w", err)
	}
	if cmd.Hold {
		w.waitGo(cmd, holder, tok)
	}
	t := transfer{id: cmd.Transfer, worker: w.c.ID, holder: holder, from: from, to: to, amount: cmd.Amount, token: tok}
	done := w.begin(evWrite, cmd.Transfer, holder, tok)
	if w.s.Write == writeFenced {
		err = w.fence.InTx(ctx, resource, fence.Token(tok), func(ctx context.Context, tx pgx.Tx) error {
			return writeTransfer(ctx, tx, t)
		})
	} else {
		err = pgx.BeginFunc(ctx, w.conn, func(tx pgx.Tx) error { return writeTransfer(ctx, tx, t) })
	}
	out, hi := outcomeOf(err)
	done(out, err, hi)
	return out, nil
}

// transferRowLock: the lock is a row lock in the writer's own transaction;
// acquiring is SELECT ... FOR UPDATE, releasing is COMMIT.
func (w *worker) transferRowLock(ctx context.Context, cmd command, holder string) (string, error) {
	done := w.begin(evAcquire, cmd.Transfer, holder, 0)
	tx, err := w.conn.Begin(ctx)
	if err == nil {
		actx, cancel := context.WithTimeout(ctx, w.c.AcquireTimeout)
		_, err = tx.Exec(actx, "SELECT name FROM lock_rows WHERE name = $1 FOR UPDATE", resource)
		cancel()
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		done(outFailed, err, 0)
		return outFailed, err
	}
	done(outOK, nil, 0)
	from, to, err := readAccounts(ctx, tx, cmd.From, cmd.To)
	if err != nil {
		_ = tx.Rollback(ctx)
		return outUnknown, err
	}
	if cmd.Hold {
		w.waitGo(cmd, holder, 0)
	}
	t := transfer{id: cmd.Transfer, worker: w.c.ID, holder: holder, from: from, to: to, amount: cmd.Amount}
	wdone := w.begin(evWrite, cmd.Transfer, holder, 0)
	err = writeTransfer(ctx, tx, t)
	rdone := w.begin(evRelease, cmd.Transfer, holder, 0)
	if err == nil {
		err = tx.Commit(ctx)
	} else {
		_ = tx.Rollback(ctx)
	}
	out, _ := outcomeOf(err)
	wdone(out, err, 0)
	rdone(outOK, nil, 0)
	return out, nil
}

// outcomeOf classifies a fenced or plain transaction's error.
func outcomeOf(err error) (string, uint64) {
	var se *fence.StaleError
	switch {
	case err == nil:
		return outAdmitted, 0
	case errors.As(err, &se):
		return outRejected, uint64(se.Highest)
	default:
		return outUnknown, 0
	}
}

// envWorker and envEtcd carry a child process's role and configuration.
const (
	envWorker = "FENCED_COMPARE_WORKER"
	envEtcd   = "FENCED_COMPARE_ETCD"
)

// IsChild reports whether this process was started by Run as one of its
// workers or etcd members; the program's main (or a test's TestMain) then
// calls ChildMain instead of its own work.
func IsChild() bool { return os.Getenv(envWorker) != "" || os.Getenv(envEtcd) != "" }

// ChildMain runs the child role and returns its exit code.
func ChildMain() int {
	ctx := context.Background()
	var err error
	if v := os.Getenv(envEtcd); v != "" {
		var c etcdMemberConfig
		if err = json.Unmarshal([]byte(v), &c); err == nil {
			err = runEtcdMember(ctx, c, os.Stdin, os.Stdout)
		}
	} else {
		var c workerConfig
		if err = json.Unmarshal([]byte(os.Getenv(envWorker)), &c); err == nil {
			err = runWorker(ctx, c, os.Stdin, os.Stdout)
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}
