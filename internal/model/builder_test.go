package model

import (
	"fmt"
	"github.com/vipproxy/vipproxy/internal/cpustat"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
)

// cloneSnapshot copies snap's top-level slices, so a step can replace
// elements without touching snapshots already built (the Source contract).
func cloneSnapshot(snap *Snapshot) *Snapshot {
	return &Snapshot{Services: slices.Clone(snap.Services), Slices: slices.Clone(snap.Slices),
		Node: snap.Node, Problems: slices.Clone(snap.Problems)}
}

// deepCopySlice copies sl with fresh backing arrays everywhere.
func deepCopySlice(in *EndpointSlice) *EndpointSlice {
	sl := *in
	sl.Ports = slices.Clone(sl.Ports)
	sl.Endpoints = slices.Clone(sl.Endpoints)
	return &sl
}

// deepCopyService copies svc with fresh backing arrays everywhere.
func deepCopyService(in *Service) *Service {
	svc := *in
	svc.ClusterIPs = slices.Clone(svc.ClusterIPs)
	svc.IPFamilies = slices.Clone(svc.IPFamilies)
	svc.ExternalIPs = slices.Clone(svc.ExternalIPs)
	svc.LoadBalancerIPs = slices.Clone(svc.LoadBalancerIPs)
	svc.LoadBalancerSourceRanges = slices.Clone(svc.LoadBalancerSourceRanges)
	svc.Ports = slices.Clone(svc.Ports)
	return &svc
}

// builderSteps are the changes TestBuilderMatchesBuild applies, each to a
// copy of the previous snapshot.
var builderSteps = []struct {
	name  string
	apply func(r *rand.Rand, s *Snapshot)
}{
	{"flip readiness", func(r *rand.Rand, s *Snapshot) {
		if len(s.Slices) == 0 {
			return
		}
		i := r.IntN(len(s.Slices))
		sl := deepCopySlice(s.Slices[i])
		if len(sl.Endpoints) > 0 {
			e := &sl.Endpoints[r.IntN(len(sl.Endpoints))]
			e.Ready, e.Serving = !e.Ready, !e.Serving
		}
		s.Slices[i] = sl
	}},
	{"change port", func(r *rand.Rand, s *Snapshot) {
		if len(s.Services) == 0 {
			return
		}
		i := r.IntN(len(s.Services))
		svc := deepCopyService(s.Services[i])
		if len(svc.Ports) > 0 {
			svc.Ports[0].Port = uint16(1 + r.IntN(3))
		}
		s.Services[i] = svc
	}},
	{"delete Service", func(r *rand.Rand, s *Snapshot) {
		if len(s.Services) > 0 {
			s.Services = slices.Delete(s.Services, 0, 1)
		}
	}},
	{"add Service", func(r *rand.Rand, s *Snapshot) {
		svc := webService()
		svc.Name = fmt.Sprintf("new-%d", r.IntN(3))
		s.Services = append(s.Services, &svc)
	}},
	{"duplicate Service", func(r *rand.Rand, s *Snapshot) {
		if len(s.Services) > 0 {
			svc := deepCopyService(s.Services[r.IntN(len(s.Services))])
			svc.AffinityTimeoutSeconds = 60
			s.Services = append([]*Service{svc}, s.Services...)
		}
	}},
	{"add slice", func(r *rand.Rand, s *Snapshot) {
		if len(s.Services) == 0 {
			return
		}
		svc := s.Services[r.IntN(len(s.Services))]
		sl := webSlice(fmt.Sprintf("%s-%d", svc.Name, r.IntN(4)), ready("10.9.0.1", "node-1"), notReady("10.9.0.2", "node-2"))
		sl.Service = svc.ServiceName
		s.Slices = append(s.Slices, &sl)
	}},
	{"delete slice", func(r *rand.Rand, s *Snapshot) {
		if len(s.Slices) > 0 {
			i := r.IntN(len(s.Slices))
			s.Slices = slices.Delete(s.Slices, i, i+1)
		}
	}},
	{"rename slice", func(r *rand.Rand, s *Snapshot) {
		if len(s.Slices) > 0 {
			i := r.IntN(len(s.Slices))
			sl := *s.Slices[i] // objects are shared between Snapshots: replace, never edit
			sl.Name = "a-" + sl.Name
			s.Slices[i] = &sl
		}
	}},
	{"shuffle", func(r *rand.Rand, s *Snapshot) {
		r.Shuffle(len(s.Services), func(i, j int) { s.Services[i], s.Services[j] = s.Services[j], s.Services[i] })
		r.Shuffle(len(s.Slices), func(i, j int) { s.Slices[i], s.Slices[j] = s.Slices[j], s.Slices[i] })
	}},
	{"fresh arrays", func(r *rand.Rand, s *Snapshot) {
		for i := range s.Services {
			s.Services[i] = deepCopyService(s.Services[i])
		}
		for i := range s.Slices {
			s.Slices[i] = deepCopySlice(s.Slices[i])
		}
	}},
	{"node zone", func(r *rand.Rand, s *Snapshot) {
		s.Node = &Node{Name: s.Node.Name, Labels: map[string]string{LabelTopologyZone: fmt.Sprintf("z%d", r.IntN(2))}}
	}},
	{"node name", func(r *rand.Rand, s *Snapshot) {
		s.Node = &Node{Name: fmt.Sprintf("node-%d", r.IntN(3)), Labels: s.Node.Labels}
	}},
	{"source problem", func(r *rand.Rand, s *Snapshot) {
		s.Problems = append(s.Problems, Problem{Object: "Service x/y", Reason: "test"})
	}},
	{"nothing", func(r *rand.Rand, s *Snapshot) {}},
}

// keptState is a State as it was returned: its port pointers and their
// values.
type keptState struct {
	st    *State
	ports []*ServicePort
	deep  []ServicePort
}

func keepState(st *State) keptState {
	k := keptState{st: st, ports: slices.Clone(st.Ports)}
	for _, sp := range st.Ports {
		k.deep = append(k.deep, *sp)
	}
	return k
}

// checkKept fails t unless every State in history is as it was
// returned, whatever was built after it (a Builder shares a State's
// Ports with its own port list).
func checkKept(t *testing.T, history []keptState) {
	t.Helper()
	for k, h := range history {
		same := slices.Equal(h.st.Ports, h.ports)
		for i := 0; same && i < len(h.st.Ports); i++ {
			same = reflect.DeepEqual(*h.st.Ports[i], h.deep[i])
		}
		if !same {
			t.Fatalf("the State of Build %d of %d changed after it was returned", k+1, len(history))
		}
	}
}

// TestBuilderMatchesBuild applies random sequences of changes and checks
// that the incremental Builder returns exactly what a from-scratch Build
// returns after each one.
func TestBuilderMatchesBuild(t *testing.T) {
	patched := 0
	for seed := range uint64(20) {
		var c Builder
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 1))
			snap := genSnapshot(20, 4, 3)
			snap.Gen = 1
			var history []keptState
			for step := range 60 {
				st := builderSteps[r.IntN(len(builderSteps))]
				next := cloneSnapshot(snap)
				st.apply(r, next)
				next.Gen, next.Patch = snap.Gen+1, patchOf(r, snap, next)
				snap = next
				got := c.Build(snap, BuildOptions{})
				want := Build(snap, BuildOptions{})
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s, patch %v): Builder and Build differ", step, st.name, snap.Patch != nil)
				}
				history = append(history, keepState(got))
				checkKept(t, history)
			}
		})
		patched += c.patched
	}
	if patched == 0 {
		t.Error("no Build took the patch path")
	}
}

// TestBuilderPatches applies random in-place changes (as a source that
// edits objects where they are sends them, with a Patch) and checks that
// the Builder takes the patch path and still returns exactly what Build
// returns, Problems included.
func TestBuilderPatches(t *testing.T) {
	inPlace := []string{"flip readiness", "change port", "nothing", "node zone", "fresh arrays", "source problem"}
	steps := map[string]func(r *rand.Rand, s *Snapshot){}
	for _, st := range builderSteps {
		if slices.Contains(inPlace, st.name) {
			steps[st.name] = st.apply
		}
	}
	// A port the Service refuses (a Problem of that Service), and back.
	steps["bad port"] = func(r *rand.Rand, s *Snapshot) {
		i := r.IntN(len(s.Services))
		svc := deepCopyService(s.Services[i])
		svc.Ports[0].Port = uint16(r.IntN(2)) // 0 is refused
		s.Services[i] = svc
	}
	// An externalIP or LB IP that is another Service's ClusterIP (the
	// ClusterIP wins: a claims Problem and a copy of the port), one that is
	// nobody's, and none: the Builder's count of claiming ports goes up
	// and down to zero.
	steps["claim"] = func(r *rand.Rand, s *Snapshot) {
		i := r.IntN(len(s.Services))
		svc := deepCopyService(s.Services[i])
		other := s.Services[r.IntN(len(s.Services))].ClusterIPs[0]
		switch r.IntN(4) {
		case 0:
			svc.ExternalIPs = []netip.Addr{other}
		case 1:
			svc.LoadBalancerIPs = []netip.Addr{other, netip.MustParseAddr("192.0.2.7")}
		case 2:
			svc.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.8")}
		default:
			svc.ExternalIPs, svc.LoadBalancerIPs = nil, nil
		}
		s.Services[i] = svc
	}
	// Options State.Uses counts, on and off.
	steps["slow start, drain"] = func(r *rand.Rand, s *Snapshot) {
		i := r.IntN(len(s.Services))
		svc := deepCopyService(s.Services[i])
		svc.SlowStart = time.Duration(r.IntN(2)) * time.Minute
		svc.DrainReset = time.Duration(r.IntN(2)) * time.Second
		svc.OutlierEjection = []string{"", "on", "off"}[r.IntN(3)]
		s.Services[i] = svc
	}
	steps["unclaim all"] = func(r *rand.Rand, s *Snapshot) {
		for i, svc := range s.Services {
			if len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0 {
				cp := deepCopyService(svc)
				cp.ExternalIPs, cp.LoadBalancerIPs = nil, nil
				s.Services[i] = cp
			}
		}
	}
	names := slices.Sorted(maps.Keys(steps))
	patched, builds, claimed, used := 0, 0, 0, 0
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 2))
		snap := genSnapshot(30, 4, 3)
		snap.Gen = 1
		var c Builder
		history := []keptState{keepState(c.Build(snap, BuildOptions{}))}
		for step := range 80 {
			name := names[r.IntN(len(names))]
			next := cloneSnapshot(snap)
			steps[name](r, next)
			next.Gen, next.Patch = snap.Gen+1, patchOf(r, snap, next)
			if next.Patch == nil {
				t.Fatalf("seed %d step %d (%s): no patch for an in-place change", seed, step, name)
			}
			snap = next
			before := c.patched
			got := c.Build(snap, BuildOptions{})
			builds++
			if c.patched > before {
				patched++
			}
			if want := Build(snap, BuildOptions{}); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d (%s, patched %v): Builder and Build differ", seed, step, name, c.patched > before)
			}
			if got.Uses.Claims > 0 {
				claimed++
			}
			if got.Uses.SlowStart > 0 && got.Uses.DrainReset > 0 && got.Uses.OutlierEjection > 0 {
				used++
			}
			history = append(history, keepState(got))
			checkKept(t, history)
		}
	}
	if claimed == 0 {
		t.Error("no Build had a port claiming an address")
	}
	if used == 0 {
		t.Error("no Build had ports with slow start, drain and outlier ejection")
	}
	// Only a zone change (every Service depends on it) takes the full path.
	if patched < builds*3/4 {
		t.Errorf("%d of %d Builds patched, want at least three quarters", patched, builds)
	}
}

// patchOf returns the Patch that makes next from base when next keeps
// base's layout (as a source that replaced objects in place would send),
// else nil. It names every replaced object and, at random, some that are
// equal.
func patchOf(r *rand.Rand, base, next *Snapshot) *Patch {
	if len(base.Services) != len(next.Services) || len(base.Slices) != len(next.Slices) {
		return nil
	}
	p := &Patch{Base: base.Gen}
	for i := range next.Services {
		a, b := base.Services[i], next.Services[i]
		if a.ServiceName != b.ServiceName || (i > 0 && compareServiceName(next.Services[i-1].ServiceName, b.ServiceName) >= 0) {
			return nil
		}
		if !ServiceEqual(a, b) || r.IntN(10) == 0 {
			p.Services = append(p.Services, i)
		}
	}
	for i := range next.Slices {
		a, b := base.Slices[i], next.Slices[i]
		if a.Name != b.Name || a.Service != b.Service {
			return nil
		}
		if !EndpointSliceEqual(a, b) || r.IntN(10) == 0 {
			p.Slices = append(p.Slices, i)
		}
	}
	return p
}

// TestBuilderReuses checks that one changed Service leaves every other
// Service's ServicePorts the same pointers as in the previous State.
func TestBuilderReuses(t *testing.T) {
	snap := genSnapshot(50, 4, 3)
	var c Builder
	first := c.Build(snap, BuildOptions{})
	next := cloneSnapshot(snap)
	sl := deepCopySlice(next.Slices[10]) // a slice of svc-00005
	sl.Endpoints[0].Ready = !sl.Endpoints[0].Ready
	next.Slices[10] = sl
	second := c.Build(next, BuildOptions{})
	if len(first.Ports) != len(second.Ports) {
		t.Fatalf("%d ports, then %d", len(first.Ports), len(second.Ports))
	}
	for i := range first.Ports {
		changed := first.Ports[i].Name.Name == next.Slices[10].Service.Name
		if same := first.Ports[i] == second.Ports[i]; same == changed {
			t.Errorf("port %s: reused=%v, want %v", first.Ports[i].Name, same, !changed)
		}
	}
}

// perturb changes one field of v (a settable struct field or
// element) so that it differs from before.
func perturb(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint16, reflect.Uint8, reflect.Uint32:
		v.SetUint(v.Uint() + 1)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
	case reflect.Pointer:
		// A fresh copy with its first field perturbed, so that a
		// comparison by pointer alone is caught too.
		p := reflect.New(v.Type().Elem())
		if !v.IsNil() {
			p.Elem().Set(v.Elem())
		}
		perturb(t, p.Elem().Field(0))
		v.Set(p)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("perturbed"), reflect.ValueOf("x"))
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(netip.Addr{}) {
			v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.99")))
			return
		}
		if v.Type() == reflect.TypeOf(Loc{}) {
			l := v.Interface().(Loc).Locality()
			v.Set(reflect.ValueOf(At(l.NodeName+"x", l.Zone)))
			return
		}
		perturb(t, v.Field(0))
	default:
		t.Fatalf("cannot perturb a %s", v.Type())
	}
}

// fullPort returns a ServicePort with every field set, for
// TestEqualCoversEveryField.
func fullPort() *ServicePort {
	ep := Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Port: 8080, Ready: true, Serving: true,
		Loc: At("n1", "z").WithHints([]string{"z"}, []string{"n1"}), Local: true}
	return &ServicePort{
		Name: ServicePortName{ServiceName: ServiceName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: TCP},
		Type: TypeLoadBalancer, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 80, Protocol: TCP, NodePort: 30080,
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AffinityTimeoutSeconds: 10,
		InternalTrafficPolicy: PolicyCluster, ExternalTrafficPolicy: PolicyLocal, HealthCheckNodePort: 30999, TrafficDistribution: "PreferClose",
		Endpoints: []Endpoint{ep}, ClusterEndpoints: []Endpoint{ep}, LocalEndpoints: []Endpoint{ep},
	}
}

// TestEqualCoversEveryField changes each field of Service, EndpointSlice,
// SliceEndpoint, ServicePort, Endpoint and Node in turn and checks that
// the equality functions the Builder, the dataplanes and the sources
// trust notice it; a new field they ignore fails here.
func TestEqualCoversEveryField(t *testing.T) {
	svc := webService()
	sl := webSlice("web-1", ready("10.0.0.1", "n1"))
	ep := ready("10.0.0.1", "n1")
	tests := []struct {
		name  string
		base  any
		equal func(a, b any) bool
	}{
		{"Service", svc, func(a, b any) bool { x, y := a.(Service), b.(Service); return ServiceEqual(&x, &y) }},
		{"EndpointSlice", sl, func(a, b any) bool { x, y := a.(EndpointSlice), b.(EndpointSlice); return EndpointSliceEqual(&x, &y) }},
		{"SliceEndpoint", ep, func(a, b any) bool { x, y := a.(SliceEndpoint), b.(SliceEndpoint); return sliceEndpointEqual(&x, &y) }},
		{"ServicePort", *fullPort(), func(a, b any) bool { x, y := a.(ServicePort), b.(ServicePort); return x.Equal(&y) }},
		{"Endpoint", fullPort().Endpoints[0], func(a, b any) bool { x, y := a.(Endpoint), b.(Endpoint); return x.Equal(&y) }},
		{"Node", Node{Name: "n1", Labels: map[string]string{"zone": "a"}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}, func(a, b any) bool { x, y := a.(Node), b.(Node); return NodeEqual(&x, &y) }},
	}
	for _, tc := range tests {
		typ := reflect.TypeOf(tc.base)
		if !tc.equal(tc.base, tc.base) {
			t.Errorf("%s: not equal to itself", tc.name)
		}
		for i := range typ.NumField() {
			t.Run(tc.name+"."+typ.Field(i).Name, func(t *testing.T) {
				changed := reflect.New(typ).Elem()
				changed.Set(reflect.ValueOf(tc.base))
				perturb(t, changed.Field(i))
				if tc.equal(tc.base, changed.Interface()) {
					t.Errorf("a change of %s.%s is not noticed", tc.name, typ.Field(i).Name)
				}
			})
		}
	}
}

// FuzzBuilder: after building snapshot A, building B (which mixes A's
// Services and slices, sharing their arrays, with another snapshot's)
// gives exactly Build(B).
func FuzzBuilder(f *testing.F) {
	f.Add([]byte{}, []byte{}, []byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, []byte("another seed walking branches"), []byte{1, 0, 1, 1, 0})
	f.Fuzz(func(t *testing.T, da, db, mix []byte) {
		a, other := fuzzSnapshot(da), fuzzSnapshot(db)
		pick := &byteSource{mix}
		b := &Snapshot{Node: a.Node}
		if pick.bool() {
			b.Node = other.Node
		}
		for _, from := range [][]*Service{a.Services, other.Services} {
			for _, s := range from {
				if pick.bool() {
					b.Services = append(b.Services, s)
				}
			}
		}
		for _, from := range [][]*EndpointSlice{a.Slices, other.Slices} {
			for _, s := range from {
				if pick.bool() {
					b.Slices = append(b.Slices, s)
				}
			}
		}
		var c Builder
		c.Build(a, BuildOptions{})
		if got, want := c.Build(b, BuildOptions{}), Build(b, BuildOptions{}); !reflect.DeepEqual(got, want) {
			t.Fatalf("Builder and Build differ")
		}
		if got, want := c.Build(a, BuildOptions{}), Build(a, BuildOptions{}); !reflect.DeepEqual(got, want) {
			t.Fatalf("Builder and Build differ after going back")
		}
	})
}

// BenchmarkBuilderOneChange: one Service's slice changes between two
// Builds at 10,000 Services (the reconcile loop's per-change cost), with
// unchanged objects sharing arrays (as the Kubernetes source hands them
// over) or copied afresh (compared element by element); and with a
// Patch (as the manifests source sends one) at 10,000 and 50,000.
func BenchmarkBuilderOneChange(b *testing.B) {
	for _, run := range []struct {
		n    int
		mode string
	}{{10000, "fresh=false"}, {10000, "fresh=true"}, {10000, "patch"}, {50000, "patch"}} {
		services, mode := run.n, run.mode
		fresh, patch := mode == "fresh=true", mode == "patch"
		b.Run(fmt.Sprintf("services=%d/%s", services, mode), func(b *testing.B) {
			base := genSnapshot(services, 10, 5)
			snaps := [2]*Snapshot{base, cloneSnapshot(base)}
			for i := range snaps[1].Slices {
				if fresh || i == 777 {
					snaps[1].Slices[i] = deepCopySlice(snaps[1].Slices[i])
				}
			}
			if fresh {
				for i := range snaps[1].Services {
					snaps[1].Services[i] = deepCopyService(snaps[1].Services[i])
				}
			}
			snaps[1].Slices[777].Endpoints[0].Ready = false
			var c Builder
			snaps[0].Gen = 1
			c.Build(snaps[0], BuildOptions{NodeName: "node-1"})
			b.ReportAllocs()
			cpu0 := cpustat.Process()
			n := 0
			for b.Loop() {
				n++
				s := snaps[n%2]
				if patch {
					// Each is the other with slice 777 replaced.
					s.Gen, s.Patch = uint64(n+1), &Patch{Base: uint64(n), Slices: []int{777}}
				}
				st := c.Build(s, BuildOptions{NodeName: "node-1"})
				if len(st.Ports) != services {
					b.Fatalf("%d ports", len(st.Ports))
				}
			}
			b.ReportMetric(float64(cpustat.Process()-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
			if patch && c.patched < b.N {
				b.Fatalf("%d of %d Builds patched", c.patched, b.N)
			}
		})
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkRetainedHeap10000 reports the heap a State of 10,000 Services
// of 10 endpoints retains beyond its Snapshot, and what a Builder keeps
// on top of that to make the next Build incremental. It measures once per
// run; b.N only repeats it.
func BenchmarkRetainedHeap10000(b *testing.B) {
	snap := genSnapshot(10000, 10, 5)
	var stateMiB, builderMiB float64
	for b.Loop() {
		h0 := heapAlloc()
		st := Build(snap, BuildOptions{NodeName: "node-1"})
		h1 := heapAlloc()
		c := new(Builder)
		st2 := c.Build(snap, BuildOptions{NodeName: "node-1"})
		h2 := heapAlloc()
		if len(st.Ports) != 10000 || len(st2.Ports) != 10000 {
			b.Fatalf("%d, %d ports", len(st.Ports), len(st2.Ports))
		}
		runtime.KeepAlive(st)
		runtime.KeepAlive(st2)
		runtime.KeepAlive(c)
		stateMiB, builderMiB = float64(h1-h0)/(1<<20), float64(h2-h1)/(1<<20)-stateMiB
	}
	b.ReportMetric(stateMiB, "state-MiB")
	b.ReportMetric(builderMiB, "builder-MiB")
}

// BenchmarkBuilderFirst50000 is a Builder's first Build at 50,000
// Services × 10 endpoints: what a restart's first sync spends in the
// model (every Service built and remembered).
func BenchmarkBuilderFirst50000(b *testing.B) {
	snap := genSnapshot(50000, 10, 5)
	b.ReportAllocs()
	for b.Loop() {
		var c Builder
		if st := c.Build(snap, BuildOptions{NodeName: "node-1"}); len(st.Ports) != 50000 {
			b.Fatalf("%d ports", len(st.Ports))
		}
	}
}
