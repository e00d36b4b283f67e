//go:build !unix

package benchkit

import "time"

// ProcessCPU is unknown here; the table shows "-".
func ProcessCPU() time.Duration { return 0 }
