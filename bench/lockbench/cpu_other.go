//go:build !unix

package lockbench

import "time"

// processCPU is unknown here; the table shows "-".
func processCPU() time.Duration { return 0 }
