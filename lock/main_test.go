package lock_test

import (
	"os"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
)

// Most tests here wait on TTLs, elections and failovers of servers of their
// own, and run in parallel: four at once. Every goroutine the tests start
// must end with them.
func TestMain(m *testing.M) {
	testenv.Parallel(4)
	os.Exit(testenv.CheckGoroutines(m.Run()))
}
