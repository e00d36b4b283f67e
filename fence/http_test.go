package fence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fenced/fenced/fence"
)

func TestParseToken(t *testing.T) {
	good := map[string]fence.Token{"1": 1, "42": 42, "9223372036854775807": fence.MaxToken, "007": 7, "00000000000000000042": 42}
	for in, want := range good {
		got, err := fence.ParseToken(in)
		if err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "+1", " 1", "1 ", "1.0", "0x10", "abc", "9223372036854775808", "18446744073709551615", "18446744073709551616", "123456789012345678901"} {
		if _, err := fence.ParseToken(in); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrInvalidToken", in, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "0", "18446744073709551615", "18446744073709551616", "-3", " 9", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			if !errors.Is(err, fence.ErrInvalidToken) {
				t.Fatalf("error %v does not match ErrInvalidToken", err)
			}
			return
		}
		if tok == 0 {
			t.Fatalf("ParseToken(%q) admitted zero", s)
		}
		back, err := fence.ParseToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("round trip of %q: %d, %v", s, back, err)
		}
		h := http.Header{}
		h.Set(fence.Header, s)
		if ht, err := fence.TokenFromHeader(h); err != nil || ht != tok {
			t.Fatalf("header %q: %d, %v; want %d", s, ht, err, tok)
		}
	})
}

type apiError struct {
	Error struct {
		Code    string      `json:"code"`
		Message string      `json:"message"`
		Token   fence.Token `json:"token"`
		Highest fence.Token `json:"highest"`
	} `json:"error"`
}

func TestMiddleware(t *testing.T) {
	store := fence.NewMemoryStore()
	var mu sync.Mutex
	var wrote []fence.Token
	h := fence.Middleware(store, func(r *http.Request) string { return r.URL.Path })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := fence.FromContext(r.Context())
		if !ok {
			t.Error("handler called without a token in context")
		}
		mu.Lock()
		wrote = append(wrote, tok)
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	do := func(path, tok string) (int, apiError) {
		t.Helper()
		req, _ := http.NewRequest("PUT", srv.URL+path, nil)
		if tok != "" {
			req.Header.Set(fence.Header, tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e apiError
		if resp.StatusCode != 200 {
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("error content type %q", ct)
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, e
	}
	if code, e := do("/a", ""); code != 400 || e.Error.Code != "invalid_argument" || !strings.Contains(e.Error.Message, "missing") {
		t.Fatalf("no header: %d %+v", code, e)
	}
	if code, e := do("/a", "x1"); code != 400 || e.Error.Code != "invalid_argument" {
		t.Fatalf("bad header: %d %+v", code, e)
	}
	if code, _ := do("/a", "10"); code != 200 {
		t.Fatalf("token 10: %d", code)
	}
	if code, _ := do("/a", "10"); code != 200 {
		t.Fatalf("token 10 again: %d", code)
	}
	if code, e := do("/a", "9"); code != 409 || e.Error.Code != "stale" || e.Error.Token != 9 || e.Error.Highest != 10 {
		t.Fatalf("stale token 9: %d %+v", code, e)
	}
	if code, _ := do("/b", "1"); code != 200 {
		t.Fatalf("other resource: %d", code)
	}
	if len(wrote) != 3 || wrote[0] != 10 || wrote[1] != 10 || wrote[2] != 1 {
		t.Fatalf("handler ran for %v, want [10 10 1]", wrote)
	}
}

// TestEveryRefusalSaysWhatIsAllowed: each 400 of a bad Fencing-Token
// header says what would be accepted, as docs/fencing-token-http.md
// promises. Before, a missing header named no value, and 21 digits were
// refused with "want a decimal number from 1 to ..." though their value
// was 1 (docs/design.md, defect 233).
func TestEveryRefusalSaysWhatIsAllowed(t *testing.T) {
	maxTok := fmt.Sprint(uint64(fence.MaxToken))
	h := fence.Middleware(fence.NewMemoryStore(), func(*http.Request) string { return "r" })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, tc := range []struct {
		name   string
		values []string
		want   string // besides its kind, what the message must name
	}{
		{"missing", nil, maxTok},
		{"repeated", []string{"5", "6"}, "exactly one"},
		{"empty", []string{""}, "20 digits"},
		{"21 digits of value 1", []string{"000000000000000000001"}, "20 digits"},
		{"4,000 digits", []string{strings.Repeat("7", 4000)}, "20 digits"},
		{"letters", []string{"x1"}, maxTok},
		{"zero", []string{"0"}, maxTok},
		{"above MaxToken", []string{"9223372036854775808"}, maxTok},
	} {
		req := httptest.NewRequest(http.MethodPut, "/r", nil)
		for _, v := range tc.values {
			req.Header.Add(fence.Header, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var e apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != http.StatusBadRequest {
			t.Fatalf("%s: %d %s (%v), want 400", tc.name, rec.Code, rec.Body, err)
		}
		if !strings.Contains(e.Error.Message, "want") || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: message %q does not say what is allowed (%q)", tc.name, e.Error.Message, tc.want)
		}
	}
}

// TestMiddlewareSerialisesPerResource runs many requests with random tokens
// against one resource; the handler records the order in which writes
// happen. Because admit and handler are serialised, the writes must be in
// non-decreasing token order.
func TestMiddlewareSerialisesPerResource(t *testing.T) {
	store := fence.NewMemoryStore()
	var mu sync.Mutex
	var wrote []fence.Token
	h := fence.Middleware(store, func(*http.Request) string { return "one" })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := fence.FromContext(r.Context())
		mu.Lock()
		wrote = append(wrote, tok)
		mu.Unlock()
	}))
	var wg sync.WaitGroup
	for i := 0; i < 400; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := httptest.NewRequest("PUT", "/", nil)
			fence.SetHeader(r.Header, fence.Token(1+(i*7919)%400))
			h.ServeHTTP(httptest.NewRecorder(), r)
		}(i)
	}
	wg.Wait()
	for i := 1; i < len(wrote); i++ {
		if wrote[i] < wrote[i-1] {
			t.Fatalf("write %d with token %d after token %d", i, wrote[i], wrote[i-1])
		}
	}
	if len(wrote) == 0 {
		t.Fatal("no write admitted")
	}
}

func TestTransportSetsHeader(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(fence.Header))
	}))
	defer srv.Close()
	c := &http.Client{Transport: &fence.Transport{}}
	req, _ := http.NewRequestWithContext(fence.WithToken(t.Context(), 77), "GET", srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.Header.Get(fence.Header) != "" {
		t.Fatal("Transport changed the caller's request")
	}
	req2, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err = c.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 2 || got[0] != "77" || got[1] != "" {
		t.Fatalf("server saw headers %q, want [77 \"\"]", got)
	}
}

// A request built by hand may have a nil Header; http.Client fills it in,
// but a RoundTripper can be called directly or by another client.
func TestTransportNilHeader(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get(fence.Header)
	}))
	defer srv.Close()
	req, err := http.NewRequestWithContext(fence.WithToken(t.Context(), 77), "GET", srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = nil
	resp, err := (&fence.Transport{}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got != "77" {
		t.Fatalf("server saw %q, want 77", got)
	}
	if req.Header != nil {
		t.Fatal("Transport changed the caller's request")
	}
}

// narrowStore holds tokens up to 1000 only, as a store whose column is
// narrower than a token would, and no resource name with a NUL byte, as
// PostgreSQL text would.
type narrowStore struct{ fence.MemoryStore }

func (s *narrowStore) Admit(ctx context.Context, resource string, t fence.Token) error {
	if t > 1000 {
		return fmt.Errorf("%w: %d does not fit this store", fence.ErrInvalidToken, t)
	}
	if strings.ContainsRune(resource, 0) {
		return fmt.Errorf("%w: %q holds a NUL byte", fence.ErrInvalidResource, resource)
	}
	return s.MemoryStore.Admit(ctx, resource, t)
}

// A token or a resource name the store cannot hold is the caller's mistake
// (400), not the store being unavailable (503), which a client may retry.
func TestMiddlewareWhatTheStoreCannotHold(t *testing.T) {
	h := fence.Middleware(&narrowStore{}, func(r *http.Request) string { return r.URL.Path })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, c := range []struct {
		path, tok string
		want      int
	}{
		{"/r", "5", 200},
		{"/r", "5000", 400},
		{"/r", "9223372036854775808", 400},
		{"/a%00b", "5", 400},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("PUT", c.path, nil)
		req.Header.Set(fence.Header, c.tok)
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s, token %s: %d %s, want %d", c.path, c.tok, rec.Code, rec.Body, c.want)
		}
	}
}

// staleSaying is a store that says a token is stale without a *StaleError,
// as a store that cannot tell the highest token does (postgres.MapError of
// a hand-made fence_admit's error whose detail it cannot read).
type staleSaying struct{}

func (staleSaying) Admit(_ context.Context, resource string, t fence.Token) error {
	return fmt.Errorf("%w: %d for %q, says a custom store", fence.ErrStale, t, resource)
}

// TestMiddlewareStaleWithoutStaleError: a stale token is answered 409
// stale however the store says so. Before, only a *StaleError was: this one
// got 503 unavailable, which docs/fencing-token-http.md tells a writer to
// retry with the same token, for ever (docs/design.md, defect 122).
func TestMiddlewareStaleWithoutStaleError(t *testing.T) {
	h := fence.Middleware(staleSaying{}, func(r *http.Request) string { return r.URL.Path })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a stale request reached the handler")
	}))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("PUT", "/r", nil)
	req.Header.Set(fence.Header, "5")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"code":"stale"`) || !strings.Contains(rec.Body.String(), `"token":5`) {
		t.Fatalf("a store's stale error without *StaleError: %d %s, want 409 stale with the token", rec.Code, rec.Body)
	}
}
