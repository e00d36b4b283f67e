// Command scaling measures how fenced's cost grows with concurrent clients
// and with locks held at once, beside etcd's Mutex, prints the tables and
// draws the curves as SVG (see lockbench.ScalingCommand).
package main

import (
	"github.com/fenced/fenced/bench/internal/benchkit"
	"github.com/fenced/fenced/bench/lockbench"
)

func main() { benchkit.Main("scaling", lockbench.ScalingCommand) }
