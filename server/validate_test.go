package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/fenced/fenced/api"
)

// spec is api/openapi.yaml loaded and validated (examples included) by
// kin-openapi, and a router of its operations.
var spec = sync.OnceValues(func() (*specDoc, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData([]byte(api.Spec()))
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("api/openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	// Route by path alone: the document's server is "/", and the tests'
	// servers listen on random ports.
	routed := *doc
	routed.Servers = nil
	router, err := legacy.NewRouter(&routed)
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	// The status of each error code, as the description of ErrorCode
	// states it: "invalid_argument 400, unauthenticated 401, ...".
	codes := doc.Components.Schemas["ErrorCode"].Value
	statusOf := map[string]int{}
	for _, m := range codeStatus.FindAllStringSubmatch(codes.Description, -1) {
		statusOf[m[1]], _ = strconv.Atoi(m[2])
	}
	for _, c := range codes.Enum {
		if statusOf[c.(string)] == 0 {
			return nil, fmt.Errorf("api/openapi.yaml: ErrorCode %s: its description states no status", c)
		}
		if want := api.ErrorCode(c.(string)).Status(); statusOf[c.(string)] != want {
			return nil, fmt.Errorf("api/openapi.yaml: ErrorCode %s has status %d, package api says %d", c, statusOf[c.(string)], want)
		}
	}
	return &specDoc{doc: doc, router: router, statusOf: statusOf}, nil
})

var codeStatus = regexp.MustCompile(`([a-z_]+) ([1-5][0-9][0-9])`)

type specDoc struct {
	doc      *openapi3.T
	router   routers.Router
	statusOf map[string]int // error code → status
}

func loadSpec(t testing.TB) *specDoc {
	t.Helper()
	s, err := spec()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validating wraps h, the server under test, so that every response it
// writes is checked against api/openapi.yaml with kin-openapi's
// openapi3filter: a documented status, a body and headers that match its
// schema, and an error code that matches the status. A response that does
// not is a test error, reported from the handler's goroutine with
// t.Errorf.
func validating(t *testing.T, h http.Handler) http.Handler {
	s := loadSpec(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &capture{ResponseWriter: w, header: w.Header()}
		h.ServeHTTP(c, r)
		if c.status == 0 {
			c.status = http.StatusOK
		}
		if err := s.check(r, c.status, c.header, c.body.Bytes()); err != nil {
			t.Errorf("%s %s answered %d %q, not as api/openapi.yaml says: %v", r.Method, r.URL.RequestURI(), c.status, excerpt(c.body.Bytes()), err)
		}
	})
}

// check validates one response to r.
func (s *specDoc) check(r *http.Request, status int, header http.Header, body []byte) error {
	route, params, err := s.router.FindRoute(r)
	if err != nil {
		// Not an operation of the document: a path it does not list, a
		// method the path does not allow, or a lock name with a slash.
		// The answer must be a documented error.
		switch status {
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound, http.StatusMethodNotAllowed:
		default:
			return fmt.Errorf("no operation of the document (%v), and status %d is not 400, 401, 404 or 405", err, status)
		}
		if r.Method == http.MethodHead {
			return nil
		}
		return s.checkError(status, header, body)
	}
	op := route.Operation
	if op.Responses.Status(status) == nil {
		return fmt.Errorf("%s %s does not document status %d", route.Method, route.Path, status)
	}
	if r.Method == http.MethodHead {
		// openapi3filter skips HEAD; its responses document no body.
		if len(op.Responses.Status(status).Value.Content) != 0 {
			return fmt.Errorf("HEAD %s documents a body for %d", route.Path, status)
		}
		return nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return err
	}
	if status >= 400 {
		return s.checkError(status, header, body)
	}
	return nil
}

// checkError validates an error response against the Error schema and the
// status of its code.
func (s *specDoc) checkError(status int, header http.Header, body []byte) error {
	if ct := header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("error Content-Type %q, want application/json", ct)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("error body: %w", err)
	}
	if err := s.doc.Components.Schemas["Error"].Value.VisitJSON(v); err != nil {
		return fmt.Errorf("error body: %w", err)
	}
	code := v.(map[string]any)["error"].(map[string]any)["code"].(string)
	if want := s.statusOf[code]; want != status {
		return fmt.Errorf("error code %s with status %d; the document's ErrorCode says %d", code, status, want)
	}
	return nil
}

// capture passes a response through and keeps its status, header and
// body.
type capture struct {
	http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (c *capture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// TestValidatingCatchesWrongResponses shows that the wrapper of every
// server test fails a response that breaks the document.
func TestValidatingCatchesWrongResponses(t *testing.T) {
	s := loadSpec(t)
	lease := `{"name":"a","lease_id":"` + "0123456789abcdef0123456789abcdef" + `","token":1796211888717416,"ttl_ms":1000}` + "\n"
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	for _, c := range []struct {
		method, path string
		status       int
		header       http.Header
		body         string
		ok           bool
	}{
		{"POST", "/v1/locks/a/acquire", 200, jsonCT, lease, true},
		{"POST", "/v1/locks/a/acquire", 200, jsonCT, `{"name":"a","lease_id":"xyz","token":1,"ttl_ms":1000}`, false},
		{"POST", "/v1/locks/a/acquire", 200, jsonCT, `{"name":"a","lease_id":"0123456789abcdef0123456789abcdef","token":0,"ttl_ms":1000}`, false},
		{"POST", "/v1/locks/a/acquire", 200, jsonCT, `{"name":"a","lease_id":"0123456789abcdef0123456789abcdef","token":1,"ttl_ms":1000,"extra":1}`, false},
		{"POST", "/v1/locks/a/acquire", 410, jsonCT, `{"error":{"code":"lost","message":"x"}}`, false},
		{"POST", "/v1/locks/a/acquire", 409, jsonCT, `{"error":{"code":"lost","message":"x"}}`, false},
		{"POST", "/v1/locks/a/acquire", 409, jsonCT, `{"error":{"code":"held","message":"x"}}`, true},
		{"POST", "/v1/locks/a/acquire", 409, jsonCT, `{"error":{"code":"held"}}`, false},
		{"GET", "/v1/locks/a", 200, jsonCT, `{"name":"a","held":false,"token":0,"ttl_ms":0}`, true},
		{"GET", "/v1/locks/a", 200, http.Header{"Content-Type": {"text/plain"}}, `{"name":"a","held":false,"token":0,"ttl_ms":0}`, false},
		{"HEAD", "/v1/locks/a", 200, jsonCT, ``, true},
		{"HEAD", "/v1/locks/a", 409, jsonCT, ``, false},
		{"GET", "/nowhere", 404, jsonCT, `{"error":{"code":"not_found","message":"x"}}`, true},
		{"GET", "/nowhere", 200, jsonCT, `{"status":"ok"}`, false},
		{"GET", "/nowhere", 404, jsonCT, `{"error":{"code":"held","message":"x"}}`, false},
	} {
		r, err := http.NewRequest(c.method, "http://fenced"+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = s.check(r, c.status, c.header, []byte(c.body))
		if (err == nil) != c.ok {
			t.Errorf("%s %s %d %s: %v, want valid %v", c.method, c.path, c.status, c.body, err, c.ok)
		}
	}
}
