// Command compare runs fenced and the common lock schemes under the same
// faults on the same Postgres ledger and prints what a checker found (see
// package compare).
package main

import (
	"os"

	"github.com/fenced/fenced/bench/compare"
	"github.com/fenced/fenced/bench/internal/benchkit"
)

func main() {
	if compare.IsChild() {
		os.Exit(compare.ChildMain())
	}
	benchkit.Main("compare", compare.Command)
}
