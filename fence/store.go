package fence

import (
	"context"
	"errors"
	"fmt"
)

// ErrStale is matched (with errors.Is) by every error that rejects a write
// because its token is lower than the highest the resource has admitted.
var ErrStale = errors.New("fence: stale token")

// ErrInvalidResource is matched by the error of a store that cannot hold a
// resource name: PostgreSQL text, for one, holds no NUL byte and only valid
// UTF-8, and the fence table's key about 2,700 bytes at most. Asking again
// cannot succeed; Middleware answers it 400.
var ErrInvalidResource = errors.New("fence: invalid resource")

// StaleError says which token was rejected and what the resource had seen.
type StaleError struct {
	Resource string
	Token    Token // the token that was rejected
	Highest  Token // the highest token the resource has admitted
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale token %d for %q: highest admitted is %d", e.Token, e.Resource, e.Highest)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// IsStale reports whether err rejects a stale token.
func IsStale(err error) bool { return errors.Is(err, ErrStale) }

// Store admits tokens per resource.
//
// Admit atomically admits t for resource if t is greater than or equal to the
// highest token admitted for it, and records t as the highest. Otherwise it
// returns an error that matches ErrStale (a *StaleError). A token outside 1
// to MaxToken is rejected with an error matching ErrInvalidToken, whether or
// not the store could hold it: admitted, a token above MaxToken would make
// every token fenced issues stale. A resource name the store cannot hold is
// rejected with an error matching ErrInvalidResource.
type Store interface {
	Admit(ctx context.Context, resource string, t Token) error
}
