//go:build linux

package main_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestExecReadsTheTerminalWithStdinRedirected: fenced exec is its
// terminal's foreground job with stdin redirected (</dev/null, a pipe).
// It decided terminal mode from stdin alone, so it put CMD in a process
// group of its own, in the background: a CMD that reads the terminal (a
// password prompt through /dev/tty: sudo, ssh, git) was stopped by SIGTTIN
// for ever while the lease was kept alive. With stdin the terminal it read
// its answer. fenced elect shares the code.
func TestExecReadsTheTerminalWithStdinRedirected(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	for _, c := range []struct {
		name, verb string
		stdin      string // tty, null or pipe
	}{
		{"StdinTTY", "exec", "tty"},
		{"StdinDevNull", "exec", "null"},
		{"StdinPipe", "exec", "pipe"},
		{"ElectStdinDevNull", "elect", "null"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name := testenv.Name(t)
			master, tty := openPTY(t)
			script := `printf 'password: ' > /dev/tty; read x < /dev/tty; echo "got $x"`
			cmd := exec.Command(bin, c.verb, "--url", url, "--ttl", "5s", name, "--", "sh", "-c", script)
			cmd.Env = childEnv()
			cmd.Stdout, cmd.Stderr = tty, tty
			switch c.stdin {
			case "tty":
				cmd.Stdin = tty
			case "pipe":
				cmd.Stdin = strings.NewReader("") // exec makes it a pipe, at EOF
			}
			// A session of its own with the terminal as its controlling
			// terminal (fd 1, stdout): fenced leads the terminal's
			// foreground process group, as when a shell runs it.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 1}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			tty.Close()
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			out, read := readTerminal(master)
			t.Cleanup(func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // fenced's group, CMD's too if it is in it
				_ = cmd.Process.Kill()
				<-exited
				master.Close()
				<-read
			})
			eventually(t, 30*time.Second, "the prompt", func() bool { return strings.Contains(out.String(), "password:") })
			if _, err := master.Write([]byte("hello\n")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("fenced %s still runs 30s after CMD was given its answer (CMD stopped by SIGTTIN in a background process group?); lock held: %v; terminal:\n%s",
					c.verb, a.held(name), out.String())
			}
			if !strings.Contains(out.String(), "got hello") {
				t.Fatalf("CMD did not read the terminal; terminal:\n%s", out.String())
			}
		})
	}
}

// TestExecCtrlZWithStdinRedirected: `fenced exec NAME -- CMD < /dev/null`
// typed in an interactive shell. With stdin not the terminal, fenced exec
// put CMD in a process group of its own, outside the terminal's foreground
// job, and Ctrl-Z stopped fenced exec alone: CMD ran on while nobody
// refreshed its lease, past its expiry and beside the next holder. Now the
// terminal stops both, as with stdin the terminal.
func TestExecCtrlZWithStdinRedirected(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("needs bash for a job-control shell: install it (apt-get install bash)")
	}
	t.Parallel()
	_, url := startDev(t, nil)
	for _, c := range []struct{ name, before, after string }{
		{"StdinTTY", "", ""},
		{"StdinDevNull", "", " < /dev/null"},
		{"StdinPipe", ": | ", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name, dir := testenv.Name(t), t.TempDir()
			pidFile, script := filepath.Join(dir, "pid"), filepath.Join(dir, "cmd.sh")
			if err := os.WriteFile(script, []byte(`echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 300`+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			master, tty := openPTY(t)
			shell := exec.Command("bash", "--norc", "--noprofile", "-i")
			shell.Env = childEnv("PS1=$ ")
			shell.Stdin, shell.Stdout, shell.Stderr = tty, tty, tty
			shell.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := shell.Start(); err != nil {
				t.Fatal(err)
			}
			tty.Close()
			exited := make(chan struct{})
			go func() { _ = shell.Wait(); close(exited) }()
			out, read := readTerminal(master)
			var pid, fenced int // CMD's, fenced exec's
			t.Cleanup(func() {
				for _, p := range []int{pid, fenced} {
					if pgid, err := syscall.Getpgid(p); p > 0 && err == nil {
						_ = syscall.Kill(-pgid, syscall.SIGKILL)
					}
				}
				_ = shell.Process.Kill()
				<-exited
				master.Close()
				<-read
			})
			line := fmt.Sprintf("%s%s exec --url %s %s -- sh %s %s%s\n", c.before, bin, url, name, script, pidFile, c.after)
			if _, err := master.Write([]byte(line)); err != nil {
				t.Fatal(err)
			}
			pid = readPID(t, pidFile, "CMD's pid")
			fenced = procStat(pid).ppid
			if _, err := master.Write([]byte{0x1a}); err != nil { // Ctrl-Z
				t.Fatal(err)
			}
			// Nothing tells when another's process stops: /proc is polled.
			deadline, tick := time.Now().Add(30*time.Second), time.NewTicker(20*time.Millisecond)
			defer tick.Stop()
			for procStat(fenced).state != 'T' || procStat(pid).state != 'T' {
				if time.Now().After(deadline) {
					t.Fatalf("30s after Ctrl-Z: fenced exec (pid %d, group %d) in state %c, CMD (pid %d, group %d) in state %c, want both stopped (T); terminal:\n%s",
						fenced, procStat(fenced).pgrp, procStat(fenced).state, pid, procStat(pid).pgrp, procStat(pid).state, out.String())
				}
				<-tick.C
			}
		})
	}
}

// readTerminal reads what is written to the terminal of master into out,
// until its last writer closes it (EIO) or master is closed; read is closed
// then.
func readTerminal(master *os.File) (out *testenv.SyncBuffer, read chan struct{}) {
	out, read = &testenv.SyncBuffer{}, make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(out, master)
	}()
	return out, read
}

// stat is what procStat reads of a process: 0 values once it is gone.
type stat struct {
	state      rune
	ppid, pgrp int
}

// procStat reads /proc/PID/stat.
func procStat(pid int) stat {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}
	}
	// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
	var s stat
	if i := bytes.LastIndexByte(b, ')'); i >= 0 {
		_, _ = fmt.Sscanf(string(b[i+1:]), " %c %d %d", &s.state, &s.ppid, &s.pgrp)
	}
	return s
}
