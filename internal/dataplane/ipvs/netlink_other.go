//go:build !linux

package ipvs

import (
	"errors"
	"fmt"
)

// ErrNoIPVS is returned by OpenNetlink where there is no IPVS.
var ErrNoIPVS = errors.New("ipvs: IPVS exists on Linux only")

// Netlink is unavailable off Linux; OpenNetlink always fails.
type Netlink struct{ Kernel }

// OpenNetlink fails off Linux with an error wrapping ErrNoIPVS.
func OpenNetlink() (*Netlink, error) { return nil, fmt.Errorf("%w", ErrNoIPVS) }

// Close does nothing.
func (n *Netlink) Close() {}
