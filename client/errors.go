package client

import (
	"fmt"
	"strings"

	"github.com/fenced/fenced/lock"
)

// Error codes of the v1 API that this package gives a meaning to.
const (
	CodeInvalidArgument = "invalid_argument"
	CodeUnauthenticated = "unauthenticated"
	CodeHeld            = "held"
	CodeLost            = "lost"
	CodeUnavailable     = "unavailable"
)

// APIError is an error answer of the fenced server:
// {"error":{"code","message"}} with its HTTP status. A body that is not in
// that form (a proxy's error page, say) gives an APIError with an empty
// Code and an excerpt of the body as Message.
//
// It matches the lock package's sentinel errors where the code has the same
// meaning, so errors.Is works as it does with an embedded lock.Client:
// held is lock.ErrNotAcquired, lost is lock.ErrLost, and an
// invalid_argument about the lock name, the TTL or the lease id is
// lock.ErrInvalidName, lock.ErrInvalidTTL or lock.ErrInvalidLeaseID.
type APIError struct {
	Status  int    // HTTP status code
	Code    string // the API's error code, e.g. "held", "lost", "unauthenticated"
	Message string // the server's explanation
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("fenced answered HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("fenced answered %s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// Unwrap returns the lock sentinel error that the code stands for, or nil.
func (e *APIError) Unwrap() error {
	switch e.Code {
	case CodeHeld:
		return lock.ErrNotAcquired
	case CodeLost:
		return lock.ErrLost
	case CodeInvalidArgument:
		switch {
		case strings.Contains(e.Message, lock.ErrInvalidName.Error()), strings.HasPrefix(e.Message, "lock name"):
			return lock.ErrInvalidName
		case strings.HasPrefix(e.Message, "ttl_ms"), strings.Contains(e.Message, lock.ErrInvalidTTL.Error()):
			return lock.ErrInvalidTTL
		case strings.HasPrefix(e.Message, "lease_id"), strings.Contains(e.Message, lock.ErrInvalidLeaseID.Error()):
			return lock.ErrInvalidLeaseID
		}
	}
	return nil
}
