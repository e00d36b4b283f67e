package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fenced/fenced/lock"
)

// failingStore fails every call as an unreachable backend would.
type failingStore struct{ fakeStore }

var errUnreachable = errors.New("dial tcp 10.0.0.1:6379: connect: connection refused")

func (s *failingStore) Acquire(context.Context, lock.AcquireRequest) (lock.Grant, error) {
	return lock.Grant{}, errUnreachable
}

func TestLogs(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fs := &failingStore{}
	srv, err := New(Config{Locks: newLocks(t, fs), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}
	if w := serve("POST", "/v1/locks/x/acquire", `{"ttl_ms":1000}`); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "connection refused") {
		t.Fatalf("acquire on a failing store: %d %s", w.Code, w.Body)
	}
	id := "0123456789abcdef0123456789abcdef"
	serve("POST", "/v1/locks/x/release", `{"lease_id":"`+id+`"}`)
	out := buf.String()
	for _, want := range []string{
		`level=WARN msg="lease store failed" op=acquire lock=x backend=`, "took=", "connection refused", "hint=",
		`level=DEBUG msg="http request" method=POST path=/v1/locks/x/acquire route=/v1/locks/{name}/acquire status=503`,
		`route=/v1/locks/{name}/release status=410`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, id) {
		t.Errorf("log shows a lease id:\n%s", out)
	}
}
