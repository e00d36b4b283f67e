//go:build linux

package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestExecKeepsSignalsIgnoredAtStart: a signal ignored when fenced exec
// starts (SIGHUP under nohup; SIGINT for `cmd &` in a script) stays
// ignored, for fenced exec and for CMD, as without fenced exec. Go's
// signal.Notify un-ignored it: CMD started with it not ignored, and fenced
// exec passed it on, so `nohup fenced exec NAME -- job &` ended at logout.
// The control, SIGHUP not ignored, is still passed on, and ends CMD
// (129). After an ignored signal, SIGUSR1 (passed on) shows that both
// still ran: CMD exits 110 on it.
func TestExecKeepsSignalsIgnoredAtStart(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	script := `trap 'exit 110' USR1; echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; sleep 300 & wait`
	for _, c := range []struct {
		name    string
		sig     syscall.Signal
		ignored bool
		code    int // fenced exec's, CMD's
	}{
		{"SIGHUP", syscall.SIGHUP, true, 110},
		{"SIGINT", syscall.SIGINT, true, 110},
		{"SIGHUPNotIgnored", syscall.SIGHUP, false, 128 + int(syscall.SIGHUP)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name, started := testenv.Name(t), filepath.Join(t.TempDir(), "started")
			// Go's exec.Cmd cannot start a process with a signal ignored:
			// a shell does, and execs fenced exec.
			wrap := `exec "$0" "$@"`
			if c.ignored {
				wrap = `trap "" ` + sigName(c.sig) + `; ` + wrap
			}
			cmd := exec.Command("sh", "-c", wrap, bin, "exec", "--url", url, "--ttl", "5s", name, "--", "sh", "-c", script, started)
			cmd.Env = childEnv()
			stderr := &testenv.SyncBuffer{}
			cmd.Stderr = stderr
			// A session of its own: no controlling terminal, whatever the
			// test's, so that fenced exec passes SIGINT on.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			})
			pid := readPID(t, started, "CMD's pid")
			t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
			if got := sigIgnored(t, pid, c.sig); got != c.ignored {
				t.Errorf("CMD ignores %v: %v, want %v (as it would without fenced exec)", c.sig, got, c.ignored)
			}
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if c.ignored {
				// The control's SIGHUP ends CMD by itself. A SIGUSR1 sent
				// right after it may be passed on first: two signals sent
				// to a process reach its threads' handlers in either order,
				// and CMD then exited 110 (CI, 1 run).
				_ = cmd.Process.Signal(syscall.SIGUSR1)
			}
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("fenced exec still runs 30s after %v and SIGUSR1; stderr:\n%s", c.sig, stderr.String())
			}
			if code := cmd.ProcessState.ExitCode(); code != c.code {
				t.Fatalf("%v (ignored at start: %v), then SIGUSR1: fenced exec exit %d, want %d; stderr:\n%s", c.sig, c.ignored, code, c.code, stderr.String())
			}
			if a.held(name) {
				t.Fatal("the lock is still held after fenced exec exited")
			}
		})
	}
}

// sigName is sig's name as the shell's trap takes it: HUP.
func sigName(sig syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGHUP: "HUP", syscall.SIGINT: "INT"}[sig]
}

// sigIgnored reads from /proc whether process pid ignores sig.
func sigIgnored(t *testing.T, pid int, sig syscall.Signal) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn %q: %v", v, err)
			}
			return mask&(1<<(uint(sig)-1)) != 0
		}
	}
	t.Fatalf("no SigIgn in /proc/%d/status", pid)
	return false
}
