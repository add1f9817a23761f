//go:build !unix

package l4proxy

import "net"

// waitReadable returns at once: where the poller cannot be asked to wait
// without reading, the session's Read waits, holding its buffer.
func waitReadable(*net.UDPConn) error { return nil }
