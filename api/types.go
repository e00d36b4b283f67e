package api

import (
	"net/http"

	"github.com/fenced/fenced/fence"
)

// The wire types of the v1 API, as openapi.yaml in this directory
// specifies them. Package server writes them and package client reads them;
// server's tests check that their JSON fields are the document's.

// AcquireRequest is the body of POST /v1/locks/{name}/acquire. A missing
// field takes the server's default: ttl_ms its default TTL (30s), wait_ms 0
// (one attempt).
type AcquireRequest struct {
	TTLMs  *int64 `json:"ttl_ms,omitempty"`
	WaitMs *int64 `json:"wait_ms,omitempty"`
	// Owner is a label for people (1 to 128 bytes of printable UTF-8),
	// shown by GET and list.
	Owner string `json:"owner,omitempty"`
	// Holder makes the acquisition reentrant: an acquire by the holder
	// that holds the lock now gets its lease id and token again, and the
	// lock takes one more release to be freed. So it is a credential, as
	// good as the lease id: the API never shows it, and a caller picks an
	// unguessable value (random per process, say) and never logs it.
	Holder string `json:"holder,omitempty"`
	// Unfair takes a free lock whoever waits longer, rather than joining
	// the queue (wait_ms > 0 only; one attempt is always unfair).
	Unfair bool `json:"unfair,omitempty"`
	// Waiter names one acquisition, the same in every request of it (32
	// lowercase hex digits, new for each): a request sent again after a lost answer
	// gets the grant the first one made. A fair waiting one's is also its
	// place in the queue, so that a wait longer than one request keeps it.
	Waiter string `json:"waiter,omitempty"`
	// Final says this request is the acquisition's last (its wait ends
	// the caller's): if it ends held, the place is given up at once, not
	// kept 3 s for a next request (with waiter, on a fair waiting
	// request only).
	Final bool `json:"final,omitempty"`
}

// CampaignRequest is the body of POST /v1/elections/{name}/campaign. As
// AcquireRequest: a missing ttl_ms takes the server's default TTL, a
// missing wait_ms makes one attempt.
type CampaignRequest struct {
	TTLMs  *int64 `json:"ttl_ms,omitempty"`
	WaitMs *int64 `json:"wait_ms,omitempty"`
	// Value is what observers see of the leader, such as its address (1
	// to 128 bytes of printable UTF-8).
	Value string `json:"value,omitempty"`
	// Waiter is as in AcquireRequest: the candidate's place in the queue
	// across the requests of one campaign.
	Waiter string `json:"waiter,omitempty"`
	// Final is as in AcquireRequest.
	Final bool `json:"final,omitempty"`
}

// Leader is the answer to GET /v1/elections/{name}: who leads, with which
// term (its token). Token is 0 and Value empty when nobody leads.
type Leader struct {
	Name    string      `json:"name"`
	Leading bool        `json:"leading"`
	Value   string      `json:"value,omitempty"`
	Token   fence.Token `json:"token"`
}

// RefreshRequest is the body of POST /v1/locks/{name}/refresh. A missing
// ttl_ms asks for the server's default TTL.
type RefreshRequest struct {
	LeaseID string `json:"lease_id"`
	TTLMs   *int64 `json:"ttl_ms,omitempty"`
	// Seq orders the lease's refreshes: 1 to MaxSeq, higher with each
	// refresh (the same when one is sent again). fenced applies none
	// below the highest it applied and answers 409 out_of_order: a
	// refresh delayed on its way cannot shorten a lease a later one
	// extended. Missing: unordered, as before seq existed.
	Seq *uint64 `json:"seq,omitempty"`
}

// MaxSeq is the highest RefreshRequest.Seq: 2^53-1, the highest integer
// every JSON parser reads exactly.
const MaxSeq = 1<<53 - 1

// ReleaseRequest is the body of POST /v1/locks/{name}/release.
type ReleaseRequest struct {
	LeaseID string `json:"lease_id"`
	// ReleaseID identifies this release across its retries (32 lowercase
	// hex digits, new for each release, the same when it is sent again): a
	// reentrant lock loses one hold per release id, so a retry after a
	// lost answer cannot free a lock another hold still has.
	ReleaseID string `json:"release_id,omitempty"`
}

// Lease is the answer to acquire and refresh: a held lease. TTLMs is the
// TTL the lease store really granted.
type Lease struct {
	Name    string      `json:"name"`
	LeaseID string      `json:"lease_id"`
	Token   fence.Token `json:"token"`
	TTLMs   int64       `json:"ttl_ms"`
	// Count is how many releases the lock takes to be freed, when a
	// reentrant holder acquired a lock it held (2 or more); omitted for 1,
	// and by refresh.
	Count int `json:"count,omitempty"`
	// WaitedMs, on an acquire or campaign that waited, is how long the
	// server waited before the attempt that granted the lease (a lower
	// bound). The lease's validity runs from then: a client adds it to
	// the time it sent the request. Omitted when 0, and by refresh.
	WaitedMs int64 `json:"waited_ms,omitempty"`
	// Reused, on an acquire or campaign, says the lease is a hold that
	// existed before this acquisition, with the token issued then: a
	// holder's reentry, or the grant made for an earlier request of the
	// same waiter whose answer was lost (lock.Lease.Reused). Omitted when
	// false, and by refresh.
	Reused bool `json:"reused,omitempty"`
}

// LockState is the answer to GET /v1/locks/{name}. It never carries the
// lease id, nor the reentrant holder identity, which gets the lease id
// from acquire. Token and TTLMs are 0 when the lock is not held.
type LockState struct {
	Name  string      `json:"name"`
	Held  bool        `json:"held"`
	Token fence.Token `json:"token"`
	TTLMs int64       `json:"ttl_ms"`
	// Owner is the acquisition's label for people; Count the releases to
	// go, when above 1. Omitted when not set, or free.
	Owner string `json:"owner,omitempty"`
	Count int    `json:"count,omitempty"`
	// LastToken, for a free lock, is the token of the lease that held it
	// last, while the store still remembers; omitted when it does not.
	LastToken fence.Token `json:"last_token,omitempty"`
	// Waiters is how many wait in the lock's queue; OldestWaitMs how long
	// the one at its head has waited.
	Waiters      int   `json:"waiters"`
	OldestWaitMs int64 `json:"oldest_wait_ms"`
}

// LockList is the answer to GET /v1/locks: one page of held locks, in no
// promised order. NextCursor, when not empty, asks for the next page.
type LockList struct {
	Locks      []LockState `json:"locks"`
	NextCursor string      `json:"next_cursor,omitempty"`
}

// Empty is the answer to release: {}.
type Empty struct{}

// Status is the answer of GET /healthz and /readyz when they succeed.
type Status struct {
	Status string `json:"status"` // "ok"
}

// ErrorBody is every error answer: {"error":{"code","message"[,"field"]}}.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Error says what went wrong. Clients decide by Code and Field, never by
// Message, which is for people.
type Error struct {
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
	// Field is the part of the request that was refused: one of the Field
	// constants. Empty when the request as a whole was (a body that is not
	// JSON, a missing token).
	Field string `json:"field,omitempty"`
	// WaitedMs and Position, on a 409 after wait_ms: how long the caller
	// waited, and its place in the lock's queue when it gave up (1 is the
	// head; 0 when it had none, as with unfair).
	WaitedMs *int64 `json:"waited_ms,omitempty"`
	Position *int   `json:"position,omitempty"`
	// MaxWaitMs, on a 400 about a wait_ms out of range (one beyond int64
	// included), is the longest wait the server allows (its --max-wait),
	// so that a client can ask for that instead.
	MaxWaitMs *int64 `json:"max_wait_ms,omitempty"`
	// Token, on the 409 of DELETE /v1/locks/{name}?token=N, is the token
	// of the grant that holds the lock instead (0 while a Redis
	// acquisition has not recorded its token yet): nothing was released.
	Token *fence.Token `json:"token,omitempty"`
	// MaybeReleased, on the 410 of a release: true when the store cannot
	// tell this "not held" from the answer to an earlier release of the
	// same lease, whose answer was lost (it may have freed the lock);
	// false when it is sure the lease was gone before this release
	// (expired, force-released, lost to a Redis restart). Absent from
	// servers before it, which a client takes as true.
	MaybeReleased *bool `json:"maybe_released,omitempty"`
}

// Fields of a request that an Error can name.
const (
	FieldName      = "name"       // the lock name in the path
	FieldTTLMs     = "ttl_ms"     // the TTL
	FieldWaitMs    = "wait_ms"    // the wait
	FieldLeaseID   = "lease_id"   // the lease id
	FieldOwner     = "owner"      // the owner label
	FieldHolder    = "holder"     // the reentrant holder identity
	FieldUnfair    = "unfair"     // the unfair flag
	FieldWaiter    = "waiter"     // the acquisition, and its place in the queue, across requests
	FieldFinal     = "final"      // the last request of a waiter
	FieldReleaseID = "release_id" // a release's id across its retries
	FieldSeq       = "seq"        // a refresh's sequence number
	FieldPrefix    = "prefix"     // list: the name prefix
	FieldLimit     = "limit"      // list: the page size
	FieldCursor    = "cursor"     // list: the cursor
	FieldValue     = "value"      // campaign: the leader's value
	FieldPath      = "path"       // a path the API does not have (404)
	// FieldAfterToken is the term GET /v1/elections/{name} waits past.
	FieldAfterToken = "after_token"
	// FieldToken is the token DELETE /v1/locks/{name}?token=N releases
	// the lock for, and no other.
	FieldToken = "token"
)

// ErrorCode is the code of an Error. Each has one HTTP status.
type ErrorCode string

// The error codes of the v1 API.
const (
	CodeInvalidArgument      ErrorCode = "invalid_argument"       // 400: a bad lock name, body, ttl_ms, wait_ms or lease id
	CodeUnauthenticated      ErrorCode = "unauthenticated"        // 401: a missing or unknown bearer token
	CodeForbidden            ErrorCode = "forbidden"              // 403: the token may not do this to this lock
	CodeNotFound             ErrorCode = "not_found"              // 404: no such path, or force-release of a lock not held
	CodeMethodNotAllowed     ErrorCode = "method_not_allowed"     // 405
	CodeHeld                 ErrorCode = "held"                   // 409: another holder has the lease
	CodeOutOfOrder           ErrorCode = "out_of_order"           // 409: a refresh with a higher seq was applied first
	CodeLost                 ErrorCode = "lost"                   // 410: this lease id does not hold the lease
	CodePayloadTooLarge      ErrorCode = "payload_too_large"      // 413
	CodeUnsupportedMediaType ErrorCode = "unsupported_media_type" // 415
	CodeUnavailable          ErrorCode = "unavailable"            // 503: a backend failed, or the server is shutting down
)

// ErrorCodes lists every code, in the order of their statuses.
var ErrorCodes = []ErrorCode{
	CodeInvalidArgument, CodeUnauthenticated, CodeForbidden, CodeNotFound, CodeMethodNotAllowed,
	CodeHeld, CodeOutOfOrder, CodeLost, CodePayloadTooLarge, CodeUnsupportedMediaType, CodeUnavailable,
}

// Status is the HTTP status of the code; 0 for a code this package does
// not know (a newer server's).
func (c ErrorCode) Status() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeHeld, CodeOutOfOrder:
		return http.StatusConflict
	case CodeLost:
		return http.StatusGone
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return 0
}
