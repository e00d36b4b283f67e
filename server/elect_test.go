package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/testenv"
)

func (e *env) leader(path string) api.Leader {
	e.t.Helper()
	r := e.do("GET", path, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var l api.Leader
	r.decode(e.t, &l)
	return l
}

// TestElection: campaign, the 409 of a candidate that waited, the leader
// seen by GET, a long poll that returns when the term changes, and the
// next leader's higher term, over the API on etcd.
func TestElection(t *testing.T) {
	e := newEnv(t, backends(t)[1].store, nil)
	name := testenv.Name(t)
	path := "/v1/elections/" + name

	if l := e.leader(path); l.Leading || l.Token != 0 || l.Name != name {
		t.Fatalf("before any campaign: %+v", l)
	}
	r := e.do("POST", path+"/campaign", `{"ttl_ms":5000,"value":"10.0.0.1:8080"}`)
	if r.status != http.StatusOK {
		t.Fatalf("campaign: %d %s", r.status, r.body)
	}
	var first api.Lease
	r.decode(t, &first)
	if l := e.leader(path); !l.Leading || l.Value != "10.0.0.1:8080" || l.Token != first.Token {
		t.Fatalf("GET after the campaign: %+v; want token %d", l, first.Token)
	}
	// The election is the lock of its name: GET of the lock agrees.
	if st := e.state(name); !st.Held || st.Owner != "10.0.0.1:8080" || st.Token != first.Token {
		t.Fatalf("the election's lock: %+v", st)
	}

	msg := e.do("POST", path+"/campaign", `{"ttl_ms":5000,"wait_ms":100,"value":"b"}`).errCode(t, http.StatusConflict, codeHeld)
	if !strings.Contains(msg, "another leader") || !strings.Contains(msg, "still led after waiting") {
		t.Fatalf("409 message %q", msg)
	}
	// A long poll past the same term answers that term when its wait ends.
	if l := e.leader(fmt.Sprintf("%s?after_token=%d&wait_ms=100", path, first.Token)); l.Token != first.Token {
		t.Fatalf("long poll that timed out: %+v", l)
	}

	polled := make(chan api.Leader, 1)
	pollErr := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("%s%s?after_token=%d&wait_ms=30000", e.ts.URL, path, first.Token))
		if err != nil {
			pollErr <- err
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var l api.Leader
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &l) != nil {
			pollErr <- fmt.Errorf("long poll: %d %s", resp.StatusCode, b)
			return
		}
		polled <- l
	}()
	waitCampaign := make(chan response, 1)
	go func() {
		resp, err := http.Post(e.ts.URL+path+"/campaign", "application/json", strings.NewReader(`{"ttl_ms":5000,"wait_ms":30000,"value":"10.0.0.2:8080"}`))
		if err != nil {
			waitCampaign <- response{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		waitCampaign <- response{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	waitUntilState(t, e, name, func(st stateResponse) bool { return st.Waiters == 1 })
	if r := e.release(name, first.LeaseID); r.status != http.StatusOK { // resign
		t.Fatalf("resign: %d %s", r.status, r.body)
	}
	var second api.Lease
	r = <-waitCampaign
	if r.status != http.StatusOK {
		t.Fatalf("the waiting candidate: %d %s", r.status, r.body)
	}
	r.decode(t, &second)
	if second.Token <= first.Token {
		t.Fatalf("term %d after %d", second.Token, first.Token)
	}
	select {
	case l := <-polled:
		if l.Token == first.Token || (l.Leading && l.Token != second.Token) {
			t.Fatalf("the long poll answered %+v after the resignation (terms %d, %d)", l, first.Token, second.Token)
		}
	case err := <-pollErr:
		t.Fatal(err)
	}
	e.release(name, second.LeaseID)
}

// waitUntilState polls GET of a lock until cond holds.
func waitUntilState(t *testing.T, e *env, name string, cond func(stateResponse) bool) {
	t.Helper()
	for i := 0; ; i++ {
		if cond(e.state(name)) {
			return
		}
		if i > 3000 {
			t.Fatalf("%s never reached the state", name)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition, as lock's tests do
	}
}

// TestElectionRefusals: a server on Redis leases refuses elections; bad
// queries and bodies are 400s naming what was wrong.
func TestElectionRefusals(t *testing.T) {
	bs := backends(t)
	name := testenv.Name(t)
	redis := newEnv(t, bs[0].store, nil)
	for _, r := range []response{
		redis.do("POST", "/v1/elections/"+name+"/campaign", `{"value":"a"}`),
		redis.do("GET", "/v1/elections/"+name, ""),
	} {
		if msg := r.errCode(t, http.StatusBadRequest, codeInvalidArgument); !strings.Contains(msg, "etcd") {
			t.Fatalf("Redis server's refusal %q does not say what to do", msg)
		}
	}
	e := newEnv(t, bs[1].store, nil)
	for _, c := range []struct {
		method, path, body, field string
	}{
		{"GET", "?after_token=x", "", fieldAfter},
		{"GET", "?after_token=-1", "", fieldAfter},
		{"GET", "?after_token=9223372036854775808", "", fieldAfter}, // above fence.MaxToken, the spec's int64
		{"GET", "?wait_ms=100", "", fieldWaitMs},
		{"GET", "?after_token=1&wait_ms=99999999", "", fieldWaitMs},
		{"GET", "?after_token=1&after_token=2", "", fieldAfter},
		{"GET", "?token=1", "", ""},
		{"POST", "/campaign", `{"value":""}`, fieldValue},
		{"POST", "/campaign", `{"value":"a\nb"}`, fieldValue},
		{"POST", "/campaign", `{"owner":"a"}`, ""},
		{"POST", "/campaign", `{"ttl_ms":1}`, fieldTTLMs},
	} {
		path := "/v1/elections/" + name + c.path
		r := e.do(c.method, path, c.body)
		r.errCode(t, http.StatusBadRequest, codeInvalidArgument)
		var eb api.ErrorBody
		json.Unmarshal(r.body, &eb)
		if eb.Error.Field != c.field {
			t.Errorf("%s %s %s: field %q, want %q (%s)", c.method, path, c.body, eb.Error.Field, c.field, eb.Error.Message)
		}
	}
	e.do("GET", "/v1/elections/a%2Fb", "").errCode(t, http.StatusBadRequest, codeInvalidArgument)
	e.do("POST", "/v1/elections/"+name, "").errCode(t, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	e.do("GET", "/v1/elections/"+name+"/campaign", "").errCode(t, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	if st := e.state(name); st.Held || st.Waiters != 0 {
		t.Fatalf("a refused request touched the lock: %+v", st)
	}
}

// TestLongPollWaitMsIsAnInteger: a long poll's wait_ms comes in the query,
// not as JSON. "100abc" is no integer and is refused as such; it was
// refused as out of range ("want 0 to 60000"), which told the caller to
// change a number it had right. "007" is seven milliseconds.
func TestLongPollWaitMsIsAnInteger(t *testing.T) {
	e := newEnv(t, backends(t)[1].store, nil)
	path := "/v1/elections/" + testenv.Name(t) + "?after_token=0&wait_ms="
	for _, bad := range []string{"100abc", "1e3", "-", "0x10", "1.5"} {
		msg := e.do("GET", path+bad, "").errCode(t, http.StatusBadRequest, codeInvalidArgument)
		if !strings.Contains(msg, "want an integer") || strings.Contains(msg, "want 0 to") {
			t.Errorf("wait_ms=%s: %q; want it refused as no integer", bad, msg)
		}
	}
	for _, far := range []string{"99999999", "99999999999999999999", "-1"} {
		if msg := e.do("GET", path+far, "").errCode(t, http.StatusBadRequest, codeInvalidArgument); !strings.Contains(msg, "want 0 to") {
			t.Errorf("wait_ms=%s: %q; want it refused as out of range", far, msg)
		}
	}
	if l := e.leader(path + "007"); l.Leading {
		t.Fatalf("nobody campaigns, yet %+v", l)
	}
}
