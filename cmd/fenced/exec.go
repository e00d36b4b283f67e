package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/lock"
)

const execSummary = `Run CMD while holding the lock NAME through a fenced server. fenced exec
acquires the lease (one attempt, or waiting up to --wait), runs CMD with
FENCED_LOCK, FENCED_LEASE_ID and FENCED_TOKEN in its environment, keeps the
lease alive (a refresh every TTL/3), and releases it when CMD exits. Pass
$FENCED_TOKEN to the protected resource with every write.

If the lease is lost (a refresh answered lost, or no successful refresh
before the deadline), CMD gets SIGTERM, then SIGKILL after --grace, and
fenced exec exits 1. SIGTERM and SIGINT sent to fenced exec are passed on to
CMD. Exit status: CMD's (128+N when a signal N ended it); 1 when fenced exec
itself failed (the lock is held, the server is unreachable, the lease was
lost); 2 for a usage error; 127 when CMD cannot be started.`

// ExitError ends fenced with a status: main exits with Code and prints
// Err if it is not nil. fenced exec returns one with the child's status.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

func runExec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newCommand("fenced exec", " NAME -- CMD [ARG...]", execSummary)
	var (
		addr, token, tokenFile   string
		tlsCA, tlsCert, tlsKey   string
		ttl, wait, grace, maxReq time.Duration
	)
	cmd.fs.StringVar(&addr, "addr", "http://127.0.0.1:7070", "`URL` of the fenced server.")
	cmd.fs.DurationVar(&ttl, "ttl", 15*time.Second, "Lease TTL; the lease is refreshed every TTL/3 while CMD runs.")
	cmd.fs.DurationVar(&wait, "wait", 0, "How long to wait for a held lock. 0: one attempt, exit 1 at once if held.")
	cmd.fs.DurationVar(&grace, "grace", 5*time.Second, "After the lease is lost, how long CMD has between SIGTERM and SIGKILL.")
	cmd.fs.StringVar(&token, "auth-token", "", "Bearer `token` for the server; prefer FENCED_AUTH_TOKEN or --auth-token-file to keep it out of ps.")
	cmd.fs.StringVar(&tokenFile, "auth-token-file", "", "Read the bearer token from this `file` (its first non-blank, non-# line).")
	cmd.fs.StringVar(&tlsCA, "tls-ca", "", "PEM CA `file` to verify the server's certificate. Empty: the system's roots.")
	cmd.fs.StringVar(&tlsCert, "tls-cert", "", "PEM client certificate `file` for mutual TLS (needs --tls-key).")
	cmd.fs.StringVar(&tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert.")
	cmd.fs.DurationVar(&maxReq, "max-request-wait", client.DefaultMaxRequestWait, "Longest wait_ms of one acquire request; keep it within the server's --max-wait.")
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	rest := cmd.fs.Args()
	if len(rest) == 0 {
		return usagef(cmd.name, "missing the lock NAME and the command: fenced exec [flags] NAME -- CMD [ARG...]")
	}
	name, argv := rest[0], rest[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usagef(cmd.name, "missing the command to run after %s --", name)
	}
	if err := lock.ValidateName(name); err != nil {
		return usagef(cmd.name, "lock NAME: %v", err)
	}
	switch {
	case lock.ValidateTTL(ttl) != nil || ttl%time.Millisecond != 0:
		return usagef(cmd.name, "--ttl %s: want %s to %s in whole milliseconds", ttl, lock.MinTTL, lock.MaxTTL)
	case wait < 0:
		return usagef(cmd.name, "--wait %s: want >= 0", wait)
	case grace < 0:
		return usagef(cmd.name, "--grace %s: want >= 0", grace)
	case token != "" && tokenFile != "":
		return usagef(cmd.name, "--auth-token and --auth-token-file: give one")
	case (tlsCert == "") != (tlsKey == ""):
		return usagef(cmd.name, "--tls-cert and --tls-key go together: give both or neither")
	}
	if maxReq < time.Millisecond {
		return usagef(cmd.name, "--max-request-wait %s: want at least 1ms", maxReq)
	}

	if _, err := client.New(addr); err != nil {
		return usagef(cmd.name, "--addr: %v", err)
	}
	opts := []client.ClientOption{client.WithMaxRequestWait(maxReq)}
	if tokenFile != "" {
		var err error
		if token, err = readTokenFile(tokenFile); err != nil {
			return fmt.Errorf("--auth-token-file: %w", err)
		}
	}
	if token != "" {
		opts = append(opts, client.WithBearerToken(token))
	}
	if tlsCA != "" || tlsCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if tlsCA != "" {
			pool, err := loadCertPool(tlsCA)
			if err != nil {
				return fmt.Errorf("--tls-ca: %w", err)
			}
			tc.RootCAs = pool
		}
		if tlsCert != "" {
			c, err := tls.LoadX509KeyPair(tlsCert, tlsKey)
			if err != nil {
				return fmt.Errorf("--tls-cert %s, --tls-key %s: %w", tlsCert, tlsKey, err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		opts = append(opts, client.WithTLSConfig(tc))
	}
	c, err := client.New(addr, opts...)
	if err != nil {
		return usagef(cmd.name, "%v", err) // the address is good: a bad token
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(cctx) // the lease is released or lost by then
	}()

	// Listen for signals from now on, so that one sent while the lock is
	// being acquired is not lost.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var lease *client.Lease
	if wait == 0 {
		lease, err = c.TryAcquire(ctx, name, ttl, client.WithKeepAlive())
	} else {
		lease, err = c.Acquire(ctx, name, ttl, client.WithKeepAlive(), client.WithWait(wait))
	}
	if err != nil {
		if errors.Is(err, lock.ErrNotAcquired) {
			return &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: lock %q is held by another holder (waited %s)", name, wait)}
		}
		return &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: %w", err)}
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lease.Release(rctx); err != nil && !errors.Is(err, lock.ErrLost) {
			fmt.Fprintf(stderr, "fenced exec: release %q: %v (the lease expires after its TTL)\n", name, err)
		}
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, stdout, stderr
	child.Env = append(os.Environ(),
		"FENCED_LOCK="+name,
		"FENCED_LEASE_ID="+lease.ID(),
		"FENCED_TOKEN="+lease.Token().String(),
	)
	if err := child.Start(); err != nil {
		release()
		return &ExitError{Code: 127, Err: fmt.Errorf("fenced exec: start %s: %w", argv[0], err)}
	}
	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }() // ends when the child exits, which the loop below waits for

	var (
		lost     error
		kill     <-chan time.Time
		ctxDone  = ctx.Done()
		leaseEnd = lease.Done()
	)
	stop := func(why string) {
		fmt.Fprintf(stderr, "fenced exec: %s; stopping %s: SIGTERM, SIGKILL after %s\n", why, argv[0], grace)
		_ = child.Process.Signal(syscall.SIGTERM) // it may have exited already
		if kill == nil {
			kill = time.After(grace)
		}
	}
	for {
		select {
		case werr := <-waited:
			code := exitCode(werr)
			release() // after a loss too: an expired lease may still be held on the server
			if lost != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: %s exited (status %d) after the lease of %q was lost: %w", argv[0], code, name, lost)}
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		case s := <-sigs:
			_ = child.Process.Signal(s) // passed on; the child decides
		case <-ctxDone:
			ctxDone = nil
			// A signal that ended the context also reached sigs and was
			// passed on; any other cancellation stops the child.
			if !isSignalCause(ctx) {
				stop("cancelled")
			}
		case <-leaseEnd:
			leaseEnd = nil
			lost = lease.Err()
			stop(fmt.Sprintf("the lease of %q was lost (%v)", name, lost))
		case <-kill:
			_ = child.Process.Kill()
		}
	}
}

// isSignalCause tells a context ended by a signal (see signalContext) from
// one cancelled otherwise.
func isSignalCause(ctx context.Context) bool {
	var se *signalError
	return errors.As(context.Cause(ctx), &se)
}

// exitCode is the shell's view of how the child ended: its exit status,
// or 128+N when signal N ended it.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

// readTokenFile returns the first line that is neither blank nor a
// comment, trimmed.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("%s has no token", path)
}
