package sequencer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A member started with no data dir keeps its data in a temporary dir that
// Close removes. A process killed before Close (SIGKILL, a crash, a test
// binary killed at its timeout) left the dir behind, with etcd's WAL
// preallocated to 64 MB, on a /tmp that is often memory. So each such dir
// holds a lock (flock on its .lock file) for as long as its member runs,
// and every start of a member removes the dirs whose lock is free: their
// process is gone, since the kernel drops a process's locks when it dies.
const (
	tempPrefix    = "fenced-etcd-"
	newTempPrefix = ".fenced-etcd-new-" // not yet locked: never swept
	lockName      = ".lock"
)

// tempDataDir makes a locked temporary data dir, after removing those of
// members whose process is gone. The dir is created under a name the sweep
// ignores and renamed once locked, so no sweep sees it unlocked.
func tempDataDir() (dir string, lock *os.File, err error) {
	sweepTempDirs()
	tmp, err := os.MkdirTemp("", newTempPrefix)
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if err != nil {
			if lock != nil {
				lock.Close()
			}
			os.RemoveAll(tmp)
		}
	}()
	if lock, err = os.OpenFile(filepath.Join(tmp, lockName), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return "", nil, err
	}
	if err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return "", nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	dir = filepath.Join(filepath.Dir(tmp), tempPrefix+strings.TrimPrefix(filepath.Base(tmp), newTempPrefix))
	if err = os.Rename(tmp, dir); err != nil {
		return "", nil, err
	}
	return dir, lock, nil
}

// sweepTempDirs removes the temporary data dirs whose lock no process holds.
// A dir without a lock file (made by an older fenced) is left alone: there
// is no telling whether its member runs.
func sweepTempDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		f, err := os.OpenFile(filepath.Join(d, lockName), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		// Held: its member runs. Any other error (another user's dir):
		// not ours to judge.
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			_ = os.RemoveAll(d) // its member is gone; best effort
		}
		f.Close()
	}
}
