package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/lock"
)

const electSummary = `Campaign in the election NAME through a fenced server, as etcdctl elect
does: wait until this process leads (candidates are served in the order they
began; --wait bounds the wait), keep the leadership alive (a refresh every
TTL/3), and resign at the end. The server must keep its leases in etcd
(fenced dev does; fenced serve with --lease-store etcd): a Redis failover
could lose a leader's term.

With a command, run CMD only while leading, with FENCED_LOCK (the election's
name), FENCED_LEASE_ID and FENCED_TOKEN in its environment (less fenced's
own secrets, as fenced exec). FENCED_TOKEN is the leader's term: pass it to
the protected resource with every write, and a deposed leader's late writes
are rejected once the next leader has written. If leadership is lost, CMD
(its process group, as with fenced exec) gets SIGTERM, then SIGKILL after
--grace, and fenced elect exits 1, as it does when leadership turns out
lost only as it resigns (deposed since the last refresh); run it
under a supervisor that starts it again to campaign again. Without a
command, print the term and lead until interrupted.

With --observe, campaign not: print who leads now and every change, one
line each, until interrupted:
  leader term TOKEN value "VALUE"
  no leader

Exit status as fenced exec's: CMD's; 1 when fenced elect failed (not leading
after --wait, leadership lost, the server unreachable or on Redis leases);
2 for a usage error; 127 when CMD cannot be started; 128+N when signal N
interrupted the wait.`

type electOpts struct {
	clientOpts
	holdOpts
	value   string
	observe bool
}

func newElectCommand() (*command, *electOpts) {
	cmd := newCommand("fenced elect", " NAME [-- CMD [ARG...]]", electSummary)
	o := &electOpts{holdOpts: holdOpts{waitZero: "leading"}}
	fs := cmd.fs
	o.clientOpts.register(fs)
	o.holdOpts.register(fs, "Leadership TTL; it is refreshed every TTL/3 while leading. A leader that stops (a crash, a pause) is replaced after it.",
		"Longest wait to lead; then exit 1. 0: wait until leading.",
		"After leadership is lost, how long CMD has between SIGTERM and SIGKILL.")
	fs.StringVar(&o.value, "value", "", "`Label` observers see of the leader, such as its address (default: HOST pid PID).")
	fs.BoolVar(&o.observe, "observe", false, "Do not campaign: print who leads and every change until interrupted.")
	return cmd, o
}

func runElect(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cmd, o := newElectCommand()
	defer cmd.explainEnv(&err)
	defer o.clientOpts.explainCertificate(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	name, argv, err := nameAndCommand(cmd, "election")
	if err != nil {
		return err
	}
	switch {
	case o.observe && len(argv) > 0:
		return usagef(cmd.name, "--observe and a command: --observe only prints who leads; drop one")
	case o.observe && (cmd.set["value"] || cmd.set["wait"] || cmd.set["ttl"] || cmd.set["grace"]):
		return usagef(cmd.name, "--observe does not campaign: --value, --wait, --ttl and --grace do not apply")
	case cmd.set["value"] && lock.ValidateLabel(o.value) != nil:
		return usagef(cmd.name, "--value: %v", lock.ValidateLabel(o.value))
	}
	if err := o.holdOpts.check(cmd.name); err != nil {
		return err
	}
	if o.value == "" {
		o.value = defaultOwner()
	}
	c, err := o.clientOpts.client(cmd.name)
	if err != nil {
		return err
	}
	defer closeClient(c)
	if o.observe {
		return observeLeaders(ctx, c, name, stdout)
	}

	sigs := make(chan os.Signal, 4)
	notify(sigs, syscall.SIGINT, syscall.SIGTERM) // less those ignored at start, which CMD inherits so
	defer signal.Stop(sigs)

	var opts []lock.Option
	if o.wait > 0 {
		opts = append(opts, lock.WithWait(o.wait))
	}
	lease, err := c.Elect(ctx, name, o.value, o.ttl, opts...)
	switch {
	case err == nil:
	case isSignalCause(ctx):
		return signalExit(ctx, fmt.Sprintf("fenced elect: %%v while campaigning in %q", name))
	case errors.Is(err, lock.ErrTTLTooShort): // nobody leads: the term came back with no validity left
		return &ExitError{Code: 1, Err: fmt.Errorf("fenced elect: election %q (--ttl %s): %w", name, o.ttl, err)}
	case errors.Is(err, lock.ErrNotAcquired):
		return &ExitError{Code: 1, Err: fmt.Errorf("fenced elect: election %q still has another leader after --wait %s", name, o.wait)}
	default: // a server on Redis leases says what to run instead (lock.ErrElectionStore)
		return &ExitError{Code: 1, Err: fmt.Errorf("fenced elect: %w", err)}
	}
	release := releaser(lease, stderr, fmt.Sprintf("fenced elect: resign %q", name), "the term ends after its TTL")
	what := fmt.Sprintf("leadership of %q", name)
	if len(argv) == 0 {
		banner := fmt.Sprintf("leading election %q with term %d; interrupt (Ctrl-C) to resign", name, lease.Token())
		return holdUntilInterrupted(ctx, cmd.name, banner, what, lease, release, stdout)
	}
	return superviseChild(ctx, cmd.name, what, lease, argv, sigs, o.grace, release, stdout, stderr)
}

// observeLeaders prints who leads name, and every change, until ctx ends
// (exit 0 on a signal). The client closes its channel while ctx lives when
// the server refuses the observer for good (a token revoked: 401, 403);
// observing again then returns the refusal, which ends the command.
func observeLeaders(ctx context.Context, c *client.Client, name string, stdout io.Writer) error {
	for {
		ch, err := c.Observe(ctx, name)
		if err != nil {
			if isSignalCause(ctx) {
				return nil
			}
			return &ExitError{Code: 1, Err: fmt.Errorf("fenced elect: %w", err)}
		}
		for l := range ch {
			if l.Leading {
				fmt.Fprintf(stdout, "leader term %d value %s\n", l.Token, strconv.Quote(l.Value))
			} else {
				fmt.Fprintln(stdout, "no leader")
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	if isSignalCause(ctx) {
		return nil
	}
	return &ExitError{Code: 1, Err: fmt.Errorf("fenced elect: %w", context.Cause(ctx))}
}
