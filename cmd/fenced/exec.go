package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/lock"
)

const execSummary = `Hold the lock NAME through a fenced server, as etcdctl lock does: wait until
it is acquired (--wait bounds the wait, --try makes one attempt), keep the
lease alive (a refresh every TTL/3), and release it at the end.

With a command, run CMD with FENCED_LOCK, FENCED_LEASE_ID and FENCED_TOKEN in
its environment (and the rest of this environment, less fenced's own
secrets: FENCED_CLIENT_TOKEN, the passwords, FENCED_DATABASE_URL, and the
token and TLS key files), and release the lock
when CMD exits. Pass $FENCED_TOKEN to the protected resource with every
write. Without a command, print the token and hold the lock until
interrupted (SIGINT, SIGTERM, or SIGHUP when its terminal closes).

--url takes several fenced servers, separated by commas: a request goes to
the next when one cannot be reached or answers 503.

If the lease is lost (a refresh answered lost, or no successful refresh
before the deadline), CMD gets SIGTERM, then SIGKILL after --grace, and
fenced exec exits 1. A loss that only the release finds (the lock
force-released, or the lease gone from the store, since the last refresh)
exits 1 too, saying so and CMD's status: CMD's writes may have overlapped
another holder's. SIGTERM and SIGINT sent to fenced exec are passed on to
CMD, and so are SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 while CMD runs. CMD runs in a process group of its
own, which these signals go to, so that what it started stops with it; what
it leaves running there when it exits gets SIGTERM, then SIGKILL after
--grace, before the lock is released. On Linux so does what it detached
from that group (setsid, a daemon's double fork), which fenced exec adopts
as its parent exits, and CMD gets SIGTERM from the kernel if fenced exec
itself is killed outright (SIGKILL, the OOM killer). (When fenced exec is
its terminal's foreground job, whatever its stdin, CMD stays in fenced
exec's group, where the terminal signals every process itself: Ctrl-C and
Ctrl-\ reach CMD once, from the terminal, Ctrl-Z stops both, and a SIGINT
or SIGQUIT sent to fenced exec alone is not passed on; send it to the
group, kill -INT -PGID. This is decided at start: started with & and
brought back with fg, CMD keeps its own group.) SIGHUP or SIGINT ignored
when fenced exec starts (nohup; a script's cmd &) stays ignored: not
caught, not passed on, and ignored by CMD too.
Exit status: CMD's (128+N when a signal N ended it); 1 when fenced exec
itself failed (the lock is still held after --wait or at --try, the server
is unreachable — with --wait, still so when the wait ends —, the lease was
lost); 2 for a usage error; 127 when CMD
cannot be started; 128+N when signal N interrupted the wait.

Its environment variables are its own, distinct from fenced serve's:
FENCED_URL, FENCED_CLIENT_TOKEN, FENCED_CLIENT_TOKEN_FILE,
FENCED_CLIENT_TLS_CA, ... (see the flags below).`

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

type execOpts struct {
	clientOpts
	holdOpts
	try   bool
	owner string
}

// holdOpts are the flags of a command that holds a lease while a child
// runs (exec, elect): its TTL, how long to wait for it, and the child's
// grace after a loss.
type holdOpts struct {
	ttl, wait, grace time.Duration
	waitZero         string // what --wait 0 waits for, in its usage error
}

// register adds --ttl, --wait and --grace with these help texts.
func (o *holdOpts) register(fs *flag.FlagSet, ttlHelp, waitHelp, graceHelp string) {
	fs.DurationVar(&o.ttl, "ttl", 15*time.Second, ttlHelp)
	fs.DurationVar(&o.wait, "wait", 0, waitHelp)
	fs.DurationVar(&o.grace, "grace", 5*time.Second, graceHelp)
}

// check refuses values the API or the child's supervision cannot take.
func (o *holdOpts) check(cmdName string) error {
	switch {
	case lock.ValidateTTL(o.ttl) != nil:
		return usagef(cmdName, "--ttl %s: want %s to %s in whole milliseconds", o.ttl, lock.MinTTL, lock.MaxTTL)
	case o.wait < 0:
		return usagef(cmdName, "--wait %s: want >= 0 (0 waits until %s)", o.wait, o.waitZero)
	case o.grace < 0:
		return usagef(cmdName, "--grace %s: want >= 0", o.grace)
	}
	return nil
}

func newExecCommand() (*command, *execOpts) {
	cmd := newCommand("fenced exec", " NAME [-- CMD [ARG...]]", execSummary)
	o := &execOpts{holdOpts: holdOpts{waitZero: "the lock is acquired"}}
	fs := cmd.fs
	o.clientOpts.register(fs)
	o.holdOpts.register(fs, "Lease TTL; the lease is refreshed every TTL/3 while it is held.",
		"Longest wait for a held lock; then exit 1. 0: wait until it is acquired.",
		"After the lease is lost, how long CMD has between SIGTERM and SIGKILL.")
	fs.BoolVar(&o.try, "try", false, "Make one attempt: exit 1 at once if the lock is held.")
	fs.StringVar(&o.owner, "owner", "", "`Label` shown with the lock by fenced locks and GET /v1/locks (default: HOST pid PID).")
	o.clientOpts.registerTimeout(fs, "Give up on the first attempt when the server has not answered it after this long (a partition, a wedged server), or once --wait is over: exit 1.")
	return cmd, o
}

// defaultOwner labels a lock with where its holder runs.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// secretEnv are environment variables the child of fenced exec (and of
// fenced elect) does not inherit: fenced's own secrets, of every command,
// and where the files that hold them are (bearer tokens, passwords, the
// Postgres URL with its password, TLS private keys); the name fenced exec
// used for its token before; and the variables exec sets itself. A flag
// added for a secret belongs here too (TestExecEnvironment looks for them
// by name).
var secretEnv = []string{
	"FENCED_CLIENT_TOKEN", "FENCED_CLIENT_TOKEN_FILE", "FENCED_AUTH_TOKEN", "FENCED_AUTH_TOKEN_FILE",
	"FENCED_REDIS_PASSWORD", "FENCED_REDIS_SENTINEL_PASSWORD", "FENCED_ETCD_PASSWORD",
	"FENCED_DATABASE_URL",
	"FENCED_TLS_KEY", "FENCED_CLIENT_TLS_KEY", "FENCED_REDIS_TLS_KEY", "FENCED_ETCD_KEY",
	"FENCED_LOCK", "FENCED_LEASE_ID", "FENCED_TOKEN",
}

// childEnv is env without secretEnv, with the lease's variables.
func childEnv(env []string, l *client.Lease) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		secret := false
		for _, s := range secretEnv {
			secret = secret || k == s
		}
		if !secret {
			out = append(out, kv)
		}
	}
	return append(out, "FENCED_LOCK="+l.Name(), "FENCED_LEASE_ID="+l.ID(), "FENCED_TOKEN="+l.Token().String())
}

func runExec(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cmd, o := newExecCommand()
	defer cmd.explainEnv(&err)
	defer o.clientOpts.explainCertificate(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	name, argv, err := nameAndCommand(cmd, "lock")
	if err != nil {
		return err
	}
	if err := firstErr(o.holdOpts.check(cmd.name), o.clientOpts.checkTimeout(cmd.name)); err != nil {
		return err
	}
	switch {
	// A variable of one of the two loses to the other on the command line
	// (exclusions, defect 139): this refuses two flags, or two variables.
	case o.try && cmd.set["wait"]:
		return usagef(cmd.name, "--try and --wait: --try makes one attempt, --wait bounds a wait; give one")
	case cmd.set["owner"] && lock.ValidateLabel(o.owner) != nil:
		return usagef(cmd.name, "--owner: %v", lock.ValidateLabel(o.owner))
	}
	if o.owner == "" {
		o.owner = defaultOwner()
	}
	c, err := o.clientOpts.client(cmd.name)
	if err != nil {
		return err
	}
	defer closeClient(c)

	// Listen for signals from now on, so that one sent while the lock is
	// being acquired is not lost.
	sigs := make(chan os.Signal, 4)
	notify(sigs, syscall.SIGINT, syscall.SIGTERM) // less those ignored at start, which CMD inherits so
	defer signal.Stop(sigs)

	lease, err := acquireForExec(ctx, c, name, o, stderr)
	if err != nil {
		return err
	}
	release := releaser(lease, stderr, fmt.Sprintf("fenced exec: release %q", name), "the lease expires after its TTL")
	what := fmt.Sprintf("the lease of %q", name)
	if len(argv) == 0 {
		banner := fmt.Sprintf("holding lock %q with token %d; interrupt (Ctrl-C) to release", name, lease.Token())
		return holdUntilInterrupted(ctx, cmd.name, banner, what, lease, release, stdout)
	}
	return superviseChild(ctx, cmd.name, what, lease, argv, sigs, o.grace, release, stdout, stderr)
}

// superviseChild runs argv while lease is held, with the lease's variables
// in its environment: it passes signals on, stops the child (SIGTERM, then
// SIGKILL after grace) when the lease is lost or ctx is cancelled, and
// calls release when the child exits. It returns the child's status as an
// *ExitError (1 after a loss, or when release returns one; 127 when it
// cannot start). prog names the command in messages, what the lease ("the
// lease of "x"").
func superviseChild(ctx context.Context, prog, what string, lease *client.Lease, argv []string, sigs <-chan os.Signal,
	grace time.Duration, release func() error, stdout, stderr io.Writer) error {
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, stdout, stderr
	child.Env = childEnv(os.Environ(), lease)
	// What the child starts (a shell script's jobs) is part of the work
	// the lease covers, so the child leads a process group of its own and
	// signals go to the group: signalling the child alone ended a shell
	// and left its jobs running after the lease was released or lost. In
	// a terminal's foreground the child stays in ours, where it reads the
	// terminal and Ctrl-C and Ctrl-Z reach the whole group from the
	// terminal itself, whatever stdin is (decided once, here: a job
	// started with & and brought back with fg keeps its own group).
	group := !terminalForeground()
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	// A fenced exec that is killed outright refreshes the lease no more:
	// CMD gets SIGTERM then (Linux), from the kernel, on the thread that
	// started it, which this goroutine keeps until CMD has exited.
	dieWithUs(child.SysProcAttr)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// While the child runs, the other signals an operator or a shell sends
	// are passed on too: uncaught, Go's default ended this process and left
	// the child running under a lease nobody refreshed. A shell sends
	// SIGHUP to its jobs as it exits; SIGQUIT (Ctrl-\) asks a JVM for a
	// thread dump; SIGUSR1 and SIGUSR2 are many daemons' commands (reopen
	// the logs, reload).
	// One ignored at start (nohup's SIGHUP) is neither listened for nor
	// passed on: CMD inherits it ignored, as it would without fenced exec.
	others := make(chan os.Signal, 4)
	notify(others, passedOn...)
	defer signal.Stop(others)
	// What CMD detaches from its group (setsid, a daemon's double fork) is
	// part of the work too: adopted, it is stopped with the rest.
	adopted := adoptOrphans()
	if err := child.Start(); err != nil {
		_ = release() // a loss found here overlapped no write: CMD never ran
		return &ExitError{Code: 127, Err: fmt.Errorf("%s: start %s: %w", prog, argv[0], err)}
	}
	send := func(s os.Signal) {
		if sig, ok := s.(syscall.Signal); ok && group {
			_ = syscall.Kill(-child.Process.Pid, sig) // the group may be gone already
			return
		}
		_ = child.Process.Signal(s) // it may have exited already
	}
	// passOn passes a signal on; the child decides what it means.
	passOn := func(s os.Signal) {
		if !group && (s == syscall.SIGINT || s == syscall.SIGQUIT) && terminalForeground() {
			// Ctrl-C or Ctrl-\: the terminal sent it to its foreground
			// group, the child included. Passed on too, it reached the
			// child twice, and many programs take a second SIGINT as
			// "quit now, skip the clean-up".
			return
		}
		send(s)
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
		fmt.Fprintf(stderr, "%s: %s; stopping %s: SIGTERM, SIGKILL after %s\n", prog, why, argv[0], grace)
		send(syscall.SIGTERM)
		if kill == nil {
			kill = time.After(grace)
		}
	}
	for {
		select {
		case werr := <-waited:
			code := exitCode(werr)
			if group {
				endGroup(child.Process.Pid, grace, func() {
					fmt.Fprintf(stderr, "%s: %s exited and left processes running in its process group; stopping them before %s ends: SIGTERM, SIGKILL after %s\n", prog, argv[0], what, grace)
				})
			}
			if adopted {
				endDetached(grace, func(n int) {
					fmt.Fprintf(stderr, "%s: %s exited and left %d process(es) running outside its process group (detached: setsid, a daemon); stopping them before %s ends: SIGTERM, SIGKILL after %s\n", prog, argv[0], n, what, grace)
				})
			}
			rerr := release() // after a loss too: an expired lease may still be held on the server
			if lost != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("%s: %s exited (status %d) after %s was lost: %w", prog, argv[0], code, what, lost)}
			}
			if rerr != nil {
				// Lost with Done not yet closed (force-released, or gone
				// from the store, between refreshes): the release is the
				// first to know, and CMD's status alone said the work went
				// well (defect 138).
				return &ExitError{Code: 1, Err: fmt.Errorf("%s: %s exited (status %d), but %s had been lost before its release: %s's writes may have overlapped another holder's: %w", prog, argv[0], code, what, argv[0], rerr)}
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		case s := <-sigs:
			passOn(s)
		case s := <-others:
			passOn(s)
		case <-ctxDone:
			ctxDone = nil
			// A signal that ended the context also reached sigs and was
			// passed on (or, Ctrl-C, reached the child from the terminal);
			// any other cancellation stops the child.
			if !isSignalCause(ctx) {
				stop("cancelled")
			}
		case <-leaseEnd:
			leaseEnd = nil
			lost = lease.Err()
			stop(fmt.Sprintf("%s was lost (%v)", what, lost))
		case <-kill:
			send(syscall.SIGKILL)
		}
	}
}

// passedOn are the signals superviseChild passes on besides SIGINT and
// SIGTERM, which its caller listens for from before the lock is taken.
var passedOn = []os.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// endGroup ends what is left of process group pgid once its leader has
// exited: SIGTERM, then SIGKILL after grace if some of it is still there
// (a process killed so runs no more code). saying is called first if
// anything is left. The group is looked at every 10ms: its members are
// not this process's children (unless it is PID 1), so nothing tells when
// they exit.
func endGroup(pgid int, grace time.Duration, saying func()) {
	if !groupLeft(pgid) {
		return
	}
	saying()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if !groupLeft(pgid) {
				return
			}
		case <-deadline.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
	}
}

// groupLeft reports whether process group pgid has a member left. It
// first reaps the members that are this process's children: as PID 1 (a
// container's entrypoint) fenced exec inherits what CMD left behind, and
// an exited member stays in the group as a zombie until reaped, so the
// group never emptied and fenced exec waited out --grace before it
// released the lock. CMD itself was reaped by its Wait already.
func groupLeft(pgid int) bool {
	reap(-pgid)
	return syscall.Kill(-pgid, 0) == nil // ESRCH: nobody left
}

// reap reaps, without waiting, the exited children that wait4's pid
// selects (-pgid: that group's; -1: any).
func reap(pid int) {
	for {
		var ws syscall.WaitStatus
		if p, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); p <= 0 || err != nil {
			return // none exited (0), or none is our child (ECHILD)
		}
	}
}

// refusal reports whether err is fenced's own refusal of a request (a 4xx
// with its API error code), which asking again would not change.
func refusal(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status < 500 && ae.Code != ""
}

// acquireForExec takes the lock as the flags say: one attempt with --try;
// otherwise one attempt, and if the lock is held a line on stderr and a
// wait, bounded by --wait if given.
func acquireForExec(ctx context.Context, c *client.Client, name string, o *execOpts, stderr io.Writer) (*client.Lease, error) {
	// The first attempt asks the server for no wait, and the client bounds
	// such a request by its context alone: a server that takes it and never
	// answers is given up on after --timeout, or once --wait is over.
	start := time.Now()
	bound := o.timeout
	if o.wait > 0 {
		bound = min(bound, o.wait+client.DefaultAnswerGrace)
	}
	tctx, cancel := context.WithTimeout(ctx, bound)
	lease, err := c.TryAcquire(tctx, name, o.ttl, lock.WithKeepAlive(), lock.WithOwner(o.owner))
	noAnswer := err != nil && timedOut(ctx, tctx)
	cancel()
	// A grant that came back with no validity left (ErrTTLTooShort, which
	// matches ErrNotAcquired too) is no held lock: nobody holds it.
	held := errors.Is(err, lock.ErrNotAcquired) && !errors.Is(err, lock.ErrTTLTooShort)
	// A --wait rides out a server that is away at the first attempt (a
	// refused connection, a 503 while it restarts), as the wait rides out
	// one that goes away during it; before, the first attempt's error ended
	// the command at once (docs/design.md, defect 144). fenced's own
	// refusals (a 4xx with its code) still end it, and so does a server
	// certificate the client does not trust, or a server that refuses the
	// client's: every handshake fails alike.
	away := err != nil && !held && !noAnswer && o.wait > 0 && ctx.Err() == nil && !refusal(err) &&
		!errors.Is(err, client.ErrCertificate) && !errors.Is(err, client.ErrClientCertificate)
	if (held || away) && !o.try {
		until := "until it is free (interrupt to give up)"
		var opts []lock.Option
		if o.wait > 0 {
			// The first attempt was part of the wait.
			left := max(o.wait-time.Since(start), time.Millisecond)
			until = "up to --wait " + o.wait.String()
			opts = append(opts, lock.WithWait(left))
		}
		if held {
			fmt.Fprintf(stderr, "fenced exec: lock %q is held; waiting %s\n", name, until)
		} else {
			fmt.Fprintf(stderr, "fenced exec: lock %q: %v; trying again %s\n", name, err, until)
		}
		lease, err = c.Acquire(ctx, name, o.ttl, append(opts, lock.WithKeepAlive(), lock.WithOwner(o.owner))...)
	}
	switch {
	case err == nil:
		return lease, nil
	case noAnswer:
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: lock %q: no answer from %s within %s (--timeout %s, --wait %s): %w", name, o.url, bound, o.timeout, o.wait, err)}
	case isSignalCause(ctx):
		return nil, signalExit(ctx, fmt.Sprintf("fenced exec: %%v while waiting for lock %q", name))
	case errors.Is(err, lock.ErrTTLTooShort):
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: lock %q (--ttl %s): %w", name, o.ttl, err)}
	case errors.Is(err, lock.ErrNotAcquired) && o.try:
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: lock %q is held by another holder (--try: one attempt)", name)}
	case errors.Is(err, lock.ErrNotAcquired):
		return nil, &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: lock %q is still held by another holder after --wait %s", name, o.wait)}
	}
	return nil, &ExitError{Code: 1, Err: fmt.Errorf("fenced exec: %w", err)}
}

// holdUntilInterrupted holds the lease with no command: it prints the token
// and waits for SIGINT, SIGTERM or SIGHUP (exit 0, released) or the loss of
// the lease (exit 1). SIGHUP, the terminal closing, killed it and left the
// lock held by nobody until its TTL ran out. A loss the release finds
// (force-released, or gone from the store, between refreshes) exits 1 too
// (defect 138): what was done with the token meanwhile may have overlapped
// another holder's writes.
func holdUntilInterrupted(ctx context.Context, prog, banner, what string, lease *client.Lease, release func() error, stdout io.Writer) error {
	hup := make(chan os.Signal, 1)
	notify(hup, syscall.SIGHUP) // not under nohup, where it is ignored
	defer signal.Stop(hup)
	fmt.Fprintln(stdout, banner)
	var err error
	select {
	case <-hup:
	case <-ctx.Done():
		if !isSignalCause(ctx) {
			err = &ExitError{Code: 1, Err: fmt.Errorf("%s: %w", prog, context.Cause(ctx))}
		}
	case <-lease.Done():
		lost := lease.Err()
		_ = release() // returns lost again, said here
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: %s was lost: %w", prog, what, lost)}
	}
	if rerr := release(); rerr != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: %s had been lost before its release: writes made with its token %d may have overlapped another holder's: %w", prog, what, lease.Token(), rerr)}
	}
	return err
}

// closeClient closes c at the end of exec or elect, when its lease is
// released or lost.
func closeClient(c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// releaser releases lease within 5s. If it could not (the server away),
// it says so on stderr (what: then) and returns nil: the lease ends after
// its TTL, and the work under it was done while it was held. It returns a
// loss (lock.ErrLost: the lease had been lost before the release) for the
// caller to exit 1 with: dropped, a lease force-released or gone from the
// store between two refreshes exited 0, silent, though another holder may
// have written meanwhile (defect 138).
func releaser(lease *client.Lease, stderr io.Writer, what, then string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := lease.Release(ctx)
		if errors.Is(err, lock.ErrLost) {
			return err
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v (%s)\n", what, err, then)
		}
		return nil
	}
}

// nameAndCommand reads the arguments NAME [-- CMD [ARG...]] of fenced exec
// and fenced elect; kind is "lock" or "election".
func nameAndCommand(cmd *command, kind string) (name string, argv []string, err error) {
	rest := cmd.fs.Args()
	if len(rest) == 0 {
		return "", nil, usagef(cmd.name, "missing the %s NAME: %s [flags] NAME [-- CMD [ARG...]]", kind, cmd.name)
	}
	name, argv = rest[0], rest[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	} else if len(argv) > 0 && strings.HasPrefix(argv[0], "-") {
		// A flag after NAME: "put -- before the command" made it the
		// command.
		return "", nil, usagef(cmd.name, "%q after the %s NAME: flags go before NAME: %s [flags] NAME [-- CMD [ARG...]]", argv[0], kind, cmd.name)
	} else if len(argv) > 0 {
		return "", nil, usagef(cmd.name, "%q after the %s NAME: put -- before the command, %s [flags] %s -- CMD [ARG...]", argv[0], kind, cmd.name, name)
	}
	if err := lock.ValidateName(name); err != nil {
		return "", nil, usagef(cmd.name, "%s NAME: %v", kind, err)
	}
	return name, argv, nil
}

// signalExit is the exit of a wait that a signal interrupted: 128+N, with
// format's %v the signal.
func signalExit(ctx context.Context, format string) error {
	var se *signalError
	errors.As(context.Cause(ctx), &se)
	code := 130
	if s, ok := se.sig.(syscall.Signal); ok {
		code = 128 + int(s)
	}
	return &ExitError{Code: code, Err: fmt.Errorf(format, se)}
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
// comment, trimmed, up to the first white space (a server's token file,
// with name=, prefixes= and allow= after the token, can be read as is).
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return strings.Fields(line)[0], nil
		}
	}
	return "", fmt.Errorf("%s has no token", path)
}
