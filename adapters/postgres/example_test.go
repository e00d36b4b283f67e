package postgres_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced/fenced/adapters/postgres"
	"github.com/fenced/fenced/fence"
)

// The holder of a lock writes a read-modify-write of an invoice, guarded by
// the fence table. It needs a database, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	f, err := postgres.NewFence(pool) // fence_tokens in schema public
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := f.Migrate(ctx); err != nil { // idempotent: run it at every start
		fmt.Println(err)
		return
	}

	var token fence.Token = 1234 // from the lock's lease
	err = f.InTx(ctx, "invoice-42", token, func(ctx context.Context, tx pgx.Tx) error {
		// The admit has locked invoice-42's fence row: no other holder can
		// write the invoice between this read and the update.
		var total int64
		if err := tx.QueryRow(ctx, "SELECT total FROM invoices WHERE id = 42").Scan(&total); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE invoices SET total = $1 WHERE id = 42", total+100)
		return err
	})
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		fmt.Printf("lost the lock: token %d, highest admitted %d\n", stale.Token, stale.Highest)
	case postgres.IsRetryable(err):
		fmt.Println("rolled back (a conflict, a timeout, a lost session): run the transaction again")
	case err != nil:
		fmt.Println(err)
	}
}

// The column guard keeps the highest token on the guarded row itself.
func ExampleColumn_InTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	// accounts(id bigint PRIMARY KEY, balance bigint, fence_token bigint NOT NULL DEFAULT 0)
	accounts, err := postgres.NewColumn(pool, "accounts", "id")
	if err != nil {
		fmt.Println(err)
		return
	}
	err = accounts.InTx(ctx, 7, 1234, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - 10 WHERE id = 7")
		return err
	})
	switch {
	case fence.IsStale(err):
		fmt.Println("lost the lock:", err)
	case errors.Is(err, postgres.ErrNoRow):
		fmt.Println("no account 7")
	case err != nil:
		fmt.Println(err)
	}
}

// Writers in other languages call fence_admit as the first statement of
// their own transaction; MapError gives Go code the same error.
func ExampleMapError() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)

	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT fence_admit('invoice-42', 1234)"); err != nil {
			return err // SQLSTATE SF001 when stale
		}
		_, err := tx.Exec(ctx, "UPDATE invoices SET paid = true WHERE id = 42")
		return err
	})
	if err := postgres.MapError(err); fence.IsStale(err) {
		fmt.Println(err) // fence: stale token 1234 for "invoice-42": highest admitted is …
	}
}
