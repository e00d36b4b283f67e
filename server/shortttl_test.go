package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
)

// TestShortTTLFreeLockIsUnavailable: a free lock whose grant comes back
// with no validity left is answered 503 unavailable about ttl_ms, with
// what to do, not 409 held (nobody holds it: GET says so), in one attempt
// and after wait_ms. A lock another holder has is still 409 held.
func TestShortTTLFreeLockIsUnavailable(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, &locktest.SlowAcquire{LeaseStore: b.store, Delay: 12 * time.Millisecond}, nil)
			for _, body := range []string{`{"ttl_ms":10}`, `{"ttl_ms":10,"wait_ms":100}`} {
				name := testenv.Name(t)
				_, r := e.acquire(name, body)
				msg := r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
				var eb api.ErrorBody
				if err := json.NewDecoder(bytes.NewReader(r.body)).Decode(&eb); err != nil {
					t.Fatal(err)
				}
				if eb.Error.Field != fieldTTLMs || eb.Error.Position != nil || eb.Error.WaitedMs != nil {
					t.Fatalf("%s: error %+v: want field ttl_ms, no position or waited_ms", body, eb.Error)
				}
				if !strings.Contains(msg, "TTL (10ms)") || !strings.Contains(msg, "ask for a TTL") {
					t.Fatalf("%s: message %q: want the TTL and what to do", body, msg)
				}
				if r.header.Get("Retry-After") == "" {
					t.Fatalf("%s: 503 without Retry-After", body)
				}
				if st := e.state(name); st.Held {
					t.Fatalf("%s: GET %+v after the 503: want held false", body, st)
				}
			}
			if v := metric(e.scrape(), "fenced_acquisitions_total", "result", "held"); v != 0 {
				t.Fatalf("fenced_acquisitions_total{result=held} %v, want 0", v)
			}
			if v := metric(e.scrape(), "fenced_acquisitions_total", "result", "ttl_too_short"); v != 2 {
				t.Fatalf("fenced_acquisitions_total{result=ttl_too_short} %v, want 2", v)
			}

			// Held by another: 409 held, whatever the ttl_ms.
			name := testenv.Name(t)
			e.mustAcquire(name, `{"ttl_ms":10000}`)
			for _, body := range []string{`{"ttl_ms":10}`, `{"ttl_ms":10,"wait_ms":50}`} {
				_, r := e.acquire(name, body)
				if msg := r.errCode(t, http.StatusConflict, codeHeld); !strings.Contains(msg, "held by another holder") {
					t.Fatalf("%s on a held lock: %q", body, msg)
				}
			}
		})
	}
}
