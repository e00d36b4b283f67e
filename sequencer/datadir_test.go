package sequencer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/fenced/fenced/internal/freeport"
)

// startSecond starts a member on dir in a goroutine and returns its
// result, or fails the test if it has not returned after 20s (before
// defect 140 was fixed, etcd waited for dir's lock as long as the first
// member ran). Then the first, closed by stop, lets it go on, and what it
// started is closed.
func startSecond(t *testing.T, dir string, stop func()) error {
	t.Helper()
	type result struct {
		e   *Embedded
		err error
	}
	done := make(chan result, 1)
	began := time.Now()
	go func() {
		e, err := StartEmbedded(t.Context(), EmbedConfig{Dir: dir, UnsafeNoFsync: true})
		done <- result{e, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		stop()
		r = <-done
		t.Errorf("a second member on %s was still starting after 20s: it waited for the first to stop (then: %v)", dir, r.err)
	}
	if r.e != nil {
		r.e.Close()
		if r.err == nil {
			r.err = errors.New("started")
		}
	}
	t.Logf("second member: %v after %s", r.err, time.Since(began).Round(time.Millisecond))
	return r.err
}

// TestStartEmbeddedRefusesADataDirInUse: a member on a data dir another
// member runs on fails at once, saying so, rather than wait without limit
// for etcd's lock of member/snap/db (defect 140).
func TestStartEmbeddedRefusesADataDirInUse(t *testing.T) {
	dir := t.TempDir()
	first, err := StartEmbedded(t.Context(), EmbedConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	err = startSecond(t, dir, func() { first.Close() })
	if err == nil || !strings.Contains(err.Error(), "etcd data dir "+dir+" is in use by") ||
		!strings.Contains(err.Error(), "stop that process, or use another data dir") {
		t.Fatalf("second member on the same dir: %v, want that the dir is in use", err)
	}
	if runtime.GOOS == "linux" && !strings.Contains(err.Error(), fmt.Sprintf("this process (pid %d", os.Getpid())) {
		t.Errorf("%v: want the holder named, this process", err)
	}
	var in *DataDirInUseError
	if !errors.As(err, &in) || in.Dir != dir || in.File != filepath.Join(dir, "member", "snap", "db") {
		t.Errorf("%#v: want a *DataDirInUseError of %s", err, dir)
	}
	// The first is untouched.
	cli, err := first.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("the first member after the refusal: %v", err)
	}
}

// TestDataDirInUseNamesTheProcess: a lock held by another process (here
// flock(1), the lock bbolt takes) is refused too, naming that process
// where the system says which it is.
func TestDataDirInUseNamesTheProcess(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Fatalf("flock(1), from util-linux, is needed to hold the lock as another process: %v", err)
	}
	dir := t.TempDir()
	e, err := StartEmbedded(t.Context(), EmbedConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	e.Close() // leaves member/snap/db
	db := filepath.Join(dir, "member", "snap", "db")
	holder := exec.Command(flock, "--exclusive", db, "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Kill()
		holder.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for checkDataDirFree(dir) == nil {
		if time.Now().After(deadline) {
			t.Fatal("flock(1) did not lock the db within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	err = startSecond(t, dir, func() { holder.Process.Kill() })
	var in *DataDirInUseError
	if !errors.As(err, &in) {
		t.Fatalf("a member on a dir whose db flock(1) holds: %v, want a *DataDirInUseError", err)
	}
	if runtime.GOOS != "linux" {
		return
	}
	// flock(1) holds the lock, then runs sleep, which inherits it: the
	// kernel names the process that took it.
	if want := fmt.Sprintf("process %d (%s --exclusive %s sleep 60)", holder.Process.Pid, flock, db); !strings.Contains(err.Error(), want) {
		t.Errorf("%v: want it to name %s", err, want)
	}
}

// TestStartEtcdReturnsOnCancel: a start of etcd that does not end (etcd
// waits for its data dir's lock without limit) still returns when its
// context ends, saying why it may not have ended (defect 140); what it
// started is closed when it ends.
func TestStartEtcdReturnsOnCancel(t *testing.T) {
	e := &Embedded{dir: t.TempDir(), startDone: make(chan struct{})}
	release := make(chan struct{})
	blocked := func(*embed.Config) (*embed.Etcd, error) {
		<-release
		return nil, errors.New("released")
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	began := time.Now()
	abandoned, err := e.startEtcd(ctx, embed.NewConfig(), blocked, nil)
	if !abandoned || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "still opening its data") {
		t.Errorf("startEtcd cancelled: %v, %v: want it abandoned, with context.Canceled and why", abandoned, err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("startEtcd returned %s after its context ended", d)
	}
	close(release)
	select {
	case <-e.startDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned start did not end once etcd's start returned")
	}
}

// TestEmbedConfigURLScheme: an embedded member is reached over plain
// HTTP; any other scheme is refused at once (defect 141).
func TestEmbedConfigURLScheme(t *testing.T) {
	// Free ports: a member that takes the scheme then starts.
	port := func(scheme string) string {
		u, err := freeport.URL()
		if err != nil {
			t.Fatal(err)
		}
		return scheme + strings.TrimPrefix(u, "http")
	}
	for _, c := range []EmbedConfig{
		{ClientURL: port("ftp")},
		{ClientURL: port("htp")},
		{PeerURL: port("unix")},
		{ClientURL: port("http"), ListenClientURL: port("ftp")},
		{PeerURL: port("http"), ListenPeerURL: port("htp")},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		c.UnsafeNoFsync = true
		e, err := StartEmbedded(ctx, c)
		cancel()
		if e != nil {
			e.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "want http://host:port") {
			t.Errorf("StartEmbedded(%+v): %v, want a refusal of the scheme", c, err)
		}
	}
}

// TestParseEndpointsScheme: an endpoint is http://, https:// or
// host:port; any other scheme is refused, not taken and waited on
// (defect 141).
func TestParseEndpointsScheme(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:2379", "https://etcd-0:2379", "127.0.0.1:2379", "http://a:1,https://b:2,c:3"} {
		if _, err := ParseEndpoints(ok); err != nil {
			t.Errorf("ParseEndpoints(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"htp://127.0.0.1:41541", "ftp://127.0.0.1:2379", "unix://127.0.0.1:2379", "unixs://a:1", "http://a:1,htps://b:2"} {
		_, err := ParseEndpoints(bad)
		if err == nil || !strings.Contains(err.Error(), "want http://host:port, https://host:port or host:port") {
			t.Errorf("ParseEndpoints(%q): %v, want a refusal of the scheme", bad, err)
		}
	}
}
