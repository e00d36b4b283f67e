package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fenced/fenced/api"
)

// TestScopedTokens: a token limited to prefixes and permissions gets a 403
// that says what it may do; an unknown token a 401; SetTokens swaps the set
// for the next request.
func TestScopedTokens(t *testing.T) {
	const (
		admin = "admin-token-0123456789"
		ci    = "ci-token-0123456789abc"
		prom  = "prom-token-0123456789a"
	)
	toks, err := ParseTokens([]byte(admin + "\n" +
		ci + "  name=ci  prefixes=build:,deploy:  allow=acquire,inspect\n" +
		prom + " name=prometheus allow=metrics\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, backends(t)[1].store, func(c *Config) { c.Tokens = toks })
	as := func(tok string) *env { c := *e; c.bearer = tok; return &c }

	// ci: its prefixes, its permissions.
	l := as(ci).mustAcquire("build:web", `{"ttl_ms":5000}`)
	if r := as(ci).do("POST", "/v1/locks/build:web/refresh", `{"lease_id":"`+l.LeaseID+`"}`); r.status != http.StatusOK {
		t.Fatalf("ci refresh: %d %s", r.status, r.body)
	}
	if st := as(ci).state("build:web"); !st.Held {
		t.Fatalf("ci inspect: %+v", st)
	}
	for _, c := range []struct {
		tok, method, path, body string
		want                    []string
		field                   string
	}{
		{ci, "POST", "/v1/locks/prod:db/acquire", `{}`, []string{`token "ci" may not acquire lock "prod:db"`, `"build:" or "deploy:"`}, api.FieldName},
		{ci, "POST", "/v1/locks/prod:db/release", `{"lease_id":"` + l.LeaseID + `"}`, []string{`may not release lock "prod:db"`}, api.FieldName},
		{ci, "GET", "/v1/locks/prod:db", ``, []string{`may not inspect lock "prod:db"`}, api.FieldName},
		{ci, "GET", "/metrics", ``, []string{`token "ci" may not read metrics: its permissions are acquire,inspect`}, ""},
		{prom, "POST", "/v1/locks/build:web/acquire", `{}`, []string{`token "prometheus" may not acquire: its permissions are metrics`}, ""},
	} {
		r := as(c.tok).do(c.method, c.path, c.body)
		msg := r.errCode(t, http.StatusForbidden, codeForbidden)
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s %s: message %q, want it to say %q", c.method, c.path, msg, w)
			}
		}
		var eb api.ErrorBody
		r.decode(t, &eb)
		if eb.Error.Field != c.field {
			t.Errorf("%s %s: field %q, want %q", c.method, c.path, eb.Error.Field, c.field)
		}
		if strings.Contains(string(r.body), c.tok) {
			t.Errorf("a 403 shows the token: %s", r.body)
		}
	}
	if st := as(admin).state("build:web"); !st.Held || st.Token != l.Token {
		t.Fatalf("a forbidden release touched the lock: %+v", st)
	}
	if r := as(prom).do("GET", "/metrics", ""); r.status != http.StatusOK {
		t.Fatalf("prometheus /metrics: %d", r.status)
	}
	mfs := as(admin).scrape()
	if v := metric(mfs, "fenced_auth_refused_total", "code", "forbidden"); v != 5 {
		t.Errorf("fenced_auth_refused_total{code=forbidden} %v, want 5", v)
	}

	// A new set: ci's token is gone, a new one works at once.
	const next = "next-token-0123456789ab"
	if err := e.srv.SetTokens(fullAccess(t, admin, next)); err != nil {
		t.Fatal(err)
	}
	as(ci).do("GET", "/v1/locks/build:web", "").errCode(t, http.StatusUnauthorized, codeUnauthenticated)
	if st := as(next).state("build:web"); !st.Held {
		t.Fatalf("new token: %+v", st)
	}
	if err := e.srv.SetTokens(nil); err == nil {
		t.Fatal("SetTokens(nil) accepted: it would open the API")
	}
	if v := metric(as(admin).scrape(), "fenced_auth_refused_total", "code", "unauthenticated"); v != 1 {
		t.Errorf("fenced_auth_refused_total{code=unauthenticated} %v, want 1", v)
	}
}
