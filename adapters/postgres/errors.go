package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced/fenced/fence"
)

// SQLStateStale is the SQLSTATE that fence_admit raises for a stale token.
// Class SF ("stale fence") is in the range the SQL standard leaves to
// implementations and is not used by PostgreSQL, so it cannot be confused
// with a PostgreSQL error. [MapError] turns it into a [*fence.StaleError].
const SQLStateStale = "SF001"

// SQLSTATEs of an ERROR after which a whole transaction may be retried:
// the server rolled it back because it met another transaction (a
// serialization failure, a deadlock) or waited too long, most often for
// another transaction's lock (lock_timeout, statement_timeout).
const (
	sqlStateSerializationFailure = "40001"
	sqlStateDeadlockDetected     = "40P01"
	sqlStateLockNotAvailable     = "55P03" // lock_timeout, or NOWAIT
	sqlStateQueryCanceled        = "57014" // statement_timeout, or a cancel request
)

// Configuration errors, which the fence's own statements meet when what
// they use is missing, or the server refuses writes.
const (
	sqlStateUndefinedTable         = "42P01"
	sqlStateUndefinedColumn        = "42703"
	sqlStateReadOnlySQLTransaction = "25006"
)

// readOnlyAdvice says what a read-only transaction means for the fence.
const readOnlyAdvice = "the server runs this transaction read-only: it is a hot-standby replica, or default_transaction_read_only is on (for the database, the role or the connection); " +
	"an admit writes, so connect to the primary"

// sqlStateClassConnectionException is the class of SQLSTATEs for a lost
// connection, 08; PgBouncer's own errors are 08P01.
const sqlStateClassConnectionException = "08"

// sqlStateCharacterNotInRepertoire is what the server answers for a text
// parameter with a NUL byte or invalid UTF-8.
const sqlStateCharacterNotInRepertoire = "22021"

// sqlStateProgramLimitExceeded is what the fence table's upsert fails with
// when the resource name is too long for the table's primary key: a btree
// entry holds at most 2704 bytes, after compression.
const sqlStateProgramLimitExceeded = "54000"

// A named prepared statement that the server connection already has, or
// does not have: pgx's statement cache (its default query mode) prepares
// statements per connection, and a pooler in transaction mode hands each
// transaction whichever server connection is free.
const (
	sqlStateDuplicatePreparedStatement = "42P05"
	sqlStateInvalidStatementName       = "26000"
)

// poolerAdvice says what to do about those errors.
const poolerAdvice = "a connection pooler in transaction mode (such as PgBouncer) shares server connections between transactions, and pgx's default statement cache cannot work there: " +
	"add default_query_exec_mode=exec (or simple_protocol) to the DSN, or set DefaultQueryExecMode in pgx's ConnConfig"

// indexLimitAdvice says what a name too long for the fence table may be.
// The limit is not a fixed number of bytes: a name that compresses well
// fits in more.
const indexLimitAdvice = "PostgreSQL's index on the fence table holds names of about 2,700 bytes (more only if they compress well); use a shorter name, such as a hash of the long one"

var (
	// ErrNoRow is returned by the column guard when the guarded row does not
	// exist. It is not a stale token: no holder has written the row. Create
	// it carrying the token (see [Column]): a row inserted with fence_token
	// 0 admits a stale holder's write after yours.
	ErrNoRow = errors.New("postgres: no such row")

	// ErrTokenRange is returned for a token above math.MaxInt64, which a
	// bigint cannot hold. Such an error also matches fence.ErrInvalidToken.
	ErrTokenRange = errors.New("postgres: token out of range")

	// ErrInvalidName is returned by the constructors for an empty, too long
	// or otherwise unusable schema, table or column name.
	ErrInvalidName = errors.New("postgres: invalid name")

	// ErrCommitUnknown is matched by the error of a transaction whose COMMIT
	// was sent and got no answer from the transaction's session: the
	// connection was lost, the context ended, or the session itself was
	// ended while COMMIT ran, by PostgreSQL (an error of severity FATAL or
	// PANIC, such as 57P01 admin_shutdown) or by a pooler such as PgBouncer
	// (its own FATAL errors, SQLSTATE class 08, when it loses the server
	// connection or its query_timeout fires). The server may have committed
	// it. Do not run the write again blindly; the fence admits the same
	// token again, so it cannot tell. Read what the write changed first, or
	// make the write idempotent.
	ErrCommitUnknown = errors.New("postgres: the commit's outcome is unknown: the write may have been applied")

	// ErrInvalidOption is returned by the constructors for an option that is
	// invalid or does not apply, and by Migrate when a schema already holds a
	// different fence table.
	ErrInvalidOption = errors.New("postgres: invalid option")
)

// commitUnknown reports whether a failed COMMIT may have been applied.
// PostgreSQL's answer to it (an ERROR, such as a serialization failure,
// or pgx.ErrTxCommitRollback) means it rolled back; an error that
// ends the session instead (FATAL or PANIC, or class 08, which PgBouncer
// sends when it loses the server connection or its query_timeout fires
// while COMMIT runs) does not say whether the server got as far as
// committing, and neither does no answer.
func commitUnknown(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return endsSession(pe)
	}
	return !commitNotSent(err)
}

// endsSession reports whether pe ends the session rather than answering a
// statement.
func endsSession(pe *pgconn.PgError) bool {
	sev := pe.SeverityUnlocalized
	if sev == "" {
		sev = pe.Severity // PgBouncer and servers before 9.6 send only this
	}
	return sev == "FATAL" || sev == "PANIC" || strings.HasPrefix(pe.Code, sqlStateClassConnectionException)
}

// commitNotSent reports whether err says that pgconn never sent the COMMIT
// (the context had ended before it), so the transaction rolled back with
// its connection. pgconn.SafeToRetry alone is no guide: a COMMIT the server
// applied, its answer lost with the connection, comes back as "conn closed"
// (pgconn.ErrConnClosed), which it also calls safe to retry.
func commitNotSent(err error) bool {
	return pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)
}

// sessionLostError is the error of a transaction that InTx knows rolled
// back because its session ended before COMMIT was sent: run again, on
// another session, it may succeed (docs/design.md, defect 223). It changes
// neither the message nor what the error matches; [IsRetryable] looks for it.
type sessionLostError struct{ err error }

func (e *sessionLostError) Error() string { return e.err.Error() }
func (e *sessionLostError) Unwrap() error { return e.err }

// hasCode reports whether err is a PostgreSQL error with SQLSTATE code.
func hasCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// pgToken checks t and converts it to a bigint.
func pgToken(t fence.Token) (int64, error) {
	if t == 0 {
		return 0, fmt.Errorf("%w: 0 means no token; want 1 to %d", fence.ErrInvalidToken, int64(math.MaxInt64))
	}
	if t > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %w: %d does not fit in a bigint (at most %d)", ErrTokenRange, fence.ErrInvalidToken, uint64(t), int64(math.MaxInt64))
	}
	return int64(t), nil
}

// checkResource refuses a resource name that a text column cannot hold, as
// a caller's error rather than a failure of the database: PostgreSQL text
// holds no NUL byte, and pgx talks UTF-8 to the server.
func checkResource(resource string) error {
	switch {
	case strings.ContainsRune(resource, 0):
		return fmt.Errorf("%w: %q contains a NUL byte, which PostgreSQL text cannot hold", fence.ErrInvalidResource, resource)
	case !utf8.ValidString(resource):
		return fmt.Errorf("%w: %q is not valid UTF-8, which PostgreSQL text needs", fence.ErrInvalidResource, resource)
	}
	return nil
}

// tooLongForIndex returns the caller's error for the fence table's refusal
// of a resource name too long for its primary key, or nil if err is not
// that: asking again, as for a failure of the database, cannot succeed.
func tooLongForIndex(err error, resource string) error {
	if !hasCode(err, sqlStateProgramLimitExceeded) {
		return nil
	}
	return fmt.Errorf("%w: %.32q… is %d bytes long; %s: %w", fence.ErrInvalidResource, resource, len(resource), indexLimitAdvice, err)
}

// MapError turns an error raised by the SQL function fence_admit (SQLSTATE
// [SQLStateStale]) into a [*fence.StaleError] with the resource, token and
// highest token it reports, so that [fence.IsStale] and errors.As work the
// same way for SQL written by hand as for this package. A resource name too
// long for the fence table's index, refused inside fence_admit (SQLSTATE
// 54000, with fence_admit in the error's context), becomes an error
// matching [fence.ErrInvalidResource]. Any other error, and nil, is returned
// unchanged. The InTx methods apply it to the error of their function.
func MapError(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	// 54000 alone could be any limit of any statement, a table of the
	// caller's among them; inside fence_admit it can only be the name.
	if pe.Code == sqlStateProgramLimitExceeded && strings.Contains(pe.Where, "fence_admit(text,bigint)") {
		return fmt.Errorf("%w: a name given to fence_admit is too long; %s: %w", fence.ErrInvalidResource, indexLimitAdvice, err)
	}
	if pe.Code != SQLStateStale {
		return err
	}
	if se, ok := parseStale(pe.Detail); ok {
		return se
	}
	// The detail is not in the form this package writes (a hand-made or
	// changed function): still stale, with the server's error kept.
	return fmt.Errorf("%w: %w", fence.ErrStale, err)
}

// parseStale parses "token=<t> highest=<h> resource=<r>".
func parseStale(detail string) (*fence.StaleError, bool) {
	rest, ok := strings.CutPrefix(detail, "token=")
	if !ok {
		return nil, false
	}
	tok, rest, ok := strings.Cut(rest, " highest=")
	if !ok {
		return nil, false
	}
	hi, res, ok := strings.Cut(rest, " resource=")
	if !ok {
		return nil, false
	}
	t, err1 := strconv.ParseUint(tok, 10, 64)
	h, err2 := strconv.ParseUint(hi, 10, 64)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return &fence.StaleError{Resource: res, Token: fence.Token(t), Highest: fence.Token(h)}, true
}

// IsRetryable reports whether err ends a transaction that rolled back and
// may succeed when run again from the start:
//
//   - an ERROR by which the server rolled it back for meeting another
//     transaction or waiting too long: a serialization failure (SQLSTATE
//     40001, common under SERIALIZABLE and REPEATABLE READ), a detected
//     deadlock (40P01), a lock_timeout or a lock not available (55P03), a
//     statement_timeout or a statement cancelled (57014);
//   - from InTx, a session that ended before COMMIT was sent (a FATAL
//     error such as 57P01 or 25P03, a pooler's 08P01, a broken
//     connection): the transaction rolled back with it. Run it again on
//     another connection, as a pool gives; a failed BEGIN is not included,
//     since a pooler that refuses transactions (PgBouncer in statement
//     mode) fails every BEGIN so.
//
// It is false for an error that matches [ErrCommitUnknown] (the write may
// have been applied), for one that matches the context's error (the
// caller's context ended, whatever the server's SQLSTATE; this package's
// errors match it when the context ended), and for a stale token: the
// holder has lost its lock. A FATAL error that is not from InTx is not
// retryable: after a COMMIT of your own, it does not say whether the
// COMMIT was applied.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrCommitUnknown) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var lost *sessionLostError
	if errors.As(err, &lost) {
		return true
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || endsSession(pe) {
		return false
	}
	switch pe.Code {
	case sqlStateSerializationFailure, sqlStateDeadlockDetected, sqlStateLockNotAvailable, sqlStateQueryCanceled:
		return true
	}
	return false
}

// dbError finishes an error from the database for the caller: one caused
// by the end of ctx matches ctx.Err(), whatever form the driver gave it,
// and one that a transaction pooler or a read-only server causes says what
// to change.
func dbError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case hasCode(err, sqlStateDuplicatePreparedStatement) || hasCode(err, sqlStateInvalidStatementName):
		err = fmt.Errorf("%w; %s", err, poolerAdvice)
	case hasCode(err, sqlStateReadOnlySQLTransaction):
		err = fmt.Errorf("%w; %s", err, readOnlyAdvice)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	return err
}
