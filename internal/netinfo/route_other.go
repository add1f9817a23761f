//go:build !linux

package netinfo

import "net/netip"

// DefaultRouteAddrs returns nothing off Linux: the primary IPs then come
// from the node's addresses in address order.
func DefaultRouteAddrs() []netip.Addr { return nil }
