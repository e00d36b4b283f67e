package main_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// hungServer is the URL of a server that takes connections and requests
// and never answers (a wedged process, a partition after the connect).
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() { // ends when the listener closes
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// TestCommandsGiveUpOnAServerThatDoesNotAnswer: fenced exec's first
// attempt and fenced locks asked the server for no wait, and the client
// bounds such a request by its context alone, which only a signal ended:
// against a server that took the request and never answered, fenced exec
// --wait 1s and fenced locks get ran until killed. Now --timeout bounds
// them (and --wait, fenced exec's first attempt).
func TestCommandsGiveUpOnAServerThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	url := hungServer(t)
	name := testenv.Name(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--url", url, "--wait", "1s", name, "--", "true"}, "no answer from " + url},
		{[]string{"exec", "--url", url, "--try", "--timeout", "1s", name, "--", "true"}, "no answer from " + url},
		{[]string{"locks", "get", "--url", url, "--timeout", "1s", name}, "no answer from " + url + " within --timeout 1s"},
		{[]string{"locks", "release", "--url", url, "--timeout", "1s", name}, "may have been released"},
	} {
		p := start(t, nil, c.args...)
		code := p.wait(20 * time.Second)
		if stderr := p.stderr.String(); code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s: exit %d, stderr:\n%s\nwant exit 1 and %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}
}

// gone reports whether process pid has ended: no longer there, or a
// zombie that runs no more code.
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// TestExecStopsWhatCMDStarted: CMD's own children are part of the work the
// lock covers. fenced exec signalled CMD alone, so a shell script's
// children outlived it: a SIGTERM passed on, or the SIGTERM after the
// lease was lost, ended the shell and left its job running, while fenced
// exec released the lock (or reported it lost) and exited, and the next
// holder ran beside it. CMD now runs in a process group of its own (unless
// fenced exec runs in a terminal's foreground, where the terminal signals
// the whole group itself), and signals go to the group.
func TestExecStopsWhatCMDStarted(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	for _, c := range []struct {
		name string
		end  func(p *proc, lock string)
		code int
	}{
		{"SIGTERM", func(p *proc, _ string) { p.signal(syscall.SIGTERM) }, 143},
		{"LeaseLost", func(_ *proc, lock string) { a.must(200, "DELETE", "/v1/locks/"+lock, "") }, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, pidFile := testenv.Name(t), filepath.Join(t.TempDir(), "pid")
			p := start(t, nil, "exec", "--url", url, "--ttl", "3s", "--grace", "1s", name, "--",
				"sh", "-c", `sleep 300 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; wait`, pidFile)
			pid := readPID(t, pidFile, "the job's pid")
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			c.end(p, name)
			if code := p.wait(20 * time.Second); code != c.code {
				t.Errorf("exit %d, want %d", code, c.code)
			}
			if !gone(pid) {
				t.Fatalf("the job CMD started (pid %d) still runs after fenced exec exited; the lock is held: %v", pid, a.held(name))
			}
		})
	}
}

// TestExecStopsWhatCMDDetached: a process CMD started in a session of its
// own (setsid, as a daemon's double fork does) left CMD's process group,
// so ending the group missed it, and when CMD exited it became init's: it
// ran on after fenced exec released the lock, beside the next holder.
// fenced exec now adopts CMD's orphans (Linux: PR_SET_CHILD_SUBREAPER) and
// stops them, SIGTERM then SIGKILL after --grace, before it releases.
func TestExecStopsWhatCMDDetached(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	name, pidFile := testenv.Name(t), filepath.Join(t.TempDir(), "pid")
	// CMD exits as soon as the detached process has written its pid.
	script := `setsid sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 300' "$0" </dev/null >/dev/null 2>&1 &
while [ ! -f "$0" ]; do sleep 0.01; done`
	code, _, stderr := run(t, nil, "exec", "--url", url, "--grace", "5s", name, "--", "sh", "-c", script, pidFile)
	pid := readPID(t, pidFile, "the detached process's pid")
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, stderr)
	}
	if !gone(pid) {
		t.Fatalf("the process CMD detached (pid %d) still runs after fenced exec exited; the lock is held: %v", pid, a.held(name))
	}
	if !strings.Contains(stderr, "outside its process group") {
		t.Errorf("stderr does not say what it stopped:\n%s", stderr)
	}
	if a.held(name) {
		t.Fatal("the lock is still held after fenced exec exited")
	}
}

// TestExecKilledStopsCMD: fenced exec killed outright (SIGKILL, the OOM
// killer) refreshes the lease no more, and CMD ran on until the lease
// expired and beyond, beside the next holder. CMD now gets SIGTERM from
// the kernel when fenced exec dies (Linux: PR_SET_PDEATHSIG).
func TestExecKilledStopsCMD(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	name, pidFile := testenv.Name(t), filepath.Join(t.TempDir(), "pid")
	p := start(t, nil, "exec", "--url", url, "--ttl", "30s", name, "--",
		"sh", "-c", `echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300`, pidFile)
	pid := readPID(t, pidFile, "CMD's pid")
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	p.signal(syscall.SIGKILL)
	p.wait(20 * time.Second)
	eventually(t, 10*time.Second, "CMD stops after fenced exec was killed", func() bool { return gone(pid) })
}

// readPID waits for file to hold a pid, written whole (a rename), and
// returns it.
func readPID(t *testing.T, file, what string) int {
	t.Helper()
	var pid int
	eventually(t, 20*time.Second, what, func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return pid
}

// TestExecPassesOnSignals: a signal fenced exec did not catch killed it
// (Go's default) and left CMD running: its lease, no longer refreshed, ran
// out under it and the next holder ran beside it. SIGHUP first (a shell
// sends it to the process group of each of its jobs as it exits); then
// SIGQUIT (a JVM's thread dump), SIGUSR1 and SIGUSR2 (many daemons'
// reopen-the-logs and reload), which CMD may well take and run on. fenced
// exec passes each on, as SIGTERM and SIGINT, and releases the lock once
// CMD has exited. CMD here exits 100+N on signal N.
func TestExecPassesOnSignals(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	script := `trap 'exit 101' HUP; trap 'exit 103' QUIT; trap 'exit 110' USR1; trap 'exit 112' USR2
echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; sleep 300 & wait`
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			name, started := testenv.Name(t), filepath.Join(t.TempDir(), "started")
			p := start(t, nil, "exec", "--url", url, "--ttl", "3s", name, "--", "sh", "-c", script, started)
			pid := readPID(t, started, "CMD's pid")
			t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
			p.signal(sig)
			if code := p.wait(20 * time.Second); code != 100+int(sig) {
				t.Errorf("exit %d, want %d: CMD's, after the %v passed on", code, 100+int(sig), sig)
			}
			if !gone(pid) {
				t.Fatalf("CMD (pid %d) still runs after fenced exec exited; the lock is held: %v", pid, a.held(name))
			}
			if a.held(name) {
				t.Fatal("the lock is still held after fenced exec exited")
			}
		})
	}
}

// TestExecHoldReleasesOnSIGHUP: fenced exec with no command holds the lock
// until interrupted. SIGHUP, its terminal closing, killed it (Go's
// default) and left the lock held by nobody until its TTL ran out; it now
// releases the lock and exits 0, as on SIGINT. fenced elect shares the
// code.
func TestExecHoldReleasesOnSIGHUP(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	name := testenv.Name(t)
	p := start(t, nil, "exec", "--url", url, "--ttl", "60s", name)
	if l := p.line(20 * time.Second); !strings.HasPrefix(l, "holding lock") {
		t.Fatalf("first line %q, want holding lock ...", l)
	}
	p.signal(syscall.SIGHUP)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Errorf("exit %d, want 0: released on SIGHUP", code)
	}
	if a.held(name) {
		t.Fatal("the lock is still held after fenced exec exited on SIGHUP")
	}
}

// TestSIGHUPWhileStarting: fenced caught SIGHUP (a reload of the token
// file: the systemd unit's ExecReload) only once it served, and Go's
// default for an uncaught SIGHUP ended it. fenced serve waits for etcd at
// start, as long as etcd is down, so a reload in that time killed it, and
// systemd, which counts SIGHUP as a clean end, did not restart it. A
// SIGHUP while starting is now kept, and the tokens are reloaded once
// fenced serves.
func TestSIGHUPWhileStarting(t *testing.T) {
	t.Parallel()
	etcd := testenv.FreeURL(t) // nothing listens there: fenced waits for it
	p := start(t, nil, "serve", "--listen", "127.0.0.1:0", "--lease-store", "etcd", "--etcd-endpoints", etcd)
	eventually(t, 30*time.Second, "the log line that fenced waits for etcd", func() bool {
		return strings.Contains(p.stderr.String(), "fenced waits for it before serving")
	})
	p.signal(syscall.SIGHUP)
	p.signal(syscall.SIGTERM) // the lower number is delivered first: SIGHUP
	p.wait(30 * time.Second)
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("fenced serve was killed by %v while it waited for etcd", ws.Signal())
	}
}
