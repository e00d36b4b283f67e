package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
)

// TestActiveLeasesKeepsReenteredLease: a lock its reentrant holder
// acquired twice is still held after one release, and
// fenced_active_leases still counts it; the second release frees it and
// the gauge drops. The gauge used to drop at the first release. A release
// sent again with its release_id takes off no second hold, and the gauge
// follows.
func TestActiveLeasesKeepsReenteredLease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.store, nil)
			name := testenv.Name(t)
			body := `{"ttl_ms":30000,"holder":"h-secret-1"}`
			l := e.mustAcquire(name, body)
			e.mustAcquire(name, body)
			if v := metric(e.scrape(), "fenced_active_leases"); v != 1 {
				t.Fatalf("fenced_active_leases %v with one lease held twice, want 1", v)
			}
			rel := `{"lease_id":"` + l.LeaseID + `","release_id":"` + strings.Repeat("3c", 16) + `"}`
			for range 2 { // the second as after a lost answer
				if r := e.do("POST", "/v1/locks/"+name+"/release", rel); r.status != http.StatusOK {
					t.Fatalf("release: %d %s", r.status, r.body)
				}
				if st := e.state(name); !st.Held {
					t.Fatalf("one release of a lock held twice freed it: %+v", st)
				}
				if v := metric(e.scrape(), "fenced_active_leases"); v != 1 {
					t.Fatalf("fenced_active_leases %v after one of two holds was released, the lock still held; want 1", v)
				}
			}
			if r := e.release(name, l.LeaseID); r.status != http.StatusOK || e.state(name).Held {
				t.Fatalf("the last release: %d %s", r.status, r.body)
			}
			if v := metric(e.scrape(), "fenced_active_leases"); v != 0 {
				t.Fatalf("fenced_active_leases %v after the last release, want 0", v)
			}
		})
	}
}
