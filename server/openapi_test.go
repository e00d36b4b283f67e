package server

import (
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/getkin/kin-openapi/openapi3"
	"sigs.k8s.io/yaml"
)

// openAPI is the part of api/openapi.yaml the test checks.
type openAPI struct {
	Paths      map[string]map[string]operation `json:"paths"`
	Components struct {
		Schemas map[string]schema `json:"schemas"`
	} `json:"components"`
}

type operation struct {
	Security  *[]map[string][]string `json:"security"`
	Responses map[string]any         `json:"responses"`
}

type schema struct {
	Properties map[string]any `json:"properties"`
	Required   []string       `json:"required"`
	Enum       []string       `json:"enum"`
}

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	y, err := os.ReadFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	var doc openAPI
	if err := json.Unmarshal(j, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return doc
}

// TestOpenAPIMatchesRoutes checks that api/openapi.yaml documents exactly
// the routes the server serves, with the same fields and error codes, and
// that each documented operation answers with a documented status.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := loadOpenAPI(t)

	var served, documented []string
	for _, rt := range routes {
		served = append(served, rt.method+" "+rt.pattern)
		if rt.method == http.MethodGet {
			served = append(served, "HEAD "+rt.pattern)
		}
	}
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(served)
	sort.Strings(documented)
	if !slices.Equal(served, documented) {
		t.Fatalf("routes served %q, documented %q", served, documented)
	}

	for _, rt := range routes {
		methods := []string{rt.method}
		if rt.method == http.MethodGet {
			methods = append(methods, http.MethodHead)
		}
		for _, m := range methods {
			op := doc.Paths[rt.pattern][strings.ToLower(m)]
			open := op.Security != nil && len(*op.Security) == 0
			if open != (rt.perm == 0) {
				t.Errorf("%s %s: open %v in the document, %v in the server", m, rt.pattern, open, rt.perm == 0)
			}
			if _, ok := op.Responses["401"]; ok == open {
				t.Errorf("%s %s: 401 documented %v, but open %v", m, rt.pattern, ok, open)
			}
			if _, ok := op.Responses["403"]; ok == open {
				t.Errorf("%s %s: 403 documented %v, but open %v", m, rt.pattern, ok, open)
			}
			if _, ok := op.Responses["404"]; !ok {
				t.Errorf("%s %s: 404 not_found not documented", m, rt.pattern)
			}
		}
	}

	fields := func(s string) []string {
		var f []string
		for k := range doc.Components.Schemas[s].Properties {
			f = append(f, k)
		}
		sort.Strings(f)
		return f
	}
	jsonFields := func(v any) []string {
		var f []string
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			f = append(f, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
		}
		sort.Strings(f)
		return f
	}
	sorted := func(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }
	for _, c := range []struct {
		schema string
		want   []string
	}{
		{"AcquireRequest", sorted(acquireFields)},
		{"RefreshRequest", sorted(refreshFields)},
		{"ReleaseRequest", sorted(releaseFields)},
		{"CampaignRequest", sorted(campaignFields)},
		{"Leader", jsonFields(api.Leader{})},
		{"Lease", jsonFields(leaseResponse{})},
		{"LockList", jsonFields(api.LockList{})},
		{"LockState", jsonFields(stateResponse{})},
		{"Status", jsonFields(statusResponse{})},
		{"Error", jsonFields(api.ErrorBody{})},
	} {
		if got := fields(c.schema); !slices.Equal(got, c.want) {
			t.Errorf("schema %s has %q, the server %q", c.schema, got, c.want)
		}
	}
	var codes []string
	for _, c := range api.ErrorCodes {
		codes = append(codes, string(c))
	}
	if got, want := sorted(doc.Components.Schemas["ErrorCode"].Enum), sorted(codes); !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum %q, the server's codes %q", got, want)
	}

	// Each documented operation answers a plain request with a status it
	// documents; the env checks each answer against the document in full.
	e := newEnv(t, backends(t)[1].store, nil)
	name := testenv.Name(t)
	id := strings.Repeat("a", 32)
	requests := map[string]struct{ body string }{
		"POST /v1/locks/{name}/acquire":      {`{"ttl_ms":1000}`},
		"POST /v1/locks/{name}/refresh":      {`{"lease_id":"` + id + `"}`},
		"POST /v1/locks/{name}/release":      {`{"lease_id":"` + id + `"}`},
		"GET /v1/locks/{name}":               {},
		"DELETE /v1/locks/{name}":            {}, // a free lock: its documented 404
		"GET /v1/locks":                      {},
		"GET /healthz":                       {},
		"GET /readyz":                        {},
		"GET /metrics":                       {},
		"GET /v1/openapi.yaml":               {},
		"POST /v1/elections/{name}/campaign": {`{"ttl_ms":1000,"value":"a"}`},
		"GET /v1/elections/{name}":           {},
	}
	for _, rt := range routes {
		req, ok := requests[rt.method+" "+rt.pattern]
		if !ok {
			t.Fatalf("no request for %s %s", rt.method, rt.pattern)
		}
		methods := []string{rt.method}
		if rt.method == http.MethodGet {
			methods = append(methods, http.MethodHead)
		}
		for _, m := range methods {
			r := e.do(m, strings.ReplaceAll(rt.pattern, "{name}", name), req.body)
			op := doc.Paths[rt.pattern][strings.ToLower(m)]
			if _, ok := op.Responses[strconv.Itoa(r.status)]; !ok || r.status == http.StatusNotFound && rt != routeForce {
				t.Errorf("%s %s answered %d %s, not documented", m, rt.pattern, r.status, r.body)
			}
			if m == http.MethodHead && len(r.body) != 0 {
				t.Errorf("HEAD %s answered a body %q", rt.pattern, r.body)
			}
		}
	}
}

// TestOpenAPIDocument checks what the document promises beyond the routes:
// HEAD mirrors GET without a body, every operation has examples (valid
// against their schemas: kin-openapi validates them on load), and tokens
// are bounded as the server and the Postgres adapter bound them.
func TestOpenAPIDocument(t *testing.T) {
	doc := loadSpec(t).doc
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if method == http.MethodHead {
				get := item.Get
				if get == nil {
					t.Errorf("HEAD %s without GET", path)
					continue
				}
				if g, h := responseCodes(get), responseCodes(op); !slices.Equal(g, h) {
					t.Errorf("HEAD %s documents %q, GET %q", path, h, g)
				}
				for code, resp := range op.Responses.Map() {
					if len(resp.Value.Content) != 0 {
						t.Errorf("HEAD %s %s documents a body", path, code)
					}
				}
				continue
			}
			if op.RequestBody != nil {
				for ct, mt := range op.RequestBody.Value.Content {
					if mt.Example == nil && len(mt.Examples) == 0 {
						t.Errorf("%s %s: request %s has no example", method, path, ct)
					}
				}
			}
			for code, resp := range op.Responses.Map() {
				for ct, mt := range resp.Value.Content {
					if mt.Example == nil && len(mt.Examples) == 0 {
						t.Errorf("%s %s: response %s %s has no example", method, path, code, ct)
					}
				}
			}
		}
	}
	const maxToken = float64(1<<63 - 1)
	tok := doc.Components.Schemas["Token"].Value
	if tok.Min == nil || *tok.Min != 1 || tok.Max == nil || *tok.Max != maxToken || tok.Format != "int64" {
		t.Errorf("Token: minimum %v, maximum %v, format %q; want 1, 2^63-1, int64", tok.Min, tok.Max, tok.Format)
	}
	st := doc.Components.Schemas["LockState"].Value.Properties["token"].Value
	if st.Min == nil || *st.Min != 0 || st.Max == nil || *st.Max != maxToken {
		t.Errorf("LockState.token: minimum %v, maximum %v; want 0 (not held) and 2^63-1", st.Min, st.Max)
	}
}

func responseCodes(op *openapi3.Operation) []string {
	var codes []string
	for code := range op.Responses.Map() {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	return codes
}

// TestOpenAPIServed: GET /v1/openapi.yaml is the embedded document, open
// even when the API needs a bearer token.
func TestOpenAPIServed(t *testing.T) {
	tokens := [][]byte{[]byte("0123456789abcdef0123456789abcdef")}
	e := newEnv(t, backends(t)[1].store, func(c *Config) { c.Tokens = fullAccess(t, string(tokens[0])) })
	r := e.do("GET", "/v1/openapi.yaml", "")
	if r.status != http.StatusOK || string(r.body) != api.Spec() || r.header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("GET /v1/openapi.yaml: %d %s, %d bytes", r.status, r.header, len(r.body))
	}
	if _, err := openapi3.NewLoader().LoadFromData(r.body); err != nil {
		t.Fatalf("the served document does not load: %v", err)
	}
	r = e.do("HEAD", "/v1/openapi.yaml", "")
	if r.status != http.StatusOK || len(r.body) != 0 || r.header.Get("Content-Length") != strconv.Itoa(len(api.Spec())) {
		t.Fatalf("HEAD /v1/openapi.yaml: %d %s %q", r.status, r.header, r.body)
	}
	r = e.do("POST", "/v1/openapi.yaml", "")
	r.errCode(t, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	if r.header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("Allow %q", r.header.Get("Allow"))
	}
	e.do("GET", "/v1/locks/x", "").errCode(t, http.StatusUnauthorized, codeUnauthenticated)
	e.do("GET", "/v1/openapi.json", "").errCode(t, http.StatusUnauthorized, codeUnauthenticated)
	e.bearer = string(tokens[0])
	e.do("GET", "/v1/openapi.json", "").errCode(t, http.StatusNotFound, codeNotFound)
}
