package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3"
// (make install, make dist). Empty means the module version from the build
// info: (devel) for a build in the repository.
var version = ""

const topUsage = `fenced: fencing-token locks. A lease (Redis or etcd) makes contention cheap;
a fencing token from an etcd revision lets the protected resource reject
stale writers.

Usage:
  fenced dev [flags]                        one process, nothing else needed: embedded etcd (leases in etcd, or --redis-addr)
  fenced serve [flags]                      real deployments: leases in Redis (or etcd), tokens from etcd
  fenced exec [flags] NAME [-- CMD [ARG...]] hold the lock NAME (waiting for it) while CMD runs, with FENCED_TOKEN set;
                                            without CMD, until interrupted
  fenced elect [flags] NAME [-- CMD [ARG...]] campaign in the election NAME; run CMD only while leading,
                                            with FENCED_TOKEN the term; --observe prints who leads
  fenced locks list|get|release [flags]     list the held locks, inspect one, force-release one
  fenced admin raise-floor [flags]          after an etcd restore: make new tokens exceed all before
  fenced admin floor [flags]                print the token floor
  fenced admin pg-sql [flags]               print the Postgres fence's migrations as SQL (for psql)
  fenced admin pg-migrate [flags]           apply them to --database-url
  fenced completion bash|zsh|fish           print a shell completion script
  fenced version                            print the version

Every flag can also be set by an environment variable: --max-ttl is
FENCED_MAX_TTL; an empty one counts as unset. A flag on the command line
overrides the environment: its own variable, and those of the flags it
cannot be given with (--try overrides FENCED_WAIT, --client-token-file
FENCED_CLIENT_TOKEN, --lease-store etcd FENCED_REDIS_ADDR).
fenced exec's, elect's and locks' variables (FENCED_URL, FENCED_CLIENT_TOKEN, ...) are distinct
from those of dev and serve (FENCED_LISTEN, FENCED_AUTH_TOKEN_FILE, ...).
Run 'fenced COMMAND --help' for the flags of a command.
`

// Run runs fenced with args (without the program name). It returns nil on
// success, an *ExitError carrying the status to exit with, or another
// error: a usage error (main exits 2) or a failure (main exits 1). It
// never exits the process.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return usagef("fenced", "missing the command")
	}
	var err error
	switch args[0] {
	case "dev":
		err = runDev(ctx, args[1:], stdout, stderr)
	case "serve":
		err = runServe(ctx, args[1:], stdout, stderr)
	case "exec":
		err = runExec(ctx, args[1:], stdout, stderr)
	case "elect":
		err = runElect(ctx, args[1:], stdout, stderr)
	case "locks":
		err = runLocks(ctx, args[1:], stdout, stderr)
	case "admin":
		err = runAdmin(ctx, args[1:], stdout, stderr)
	case "completion":
		err = runCompletion(args[1:], stdout)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionString())
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[1] != "help" {
			// fenced help admin raise-floor: the subcommand's own usage.
			return Run(ctx, append(args[1:len(args):len(args)], "--help"), stdout, stderr)
		}
		fmt.Fprint(stdout, topUsage)
	default:
		return usagef("fenced", "unknown command %q: want dev, serve, exec, elect, locks, admin, completion or version", args[0])
	}
	if err == errHelp {
		return nil
	}
	return err
}

// buildVersion is the version stamped at build time, else the module's
// version, else "(devel)".
func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// versionString is the line of fenced version: the version, the VCS
// revision if the build recorded it, the Go version and the platform.
func versionString() string {
	v, rev := buildVersion(), ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && modified {
			rev += "-dirty"
		}
	}
	s := "fenced " + v
	if rev != "" {
		s += " " + rev
	}
	return fmt.Sprintf("%s %s %s/%s", s, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// signalError is the cause of a context ended by a signal.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return e.sig.String() + " signal received" }

// ignoredAtStart are the signals fenced listens for that it was started
// with ignored: SIGHUP under nohup, SIGINT (and SIGQUIT) for `cmd &` in a
// shell without job control. Notify un-ignores a signal (os/signal), so
// `nohup fenced exec` died at logout and its CMD, which would have
// inherited SIG_IGN, got the SIGHUP passed on; fenced now neither listens
// for these nor passes them on (docs/design.md, defect 180). Go's runtime
// keeps an inherited SIG_IGN for SIGHUP and SIGINT only, and reports the
// others not ignored. Read at package init, before any Notify.
var ignoredAtStart = ignored(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)

func ignored(sigs ...os.Signal) map[os.Signal]bool {
	m := make(map[os.Signal]bool)
	for _, s := range sigs {
		m[s] = signal.Ignored(s)
	}
	return m
}

// notify is signal.Notify for those of sigs not ignored at start. With
// none left it does nothing: Notify with no signals listens for all.
func notify(c chan<- os.Signal, sigs ...os.Signal) {
	var keep []os.Signal
	for _, s := range sigs {
		if !ignoredAtStart[s] {
			keep = append(keep, s)
		}
	}
	if len(keep) > 0 {
		signal.Notify(c, keep...)
	}
}

// signalContext returns a context cancelled, with a *signalError cause, by
// the first SIGINT or SIGTERM not ignored at start. Later ones are not
// fatal either: fenced exec passes them on to its child. stop stops
// listening.
func signalContext() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { // owned by stop
		select {
		case s := <-sigs:
			cancel(&signalError{s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(context.Canceled)
	}
}
