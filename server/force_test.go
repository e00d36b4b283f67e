package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
)

// TestForceReleaseWithToken: DELETE /v1/locks/{name}?token=N releases the
// lock only for the grant with token N. Another grant's lock is a 409 held
// that names the token holding it, and stays held; a bad token, or a
// parameter the route does not take, is a 400 that touches nothing (an
// ignored ?tokn=5 would release whoever holds the lock).
func TestForceReleaseWithToken(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.store, nil)
			name := testenv.Name(t)
			path := "/v1/locks/" + name
			l := e.mustAcquire(name, `{"ttl_ms":30000,"owner":"stuck"}`)
			stillHeld := func(when string) {
				t.Helper()
				if st := e.state(name); !st.Held || st.Token != l.Token {
					t.Fatalf("%s: %+v; want still held by token %d", when, st, l.Token)
				}
			}

			for _, q := range []string{"token=", "token=0", "token=-1", "token=abc", "token=1e3", "token=9223372036854775808", "token=1&token=2"} {
				r := e.do("DELETE", path+"?"+q, "")
				msg := r.errCode(t, http.StatusBadRequest, codeInvalidArgument)
				if field := errField(t, r); field != api.FieldToken {
					t.Errorf("?%s: field %q, want token", q, field)
				}
				if !strings.Contains(msg, "token") || !strings.Contains(msg, fmt.Sprint(fence.MaxToken)) && !strings.Contains(msg, "once") {
					t.Errorf("?%s: %q does not say what token takes", q, msg)
				}
				stillHeld("after ?" + q)
			}
			if msg := e.do("DELETE", path+"?tokn=5", "").errCode(t, http.StatusBadRequest, codeInvalidArgument); !strings.Contains(msg, "token") {
				t.Errorf("?tokn=5: %q does not name the parameter the route takes", msg)
			}
			stillHeld("after ?tokn=5")

			other := l.Token + 1000
			r := e.do("DELETE", fmt.Sprintf("%s?token=%d", path, other), "")
			msg := r.errCode(t, http.StatusConflict, codeHeld)
			var eb api.ErrorBody
			r.decode(t, &eb)
			if eb.Error.Token == nil || *eb.Error.Token != l.Token || !strings.Contains(msg, l.Token.String()) || !strings.Contains(msg, "nothing was released") {
				t.Fatalf("?token=%d of a lock held by %d: %s; want a 409 naming token %d", other, l.Token, r.body, l.Token)
			}
			stillHeld("after a DELETE with another token")

			r = e.do("DELETE", fmt.Sprintf("%s?token=%d", path, l.Token), "")
			var removed stateResponse
			if r.status != http.StatusOK {
				t.Fatalf("?token=%d of the lock it holds: %d %s", l.Token, r.status, r.body)
			}
			r.decode(t, &removed)
			if !removed.Held || removed.Token != l.Token || removed.Owner != "stuck" {
				t.Fatalf("?token=%d answered %+v, want the removed lease", l.Token, removed)
			}
			e.do("DELETE", fmt.Sprintf("%s?token=%d", path, l.Token), "").errCode(t, http.StatusNotFound, codeNotFound)
		})
	}
}

// errField is the field of an error answer.
func errField(t *testing.T, r response) string {
	t.Helper()
	var eb api.ErrorBody
	if err := json.NewDecoder(bytes.NewReader(r.body)).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	return eb.Error.Field
}
