package server

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

// Elections (docs/design.md, "Leader election"): a campaign is an acquire
// of the election's lock whose owner is the leader's value; the leader
// refreshes and resigns through the lock's refresh and release. Only a
// server whose leases are in etcd holds elections.

// opCampaign names a campaign in 403 answers; it counts in
// fenced_acquisitions_total, its invalid requests too (countInvalid), and
// its lease store failures as acquire's (grant); the leader read's as
// opLeader.
const opCampaign = "campaign"

// electable answers a 400 when this server's leases are in Redis.
func (s *Server) electable(w http.ResponseWriter) bool {
	if s.locks.Electable() {
		return true
	}
	writeError(w, invalid("", "elections need etcd leases, and this server keeps its leases in Redis, where a failover can forget a leader's lease "+
		"and two candidates would then lead at once; hold elections on a fenced serve with --lease-store etcd, or a fenced dev without --redis-addr"))
	return false
}

func (s *Server) campaign(w http.ResponseWriter, r *http.Request, name string) {
	req, ok := decodeBody(s, w, r, opCampaign, s.limits.decodeCampaign)
	if !ok {
		return
	}
	if !s.electable(w) {
		s.countInvalid(opCampaign)
		return
	}
	s.grant(w, r, name, req, true)
}

// leader answers who leads: at once, or, with after_token and wait_ms,
// once the term differs from after_token or wait_ms has passed (a long
// poll: an observer in any language follows the terms with one request
// each).
func (s *Server) leader(w http.ResponseWriter, r *http.Request, name string) {
	q, aerr := query(r) // ServeHTTP checked it (route.checkQuery)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var (
		after   fence.Token
		waitFor bool
		wait    time.Duration
	)
	if v, ok := q[fieldAfter]; ok {
		// Up to fence.MaxToken, as the spec's int64 says: no term is above it.
		t, err := strconv.ParseUint(v[0], 10, 64)
		if err != nil || fence.Token(t) > fence.MaxToken {
			writeError(w, invalid(fieldAfter, fmt.Sprintf("after_token %s: want the token of the term to wait past, an integer from 0 to %d (0: wait until someone leads)", excerpt([]byte(v[0])), fence.MaxToken)))
			return
		}
		after, waitFor = fence.Token(t), true
	}
	if v, ok := q[fieldWaitMs]; ok {
		if wait, aerr = s.limits.wait([]byte(v[0])); aerr != nil {
			writeError(w, aerr)
			return
		}
		if !waitFor {
			writeError(w, invalid(fieldWaitMs, "wait_ms needs after_token: the term to wait past (the token of the last answer; 0 to wait until someone leads)"))
			return
		}
	}
	if !s.electable(w) {
		return
	}
	ctx, cancel := s.waitContext(r, wait)
	defer cancel() // also ends the observer
	start := time.Now()
	fail := func(err error) {
		aerr, _ := s.failure(r, ctx, opLeader, name, start, err)
		writeError(w, aerr)
	}
	if !waitFor || wait == 0 {
		st, err := s.locks.Inspect(ctx, name)
		if err != nil {
			fail(err)
			return
		}
		writeJSON(w, http.StatusOK, api.NewLeader(lock.LeaderOf(st)))
		return
	}
	ch, err := s.locks.Observe(ctx, name)
	if err != nil {
		fail(err)
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	cur, ok := <-ch // Observe has read it: it comes at once
	for ok && cur.Token == after {
		var l lock.Leader
		select {
		case l, ok = <-ch:
			if ok {
				cur = l
			}
		case <-timer.C:
			writeJSON(w, http.StatusOK, api.NewLeader(cur))
			return
		}
	}
	if !ok { // ctx ended (the client went away, or the backend hung), or the lock client closed
		fail(cmp.Or(ctx.Err(), lock.ErrClosed))
		return
	}
	writeJSON(w, http.StatusOK, api.NewLeader(cur))
}
