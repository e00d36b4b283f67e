package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

var fuzzLimits = limits{minTTL: lock.MinTTL, maxTTL: lock.MaxTTL, defaultTTL: DefaultTTL, maxWait: DefaultMaxWait}

var bodySeeds = []string{
	``, ` `, `{}`, `{"ttl_ms":1000}`, `{"ttl_ms":1000,"wait_ms":5000}`, `{"wait_ms":0}`,
	`{"ttl_ms":-1}`, `{"ttl_ms":1.5}`, `{"ttl_ms":1e3}`, `{"ttl_ms":"1"}`, `{"ttl_ms":null}`,
	`{"ttl_ms":99999999999999999999999}`, `{"ttl_ms":1,"ttl_ms":2}`, `{"TTL_MS":1}`, `{"x":1}`,
	`{} {}`, `{`, `}`, `[]`, `null`, `"s"`, `{"ttl_ms":1000}x`, "{\"ttl_ms\":\xff}",
	`{"lease_id":"0123456789abcdef0123456789abcdef"}`, `{"lease_id":"0123456789abcdef0123456789abcdef","ttl_ms":500}`,
	`{"lease_id":""}`, `{"lease_id":5}`, `{"lease_id":"\u0000"}`, `{"lease_id":["a"]}`,
}

// checkTTL fails unless ttl is within the limits.
func checkTTL(t *testing.T, ttl time.Duration) {
	if ttl < fuzzLimits.minTTL || ttl > fuzzLimits.maxTTL || ttl%time.Millisecond != 0 {
		t.Fatalf("ttl %s accepted", ttl)
	}
}

func checkRejected(t *testing.T, aerr *apiError) {
	if aerr.status != http.StatusBadRequest || aerr.code != codeInvalidArgument || aerr.message == "" {
		t.Fatalf("rejection %+v: want a 400 invalid_argument with a message", aerr)
	}
}

func FuzzDecodeAcquire(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, aerr := fuzzLimits.decodeAcquire(body)
		if aerr != nil {
			checkRejected(t, aerr)
			return
		}
		checkTTL(t, req.ttl)
		if req.wait < 0 || req.wait > fuzzLimits.maxWait {
			t.Fatalf("wait %s accepted", req.wait)
		}
	})
}

func FuzzDecodeRefresh(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, aerr := fuzzLimits.decodeRefresh(body)
		if aerr != nil {
			checkRejected(t, aerr)
			return
		}
		checkTTL(t, req.ttl)
		if req.leaseID == "" {
			t.Fatal("empty lease id accepted")
		}
	})
}

func FuzzDecodeRelease(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, aerr := fuzzLimits.decodeRelease(body)
		if aerr != nil {
			checkRejected(t, aerr)
			return
		}
		if req.leaseID == "" {
			t.Fatal("empty lease id accepted")
		}
	})
}

// FuzzLockName checks the path to lock name step: a name either passes
// lock.ValidateName or is a 400.
func FuzzLockName(f *testing.F) {
	for _, s := range []string{"a", "a%2Fb", "a/b", "", "%", "%zz", "..", "a%00", "%C3%A4", strings.Repeat("x", 201), "A-z_0.9:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		name, aerr := lockName(raw)
		if aerr != nil {
			checkRejected(t, aerr)
			return
		}
		if err := lock.ValidateName(name); err != nil {
			t.Fatalf("%q accepted as %q: %v", raw, name, err)
		}
	})
}

// fakeStore is an in-memory LeaseStore for the handler fuzz test. It
// records any call with a name or lease id that should have been rejected.
type fakeStore struct {
	mu  sync.Mutex
	bad []string
}

func (s *fakeStore) check(name, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lock.ValidateName(name) != nil {
		s.bad = append(s.bad, "name "+name)
	}
	if id != "" && len(id) != 32 {
		s.bad = append(s.bad, "lease id "+id)
	}
}

func (s *fakeStore) Acquire(_ context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	s.check(req.Name, req.LeaseID)
	if strings.HasPrefix(req.Name, "held") {
		return lock.Grant{}, &lock.HeldError{}
	}
	return lock.Grant{Token: 7, TTL: req.TTL, LeaseID: req.LeaseID, Count: 1}, nil
}

func (s *fakeStore) Refresh(_ context.Context, name, id string, ttl time.Duration, _ uint64) (lock.Grant, error) {
	s.check(name, id)
	return lock.Grant{}, lock.ErrLost
}

func (s *fakeStore) Release(_ context.Context, name, id, _ string) error {
	s.check(name, id)
	return lock.ErrLost
}

func (s *fakeStore) Watch(ctx context.Context, name, _ string) (<-chan struct{}, func(), error) {
	s.check(name, "")
	return make(chan struct{}), func() {}, nil
}

func (s *fakeStore) Leave(_ context.Context, name, _ string) error {
	s.check(name, "")
	return nil
}

func (s *fakeStore) List(context.Context, lock.ListRequest) (lock.ListPage, error) {
	return lock.ListPage{}, nil
}

func (s *fakeStore) ForceRelease(_ context.Context, name string, _ fence.Token) (lock.State, error) {
	s.check(name, "")
	return lock.State{Name: name}, nil
}

func (s *fakeStore) Inspect(_ context.Context, name string) (lock.State, error) {
	s.check(name, "")
	return lock.State{}, nil
}

func (s *fakeStore) Ping(context.Context) error { return nil }

// FuzzServeHTTP sends any method, path and body through the handler: the
// answer is a documented status with a JSON error body for every failure,
// never a 5xx, and no invalid name or lease id reaches the store.
func FuzzServeHTTP(f *testing.F) {
	for _, s := range []struct{ method, path, body string }{
		{"POST", "/v1/locks/a/acquire", `{"ttl_ms":1000}`},
		{"POST", "/v1/locks/held/acquire", `{"wait_ms":1}`},
		{"POST", "/v1/locks/a%2Fb/acquire", ``},
		{"POST", "/v1/locks/a/refresh", `{"lease_id":"0123456789abcdef0123456789abcdef"}`},
		{"POST", "/v1/locks/a/release", `{"lease_id":"x"}`},
		{"GET", "/v1/locks/a", ``},
		{"GET", "/v1/locks/a/b", ``},
		{"DELETE", "/v1/locks/a", ``},
		{"GET", "/healthz", ``},
		{"GET", "/nope", ``},
	} {
		f.Add(s.method, s.path, []byte(s.body))
	}
	store := &fakeStore{}
	locks, err := lock.New(store)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := New(Config{Locks: locks, MaxWait: 10 * time.Millisecond, MaxBodyBytes: MinMaxBodyBytes})
	if err != nil {
		f.Fatal(err)
	}
	allowed := map[int]bool{200: true, 400: true, 404: true, 405: true, 409: true, 410: true, 413: true, 415: true}
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		u, err := url.ParseRequestURI(path)
		if err != nil || !validMethod(method) {
			return // net/http rejects these before any handler
		}
		r := &http.Request{Method: method, URL: u, Header: http.Header{}, Body: http.NoBody, RequestURI: path}
		if len(body) > 0 {
			r.Body = httpBody(body)
			r.ContentLength = int64(len(body))
		}
		r = r.WithContext(context.Background())
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if !allowed[w.Code] {
			t.Fatalf("%s %s %q: status %d %s", method, path, body, w.Code, w.Body)
		}
		if w.Code != 200 && !bytes.Contains(w.Body.Bytes(), []byte(`{"error":{"code":"`)) {
			t.Fatalf("%s %s %q: %d without an error body: %s", method, path, body, w.Code, w.Body)
		}
		store.mu.Lock()
		defer store.mu.Unlock()
		if len(store.bad) > 0 {
			t.Fatalf("%s %s %q reached the store with %q", method, path, body, store.bad)
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range []byte(m) {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", rune(c)) {
			return false
		}
	}
	return true
}

type bodyReader struct{ *bytes.Reader }

func (bodyReader) Close() error { return nil }

func httpBody(b []byte) bodyReader { return bodyReader{bytes.NewReader(b)} }
