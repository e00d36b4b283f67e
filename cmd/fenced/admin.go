package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/sequencer"
)

const adminSummary = `Administer the token floor in etcd, and install the Postgres fence.

  fenced admin raise-floor [flags]   make every token issued from now on exceed every token issued before
  fenced admin floor [flags]         print the current floor
  fenced admin pg-sql [flags]        print the Postgres fence's migrations as SQL, for psql, Flyway or Liquibase
  fenced admin pg-migrate [flags]    apply them to --database-url

Run raise-floor once after etcd was restored from an older snapshot or
replaced by a new cluster, before fenced serves again: otherwise tokens go
back. The new floor is the largest of --min-token, the highest token the
cluster has issued, and the current time in microseconds. Give the highest
token your resources have seen as --min-token to be safe even against a
wrong clock.`

// raiseFloorSummary is admin raise-floor's own usage.
const raiseFloorSummary = `Raise the token floor in etcd: every token issued from now on exceeds every
token issued before, under --etcd-prefix.

Run it once after etcd was restored from an older snapshot or replaced by a
new cluster, before fenced serves again: otherwise tokens go back. (With
embedded etcd members, start fenced serve or dev with --raise-floor instead.)
The new floor is the largest of --min-token, the highest token the cluster
has issued, and the current time in microseconds. Give the highest token your
resources have seen as --min-token to be safe even against a wrong clock. It
takes at most 2^62 (4611686018427387904): nothing lowers a floor once raised,
and a larger one would leave too few of the tokens below 2^63.

It prints the new floor and the prefix, and says when no token was ever
issued under that prefix: a new cluster raised before fenced first runs, or a
prefix fenced does not serve.`

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("fenced admin", "missing the admin command: raise-floor, floor, pg-sql or pg-migrate")
	}
	switch args[0] {
	case "raise-floor", "floor":
		return runFloor(ctx, args[0], args[1:], stdout)
	case "pg-sql":
		return runPgSQL(args[1:], stdout)
	case "pg-migrate":
		return runPgMigrate(ctx, args[1:], stdout)
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[0] == "help" { // fenced admin help raise-floor
			return runAdmin(ctx, []string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprintln(stdout, "Usage: fenced admin raise-floor|floor|pg-sql|pg-migrate [flags]")
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, adminSummary)
		return nil
	}
	return usagef("fenced admin", "unknown admin command %q: want raise-floor, floor, pg-sql or pg-migrate", args[0])
}

// tokenValue is a fence.Token flag; 0 is allowed (no minimum).
type tokenValue struct{ t *fence.Token }

func (v tokenValue) String() string {
	if v.t == nil {
		return "0"
	}
	return v.t.String()
}

func (v tokenValue) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want a decimal token, 0 to %d (2^62)", uint64(sequencer.MaxMinToken))
	}
	*v.t = fence.Token(n)
	return nil
}

// checkMinToken refuses a --min-token above sequencer.MaxMinToken before
// etcd is asked: a typo with a digit too many left one token below 2^63,
// then none, for good (docs/design.md, "Keys and tokens").
func checkMinToken(cmd string, min fence.Token) error {
	if min <= sequencer.MaxMinToken {
		return nil
	}
	return usagef(cmd, "--min-token %d: above 2^62 (%d), the most it takes: nothing lowers a floor once raised, and this one would leave "+
		"too few of the tokens below 2^63 (a digit too many?); give the highest token your resources have seen (tokens are near %d now, "+
		"the clock in microseconds), or leave it out: the clock and the tokens etcd issued count anyway",
		uint64(min), uint64(sequencer.MaxMinToken), time.Now().UnixMicro())
}

type floorOpts struct {
	ef      etcdFlags
	prefix  string
	min     fence.Token
	timeout time.Duration
}

// newFloorCommand is admin floor or admin raise-floor (sub).
func newFloorCommand(sub string) (*command, *floorOpts) {
	summary := "Print the token floor under --etcd-prefix: a lower bound on the next token, the floor offset and etcd's\n" +
		"revision; say when no token was ever issued under the prefix, and exit 1 when no token is left below 2^63."
	if sub == "raise-floor" {
		summary = raiseFloorSummary
	}
	cmd := newCommand("fenced admin "+sub, "", summary)
	o := &floorOpts{}
	o.ef.register(cmd.fs, "The etcd cluster fenced takes tokens from: `endpoints` http(s)://host:port,... (required).")
	registerPrefix(cmd.fs, &o.prefix)
	if sub == "raise-floor" {
		cmd.fs.Var(tokenValue{&o.min}, "min-token", "Every token issued from now on exceeds this `token`: the highest token your resources have seen; at most 2^62.")
	}
	cmd.fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "Give up after this long.")
	return cmd, o
}

func runFloor(ctx context.Context, sub string, args []string, stdout io.Writer) (err error) {
	cmd, o := newFloorCommand(sub)
	defer cmd.explainEnv(&err)
	if err := cmd.parse(args, stdout); err != nil {
		return err
	}
	ef, prefix, min, timeout := &o.ef, o.prefix, o.min, o.timeout
	if err := firstErr(cmd.noArgs(), validatePrefix(cmd.name, prefix)); err != nil {
		return err
	}
	if ef.endpoints == "" {
		return usagef(cmd.name, "--etcd-endpoints is required: the etcd cluster fenced takes tokens from")
	}
	eps, err := ef.validate(cmd.name)
	if err != nil {
		return err
	}
	if timeout <= 0 {
		return usagef(cmd.name, "--timeout %s: want > 0", timeout)
	}
	if err := checkMinToken(cmd.name, min); err != nil {
		return err
	}
	cli, err := ef.client(eps)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	where := fmt.Sprintf("etcd prefix %q", sequencer.NewKeyspace(prefix).Prefix())
	if sub == "floor" {
		f, err := sequencer.ReadFloor(ctx, cli, prefix)
		if err != nil {
			return fmt.Errorf("etcd at %s: %w", ef.endpoints, err)
		}
		fmt.Fprintf(stdout, "next token >= %d (floor offset %d, etcd revision %d, %s)\n", f.Next, f.Offset, f.Revision, where)
		if f.Exhausted() {
			// The floor a command printed as if all were well: say it,
			// and fail, since every acquisition does.
			return fmt.Errorf("no token is left below 2^63 under %s: the next would be %d, above 2^63-1 (fence.MaxToken), and every acquisition fails; %s",
				where, uint64(f.Next), exhaustedAdvice)
		}
		printFloorNotes(stdout, f, where, "")
		return nil
	}
	f, err := sequencer.RaiseFloor(ctx, cli, prefix, min)
	if errors.Is(err, sequencer.ErrTokensExhausted) {
		return fmt.Errorf("etcd at %s, %s: %w; %s", ef.endpoints, where, err, exhaustedAdvice)
	}
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", ef.endpoints, err)
	}
	fmt.Fprintf(stdout, "floor raised: next token >= %d (floor offset %d, etcd revision %d, %s)\n", f.Next, f.Offset, f.Revision, where)
	printFloorNotes(stdout, f, where, "; the floor is raised all the same, as it should be on a new cluster before fenced first runs")
	return nil
}

// exhaustedAdvice is what an operator does once no token is left below
// 2^63 (sequencer.ErrTokensExhausted), as fenced serve's 503 says it.
const exhaustedAdvice = "nothing lowers a floor: to issue tokens again, give every fenced a new --etcd-prefix (or a new etcd cluster), " +
	"reset the fences that admitted a token near 2^63, and restart every fenced (each remembers the highest token it saw)"

// printFloorNotes says what an operator may not expect of floor f under
// where: a prefix no token was issued under (a new cluster, or not the
// prefix fenced serves: the raise "worked" on the wrong keys), and few
// tokens left. raised ends the first note.
func printFloorNotes(w io.Writer, f sequencer.Floor, where, raised string) {
	if !f.Issued {
		fmt.Fprintf(w, "no token was ever issued under %s in this etcd cluster: if fenced serves another prefix (its --etcd-prefix, "+
			"$FENCED_ETCD_PREFIX; default %s), give that one%s\n", where, sequencer.DefaultPrefix, raised)
	}
	if f.Next > sequencer.MaxMinToken {
		fmt.Fprintf(w, "only %d tokens are left below 2^63 under %s\n", uint64(fence.MaxToken-f.Next)+1, where)
	}
}
