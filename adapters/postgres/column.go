package postgres

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/fence"
)

// Column guards writes to the rows of one table with a highest-seen-token
// column on the rows themselves: fence_token bigint NOT NULL DEFAULT 0 (see
// [Column.AddColumn]). The table's key is a single column. Create it with
// [NewColumn]. A Column is safe for concurrent use.
//
// The guard is on the row, so a row is created carrying its creator's
// token: a row inserted with the default, 0, admits any token, a stale one
// too, until a holder writes it, and a row deleted takes its token with it.
// Create rows under the lock with fence_token set to the token, best with
// the guarded insert, which [Column.Rejected] explains when it affects no
// row:
//
//	INSERT INTO t AS r (key, ..., fence_token) VALUES ($1, ..., $2)
//	ON CONFLICT (key) DO UPDATE SET ..., fence_token = EXCLUDED.fence_token
//	WHERE r.fence_token <= EXCLUDED.fence_token
//
// Rows created before any lock holder writes them (a migration, a seed) may
// keep 0. For resources that are deleted and created again, use a [Fence],
// whose token outlives what it guards (docs/design.md, defect 120).
//
// A stale error names the row as the resource "<table>/<key>", the key
// formatted with fmt's %v. A key that the key column's type cannot hold is
// an error from the server, except a string key (or a key of a string type)
// with a NUL byte or invalid UTF-8, or a []byte key that a text key column
// refuses for the same reason: these match [fence.ErrInvalidResource].
type Column struct {
	db                  Beginner
	schema, table       string
	keyColumn, fenceCol string
	txOptions           pgx.TxOptions

	admitSQL, highestSQL, addSQL, checkSQL string
}

// NewColumn returns a Column that guards the rows of table, found by
// keyColumn, and begins its transactions on db. Options: [WithSchema]
// (default "public"), [WithFenceColumn] (default "fence_token") and
// [WithTxOptions]. Names are quoted as identifiers, never pasted into SQL;
// invalid names and options are an error.
func NewColumn(db Beginner, table, keyColumn string, opts ...Option) (*Column, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil Beginner", ErrInvalidOption)
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if c.tableSet {
		return nil, fmt.Errorf("%w: WithTable applies to a Fence, not a Column; the guarded table is an argument of NewColumn", ErrInvalidOption)
	}
	// Not checkSchema: the table exists already, and may be a temporary
	// one, in pg_temp.
	if err := checkName("schema", c.schema, false); err != nil {
		return nil, err
	}
	for _, n := range []struct{ what, name string }{
		{"table", table}, {"key column", keyColumn}, {"fence column", c.fenceColumn},
	} {
		if err := checkName(n.what, n.name, false); err != nil {
			return nil, err
		}
	}
	if keyColumn == c.fenceColumn {
		return nil, fmt.Errorf("%w: key column and fence column are both %q", ErrInvalidName, keyColumn)
	}
	col := &Column{db: db, schema: c.schema, table: table, keyColumn: keyColumn, fenceCol: c.fenceColumn, txOptions: c.txOptions}
	idents := map[string]string{
		"table":        pgx.Identifier{c.schema, table}.Sanitize(),
		"key_column":   pgx.Identifier{keyColumn}.Sanitize(),
		"fence_column": pgx.Identifier{c.fenceColumn}.Sanitize(),
	}
	if err := renderAll(idents, map[string]*string{
		"sql/column_admit.sql":   &col.admitSQL,
		"sql/column_highest.sql": &col.highestSQL,
		"sql/column_add.sql":     &col.addSQL,
		"sql/column_check.sql":   &col.checkSQL,
	}); err != nil {
		return nil, err
	}
	return col, nil
}

// AddColumn adds the fence column, bigint NOT NULL DEFAULT 0, to the table
// if it is not there yet. It takes an ACCESS EXCLUSIVE lock on the table for
// a moment; run it with your schema migrations. A column of that name that
// is there already but is not bigint NOT NULL is an error matching
// [ErrInvalidOption]: a NULL token admits nothing.
func (c *Column) AddColumn(ctx context.Context) error {
	err := inTx(ctx, c.db, pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, c.addSQL); err != nil {
			return err
		}
		var problem string
		if err := tx.QueryRow(ctx, c.checkSQL, c.schema, c.table, c.fenceCol).Scan(&problem); err != nil {
			return err
		}
		if problem != "" {
			return fmt.Errorf("%w: column %q exists and cannot hold tokens (%s); make it bigint NOT NULL DEFAULT 0, or choose another name with WithFenceColumn",
				ErrInvalidOption, c.fenceCol, problem)
		}
		return nil
	}, nil)
	if err != nil {
		return c.dbError(ctx, fmt.Errorf("postgres: add fence column to %q: %w", c.table, err))
	}
	return nil
}

// AdmitTx admits t for the row whose key is key, inside tx. Make it the
// first statement of the transaction: it sets the row's fence column to t
// only if t is not lower, and keeps the row locked until tx ends, so that a
// read-modify-write of the row after it is serialised with every other
// admitted transaction for the row.
//
// A token lower than the row's fence column returns a [*fence.StaleError]
// (matching [fence.ErrStale]) with the row's token as Highest. A missing row
// returns an error matching [ErrNoRow], which is not stale: create the row
// with the token (see [Column]). tx stays usable
// after both (roll it back). Token errors and isolation levels are as for
// [Fence.AdmitTx].
func (c *Column) AdmitTx(ctx context.Context, tx pgx.Tx, key any, t fence.Token) error {
	tok, err := pgToken(t)
	if err != nil {
		return err
	}
	if err := c.checkKey(key); err != nil {
		return err
	}
	for range admitAttempts {
		var got int64
		err := tx.QueryRow(ctx, c.admitSQL, key, tok).Scan(&got)
		if err == nil {
			return nil
		}
		if hasCode(err, sqlStateCharacterNotInRepertoire) {
			return c.invalidKey(key, err)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return c.dbError(ctx, fmt.Errorf("postgres: admit token %d for %s: %w", t, c.resource(key), err))
		}
		err = c.rejected(ctx, tx, key, t, tok)
		if !errors.Is(err, errAdmissible) {
			return err
		}
		// The row was inserted, or its token lowered, in between: admit again.
	}
	return fmt.Errorf("postgres: admit token %d for %s: the row changed under %d attempts", t, c.resource(key), admitAttempts)
}

// Rejected explains why a guarded statement of your own affected no row.
// Such a statement is the single-statement form of the column guard, for a
// write that SQL can express without reading first:
//
//	UPDATE accounts SET balance = balance + $3, fence_token = $2
//	WHERE id = $1 AND fence_token <= $2
//
// When it affects no row, Rejected reads the row in tx and returns a
// [*fence.StaleError] if the row carries a higher token, or an error matching
// [ErrNoRow] if there is no such row. If the row is there and t is not
// stale, the statement failed for another reason (another condition of
// yours, or a row inserted since), and Rejected returns an error saying so.
func (c *Column) Rejected(ctx context.Context, tx pgx.Tx, key any, t fence.Token) error {
	tok, err := pgToken(t)
	if err != nil {
		return err
	}
	if err := c.checkKey(key); err != nil {
		return err
	}
	return c.rejected(ctx, tx, key, t, tok)
}

// errAdmissible says that the row exists and t is not stale for it.
var errAdmissible = errors.New("postgres: token is not stale for the row")

func (c *Column) rejected(ctx context.Context, tx pgx.Tx, key any, t fence.Token, tok int64) error {
	var highest *int64
	err := tx.QueryRow(ctx, c.highestSQL, key).Scan(&highest)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// A holder that creates the row plainly leaves fence_token 0, which
		// admits a stale holder after it (docs/design.md, defect 120).
		return fmt.Errorf("%w: %s; create it carrying the token (%s = %d), or any stale holder may write it after you",
			ErrNoRow, c.resource(key), c.fenceCol, tok)
	case hasCode(err, sqlStateCharacterNotInRepertoire):
		return c.invalidKey(key, err)
	case err != nil:
		return c.dbError(ctx, fmt.Errorf("postgres: read fence token of %s: %w", c.resource(key), err))
	case highest == nil:
		// NULL <= t is never true: no token can be admitted for the row.
		return fmt.Errorf("postgres: the fence column %q of %s is NULL, which admits no token; set it to 0 and make the column NOT NULL (AddColumn checks it)",
			c.fenceCol, c.resource(key))
	case *highest > tok:
		return &fence.StaleError{Resource: c.resource(key), Token: t, Highest: fence.Token(*highest)}
	}
	return fmt.Errorf("%w: %s has token %d, and %d may write", errAdmissible, c.resource(key), *highest, tok)
}

// InTx runs fn in a transaction that first admits t for the row whose key is
// key (see [Column.AdmitTx]), and commits if fn returns nil. Errors,
// rollback and retries are as for [Fence.InTx]; a missing row is an error
// matching [ErrNoRow], and fn is not called.
func (c *Column) InTx(ctx context.Context, key any, t fence.Token, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if _, err := pgToken(t); err != nil {
		return err
	}
	if err := c.checkKey(key); err != nil {
		return err
	}
	return inTx(ctx, c.db, c.txOptions, func(ctx context.Context, tx pgx.Tx) error {
		return c.AdmitTx(ctx, tx, key, t)
	}, fn)
}

// dbError is [dbError] for the Column's own statements, which name the
// table with its schema: a table that only search_path finds is missing to
// them, and a column missing is the fence column never added (or the key
// column misnamed).
func (c *Column) dbError(ctx context.Context, err error) error {
	switch {
	case hasCode(err, sqlStateUndefinedTable):
		err = fmt.Errorf("%w; a Column looks for table %q only in schema %q, not along search_path: if the table is in another schema, name it with WithSchema (the default is public)",
			err, c.table, c.schema)
	case hasCode(err, sqlStateUndefinedColumn):
		err = fmt.Errorf("%w; table %s needs the fence column %q and the key column %q: add the fence column with Column.AddColumn (run it with your schema migrations), "+
			"or name the column the table has with WithFenceColumn",
			err, pgx.Identifier{c.schema, c.table}.Sanitize(), c.fenceCol, c.keyColumn)
	}
	return dbError(ctx, err)
}

func (c *Column) resource(key any) string { return fmt.Sprintf("%s/%v", c.table, key) }

// checkKey refuses, before a round trip, a string key that no column can
// take: pgx sends it as text. A []byte key is left to the server, because a
// bytea key column holds any bytes; a text one refuses them with SQLSTATE
// 22021 (see invalidKey).
func (c *Column) checkKey(key any) error {
	v := reflect.ValueOf(key)
	if v.Kind() != reflect.String {
		return nil
	}
	if err := checkResource(v.String()); err != nil {
		return fmt.Errorf("postgres: key of table %q: %w", c.table, err)
	}
	return nil
}

// invalidKey is the error for a key the server refused as text (SQLSTATE
// 22021). The key is quoted: raw, a NUL byte or invalid UTF-8 would end up
// in logs and HTTP bodies.
func (c *Column) invalidKey(key any, err error) error {
	k := fmt.Sprint(key)
	if b, ok := key.([]byte); ok {
		k = string(b)
	}
	return fmt.Errorf("%w: key %q of table %q has a NUL byte or invalid UTF-8, which PostgreSQL text cannot hold: %w", fence.ErrInvalidResource, k, c.table, err)
}
