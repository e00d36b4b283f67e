package sequencer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DataDirInUseError is StartEmbedded's error when another process, or
// another member of this one, runs on its data dir: it holds the lock of
// the dir's bbolt file, member/snap/db. etcd would wait for that lock
// without limit, silently (docs/design.md, defect 140).
type DataDirInUseError struct {
	Dir  string // the data dir
	File string // the locked file, Dir/member/snap/db
	// PID is the process that holds the lock, when known (Linux: from
	// /proc/locks), else 0; Command is its command line, when known.
	PID     int
	Command string
}

func (e *DataDirInUseError) Error() string {
	return fmt.Sprintf("sequencer: etcd data dir %s is in use by %s, which holds the lock of %s: a fenced or etcd still runs on it; stop that process, or use another data dir", e.Dir, e.Holder(), e.File)
}

// Holder names the process that holds the lock: "process 123 (fenced dev
// ...)", "this process (pid 123)", or "another process" when that is not
// known.
func (e *DataDirInUseError) Holder() string {
	switch {
	case e.PID <= 0:
		return "another process"
	case e.PID == os.Getpid():
		return fmt.Sprintf("this process (pid %d: another member of it)", e.PID)
	case e.Command != "":
		return fmt.Sprintf("process %d (%s)", e.PID, e.Command)
	}
	return fmt.Sprintf("process %d", e.PID)
}

// checkDataDirFree fails with a *DataDirInUseError when another process
// holds the lock of dir's bbolt file. It takes the lock bbolt takes, flock
// LOCK_EX, but without waiting, and lets it go at once (defect 140). Any
// other failure (no such file yet, no permission, a file system without
// flock) is etcd's to meet and report: nil.
func checkDataDirFree(dir string) error {
	db := filepath.Join(dir, "member", "snap", "db") // etcd's ServerConfig.BackendPath
	f, err := os.Open(db)
	if err != nil {
		return nil
	}
	defer f.Close() // drops the lock, if taken
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return nil
	}
	e := &DataDirInUseError{Dir: dir, File: db}
	if fi, err := f.Stat(); err == nil {
		e.PID = flockHolder(fi)
	}
	if e.PID > 0 && e.PID != os.Getpid() {
		e.Command = commandLine(e.PID)
	}
	return e
}

// commandLine is process pid's command line, shortened, or "" when it
// cannot be read.
func commandLine(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
