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

	"github.com/fenced/fenced/internal/testenv"
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
		op := doc.Paths[rt.pattern][strings.ToLower(rt.method)]
		open := op.Security != nil && len(*op.Security) == 0
		if open != rt.open {
			t.Errorf("%s: open %v in the document, %v in the server", rt.pattern, open, rt.open)
		}
		if _, ok := op.Responses["401"]; ok == rt.open {
			t.Errorf("%s: 401 documented %v, but open %v", rt.pattern, ok, rt.open)
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
		{"Lease", jsonFields(leaseResponse{})},
		{"LockState", jsonFields(stateResponse{})},
		{"Status", jsonFields(statusResponse{})},
	} {
		if got := fields(c.schema); !slices.Equal(got, c.want) {
			t.Errorf("schema %s has %q, the server %q", c.schema, got, c.want)
		}
	}
	if got, want := sorted(doc.Components.Schemas["ErrorCode"].Enum), sorted(errorCodes); !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum %q, the server's codes %q", got, want)
	}

	// Each documented operation answers a plain request with a status it
	// documents.
	e := newEnv(t, backends(t)[1].store, nil)
	name := testenv.Name(t)
	id := strings.Repeat("a", 32)
	requests := map[string]struct{ body string }{
		"POST /v1/locks/{name}/acquire": {`{"ttl_ms":1000}`},
		"POST /v1/locks/{name}/refresh": {`{"lease_id":"` + id + `"}`},
		"POST /v1/locks/{name}/release": {`{"lease_id":"` + id + `"}`},
		"GET /v1/locks/{name}":          {},
		"GET /healthz":                  {},
		"GET /readyz":                   {},
		"GET /metrics":                  {},
	}
	for _, rt := range routes {
		req, ok := requests[rt.method+" "+rt.pattern]
		if !ok {
			t.Fatalf("no request for %s %s", rt.method, rt.pattern)
		}
		r := e.do(rt.method, strings.ReplaceAll(rt.pattern, "{name}", name), req.body)
		op := doc.Paths[rt.pattern][strings.ToLower(rt.method)]
		if _, ok := op.Responses[strconv.Itoa(r.status)]; !ok || r.status == http.StatusNotFound {
			t.Errorf("%s %s answered %d %s, not documented", rt.method, rt.pattern, r.status, r.body)
		}
	}
}
