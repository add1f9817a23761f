package model

import (
	"errors"
	"fmt"
	"net/netip"
)

// Reasons CheckEndpointIP refuses an address. Test with errors.Is.
var (
	ErrInvalidIP   = errors.New("invalid or zoned address")
	ErrUnspecified = errors.New("unspecified address")
	ErrLoopback    = errors.New("loopback address")
	ErrLinkLocal   = errors.New("link-local address")
	ErrMulticast   = errors.New("multicast address")
)

// CheckEndpointIP reports whether a may be a Service backend. It refuses,
// with an error wrapping the matching sentinel:
//
//   - the zero Addr and zoned addresses (ErrInvalidIP);
//   - 0.0.0.0 and :: (ErrUnspecified);
//   - 127.0.0.0/8 and ::1 (ErrLoopback);
//   - 169.254.0.0/16 and fe80::/10 (ErrLinkLocal);
//   - link-local multicast 224.0.0.0/24 and ff02::/16, which wrap both
//     ErrLinkLocal and ErrMulticast;
//   - every other multicast address (ErrMulticast).
//
// These are the addresses the API server refuses for endpoints; DNATing
// to them would let a Service reach the node's own loopback services or a
// neighbour on the link. IPv4-mapped IPv6 addresses are judged by their
// IPv4 address.
func CheckEndpointIP(a netip.Addr) error {
	if !a.IsValid() || a.Zone() != "" {
		return fmt.Errorf("%w: %q", ErrInvalidIP, a.String())
	}
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return fmt.Errorf("%w %s", ErrUnspecified, a)
	case a.IsLoopback():
		return fmt.Errorf("%w %s", ErrLoopback, a)
	case a.IsLinkLocalUnicast():
		return fmt.Errorf("%w %s", ErrLinkLocal, a)
	case a.IsLinkLocalMulticast():
		return fmt.Errorf("%w %s (%w)", ErrLinkLocal, a, ErrMulticast)
	case a.IsMulticast():
		return fmt.Errorf("%w %s", ErrMulticast, a)
	}
	return nil
}
