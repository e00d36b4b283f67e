// Package client is a Go client of the fenced HTTP API (api/openapi.yaml).
//
// [Client] implements [lock.Locker] with [lock.Option]s, and its [Lease] is
// [lock.Lease] itself (refreshed and released through the API by lease
// id), so code moves between the embedded lock package and the fenced
// service by changing only how it builds its Locker:
//
//	c, err := client.New("http://127.0.0.1:7070", client.WithBearerToken(tok))
//	if err != nil { … }
//	defer c.Close(ctx)
//	var locks lock.Locker = c // or a *lock.Client
//	lease, err := locks.Acquire(ctx, "invoice-42", 10*time.Second, lock.WithKeepAlive())
//	if err != nil { … }
//	defer lease.Release(ctx)
//	err = db.Write(lease.Context(), lease.Token(), …) // the resource admits the token
//
// # Waiting
//
// [Client.Acquire] lets the server wait for a held lock: each request asks
// for wait_ms up to [WithMaxRequestWait] (30s by default, within the
// server's default --max-wait of 60s) and is repeated until the lease is
// granted, the [lock.WithWait] budget runs out, or the context ends. A
// server whose --max-wait is shorter refuses that wait with the longest it
// allows ([APIError.MaxWait], the API's max_wait_ms): the client asks for
// that at once, and from then on, for [Client.Elect] and [Client.Observe]
// too, so the two settings need not be matched by hand. An Acquire's
// requests carry one waiter id (the API's "waiter", drawn once per
// acquisition, or [lock.WithWaiter]'s), so the wait keeps its place in the
// lock's queue from one request to the next. A TryAcquire's and an unfair
// Acquire's requests carry one too, with no place in the queue: it names
// the acquisition, so that a request sent again after a lost answer gets
// the grant the first one made (see "Several servers").
// [Client.TryAcquire] makes one attempt. An option that does not apply is
// an error matching [lock.ErrInvalidOption], as with lock.Client; so is
// [lock.WithRetry], since the server, not the client, waits.
//
// A lease granted after a wait is valid from the attempt that granted it:
// the answer says how long the server waited before it (waited_ms), and
// the client counts from its send time plus that.
//
// # Elections
//
// [Client.Elect] and [Client.Observe] implement [lock.Elector] through
// POST /v1/elections/{name}/campaign and long polls of
// GET /v1/elections/{name}; the server must keep its leases in etcd (else
// the error matches [lock.ErrElectionStore]). Observe asks a server whose
// --max-wait refuses its long poll's wait for less, and closes its channel
// (ctx still alive) when a server refuses the poll for good (a 4xx such
// as 401 or 403): calling Observe again then returns the refusal.
//
// # Several servers
//
// [New] takes several base URLs, separated by commas, of fenced servers
// that share their Redis and etcd (as etcd's client takes its endpoints).
// A request goes to the server that answered last; when that server cannot
// be reached or answers 503 unavailable, the client moves to the next, and
// stays there. Another 5xx, or an answer that is not fenced's own (a
// proxy's 502 or 504 page, with no API error code; a 2xx other than 200),
// counts as a 503 does:
// it may come after fenced acted on the request, so it is no decision, and
// a grant made meanwhile comes back only to a request sent again with its
// waiter (docs/design.md, defect 119). One 503 is a decision: an
// acquire's on ttl_ms (its grant came back with no validity left and was
// released: lock.ErrTTLTooShort), which is not sent again; a wait asks
// again as after a held lock. Whether a request is sent again depends on
// what it does:
//
//   - Refresh, release, inspect and list are safe to repeat (a release
//     repeated by its own lease id succeeds), so they move on after any
//     failure to get an answer. On etcd leases only the server that
//     released a lease remembers it, so a release whose answer was lost and
//     that is sent again to another server is answered 410 lost. Before the
//     lease's deadline nothing but a release or a force-release takes a
//     lease away, so Release counts that answer as released (the error it
//     would be carries [lock.ErrSentAgain]); after the deadline it returns
//     ErrLost. (Before, it returned ErrLost for a lease its first request
//     had released, docs/design.md defect 97.)
//   - TryAcquire is a short request, repeated as a refresh is: after any
//     failure to get an answer it moves on, and round the servers again up
//     to [WithRetries] times. Its waiter id makes a request sent again
//     after a lost answer get the grant the first one made, from any
//     server over the same Redis or etcd: the same lease id and token.
//     (Before, it returned the lost answer's error, and the lease it may
//     have taken held the lock, known to nobody, until its TTL.)
//   - ForceRelease without options moves on only when its request was
//     never written to a connection: not after a lost answer, and not
//     after a 503 either, which a server answers too when its backend
//     applied the force-release and then timed out, or a proxy's page. Sent again, it would
//     delete whatever holds the lock by then, most often the waiter the
//     first one woke, or find the lock free and say "not held" of a lock
//     it released. It returns the error, which says the lock may have
//     been released. With [lock.IfToken] it releases only the grant with
//     that token, and is sent again as a release is: a second request
//     finds the lock free or held by another token, and deletes nothing.
//   - Acquire, which waits anyway, moves on after a lost answer too, and
//     with a single server asks it again while its wait (WithWait or the
//     context's deadline) has time left. Its requests carry its waiter id,
//     so a lease granted unseen comes back with the next request, from any
//     server over the same Redis or etcd: the same lease id and token.
//     (Before, such a lease held the lock until its TTL ran out.) Without
//     a deadline, Acquire returns the error at once. Each request asks
//     only for the wait that is left, the next server's too, and none is
//     sent once the wait is over: a wait over several servers lasts no
//     longer than its budget. An unfair Acquire ([lock.WithUnfair]) goes
//     the same way: its waiter id has no place in the queue, but finds its
//     grant.
//
// When every server failed, the error joins a [*ServerError] per server.
//
// When every server failed a request without deciding it (each answered
// 503 or another answer that is no decision, could not be reached, or lost
// the answer to a request that may be sent again), the client pauses and goes round again, up to
// [WithRetries] times (2 by default): the server's Retry-After (at most
// 1s) or 100ms, then 200ms, each with jitter, all within the context.
// This holds for a single server too, or a load balancer in front of
// several, where a node that drains or a backend that fails over answers
// 503 for a moment. It applies to TryAcquire, Refresh, Release, Inspect,
// List, ForceRelease (with [lock.IfToken] only; without, an unsent request
// only) and Leader. A waiting Acquire or Elect and Observe's long polls
// ride out failures within their wait instead, as above.
//
// # Servers that stop answering
//
// A server that takes a request and never answers (a partition that
// delivers nothing, a stopped or wedged process) is not a refused
// connection: only a bound on the request ends it. The client sets these
// bounds, and a request that outlives one fails with an error matching
// [ErrNoAnswer] (never the context's DeadlineExceeded: the caller's
// context has not ended) and is passed on as after a lost answer:
//
//   - A request that asks the server to wait (a waiting Acquire's or
//     Elect's, an Observe long poll) must be answered within the wait it
//     asked for plus [WithAnswerGrace] (2s by default). So a [lock.WithWait]
//     budget holds, overrun by at most the grace, even when the context has
//     no deadline. When that budget is spent waiting on a server that did
//     not answer, no other server is asked (the wait is over) and the error
//     matches ErrNoAnswer, not [lock.ErrNotAcquired]: nobody said the lock
//     was held. A budget longer than one request's wait goes on with the
//     next server, asking for the wait that is left.
//   - With several servers, a refresh, release, inspect or list gives
//     each server but the last half of the time left
//     before its context's deadline. A keep-alive refresh's deadline is the
//     lease's own, so a server that hangs takes at most half of it and the
//     next one refreshes the lease in time, while a server that is only
//     slow (a loaded node) still has the larger part. (A share of the time
//     left divided by the servers left cut a loaded but healthy node off
//     too soon: with three servers and a 1 s TTL, a refresh had 0.2 s.)
//   - Observe's first request, a read of who leads now, must be answered
//     within the grace: its context is the whole observation's, so the
//     caller could not bound it otherwise.
//   - A TryAcquire, a force-release, and a refresh, release or read whose
//     context has no deadline are bounded by the context only: give them
//     a deadline.
//
// # Losing a lease
//
// A lease is valid until [Lease.Deadline]: the granted TTL from when the
// acquire or refresh request was sent, less the drift allowance of 1% of
// the TTL plus 2ms, as in package lock. With [lock.WithKeepAlive] a
// timer, owned by the lease and stopped by [Lease.Release] or
// [Client.Close], refreshes it every TTL/3. When a refresh is answered 410
// lost, or the deadline passes without a successful refresh, [Lease.Done]
// closes and [Lease.Context] is cancelled, once; [Lease.Err] says why. A
// refresh that fails for another reason (network, 503 from every server)
// is retried until the deadline; but not one that fails on a TLS
// certificate ([ErrCertificate], [ErrClientCertificate], at every
// server): no refresh can get through before the deadline, and the lease
// is lost at once, its Err matching [lock.ErrLost] and the certificate's
// error, saying that the server holds the lock until its TTL runs out. A
// Release that fails so says the same: nothing reached the server.
//
// # Errors
//
// The errors match the lock package's sentinels, so errors.Is works the
// same for both: a held lock is [lock.ErrNotAcquired], a lease id that no
// longer holds the lease [lock.ErrLost], a bad name or TTL
// [lock.ErrInvalidName] or [lock.ErrInvalidTTL] (checked before any
// request), a closed client [lock.ErrClosed]. Every answer of the server
// other than 200 is an [*APIError] with its status, code and field, mapped
// to those sentinels by code and field, never by message text. Only a 4xx
// or 5xx has a code: another 2xx is not fenced's (its one success is 200)
// but something's in front of it, an answer without a code, which counts
// as a proxy's page does ("Several servers") whatever its body says. So is a
// redirect (3xx), which fenced never sends: something in front of it (an
// ingress that sends http:// to https://) answered, and the client follows
// no redirect, which for a 301 to 303 would turn a DELETE or a POST into a
// GET (a force-release into an inspect, that reported success). Its
// APIError has no code and names the URL to point the client at; nothing
// was applied, and the request is sent neither again nor to the next
// server. A server certificate the client does not trust (signed by a CA
// not given with [WithTLSConfig], or not issued for the URL's host) fails
// at the first handshake with an error matching [ErrCertificate] that says
// so and what to do: every handshake would fail alike, so it is neither
// sent again nor waited out, and nothing was applied; with several
// servers that one is passed over, as one that cannot be reached. So is a
// server that requires a client certificate (mutual TLS, fenced serve
// --tls-client-ca) and refuses the client's, or its lack of one: an error
// matching [ErrClientCertificate] that says to give the client a
// certificate the server accepts (WithTLSConfig, a tls.Config whose
// Certificates holds it with its key). Under TLS 1.3 the server's refusal
// comes after the request was written, but the server read none of it:
// nothing was applied. Both errors match [lock.ErrCannotSend], by which a
// lease's keep-alive knows to give up, unless an earlier attempt of the
// same request may have reached a server (its answer lost): then it may
// have been applied. When the context ends, the error
// matches ctx.Err().
package client
