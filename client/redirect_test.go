package client_test

import (
	"context"
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

// redirector answers every request with a redirect of the given status to
// the same path and query on target, as an ingress that sends http:// to
// https:// does, and counts what reaches it.
func redirector(t *testing.T, target string, status int) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.RequestURI(), status)
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

var redirects = []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
	http.StatusTemporaryRedirect, http.StatusPermanentRedirect}

// wantRedirectRefused fails the test unless err is the *APIError of a
// redirect to target: its status, no code, and a message that names
// target as the URL to use, and does not say the request may have been
// applied.
func wantRedirectRefused(t *testing.T, what string, err error, status int, target string) {
	t.Helper()
	var ae *client.APIError
	switch {
	case !errors.As(err, &ae) || ae.Status != status || ae.Code != "":
		t.Fatalf("%s through a %d redirect: %v; want an *APIError with status %d", what, status, err, status)
	case !strings.Contains(err.Error(), "point the client at "+target):
		t.Fatalf("%s through a %d redirect: %v; want it to name %s as the URL to use", what, status, err, target)
	case strings.Contains(err.Error(), "may have"):
		t.Fatalf("%s through a %d redirect: %v; a redirect is never fenced's answer: nothing was applied", what, status, err)
	}
}

// TestForceReleaseThroughARedirect: the client follows no redirect. Go's
// http.Client follows 301, 302 and 303 by default, and turns a DELETE into
// a GET of the same path: fenced's inspect. ForceRelease through an
// ingress that sends http:// to https:// returned the inspect's state as
// its success and released nothing, and `fenced locks release` printed
// "released" of a lock still held. Every request is now refused with the
// redirect's *APIError, which names the URL to use, and the lock stays
// held (package documentation, "Errors").
func TestForceReleaseThroughARedirect(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	name := testenv.Name(t)
	held, err := newClient(t, f.url).TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.WithoutCancel(ctx))
	for _, status := range redirects {
		c := newClient(t, redirector(t, f.url, status))
		st, err := c.ForceRelease(ctx, name)
		wantRedirectRefused(t, "ForceRelease", err, status, f.url)
		if st.Held {
			t.Errorf("ForceRelease through a %d redirect returned the state %+v", status, st)
		}
		_, err = c.ForceRelease(ctx, name, lock.IfToken(held.Token()))
		wantRedirectRefused(t, "ForceRelease with IfToken", err, status, f.url)
		if now, err := f.locks.Inspect(ctx, name); err != nil || !now.Held || now.Token != held.Token() {
			t.Fatalf("after ForceRelease through a %d redirect: %+v, %v; want still held", status, now, err)
		}
	}
}

// TestLeaseCallsThroughARedirect: acquire, refresh and release through a
// redirect are its *APIError too, where 301 to 303 turned them into GETs
// answered 405, and are not sent again; a caller's own http.Client
// (WithHTTPClient) follows none either, and is left as it was given.
func TestLeaseCallsThroughARedirect(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	name := testenv.Name(t)
	url := redirector(t, f.url, http.StatusMovedPermanently)
	hc := &http.Client{}
	for _, c := range []*client.Client{newClient(t, url), newClient(t, url, client.WithHTTPClient(hc))} {
		_, err := c.TryAcquire(ctx, name, 30*time.Second)
		wantRedirectRefused(t, "TryAcquire", err, http.StatusMovedPermanently, f.url)
		_, err = c.Acquire(ctx, name, 30*time.Second, lock.WithWait(time.Second))
		wantRedirectRefused(t, "Acquire", err, http.StatusMovedPermanently, f.url)
		_, err = c.Inspect(ctx, name)
		wantRedirectRefused(t, "Inspect", err, http.StatusMovedPermanently, f.url)
	}
	if hc.CheckRedirect != nil {
		t.Error("WithHTTPClient's client was changed")
	}
	if n := f.acquires.Load(); n != 0 {
		t.Errorf("%d acquire requests reached the server through the redirect", n)
	}
	// A lease taken before the ingress began to redirect: its refresh and
	// release are refused, and it stays held, for the release that gets
	// through.
	pass, _ := passOn(t, f, 0)
	var moved atomic.Bool
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if moved.Load() {
			http.Redirect(w, r, f.url+r.URL.RequestURI(), http.StatusMovedPermanently)
			return
		}
		pass.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	l, err := newClient(t, hs.URL).TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	moved.Store(true)
	wantRedirectRefused(t, "Refresh", l.Refresh(ctx, 0), http.StatusMovedPermanently, f.url)
	wantRedirectRefused(t, "Release", l.Release(ctx), http.StatusMovedPermanently, f.url)
	if now, err := f.locks.Inspect(ctx, name); err != nil || now.Token != l.Token() {
		t.Fatalf("after a release through a redirect: %+v, %v; want still held", now, err)
	}
	moved.Store(false)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("the release that gets through: %v", err)
	}
}
