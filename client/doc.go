// Package client is a Go client of the fenced HTTP API (api/openapi.yaml).
//
// Its [Lease] is [lock.Lease] itself (adopted with [lock.Client.Adopt] and
// refreshed and released through the API), so code can move between the
// embedded lock package and the fenced service by changing how it builds
// its client:
//
//	c, err := client.New("http://127.0.0.1:7070", client.WithBearerToken(tok))
//	if err != nil { … }
//	defer c.Close(ctx)
//	lease, err := c.Acquire(ctx, "invoice-42", 10*time.Second, client.WithKeepAlive())
//	if err != nil { … }
//	defer lease.Release(ctx)
//	err = db.Write(lease.Context(), lease.Token(), …) // the resource admits the token
//
// # Waiting
//
// [Client.Acquire] lets the server wait for a held lock: each request asks
// for wait_ms up to [WithMaxRequestWait] (30s by default, within the
// server's default --max-wait of 60s) and is repeated until the lease is
// granted, the [WithWait] budget runs out, or the context ends.
// [Client.TryAcquire] makes one attempt.
//
// # Losing a lease
//
// A lease is valid until [Lease.Deadline]: the granted TTL from when the
// acquire or refresh request was sent, less the drift allowance of 1% of
// the TTL plus 2ms, as in package lock. With [WithKeepAlive] one goroutine,
// owned by the lease and stopped by [Lease.Release] or [Client.Close],
// refreshes it every TTL/3. When a refresh is answered 410 lost, or the
// deadline passes without a successful refresh, [Lease.Done] closes and
// [Lease.Context] is cancelled, once; [Lease.Err] says why. A refresh that
// fails for another reason (network, 503) is retried until the deadline.
//
// # Errors
//
// The errors match the lock package's sentinels, so errors.Is works the
// same for both: a held lock is [lock.ErrNotAcquired], a lease id that no
// longer holds the lease [lock.ErrLost], a bad name or TTL
// [lock.ErrInvalidName] or [lock.ErrInvalidTTL] (checked before any
// request), a closed client [lock.ErrClosed]. Every answer of the server
// other than 200 is an [*APIError] with its status, code and message.
// When the context ends, the error matches ctx.Err().
package client
