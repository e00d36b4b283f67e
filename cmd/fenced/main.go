// Command fenced is the fencing-token lock service: the daemon (fenced dev,
// fenced serve), a command runner that holds a lock (fenced exec), and
// admin commands. Run fenced --help.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	ctx, stop := signalContext()
	err := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var ee *ExitError
	var ue *usageError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &ee):
		if ee.Err != nil {
			fmt.Fprintln(os.Stderr, ee.Err)
		}
		os.Exit(ee.Code)
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "fenced:", err)
		os.Exit(1)
	}
}
