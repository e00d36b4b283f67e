package client_test

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestCertificateRefusedAfterASendIsNoCannotSend: a release's first round
// reaches the server, which applies it, and its answer is lost (the
// connection drops); it is sent again, and that handshake fails on a
// certificate (the server's rotated meanwhile). That is no
// lock.ErrCannotSend ("nothing was applied"): the first send may have
// been, and was. Before, Release said the lock stayed held until its TTL
// while it was free, and, not counting the first send as unanswered, a
// later Release answered "lost, maybe released" reported the holder's own
// release as a loss (docs/design.md, defect 258; found by a review).
func TestCertificateRefusedAfterASendIsNoCannotSend(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca, other := newTestCA(t), newTestCA(t)
	var cut atomic.Bool
	srv := serveTLS(t, f, ca.cert, func(s *tlsServer, api http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/release") && cut.CompareAndSwap(true, false) {
				api.ServeHTTP(httptest.NewRecorder(), r) // applied
				s.cert.Store(&other.cert)                // rotated: the next handshake fails
				if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
					c.Close() // the answer is lost
				}
				return
			}
			api.ServeHTTP(w, r)
		})
	})
	cl := newClient(t, srv.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := cl.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cut.Store(true)
	err = l.Release(ctx)
	st, ierr := f.locks.Inspect(ctx, name)
	if ierr != nil {
		t.Fatal(ierr)
	}
	if st.Held || !errors.Is(err, client.ErrCertificate) {
		t.Fatalf("Release: %v, the lock held: %v; want it free (the first send applied) and the certificate error", err, st.Held)
	}
	if errors.Is(err, lock.ErrCannotSend) {
		t.Fatalf("Release matches lock.ErrCannotSend (nothing reached the store, nothing applied), but its first send was applied: the lock is free")
	}
	if strings.Contains(err.Error(), "stays held in the store until its TTL runs out") {
		t.Fatalf("Release says the lock stays held until its TTL; it is free")
	}

	// As TestUntrustedCertificateAfterTheGrant: the store forgets the
	// release ids; the holder calls Release again once the certificate is
	// fixed.
	srv.cert.Store(&ca.cert)
	forgetReleases(t, f, name)
	if err := l.Release(ctx); err != nil {
		t.Errorf("second Release: %v; want nil: the holder's own first release freed the lock (an attempt that reached the server)", err)
	}
}
