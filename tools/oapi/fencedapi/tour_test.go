package fencedapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
	"github.com/fenced/fenced/tools/oapi/fencedapi"
)

// newServer runs fenced's API in process, as fenced dev does: an embedded
// etcd holds the leases and issues the tokens.
func newServer(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/tour/"))
	if err != nil {
		t.Fatal(err)
	}
	locks, err := lock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close(context.Background()) })
	srv, err := server.New(server.Config{Locks: locks})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts.URL
}

var leaseID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestTour takes the README's tour through the client generated from
// api/openapi.yaml: every answer decodes into the document's types.
func TestTour(t *testing.T) {
	c, err := fencedapi.NewClientWithResponses(newServer(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const name = "invoice-42"
	ptr := func(n int64) *int64 { return &n }

	doc, err := c.OpenapiWithResponse(ctx)
	if err != nil || doc.StatusCode() != http.StatusOK || doc.YAML200 == nil || (*doc.YAML200)["openapi"] != "3.0.3" {
		t.Fatalf("GET /v1/openapi.yaml: %v %s", err, doc.Status())
	}

	a, err := c.AcquireWithResponse(ctx, name, fencedapi.AcquireRequest{TtlMs: ptr(10000)})
	if err != nil || a.JSON200 == nil {
		t.Fatalf("acquire: %v %s %s", err, a.Status(), a.Body)
	}
	l := *a.JSON200
	if l.Name != name || !leaseID.MatchString(l.LeaseId) || l.Token < 1 || l.TtlMs < 10000 {
		t.Fatalf("acquire: %+v", l)
	}
	t.Logf("acquired %+v", l)

	held, err := c.AcquireWithResponse(ctx, name, fencedapi.AcquireRequest{TtlMs: ptr(10000), WaitMs: ptr(100)})
	if err != nil || held.JSON409 == nil || held.JSON409.Error.Code != fencedapi.ErrorCodeHeld {
		t.Fatalf("acquire of a held lock: %v %s %s", err, held.Status(), held.Body)
	}

	st, err := c.InspectWithResponse(ctx, name)
	if err != nil || st.JSON200 == nil || !st.JSON200.Held || st.JSON200.Token != l.Token {
		t.Fatalf("inspect: %v %s %s", err, st.Status(), st.Body)
	}
	head, err := c.InspectHeadWithResponse(ctx, name)
	if err != nil || head.StatusCode() != http.StatusOK || len(head.Body) != 0 {
		t.Fatalf("HEAD inspect: %v %s %q", err, head.Status(), head.Body)
	}

	r, err := c.RefreshWithResponse(ctx, name, fencedapi.RefreshRequest{LeaseId: l.LeaseId, TtlMs: ptr(10000)})
	if err != nil || r.JSON200 == nil || r.JSON200.Token != l.Token || r.JSON200.LeaseId != l.LeaseId {
		t.Fatalf("refresh: %v %s %s", err, r.Status(), r.Body)
	}

	rel, err := c.ReleaseWithResponse(ctx, name, fencedapi.ReleaseRequest{LeaseId: l.LeaseId})
	if err != nil || rel.JSON200 == nil {
		t.Fatalf("release: %v %s %s", err, rel.Status(), rel.Body)
	}
	lost, err := c.RefreshWithResponse(ctx, name, fencedapi.RefreshRequest{LeaseId: l.LeaseId})
	if err != nil || lost.JSON410 == nil || lost.JSON410.Error.Code != fencedapi.ErrorCodeLost {
		t.Fatalf("refresh after release: %v %s %s", err, lost.Status(), lost.Body)
	}
	st, err = c.InspectWithResponse(ctx, name)
	if err != nil || st.JSON200 == nil || st.JSON200.Held || st.JSON200.Token != 0 {
		t.Fatalf("inspect after release: %v %s %s", err, st.Status(), st.Body)
	}

	next, err := c.AcquireWithResponse(ctx, name, fencedapi.AcquireRequest{})
	if err != nil || next.JSON200 == nil || next.JSON200.Token <= l.Token {
		t.Fatalf("next acquire: %v %s %s; want a token above %d", err, next.Status(), next.Body, l.Token)
	}
	t.Logf("next holder's token %d > %d", next.JSON200.Token, l.Token)

	bad, err := c.AcquireWithResponse(ctx, "bad name", fencedapi.AcquireRequest{})
	if err != nil || bad.JSON400 == nil || bad.JSON400.Error.Code != fencedapi.ErrorCodeInvalidArgument {
		t.Fatalf("acquire of a bad name: %v %s %s", err, bad.Status(), bad.Body)
	}
}
