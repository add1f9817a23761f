package ipvs

import "github.com/vipproxy/vipproxy/internal/sysctl"

import ()

// sysctlSetting is one sysctl the mode needs, by its /proc/sys path.
type sysctlSetting struct{ name, value string }

// sysctls returns what kube-proxy sets in IPVS mode: IPVS connection
// tracking (so iptables masquerade sees IPVS connections), expiring
// connections to removed real servers and quiescent persistence templates,
// forwarding, and with strictARP arp_ignore=1 / arp_announce=2.
func sysctls(strictARP bool) []sysctlSetting {
	s := []sysctlSetting{
		{"/proc/sys/net/ipv4/vs/conntrack", "1"},
		{"/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"},
		{"/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"},
		{"/proc/sys/net/ipv4/ip_forward", "1"},
	}
	if strictARP {
		s = append(s, sysctlSetting{"/proc/sys/net/ipv4/conf/all/arp_ignore", "1"}, sysctlSetting{"/proc/sys/net/ipv4/conf/all/arp_announce", "2"})
	}
	return s
}

// FakeSysctl returns an in-memory sysctl.FS holding every sysctl the mode
// may write, at the values of a fresh node (forwarding on, the rest 0).
func FakeSysctl() *sysctl.Fake {
	v := map[string]string{}
	for _, s := range sysctls(true) {
		v[s.name] = "0"
	}
	v["/proc/sys/net/ipv4/ip_forward"] = "1"
	return &sysctl.Fake{Values: v}
}
