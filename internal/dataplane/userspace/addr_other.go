//go:build !linux

package userspace

import "runtime"

// osAddrs returns the address manager for this system: on systems other
// than Linux vipproxy does not add addresses, it serves the VIPs that are
// already local.
func osAddrs() AddrManager {
	return NoAddrs{Reason: "adding VIP addresses is only supported on Linux, not " + runtime.GOOS}
}
