//go:build !unix

package httpbench

import "time"

// processCPU is unknown here: the table shows "-".
func processCPU() time.Duration { return 0 }
