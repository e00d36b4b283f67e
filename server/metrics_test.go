package server

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetrics(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.store, nil)
			before := e.scrape()
			for _, name := range []string{"go_goroutines", "process_open_fds", "fenced_acquire_duration_seconds", "fenced_active_leases"} {
				if before[name] == nil {
					t.Errorf("%s missing from /metrics", name)
				}
			}
			for _, r := range []string{"acquired", "held", "invalid", "error", "cancelled"} {
				if _, ok := findMetric(before, "fenced_acquisitions_total", "result", r); !ok {
					t.Errorf("fenced_acquisitions_total{result=%q} not exported from the start", r)
				}
			}

			n1, n2 := testenv.Name(t), testenv.Name(t)
			a := e.mustAcquire(n1, `{"ttl_ms":30000}`)
			c := e.mustAcquire(n2, `{"ttl_ms":30000}`)
			e.acquire(n1, ``)               // held
			e.acquire(n1, `{"wait_ms":10}`) // held after a wait
			e.acquire(n1, `{"ttl_ms":"x"}`) // invalid
			e.acquire("a%2Fb", `{}`)        // invalid name
			e.do("POST", "/v1/locks/"+n1+"/refresh", `{"lease_id":"`+a.LeaseID+`"}`)
			e.do("POST", "/v1/locks/"+n1+"/refresh", `{"lease_id":"`+strings.Repeat("1", 32)+`"}`) // lost
			e.do("POST", "/v1/locks/"+n1+"/refresh", `{}`)                                         // invalid
			if r := e.release(n1, a.LeaseID); r.status != http.StatusOK {
				t.Fatalf("release: %d", r.status)
			}
			e.release(n1, a.LeaseID)               // released again: a success
			e.release(n1, strings.Repeat("2", 32)) // lost

			m := e.scrape()
			for _, c := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"fenced_acquisitions_total", []string{"result", "acquired"}, 2},
				{"fenced_acquisitions_total", []string{"result", "held"}, 2},
				{"fenced_acquisitions_total", []string{"result", "invalid"}, 2},
				{"fenced_acquisitions_total", []string{"result", "error"}, 0},
				{"fenced_acquire_duration_seconds", nil, 4},
				{"fenced_tokens_issued_total", nil, 2},
				{"fenced_refreshes_total", []string{"result", "refreshed"}, 1},
				{"fenced_refreshes_total", []string{"result", "lost"}, 1},
				{"fenced_refreshes_total", []string{"result", "invalid"}, 1},
				{"fenced_releases_total", []string{"result", "released"}, 2},
				{"fenced_releases_total", []string{"result", "lost"}, 1},
				{"fenced_leases_lost_total", nil, 2},
				{"fenced_backend_errors_total", []string{"op", "acquire"}, 0},
				{"fenced_active_leases", nil, 1},
				{"fenced_http_requests_total", []string{"route", "/v1/locks/{name}/acquire", "code", "200"}, 2},
				{"fenced_http_requests_total", []string{"route", "/v1/locks/{name}/acquire", "code", "409"}, 2},
				{"fenced_http_requests_total", []string{"route", "/v1/locks/{name}/acquire", "code", "400"}, 2},
				{"fenced_http_requests_total", []string{"route", "/metrics", "code", "200"}, 1},
			} {
				if got := metric(m, c.name, c.labels...); got != c.want {
					t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
				}
			}
			e.release(n2, c.LeaseID)
			if v := metric(e.scrape(), "fenced_active_leases"); v != 0 {
				t.Errorf("fenced_active_leases %v after releasing all, want 0", v)
			}
		})
	}
}

// TestTokensIssuedCountsNewGrantsOnly: a reentrant holder's acquire, and a
// waiter's acquire that finds the grant made for its earlier request, hand
// back a hold with the token issued before; fenced_tokens_issued_total
// counts neither. It counted both.
func TestTokensIssuedCountsNewGrantsOnly(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.store, nil)
			n1, n2 := testenv.Name(t), testenv.Name(t)
			h1 := e.mustAcquire(n1, `{"ttl_ms":30000,"holder":"job-7"}`)
			h2 := e.mustAcquire(n1, `{"ttl_ms":30000,"holder":"job-7"}`)
			waiter := `{"ttl_ms":30000,"wait_ms":1000,"waiter":"` + strings.Repeat("ab", 16) + `"}`
			w1 := e.mustAcquire(n2, waiter)
			w2 := e.mustAcquire(n2, waiter) // as after a lost answer
			if h2.Token != h1.Token || h2.LeaseID != h1.LeaseID || w2.Token != w1.Token || w2.LeaseID != w1.LeaseID {
				t.Fatalf("the second acquisitions were new grants: holder %+v then %+v, waiter %+v then %+v", h1, h2, w1, w2)
			}
			if got := metric(e.scrape(), "fenced_tokens_issued_total"); got != 2 {
				t.Fatalf("fenced_tokens_issued_total = %v after two new grants and two reused ones, want 2", got)
			}
			if got := metric(e.scrape(), "fenced_acquisitions_total", "result", "acquired"); got != 4 {
				t.Fatalf("fenced_acquisitions_total{result=acquired} = %v, want 4: every acquire that got a lease", got)
			}
		})
	}
}

func findMetric(mfs map[string]*dto.MetricFamily, name string, labels ...string) (*dto.Metric, bool) {
	mf := mfs[name]
	if mf == nil {
		return nil, false
	}
	for _, m := range mf.GetMetric() {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
			}
			ok = ok && found
		}
		if ok {
			return m, true
		}
	}
	return nil, false
}

// TestLeaseTracker: only an acquire adds a lease; a refresh extends one
// tracked, even one just past its deadline here, and brings back none
// that was released, lost or force-released; an acquire brings back a
// released one (a reentry the release did not free) but not an ended one.
func TestLeaseTracker(t *testing.T) {
	lt := newLeaseTracker()
	now := time.Now()
	lt.acquired("a", "1", now.Add(time.Minute), false)
	lt.acquired("b", "2", now.Add(time.Second), false)
	lt.acquired("c", "3", now.Add(-time.Second), false)
	if n := lt.count(now); n != 2 {
		t.Fatalf("count %d, want 2 (one expired)", n)
	}
	lt.refreshed("b", "2", now.Add(time.Hour))
	lt.refreshed("c", "3", now.Add(time.Hour)) // applied by the store just in time
	lt.refreshed("d", "4", now.Add(time.Hour)) // acquired through another node
	if n := lt.count(now.Add(2 * time.Second)); n != 3 {
		t.Fatalf("count after refreshes %d, want 3 (a, b, c)", n)
	}
	lt.released("a", "1")
	lt.released("x", "9")                      // unknown: no effect
	lt.refreshed("a", "1", now.Add(time.Hour)) // answered after the release
	if n := lt.count(now.Add(2 * time.Second)); n != 2 {
		t.Fatalf("count after a release and a refresh behind it %d, want 2", n)
	}
	lt.acquired("a", "1", now.Add(time.Hour), true) // a reentry the release only counted down
	if n := lt.count(now.Add(2 * time.Second)); n != 3 {
		t.Fatalf("count after a reentry behind a release %d, want 3", n)
	}
	lt.ended("a", "1") // force-released
	lt.ended("b", "2") // lost
	lt.refreshed("b", "2", now.Add(time.Hour))
	lt.acquired("a", "1", now.Add(time.Hour), true)
	if n := lt.count(now.Add(2 * time.Second)); n != 1 {
		t.Fatalf("count after two leases ended and answers behind them %d, want 1", n)
	}
	lt.released("c", "3")
	if n := lt.count(now.Add(time.Hour + expiredKept)); n != 0 || len(lt.leases) != 0 {
		t.Fatalf("count %d, %d entries kept past their deadline and expiredKept, want none", n, len(lt.leases))
	}
}

func TestSharedRegistry(t *testing.T) {
	store := backends(t)[1].store
	reg := prometheus.NewRegistry()
	e := newEnv(t, store, func(c *Config) { c.Registerer = reg })
	m := e.scrape()
	if m["fenced_tokens_issued_total"] == nil {
		t.Fatal("metrics not served from the given registry")
	}
	if m["go_goroutines"] != nil {
		t.Fatal("Go collector added to a registry the caller owns")
	}
	// A second server on the same registry: the names are taken.
	if _, err := New(Config{Locks: newLocks(t, store), Registerer: reg}); err == nil || !strings.Contains(err.Error(), "Config.Registerer") {
		t.Fatalf("second server on one registry: %v", err)
	}
}

// TestAcquisitionResultsNotStoreFailures: an acquire that ends in a 503
// the lease store did not cause counts under its own result, not "error"
// ("lease store failed", which FencedAcquireErrors alerts on): a wait that
// Drain ends and an acquire after the lock client closed (shutting_down),
// a copy of a request still taking the lock (in_progress), a grant that
// came back with no validity left (ttl_too_short). All four counted as
// "error", so the alert fired at every rolling restart.
func TestAcquisitionResultsNotStoreFailures(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range []struct {
				what, result string
				run          func(t *testing.T) *env
			}{
				{"a wait Drain ends", resultShuttingDown, func(t *testing.T) *env {
					ws := &watchSignal{LeaseStore: b.store, watching: make(chan string, 1)}
					e := newEnv(t, ws, nil)
					name := testenv.Name(t)
					e.mustAcquire(name, `{"ttl_ms":30000}`)
					waiting := e.send("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000,"wait_ms":30000}`)
					<-ws.watching
					e.srv.Drain()
					wantShuttingDown(t, "the waiting acquire", <-waiting)
					return e
				}},
				{"the lock client closed", resultShuttingDown, func(t *testing.T) *env {
					e := newEnv(t, b.store, nil)
					if err := e.srv.locks.Close(t.Context()); err != nil {
						t.Fatal(err)
					}
					_, r := e.acquire(testenv.Name(t), `{"ttl_ms":30000}`)
					wantShuttingDown(t, "acquire after Close", r)
					return e
				}},
				{"a copy still taking the lock", resultInProgress, func(t *testing.T) *env {
					e := newEnv(t, inProgressStore{b.store}, nil)
					_, r := e.acquire(testenv.Name(t), `{"ttl_ms":30000,"waiter":"`+strings.Repeat("c3", 16)+`"}`)
					r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
					return e
				}},
				{"no validity left", resultTTLTooShort, func(t *testing.T) *env {
					e := newEnv(t, &locktest.SlowAcquire{LeaseStore: b.store, Delay: 12 * time.Millisecond}, nil)
					_, r := e.acquire(testenv.Name(t), `{"ttl_ms":10}`)
					r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
					return e
				}},
			} {
				m := c.run(t).scrape()
				if v := metric(m, "fenced_acquisitions_total", "result", resultError); v != 0 {
					t.Errorf("%s: fenced_acquisitions_total{result=error} %v, want 0: the lease store did not fail (backend errors %v)",
						c.what, v, metric(m, "fenced_backend_errors_total", "op", opAcquire))
				}
				if v := metric(m, "fenced_acquisitions_total", "result", c.result); v != 1 {
					t.Errorf("%s: fenced_acquisitions_total{result=%s} %v, want 1", c.what, c.result, v)
				}
			}
		})
	}
}

// TestInvalidCountedEveryRoute: a request refused before the lease store
// (a bad name, query string or body) counts as result "invalid" of the
// counter of its operation, whichever check refused it: acquire and
// campaign (a campaign is an acquire of the election's lock) in
// fenced_acquisitions_total, refresh in fenced_refreshes_total, release
// (a leader's resignation too) in fenced_releases_total. Reads (inspect,
// list, leader) and force-release count in none. A campaign's bad body
// counted as an invalid acquisition, its bad name or query string not.
func TestInvalidCountedEveryRoute(t *testing.T) {
	e := newEnv(t, backends(t)[1].store, nil) // etcd: elections
	id := strings.Repeat("d4", 16)
	counters := []string{"fenced_acquisitions_total", "fenced_refreshes_total", "fenced_releases_total"}
	for _, c := range []struct {
		method, path, body string
		counter            string // "" for none
	}{
		{"POST", "/v1/locks/bad$name/acquire", `{"ttl_ms":5000}`, "fenced_acquisitions_total"},
		{"POST", "/v1/locks/x/acquire?x=1", `{"ttl_ms":5000}`, "fenced_acquisitions_total"},
		{"POST", "/v1/locks/x/acquire", `{"ttl_ms":"x"}`, "fenced_acquisitions_total"},
		{"POST", "/v1/elections/bad$name/campaign", `{"ttl_ms":5000,"value":"a"}`, "fenced_acquisitions_total"},
		{"POST", "/v1/elections/a%2Fb/campaign", `{"ttl_ms":5000,"value":"a"}`, "fenced_acquisitions_total"},
		{"POST", "/v1/elections/x/campaign?x=1", `{"ttl_ms":5000,"value":"a"}`, "fenced_acquisitions_total"},
		{"POST", "/v1/elections/x/campaign", `{"ttl_ms":"x","value":"a"}`, "fenced_acquisitions_total"},
		{"POST", "/v1/locks/bad$name/refresh", `{"lease_id":"` + id + `"}`, "fenced_refreshes_total"},
		{"POST", "/v1/locks/x/refresh?x=1", `{"lease_id":"` + id + `"}`, "fenced_refreshes_total"},
		{"POST", "/v1/locks/x/refresh", `{}`, "fenced_refreshes_total"},
		{"POST", "/v1/locks/bad$name/release", `{"lease_id":"` + id + `"}`, "fenced_releases_total"},
		{"POST", "/v1/locks/x/release?x=1", `{"lease_id":"` + id + `"}`, "fenced_releases_total"},
		{"POST", "/v1/locks/x/release", `{}`, "fenced_releases_total"},
		{"GET", "/v1/locks/bad$name", "", ""},
		{"GET", "/v1/locks/x?x=1", "", ""},
		{"GET", "/v1/locks?prefix=bad$", "", ""},
		{"DELETE", "/v1/locks/bad$name", "", ""},
		{"DELETE", "/v1/locks/x?token=x", "", ""},
		{"GET", "/v1/elections/bad$name", "", ""},
		{"GET", "/v1/elections/x?after_token=x", "", ""},
	} {
		before := e.scrape()
		if r := e.do(c.method, c.path, c.body); r.status != http.StatusBadRequest {
			t.Fatalf("%s %s %s: %d %s, want 400", c.method, c.path, c.body, r.status, r.body)
		}
		after := e.scrape()
		for _, name := range counters {
			want := 0.0
			if name == c.counter {
				want = 1
			}
			if d := metric(after, name, "result", resultInvalid) - metric(before, name, "result", resultInvalid); d != want {
				t.Errorf("%s %s %s: %s{result=invalid} +%v, want +%v", c.method, c.path, c.body, name, d, want)
			}
		}
	}
}

// TestResultLabelsDocumented: every result a counter with a result label
// exports, from the start, is listed in its help and in doc.go's list for
// it, and every result doc.go lists is exported. fenced_refreshes_total
// exported out_of_order, which its help did not list.
func TestResultLabelsDocumented(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, backends(t)[0].store, nil)
	families := 0
	for name, mf := range e.scrape() {
		exported := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" {
					exported[lp.GetValue()] = true
				}
			}
		}
		if len(exported) == 0 {
			continue
		}
		families++
		dm := regexp.MustCompile(regexp.QuoteMeta(name) + `\{result="([^"]+)"\}`).FindSubmatch(src)
		if dm == nil {
			t.Errorf(`%s: doc.go lists no %s{result="…"}`, name, name)
			continue
		}
		documented := strings.Split(string(dm[1]), "|")
		for r := range exported {
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(r) + `\b`).MatchString(mf.GetHelp()) {
				t.Errorf("%s exports result %q, which its help does not list: %q", name, r, mf.GetHelp())
			}
			if !slices.Contains(documented, r) {
				t.Errorf("%s exports result %q, which doc.go does not list: %v", name, r, documented)
			}
		}
		for _, r := range documented {
			if !exported[r] {
				t.Errorf("%s: doc.go lists result %q, not exported from the start", name, r)
			}
		}
	}
	if families < 3 {
		t.Fatalf("%d counters with a result label, want acquisitions, refreshes and releases at least", families)
	}
}
