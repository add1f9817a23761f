//go:build unix

// Package cpustat reads the CPU time this process has used: a figure that,
// unlike wall time, does not grow when other processes load the machine.
package cpustat

import (
	"syscall"
	"time"
)

// Process returns the user and system CPU time this process used so far,
// 0 when it cannot be read.
func Process() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
