package server

import (
	"net/http"
	"slices"
	"sort"
	"testing"
)

// TestRouteQueryMatchesDocument: what each route takes in its query
// string is what api/openapi.yaml documents, and a route that reads no
// query string (anyQuery) documents no 400 that could refuse one.
func TestRouteQueryMatchesDocument(t *testing.T) {
	doc := loadSpec(t).doc
	for _, rt := range routes {
		op := doc.Paths.Find(rt.pattern).GetOperation(rt.method)
		if op == nil {
			t.Fatalf("%s %s: not in the document", rt.method, rt.pattern)
		}
		var documented []string
		for _, p := range op.Parameters {
			if p.Value.In == "query" {
				documented = append(documented, p.Value.Name)
			}
		}
		sort.Strings(documented)
		served := slices.Sorted(slices.Values(rt.query))
		if !slices.Equal(documented, served) {
			t.Errorf("%s %s: query parameters %q documented, %q served", rt.method, rt.pattern, documented, served)
		}
		if rt.anyQuery && (len(rt.query) > 0 || op.Responses.Status(http.StatusBadRequest) != nil) {
			t.Errorf("%s %s ignores its query string, but documents parameters or a 400", rt.method, rt.pattern)
		}
		if !rt.anyQuery && op.Responses.Status(http.StatusBadRequest) == nil {
			t.Errorf("%s %s refuses a query string, but documents no 400", rt.method, rt.pattern)
		}
	}
}
