// Package netinfo answers questions about this node's addresses: its
// primary IPs and the local addresses NodePorts listen on.
package netinfo

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// LocalAddrs returns every address configured on this network namespace's
// interfaces, loopback included, sorted. It fails only when the kernel
// cannot be asked.
func LocalAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("netinfo: list addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		out = append(out, p.Addr().Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// Without returns local minus the addresses in own (a node's VIP
// addresses are never node IPs), in local's order. local is not modified.
func Without(local, own []netip.Addr) []netip.Addr {
	if len(own) == 0 {
		return local
	}
	out := make([]netip.Addr, 0, len(local))
	for _, a := range local {
		if !slices.Contains(own, a) {
			out = append(out, a)
		}
	}
	return out
}

// PrimaryIPs picks this node's primary IP per family, in kube-proxy's
// order: the bind address when it is a concrete unicast address, else the
// Node's addresses (first of each family), else — standalone, with no
// Node object — the address the default route leaves from (defaultRoute,
// see DefaultRouteAddrs), else the first global unicast local address of
// each family. Loopback and link-local addresses are never primary, nor
// is anything not in local (callers remove vipproxy's own VIPs from local
// first, see Without). The result has at most one IPv4 and one IPv6
// address, IPv4 first.
func PrimaryIPs(nodeAddrs []netip.Addr, bindAddress netip.Addr, defaultRoute, local []netip.Addr) []netip.Addr {
	var v4, v6 netip.Addr
	pick := func(a netip.Addr) {
		a = a.Unmap()
		if !a.IsGlobalUnicast() && !a.IsPrivate() {
			return
		}
		if a.Is4() && !v4.IsValid() {
			v4 = a
		}
		if a.Is6() && !v6.IsValid() {
			v6 = a
		}
	}
	if bindAddress.IsValid() && !bindAddress.IsUnspecified() {
		pick(bindAddress)
	}
	for _, a := range nodeAddrs {
		pick(a)
	}
	for _, a := range defaultRoute {
		if slices.Contains(local, a.Unmap()) {
			pick(a)
		}
	}
	for _, a := range local {
		pick(a)
	}
	var out []netip.Addr
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// NodePortAddrs returns the local addresses NodePorts accept traffic on:
// those inside prefixes, or primary when prefixes is empty. Loopback
// addresses are never included (vipproxy never sets route_localnet).
func NodePortAddrs(prefixes []netip.Prefix, primary, local []netip.Addr) []netip.Addr {
	if len(prefixes) == 0 {
		return slices.Clone(primary)
	}
	var out []netip.Addr
	for _, a := range local {
		if a.IsLoopback() {
			continue
		}
		for _, p := range prefixes {
			if p.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	return out
}
