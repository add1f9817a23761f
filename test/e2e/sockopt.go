//go:build linux

package e2e

import (
	"syscall"
)

// reuseAddr sets SO_REUSEADDR so fixed-port clients can rebind at once.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}
