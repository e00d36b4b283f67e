// Package testenv gives tests the real services they run against: an
// embedded etcd, the machine's Redis and Postgres. A service that cannot be
// reached fails the test with what to do; it never skips.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Etcd starts a single-member embedded etcd for the test and returns a
// client of it. Both are closed by t.Cleanup.
func Etcd(t testing.TB) (*sequencer.Embedded, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := e.Client()
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// RedisAddr is the test Redis: $FENCED_TEST_REDIS, default 127.0.0.1:6379.
func RedisAddr() string {
	if a := os.Getenv("FENCED_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// Redis returns a client of the test Redis, checked with PING.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s does not answer (%v): start it (redis-server --port 6379) or set FENCED_TEST_REDIS", RedisAddr(), err)
	}
	return rdb
}

// PostgresDSN is the test database: $FENCED_TEST_POSTGRES, else
// $DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test.
func PostgresDSN() string {
	for _, k := range []string{"FENCED_TEST_POSTGRES", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Name returns a name unique to this test run, safe as a lock name.
func Name(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "t-" + hex.EncodeToString(b[:])
}

// FreeURL returns http://127.0.0.1:port for a loopback port free a moment
// ago, never handed out before in this process (package freeport).
func FreeURL(t testing.TB) string {
	t.Helper()
	u, err := freeport.URL()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// SyncBuffer is a bytes.Buffer safe to write from one goroutine (a
// process's output, a logger) and read from the test's.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Next receives the next value from ch, failing the test if ch is closed
// or nothing comes within 30s.
func Next[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received in 30s")
	}
	var zero T
	return zero
}

// Observer is a client that observes elections (lock.Client and
// client.Client; T is lock.Leader, which this package cannot import).
type Observer[T any] interface {
	Observe(ctx context.Context, name string) (<-chan T, error)
	Close(ctx context.Context) error
}

// CloseEndsObserve checks that c.Close ends an Observe whose ctx lives
// on: its channel closes within 5s, and a later Observe returns closed.
func CloseEndsObserve[T any](t *testing.T, c Observer[T], closed error) {
	t.Helper()
	name := Name(t)
	obs, err := c.Observe(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	Next(t, obs)
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case v, ok := <-obs:
		if ok {
			t.Fatalf("observed %+v after Close; want the channel closed", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel is still open 5s after Close")
	}
	if _, err := c.Observe(t.Context(), name); !errors.Is(err, closed) {
		t.Fatalf("Observe after Close: %v, want %v", err, closed)
	}
}

// WaitCompacted writes to key until etcd refuses a read at the revision of
// the first write as compacted, and fails the test if that takes longer
// than within. etcd's periodic compactor compacts to a revision it noted a
// retention ago, and only while revisions move, hence the writes.
func WaitCompacted(t testing.TB, cli *clientv3.Client, key string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	first, err := cli.Put(ctx, key, "0")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := cli.Put(ctx, key, "1"); err != nil {
			t.Fatal(err)
		}
		_, err := cli.Get(ctx, key, clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d still readable after %s: not compacted", first.Header.Revision, within)
		}
		<-tick.C
	}
}

// WaitUntil polls cond every 2ms until it holds, and fails the test if it
// does not within the given time. Polling a condition that another
// goroutine makes true is how a test waits for progress it cannot be told
// of.
func WaitUntil(t testing.TB, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %s", within)
		}
		<-tick.C
	}
}

// Parallel makes the test binary run up to n parallel tests at once, unless
// its command line set -parallel (go test -parallel, or GOFLAGS). Call it
// from TestMain before m.Run. It is for a package whose tests mostly wait
// (TTLs, elections, failovers, on servers of their own) rather than
// compute: the default, GOMAXPROCS, runs two at once on a two-CPU machine
// that they leave three quarters idle.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err) // testing registers the flag before TestMain runs
		}
	}
}
