//go:build unix

package reconcile

import (
	"syscall"
	"time"
)

// processCPUTime returns user+system CPU time used by this process, so
// benchmarks can report a figure that does not grow when other processes
// load the machine.
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
