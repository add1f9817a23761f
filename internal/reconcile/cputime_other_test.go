//go:build !unix

package reconcile

import "time"

// processCPUTime is unknown here; benchmarks then report 0.
func processCPUTime() time.Duration { return 0 }
