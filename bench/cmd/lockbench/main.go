// Command lockbench compares fenced's locks with etcd's concurrency Mutex,
// bsm/redislock and go-redsync/redsync in one run, against the same Redis
// and an embedded etcd, and prints one table (see lockbench.Command).
package main

import (
	"github.com/fenced/fenced/bench/internal/benchkit"
	"github.com/fenced/fenced/bench/lockbench"
)

func main() { benchkit.Main("lockbench", lockbench.Command) }
