package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// pendingReadTimeout bounds the read of a message that the server sent
// while the transaction was idle. The bytes are there already; the bound
// only keeps an incomplete message from blocking the commit.
const pendingReadTimeout = time.Second

// sessionEnded returns the error with which the server, or a pooler, ended
// the session of tx while it was idle in the transaction (after
// pg_terminate_backend, idle_in_transaction_session_timeout, or a pooler's
// loss of its server connection), or nil. Such a session has sent its FATAL
// error, or closed the connection, before COMMIT is sent: the transaction
// rolled back. Read only after COMMIT, the same error would answer COMMIT
// as far as the client can tell, and a COMMIT may have been applied when
// its session ends while it runs.
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
