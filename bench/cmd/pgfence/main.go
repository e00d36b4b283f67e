// Command pgfence measures the transactions per second of an UPDATE guarded
// by the Postgres adapter's column and fence-table modes against the same
// UPDATE unguarded (see pgfence.Command).
package main

import (
	"github.com/fenced/fenced/bench/internal/benchkit"
	"github.com/fenced/fenced/bench/pgfence"
)

func main() { benchkit.Main("pgfence", pgfence.Command) }
