package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Header is the HTTP header that carries a fencing token, in decimal.
const Header = "Fencing-Token"

// SetHeader sets the Fencing-Token header to t.
func SetHeader(h http.Header, t Token) { h.Set(Header, t.String()) }

// TokenFromHeader parses the Fencing-Token header. A missing, repeated,
// zero or malformed header is an error that matches ErrInvalidToken.
func TokenFromHeader(h http.Header) (Token, error) {
	vs := h.Values(Header)
	switch len(vs) {
	case 0:
		return 0, fmt.Errorf("%w: missing %s header; want one, a decimal number from 1 to %d", ErrInvalidToken, Header, MaxToken)
	case 1:
		return ParseToken(vs[0])
	default:
		return 0, fmt.Errorf("%w: %d %s headers; want exactly one", ErrInvalidToken, len(vs), Header)
	}
}

// Transport is an http.RoundTripper that sets the Fencing-Token header from
// the token carried by the request's context (see WithToken), unless the
// request already has one. Header names are case-insensitive: a value put
// in the map under another spelling (h["fencing-token"]) counts as one.
type Transport struct {
	Base http.RoundTripper // nil means http.DefaultTransport
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if tok, ok := FromContext(r.Context()); ok && !hasToken(r.Header) {
		r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
		if r.Header == nil {
			// Clone keeps a nil Header nil; a request built by hand may have one.
			r.Header = make(http.Header)
		}
		// An empty value under another spelling would still be sent: the
		// resource would see two headers and answer 400.
		for k := range r.Header {
			if strings.EqualFold(k, Header) {
				delete(r.Header, k)
			}
		}
		SetHeader(r.Header, tok)
	}
	return base.RoundTrip(r)
}

// hasToken reports whether h has a non-empty Fencing-Token value under any
// spelling of the name. Header.Get looks up the canonical key only, and the
// client sends every key of the map: a second header under the canonical
// key would make the request invalid.
func hasToken(h http.Header) bool {
	for k, vs := range h {
		if strings.EqualFold(k, Header) && len(vs) > 0 && vs[0] != "" {
			return true
		}
	}
	return false
}

// Middleware guards an HTTP handler with a fence. For each request it reads
// the Fencing-Token header, admits the token to store for the resource named
// by resource(r), and only then calls next, with the token in the request's
// context (FromContext). A missing or malformed header, a token the store
// cannot represent (ErrInvalidToken) or a resource name it cannot hold
// (ErrInvalidResource) is a 400; a stale token (any store error matching
// ErrStale, a *StaleError or not) a 409; both
// carry a JSON body {"error":{"code":"invalid_argument"|"stale","message":"…"}}
// and next is not called. Any other error from the store is a 503.
//
// Requests for the same resource are serialised from the admit to the end of
// next, so that a request with a lower token cannot be admitted before a
// higher one and then write after it. Requests for different resources run
// in parallel. A request that waits for its turn stops waiting when its
// context ends (its client went away, a server timeout): it is answered
// 503 and not admitted. Over a *MemoryStore the turns are the store's own,
// shared by every Middleware over it and by its Do; over any other store
// each Middleware value has its own.
//
// A turn ends when next returns, so next must not return before its write
// has ended: no http.TimeoutHandler inside Middleware (it returns at its
// timeout while the handler it wraps goes on writing, and the next holder
// is admitted meanwhile), and no goroutine that writes after next returns.
// Put timeouts outside, http.TimeoutHandler(Middleware(store, resource)(h),
// d, msg): the client is answered at the timeout, the request keeps its
// turn until h has ended, and requests waiting behind it give up at theirs.
//
// Tokens are not authenticated: the fence trusts the token a writer sends.
// Authenticate writers before the fence, in a handler outside Middleware. A
// wrong token far above the real ones (a bug, a hostile client) is admitted
// like any other and becomes the resource's highest, and every real holder
// is then refused 409 until that highest is lowered by hand. A MemoryStore
// forgets it when its process restarts (with every other highest). With
// the Postgres adapter, set the resource's row of the fence table to the
// token of the lock's current holder (fenced locks get shows it; schema and
// table are the Fence's, public.fence_tokens by default):
//
//	UPDATE public.fence_tokens SET token = 1796233619755456 WHERE resource = 'invoice-7';
//
// The serialisation holds inside one process only. The middleware alone is
// enough when this process is the only writer of the resource and its
// writes go through this Middleware (or, over a MemoryStore, through
// Middleware values and Do of that one store), to a store that nothing else
// writes. With several replicas, several handlers writing the same data, or
// writers that bypass this handler, a request admitted here can still write
// after a higher token was admitted elsewhere: the resource must then check
// the token inside its own write, atomically (a conditional update, or the
// Postgres adapter's admit in the same transaction). See docs/design.md,
// "Where the fence must be".
func Middleware(store Store, resource func(*http.Request) string) func(http.Handler) http.Handler {
	locks := new(keyedMutex)
	if ms, ok := store.(*MemoryStore); ok && ms != nil {
		// The store's own turns, so that its Do and other Middleware
		// values over it cannot write in between.
		locks = &ms.locks
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tok, err := TokenFromHeader(r.Header)
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_argument", err.Error(), nil)
				return
			}
			res := resource(r)
			unlock, err := locks.lock(r.Context(), res)
			if err != nil {
				// The request ended (its client went away, a server
				// timeout) while another of its resource ran: it was not
				// admitted.
				writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("fence: waiting for another request of %q: %v", res, err), nil)
				return
			}
			defer unlock()
			if err := store.Admit(r.Context(), res, tok); err != nil {
				var se *StaleError
				if errors.As(err, &se) {
					writeError(w, http.StatusConflict, "stale", se.Error(), se)
					return
				}
				// Stale all the same, from a store that says so without a
				// *StaleError (it cannot tell the highest): a 503 would
				// have the writer retry a token that can never be admitted
				// (docs/design.md, defect 122).
				if errors.Is(err, ErrStale) {
					writeError(w, http.StatusConflict, "stale", err.Error(), &StaleError{Token: tok})
					return
				}
				// A token or a resource name the store cannot hold: no
				// retry can succeed.
				if errors.Is(err, ErrInvalidToken) || errors.Is(err, ErrInvalidResource) {
					writeError(w, http.StatusBadRequest, "invalid_argument", err.Error(), nil)
					return
				}
				writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), nil)
				return
			}
			next.ServeHTTP(w, r.WithContext(WithToken(r.Context(), tok)))
		})
	}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Token   Token  `json:"token,omitempty"`
		Highest Token  `json:"highest,omitempty"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string, se *StaleError) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	if se != nil {
		b.Error.Token, b.Error.Highest = se.Token, se.Highest
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b) // the client has gone if this fails; nothing to do
}
