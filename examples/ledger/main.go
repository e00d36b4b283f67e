// Command ledger moves money between the accounts of a small Postgres ledger
// from several worker processes under a lock, freezes one worker with
// SIGSTOP between its read and its write until its lease has expired and
// another worker has committed, and then lets it write.
//
// It runs that scenario twice: with a Redis-only lock (SET NX PX and a Lua
// compare-and-delete, no token), where the frozen worker's write is applied
// and loses an update; and with fenced (a lease in Redis, a token from etcd,
// the token admitted by adapters/postgres in the write's transaction), where
// it is rejected as stale. Then it checks the ledger of each run.
//
//	go run ./examples/ledger [flags]
//
// See README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx := context.Background()
	var stop context.CancelFunc
	// A worker keeps the default signal dispositions, so that a signal ends
	// it at once; the orchestrator turns SIGINT and SIGTERM into the end of
	// its context, and kills its workers.
	if len(os.Args) < 2 || os.Args[1] != workerCommand {
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	}
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if stop != nil {
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}
