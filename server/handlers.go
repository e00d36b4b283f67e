package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Operations, the op label of fenced_backend_errors_total and of the
// "lease store failed" log line: one word each, as doc.go and the metric's
// help list them (backendOps).
const (
	opAcquire = "acquire" // campaigns too
	opRefresh = "refresh"
	opRelease = "release"
	opInspect = "inspect"
	opList    = "list"
	opForce   = "force_release"
	opLeader  = "leader"
	opReady   = "ready"
)

// backendOps is every op of fenced_backend_errors_total.
var backendOps = []string{opAcquire, opRefresh, opRelease, opInspect, opList, opForce, opLeader, opReady}

// opWords is op as an answer's message says it.
func opWords(op string) string {
	switch op {
	case opList:
		return "list locks under"
	case opForce:
		return "force-release"
	case opLeader:
		return "read the leader of"
	}
	return op
}

// The answers, as package api defines them.
type (
	leaseResponse  = api.Lease
	stateResponse  = api.LockState
	statusResponse = api.Status
)

// body checks the Content-Type and reads at most maxBody bytes of the
// request body.
func (s *Server) body(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if aerr := checkContentType(r.Header); aerr != nil {
		return nil, aerr
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
			message: fmt.Sprintf("request body over %d bytes", s.maxBody)}
	}
	if err != nil {
		return nil, invalid("", fmt.Sprintf("reading the request body: %v", err))
	}
	return b, nil
}

// decodeBody reads the body and decodes it with decode; a bad one is
// answered (and counted as invalid for op), and ok is false.
func decodeBody[T any](s *Server, w http.ResponseWriter, r *http.Request, op string, decode func([]byte) (T, *apiError)) (req T, ok bool) {
	b, aerr := s.body(w, r)
	if aerr == nil {
		req, aerr = decode(b)
	}
	if aerr != nil {
		s.countInvalid(op)
		writeError(w, aerr)
		return req, false
	}
	return req, true
}

// countInvalid counts a request of op refused before the lease store (a
// bad name, query string or body) as result invalid of op's counter.
// Reads and force-release have none.
func (s *Server) countInvalid(op string) {
	switch op {
	case opAcquire, opCampaign: // a campaign is an acquire of the election's lock
		s.metrics.acquisitions.WithLabelValues(resultInvalid).Inc()
	case opRefresh:
		s.metrics.refreshes.WithLabelValues(resultInvalid).Inc()
	case opRelease:
		s.metrics.releases.WithLabelValues(resultInvalid).Inc()
	}
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, name string) {
	req, ok := decodeBody(s, w, r, opAcquire, s.limits.decodeAcquire)
	if !ok {
		return
	}
	s.grant(w, r, name, req, false)
}

// grant takes the lease of an acquire, or of a campaign (req.owner is then
// the leader's value), and answers it.
func (s *Server) grant(w http.ResponseWriter, r *http.Request, name string, req acquireRequest, campaign bool) {
	ctx, cancel := s.waitContext(r, req.wait)
	defer cancel()
	if req.wait > 0 {
		s.metrics.waiters.Inc()
		defer s.metrics.waiters.Dec()
	}
	start := time.Now()
	var (
		l   *lock.Lease
		err error
	)
	// Every call's: the acquisition across requests (one sent again after
	// a lost answer gets its grant, and a fair waiter keeps its place).
	opts := make([]lock.Option, 1, 7)
	opts[0] = lock.WithDetached()
	if req.waiter != "" {
		opts = append(opts, lock.WithWaiter(req.waiter))
	}
	if req.final {
		opts = append(opts, lock.WithFinal())
	}
	if campaign && req.wait > 0 {
		l, err = s.locks.Elect(ctx, name, req.owner, req.ttl, append(opts, lock.WithWait(req.wait))...)
	} else {
		// An acquisition's, and a campaign's one attempt's (an unfair
		// one, as ever): who holds it.
		if req.owner != "" {
			opts = append(opts, lock.WithOwner(req.owner))
		}
		if req.holder != "" {
			opts = append(opts, lock.WithHolder(req.holder))
		}
		if req.unfair {
			opts = append(opts, lock.WithUnfair())
		}
		if req.wait == 0 {
			l, err = s.locks.TryAcquire(ctx, name, req.ttl, opts...)
		} else {
			l, err = s.locks.Acquire(ctx, name, req.ttl, append(opts, lock.WithWait(req.wait))...)
		}
	}
	s.metrics.acquireDuration.Observe(time.Since(start).Seconds())
	if errors.Is(err, lock.ErrTTLTooShort) {
		// Before ErrNotAcquired, which it matches too: the grant came back
		// with no validity left and was released, so nobody holds the lock
		// and 409 held would be false. A 503 with field ttl_ms, the part of
		// the request to change, lets a client tell it by code and field;
		// not counted "error": the store answered, only later than the TTL.
		s.metrics.acquisitions.WithLabelValues(resultTTLTooShort).Inc()
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, field: fieldTTLMs, message: err.Error()})
		return
	}
	if errors.Is(err, lock.ErrNotAcquired) {
		s.metrics.acquisitions.WithLabelValues(resultHeld).Inc()
		what, still := fmt.Sprintf("lock %q is held by another holder", name), "still held"
		if campaign {
			what, still = fmt.Sprintf("election %q has another leader", name), "still led"
		}
		aerr := &apiError{status: http.StatusConflict, code: codeHeld,
			message: what + "; set wait_ms to wait for it"}
		var we *lock.WaitError
		if req.wait > 0 && errors.As(err, &we) {
			aerr.wait, aerr.waited, aerr.position = true, we.Waited, we.Position
			aerr.message = fmt.Sprintf("%s; %s after waiting %d ms (wait_ms %d)", what, still, we.Waited.Milliseconds(), req.wait.Milliseconds())
			if we.Position > 0 {
				aerr.message += fmt.Sprintf("; this caller was number %d in its queue", we.Position)
			}
		}
		writeError(w, aerr)
		return
	}
	if err != nil {
		aerr, result := s.failure(r, ctx, opAcquire, name, start, err)
		s.metrics.acquisitions.WithLabelValues(result).Inc()
		writeError(w, aerr)
		return
	}
	if !l.Reused() {
		s.metrics.tokensIssued.Inc()
	}
	if r.Context().Err() != nil {
		s.clientGone(w, r, name, req, l)
		return
	}
	s.metrics.acquisitions.WithLabelValues(resultAcquired).Inc()
	s.leases.acquired(name, l.ID(), l.Deadline(), l.Count() > 1)
	count := l.Count()
	if count == 1 {
		count = 0 // omitted: the usual case says nothing
	}
	writeJSON(w, http.StatusOK, leaseResponse{Name: name, LeaseID: l.ID(), Token: l.Token(), TTLMs: l.TTL().Milliseconds(), Count: count,
		WaitedMs: waitedBefore(l, start).Milliseconds(), Reused: l.Reused()})
}

// clientGone answers an acquire whose client went away while the lease l
// was being taken. Without a waiter id nobody can ever learn l's lease id,
// so it is released now rather than at the end of its TTL (for a holder's
// reentry, that takes off the one hold this request added). With one, a
// copy of this request, on this server or another, may have been handed
// l (defect 148): a new grant is released only if no other request was
// handed it (lock.UnhandedReleaser, defect 153), and a holder's reentry
// taken off only if no other request was handed its hold
// (lock.UnhandedUnreenterer, defect 183); any other grant found again is
// kept. A grant kept goes to the waiter's next request, or the client's
// give-up (a final request) or the TTL ends it.
func (s *Server) clientGone(w http.ResponseWriter, r *http.Request, name string, req acquireRequest, l *lock.Lease) {
	s.metrics.acquisitions.WithLabelValues(resultCancelled).Inc()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.backendTimeout)
	defer rcancel()
	// A grant found again without a waiter is a reentry this request
	// counted; any other is someone's grant.
	if req.waiter != "" || (l.Reused() && req.holder == "") {
		released := false
		var err error
		switch {
		case !l.Reused():
			released, err = s.locks.ReleaseUnhanded(rctx, name, l.ID())
		case req.holder != "" && req.waiter != "":
			// A reentry (or the waiter's own grant found again, which
			// counted no hold under the waiter: then nothing changes).
			released, err = s.locks.UnreenterUnhanded(rctx, name, l.ID(), req.waiter)
		}
		if !released {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "client went away during acquire; lease kept for the waiter's next request",
				slog.String("lock", name), slog.Bool("found_again", l.Reused()), slog.Any("release_err", err))
			writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable,
				message: "request cancelled while the lease was taken; the lease is kept for the waiter's next request"})
			return
		}
		msg := "request cancelled while the lease was taken; the lease was released"
		if l.Reused() {
			msg = "request cancelled while the lease was taken; the hold this reentry added was taken off, the holder's others stand"
		}
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "client went away during acquire; lease released",
			slog.String("lock", name), slog.Bool("reentry", l.Reused()))
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: msg})
		return
	}
	err := s.locks.ReleaseID(rctx, name, l.ID(), "")
	s.log.LogAttrs(r.Context(), slog.LevelDebug, "client went away during acquire; lease released",
		slog.String("lock", name), slog.Any("release_err", err))
	writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable,
		message: "request cancelled while the lease was taken; the lease was released"})
}

// waitedBefore is how long after start the attempt that granted l began,
// less 0.1% for the rate of this clock against the client's: the client
// measures l's validity from the moment it sent the request plus this, a
// moment that is never after the grant (docs/design.md, "Waiting").
func waitedBefore(l *lock.Lease, start time.Time) time.Duration {
	w := l.Started().Sub(start)
	return max(w-w/1000, 0)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, name string) {
	req, ok := decodeBody(s, w, r, opRefresh, s.limits.decodeRefresh)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	start := time.Now()
	g, err := s.locks.RefreshID(ctx, name, req.leaseID, req.ttl, req.seq)
	if err != nil {
		aerr, result := s.failure(r, ctx, opRefresh, name, start, err)
		if result == resultLost {
			s.leases.ended(name, req.leaseID)
		}
		s.metrics.refreshes.WithLabelValues(result).Inc()
		writeError(w, aerr)
		return
	}
	s.metrics.refreshes.WithLabelValues(resultRefreshed).Inc()
	s.leases.refreshed(name, req.leaseID, start.Add(g.TTL))
	writeJSON(w, http.StatusOK, leaseResponse{Name: name, LeaseID: req.leaseID, Token: g.Token, TTLMs: g.TTL.Milliseconds()})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, name string) {
	req, ok := decodeBody(s, w, r, opRelease, s.limits.decodeRelease)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	start := time.Now()
	if err := s.locks.ReleaseID(ctx, name, req.leaseID, req.releaseID); err != nil {
		aerr, result := s.failure(r, ctx, opRelease, name, start, err)
		if result == resultLost {
			s.leases.ended(name, req.leaseID)
			// Whether the store could tell it from an earlier release's
			// answer, for a client that sent one and lost its answer
			// (docs/design.md, defect 190).
			maybe := errors.Is(err, lock.ErrMaybeReleased)
			aerr.maybeReleased = &maybe
		}
		s.metrics.releases.WithLabelValues(result).Inc()
		writeError(w, aerr)
		return
	}
	s.metrics.releases.WithLabelValues(resultReleased).Inc()
	s.releasedHold(r, name, req.leaseID)
	writeJSON(w, http.StatusOK, api.Empty{})
}

// releasedHold updates fenced_active_leases after a release by id of name
// succeeded. A lease seen held more than once (a reentrant holder's) may
// still hold the lock after a release (one hold taken off, or none by a
// release sent again with its release_id), and ReleaseID does not say
// which: for those only the store is asked, so that the common release
// costs no second call.
func (s *Server) releasedHold(r *http.Request, name, id string) {
	if !s.leases.reentered(name, id) {
		s.leases.released(name, id)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	st, err := s.locks.Inspect(ctx, name)
	switch {
	case err != nil:
		// Still counted, until its TTL runs out: the gauge is no reason
		// to fail a release that succeeded.
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "released a reentered lease; could not read whether the lock is still held",
			slog.String("lock", name), slog.Any("err", err))
	case !st.Held || st.LeaseID != id:
		s.leases.released(name, id)
	}
}

// inspect reports a lock's state, never its lease id: the lease id is the
// holder's secret.
func (s *Server) inspect(w http.ResponseWriter, r *http.Request, name string) {
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	start := time.Now()
	st, err := s.locks.Inspect(ctx, name)
	if err != nil {
		aerr, _ := s.failure(r, ctx, opInspect, name, start, err)
		writeError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, api.NewLockState(st))
}

// defaultListLimit is the page size of GET /v1/locks without limit.
const defaultListLimit = 100

// query is the request's query string, parsed. r.URL.Query drops a pair
// it cannot decode (a bad %-escape, a ';') and keeps the rest, so
// ?prefix=%zz would list every lock: a malformed query string is a 400.
func query(r *http.Request) (url.Values, *apiError) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, invalid("", fmt.Sprintf("query string %s: %v; escape each parameter's name and value (%%XX), and separate the parameters with & (not ;)", excerpt([]byte(r.URL.RawQuery)), err))
	}
	return q, nil
}

// list answers one page of the held locks under a prefix. ServeHTTP has
// checked the query string (route.checkQuery) and the prefix against the
// caller's token.
func (s *Server) list(w http.ResponseWriter, r *http.Request, _ string) {
	q, aerr := query(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	prefix := q.Get(fieldPrefix)
	if err := lock.ValidateNamePrefix(prefix); err != nil {
		writeError(w, invalid(fieldPrefix, err.Error()))
		return
	}
	limit := defaultListLimit
	if v, ok := q[fieldLimit]; ok {
		// Digits only, as token and after_token: Atoi took "+5"
		// (docs/design.md, defect 209).
		n, err := strconv.ParseUint(v[0], 10, 32)
		if err != nil || n < 1 || n > lock.MaxListLimit {
			writeError(w, invalid(fieldLimit, fmt.Sprintf("limit %s: want an integer from 1 to %d (default %d)", excerpt([]byte(v[0])), lock.MaxListLimit, defaultListLimit)))
			return
		}
		limit = int(n)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	start := time.Now()
	page, err := s.locks.List(ctx, prefix, limit, q.Get(fieldCursor))
	if errors.Is(err, lock.ErrInvalidCursor) {
		writeError(w, invalid(fieldCursor, err.Error()+"; pass the next_cursor of the previous page, or none for the first"))
		return
	}
	if err != nil {
		aerr, _ := s.failure(r, ctx, opList, prefix, start, err)
		writeError(w, aerr)
		return
	}
	resp := api.LockList{Locks: make([]stateResponse, 0, len(page.Locks)), NextCursor: page.Next}
	for _, st := range page.Locks {
		resp.Locks = append(resp.Locks, api.NewLockState(st))
	}
	writeJSON(w, http.StatusOK, resp)
}

// forceRelease deletes a lock's lease whoever holds it: an operator's act,
// logged with the caller's token. 404 when nobody held it. With ?token=N
// only the grant with token N: 409 held when another holds it, so that a
// DELETE sent again after a lost answer or a 503 spares the next holder.
func (s *Server) forceRelease(w http.ResponseWriter, r *http.Request, name string) {
	// An unknown parameter is refused, not ignored (ServeHTTP, by
	// route.checkQuery): ?tokn=5 must not release whoever holds the lock.
	q, aerr := query(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var opts []lock.ForceOption
	if v, ok := q[fieldToken]; ok {
		tok, err := fence.ParseToken(v[0])
		if err != nil {
			writeError(w, invalid(fieldToken, fmt.Sprintf("token %s: want the token of the grant to release, a decimal number from 1 to %d; without token the lock is released whoever holds it", excerpt([]byte(v[0])), fence.MaxToken)))
			return
		}
		opts = append(opts, lock.IfToken(tok))
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.backendTimeout)
	defer cancel()
	start := time.Now()
	st, err := s.locks.ForceRelease(ctx, name, opts...)
	var he *lock.HeldByOtherError
	if errors.As(err, &he) {
		holder := fmt.Sprintf("token %d", he.Token)
		if he.Token == 0 {
			holder = "a grant that has no token yet"
		}
		writeError(w, &apiError{status: http.StatusConflict, code: codeHeld, heldBy: &he.Token,
			message: fmt.Sprintf("lock %q is held by %s, not by token %d: nothing was released", name, holder, he.Want)})
		return
	}
	if err != nil {
		aerr, _ := s.failure(r, ctx, opForce, name, start, err)
		writeError(w, aerr)
		return
	}
	if !st.Held {
		writeError(w, &apiError{status: http.StatusNotFound, code: codeNotFound,
			message: fmt.Sprintf("lock %q is not held: nothing to release", name)})
		return
	}
	s.leases.ended(name, st.LeaseID)
	attrs := []slog.Attr{slog.String("lock", name), slog.Uint64("token", uint64(st.Token)),
		slog.String("remaining", st.Remaining.Round(time.Millisecond).String())}
	if st.Owner != "" {
		attrs = append(attrs, slog.String("owner", st.Owner))
	}
	if tok := callerToken(r.Context()); tok != "" {
		attrs = append(attrs, slog.String("by_token", tok))
	}
	s.log.LogAttrs(r.Context(), slog.LevelWarn, "lock force-released: its holder's writes with this token are no longer protected by the lease, only by the fence", attrs...)
	writeJSON(w, http.StatusOK, api.NewLockState(st))
}

// failure maps an error of the lock client to the API error and the result
// label. ErrNotAcquired is left to the caller (only acquire sees it). ctx
// is the context of the failed call, to tell a timeout; start is when the
// call began.
func (s *Server) failure(r *http.Request, ctx context.Context, op, name string, start time.Time, err error) (*apiError, string) {
	switch {
	case errors.Is(err, lock.ErrInvalidName):
		return invalid(fieldName, err.Error()), resultInvalid
	case errors.Is(err, lock.ErrInvalidTTL):
		return invalid(fieldTTLMs, err.Error()), resultInvalid
	case errors.Is(err, lock.ErrInvalidLeaseID):
		return invalid(fieldLeaseID, err.Error()), resultInvalid
	case errors.Is(err, lock.ErrOutOfOrder):
		return &apiError{status: http.StatusConflict, code: codeOutOfOrder,
			message: fmt.Sprintf("a refresh of this lease with a higher seq was applied first: this one arrived late and was not applied (lock %q is still held, as the later refresh left it)", name)}, resultOutOfOrder
	case errors.Is(err, lock.ErrLost):
		s.metrics.leasesLost.Inc()
		return &apiError{status: http.StatusGone, code: codeLost,
			message: fmt.Sprintf("this lease id does not hold lock %q: the lease expired or was taken over, or the id never held it; stop writing with its token and acquire again", name)}, resultLost
	case r.Context().Err() != nil:
		// The client went away (or the server's base context ended): the
		// store is not at fault. Whoever still listens learns the truth.
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "request cancelled before the lease store answered",
			slog.String("op", op), slog.String("lock", name), slog.Any("cause", context.Cause(r.Context())))
		return &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable,
			message: "request cancelled before the lease store answered"}, resultCancelled
	case context.Cause(ctx) == errShuttingDown:
		// Drain ended the wait: the client, still listening, should try
		// another node.
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "wait ended: fenced is shutting down",
			slog.String("op", op), slog.String("lock", name))
		return shuttingDown(), resultShuttingDown
	case errors.Is(err, lock.ErrClosed):
		return shuttingDown(), resultShuttingDown
	case errors.Is(err, lock.ErrInProgress):
		// Not the store's fault: a copy of this request, here or on
		// another node, is still taking the lock (defect 158).
		return &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable,
			message: fmt.Sprintf("an earlier request of this acquisition (the same waiter) is still taking lock %q, through this node or another: ask again in a moment, and it is handed that grant", name)}, resultInProgress
	}
	s.metrics.backendErrors.WithLabelValues(op).Inc()
	backend := backendOf(err)
	took := time.Since(start)
	msg := fmt.Sprintf("lease store failed (%s %q): %v; check that Redis and etcd are reachable from fenced (GET /readyz)", opWords(op), name, err)
	hint, refused := backendHint(backend, err)
	if !refused {
		hint += "; GET /readyz runs the same check; --backend-timeout bounds each request"
	}
	switch {
	case ctx.Err() != nil:
		msg = fmt.Sprintf("lease store did not answer %s %q within %s; check that Redis and etcd are reachable and have a leader (GET /readyz)", opWords(op), name, took.Round(time.Millisecond))
	case refused:
		msg = fmt.Sprintf("lease store failed (%s %q): %v; %s", opWords(op), name, err, hint)
	}
	s.log.LogAttrs(r.Context(), slog.LevelWarn, "lease store failed",
		slog.String("op", op), slog.String("lock", name), slog.String("backend", backend),
		slog.String("took", took.Round(time.Microsecond).String()), slog.Bool("timed_out", ctx.Err() != nil), slog.Any("err", err),
		slog.String("hint", hint))
	return &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: msg}, resultError
}

// backendHint is what an operator does about err, a failure of backend.
// refused says the backend answered and refused to write, for a reason
// that the hint names: "check that it is reachable" is not the advice.
func backendHint(backend string, err error) (hint string, refused bool) {
	switch {
	case errors.Is(err, sequencer.ErrTokensExhausted):
		return tokensExhaustedHint, true
	case errors.Is(err, rpctypes.ErrNoSpace):
		return noSpaceHint, true
	case redisRefused(err, "OOM"):
		return redisOOMHint, true
	case redisRefused(err, "READONLY"):
		return redisReadOnlyHint, true
	case redisRefused(err, "NOAUTH"), redisRefused(err, "ERR Protocol error: unauthenticated"):
		// The second: Redis cuts an unauthenticated client off at a
		// command of more than a few arguments, as the store's scripts.
		return redisNoAuthHint, true
	case redisRefused(err, "WRONGPASS"):
		return redisWrongPassHint, true
	case redisACLRefused(err):
		return redisNoPermHint, true
	case redisRefused(err, "ERR DB index"):
		return redisDBHint, true
	case errors.Is(err, rpctypes.ErrNoLeader):
		return noLeaderHint, false
	}
	return "check that " + backend + " is reachable from fenced and healthy (etcd: has a leader)", false
}

// refusal says what a backend that answered with a refusal refuses:
// writes (a full or read-only store), or fenced's connection and commands
// (its credentials, database or permissions: defect 195).
func refusal(err error) string {
	if errors.Is(err, sequencer.ErrTokensExhausted) {
		return "has no token left below 2^63"
	}
	for _, code := range []string{"NOAUTH", "ERR Protocol error: unauthenticated", "WRONGPASS", "ERR DB index"} {
		if redisRefused(err, code) {
			return "refuses fenced's connection"
		}
	}
	if redisACLRefused(err) {
		return "refuses fenced's connection"
	}
	return "refuses writes"
}

// BackendHint is what an operator does about err, a failure of a
// backend's check, and whether the backend answered with a refusal (it
// is reachable, and a setting is what to fix). fenced logs it when a
// backend is not ready at start.
func BackendHint(err error) (hint string, refused bool) {
	return backendHint(backendOf(err), err)
}

// redisRefused reports whether err carries Redis's error reply with code.
func redisRefused(err error, code string) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), code+" ")
}

// redisACLRefused: the ACL user may not run a command or touch a key. A
// command refused inside a script is no NOPERM on Redis 7.0 but "ERR The
// user executing the script can't …", and was taken for a Redis that does
// not answer (docs/design.md, defect 211).
func redisACLRefused(err error) bool {
	return redisRefused(err, "NOPERM") || redisRefused(err, "ERR The user executing the script can't")
}

// noSpaceHint is what an operator does when etcd's database reached its
// space quota: etcd then refuses every write until the alarm is disarmed,
// and history is what fills it (docs/design.md, "Bounded state").
const noSpaceHint = "etcd's database reached its space quota (alarm NOSPACE) and etcd refuses every write: " +
	"compact its history (etcdctl compact), defragment it (etcdctl defrag), disarm the alarm (etcdctl alarm disarm), " +
	"and keep less history (--auto-compaction-retention; fenced's embedded etcd keeps a minute)"

// tokensExhaustedHint: no token is left below 2^63 (fence.MaxToken) above
// the floor, or this fenced saw token 2^63-1. etcd answers; no waiting
// mends it, and nothing lowers a floor (docs/design.md, "Keys and tokens").
const tokensExhaustedHint = "the tokens below 2^63 are used up under this --etcd-prefix (the token floor in etcd, or a token this fenced saw, reached 2^63-1, " +
	"the largest a signed 64-bit column holds) and retrying does not help: nothing lowers a floor. To issue tokens again, give every fenced a new " +
	"--etcd-prefix or a new etcd cluster, reset the fences that admitted a token near 2^63, and restart every fenced, since each remembers the " +
	"highest token it saw (fenced admin floor shows the floor)"

// noLeaderHint: the etcd member fenced asked has no leader, and fenced
// found no other that had one (it asks the next member when there is one,
// defect 107).
const noLeaderHint = "etcd has no leader where fenced asked: the cluster lost its quorum, or the member is cut off from its peers " +
	"(an election takes a second or two); check every member (etcdctl endpoint status --cluster), give fenced every member " +
	"in --etcd-endpoints so that it can ask another, and mind that a node with an embedded member asks its own only"

// redisOOMHint: Redis reached maxmemory with the noeviction policy, which
// is the right one for leases (an evicting policy may drop a held one).
const redisOOMHint = "Redis reached its maxmemory and refuses every write (OOM): raise maxmemory or free memory in that Redis; " +
	"keep maxmemory-policy noeviction, since an evicting policy can drop a held lease"

// redisReadOnlyHint: fenced's address reaches a replica, as after a
// failover that moved the primary elsewhere.
const redisReadOnlyHint = "the Redis at fenced's address is a read-only replica (READONLY), as after a failover: " +
	"point --redis-addr at the primary, or give --redis-sentinel-addrs and --redis-master to follow failovers"

// Redis answered and refused fenced's connection: a setting of fenced's
// or of Redis's is wrong, and "check that Redis is reachable", which it
// is, sent the operator to the network (docs/design.md, defect 195).
const (
	redisNoAuthHint = "Redis wants a password (NOAUTH) and fenced gave none: set --redis-password (better FENCED_REDIS_PASSWORD, " +
		"out of ps) to Redis's requirepass, and --redis-username for an ACL user"
	redisWrongPassHint = "Redis refused fenced's user name or password (WRONGPASS): check --redis-username and --redis-password " +
		"(FENCED_REDIS_PASSWORD) against Redis's requirepass or ACL user (ACL LIST), and that the user is on"
	redisNoPermHint = "the Redis ACL user fenced logs in as (--redis-username) may not run a command or touch a key fenced needs (NOPERM): " +
		"give it the rules the README lists under \"Redis ACL\" (lock.RedisACLRules: the keys and channels under --redis-prefix and the commands of fenced's scripts) with ACL SETUSER; ACL LOG says what was refused"
	redisDBHint = "Redis has no database of the number fenced selects (ERR DB index): set --redis-db below Redis's databases " +
		"setting (redis-cli CONFIG GET databases; 16 by default), or raise databases in redis.conf"
)

// backendOf names the backend that failed: "redis", "etcd", "redlock", or
// "Redis or etcd" when the error does not say.
func backendOf(err error) string {
	var be *lock.BackendError
	if errors.As(err, &be) {
		return be.Backend
	}
	return "Redis or etcd"
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request, _ string) {
	writeJSON(w, http.StatusOK, statusResponse{Status: "ok"})
}

// readyz answers within the ready timeout (a probe's own timeout is
// usually one second). Only the log and authenticated callers learn what
// failed in detail: the error may name backend addresses.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request, _ string) {
	if s.draining() {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: "not ready: fenced is shutting down"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.readyTimeout)
	defer cancel()
	start := time.Now()
	if err := s.ready(ctx); err != nil {
		if r.Context().Err() != nil {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: "request cancelled before the readiness check finished"})
			return
		}
		s.metrics.backendErrors.WithLabelValues(opReady).Inc()
		backend := backendOf(err)
		took := time.Since(start)
		hint, refused := backendHint(backend, err)
		what := "not ready: a backend does not answer"
		if refused {
			what = "not ready: " + backend + " " + refusal(err)
		}
		s.log.LogAttrs(r.Context(), slog.LevelWarn, what,
			slog.String("backend", backend), slog.String("took", took.Round(time.Microsecond).String()),
			slog.Bool("timed_out", ctx.Err() != nil), slog.Any("err", err),
			slog.String("hint", hint))
		// The details may name backend addresses: only for those allowed.
		details := true
		if tokens := s.tokens.Load(); tokens != nil {
			_, aerr := tokens.authenticate(r)
			details = aerr == nil
		}
		msg := s.notReady(backend, err, hint, refused, details, ctx.Err() != nil)
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: codeUnavailable, message: msg})
		return
	}
	writeJSON(w, http.StatusOK, statusResponse{Status: "ok"})
}

// notReady is /readyz's message when backend failed its check with err:
// what refuses writes and what to do about it, or what failed; err itself
// only with details (it may name addresses).
func (s *Server) notReady(backend string, err error, hint string, refused, details, timedOut bool) string {
	switch {
	case refused && details:
		return fmt.Sprintf("not ready: %s %s: %v; %s", backend, refusal(err), err, hint)
	case refused:
		return fmt.Sprintf("not ready: %s %s; %s", backend, refusal(err), hint)
	case details:
		return fmt.Sprintf("not ready: %v", err)
	case timedOut:
		return fmt.Sprintf("not ready: %s did not answer within %s; the fenced log has the details", backend, s.readyTimeout)
	}
	return fmt.Sprintf("not ready: %s failed; the fenced log has the details", backend)
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, _ string) {
	s.metricsHandler.ServeHTTP(w, r)
}
