//go:build !linux

package ipvs

import (
	"errors"
	"net/netip"
)

// LinkAddrs cannot bind addresses off Linux.
type LinkAddrs struct{ NoDummy bool }

var errNoLinux = errors.New("ipvs: binding VIPs needs Linux")

// Add fails off Linux.
func (*LinkAddrs) Add(netip.Addr) error { return errNoLinux }

// Del does nothing off Linux.
func (*LinkAddrs) Del(netip.Addr) error { return nil }

// List returns nothing off Linux.
func (*LinkAddrs) List() ([]netip.Addr, error) { return nil, nil }

// Cleanup does nothing off Linux.
func (*LinkAddrs) Cleanup() error { return nil }
