package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	wire "github.com/fenced/fenced/api"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

const locksSummary = `Inspect and operate the locks of a fenced server:
  fenced locks list [--prefix P] [--limit N] [--json]   the held locks (all pages, or the first N)
  fenced locks get NAME [--json]                        one lock: holder's token, owner, TTL left, waiters
  fenced locks release [--if-token N] NAME              force-release: delete the lease whoever holds it,
                                                        or (--if-token) only if its token is N
The holder of a force-released lock learns it at its next refresh; its token
still fences its late writes. Needs the server's inspect (list, get) or
force-release permission. A release without --if-token is not sent again
when its answer is lost or is a 503 (it may have been done, and a second
would release the next holder): get the lock; if it is still held, by the
holder you meant, release it with --if-token and the token it shows, which
is safe to send again (a free lock has no token to give).`

type locksOpts struct {
	clientOpts
	prefix  string
	limit   int
	json    bool
	ifToken fence.Token // release: 0 for whoever holds it
}

// grantToken is the --if-token flag: a token fenced can issue, 1 to
// 2^63-1.
type grantToken struct{ t *fence.Token }

func (v grantToken) String() string {
	if v.t == nil || *v.t == 0 {
		return ""
	}
	return v.t.String()
}

func (v grantToken) Set(s string) error {
	t, err := fence.ParseToken(s)
	if err != nil {
		return fmt.Errorf("want the token of the grant to release (fenced locks get shows it), a decimal number from 1 to %d", fence.MaxToken)
	}
	*v.t = t
	return nil
}

// locksCommands are the subcommands of fenced locks.
var locksCommands = []string{"list", "get", "release"}

// newLocksCommand is the flag set of fenced locks sub; nil for an unknown
// sub.
func newLocksCommand(sub string) (*command, *locksOpts) {
	var cmd *command
	o := &locksOpts{}
	switch sub {
	case "list":
		cmd = newCommand("fenced locks list", "", locksSummary)
		cmd.fs.StringVar(&o.prefix, "prefix", "", "List the locks whose names start with this `prefix`.")
		cmd.fs.IntVar(&o.limit, "limit", 0, "List at most `N` locks (0: all, a page of 100 at a time).")
	case "get":
		cmd = newCommand("fenced locks get", " NAME", locksSummary)
	case "release":
		cmd = newCommand("fenced locks release", " NAME", locksSummary)
		// Not --token: its variable would be FENCED_TOKEN, which fenced
		// exec and fenced elect set for their command to its own token.
		cmd.fs.Var(grantToken{&o.ifToken}, "if-token", "Release the lock only if the grant holding it has this `token` (fenced locks get shows it);\nsafe to run again. Default: whoever holds it.")
	default:
		return nil, nil
	}
	o.clientOpts.register(cmd.fs)
	o.clientOpts.registerTimeout(cmd.fs, "Give up on a request the server has not answered after this long (a partition, a wedged server): exit 1.")
	if sub != "release" {
		cmd.fs.BoolVar(&o.json, "json", false, "Print JSON (the API's objects) instead of a table.")
	}
	return cmd, o
}

func runLocks(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fmt.Fprintln(stdout, "Usage: fenced locks list|get|release [flags]\n\n"+locksSummary)
			return errHelp
		}
		return usagef("fenced locks", "missing the subcommand: list, get NAME or release NAME")
	}
	sub, args := args[0], args[1:]
	cmd, o := newLocksCommand(sub)
	if cmd == nil {
		return usagef("fenced locks", "unknown subcommand %q: want %s", sub, strings.Join(locksCommands, ", "))
	}
	defer cmd.explainEnv(&err) // list, get and release
	defer o.clientOpts.explainCertificate(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	var name string
	if sub == "list" {
		if err := cmd.noArgs(); err != nil {
			return err
		}
		if err := lock.ValidateNamePrefix(o.prefix); err != nil {
			return usagef(cmd.name, "--prefix: %v", err)
		}
		if o.limit < 0 {
			return usagef(cmd.name, "--limit %d: want >= 0 (0: all)", o.limit)
		}
	} else {
		if cmd.fs.NArg() == 0 {
			return usagef(cmd.name, "want a lock NAME")
		}
		name = cmd.fs.Arg(0)
		if rest := cmd.fs.Args()[1:]; len(rest) > 0 {
			// Flags may follow NAME too (fenced locks get NAME --json), as
			// the summary writes them; the flag package stops at NAME.
			if err := cmd.parse(rest, stdout); err != nil {
				return err
			}
			if cmd.fs.NArg() > 0 {
				return usagef(cmd.name, "want exactly one lock NAME, got %q and %q", name, cmd.fs.Args())
			}
		}
		if err := lock.ValidateName(name); err != nil {
			return usagef(cmd.name, "lock NAME: %v", err)
		}
	}
	if err := o.clientOpts.checkTimeout(cmd.name); err != nil {
		return err
	}
	c, err := o.clientOpts.client(cmd.name)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx)) // holds no lease: nothing to release
	// Every request here asks the server for no wait, and the client
	// bounds such a request by its context alone: each has --timeout.
	bounded := func(call func(ctx context.Context) error) error {
		tctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		err := call(tctx)
		if err != nil && timedOut(ctx, tctx) {
			maybe := ""
			if sub == "release" {
				maybe = fmt.Sprintf("; the lock may have been released (fenced locks get %s says)", name)
			}
			err = &ExitError{Code: 1, Err: fmt.Errorf("%s: no answer from %s within --timeout %s%s: %w", cmd.name, o.url, o.timeout, maybe, err)}
		}
		return err
	}

	switch sub {
	case "list":
		var all []lock.State
		cursor := ""
		for {
			limit := lock.MaxListLimit / 10
			if o.limit > 0 {
				limit = min(limit, o.limit-len(all))
			}
			var page lock.ListPage
			err := bounded(func(ctx context.Context) (err error) {
				page, err = c.List(ctx, o.prefix, limit, cursor)
				return err
			})
			if err != nil {
				return err
			}
			all = append(all, page.Locks...)
			if cursor = page.Next; cursor == "" || o.limit > 0 && len(all) >= o.limit {
				break
			}
		}
		if o.json {
			out := make([]wire.LockState, 0, len(all))
			for _, st := range all {
				out = append(out, wire.NewLockState(st))
			}
			return printJSON(stdout, out)
		}
		return printLocks(stdout, all)
	case "get":
		var st lock.State
		err := bounded(func(ctx context.Context) (err error) {
			st, err = c.Inspect(ctx, name)
			return err
		})
		if err != nil {
			return err
		}
		if o.json {
			return printJSON(stdout, wire.NewLockState(st))
		}
		return printLocks(stdout, []lock.State{st})
	default:
		var opts []lock.ForceOption
		if o.ifToken != 0 {
			opts = append(opts, lock.IfToken(o.ifToken))
		}
		var st lock.State
		err := bounded(func(ctx context.Context) (err error) {
			st, err = c.ForceRelease(ctx, name, opts...)
			return err
		})
		var he *lock.HeldByOtherError
		if errors.As(err, &he) {
			holder := "token " + he.Token.String()
			if he.Token == 0 {
				holder = "a grant that has no token yet"
			}
			return &ExitError{Code: 1, Err: fmt.Errorf("fenced locks release: lock %q is held by %s, not by token %s: nothing released", name, holder, o.ifToken)}
		}
		if err != nil {
			return err
		}
		if !st.Held && o.ifToken != 0 {
			return &ExitError{Code: 1, Err: fmt.Errorf("fenced locks release: lock %q is not held, so not by token %s: nothing released", name, o.ifToken)}
		}
		if !st.Held {
			return &ExitError{Code: 1, Err: fmt.Errorf("fenced locks release: lock %q is not held: nothing released", name)}
		}
		owner := st.Owner
		if owner == "" {
			owner = "no owner label"
		}
		fmt.Fprintf(stdout, "released %s: token %s (%s), %s left; its holder's later writes with that token are stopped only by the fence\n",
			name, st.Token, owner, st.Remaining.Round(time.Millisecond))
		return nil
	}
}

// printLocks is the table of fenced locks list and get.
func printLocks(w io.Writer, locks []lock.State) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHELD\tTOKEN\tTTL\tOWNER\tWAITERS\t")
	for _, st := range locks {
		token, ttl, owner := "-", "-", st.Owner
		if st.Held {
			token, ttl = st.Token.String(), st.Remaining.Round(time.Millisecond).String()
		} else if st.LastToken != 0 {
			token = "last " + st.LastToken.String()
		}
		if owner == "" {
			owner = "-"
		}
		if st.Count > 1 {
			owner += fmt.Sprintf(" (held %d times)", st.Count)
		}
		waiters := fmt.Sprint(st.Waiters)
		if st.Waiters > 0 {
			waiters += fmt.Sprintf(" (oldest %s)", st.OldestWait.Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%s\t%s\t\n", st.Name, st.Held, token, ttl, owner, waiters)
	}
	return tw.Flush()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
