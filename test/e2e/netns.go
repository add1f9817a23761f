//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
)

// InNetns runs fn on a fresh OS thread that has joined the named network
// namespace (a name under /run/netns). Sockets fn creates belong to that
// namespace for their whole life, whichever thread later uses them. The thread
// is never unlocked, so the Go runtime discards it when fn returns and no other
// goroutine ever runs in the wrong namespace. It returns fn's error, or an
// error if the namespace cannot be entered.
func InNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		h, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("netns %s: enter: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// DialOptions tune DialConn and Dial. The zero value dials from the
// namespace's default source address and an ephemeral port with a 1 s timeout.
type DialOptions struct {
	// Source, if non-empty, is the local IP to bind (the namespace must own it).
	Source string
	// SourcePort, if non-zero, is the local port to bind (UDP "fixed source
	// port" clients). SO_REUSEADDR is set so a port can be rebound at once.
	SourcePort int
	// Timeout bounds connecting and, for Dial, reading the reply. Zero means 1 s.
	Timeout time.Duration
}

func (o DialOptions) timeout() time.Duration {
	if o.Timeout <= 0 {
		return time.Second
	}
	return o.Timeout
}

// DialConn opens a connection ("tcp" or "udp", any family) from inside the
// named namespace to addr ("ip:port" or "[ip6]:port").
func DialConn(ns, network, addr string, o DialOptions) (net.Conn, error) {
	var conn net.Conn
	err := InNetns(ns, func() error {
		d := net.Dialer{Timeout: o.timeout()}
		if o.Source != "" || o.SourcePort != 0 {
			ip := net.ParseIP(o.Source)
			switch network {
			case "udp", "udp4", "udp6":
				d.LocalAddr = &net.UDPAddr{IP: ip, Port: o.SourcePort}
			default:
				d.LocalAddr = &net.TCPAddr{IP: ip, Port: o.SourcePort}
			}
			d.Control = reuseAddr
		}
		c, err := d.DialContext(context.Background(), network, addr)
		conn = c
		return err
	})
	return conn, err
}
