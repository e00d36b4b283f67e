package server

import (
	"encoding/json"
	"net/http"
)

// Error codes of the v1 API, the "code" of {"error":{"code","message"}}.
// api/openapi.yaml lists the same set.
const (
	codeInvalidArgument      = "invalid_argument"       // 400
	codeUnauthenticated      = "unauthenticated"        // 401
	codeNotFound             = "not_found"              // 404
	codeMethodNotAllowed     = "method_not_allowed"     // 405
	codeHeld                 = "held"                   // 409
	codeLost                 = "lost"                   // 410
	codePayloadTooLarge      = "payload_too_large"      // 413
	codeUnsupportedMediaType = "unsupported_media_type" // 415
	codeUnavailable          = "unavailable"            // 503
)

// errorCodes is every code the server writes, for the OpenAPI test.
var errorCodes = []string{
	codeInvalidArgument, codeUnauthenticated, codeNotFound, codeMethodNotAllowed,
	codeHeld, codeLost, codePayloadTooLarge, codeUnsupportedMediaType, codeUnavailable,
}

// apiError is an error the API reports to the caller as is.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func invalid(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: codeInvalidArgument, message: msg}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
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
	writeJSON(w, e.status, errorBody{Error: errorDetail{Code: e.code, Message: e.message}})
}
