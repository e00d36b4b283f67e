package server

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
)

// TestBackendErrorOpsDocumented: with etcd down, every route that reaches
// the lease store fails, and every op label of fenced_backend_errors_total
// that counts it is one doc.go and the metric's help list, exported from
// the start. The list and force-release counted under "list locks" and
// "force-release", and the leader read under "leader", none of them listed.
func TestBackendErrorOpsDocumented(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`fenced_backend_errors_total\{op="([^"]+)"\}`).FindSubmatch(src)
	if m == nil {
		t.Fatal(`doc.go lists no fenced_backend_errors_total{op="…"}`)
	}
	documented := strings.Split(string(m[1]), "|")

	es, err := lock.NewEtcdStore(etcdDown(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es.Close() })
	e := newEnv(t, es, func(c *Config) { c.BackendTimeout = 200 * time.Millisecond })
	id := strings.Repeat("a", 32)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/locks/x/acquire", `{"ttl_ms":1000}`},
		{"POST", "/v1/locks/x/refresh", `{"lease_id":"` + id + `"}`},
		{"POST", "/v1/locks/x/release", `{"lease_id":"` + id + `"}`},
		{"GET", "/v1/locks/x", ""},
		{"GET", "/v1/locks?prefix=x", ""},
		{"DELETE", "/v1/locks/x", ""},
		{"GET", "/v1/elections/x", ""},
		{"POST", "/v1/elections/x/campaign", `{"ttl_ms":1000}`},
		{"GET", "/readyz", ""},
	} {
		e.do(c.method, c.path, c.body).errCode(t, http.StatusServiceUnavailable, codeUnavailable)
	}
	mf := e.scrape()["fenced_backend_errors_total"]
	if mf == nil {
		t.Fatal("fenced_backend_errors_total not exported")
	}
	got := map[string]float64{}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "op" {
				got[lp.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	for op, v := range got {
		if !slices.Contains(documented, op) {
			t.Errorf("fenced_backend_errors_total{op=%q} = %v: not in doc.go's list %v", op, v, documented)
		}
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(op) + `\b`).MatchString(mf.GetHelp()) {
			t.Errorf("op %q not in the metric's help: %q", op, mf.GetHelp())
		}
	}
	for _, op := range documented {
		v, ok := got[op]
		if !ok {
			t.Errorf("fenced_backend_errors_total{op=%q} not exported from the start", op)
		}
		want := 1.0
		if op == "acquire" {
			want = 2 // and the campaign
		}
		if v != want {
			t.Errorf("fenced_backend_errors_total{op=%q} = %v, want %v", op, v, want)
		}
	}
}
