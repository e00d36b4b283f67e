// Package server is the HTTP handler of the fenced daemon: the v1 JSON API,
// specified in api/openapi.yaml, over a [lock.Client], plus health,
// readiness and Prometheus metrics. A test keeps the routes and the
// document in step; docs/design.md ("Operating under faults") explains
// its timeouts and readiness.
//
//	POST /v1/locks/{name}/acquire  {"ttl_ms":N,"wait_ms":N}  → {"name","lease_id","token","ttl_ms"}
//	POST /v1/locks/{name}/refresh  {"lease_id","ttl_ms","seq"} → {"name","lease_id","token","ttl_ms"}
//	POST /v1/locks/{name}/release  {"lease_id"}              → {}
//	GET  /v1/locks/{name}                                    → {"name","held","token","ttl_ms",…}
//	GET  /v1/locks?prefix=&limit=&cursor=                    → {"locks":[…],"next_cursor"}
//	DELETE /v1/locks/{name}?token=                           → the state it had (force-release; with token, only that grant's, else 409)
//	POST /v1/elections/{name}/campaign {"ttl_ms","wait_ms","value"} → a lease; its token is the term
//	GET  /v1/elections/{name}?after_token=&wait_ms=          → {"name","leading","value","token"}
//	GET  /healthz, /readyz, /metrics
//
// An election is the lock of its name, held by the leader: it refreshes
// and resigns through the lock's refresh and release. Only a server whose
// leases are in etcd holds elections; on Redis leases they are a 400.
//
// Build one with [New] and serve it with any [net/http.Server]:
//
//	srv, err := server.New(server.Config{Locks: client})
//	if err != nil { … }
//	http.ListenAndServe(addr, srv)
//
// # Leases and lease ids
//
// Acquire takes the lease with [lock.WithDetached]: the server keeps no
// goroutine per lease, and the remote holder refreshes and releases it by
// its lease id ([lock.Client.RefreshID], [lock.Client.ReleaseID]). The lease
// id is the holder's secret: only acquire and refresh return it, to the
// holder; GET /v1/locks/{name} never does. Nor does the API ever show
// acquire's "holder", the reentrant holder identity: an acquire with it
// returns the lease id of the lock it holds, so it is a secret too (GET,
// the list and force-release show the owner label and the count). The
// token is a JSON number; pass it to the protected resource with every
// write (package fence). ttl_ms in a response is the TTL really granted.
// wait_ms 0 (the default) makes one attempt; a larger value waits up to
// that long for the holder to release or expire, and then answers 409
// held.
//
// # Requests
//
// Bodies are one JSON object with exactly the documented fields (spelled
// exactly, each once, nothing after the object); integers are plain JSON
// integers (no fraction, exponent, quotes or null). An empty body is an
// empty object: acquire then uses Config.DefaultTTL and wait_ms 0, and a
// refresh without ttl_ms asks for Config.DefaultTTL too. Content-Type may
// be missing or application/json (charset utf-8 if any), or curl -d's
// application/x-www-form-urlencoded, whose body is still read as JSON;
// anything else is 415. A body over Config.MaxBodyBytes is 413. Lock names are 1 to 200
// characters of A-Z a-z 0-9 . _ - : ([lock.ValidateName]); the path is not
// cleaned, so a name with "/" or "%2F" is a 400, and no invalid request
// touches a key in Redis or etcd. Every route under /v1/locks and
// /v1/elections takes only its documented query parameters, each once:
// the list's, the force-release's token and the leader's long poll; none
// for acquire, refresh, release, campaign and GET of a lock, which take
// their arguments in the JSON body (?wait_ms= on an acquire is a 400, not
// an acquire that does not wait). A query string that [net/url.ParseQuery]
// refuses (a bad %-escape, a ';') is a 400 as a whole, never served with
// the pairs it could read. /healthz, /readyz, /metrics and
// /v1/openapi.yaml ignore theirs.
//
// # Errors
//
// Every error is {"error":{"code":"…","message":"…","field":"…"}}
// ([api.ErrorBody]) with one of these codes: invalid_argument (400),
// unauthenticated (401, with WWW-Authenticate: Bearer), forbidden (403),
// not_found (404), method_not_allowed (405, with Allow), held (409),
// out_of_order (409: a refresh whose seq is below one of the same lease
// fenced applied first; not applied, the lease still held), lost (410:
// the lease id does not hold the lease), payload_too_large (413),
// unsupported_media_type (415) and unavailable (503: Redis or etcd failed or
// did not answer within Config.BackendTimeout, or the server is shutting
// down). field names the part of the request refused (name, ttl_ms,
// wait_ms, lease_id), so that clients decide by code and field, never by
// the message.
//
// When a request's context ends before the lease store answers (the
// client went away), the server logs it at debug level, counts it as
// "cancelled" (and as status 499 in fenced_http_requests_total and the
// request log), not as a backend error, and answers 503 unavailable,
// which only a client still listening (a server whose base context ended)
// can see. A lease taken for a client that went away is released at once,
// unless the acquire carried a waiter id and a copy of the request, on
// this server or another, was handed the grant already (the store tells,
// lock.UnhandedReleaser; a store that cannot keeps it), or the grant was
// one found again: then the waiter's next request, on any server, is
// handed it, and the client's give-up (a final request) or the TTL ends
// it.
//
// [Server.Drain], for a server about to shut down, ends every wait at
// once: an acquire or campaign with wait_ms, and an election long poll,
// in progress or arriving later, answers 503 unavailable ("fenced is
// shutting down") with Retry-After, so that its client tries another node
// rather than be cut off when the shutdown's grace ends; GET /readyz
// answers 503. Requests that do not wait are served as before. fenced
// calls Drain when net/http's Server.Shutdown begins.
//
// A wait_ms that runs out is a 409 only if the lock was seen held; if Redis
// or etcd did not answer in that time, it is a 503. Within wait_ms, a
// backend that is briefly down (no etcd leader, a Redis restarting) is
// tried again rather than answered with a 503 at once.
//
// # Authentication
//
// With Config.Tokens set, every path but GET /healthz, GET /readyz (probes)
// and GET /v1/openapi.yaml needs Authorization: Bearer <token>, /metrics
// included. Tokens are compared by SHA-256 digest in constant time against
// every configured token; an unknown one is a 401. Each token has
// [Permission]s (acquire, with refresh and release; inspect; force-release;
// metrics) and may be limited to lock names starting with given prefixes,
// as etcd's roles and Consul's ACLs limit credentials to key prefixes: a
// known token that may not do what it asks is a 403 forbidden that names
// the token (never its secret) and says what it may do. [LoadTokens] reads
// them from a file (one token per line has every permission, as before;
// name=, prefixes= and allow= narrow it), and [Server.SetTokens] replaces
// them while the server runs (fenced reloads the file on SIGHUP).
//
// # Metrics
//
//	fenced_acquisitions_total{result="acquired|held|invalid|error|cancelled|shutting_down|in_progress|ttl_too_short"}
//	fenced_acquire_duration_seconds          histogram, waiting included
//	fenced_tokens_issued_total               not a reentry or a grant found again
//	fenced_active_leases                     gauge, see below
//	fenced_refreshes_total{result="refreshed|lost|out_of_order|invalid|error|cancelled"}
//	fenced_releases_total{result="released|lost|invalid|error|cancelled"}
//	fenced_leases_lost_total                 refresh or release answered 410
//	fenced_backend_errors_total{op="acquire|refresh|release|inspect|list|force_release|leader|ready"}
//	fenced_http_requests_total{route,code}   route is the OpenAPI path
//	fenced_http_request_duration_seconds{route}
//	fenced_waiters                           acquire requests with wait_ms > 0 in progress
//	fenced_auth_refused_total{code="unauthenticated|forbidden"}
//
// Campaigns count in fenced_acquisitions_total, and a leader's
// resignation (a release) in fenced_releases_total. Result "error" is the
// lease store's failure alone (it counts in fenced_backend_errors_total
// too, and FencedAcquireErrors alerts on it); the 503s the store did not
// cause have their own: shutting_down (Drain ended a wait, or the server
// is closing: every rolling restart has some), in_progress (an earlier
// request of the same waiter is still taking the lock; ask again) and
// ttl_too_short (the grant came back with no validity left: a TTL below
// the store's latency). "invalid" is a request refused before the lease
// store, by its name, query string or body, on every route of the three
// counters; reads and force-release count in none of them.
//
// fenced_active_leases counts leases acquired through this server that it
// has not seen released, lost or force-released and whose TTL has not run
// out since their last acquire or refresh through it. A refresh extends a
// lease counted and adds none: a lease acquired through another fenced
// node is that node's to count, and a refresh answered after a release or
// a loss of its lease does not bring the lease back. Expired entries are
// dropped lazily, when the gauge is read and on acquire, by no goroutine.
// A lease released through another fenced node stays counted here until
// its TTL runs out. A lease its reentrant holder acquired more than once
// counts until a release frees the lock: after each release of one, the
// server reads the lock's state.
package server
