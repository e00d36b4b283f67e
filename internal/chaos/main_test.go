package chaos

import (
	"os"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.CheckGoroutines(m.Run())) }
