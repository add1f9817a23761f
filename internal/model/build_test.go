package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/cpustat"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func svcName(ns, n string) ServiceName { return ServiceName{Namespace: ns, Name: n} }

func ready(addr, node string) SliceEndpoint {
	return SliceEndpoint{Address: ip(addr), Ready: true, Serving: true, Loc: At(node, "")}
}

func notReady(addr, node string) SliceEndpoint {
	return SliceEndpoint{Address: ip(addr), Loc: At(node, "")}
}

// webService is a valid two-port Service (http/TCP 80, dns/UDP 53).
func webService() Service {
	return Service{
		ServiceName: svcName("default", "web"),
		Type:        TypeClusterIP,
		ClusterIPs:  []netip.Addr{ip("10.96.0.10")},
		Ports: []ServicePortSpec{
			{Name: "http", Protocol: TCP, Port: 80},
			{Name: "dns", Protocol: UDP, Port: 53},
		},
	}
}

func webSlice(name string, eps ...SliceEndpoint) EndpointSlice {
	return EndpointSlice{
		Name:        name,
		Service:     svcName("default", "web"),
		AddressType: IPv4,
		Ports:       []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}, {Name: "dns", Protocol: UDP, Port: 5353}},
		Endpoints:   eps,
	}
}

func findPort(st *State, name string) *ServicePort {
	for _, p := range st.Ports {
		if p.Name.String() == name {
			return p
		}
	}
	return nil
}

func epStrings(eps []Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		s := e.String()
		if !e.Ready {
			s += "(notready)"
		}
		out = append(out, s)
	}
	return out
}

func hasProblem(st *State, object, field string) bool {
	for _, p := range st.Problems {
		if p.Object == object && p.Field == field {
			return true
		}
	}
	return false
}

func TestBuildMergeAndDedupe(t *testing.T) {
	tests := []struct {
		name   string
		slices []EndpointSlice
		want   []string // endpoints of default/web:http/TCP
	}{
		{
			name:   "one slice, sorted by address",
			slices: []EndpointSlice{webSlice("a", ready("10.0.0.3", "n1"), ready("10.0.0.1", "n1"), ready("10.0.0.20", "n1"))},
			want:   []string{"10.0.0.1:8080", "10.0.0.3:8080", "10.0.0.20:8080"},
		},
		{
			name: "two slices merged",
			slices: []EndpointSlice{
				webSlice("b", ready("10.0.0.2", "n1")),
				webSlice("a", ready("10.0.0.1", "n1")),
			},
			want: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
		},
		{
			name: "same address in two slices once",
			slices: []EndpointSlice{
				webSlice("a", ready("10.0.0.1", "n1")),
				webSlice("b", ready("10.0.0.1", "n1"), ready("10.0.0.2", "n1")),
			},
			want: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
		},
		{
			name:   "same address twice in one slice once",
			slices: []EndpointSlice{webSlice("a", ready("10.0.0.1", "n1"), ready("10.0.0.1", "n1"))},
			want:   []string{"10.0.0.1:8080"},
		},
		{
			name: "disagreeing duplicates: ready wins over not ready (not ready first)",
			slices: []EndpointSlice{
				webSlice("a", notReady("10.0.0.1", "n1")),
				webSlice("b", ready("10.0.0.1", "n1")),
			},
			want: []string{"10.0.0.1:8080"},
		},
		{
			name: "disagreeing duplicates: ready wins over not ready (ready first)",
			slices: []EndpointSlice{
				webSlice("a", ready("10.0.0.1", "n1")),
				webSlice("b", notReady("10.0.0.1", "n1")),
			},
			want: []string{"10.0.0.1:8080"},
		},
		{
			name: "same address different ports kept apart",
			slices: []EndpointSlice{
				webSlice("a", ready("10.0.0.1", "n1")),
				{Name: "b", Service: svcName("default", "web"), AddressType: IPv4,
					Ports:     []EndpointPort{{Name: "http", Protocol: TCP, Port: 9090}},
					Endpoints: []SliceEndpoint{ready("10.0.0.1", "n1")}},
			},
			want: []string{"10.0.0.1:8080", "10.0.0.1:9090"},
		},
		{
			name: "slice port of other protocol does not feed the port",
			slices: []EndpointSlice{
				{Name: "a", Service: svcName("default", "web"), AddressType: IPv4,
					Ports:     []EndpointPort{{Name: "http", Protocol: UDP, Port: 8080}},
					Endpoints: []SliceEndpoint{ready("10.0.0.1", "n1")}},
			},
			want: []string{},
		},
		{
			name: "slice port without number ignored",
			slices: []EndpointSlice{
				{Name: "a", Service: svcName("default", "web"), AddressType: IPv4,
					Ports:     []EndpointPort{{Name: "http", Protocol: TCP}},
					Endpoints: []SliceEndpoint{ready("10.0.0.1", "n1")}},
			},
			want: []string{},
		},
		{
			name:   "slice of another Service ignored",
			slices: []EndpointSlice{func() EndpointSlice { s := webSlice("a", ready("10.0.0.1", "n1")); s.Service.Name = "other"; return s }()},
			want:   []string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := Build(&Snapshot{Services: Ptrs([]Service{webService()}), Slices: Ptrs(tc.slices)}, BuildOptions{NodeName: "n1"})
			p := findPort(st, "default/web:http/TCP")
			if p == nil {
				t.Fatalf("port missing; problems %v", st.Problems)
			}
			if got := epStrings(p.Endpoints); !slices.Equal(got, tc.want) {
				t.Errorf("endpoints = %v, want %v", got, tc.want)
			}
			for _, e := range p.Endpoints {
				if e.IP == ip("10.0.0.1") && strings.Contains(tc.name, "disagreeing") && !e.Ready {
					t.Errorf("kept the not-ready copy of 10.0.0.1")
				}
			}
		})
	}
}

func TestBuildRefusedEndpoints(t *testing.T) {
	s := webSlice("s1",
		ready("10.0.0.1", "n1"),
		ready("127.0.0.1", "n1"),
		ready("169.254.1.1", "n1"),
		ready("0.0.0.0", "n1"),
		ready("224.0.0.5", "n1"),
		ready("fd00::1", "n1"), // wrong family for an IPv4 slice
		SliceEndpoint{Ready: true, Serving: true},
	)
	st := Build(&Snapshot{Services: Ptrs([]Service{webService()}), Slices: Ptrs([]EndpointSlice{s})}, BuildOptions{NodeName: "n1"})
	p := findPort(st, "default/web:http/TCP")
	if p == nil {
		t.Fatalf("port missing")
	}
	if got := epStrings(p.Endpoints); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("endpoints = %v", got)
	}
	for _, f := range []string{"endpoints[1].addresses[0]", "endpoints[2].addresses[0]", "endpoints[3].addresses[0]",
		"endpoints[4].addresses[0]", "endpoints[5].addresses[0]", "endpoints[6].addresses"} {
		if !hasProblem(st, "EndpointSlice default/s1", f) {
			t.Errorf("no problem for %s; got %v", f, st.Problems)
		}
	}
	// One problem per refused endpoint, not one per port.
	if n := len(st.Problems); n != 6 {
		t.Errorf("%d problems, want 6: %v", n, st.Problems)
	}
}

func TestBuildServices(t *testing.T) {
	bad := webService()
	bad.Name = "bad"
	bad.AffinityTimeoutSeconds = 100000
	badPort := webService()
	badPort.Name = "badport"
	badPort.Ports[1].NodePort = 30053 // type ClusterIP with a nodePort
	headless := webService()
	headless.Name = "headless"
	headless.Headless = true
	headless.ClusterIPs = nil
	extName := Service{ServiceName: svcName("default", "ext"), Type: TypeExternalName, Ports: []ServicePortSpec{{Port: 80, Protocol: TCP}}}
	noIP := webService()
	noIP.Name = "noip"
	noIP.ClusterIPs = nil
	dupPort := webService()
	dupPort.Name = "dupport"
	dupPort.Ports = append(dupPort.Ports, ServicePortSpec{Name: "http", Protocol: TCP, Port: 81})
	unnamed := Service{ServiceName: svcName("kube-system", "dns"), ClusterIPs: []netip.Addr{ip("10.96.0.53")},
		Ports: []ServicePortSpec{{Protocol: UDP, Port: 53}}}
	snap := &Snapshot{
		Services: Ptrs([]Service{bad, webService(), badPort, headless, extName, noIP, dupPort, unnamed}),
		Problems: []Problem{{Object: "file x.yaml document 1", Reason: "does not parse"}},
	}
	st := Build(snap, BuildOptions{NodeName: "n1"})
	var names []string
	for _, p := range st.Ports {
		names = append(names, p.Name.String())
	}
	want := []string{
		"default/badport:http/TCP",
		"default/dupport:dns/UDP",
		"default/dupport:http/TCP",
		"default/web:dns/UDP",
		"default/web:http/TCP",
		"kube-system/dns/UDP",
	}
	if !slices.Equal(names, want) {
		t.Errorf("ports = %v\nwant %v", names, want)
	}
	for _, pr := range []struct{ object, field string }{
		{"file x.yaml document 1", ""},
		{"Service default/bad", "spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
		{"Service default/badport", "spec.ports[1].nodePort"},
		{"Service default/noip", "spec.clusterIPs"},
		{"Service default/dupport", "spec.ports[2].name"},
	} {
		if !hasProblem(st, pr.object, pr.field) {
			t.Errorf("missing problem %s %s; got %v", pr.object, pr.field, st.Problems)
		}
	}
	if st.Problems[0].Object != "file x.yaml document 1" {
		t.Errorf("snapshot problems not first: %v", st.Problems)
	}
	// The affinity problem is reported once although both ports fail.
	n := 0
	for _, p := range st.Problems {
		if p.Object == "Service default/bad" {
			n++
		}
	}
	if n != 2 { // same field, but the reason names the port
		t.Errorf("bad Service: %d problems, want 2 (one per port): %v", n, st.Problems)
	}
	for _, p := range st.Ports {
		if err := p.Validate(); err != nil {
			t.Errorf("built port %s invalid: %v", p.Name, err)
		}
		if p.InternalTrafficPolicy != PolicyCluster || p.ExternalTrafficPolicy != PolicyCluster || p.Type != TypeClusterIP {
			t.Errorf("%s: defaults not applied: %q %q %q", p.Name, p.InternalTrafficPolicy, p.ExternalTrafficPolicy, p.Type)
		}
	}
}

func TestBuildLocalAndTopology(t *testing.T) {
	svc := webService()
	svc.InternalTrafficPolicy = PolicyLocal
	svc.TrafficDistribution = DistributionPreferClose
	mk := func(addr, node, zone string) SliceEndpoint {
		e := ready(addr, node)
		e.Loc = At(node, zone)
		return e
	}
	snap := &Snapshot{
		Services: Ptrs([]Service{svc}),
		Slices:   Ptrs([]EndpointSlice{webSlice("a", mk("10.0.0.1", "n1", "z1"), mk("10.0.0.2", "n2", "z2"))}),
		Node:     &Node{Name: "n1", Labels: map[string]string{LabelTopologyZone: "z1"}},
	}
	st := Build(snap, BuildOptions{}) // node name from snap.Node
	p := findPort(st, "default/web:http/TCP")
	if st.NodeName != "n1" {
		t.Errorf("NodeName = %q", st.NodeName)
	}
	if p.ClusterEndpoints != nil {
		t.Errorf("ClusterEndpoints = %v, want nil (internal Local, not external)", p.ClusterEndpoints)
	}
	if got := epStrings(p.LocalEndpoints); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("LocalEndpoints = %v", got)
	}
	svc.InternalTrafficPolicy = PolicyCluster
	snap.Services = Ptrs([]Service{svc})
	// Kubernetes mode: slices without hints are followed as they are (the
	// EndpointSlice controller removes hints on purpose): every endpoint.
	p = findPort(Build(snap, BuildOptions{}), "default/web:http/TCP")
	if got := epStrings(p.ClusterEndpoints); !slices.Equal(got, []string{"10.0.0.1:8080", "10.0.0.2:8080"}) {
		t.Errorf("ClusterEndpoints with PreferClose and no hints = %v, want both", got)
	}
	// Standalone: hints derived from trafficDistribution keep the zone.
	for _, build := range []func(*Snapshot, BuildOptions) *State{Build, new(Builder).Build} {
		p = findPort(build(snap, BuildOptions{DeriveHints: true}), "default/web:http/TCP")
		if got := epStrings(p.ClusterEndpoints); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
			t.Errorf("ClusterEndpoints with PreferClose in zone z1 and derived hints = %v", got)
		}
	}
	if len(snap.Slices[0].Endpoints[0].ZoneHints()) != 0 {
		t.Errorf("deriving hints wrote into the Snapshot")
	}
}

func TestBuildFamilies(t *testing.T) {
	svc := webService() // IPv4 only
	svc.ExternalIPs = []netip.Addr{ip("192.0.2.1"), ip("2001:db8::1")}
	svc.LoadBalancerIPs = []netip.Addr{ip("2001:db8::2"), ip("192.0.2.2")}
	v6 := webSlice("v6", ready("fd00::1", "n1"))
	v6.AddressType = IPv6
	st := Build(&Snapshot{Services: Ptrs([]Service{svc}), Slices: Ptrs([]EndpointSlice{webSlice("v4", ready("10.0.0.1", "n1")), v6})}, BuildOptions{})
	p := findPort(st, "default/web:http/TCP")
	if p == nil {
		t.Fatalf("port missing: %v", st.Problems)
	}
	if !slices.Equal(p.ExternalIPs, []netip.Addr{ip("192.0.2.1")}) || !slices.Equal(p.LoadBalancerIPs, []netip.Addr{ip("192.0.2.2")}) {
		t.Errorf("externalIPs %v lbIPs %v", p.ExternalIPs, p.LoadBalancerIPs)
	}
	if got := epStrings(p.Endpoints); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("endpoints = %v", got)
	}
	if !hasProblem(st, "Service default/web", "spec.externalIPs[1]") || !hasProblem(st, "EndpointSlice default/v6", "addressType") {
		t.Errorf("problems = %v", st.Problems)
	}

	// Dual stack: both families kept.
	svc.ClusterIPs = append(svc.ClusterIPs, ip("fd00:96::10"))
	st = Build(&Snapshot{Services: Ptrs([]Service{svc}), Slices: Ptrs([]EndpointSlice{webSlice("v4", ready("10.0.0.1", "n1")), v6})}, BuildOptions{})
	p = findPort(st, "default/web:http/TCP")
	if got := epStrings(p.Endpoints); !slices.Equal(got, []string{"10.0.0.1:8080", "[fd00::1]:8080"}) {
		t.Errorf("dual-stack endpoints = %v", got)
	}
	if len(p.ExternalIPs) != 2 || len(p.LoadBalancerIPs) != 2 {
		t.Errorf("dual-stack externalIPs %v lbIPs %v", p.ExternalIPs, p.LoadBalancerIPs)
	}
}

func TestBuildDeterministic(t *testing.T) {
	snap := genSnapshot(200, 10, 3)
	a := Build(snap, BuildOptions{NodeName: "node-1"})
	b := Build(snap, BuildOptions{NodeName: "node-1"})
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two builds of one snapshot differ")
	}
	// Shuffled Services and slices give the same Ports and Problems.
	shuf := *snap
	shuf.Services = slices.Clone(snap.Services)
	shuf.Slices = slices.Clone(snap.Slices)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(shuf.Services), func(i, j int) { shuf.Services[i], shuf.Services[j] = shuf.Services[j], shuf.Services[i] })
	r.Shuffle(len(shuf.Slices), func(i, j int) { shuf.Slices[i], shuf.Slices[j] = shuf.Slices[j], shuf.Slices[i] })
	c := Build(&shuf, BuildOptions{NodeName: "node-1"})
	if !reflect.DeepEqual(a, c) {
		t.Fatalf("build of shuffled snapshot differs")
	}
	if len(a.Ports) != 200 {
		t.Errorf("%d ports, want 200", len(a.Ports))
	}
	if len(a.Problems) == 0 {
		t.Errorf("generated snapshot should have problems (bad endpoints)")
	}
}

// genSnapshot makes n single-port UDP Services with eps endpoints each,
// spread over two slices and `nodes` nodes; every 50th Service also has a
// loopback endpoint (refused) and a duplicate across its slices.
func genSnapshot(n, eps, nodes int) *Snapshot {
	snap := &Snapshot{Node: &Node{Name: "node-1", Labels: map[string]string{LabelTopologyZone: "z1"}}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%05d", i)
		snap.Services = append(snap.Services, &Service{
			ServiceName: svcName("ns", name),
			Type:        TypeNodePort,
			ClusterIPs:  []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:       []ServicePortSpec{{Name: "p", Protocol: UDP, Port: 53, NodePort: uint16(30000 + i%2768)}},
		})
		for s := 0; s < 2; s++ {
			sl := EndpointSlice{Name: fmt.Sprintf("%s-%d", name, s), Service: svcName("ns", name), AddressType: IPv4,
				Ports: []EndpointPort{{Name: "p", Protocol: UDP, Port: 5353}}}
			for e := s; e < eps; e += 2 {
				se := ready(netip.AddrFrom4([4]byte{10, byte(1 + e), byte(i >> 8), byte(i)}).String(), fmt.Sprintf("node-%d", e%nodes))
				se.Loc = At(se.NodeName(), fmt.Sprintf("z%d", e%2))
				sl.Endpoints = append(sl.Endpoints, se)
			}
			if i%50 == 0 {
				sl.Endpoints = append(sl.Endpoints, ready("127.0.0.1", "node-1"), ready("10.200.0.1", "node-1"))
			}
			snap.Slices = append(snap.Slices, &sl)
		}
	}
	return snap
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		snap := genSnapshot(n, 10, 5)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpustat.Process()
			for b.Loop() {
				st := Build(snap, BuildOptions{NodeName: "node-1"})
				if len(st.Ports) != n {
					b.Fatalf("%d ports", len(st.Ports))
				}
			}
			// CPU time (GC included) per Build: stable on a loaded machine.
			b.ReportMetric(float64(cpustat.Process()-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
		})
	}
}

// TestBuildBalance: a Service's Balance and its slices' weights reach
// its ports and endpoints; an algorithm the dataplane does not implement
// (BuildOptions.Balances) falls back to the default with a Problem naming
// the annotation, and the Service is still built.
func TestBuildBalance(t *testing.T) {
	field := "metadata.annotations[" + AnnotationBalance + "]"
	tests := []struct {
		name        string
		balances    []Balance
		ask         Balance
		want        Balance
		wantProblem bool
	}{
		{"every algorithm (nil)", nil, BalanceConsistentHash, BalanceConsistentHash, false},
		{"supported", []Balance{BalanceRandom, BalanceRoundRobin}, BalanceRoundRobin, BalanceRoundRobin, false},
		{"not supported", []Balance{BalanceRandom}, BalanceConsistentHash, BalanceDefault, true},
		{"none supported", []Balance{}, BalanceRandom, BalanceDefault, true},
		{"default always allowed", []Balance{}, BalanceDefault, BalanceDefault, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := webService()
			svc.Balance = tc.ask
			heavy := ready("10.1.0.2", "n2")
			heavy.Weight = 5
			snap := &Snapshot{
				Services: Ptrs([]Service{svc}),
				Slices:   Ptrs([]EndpointSlice{webSlice("a", ready("10.1.0.1", "n1")), webSlice("b", heavy)}),
			}
			st := Build(snap, BuildOptions{NodeName: "n1", Balances: tc.balances})
			sp := findPort(st, "default/web:http/TCP")
			if sp == nil {
				t.Fatal("port not built")
			}
			if sp.Balance != tc.want {
				t.Errorf("Balance = %q, want %q", sp.Balance, tc.want)
			}
			if got := hasProblem(st, "Service default/web", field); got != tc.wantProblem {
				t.Errorf("problem on %s = %v, want %v (problems %v)", field, got, tc.wantProblem, st.Problems)
			}
			var weights []int
			for _, e := range sp.ClusterEndpoints {
				weights = append(weights, e.W())
			}
			if !slices.Equal(weights, []int{1, 5}) {
				t.Errorf("endpoint weights %v, want [1 5]", weights)
			}
		})
	}
}

// TestBuildQuietFlows: with BuildOptions.QuietFlows every port is quiet
// but the TCP ports with ejection (whose events vipproxy reads), which are
// sampled; without it none is either. The Builder rebuilds every Service
// when it changes.
func TestBuildQuietFlows(t *testing.T) {
	tests := []struct {
		name           string
		quiet          bool
		ejection       string
		wantTCP, wantU bool
		wantSampled    bool // the TCP port's
	}{
		{"off", false, "on", false, false, false},
		{"ejection on: TCP sampled, UDP quiet", true, "on", false, true, true},
		{"ejection off: both quiet", true, "off", true, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := webService()
			svc.OutlierEjection = tc.ejection
			snap := &Snapshot{Services: Ptrs([]Service{svc}), Slices: Ptrs([]EndpointSlice{webSlice("a", ready("10.1.0.1", "n1"))})}
			st := Build(snap, BuildOptions{NodeName: "n1", QuietFlows: tc.quiet})
			tcp, udp := findPort(st, "default/web:http/TCP"), findPort(st, "default/web:dns/UDP")
			if tcp == nil || udp == nil {
				t.Fatal("ports not built")
			}
			if tcp.QuietFlows != tc.wantTCP || udp.QuietFlows != tc.wantU {
				t.Errorf("QuietFlows TCP %v UDP %v, want %v %v", tcp.QuietFlows, udp.QuietFlows, tc.wantTCP, tc.wantU)
			}
			if tcp.SampledFlows != tc.wantSampled || udp.SampledFlows {
				t.Errorf("SampledFlows TCP %v UDP %v, want %v false", tcp.SampledFlows, udp.SampledFlows, tc.wantSampled)
			}
		})
	}
	var b Builder
	svc := webService()
	snap := &Snapshot{Services: Ptrs([]Service{svc}), Slices: Ptrs([]EndpointSlice{webSlice("a", ready("10.1.0.1", "n1"))})}
	if findPort(b.Build(snap, BuildOptions{NodeName: "n1"}), "default/web:http/TCP").QuietFlows {
		t.Error("quiet without QuietFlows")
	}
	if !findPort(b.Build(snap, BuildOptions{NodeName: "n1", QuietFlows: true}), "default/web:http/TCP").QuietFlows {
		t.Error("the Builder kept the port built without QuietFlows")
	}
}

// TestBuildParallel checks that a Build of enough Services to spread them
// over the CPUs gives what building them one by one gives: the ports, and
// the problems in the same order (duplicates and refused endpoints among
// them), with Build and with a Builder, on its first Build and on one
// whose cache holds most Services.
func TestBuildParallel(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // parallel on any machine
	snap := genSnapshot(3*parallelBuildFrom+5, 4, 3)
	for i := range 5 {
		d := *snap.Services[i*101]
		d.Type = TypeClusterIP
		snap.Services = append(snap.Services, &d) // a duplicate: the first one is used
	}
	next := *snap
	next.Gen++
	next.Services = slices.Clone(snap.Services)
	for i := 0; i < len(next.Services); i += 613 {
		s := *next.Services[i]
		s.Ports = []ServicePortSpec{{Name: "p", Protocol: UDP, Port: 54, NodePort: s.Ports[0].NodePort}}
		next.Services[i] = &s
	}
	opts := BuildOptions{NodeName: "node-1"}
	build := func(parallel bool) []*State {
		defer func(n int) { parallelBuildFrom = n }(parallelBuildFrom)
		if !parallel {
			parallelBuildFrom = 1 << 30
		}
		var c Builder
		return []*State{Build(snap, opts), c.Build(snap, opts), c.Build(&next, opts)}
	}
	par, ser := build(true), build(false)
	for i := range par {
		if !reflect.DeepEqual(par[i].Ports, ser[i].Ports) {
			t.Errorf("build %d: ports differ from a one-by-one build", i)
		}
		if diff := cmp.Diff(ser[i].Problems, par[i].Problems); diff != "" {
			t.Errorf("build %d: problems differ (-one by one +parallel):\n%s", i, diff)
		}
		has := func(reason string) bool {
			return slices.ContainsFunc(par[i].Problems, func(p Problem) bool { return strings.Contains(p.Reason, reason) })
		}
		dup, refused := has("duplicate Service"), has("refused")
		if len(par[i].Ports) < 3*parallelBuildFrom || !dup || !refused {
			t.Errorf("build %d: %d ports, duplicate reported %t, refused endpoints reported %t: not the State meant",
				i, len(par[i].Ports), dup, refused)
		}
	}
}
