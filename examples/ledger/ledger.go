package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/fence"
)

//go:embed schema.sql
var schemaSQL string

// createLedger drops the schema if a previous run left it, creates it with
// the ledger, and opens the accounts with balance each.
func createLedger(ctx context.Context, conn *pgx.Conn, schema string, accounts int, balance int64) error {
	if err := dropLedger(ctx, conn, schema); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		// search_path names the schema (pgConfig), so the tables go there.
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO accounts (id, opening_balance, balance)
			SELECT g, $2, $2 FROM generate_series(1, $1::integer) AS g`, accounts, balance)
		return err
	})
	if err != nil {
		return fmt.Errorf("create the ledger in schema %q: %w", schema, err)
	}
	return nil
}

// dropLedger drops the ledger's schema and everything in it.
func dropLedger(ctx context.Context, conn *pgx.Conn, schema string) error {
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %q: %w", schema, err)
	}
	return nil
}

// querier is what reads need: a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// account is one account as a transfer read it.
type account struct {
	id      int
	balance int64
	last    *string // last_transfer; nil for the opening balance
}

// readAccounts reads the two accounts of a transfer.
func readAccounts(ctx context.Context, q querier, from, to int) (account, account, error) {
	read := func(id int) (account, error) {
		a := account{id: id}
		err := q.QueryRow(ctx, "SELECT balance, last_transfer FROM accounts WHERE id = $1", id).Scan(&a.balance, &a.last)
		if errors.Is(err, pgx.ErrNoRows) {
			err = fmt.Errorf("no account %d", id)
		}
		return a, err
	}
	f, err := read(from)
	if err != nil {
		return f, account{}, err
	}
	t, err := read(to)
	return f, t, err
}

// transfer is one transfer as its writer computed it.
type transfer struct {
	id            string
	worker        int
	from, to      account // as read
	amount        int64
	token         fence.Token // 0 under the Redis-only lock
	acquiredAt    time.Time
	leaseDeadline time.Time
}

// writeTransfer writes the balances computed from what was read, and logs
// the transfer, in tx. Accounts are written in id order so that two
// overlapping writers (which the Redis-only lock lets happen) wait for each
// other rather than deadlock.
func writeTransfer(ctx context.Context, tx pgx.Tx, t transfer) error {
	writes := []struct {
		id      int
		balance int64
	}{{t.from.id, t.from.balance - t.amount}, {t.to.id, t.to.balance + t.amount}}
	if writes[1].id < writes[0].id {
		writes[0], writes[1] = writes[1], writes[0]
	}
	for _, w := range writes {
		if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = $2, last_transfer = $3 WHERE id = $1", w.id, w.balance, t.id); err != nil {
			return err
		}
	}
	var seq int64
	if err := tx.QueryRow(ctx, "UPDATE commit_order SET last = last + 1 RETURNING last").Scan(&seq); err != nil {
		return err
	}
	var token *int64
	if t.token != 0 {
		v := int64(t.token)
		token = &v
	}
	_, err := tx.Exec(ctx, `INSERT INTO transfers (id, commit_seq, worker, from_account, to_account, amount,
			from_prev, to_prev, token, acquired_at, lease_deadline, committed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, clock_timestamp())`,
		t.id, seq, t.worker, t.from.id, t.to.id, t.amount, t.from.last, t.to.last, token, t.acquiredAt, t.leaseDeadline)
	return err
}

// audit is what checkLedger finds.
type audit struct {
	applied         int   // transfers in the log
	lostUpdates     int   // applied transfers computed from balances that had changed before they committed
	staleApplied    int   // applied transfers committed after a transfer of a later holder
	afterDeadline   int   // applied transfers committed after their own lease deadline, by the clock
	openingTotal    int64 // sum of the opening balances
	total           int64 // sum of the balances now
	conserved       bool  // total == openingTotal
	replayMatches   bool  // every balance equals its opening balance replayed through the log
	lastMatches     bool  // every account's last_transfer is the last logged transfer on it
	firstMismatch   string
	staleExample    string
	deadlineExample string
}

// ok is the ledger invariant: money conserved, every balance equal to the
// replay of the transfers log, no lost update, and no write applied by a
// holder after a later holder had written.
func (a audit) ok() bool {
	return a.conserved && a.replayMatches && a.lostUpdates == 0 && a.staleApplied == 0
}

// checkLedger reads the ledger and checks it. It replays the log in commit
// order (commit_seq) and, for each transfer, compares it with what was
// committed before it:
//
//   - Lost update: the writer read account a with last_transfer P, but the
//     last transfer on a committed before this one was not P. The writer
//     computed from balances that had changed since it read them, and its
//     write replaced those changes: at least one committed transfer's effect
//     is lost.
//   - Stale write applied: a transfer committed after a transfer of a later
//     holder, that is, by a writer whose lease had ended and been granted to
//     another holder who had already written. Holders are ordered by their
//     token under fenced (tokens grow with every grant), and by acquired_at
//     under the Redis-only lock, which has no token (the workers' clock: one
//     host here). This is what a lock is for, and what fencing guarantees.
//   - Write after the lease deadline (reported, not part of the invariant):
//     committed_at (Postgres's clock just before COMMIT) is later than
//     lease_deadline (the start of the writer's acquisition plus the TTL less
//     the drift allowance, by the writer's clock; one host here). A late
//     writer that no other holder has followed yet does no harm, and the
//     fence admits it: its token is still the highest.
func checkLedger(ctx context.Context, conn *pgx.Conn) (audit, error) {
	var a audit
	type acct struct {
		opening, balance, replay int64
		last, replayLast         *string
	}
	accts := map[int]*acct{}
	var ids []int
	rows, err := conn.Query(ctx, "SELECT id, opening_balance, balance, last_transfer FROM accounts ORDER BY id")
	if err != nil {
		return a, fmt.Errorf("read accounts: %w", err)
	}
	var id int
	var x acct
	_, err = pgx.ForEachRow(rows, []any{&id, &x.opening, &x.balance, &x.last}, func() error {
		c := x
		c.replay = c.opening
		accts[id] = &c
		ids = append(ids, id)
		a.openingTotal += c.opening
		a.total += c.balance
		return nil
	})
	if err != nil {
		return a, fmt.Errorf("read accounts: %w", err)
	}

	rows, err = conn.Query(ctx, `SELECT id, from_account, to_account, amount, from_prev, to_prev,
		coalesce(token, 0), acquired_at, lease_deadline, committed_at FROM transfers ORDER BY commit_seq`)
	if err != nil {
		return a, fmt.Errorf("read transfers: %w", err)
	}
	var (
		tid                           string
		from, to                      int
		amount, token                 int64
		fromPrev, toPrev              *string
		acquired, deadline, committed time.Time
		latest                        int64  // the latest holder that has written: its token, or acquired_at in µs
		latestID                      string // and its transfer
	)
	same := func(p, q *string) bool { return (p == nil && q == nil) || (p != nil && q != nil && *p == *q) }
	_, err = pgx.ForEachRow(rows, []any{&tid, &from, &to, &amount, &fromPrev, &toPrev, &token, &acquired, &deadline, &committed}, func() error {
		f, t := accts[from], accts[to]
		if f == nil || t == nil {
			return fmt.Errorf("transfer %s names an unknown account", tid)
		}
		a.applied++
		if !same(fromPrev, f.replayLast) || !same(toPrev, t.replayLast) {
			a.lostUpdates++
		}
		holder := token
		if holder == 0 {
			holder = acquired.UnixMicro()
		}
		if holder < latest {
			a.staleApplied++
			if a.staleExample == "" {
				a.staleExample = fmt.Sprintf("%s committed after %s, whose holder took the lock later", tid, latestID)
			}
		} else {
			latest, latestID = holder, tid
		}
		if committed.After(deadline) {
			a.afterDeadline++
			if a.deadlineExample == "" {
				a.deadlineExample = fmt.Sprintf("%s committed %s after its lease deadline", tid, committed.Sub(deadline).Round(time.Millisecond))
			}
		}
		id := tid
		f.replay -= amount
		t.replay += amount
		f.replayLast, t.replayLast = &id, &id
		return nil
	})
	if err != nil {
		return a, fmt.Errorf("read transfers: %w", err)
	}
	a.conserved = a.total == a.openingTotal
	a.replayMatches, a.lastMatches = true, true
	for _, id := range ids {
		c := accts[id]
		if c.balance != c.replay {
			if a.replayMatches {
				a.firstMismatch = fmt.Sprintf("account %d has %d, the log replays to %d", id, c.balance, c.replay)
			}
			a.replayMatches = false
		}
		if !same(c.last, c.replayLast) {
			a.lastMatches = false
		}
	}
	return a, nil
}
