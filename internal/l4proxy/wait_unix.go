//go:build unix

package l4proxy

import (
	"errors"
	"net"
	"syscall"
)

// waitReadable blocks until c has a datagram (or an error) to read, or its
// read deadline passes, without consuming anything: it peeks one byte
// without waiting and, while there is nothing, lets the runtime poller
// wait for readability.
func waitReadable(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var one [1]byte
	werr := rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
	})
	return werr
}
