package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// pendingReadTimeout bounds the read of a message that the server sent
// while the transaction was idle. The bytes are there already; the bound
// only keeps an incomplete message from blocking the commit.
const pendingReadTimeout = time.Second

// commitBlocked returns why COMMIT cannot be sent on tx's connection
// after fn returned nil, or nil (docs/design.md, defect 222). Either way the transaction rolls back: a
// busy connection fails the rollback too, and pgx closes it.
//
//   - The connection is busy: fn left the rows of a tx.Query open, or
//     another goroutine still runs a statement on tx. The peek of
//     sessionEnded (docs/design.md, defect 154) would take its unread rows
//     for the message of a session that ended, and COMMIT fails with
//     pgconn's "conn busy". Committing anyway is not safe: rows not read to
//     the end have not said whether their statement failed.
//   - pgx has closed the connection: a statement of fn met the end of the
//     session (a FATAL error, a broken connection), and fn returned nil
//     all the same. COMMIT was never sent, so the transaction rolled back;
//     Commit's "conn closed" would read as a COMMIT whose answer was lost.
func commitBlocked(tx pgx.Tx) error {
	c := tx.Conn()
	switch {
	case c == nil:
		return nil
	case c.IsClosed():
		return &sessionLostError{fmt.Errorf("postgres: commit not sent: the connection was closed before it, by a statement of the function that failed with the session's end, though the function returned nil; "+
			"the transaction rolled back: %w", pgconn.ErrConnClosed)}
	case c.PgConn().IsBusy():
		return errors.New("postgres: commit not sent: the function returned with the connection still busy (the rows of a tx.Query not closed, or a statement of another goroutine still running on tx); " +
			"close the rows (defer rows.Close()) before returning; the transaction rolled back")
	}
	return nil
}

// sessionLost marks err, from a statement of tx before COMMIT, as the end of
// the transaction's session, when it is: pgx has closed the connection, on
// a FATAL error (including a pooler's class 08 ones) or a broken
// connection. COMMIT cannot be sent any more, so the transaction rolled
// back for sure, and [IsRetryable] reports it. An ERROR that pgx closed the
// connection on (an OnPgError of the caller's) is left as it is.
func sessionLost(tx pgx.Tx, err error) error {
	c := tx.Conn()
	if c == nil || !c.IsClosed() {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && !endsSession(pe) {
		return err
	}
	return &sessionLostError{err}
}

// sessionEnded returns the error with which the server, or a pooler, ended
// the session of tx while it was idle in the transaction (after
// pg_terminate_backend, idle_in_transaction_session_timeout, or a pooler's
// loss of its server connection), or nil. Such a session has sent its FATAL
// error, or closed the connection, before COMMIT is sent: the transaction
// rolled back. Read only after COMMIT, the same error would answer COMMIT
// as far as the client can tell, and a COMMIT may have been applied when
// its session ends while it runs. Call it only when tx's connection is idle
// (see commitBlocked): on a busy one, the unread bytes are rows.
//
// Nothing is read unless the server has sent something: the check is one
// non-blocking peek at the socket. It cannot peek through TLS, nor on
// systems other than Unix; there such an error still reads as the
// COMMIT's own, whose outcome is unknown.
func sessionEnded(tx pgx.Tx) error {
	c := tx.Conn()
	if c == nil {
		return nil
	}
	pc := c.PgConn()
	if pc.Frontend().ReadBufferLen() == 0 && !pending(pc.Conn()) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pendingReadTimeout)
	defer cancel()
	msg, err := pc.ReceiveMessage(ctx)
	switch {
	case pgconn.Timeout(err):
		return nil
	case err != nil: // the end of the stream, or a FATAL error pgconn closed on
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return pe
		}
		return err
	}
	if e, ok := msg.(*pgproto3.ErrorResponse); ok {
		return pgconn.ErrorResponseToPgError(e)
	}
	return nil // a notice, or a parameter's new value: the session goes on
}
