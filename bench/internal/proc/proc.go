// Package proc measures the benchmark process itself.
package proc

import (
	"syscall"
	"time"
)

// CPUTime is the CPU time the process has used, user and system: on a
// shared machine it says what an operation costs better than the wall
// clock, which counts the time other processes held the cores.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
