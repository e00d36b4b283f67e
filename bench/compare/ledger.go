package compare

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
)

// The protected resource is the ledger of examples/ledger: accounts whose
// balances a transfer reads, computes in Go and writes back, and a log of
// transfers in commit order. Every scheme works the same ledger.

//go:embed schema.sql
var schemaSQL string

const (
	accounts       = 4
	openingBalance = 1000
	resource       = "ledger" // the fence's resource name, and the lock name's stem
)

// createLedger makes schema with the ledger, the fence table (the adapter's
// migrations) and the row lock, and opens the accounts.
func createLedger(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := dropLedger(ctx, pool, schema); err != nil {
		return err
	}
	id := pgx.Identifier{schema}.Sanitize()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO accounts (id, opening_balance, balance)
			SELECT g, $2, $2 FROM generate_series(1, $1::integer) AS g`, accounts, openingBalance)
		return err
	})
	if err != nil {
		return fmt.Errorf("create the ledger in schema %s: %w", schema, err)
	}
	f, err := postgres.NewFence(pool, postgres.WithSchema(schema))
	if err != nil {
		return err
	}
	return f.Migrate(ctx)
}

func dropLedger(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// account is one account as a transfer read it.
type account struct {
	id      int
	balance int64
	last    *string // last_transfer; nil for the opening balance
}

func readAccounts(ctx context.Context, q querier, from, to int) (f, t account, err error) {
	read := func(id int) (account, error) {
		a := account{id: id}
		err := q.QueryRow(ctx, "SELECT balance, last_transfer FROM accounts WHERE id = $1", id).Scan(&a.balance, &a.last)
		if errors.Is(err, pgx.ErrNoRows) {
			err = fmt.Errorf("no account %d", id)
		}
		return a, err
	}
	if f, err = read(from); err != nil {
		return
	}
	t, err = read(to)
	return
}

// transfer is one transfer as its writer computed it.
type transfer struct {
	id       string
	worker   int
	holder   string
	from, to account
	amount   int64
	token    uint64
}

// writeTransfer writes the balances computed from what was read and logs
// the transfer, in tx. The last statement but one numbers the commit.
func writeTransfer(ctx context.Context, tx pgx.Tx, t transfer) error {
	writes := [2]struct {
		id      int
		balance int64
	}{{t.from.id, t.from.balance - t.amount}, {t.to.id, t.to.balance + t.amount}}
	if writes[1].id < writes[0].id { // id order: overlapping writers wait, never deadlock
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
	_, err := tx.Exec(ctx, `INSERT INTO transfers (id, commit_seq, worker, holder, from_account, to_account, amount, from_prev, to_prev, token)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		t.id, seq, t.worker, t.holder, t.from.id, t.to.id, t.amount, t.from.last, t.to.last, token)
	return err
}

// audit is the ledger checked: the invariant of examples/ledger.
type audit struct {
	Applied       int   `json:"applied"`
	LostUpdates   int   `json:"lost_updates"`
	OpeningTotal  int64 `json:"opening_total"`
	Total         int64 `json:"total"`
	Conserved     bool  `json:"money_conserved"`
	ReplayMatches bool  `json:"balances_match_log"`
	// commits maps an applied transfer to its commit_seq.
	commits map[string]int64
	// lost names the transfers that lost an update.
	lost map[string]bool
}

// checkLedger replays the log in commit order. A transfer whose writer read
// an account whose last committed transfer had changed by the time it
// committed overwrote that transfer's effect: a lost update.
func checkLedger(ctx context.Context, pool *pgxpool.Pool, schema string) (audit, error) {
	a := audit{commits: map[string]int64{}, lost: map[string]bool{}}
	type acct struct {
		opening, balance, replay int64
		replayLast               *string
	}
	accts := map[int]*acct{}
	var ids []int
	s := pgx.Identifier{schema}.Sanitize()
	rows, err := pool.Query(ctx, "SELECT id, opening_balance, balance FROM "+s+".accounts ORDER BY id")
	if err != nil {
		return a, fmt.Errorf("read accounts: %w", err)
	}
	var id int
	var x acct
	if _, err = pgx.ForEachRow(rows, []any{&id, &x.opening, &x.balance}, func() error {
		c := x
		c.replay = c.opening
		accts[id] = &c
		ids = append(ids, id)
		a.OpeningTotal += c.opening
		a.Total += c.balance
		return nil
	}); err != nil {
		return a, fmt.Errorf("read accounts: %w", err)
	}
	rows, err = pool.Query(ctx, "SELECT id, commit_seq, from_account, to_account, amount, from_prev, to_prev FROM "+s+".transfers ORDER BY commit_seq")
	if err != nil {
		return a, fmt.Errorf("read transfers: %w", err)
	}
	var (
		tid              string
		seq              int64
		from, to         int
		amount           int64
		fromPrev, toPrev *string
	)
	same := func(p, q *string) bool { return (p == nil && q == nil) || (p != nil && q != nil && *p == *q) }
	if _, err = pgx.ForEachRow(rows, []any{&tid, &seq, &from, &to, &amount, &fromPrev, &toPrev}, func() error {
		f, t := accts[from], accts[to]
		if f == nil || t == nil {
			return fmt.Errorf("transfer %s names an unknown account", tid)
		}
		a.Applied++
		a.commits[tid] = seq
		if !same(fromPrev, f.replayLast) || !same(toPrev, t.replayLast) {
			a.LostUpdates++
			a.lost[tid] = true
		}
		id := tid
		f.replay -= amount
		t.replay += amount
		f.replayLast, t.replayLast = &id, &id
		return nil
	}); err != nil {
		return a, fmt.Errorf("read transfers: %w", err)
	}
	a.Conserved = a.Total == a.OpeningTotal
	a.ReplayMatches = true
	for _, id := range ids {
		if c := accts[id]; c.balance != c.replay {
			a.ReplayMatches = false
		}
	}
	return a, nil
}

// ok is the ledger invariant.
func (a audit) ok() bool { return a.Conserved && a.ReplayMatches && a.LostUpdates == 0 }
