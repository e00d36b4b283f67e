package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// backend is one lease store under test.
type backend struct {
	name  string
	store lock.LeaseStore
	// shortTTL is a ttl_ms that makes a lease expire soon; the store may
	// round it up (etcd).
	shortTTL int64
}

// backends returns a RedisStore (tokens from an etcd sequencer) and an
// EtcdStore, sharing one embedded etcd under unique prefixes.
func backends(t *testing.T) []backend {
	t.Helper()
	rdb := testenv.Redis(t)
	_, cli := testenv.Etcd(t)
	seq := newSequencer(t, cli)
	rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es.Close() })
	return []backend{
		{name: "redis", store: rs, shortTTL: 100},
		{name: "etcd", store: es, shortTTL: 1000},
	}
}

// env is a Server under httptest.
type env struct {
	t      *testing.T
	srv    *Server
	ts     *httptest.Server
	bearer string // sent when not empty
}

func newLocks(t *testing.T, store lock.LeaseStore) *lock.Client {
	t.Helper()
	c, err := lock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func newEnv(t *testing.T, store lock.LeaseStore, mod func(*Config)) *env {
	t.Helper()
	cfg := Config{Locks: newLocks(t, store), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(validating(t, srv)) // every response is checked against api/openapi.yaml
	t.Cleanup(ts.Close)
	return &env{t: t, srv: srv, ts: ts}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; hdr is pairs of header name and value.
func (e *env) do(method, path, body string, hdr ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.ts.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+e.bearer)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// decode decodes r's body strictly into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// errCode checks that r is an error response with status and code and
// returns its message.
func (r response) errCode(t *testing.T, status int, code api.ErrorCode) string {
	t.Helper()
	var eb api.ErrorBody
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("status %d, body %q: not an error body: %v", r.status, r.body, err)
	}
	if r.status != status || eb.Error.Code != code || eb.Error.Message == "" {
		t.Fatalf("got %d %+v, want %d %s with a message", r.status, eb.Error, status, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type %q", ct)
	}
	return eb.Error.Message
}

func (e *env) acquire(name, body string) (leaseResponse, response) {
	e.t.Helper()
	r := e.do("POST", "/v1/locks/"+name+"/acquire", body)
	var lr leaseResponse
	if r.status == http.StatusOK {
		r.decode(e.t, &lr)
	}
	return lr, r
}

func (e *env) mustAcquire(name, body string) leaseResponse {
	e.t.Helper()
	lr, r := e.acquire(name, body)
	if r.status != http.StatusOK {
		e.t.Fatalf("acquire %s: %d %s", name, r.status, r.body)
	}
	if lr.Name != name || len(lr.LeaseID) != 32 || lr.Token == 0 || lr.TTLMs <= 0 {
		e.t.Fatalf("acquire %s: %+v", name, lr)
	}
	return lr
}

func (e *env) release(name, id string) response {
	e.t.Helper()
	return e.do("POST", "/v1/locks/"+name+"/release", `{"lease_id":"`+id+`"}`)
}

func (e *env) state(name string) stateResponse {
	e.t.Helper()
	r := e.do("GET", "/v1/locks/"+name, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", name, r.status, r.body)
	}
	var st stateResponse
	r.decode(e.t, &st)
	return st
}

// scrape parses GET /metrics.
func (e *env) scrape() map[string]*dto.MetricFamily {
	e.t.Helper()
	r := e.do("GET", "/metrics", "")
	if r.status != http.StatusOK {
		e.t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		e.t.Fatalf("parse /metrics: %v\n%s", err, r.body)
	}
	return mfs
}

// metric returns the value of the counter, gauge or histogram count name
// with the given label pairs; 0 if absent.
func metric(mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf := mfs[name]
	if mf == nil {
		return 0
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// counting wraps a store and counts every call that could touch a key.
type counting struct {
	lock.LeaseStore
	calls atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	c.calls.Add(1)
	return c.LeaseStore.Acquire(ctx, req)
}

func (c *counting) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	c.calls.Add(1)
	return c.LeaseStore.Refresh(ctx, name, id, ttl, seq)
}

func (c *counting) Release(ctx context.Context, name, id, op string) error {
	c.calls.Add(1)
	return c.LeaseStore.Release(ctx, name, id, op)
}

func (c *counting) Inspect(ctx context.Context, name string) (lock.State, error) {
	c.calls.Add(1)
	return c.LeaseStore.Inspect(ctx, name)
}

func (c *counting) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	c.calls.Add(1)
	return c.LeaseStore.Watch(ctx, name, waiter)
}

// watchSignal wraps a store and says when a waiter has started watching.
type watchSignal struct {
	lock.LeaseStore
	watching chan string // receives the lock name of each Watch call
}

func (w *watchSignal) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	ch, stop, err := w.LeaseStore.Watch(ctx, name, waiter)
	select {
	case w.watching <- name:
	default:
	}
	return ch, stop, err
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// redisStoreOn is a Redis lease store on the Redis at addr, with tokens
// from an embedded etcd; calls end at their context's deadline. mods
// change the go-redis options.
func redisStoreOn(t *testing.T, addr string, mods ...func(*redis.Options)) *lock.RedisStore {
	t.Helper()
	o := &redis.Options{Addr: addr, ContextTimeoutEnabled: true}
	for _, m := range mods {
		m(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	_, cli := testenv.Etcd(t)
	rs, err := lock.NewRedisStore(rdb, newSequencer(t, cli))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs
}

// redisDown returns a Redis client of a port where nothing listens.
func redisDown(t *testing.T) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// etcdDown returns an etcd client of a port where nothing listens.
func etcdDown(t *testing.T) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + closedAddr(t)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func newSequencer(t *testing.T, cli *clientv3.Client) *sequencer.Etcd {
	seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	return seq
}
