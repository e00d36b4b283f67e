package calls_test

import (
	"os"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
)

// Every goroutine the tests start must end with them.
func TestMain(m *testing.M) { os.Exit(testenv.CheckGoroutines(m.Run())) }
