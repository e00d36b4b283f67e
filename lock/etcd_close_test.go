package lock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Defect 170: the group commit's runners outlived EtcdStore.Close by up to
// 10 s (their batches committed on contexts of their own, and Close did not
// wait for them), so a create of a caller that had left could commit after
// Close.
//
// Close while etcd hangs: lock.Client.Close must end by its context, and
// EtcdStore.Close "waits for the work it started, which it cuts short".
// Afterwards no goroutine of the store's may still be running.
func TestEtcdCloseWaitsForItsGroupCommits(t *testing.T) {
	e, _ := testenv.Etcd(t)
	p, cli := testenv.EtcdThroughProxy(t, e)
	prefix := "/" + testenv.Name(t) + "/"
	direct := testenv.EtcdClient(t, e.ClientURL())
	other := newClient(t, newEtcdStore(t, direct, lock.WithEtcdPrefix(prefix)))
	busy, err := other.Acquire(t.Context(), "busy", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release(context.Background())

	before := testenv.Goroutines()
	s, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	c, err := lock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := c.Acquire(t.Context(), "held-"+string(rune('a'+i)), 3*time.Second, lock.WithKeepAlive()); err != nil {
			t.Fatal(err)
		}
	}
	p.Hold(true) // etcd stops answering this process
	defer p.Hold(false)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.Acquire(ctx, "w-"+string(rune('a'+i)), 3*time.Second)
			t.Logf("acquire %d: %v", i, err)
		})
	}
	wg.Go(func() {
		_, err := c.Acquire(context.Background(), "busy", 3*time.Second, lock.WithWait(20*time.Second))
		t.Logf("waiting acquire: %v", err)
	})
	time.Sleep(700 * time.Millisecond) // batches in flight, some stalled
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	began := time.Now()
	cerr := c.Close(ctx)
	cancel()
	tookClient := time.Since(began)
	began = time.Now()
	s.Close()
	tookStore := time.Since(began)
	began = time.Now()
	t.Logf("client Close took %v (%v), store Close %v", tookClient.Round(time.Millisecond), cerr, tookStore.Round(time.Millisecond))
	if tookClient > time.Second {
		t.Errorf("lock.Client.Close took %v past its 500ms context", tookClient)
	}
	if tookStore > time.Second {
		t.Errorf("EtcdStore.Close took %v", tookStore)
	}
	wgDone := make(chan struct{})
	go func() { wg.Wait(); close(wgDone) }()
	select {
	case <-wgDone:
	case <-time.After(6 * time.Second):
		t.Errorf("acquisitions still running 6s after Close")
	}
	// What the store started: still running 1 s after both Closes?
	deadline := time.Now().Add(time.Second)
	var left []string
	for {
		left = left[:0]
		for _, g := range testenv.GoroutinesIn("github.com/fenced/fenced/") {
			id, _, _ := strings.Cut(g, " [")
			if !before[id] && !strings.Contains(g, "testenv.") && !strings.Contains(g, "faultproxy") && !strings.Contains(g, "etcd_close_test") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		gone := time.Now()
		for time.Since(gone) < 15*time.Second {
			n := 0
			for _, g := range testenv.GoroutinesIn("groupcommit") {
				id, _, _ := strings.Cut(g, " [")
				if !before[id] {
					n++
				}
			}
			if n == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("the group commit's goroutines ended %v after the store's Close returned", time.Since(began).Round(100*time.Millisecond))
		t.Errorf("%d goroutine(s) of the store still running 1s after Close:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
}
