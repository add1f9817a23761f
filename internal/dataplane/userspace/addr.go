package userspace

import (
	"errors"
	"net"
	"net/netip"
)

// AddrManager adds and removes the VIP addresses the userspace mode owns,
// so that its listeners can bind them. Implementations: LoAddrs (Linux,
// netlink) and NoAddrs.
type AddrManager interface {
	// CanAdd returns nil when Add can work, else why not (for the log).
	CanAdd() error
	// Add makes ip a local address owned by vipproxy; adding an owned
	// address again is not an error.
	Add(ip netip.Addr) error
	// Del removes an owned address; removing a missing one is not an error.
	Del(ip netip.Addr) error
	// List returns the addresses vipproxy owns now, including ones left by
	// an earlier process.
	List() ([]netip.Addr, error)
}

// NoAddrs is an AddrManager that owns nothing and cannot add: the mode
// then serves only VIPs that are already local. Reason says why, for the
// log ("" means "adding addresses is disabled").
type NoAddrs struct {
	Reason string
}

// CanAdd implements AddrManager: always an error carrying Reason.
func (n NoAddrs) CanAdd() error {
	if n.Reason == "" {
		return errors.New("adding addresses is disabled")
	}
	return errors.New(n.Reason)
}

// Add implements AddrManager: always the CanAdd error.
func (n NoAddrs) Add(netip.Addr) error { return n.CanAdd() }

// Del implements AddrManager: nothing is owned, so nothing to do.
func (NoAddrs) Del(netip.Addr) error { return nil }

// List implements AddrManager: nothing is owned.
func (NoAddrs) List() ([]netip.Addr, error) { return nil, nil }

// bindable reports whether ip is a local address a socket can bind, by
// binding a UDP socket to an ephemeral port on it. This is exact on every
// system: on Linux the whole of 127.0.0.0/8 binds, on macOS only the
// loopback aliases configured.
func bindable(ip netip.Addr) bool {
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
	if err != nil {
		return false
	}
	pc.Close()
	return true
}
