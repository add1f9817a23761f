package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// Endpoint condition flags for the table below.
const (
	fReady       = 1 << iota // ready (implies serving, not terminating)
	fServing                 // serving
	fTerminating             // terminating
	fLocal                   // on this node
)

type epOpt func(*Endpoint)

func zoneHint(z ...string) epOpt {
	return func(e *Endpoint) { e.Loc = e.Loc.WithHints(z, e.NodeHints()) }
}
func nodeHint(n ...string) epOpt {
	return func(e *Endpoint) { e.Loc = e.Loc.WithHints(e.ZoneHints(), n) }
}
func inZone(z string) epOpt {
	return func(e *Endpoint) { e.Loc = At(e.NodeName(), z).WithHints(e.ZoneHints(), e.NodeHints()) }
}
func onNode(n string) epOpt {
	return func(e *Endpoint) { e.Loc = At(n, e.Zone()).WithHints(e.ZoneHints(), e.NodeHints()) }
}

// tep builds a test endpoint 10.0.0.<last>:80.
func tep(last byte, flags int, opts ...epOpt) Endpoint {
	e := Endpoint{
		IP:          netip.AddrFrom4([4]byte{10, 0, 0, last}),
		Port:        80,
		Ready:       flags&fReady != 0,
		Serving:     flags&(fReady|fServing) != 0,
		Terminating: flags&fTerminating != 0,
		Local:       flags&fLocal != 0,
	}
	if e.Local {
		e.Loc = At("me", "")
	} else {
		e.Loc = At("other", "")
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

type spOpt func(*ServicePort)

func iLocal(p *ServicePort)     { p.InternalTrafficPolicy = PolicyLocal }
func eLocal(p *ServicePort)     { p.ExternalTrafficPolicy = PolicyLocal }
func nodePort(p *ServicePort)   { p.Type = TypeNodePort; p.NodePort = 30080 }
func externalIP(p *ServicePort) { p.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")} }
func lbIP(p *ServicePort) {
	p.Type = TypeLoadBalancer
	p.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.2")}
}
func dist(d string) spOpt     { return func(p *ServicePort) { p.TrafficDistribution = d } }
func eps(e ...Endpoint) spOpt { return func(p *ServicePort) { p.Endpoints = e } }
func addrs(eps []Endpoint) (out []string) {
	if eps == nil {
		return nil
	}
	out = []string{}
	for _, e := range eps {
		out = append(out, e.IP.String())
	}
	return out
}

func TestCategorizeEndpoints(t *testing.T) {
	none := []string(nil) // set not needed: must be nil
	empty := []string{}   // set needed but no endpoint usable
	tests := []struct {
		name        string
		opts        []spOpt
		node, zone  string
		wantCluster []string
		wantLocal   []string
	}{
		// Rule 1: which sets are needed.
		{name: "needs/cluster only by default, no endpoints gives empty non-nil", wantCluster: empty, wantLocal: none},
		{name: "needs/internal Local without external access: no cluster set",
			opts: []spOpt{iLocal, eps(tep(1, fReady|fLocal))}, wantCluster: none, wantLocal: []string{"10.0.0.1"}},
		{name: "needs/internal Local with NodePort: both sets (external traffic is Cluster)",
			opts: []spOpt{iLocal, nodePort, eps(tep(1, fReady|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "needs/external Local with NodePort: both sets (short-circuit uses Cluster)",
			opts: []spOpt{eLocal, nodePort, eps(tep(1, fReady|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "needs/external Local with externalIP: both sets",
			opts: []spOpt{eLocal, externalIP, eps(tep(1, fReady|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "needs/external Local with load-balancer IP: both sets",
			opts: []spOpt{eLocal, lbIP, eps(tep(1, fReady|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "needs/external Local without external access is ignored: no local set",
			opts: []spOpt{eLocal, eps(tep(1, fReady|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "needs/both Local with NodePort: both sets",
			opts: []spOpt{iLocal, eLocal, nodePort, eps(tep(1, fReady), tep(2, fReady))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: empty},

		// Rules 2-4: ready first, then serving+terminating.
		{name: "ready/all ready endpoints used",
			opts: []spOpt{eps(tep(1, fReady), tep(2, fReady|fLocal))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "ready/not-ready endpoint never used",
			opts: []spOpt{eps(tep(1, fReady), tep(2, 0))}, wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "ready/ready preferred over serving+terminating",
			opts: []spOpt{eps(tep(1, fServing|fTerminating), tep(2, fReady))}, wantCluster: []string{"10.0.0.2"}, wantLocal: none},
		{name: "fallback/no ready: serving+terminating used",
			opts: []spOpt{eps(tep(1, fServing|fTerminating), tep(2, 0), tep(3, fServing|fTerminating))}, wantCluster: []string{"10.0.0.1", "10.0.0.3"}, wantLocal: none},
		{name: "fallback/terminating but not serving never used",
			opts: []spOpt{eps(tep(1, fTerminating), tep(2, fServing|fTerminating))}, wantCluster: []string{"10.0.0.2"}, wantLocal: none},
		{name: "fallback/serving but neither ready nor terminating never used",
			opts: []spOpt{eps(tep(1, fServing))}, wantCluster: empty, wantLocal: none},
		{name: "fallback/nothing usable gives empty set",
			opts: []spOpt{eps(tep(1, 0), tep(2, fTerminating))}, wantCluster: empty, wantLocal: none},

		// Rule 6: Local set, chosen independently.
		{name: "local/only endpoints on this node",
			opts: []spOpt{iLocal, eps(tep(1, fReady), tep(2, fReady|fLocal), tep(3, fReady|fLocal))}, wantCluster: none, wantLocal: []string{"10.0.0.2", "10.0.0.3"}},
		{name: "local/no local endpoint gives empty set even with remote ready ones",
			opts: []spOpt{iLocal, eps(tep(1, fReady), tep(2, fReady))}, wantCluster: none, wantLocal: empty},
		{name: "local/ready local preferred over terminating local",
			opts: []spOpt{iLocal, eps(tep(1, fServing|fTerminating|fLocal), tep(2, fReady|fLocal))}, wantCluster: none, wantLocal: []string{"10.0.0.2"}},
		{name: "local/fallback to serving+terminating local endpoints",
			opts: []spOpt{iLocal, eps(tep(1, fServing|fTerminating|fLocal), tep(2, fReady), tep(3, fTerminating|fLocal))}, wantCluster: none, wantLocal: []string{"10.0.0.1"}},
		{name: "local/not-ready local endpoint never used",
			opts: []spOpt{iLocal, eps(tep(1, fLocal))}, wantCluster: none, wantLocal: empty},
		{name: "independent/local falls back to terminating while cluster uses remote ready",
			opts: []spOpt{eLocal, nodePort, eps(tep(1, fServing|fTerminating|fLocal), tep(2, fReady))}, wantCluster: []string{"10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "independent/both fall back to terminating",
			opts: []spOpt{eLocal, nodePort, eps(tep(1, fServing|fTerminating|fLocal), tep(2, fServing|fTerminating))}, wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: []string{"10.0.0.1"}},
		{name: "independent/local has none while cluster falls back",
			opts: []spOpt{iLocal, nodePort, eps(tep(2, fServing|fTerminating))}, wantCluster: []string{"10.0.0.2"}, wantLocal: empty},

		// Rule 5b: zone hints.
		{name: "zone/every ready endpoint hinted and one for this zone: filtered",
			zone: "z1", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1")), tep(2, fReady, zoneHint("z2")), tep(3, fReady, zoneHint("z1")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.3"}, wantLocal: none},
		{name: "zone/one ready endpoint without hint: all kept",
			zone: "z1", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1")), tep(2, fReady))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "zone/no endpoint hinted for this zone: all kept",
			zone: "z3", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1")), tep(2, fReady, zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "zone/node without zone label: all kept",
			zone: "", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1")), tep(2, fReady, zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "zone/not-ready endpoint without hint does not disable hints",
			zone: "z1", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1")), tep(2, 0), tep(3, fReady, zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "zone/endpoint hinted for several zones",
			zone: "z2", opts: []spOpt{eps(tep(1, fReady, zoneHint("z1", "z2")), tep(2, fReady, zoneHint("z1")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "zone/hints never filter the local set",
			zone: "z1", opts: []spOpt{eLocal, nodePort, eps(tep(1, fReady, zoneHint("z1")), tep(2, fReady|fLocal, zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: []string{"10.0.0.2"}},
		{name: "zone/no ready endpoint: fallback to terminating ignores hints",
			zone: "z1", opts: []spOpt{eps(tep(1, fServing|fTerminating, zoneHint("z2")), tep(2, fServing|fTerminating, zoneHint("z1")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},

		// Rule 5a: node hints.
		{name: "node/every ready endpoint node-hinted and one for this node: same node",
			node: "me", zone: "z1", opts: []spOpt{eps(tep(1, fReady, nodeHint("me"), zoneHint("z1")), tep(2, fReady, nodeHint("other"), zoneHint("z1")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "node/some endpoint lacks node hint: falls to zone hints",
			node: "me", zone: "z1", opts: []spOpt{eps(tep(1, fReady, nodeHint("me"), zoneHint("z1")), tep(2, fReady, zoneHint("z1")), tep(3, fReady, zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "node/no endpoint hinted for this node: falls to zone hints",
			node: "me", zone: "z1", opts: []spOpt{eps(tep(1, fReady, nodeHint("a"), zoneHint("z1")), tep(2, fReady, nodeHint("b"), zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "node/no node and no zone match: all kept",
			node: "me", zone: "z9", opts: []spOpt{eps(tep(1, fReady, nodeHint("a"), zoneHint("z1")), tep(2, fReady, nodeHint("b"), zoneHint("z2")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "node/empty node name never matches",
			node: "", zone: "", opts: []spOpt{eps(tep(1, fReady, nodeHint("")), tep(2, fReady, nodeHint("b")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},

		// Rule 5, hints derived from trafficDistribution.
		{name: "distribution/PreferClose without hints uses endpoint zones",
			zone: "z1", opts: []spOpt{dist(DistributionPreferClose), eps(tep(1, fReady, inZone("z1")), tep(2, fReady, inZone("z2")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "distribution/PreferSameZone without hints uses endpoint zones",
			zone: "z2", opts: []spOpt{dist(DistributionPreferSameZone), eps(tep(1, fReady, inZone("z1")), tep(2, fReady, inZone("z2")))},
			wantCluster: []string{"10.0.0.2"}, wantLocal: none},
		{name: "distribution/PreferSameNode without hints prefers this node",
			node: "me", zone: "z1", opts: []spOpt{dist(DistributionPreferSameNode), eps(tep(1, fReady, inZone("z1")), tep(2, fReady|fLocal, inZone("z2")), tep(3, fReady, inZone("z1")))},
			wantCluster: []string{"10.0.0.2"}, wantLocal: none},
		{name: "distribution/PreferSameNode with no endpoint here falls back to zone",
			node: "me", zone: "z1", opts: []spOpt{dist(DistributionPreferSameNode), eps(tep(1, fReady, inZone("z1")), tep(2, fReady, inZone("z2")))},
			wantCluster: []string{"10.0.0.1"}, wantLocal: none},
		{name: "distribution/endpoint without zone disables the filter",
			zone: "z1", opts: []spOpt{dist(DistributionPreferClose), eps(tep(1, fReady, inZone("z1")), tep(2, fReady))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "distribution/unset: zones alone never filter",
			zone: "z1", opts: []spOpt{eps(tep(1, fReady, inZone("z1")), tep(2, fReady, inZone("z2")))},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantLocal: none},
		{name: "distribution/explicit hints win over derived ones",
			zone: "z1", opts: []spOpt{dist(DistributionPreferClose), eps(tep(1, fReady, inZone("z1"), zoneHint("z2")), tep(2, fReady, inZone("z2"), zoneHint("z1")))},
			wantCluster: []string{"10.0.0.2"}, wantLocal: none},
		{name: "distribution/PreferSameNode node match ignores node name of other nodes",
			node: "me", zone: "", opts: []spOpt{dist(DistributionPreferSameNode), eps(tep(1, fReady, onNode("x")), tep(2, fReady|fLocal), tep(3, fReady|fLocal))},
			wantCluster: []string{"10.0.0.2", "10.0.0.3"}, wantLocal: none},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sp := &ServicePort{Name: ServicePortName{ServiceName: svcName("ns", "s"), Protocol: TCP}, Protocol: TCP, Port: 80,
				Type: TypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}}
			for _, o := range tc.opts {
				o(sp)
			}
			if strings.HasPrefix(tc.name, "distribution/") {
				// Kubernetes mode: slices without hints are followed as
				// they are, so every ready endpoint is used.
				kube, _ := CategorizeEndpoints(sp, tc.node, tc.zone)
				var ready []string
				for _, e := range sp.Endpoints {
					if e.Ready {
						ready = append(ready, e.IP.String())
					}
				}
				if got := addrs(kube); !slices.Equal(got, ready) && !slices.ContainsFunc(sp.Endpoints, func(e Endpoint) bool { return len(e.ZoneHints()) > 0 }) {
					t.Errorf("without derived hints: cluster = %v, want every ready endpoint %v", got, ready)
				}
				// Standalone: hints derived as the EndpointSlice controller would.
				for i := range sp.Endpoints {
					DeriveHints(&sp.Endpoints[i], sp.TrafficDistribution)
				}
			}
			before := slices.Clone(sp.Endpoints)
			cluster, local := CategorizeEndpoints(sp, tc.node, tc.zone)
			if got := addrs(cluster); !equalNil(got, tc.wantCluster) {
				t.Errorf("cluster = %#v, want %#v", got, tc.wantCluster)
			}
			if got := addrs(local); !equalNil(got, tc.wantLocal) {
				t.Errorf("local = %#v, want %#v", got, tc.wantLocal)
			}
			if !slices.EqualFunc(before, sp.Endpoints, func(a, b Endpoint) bool { return a.String() == b.String() && a.Ready == b.Ready }) {
				t.Errorf("CategorizeEndpoints modified its input")
			}
			// The result must pass validation when stored back.
			sp.ClusterEndpoints, sp.LocalEndpoints = cluster, local
			if err := sp.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			// HasUsableEndpoints agrees with the rules.
			want := false
			for _, e := range sp.Endpoints {
				want = want || e.Ready || (e.Serving && e.Terminating)
			}
			if sp.HasUsableEndpoints() != want {
				t.Errorf("HasUsableEndpoints = %v, want %v", !want, want)
			}
		})
	}
	if len(tests) < 30 {
		t.Errorf("only %d cases", len(tests))
	}
}

// equalNil compares like slices.Equal but also tells nil from empty.
func equalNil(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}
