package model

import (
	"net/netip"
	"reflect"
	"testing"
)

// byteSource hands out fuzz input bytes; it returns 0 when they run out.
type byteSource struct{ b []byte }

func (s *byteSource) next() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *byteSource) pick(n int) int { return int(s.next()) % n }

func (s *byteSource) bool() bool { return s.next()&1 == 1 }

var fuzzAddrs = []netip.Addr{
	netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"),
	netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"),
	netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("169.254.0.1"),
	netip.MustParseAddr("fe80::1"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("224.0.0.1"),
	netip.MustParseAddr("::ffff:10.0.0.4"), {},
}

// rare reports true about one time in 16: it picks the invalid choices.
func (s *byteSource) rare() bool { return s.next()%16 == 0 }

// choose returns a mostly valid element: from good, or rarely from bad.
func choose[T any](s *byteSource, good, bad []T) T {
	if len(bad) > 0 && s.rare() {
		return bad[s.pick(len(bad))]
	}
	return good[s.pick(len(good))]
}

// fuzzSnapshot builds a small Snapshot, mostly valid, from fuzz bytes.
func fuzzSnapshot(data []byte) *Snapshot {
	s := &byteSource{data}
	snap := &Snapshot{Node: &Node{Name: []string{"", "n1", "n2"}[s.pick(3)],
		Labels: map[string]string{LabelTopologyZone: []string{"", "z1", "z2"}[s.pick(3)]}}}
	names := []string{"", "a", "b"}
	protos := []Protocol{TCP, UDP, SCTP}
	nsvc := 1 + s.pick(4)
	for i := 0; i < nsvc; i++ {
		typ := choose(s, []ServiceType{"", TypeClusterIP, TypeNodePort, TypeLoadBalancer}, []ServiceType{TypeExternalName, "Bogus"})
		svc := Service{
			ServiceName:            svcName("ns", names[1+s.pick(2)]),
			Type:                   typ,
			Headless:               s.rare(),
			AffinityTimeoutSeconds: choose(s, []int{0, 10, 10800, 86400}, []int{86401, -1}),
			InternalTrafficPolicy:  choose(s, []TrafficPolicy{"", PolicyCluster, PolicyLocal}, []TrafficPolicy{"Bogus"}),
			ExternalTrafficPolicy:  choose(s, []TrafficPolicy{"", PolicyCluster, PolicyLocal}, []TrafficPolicy{"Bogus"}),
			TrafficDistribution:    choose(s, []string{"", DistributionPreferClose, DistributionPreferSameZone, DistributionPreferSameNode}, []string{"Bogus"}),
		}
		if typ == TypeLoadBalancer && svc.ExternalTrafficPolicy == PolicyLocal || s.rare() {
			svc.HealthCheckNodePort = 30999
		}
		good4 := []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2")}
		good6 := []netip.Addr{netip.MustParseAddr("fd00:96::1")}
		bad := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("224.0.0.9"), netip.MustParseAddr("::ffff:10.96.0.3"), {}}
		if !s.rare() {
			svc.ClusterIPs = append(svc.ClusterIPs, choose(s, good4, bad))
		}
		if s.bool() {
			svc.ClusterIPs = append(svc.ClusterIPs, choose(s, good6, bad))
		}
		if s.bool() {
			svc.ExternalIPs = append(svc.ExternalIPs, choose(s, append(good4, good6...), bad))
		}
		if s.bool() {
			svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, choose(s, append(good4, good6...), bad))
		}
		if s.bool() {
			svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges,
				choose(s, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), {}}))
		}
		for n := 1 + s.pick(3); n > 0; n-- {
			ps := ServicePortSpec{
				Name: names[s.pick(3)], Protocol: choose(s, protos, []Protocol{"ICMP"}),
				Port: choose(s, []uint16{53, 80, 443}, []uint16{0}),
			}
			if typ == TypeNodePort || typ == TypeLoadBalancer {
				ps.NodePort = uint16(30000 + s.pick(3))
			}
			if s.rare() {
				ps.NodePort = uint16(s.pick(2)) * 30000
			}
			svc.Ports = append(svc.Ports, ps)
		}
		snap.Services = append(snap.Services, &svc)
	}
	for n := s.pick(5); n > 0; n-- {
		sl := EndpointSlice{
			Name:        names[s.pick(3)],
			Service:     svcName("ns", names[1+s.pick(2)]),
			AddressType: choose(s, []AddressType{IPv4, IPv6}, []AddressType{"FQDN"}),
		}
		for m := 1 + s.pick(3); m > 0; m-- {
			sl.Ports = append(sl.Ports, EndpointPort{Name: names[s.pick(3)], Protocol: choose(s, protos, []Protocol{"ICMP"}),
				Port: choose(s, []uint16{8080, 8443}, []uint16{0})})
		}
		for m := s.pick(6); m > 0; m-- {
			e := SliceEndpoint{Ready: s.bool(), Serving: s.bool(), Terminating: s.bool(),
				Loc: At([]string{"", "n1", "n2"}[s.pick(3)], []string{"", "z1", "z2"}[s.pick(3)])}
			if choose(s, []int{1}, []int{0}) == 1 {
				e.Address = choose(s, fuzzAddrs[:5], fuzzAddrs[5:])
			}
			var zones, nodes []string
			if s.bool() {
				zones = []string{[]string{"z1", "z2"}[s.pick(2)]}
			}
			if s.bool() {
				nodes = []string{[]string{"n1", "n2"}[s.pick(2)]}
			}
			e.Loc = e.Loc.WithHints(zones, nodes)
			sl.Endpoints = append(sl.Endpoints, e)
		}
		snap.Slices = append(snap.Slices, &sl)
	}
	return snap
}

// FuzzBuild: Build never panics, is deterministic, and every ServicePort
// it produces passes Validate and carries the endpoint sets
// CategorizeEndpoints chooses.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30})
	f.Add([]byte("a fairly long seed that walks many branches of the generator 0123456789"))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap := fuzzSnapshot(data)
		st := Build(snap, BuildOptions{})
		if again := Build(snap, BuildOptions{}); !reflect.DeepEqual(st, again) {
			t.Fatalf("Build not deterministic")
		}
		for i, p := range st.Ports {
			if err := p.Validate(); err != nil {
				t.Fatalf("port %s invalid: %v", p.Name, err)
			}
			if i > 0 && st.Ports[i-1].Name.String() >= p.Name.String() {
				t.Fatalf("ports not sorted/unique at %d: %s, %s", i, st.Ports[i-1].Name, p.Name)
			}
			c, l := CategorizeEndpoints(p, st.NodeName, st.Node.Zone())
			if !reflect.DeepEqual(c, p.ClusterEndpoints) || !reflect.DeepEqual(l, p.LocalEndpoints) {
				t.Fatalf("port %s: stored endpoint sets differ from CategorizeEndpoints", p.Name)
			}
		}
	})
}
