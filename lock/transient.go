package lock

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// transient reports whether err, an attempt's error while the caller's
// context is still live, is one a backend gives while it is briefly
// unavailable: an etcd leader election or a lost quorum, a Redis that
// restarts, loads its data or fails over (or, a Redlock node, sits out
// after losing its data), a Redis Cluster moving a slot, a dropped or
// refused connection,
// a call that hit its own timeout. Acquire tries again after such an error
// within its wait budget (docs/design.md, "Riding out an outage"). Errors
// that will not go away by waiting (bad credentials, a closed client, a
// request etcd refuses as too large) are not transient.
func transient(err error) bool {
	if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, redis.ErrClosed) || errors.Is(err, context.Canceled) {
		return false
	}
	var q *QuorumError
	if errors.As(err, &q) {
		// Redlock: retry only if every node that failed failed for a
		// reason that passes.
		for _, n := range q.Nodes {
			if !transient(n) {
				return false
			}
		}
		return len(q.Nodes) > 0
	}
	var re *RecoveringError // a Redlock node that lost its data: it takes leases again soon
	if errors.As(err, &re) || errors.Is(err, ErrInProgress) {
		return true
	}
	if redis.IsAuthError(err) || redis.IsPermissionError(err) {
		return false
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded): // the call's own timeout: the caller's has not passed
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	var ne net.Error // dial errors, read and write timeouts
	if errors.As(err, &ne) {
		return true
	}
	// etcd's errors (rpctypes.EtcdError) and gRPC's: Unavailable is "no
	// leader", "leader changed", "request timed out", no connection.
	var coded interface{ Code() codes.Code }
	if errors.As(err, &coded) {
		return unavailable(coded.Code())
	}
	if st, ok := status.FromError(err); ok {
		return unavailable(st.Code())
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || slotMoving(err) || redis.IsMaxClientsError(err) ||
		errors.Is(err, redis.ErrPoolTimeout)
}

func unavailable(c codes.Code) bool {
	return c == codes.Unavailable || c == codes.ResourceExhausted
}
