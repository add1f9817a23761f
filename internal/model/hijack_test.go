package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestBuildRefusesVIPHijacks: externalIPs and load-balancer IPs cannot
// take over a ClusterIP (whichever name sorts first), the node's loopback,
// link-local (metadata) or multicast addresses, the service range, or
// addresses outside --external-ip-cidrs.
func TestBuildRefusesVIPHijacks(t *testing.T) {
	dns := Service{ServiceName: svcName("kube-system", "kube-dns"), ClusterIPs: []netip.Addr{ip("10.96.0.10")},
		Ports: []ServicePortSpec{{Name: "dns", Protocol: UDP, Port: 53}}}
	attacker := func(ns string, ext ...string) Service {
		s := Service{ServiceName: svcName(ns, "evil"), ClusterIPs: []netip.Addr{ip("10.96.5.5")},
			Ports: []ServicePortSpec{{Name: "dns", Protocol: UDP, Port: 53}}}
		for _, e := range ext {
			s.ExternalIPs = append(s.ExternalIPs, ip(e))
		}
		return s
	}
	tests := []struct {
		name     string
		svcs     []Service
		opts     BuildOptions
		wantExt  []string // externalIPs the attacker's port keeps
		problems []string // substrings, one per expected Problem of the attacker
	}{
		{name: "ClusterIP wins when the attacker sorts first", svcs: []Service{dns, attacker("aaa", "10.96.0.10", "192.0.2.1")},
			wantExt: []string{"192.0.2.1"}, problems: []string{"is the ClusterIP of Service kube-system/kube-dns"}},
		{name: "ClusterIP wins when the attacker sorts last", svcs: []Service{dns, attacker("zzz", "10.96.0.10")},
			problems: []string{"is the ClusterIP of Service kube-system/kube-dns"}},
		{name: "ClusterIP owner named also inside the service range", svcs: []Service{dns, attacker("zzz", "10.96.0.10")},
			opts:     BuildOptions{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
			problems: []string{"is the ClusterIP of Service kube-system/kube-dns"}},
		{name: "metadata address refused", svcs: []Service{attacker("a", "169.254.169.254")}, problems: []string{"link-local"}},
		{name: "loopback refused", svcs: []Service{attacker("a", "127.0.0.1")}, problems: []string{"loopback"}},
		{name: "multicast refused", svcs: []Service{attacker("a", "239.1.1.1")}, problems: []string{"multicast"}},
		{name: "unspecified refused", svcs: []Service{attacker("a", "0.0.0.0")}, problems: []string{"unspecified"}},
		{name: "inside the service range refused", svcs: []Service{attacker("a", "10.96.200.1", "192.0.2.1")},
			opts:    BuildOptions{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
			wantExt: []string{"192.0.2.1"}, problems: []string{"inside the service range"}},
		{name: "allow-list refuses the rest", svcs: []Service{attacker("a", "192.0.2.1", "198.51.100.1")},
			opts:    BuildOptions{ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
			wantExt: []string{"192.0.2.1"}, problems: []string{"outside --external-ip-cidrs"}},
		{name: "empty allow-list allows", svcs: []Service{attacker("a", "192.0.2.1", "198.51.100.1")},
			wantExt: []string{"192.0.2.1", "198.51.100.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, build := range []func(*Snapshot, BuildOptions) *State{Build, new(Builder).Build} {
				st := build(&Snapshot{Services: Ptrs(tc.svcs)}, tc.opts)
				var evil *ServicePort
				for _, p := range st.Ports {
					if p.Name.Name == "evil" {
						evil = p
					}
				}
				if evil == nil {
					t.Fatalf("attacker's port missing: %v", st.Problems)
				}
				var got []string
				for _, a := range evil.ExternalIPs {
					got = append(got, a.String())
				}
				if !slices.Equal(got, tc.wantExt) {
					t.Errorf("externalIPs %v, want %v", got, tc.wantExt)
				}
				var ps []Problem
				for _, p := range st.Problems {
					if strings.Contains(p.Object, "evil") {
						ps = append(ps, p)
					}
				}
				if len(ps) != len(tc.problems) {
					t.Fatalf("problems %v, want %d", ps, len(tc.problems))
				}
				for i, want := range tc.problems {
					if !strings.Contains(ps[i].Reason, want) || !strings.HasPrefix(ps[i].Field, "spec.externalIPs") {
						t.Errorf("problem %v, want %q on spec.externalIPs", ps[i], want)
					}
				}
			}
		})
	}
}

// TestBuildClusterIPClaimLoadBalancer: a load-balancer IP equal to a
// ClusterIP is dropped too, and a Builder hands out the same copy while
// nothing changes (stable pointers mean no dataplane rewrite).
func TestBuildClusterIPClaimLoadBalancer(t *testing.T) {
	a := Service{ServiceName: svcName("ns", "a"), ClusterIPs: []netip.Addr{ip("10.96.0.20")},
		Ports: []ServicePortSpec{{Protocol: TCP, Port: 80}}}
	b := Service{ServiceName: svcName("ns", "b"), Type: TypeLoadBalancer, ClusterIPs: []netip.Addr{ip("10.96.0.21")},
		LoadBalancerIPs: []netip.Addr{ip("10.96.0.20"), ip("203.0.113.7"), ip("169.254.169.254")},
		Ports:           []ServicePortSpec{{Protocol: TCP, Port: 80, NodePort: 30080}}}
	var c Builder
	snap := &Snapshot{Services: Ptrs([]Service{a, b})}
	st1 := c.Build(snap, BuildOptions{})
	st2 := c.Build(snap, BuildOptions{})
	p1, p2 := findPort(st1, "ns/b/TCP"), findPort(st2, "ns/b/TCP")
	if p1 == nil || !slices.Equal(p1.LoadBalancerIPs, []netip.Addr{ip("203.0.113.7")}) {
		t.Fatalf("LB IPs of b: %+v; problems %v", p1, st1.Problems)
	}
	if p1 != p2 {
		t.Errorf("unchanged input gave a new port pointer")
	}
	if len(st1.Problems) != 2 {
		t.Errorf("problems %v, want the ClusterIP claim and the link-local address", st1.Problems)
	}
}
