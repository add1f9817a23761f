// Package vipaddr binds VIPs as host addresses (/32, /128) on an
// interface over netlink, marked as one owner's so that listing and
// deleting never touch anyone else's: by the address protocol (IFA_PROTO,
// Linux 6.0+, both families) and, for IPv4, by the address label. The
// userspace mode binds its VIPs on lo, the IPVS mode on its dummy
// interface (or lo where there is none).
package vipaddr

import "net/netip"

// Marked binds addresses on Interface, marked with Proto and, for IPv4,
// Label. The zero Label means no label.
type Marked struct {
	Interface string
	Label     string
	Proto     byte
	// All makes List return every address of the interface, marked or
	// not: the owner created the interface (the IPVS dummy).
	All bool
}

// Host returns ip's host prefix length: 32 or 128.
func Host(ip netip.Addr) int {
	if ip.Is4() {
		return 32
	}
	return 128
}
