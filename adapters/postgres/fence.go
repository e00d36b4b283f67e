package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/fence"
)

// admitAttempts bounds how often an admit is tried again when the row it
// found changes between its two statements (a row deleted or inserted by
// someone else). Tokens only grow, so this does not happen in normal use.
const admitAttempts = 3

// Fence guards writes with a fence table: one row per resource holding the
// highest token admitted for it. Create it with [NewFence] and the table
// with [Fence.Migrate]. A Fence is safe for concurrent use.
type Fence struct {
	db        Beginner
	schema    string
	table     string
	txOptions pgx.TxOptions

	admitSQL, highestSQL string
	migrate              migrateSQL
}

var _ fence.Store = (*Fence)(nil)

// NewFence returns a Fence that begins its transactions on db. Options:
// [WithSchema] (default "public"), [WithTable] (default "fence_tokens") and
// [WithTxOptions]. Invalid names and options are an error.
func NewFence(db Beginner, opts ...Option) (*Fence, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil Beginner", ErrInvalidOption)
	}
	c, err := fenceConfig(opts)
	if err != nil {
		return nil, err
	}
	f := &Fence{db: db, schema: c.schema, table: c.table, txOptions: c.txOptions}
	idents := fenceIdents(c.schema, c.table)
	if err := renderAll(idents, map[string]*string{
		"sql/fence_admit.sql":   &f.admitSQL,
		"sql/fence_highest.sql": &f.highestSQL,
	}); err != nil {
		return nil, err
	}
	if f.migrate, err = renderMigrate(idents); err != nil {
		return nil, err
	}
	return f, nil
}

// fenceConfig checks the options of a Fence.
func fenceConfig(opts []Option) (config, error) {
	c, err := newConfig(opts)
	if err != nil {
		return c, err
	}
	if c.fenceColumnSet {
		return c, fmt.Errorf("%w: WithFenceColumn applies to a Column, not a Fence", ErrInvalidOption)
	}
	if err := checkSchema(c.schema, true); err != nil {
		return c, err
	}
	if err := checkName("fence table", c.table, true); err != nil {
		return c, err
	}
	if c.table == versionTable {
		return c, fmt.Errorf("%w: fence table %q is the name of the table that records the migrations; choose another", ErrInvalidName, c.table)
	}
	return c, nil
}

// fenceIdents are the quoted identifiers the fence's SQL templates use.
func fenceIdents(schema, table string) map[string]string {
	return map[string]string{
		"schema":        pgx.Identifier{schema}.Sanitize(),
		"fence_table":   pgx.Identifier{schema, table}.Sanitize(),
		"version_table": pgx.Identifier{schema, versionTable}.Sanitize(),
	}
}

// Admit implements [fence.Store]: it admits t for resource in a short
// transaction of its own (a single statement when db can run one, as
// *pgxpool.Pool and *pgx.Conn can). It checks, and does not guard a write;
// to guard one, admit inside the write's transaction with [Fence.InTx] or
// [Fence.AdmitTx].
func (f *Fence) Admit(ctx context.Context, resource string, t fence.Token) error {
	if q, ok := f.db.(querier); ok {
		return f.admit(ctx, q, resource, t)
	}
	return f.InTx(ctx, resource, t, func(context.Context, pgx.Tx) error { return nil })
}

// querier runs a statement outside an explicit transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AdmitTx admits t for resource inside tx. Make it the first statement of
// the transaction: it inserts or advances the resource's fence row and
// keeps that row locked until tx ends, so that whatever tx reads and writes
// after it is serialised with every other transaction admitted for the same
// resource.
//
// A token lower than the highest admitted returns a [*fence.StaleError]
// (matching [fence.ErrStale]) with the highest token, and tx stays usable
// (roll it back). A zero token or one above math.MaxInt64 matches
// [fence.ErrInvalidToken]. Under REPEATABLE READ and SERIALIZABLE a
// concurrent admit can fail tx with an error for which [IsRetryable] is
// true.
func (f *Fence) AdmitTx(ctx context.Context, tx pgx.Tx, resource string, t fence.Token) error {
	return f.admit(ctx, tx, resource, t)
}

func (f *Fence) admit(ctx context.Context, q querier, resource string, t fence.Token) error {
	tok, err := pgToken(t)
	if err != nil {
		return err
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	for range admitAttempts {
		var got int64
		err := q.QueryRow(ctx, f.admitSQL, resource, tok).Scan(&got)
		if err == nil {
			return nil
		}
		if e := tooLongForIndex(err, resource); e != nil {
			return e
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return f.dbError(ctx, fmt.Errorf("postgres: admit token %d for %q: %w", t, resource, err))
		}
		// A higher token is there. In READ COMMITTED this statement sees the
		// latest committed token; in REPEATABLE READ and SERIALIZABLE the
		// snapshot the upsert used.
		var highest int64
		err = q.QueryRow(ctx, f.highestSQL, resource).Scan(&highest)
		switch {
		case err == nil && highest > tok:
			return &fence.StaleError{Resource: resource, Token: t, Highest: fence.Token(highest)}
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return f.dbError(ctx, fmt.Errorf("postgres: read highest token for %q: %w", resource, err))
		}
		// The row was deleted or lowered in between: admit again.
	}
	return fmt.Errorf("postgres: admit token %d for %q: the fence row changed under %d attempts", t, resource, admitAttempts)
}

// InTx runs fn in a transaction that first admits t for resource (see
// [Fence.AdmitTx]), and commits if fn returns nil. On any error, from the
// admit, fn or the commit, it rolls back and returns the error: a stale token
// as a [*fence.StaleError] (fn is not called), an error raised by the SQL
// function fence_admit inside fn mapped by [MapError], and a rollback that
// may succeed when run again (a serialization failure, a timeout, a
// session that ended before COMMIT was sent) wrapped so that [IsRetryable]
// reports it. A COMMIT sent that got no answer, or whose session ended
// while it ran (a FATAL error, or a pooler's class 08 error), matches
// [ErrCommitUnknown]: it may have been applied. fn must close the rows it
// opens before it returns: COMMIT cannot be sent on a connection still
// busy with them, and the transaction rolls back with an error that says
// so. InTx does not retry; retrying is the caller's choice because fn may
// have effects outside the database.
func (f *Fence) InTx(ctx context.Context, resource string, t fence.Token, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if _, err := pgToken(t); err != nil {
		return err
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	return inTx(ctx, f.db, f.txOptions, func(ctx context.Context, tx pgx.Tx) error {
		return f.AdmitTx(ctx, tx, resource, t)
	}, fn)
}

// Highest returns the highest token admitted for resource, or 0 when none
// has been.
func (f *Fence) Highest(ctx context.Context, resource string) (fence.Token, error) {
	if err := checkResource(resource); err != nil {
		return 0, err
	}
	var highest int64
	read := func(ctx context.Context, q querier) error {
		err := q.QueryRow(ctx, f.highestSQL, resource).Scan(&highest)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	}
	var err error
	if q, ok := f.db.(querier); ok {
		err = read(ctx, q)
	} else {
		err = inTx(ctx, f.db, f.txOptions, func(ctx context.Context, tx pgx.Tx) error { return read(ctx, tx) }, nil)
	}
	if err != nil {
		return 0, f.dbError(ctx, fmt.Errorf("postgres: read highest token for %q: %w", resource, err))
	}
	return fence.Token(highest), nil
}

// dbError is [dbError] for the Fence's own statements, which can meet no
// fence table only because Migrate has not run in the Fence's schema.
func (f *Fence) dbError(ctx context.Context, err error) error {
	if hasCode(err, sqlStateUndefinedTable) {
		err = fmt.Errorf("%w; the fence table %s is missing: run Migrate (at every start, or once with fenced admin pg-migrate, "+
			"or the script of fenced admin pg-sql, as the schema's owner), with the same WithSchema and WithTable",
			err, pgx.Identifier{f.schema, f.table}.Sanitize())
	}
	return dbError(ctx, err)
}

// inTx begins a transaction on db, runs admit and then fn (if not nil), and
// commits; on any error it rolls back.
func inTx(ctx context.Context, db Beginner, opts pgx.TxOptions, admit, fn func(context.Context, pgx.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return dbError(ctx, fmt.Errorf("postgres: begin: %w", err))
	}
	// After a commit this does nothing; after an error or a panic in fn it
	// rolls back. With ctx ended, or the connection busy, the rollback
	// fails and pgx closes the connection, which ends the transaction just
	// as well.
	defer func() { _ = tx.Rollback(ctx) }()
	if err := admit(ctx, tx); err != nil {
		return sessionLost(tx, err)
	}
	if fn != nil {
		if err := fn(ctx, tx); err != nil {
			return sessionLost(tx, dbError(ctx, MapError(err)))
		}
	}
	if err := commitBlocked(tx); err != nil {
		return dbError(ctx, err)
	}
	// The error of a session that ended before COMMIT is read only after
	// COMMIT is sent, and would pass for COMMIT's own.
	if err := sessionEnded(tx); err != nil {
		return &sessionLostError{dbError(ctx, fmt.Errorf("postgres: commit not sent: the session ended before it, so the transaction rolled back: %w", err))}
	}
	if err := tx.Commit(ctx); err != nil {
		switch {
		case commitUnknown(err):
			return dbError(ctx, fmt.Errorf("postgres: commit: %w: %w", ErrCommitUnknown, err))
		case commitNotSent(err):
			return dbError(ctx, fmt.Errorf("postgres: commit not sent, so the transaction rolled back: %w", err))
		}
		return dbError(ctx, fmt.Errorf("postgres: commit: %w", err))
	}
	return nil
}
