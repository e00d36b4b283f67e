package server

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
)

// Error codes of the v1 API (package api), the "code" of
// {"error":{"code","message","field"}}.
const (
	codeInvalidArgument      = api.CodeInvalidArgument
	codeUnauthenticated      = api.CodeUnauthenticated
	codeForbidden            = api.CodeForbidden
	codeNotFound             = api.CodeNotFound
	codeMethodNotAllowed     = api.CodeMethodNotAllowed
	codeHeld                 = api.CodeHeld
	codeLost                 = api.CodeLost
	codeOutOfOrder           = api.CodeOutOfOrder
	codePayloadTooLarge      = api.CodePayloadTooLarge
	codeUnsupportedMediaType = api.CodeUnsupportedMediaType
	codeUnavailable          = api.CodeUnavailable
)

// The fields an error can name (package api).
const (
	fieldName      = api.FieldName
	fieldTTLMs     = api.FieldTTLMs
	fieldWaitMs    = api.FieldWaitMs
	fieldLeaseID   = api.FieldLeaseID
	fieldOwner     = api.FieldOwner
	fieldHolder    = api.FieldHolder
	fieldUnfair    = api.FieldUnfair
	fieldWaiter    = api.FieldWaiter
	fieldFinal     = api.FieldFinal
	fieldReleaseID = api.FieldReleaseID
	fieldSeq       = api.FieldSeq
	fieldPrefix    = api.FieldPrefix
	fieldLimit     = api.FieldLimit
	fieldCursor    = api.FieldCursor
	fieldValue     = api.FieldValue
	fieldAfter     = api.FieldAfterToken
	fieldToken     = api.FieldToken
	fieldPath      = api.FieldPath
)

// apiError is an error the API reports to the caller as is.
type apiError struct {
	status  int
	code    api.ErrorCode
	message string
	field   string // the request field refused, or ""
	// waited and position: a 409 after wait_ms (api.Error's WaitedMs and
	// Position); waited < 0 when not set.
	waited   time.Duration
	position int
	wait     bool
	// maxWait, on a 400 about a wait_ms out of range, is the server's
	// longest wait (api.Error's MaxWaitMs); 0 when not set.
	maxWait time.Duration
	// heldBy, on the 409 of a force-release with a token, is the token
	// that holds the lock instead (api.Error's Token); nil when not set.
	heldBy *fence.Token
	// maybeReleased, on the 410 of a release, is api.Error's
	// MaybeReleased; nil when not set.
	maybeReleased *bool
}

func (e *apiError) Error() string { return string(e.code) + ": " + e.message }

// invalid is a 400 about field ("" for the body as a whole).
func invalid(field, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: codeInvalidArgument, message: msg, field: field}
}

// writeJSON writes v with status. API responses carry lease ids, so they
// are never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only our own response types are marshalled
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encoding the response failed"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// retryAfter is the Retry-After of every 503: a backend that failed or
// timed out, or a server shutting down, is worth trying again soon (on
// another node, or this one).
const retryAfter = "1"

func writeError(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfter)
	}
	body := api.Error{Code: e.code, Message: e.message, Field: e.field}
	if e.wait {
		ms, pos := e.waited.Milliseconds(), e.position
		body.WaitedMs, body.Position = &ms, &pos
	}
	if e.maxWait > 0 {
		ms := e.maxWait.Milliseconds()
		body.MaxWaitMs = &ms
	}
	body.Token = e.heldBy
	body.MaybeReleased = e.maybeReleased
	writeJSON(w, e.status, api.ErrorBody{Error: body})
}
