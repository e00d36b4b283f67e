package sequencer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A member started with no data dir removes the dirs that members killed
// before Close left behind (their lock is free), and only those: not a
// running member's (locked), not one without a lock file (an older
// fenced's). Its own dir is locked while it runs and gone after Close.
func TestTempDataDirsOfGoneMembersAreRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	mk := func(name string, lock bool) string {
		d := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Join(d, "member", "wal"), 0o700); err != nil {
			t.Fatal(err)
		}
		if lock {
			if err := os.WriteFile(filepath.Join(d, lockName), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	gone, running, older := mk(tempPrefix+"gone", true), mk(tempPrefix+"running", true), mk(tempPrefix+"older", false)
	held, err := os.OpenFile(filepath.Join(running, lockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := StartEmbedded(ctx, EmbedConfig{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dir of a gone member is still there: %v", err)
	}
	for _, d := range []string{running, older} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(d), err)
		}
	}
	if filepath.Dir(e.dir) != tmp || !strings.HasPrefix(filepath.Base(e.dir), tempPrefix) {
		t.Fatalf("the member's dir is %s, want %s%s*", e.dir, tmp+"/", tempPrefix)
	}
	f, err := os.OpenFile(filepath.Join(e.dir, lockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("the running member's dir is not locked: flock gave %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the member's dir is still there after Close: %v", err)
	}
}
