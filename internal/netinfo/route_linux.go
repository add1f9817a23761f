//go:build linux

package netinfo

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultRouteAddrs returns, per family (IPv4 first), the address this
// network namespace's default route leaves from: the route's preferred
// source when it names one, else the first global unicast address of the
// route's interface. A family without a default route, or whose default
// route cannot be read, is left out.
func DefaultRouteAddrs() []netip.Addr {
	var out []netip.Addr
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			continue
		}
		for _, r := range routes {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			if a, ok := netip.AddrFromSlice(r.Src); ok && a.Unmap().IsGlobalUnicast() {
				out = append(out, a.Unmap())
				break
			}
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			addrs, err := netlink.AddrList(link, fam)
			if err != nil {
				continue
			}
			found := false
			for _, la := range addrs {
				if a, ok := netip.AddrFromSlice(la.IP); ok && a.Unmap().IsGlobalUnicast() {
					out = append(out, a.Unmap())
					found = true
					break
				}
			}
			if found {
				break
			}
		}
	}
	return out
}
