package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Token is a fencing token. Zero means "no token" and is never admitted.
// Tokens fenced issues lie in 1 to MaxToken.
type Token uint64

// MaxToken is the largest token: 2^63-1, so that every token fits a signed
// 64-bit column (a Postgres bigint, a Java long).
const MaxToken Token = 1<<63 - 1

// String returns the token in decimal, the form used in headers and logs.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// ErrInvalidToken is returned when a token is missing, zero or not a decimal
// number.
var ErrInvalidToken = errors.New("fence: invalid token")

// ParseToken parses a token in decimal: 1 to 20 digits (leading zeros are
// accepted, so a zero-padded 20-digit form parses), no sign, no spaces, with
// a value from 1 to MaxToken (2^63-1). Every error says what is allowed, as
// Middleware sends it to the writer in its 400.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty; want 1 to 20 digits, a decimal number from 1 to %d", ErrInvalidToken, MaxToken)
	}
	if len(s) > 20 {
		return 0, fmt.Errorf("%w: %d characters; want at most 20 digits, a decimal number from 1 to %d", ErrInvalidToken, len(s), MaxToken)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %q is not a decimal number; want digits only, 1 to %d", ErrInvalidToken, s, MaxToken)
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || Token(v) > MaxToken {
		return 0, fmt.Errorf("%w: %q is out of range; want a decimal number from 1 to %d", ErrInvalidToken, s, MaxToken)
	}
	if v == 0 {
		return 0, fmt.Errorf("%w: 0 means no token; want 1 to %d", ErrInvalidToken, MaxToken)
	}
	return Token(v), nil
}

type ctxKey struct{}

// WithToken returns a copy of ctx that carries t.
func WithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

// FromContext returns the token carried by ctx, if any.
func FromContext(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(ctxKey{}).(Token)
	return t, ok && t != 0
}
