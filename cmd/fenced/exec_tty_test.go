//go:build linux

package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/fenced/fenced/internal/testenv"
)

// TestExecCtrlCInATerminalReachesCMDOnce: fenced exec in a terminal's
// foreground, its CMD in the same process group. Ctrl-C makes the
// terminal send SIGINT to the whole group, CMD included; fenced exec
// passed it on as well, so CMD got it twice, and many programs take a
// second SIGINT as "stop cleaning up, quit now". Ctrl-\ (SIGQUIT, a JVM's
// thread dump) killed fenced exec with Go's stack dump and left CMD
// running under a lease nobody refreshed; it too reaches CMD once now, and
// fenced exec releases the lock when CMD ends.
func TestExecCtrlCInATerminalReachesCMDOnce(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	for _, c := range []struct {
		key  string
		char byte
		sig  string
	}{{"Ctrl-C", 3, "INT"}, {"Ctrl-backslash", 0x1c, "QUIT"}} {
		t.Run(c.key, func(t *testing.T) {
			t.Parallel()
			name := testenv.Name(t)
			master, tty := openPTY(t)
			dir := t.TempDir()
			got, stop := filepath.Join(dir, "got"), filepath.Join(dir, "stop")
			// CMD counts the signals it gets, a line each, and ends when told.
			script := `trap 'echo sig >> "$GOT"' ` + c.sig + `; echo ready; while [ ! -e "$STOP" ]; do :; done`
			cmd := exec.Command(bin, "exec", "--url", url, name, "--", "sh", "-c", script)
			cmd.Env = childEnv("GOT="+got, "STOP="+stop)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
			// A session of its own with the terminal as its controlling
			// terminal: fenced exec leads the terminal's foreground process
			// group, as when a shell runs it.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			tty.Close()
			var waitErr error
			exited := make(chan struct{})
			go func() { waitErr = cmd.Wait(); close(exited) }()
			out := &testenv.SyncBuffer{}
			read := make(chan struct{})
			go func() { // ends when the terminal's last writer closes it (EIO)
				defer close(read)
				b := make([]byte, 4096)
				for {
					n, err := master.Read(b)
					out.Write(b[:n])
					if err != nil {
						return
					}
				}
			}()
			t.Cleanup(func() {
				_ = os.WriteFile(stop, nil, 0o600)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				master.Close()
				<-read
			})

			eventually(t, 30*time.Second, "CMD runs", func() bool { return strings.Contains(out.String(), "ready") })
			if _, err := master.Write([]byte{c.char}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "CMD got SIG"+c.sig, func() bool {
				b, _ := os.ReadFile(got)
				return len(b) > 0
			})
			// fenced exec's own copy came at the same moment as the
			// terminal's; CMD ends once it is told to, after handling what
			// it got.
			if err := os.WriteFile(stop, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
				if waitErr != nil {
					t.Fatalf("fenced exec: %v, want exit 0, CMD's; terminal:\n%s", waitErr, out.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("fenced exec did not end after its CMD; terminal:\n%s", out.String())
			}
			b, _ := os.ReadFile(got)
			if n := strings.Count(string(b), "sig"); n != 1 {
				t.Fatalf("one %s reached CMD %d times, want once; terminal:\n%s", c.key, n, out.String())
			}
			if a.held(name) {
				t.Fatal("the lock is still held after fenced exec exited")
			}
		})
	}
}

// TestExecAsPID1DoesNotWaitForZombies: fenced exec as PID 1 (a
// container's entrypoint, here a PID namespace of its own). What CMD left
// running in its group is fenced exec's child then, and once stopped it
// stayed in the group as a zombie, unreaped: fenced exec waited out all
// of --grace before it released the lock.
func TestExecAsPID1DoesNotWaitForZombies(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("a PID namespace needs root (CI runs as root)")
	}
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	name := testenv.Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "exec", "--url", url, "--grace", "2m", name, "--", "sh", "-c", "sleep 300 & exit 0")
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setsid: true} // no terminal, as start's
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("fenced exec as PID 1 still ran 30s after CMD exited (--grace 2m): it waited for a zombie; output:\n%s", out)
	}
	if err != nil {
		t.Fatalf("fenced exec: %v; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "left processes running in its process group") {
		t.Errorf("no word of the job CMD left running; output:\n%s", out)
	}
	if a.held(name) {
		t.Fatal("the lock is still held after fenced exec exited")
	}
}

// openPTY opens a pseudo-terminal: its master, and the terminal itself.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		m.Close()
		t.Fatalf("unlock the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		m.Close()
		t.Fatalf("the pseudo-terminal's number: %v", errno)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatalf("open the pseudo-terminal: %v", err)
	}
	return m, s
}
