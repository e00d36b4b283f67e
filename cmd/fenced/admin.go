package main

import (
	"context"
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
		return fmt.Errorf("want a decimal token, 0 to %d", uint64(1<<63-1))
	}
	*v.t = fence.Token(n)
	return nil
}

type floorOpts struct {
	ef      etcdFlags
	prefix  string
	min     fence.Token
	timeout time.Duration
}

// newFloorCommand is admin floor or admin raise-floor (sub).
func newFloorCommand(sub string) (*command, *floorOpts) {
	summary := "Print the token floor: a lower bound on the next token, the floor offset and etcd's revision."
	if sub == "raise-floor" {
		summary = adminSummary
	}
	cmd := newCommand("fenced admin "+sub, "", summary)
	o := &floorOpts{}
	o.ef.register(cmd.fs, "The etcd cluster fenced takes tokens from: `endpoints` http(s)://host:port,... (required).")
	registerPrefix(cmd.fs, &o.prefix)
	if sub == "raise-floor" {
		cmd.fs.Var(tokenValue{&o.min}, "min-token", "Every token issued from now on exceeds this `token`: the highest token your resources have seen.")
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
	if uint64(min) >= 1<<63 {
		return usagef(cmd.name, "--min-token %d: want below 2^63", min)
	}
	cli, err := ef.client(eps)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if sub == "floor" {
		f, err := sequencer.ReadFloor(ctx, cli, prefix)
		if err != nil {
			return fmt.Errorf("etcd at %s: %w", ef.endpoints, err)
		}
		fmt.Fprintf(stdout, "next token >= %d (floor offset %d, etcd revision %d)\n", f.Next, f.Offset, f.Revision)
		return nil
	}
	f, err := sequencer.RaiseFloor(ctx, cli, prefix, min)
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", ef.endpoints, err)
	}
	fmt.Fprintf(stdout, "floor raised: next token >= %d (floor offset %d, etcd revision %d)\n", f.Next, f.Offset, f.Revision)
	return nil
}
