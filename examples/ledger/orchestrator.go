package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// openingBalance is every account's balance at the start.
const openingBalance = 1000

// session is one run of the orchestrator: its connections, the embedded
// etcd, and the plan that every mode runs.
type session struct {
	cfg    config
	log    io.Writer // the story of each mode: stdout, or stderr with --json
	stderr io.Writer
	exe    string // this binary, re-executed as the workers
	runID  string // makes lock names unique to this run
	plan   plan

	conn  *pgx.Conn
	rdb   *redis.Client
	etcd  *sequencer.Embedded
	store *lock.RedisStore // to watch fenced's lease: in this Redis
	svc   *client.Client   // or through the fenced service (--fenced-url)
}

// plan is the work of a mode, the same for every mode: each worker's
// transfers in order, the one the first worker pauses in, and the
// conflicting transfer another worker makes during the pause.
//
// The outcome does not depend on timing: the paused transfer is between
// accounts 1 and 2, which no other worker's planned transfer touches, so
// that while worker 1 is frozen only the conflicting transfer changes them.
// It moves money from another account into the account worker 1 takes
// from; worker 1's late write, computed before the pause, overwrites it.
// Under a Redis-only lock that loses exactly the conflicting transfer's
// amount, and the balances no longer match the log; under fenced the late
// write is rejected. The seed picks amounts and accounts, not the outcome.
type plan struct {
	queues   [][]command
	pauseID  string
	pauseCmd command
	conflict command // the transfer worker 2 makes while worker 1 is frozen
}

func makePlan(seed uint64, workers, transfers, accounts int) plan {
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// pair is two different accounts from lo to accounts.
	pair := func(lo int) (int, int) {
		from := lo + rng.IntN(accounts-lo+1)
		to := lo + rng.IntN(accounts-lo)
		if to >= from {
			to++
		}
		return from, to
	}
	p := plan{queues: make([][]command, workers)}
	// Worker 1 pauses in the middle of its work, so that others are
	// contending for the lock before and after.
	at := (transfers - 1) / 2
	for w := range workers {
		for k := 1; k <= transfers; k++ {
			c := command{Op: opTransfer, Transfer: fmt.Sprintf("w%d-t%d", w+1, k), Amount: 1 + rng.Int64N(100)}
			switch {
			case w == 0 && k-1 == at:
				c.From, c.To, c.Pause = 1, 2, true
				if rng.IntN(2) == 1 {
					c.From, c.To = 2, 1
				}
			case w == 0: // before or after the pause: any accounts
				c.From, c.To = pair(1)
			default: // never accounts 1 and 2
				c.From, c.To = pair(3)
			}
			p.queues[w] = append(p.queues[w], c)
		}
	}
	p.pauseCmd = p.queues[0][at]
	p.pauseID = p.pauseCmd.Transfer
	p.conflict = command{Op: opTransfer, Transfer: "w2-conflict", From: 3 + rng.IntN(accounts-2), To: p.pauseCmd.From,
		Amount: 1 + rng.Int64N(100)}
	return p
}

// orchestrate runs every mode of cfg and reports. Its error is nil when
// fenced kept the invariant (or was not run), whatever the Redis-only lock
// did.
func orchestrate(ctx context.Context, cfg config, stdout, stderr io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	s := &session{cfg: cfg, log: stdout, stderr: stderr}
	if cfg.json {
		s.log = stderr
	}
	if s.exe, err = os.Executable(); err != nil {
		return fmt.Errorf("find this program to start its workers: %w", err)
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	s.runID = hex.EncodeToString(b[:])
	seed := cfg.seed
	if seed == 0 {
		seed = 1 + mrand.Uint64N(1<<32)
	}
	s.plan = makePlan(seed, cfg.workers, cfg.transfers, cfg.accounts)

	if s.conn, err = connectPostgres(ctx, cfg.databaseURL, cfg.schema); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		s.conn.Close(cctx)
	}()
	if s.rdb, err = connectRedis(ctx, cfg.redisAddr); err != nil {
		return err
	}
	defer s.rdb.Close()
	if slices.Contains(cfg.modes, modeFenced) && cfg.fencedURL != "" {
		if s.svc, err = client.New(cfg.fencedURL); err != nil {
			return err
		}
		defer s.svc.Close(context.WithoutCancel(ctx))
	} else if slices.Contains(cfg.modes, modeFenced) {
		if s.etcd, err = startEtcd(ctx); err != nil {
			return err
		}
		defer s.etcd.Close()
		cli, err := s.etcd.Client()
		if err != nil {
			return fmt.Errorf("etcd client: %w", err)
		}
		defer cli.Close()
		seq, err := sequencer.NewEtcd(cli)
		if err != nil {
			return err
		}
		defer seq.Close()
		if s.store, err = lock.NewRedisStore(s.rdb, seq); err != nil {
			return err
		}
		defer s.store.Close()
	}

	fmt.Fprintf(s.log, "ledger: %d accounts of %d, %d worker processes × %d transfers, lease TTL %s, pause ≥ %s, seed %d\n",
		cfg.accounts, openingBalance, cfg.workers, cfg.transfers, cfg.ttl, cfg.pause, seed)
	var results []modeResult
	for _, m := range cfg.modes {
		r, err := s.runMode(ctx, m)
		if err != nil {
			return fmt.Errorf("%s mode: %w", m, err)
		}
		results = append(results, r)
	}
	if cfg.json {
		err = writeJSON(stdout, results)
	} else {
		err = writeTable(stdout, results)
	}
	if err != nil {
		return err
	}
	for _, r := range results {
		if r.Mode == modeFenced && !r.InvariantOK {
			return errors.New("fenced mode broke the ledger invariant: " + r.Verdict)
		}
	}
	return nil
}

// startEtcd starts a single-member embedded etcd in a temporary directory,
// for the tokens. fsync is off: the data dir is thrown away with the run.
func startEtcd(ctx context.Context) (*sequencer.Embedded, error) {
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{UnsafeNoFsync: true})
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	return e, nil
}

// runMode creates the ledger, runs the plan with workers of mode, checks the
// ledger and drops it.
func (s *session) runMode(ctx context.Context, mode string) (modeResult, error) {
	r := modeResult{Mode: mode, Workers: s.cfg.workers, PausedTransfer: s.plan.pauseID}
	if err := createLedger(ctx, s.conn, s.cfg.schema, s.cfg.accounts, openingBalance); err != nil {
		return r, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := dropLedger(dctx, s.conn, s.cfg.schema); err != nil {
			fmt.Fprintf(s.stderr, "ledger: %v (the next run drops it)\n", err)
		}
	}()
	wc := workerConfig{mode: mode, schema: s.cfg.schema, lockName: fmt.Sprintf("ledger-%s-%s", s.runID, mode), ttl: s.cfg.ttl}
	if mode == modeFenced {
		f, err := postgres.NewFence(s.conn, postgres.WithSchema(s.cfg.schema))
		if err != nil {
			return r, err
		}
		if err := f.Migrate(ctx); err != nil {
			return r, err
		}
		if s.svc == nil {
			wc.etcd = s.etcd.ClientURL()
		}
	}

	env := append(os.Environ(), "DATABASE_URL="+s.cfg.databaseURL, "FENCED_REDIS_ADDR="+s.cfg.redisAddr, "FENCED_URL="+s.cfg.fencedURL)
	f, err := startFleet(s.exe, s.cfg.workers, func(i int) []string {
		c := wc
		c.id = i
		return c.args()
	}, env, s.stderr)
	if err != nil {
		return r, err
	}
	defer f.stop()
	for i, p := range f.procs {
		p.queue = slices.Clone(s.plan.queues[i])
	}
	if err := s.drive(ctx, mode, wc.lockName, f, &r); err != nil {
		return r, err
	}

	a, err := checkLedger(ctx, s.conn)
	if err != nil {
		return r, err
	}
	if !a.lastMatches {
		return r, errors.New("audit: an account's last_transfer is not the last transfer on it in commit order; the commit order is wrong")
	}
	if a.applied != r.applied {
		return r, fmt.Errorf("audit: %d transfers in the log, but the workers reported %d applied", a.applied, r.applied)
	}
	r.TransfersApplied = a.applied
	r.LostUpdates = a.lostUpdates
	r.StaleWritesApplied = a.staleApplied
	r.WritesAfterDeadline = a.afterDeadline
	r.MoneyConserved = a.conserved
	r.BalancesMatchLog = a.replayMatches
	r.TotalBefore, r.TotalAfter = a.openingTotal, a.total
	r.InvariantOK = a.ok()
	r.Verdict = verdict(a)
	fmt.Fprintf(s.log, "%s: %s\n", mode, r.Verdict)
	return r, nil
}

// verdict says in a line what the audit found.
func verdict(a audit) string {
	if a.ok() {
		return fmt.Sprintf("invariant holds: %d transfers applied, money conserved (%d), every balance equals the replay of the log", a.applied, a.total)
	}
	var why []string
	if a.lostUpdates > 0 {
		why = append(why, fmt.Sprintf("%d lost update(s)", a.lostUpdates))
	}
	if a.staleApplied > 0 {
		why = append(why, fmt.Sprintf("%d stale write(s) applied (%s)", a.staleApplied, a.staleExample))
	}
	if !a.replayMatches {
		why = append(why, a.firstMismatch)
	}
	if !a.conserved {
		why = append(why, fmt.Sprintf("money not conserved: %d at the start, %d now", a.openingTotal, a.total))
	}
	return "invariant BROKEN: " + strings.Join(why, "; ")
}

// drive runs the plan and the pause, by messages and observed state:
//
//  1. Every worker works through its transfers; they contend for the lock.
//  2. Worker 1, in its paused transfer, reports that it has read the
//     balances under the lock and blocks; the orchestrator freezes it with
//     SIGSTOP right there, and queues the conflicting transfer, into one
//     of the two accounts worker 1 read, first for worker 2.
//  3. The orchestrator polls the lock's key until it no longer holds worker
//     1's lease (expired, or already taken), and waits for worker 2 to
//     commit the conflicting transfer, and for the pause time (--pause).
//  4. SIGCONT, and "go": worker 1 writes what it computed before the pause.
//  5. When every worker has done all its transfers, their stdin is closed
//     and they exit.
func (s *session) drive(ctx context.Context, mode, lockName string, f *fleet, r *modeResult) error {
	victim, rival := f.procs[0], f.procs[1]
	conflict := s.plan.conflict
	conflictID := conflict.Transfer
	var (
		read          *report // the victim's read, once reported
		frozenAt      time.Time
		leaseGone     bool
		conflictDone  bool
		pauseOver     bool
		resumed       bool
		pausedOutcome string
		pollC, pauseC <-chan time.Time
		poll          *time.Ticker
		pauseT        *time.Timer
	)
	defer func() {
		if poll != nil {
			poll.Stop()
		}
		if pauseT != nil {
			pauseT.Stop()
		}
	}()
	for _, p := range f.procs {
		if err := f.next(p); err != nil {
			return err
		}
	}
	for {
		if read != nil && !resumed && leaseGone && conflictDone && pauseOver {
			if err := thaw(victim.cmd.Process); err != nil {
				return fmt.Errorf("SIGCONT worker %d: %w", victim.n, err)
			}
			victim.frozen, resumed = false, true
			r.PauseMS = time.Since(frozenAt).Milliseconds()
			fmt.Fprintf(s.log, "%s: SIGCONT to worker %d after %s frozen; it writes the balances it computed before the pause\n",
				mode, victim.n, time.Since(frozenAt).Round(time.Millisecond))
			if err := f.write(victim, command{Op: opGo}); err != nil {
				return err
			}
		}
		if pausedOutcome != "" && allIdle(f) {
			f.closeInputs()
			return f.wait(ctx)
		}

		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("waiting for the workers: %w (see --timeout)", ctx.Err())
			}
			return fmt.Errorf("waiting for the workers: %w", ctx.Err())

		case <-pauseC:
			pauseOver, pauseC = true, nil

		case <-pollC:
			held, err := s.leaseHeldBy(ctx, mode, lockName, read.Holder, read.Token)
			if err != nil {
				return fmt.Errorf("watch worker %d's lease: %w", victim.n, err)
			}
			if !held {
				leaseGone, pollC = true, nil
				poll.Stop()
				r.LeaseGoneMS = time.Since(frozenAt).Milliseconds()
				fmt.Fprintf(s.log, "%s: worker %d's lease is gone %s after SIGSTOP: %s\n",
					mode, victim.n, time.Since(frozenAt).Round(time.Millisecond), s.leaseGoneBy(mode))
			}

		case e := <-f.events:
			p := f.procs[e.n-1]
			if e.exited {
				p.exited = true
				if e.err == nil {
					e.err = errors.New("exit status 0")
				}
				return fmt.Errorf("worker %d exited before its work was done: %w", e.n, e.err)
			}
			switch e.rep.Type {
			case reportRead:
				if p != victim || read != nil || e.rep.Transfer != s.plan.pauseID {
					return fmt.Errorf("worker %d reported an unexpected read of %s", e.n, e.rep.Transfer)
				}
				if err := freeze(victim.cmd.Process); err != nil {
					return fmt.Errorf("SIGSTOP worker %d: %w", victim.n, err)
				}
				victim.frozen, frozenAt = true, time.Now()
				rep := e.rep
				read = &rep
				fmt.Fprintf(s.log, "%s: worker %d holds the lock%s and has read accounts %d (%d) and %d (%d) for %s: SIGSTOP\n",
					mode, victim.n, tokenNote(rep.Token), rep.From, rep.FromBalance, rep.To, rep.ToBalance, rep.Transfer)
				rival.queue = append([]command{conflict}, rival.queue...)
				if err := f.next(rival); err != nil {
					return err
				}
				poll = time.NewTicker(5 * time.Millisecond) // observing Redis, not synchronising
				pollC = poll.C
				pauseT = time.NewTimer(s.cfg.pause)
				pauseC = pauseT.C

			case reportResult:
				if !p.busy {
					return fmt.Errorf("worker %d reported a result it was not asked for", e.n)
				}
				p.busy = false
				r.TransfersAttempted++
				switch e.rep.Outcome {
				case outcomeApplied:
					r.applied++
				case outcomeStale:
					r.StaleWritesRejected++
				default:
					return fmt.Errorf("worker %d: transfer %s has outcome %q", e.n, e.rep.Transfer, e.rep.Outcome)
				}
				if e.rep.LeaseLost {
					r.ReleasesFoundLeaseLost++
				}
				switch e.rep.Transfer {
				case conflictID:
					if e.rep.Outcome != outcomeApplied {
						// Worker 2 was itself slower than its lease, and
						// another worker wrote with a later token: again.
						fmt.Fprintf(s.log, "%s: worker %d's %s was rejected (%s); it tries again\n", mode, e.n, conflictID, e.rep.Reason)
						p.queue = append([]command{conflict}, p.queue...)
						break
					}
					conflictDone = true
					fmt.Fprintf(s.log, "%s: worker %d took the lock%s and committed %s, moving %d from account %d into account %d, which worker %d read\n",
						mode, e.n, tokenNote(e.rep.Token), e.rep.Transfer, conflict.Amount, e.rep.From, e.rep.To, victim.n)
				case s.plan.pauseID:
					if read == nil {
						// Rejected at its read: worker 1 was slower than its
						// lease before the pause. Again, to pause this time.
						fmt.Fprintf(s.log, "%s: worker %d's %s was rejected before the pause (%s); it tries again\n", mode, e.n, e.rep.Transfer, e.rep.Reason)
						p.queue = append([]command{s.plan.pauseCmd}, p.queue...)
						break
					}
					pausedOutcome = e.rep.Outcome
					if pausedOutcome == outcomeApplied {
						r.PausedWrite = "applied"
						fmt.Fprintf(s.log, "%s: worker %d's late write of %s was APPLIED over worker %d's transfer\n", mode, e.n, e.rep.Transfer, rival.n)
					} else {
						r.PausedWrite = "rejected"
						fmt.Fprintf(s.log, "%s: worker %d's late write of %s was REJECTED by the ledger: %s\n", mode, e.n, e.rep.Transfer, e.rep.Reason)
					}
					if e.rep.LeaseLost {
						fmt.Fprintf(s.log, "%s: worker %d's release found its lease gone\n", mode, e.n)
					}
				}
				if err := f.next(p); err != nil {
					return err
				}
			default:
				return fmt.Errorf("worker %d sent a report of type %q", e.n, e.rep.Type)
			}
		}
	}
}

func tokenNote(t uint64) string {
	if t == 0 {
		return ""
	}
	return fmt.Sprintf(" (token %d)", t)
}

func allIdle(f *fleet) bool {
	for _, p := range f.procs {
		if p.busy || len(p.queue) > 0 {
			return false
		}
	}
	return true
}

// leaseHeldBy reports whether the lock's key in Redis still holds holder.
// leaseGoneBy says how leaseHeldBy saw the lease go: with --fenced-url the
// service answers, whatever store holds its leases.
func (s *session) leaseGoneBy(mode string) string {
	if mode != modeRedisOnly && s.svc != nil {
		return "fenced no longer shows its token holding the lock"
	}
	return "the lock's key in Redis no longer holds its lease"
}

func (s *session) leaseHeldBy(ctx context.Context, mode, lockName, holder string, token uint64) (bool, error) {
	if mode == modeRedisOnly {
		v, err := (&redisLock{rdb: s.rdb, key: redisOnlyKey(lockName)}).holder(ctx)
		return v == holder, err
	}
	if s.svc != nil {
		// The service never tells a lease id; a token is one lease's.
		st, err := s.svc.Inspect(ctx, lockName)
		return st.Held && st.Token == fence.Token(token), err
	}
	st, err := s.store.Inspect(ctx, lockName)
	return st.Held && st.LeaseID == holder, err
}
