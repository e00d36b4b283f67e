package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

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

func TestLeaseTracker(t *testing.T) {
	lt := newLeaseTracker()
	now := time.Now()
	lt.held("a", "1", now.Add(time.Minute), false)
	lt.held("b", "2", now.Add(time.Second), false)
	lt.held("c", "3", now.Add(-time.Second), false)
	if n := lt.count(now); n != 2 {
		t.Fatalf("count %d, want 2 (one expired)", n)
	}
	lt.held("b", "2", now.Add(time.Hour), false) // refreshed
	if n := lt.count(now.Add(2 * time.Second)); n != 2 {
		t.Fatalf("count after refresh %d, want 2", n)
	}
	lt.gone("a", "1")
	lt.gone("x", "9") // unknown: no effect
	if n := lt.count(now.Add(2 * time.Second)); n != 1 {
		t.Fatalf("count after release %d, want 1", n)
	}
	if n := len(lt.leases); n != 1 {
		t.Fatalf("%d entries kept, want 1", n)
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
