package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/fenced/fenced/internal/groupcommit"
)

// errShuttingDown is the cause of a wait that Drain ended.
var errShuttingDown = errors.New("server: draining: fenced is shutting down")

// Drain ends every wait, for a server about to shut down: acquires and
// campaigns with wait_ms > 0 and election long polls in progress, and
// those that arrive later, answer at once 503 unavailable ("fenced is
// shutting down") with Retry-After, so that their clients try another
// node; GET /readyz answers 503. Requests that do not wait (an acquire
// without wait_ms, refresh, release, inspect) are served as before: let
// them finish with [net/http.Server.Shutdown], which waits for the
// handlers. A lease granted to a waiting acquire just as Drain is called is
// answered as usual (or released, if its client went away). Drain returns
// at once, and calling it again does nothing; register it with
// [net/http.Server.RegisterOnShutdown] to have Shutdown call it.
func (s *Server) Drain() { s.drain() }

// draining reports whether Drain was called.
func (s *Server) draining() bool { return s.drained.Err() != nil }

// waitContext is the context of a request that may wait up to wait: the
// request's, bounded by wait plus the backend timeout, and, when wait > 0,
// ended by Drain with the cause errShuttingDown.
func (s *Server) waitContext(r *http.Request, wait time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), wait+s.backendTimeout)
	if wait <= 0 {
		return ctx, cancel
	}
	ctx, cancelCause := context.WithCancelCause(ctx)
	// Drain's cancel must end the wait at once, also while a store call
	// hangs: not inline, where go-redis would hold it until the call's
	// deadline (docs/design.md, defect 197).
	ctx = groupcommit.LeaveOnCancel(ctx)
	stop := context.AfterFunc(s.drained, func() { cancelCause(errShuttingDown) })
	if s.draining() {
		cancelCause(errShuttingDown) // now, not when AfterFunc's goroutine runs
	}
	return ctx, func() {
		stop()
		cancelCause(context.Canceled)
		cancel()
	}
}

// shuttingDown is the answer to a wait that Drain ended.
func shuttingDown() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable,
		message: "fenced is shutting down; retry on another node or later"}
}
