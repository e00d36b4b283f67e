// Command httpbench measures acquire+release over the HTTP API against the
// in-process SDK, in one process and one run, over one lease store, and
// prints one table (see httpbench.Command).
package main

import (
	"github.com/fenced/fenced/bench/httpbench"
	"github.com/fenced/fenced/bench/internal/benchkit"
)

func main() { benchkit.Main("httpbench", httpbench.Command) }
