package netinfo

import (
	"net/netip"
	"slices"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestPrimaryIPs(t *testing.T) {
	tests := []struct {
		name  string
		node  []netip.Addr
		bind  string
		route []netip.Addr
		local []netip.Addr
		want  []netip.Addr
	}{
		{"concrete bind address first (kube-proxy's order)", addrs("192.168.1.5"), "10.1.1.1", nil, addrs("10.0.0.1"), addrs("10.1.1.1")},
		{"node addresses next", addrs("192.168.1.5", "fd00::5"), "", addrs("10.0.0.9"), addrs("10.0.0.1", "10.0.0.9"), addrs("192.168.1.5", "fd00::5")},
		{"no Node: the default route's address, not the lowest", nil, "", addrs("192.168.77.11"), addrs("10.244.1.1", "192.168.77.11"), addrs("192.168.77.11")},
		{"default route per family", nil, "", addrs("192.168.77.11", "fd77::11"), addrs("10.244.1.1", "192.168.77.11", "fd00::1", "fd77::11"), addrs("192.168.77.11", "fd77::11")},
		{"default route address that is not local (a VIP) skipped", nil, "", addrs("10.96.0.60"), addrs("10.244.1.1"), addrs("10.244.1.1")},
		{"unspecified bind ignored", nil, "0.0.0.0", nil, addrs("127.0.0.1", "10.0.0.1"), addrs("10.0.0.1")},
		{"loopback and link-local never", nil, "", nil, addrs("127.0.0.1", "::1", "fe80::1", "169.254.0.3"), nil},
		{"one per family, v4 first", nil, "", nil, addrs("fd00::1", "10.0.0.1", "10.0.0.2", "fd00::2"), addrs("10.0.0.1", "fd00::1")},
		{"mapped unmapped", addrs("::ffff:10.2.3.4"), "", nil, nil, addrs("10.2.3.4")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var bind netip.Addr
			if tc.bind != "" {
				bind = netip.MustParseAddr(tc.bind)
			}
			got := PrimaryIPs(tc.node, bind, tc.route, tc.local)
			if !slices.Equal(got, tc.want) {
				t.Errorf("PrimaryIPs = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNodePortAddrs(t *testing.T) {
	local := addrs("127.0.0.1", "10.0.0.1", "192.168.77.2", "fd00::1")
	tests := []struct {
		name     string
		prefixes []netip.Prefix
		want     []netip.Addr
	}{
		{"empty means primary", nil, addrs("10.0.0.1")},
		{"prefix selects", []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}, addrs("192.168.77.2")},
		{"loopback never", []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, addrs("10.0.0.1", "192.168.77.2")},
		{"v6 prefix", []netip.Prefix{netip.MustParsePrefix("fd00::/64")}, addrs("fd00::1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NodePortAddrs(tc.prefixes, addrs("10.0.0.1"), local)
			if !slices.Equal(got, tc.want) {
				t.Errorf("NodePortAddrs = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWithoutOwnAddrs: a VIP left on lo sorts before the node's address;
// once removed it is neither the primary IP nor a NodePort address.
func TestWithoutOwnAddrs(t *testing.T) {
	a := netip.MustParseAddr
	local := []netip.Addr{a("10.96.0.60"), a("127.0.0.1"), a("192.168.1.5")}
	own := []netip.Addr{a("10.96.0.60")}
	if got := PrimaryIPs(nil, netip.Addr{}, nil, local); got[0] != a("10.96.0.60") {
		t.Fatalf("test premise: primary %v", got)
	}
	rest := Without(local, own)
	if got := PrimaryIPs(nil, netip.Addr{}, nil, rest); len(got) != 1 || got[0] != a("192.168.1.5") {
		t.Errorf("primary %v, want [192.168.1.5]", got)
	}
	if got := NodePortAddrs([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, nil, rest); len(got) != 1 || got[0] != a("192.168.1.5") {
		t.Errorf("NodePort addresses %v, want [192.168.1.5]", got)
	}
	if len(local) != 3 {
		t.Errorf("Without modified its input")
	}
}
