//go:build unix

package allocator

import (
	"os"
	"syscall"
)

// tryLockShared takes a shared flock on f without waiting. It reports
// false when another process holds the file exclusively (a running
// vipproxy); unlock releases the lock.
func tryLockShared(f *os.File) (unlock func(), ok bool) {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return nil, false
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }, true
}
