package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

var (
	v4CIDR = netip.MustParsePrefix("10.96.0.0/24")
	v6CIDR = netip.MustParsePrefix("fd00:10:96::/112")
)

func openBoltT(t *testing.T, path string) *BoltStore {
	t.Helper()
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newAssignerT(t *testing.T, store Store, cidrs ...netip.Prefix) *Assigner {
	t.Helper()
	if len(cidrs) == 0 {
		cidrs = []netip.Prefix{v4CIDR}
	}
	a, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: cidrs, StaticSubrange: true, Rand: seeded(11)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func svcName(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} }

func clusterIPSvc(ns, name string, ips ...string) model.Service {
	s := model.Service{ServiceName: svcName(ns, name), Type: model.TypeClusterIP,
		Ports: []model.ServicePortSpec{{Name: "http", Protocol: model.TCP, Port: 80}}}
	for _, ip := range ips {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(ip))
	}
	return s
}

func nodePortSvc(ns, name string, nodePorts ...uint16) model.Service {
	s := model.Service{ServiceName: svcName(ns, name), Type: model.TypeNodePort}
	for i, np := range nodePorts {
		s.Ports = append(s.Ports, model.ServicePortSpec{Name: "p" + string(rune('a'+i)), Protocol: model.TCP, Port: 80 + uint16(i), NodePort: np})
	}
	return s
}

func TestAssignRestartKeepsValues(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a.db")
	store := openBoltT(t, path)
	a := newAssignerT(t, store)

	web, err := a.Assign(ctx, clusterIPSvc("default", "web"))
	if err != nil {
		t.Fatal(err)
	}
	if len(web.ClusterIPs) != 1 || !v4CIDR.Contains(web.ClusterIPs[0]) {
		t.Fatalf("ClusterIPs = %v, want one address in %v", web.ClusterIPs, v4CIDR)
	}
	if a.ips[model.IPv4].InStaticBand(web.ClusterIPs[0]) {
		t.Errorf("dynamic allocation %v came from the static band", web.ClusterIPs[0])
	}
	np, err := a.Assign(ctx, nodePortSvc("default", "np", 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := np.Ports[0].NodePort, np.Ports[1].NodePort
	if p0 < 30000 || p0 > 32767 || p1 < 30000 || p1 > 32767 || p0 == p1 {
		t.Fatalf("NodePorts %d, %d: want two distinct ports in 30000-32767", p0, p1)
	}
	again, err := a.Assign(ctx, clusterIPSvc("default", "web"))
	if err != nil || again.ClusterIPs[0] != web.ClusterIPs[0] {
		t.Fatalf("second Assign = %v, %v; want the same %v", again.ClusterIPs, err, web.ClusterIPs[0])
	}

	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	store2 := openBoltT(t, path)
	a2 := newAssignerT(t, store2)
	web2, err := a2.Assign(ctx, clusterIPSvc("default", "web"))
	if err != nil || web2.ClusterIPs[0] != web.ClusterIPs[0] {
		t.Fatalf("after restart web = %v, %v; want %v", web2.ClusterIPs, err, web.ClusterIPs[0])
	}
	np2, err := a2.Assign(ctx, nodePortSvc("default", "np", 0, 0))
	if err != nil || np2.Ports[0].NodePort != p0 || np2.Ports[1].NodePort != p1 {
		t.Fatalf("after restart NodePorts = %+v, %v; want %d, %d", np2.Ports, err, p0, p1)
	}
}

func TestAssignFixedValues(t *testing.T) {
	ctx := context.Background()
	a := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "a.db")))
	if _, err := a.Assign(ctx, clusterIPSvc("default", "other", "10.96.0.10")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Assign(ctx, nodePortSvc("default", "otherport", 30080)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		svc     model.Service
		wantMsg string
		is      error
		inRange bool // expect *ErrNotInRange
	}{
		{
			name:    "IP taken",
			svc:     clusterIPSvc("default", "web", "10.96.0.10"),
			wantMsg: `Service default/web: spec.clusterIP "10.96.0.10": already allocated to default/other`,
			is:      ErrAllocated,
		},
		{
			name:    "IP out of range",
			svc:     clusterIPSvc("default", "web", "10.97.0.10"),
			wantMsg: `Service default/web: spec.clusterIP "10.97.0.10": 10.97.0.10 is not in the allocatable range 10.96.0.0/24`,
			inRange: true,
		},
		{
			name:    "network address",
			svc:     clusterIPSvc("default", "web", "10.96.0.0"),
			inRange: true,
		},
		{
			name:    "broadcast address",
			svc:     clusterIPSvc("default", "web", "10.96.0.255"),
			inRange: true,
		},
		{
			name:    "NodePort taken",
			svc:     nodePortSvc("default", "web", 30080),
			wantMsg: `Service default/web: spec.ports[0].nodePort "30080": already allocated to default/otherport`,
			is:      ErrAllocated,
		},
		{
			name:    "NodePort out of range",
			svc:     nodePortSvc("default", "web", 0, 8080),
			wantMsg: `Service default/web: spec.ports[1].nodePort "8080": 8080 is not in the allocatable range 30000-32767`,
			inRange: true,
		},
		{
			name: "nodePort on a ClusterIP Service",
			svc: func() model.Service {
				s := nodePortSvc("default", "web", 30001)
				s.Type = model.TypeClusterIP
				return s
			}(),
			wantMsg: `Service default/web: spec.ports[0].nodePort "30001": may not be set when type is "ClusterIP"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Assign(ctx, tc.svc)
			if err == nil {
				t.Fatal("Assign succeeded, want an error")
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Errorf("error\n got: %s\nwant: %s", err, tc.wantMsg)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
			var nir *ErrNotInRange
			if errors.As(err, &nir) != tc.inRange {
				t.Errorf("errors.As(*ErrNotInRange) = %v, want %v (err %v)", !tc.inRange, tc.inRange, err)
			}
			var ae *AssignError
			if !errors.As(err, &ae) || ae.Service != svcName("default", "web") {
				t.Errorf("want *AssignError naming default/web, got %#v", err)
			}
		})
	}
	// A failed Assign leaves nothing behind.
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("after refused Assigns the map holds %d records, want 2: %+v", len(list), list)
	}
	// The owner itself may re-assert its fixed values; a free static IP is granted.
	if _, err := a.Assign(ctx, clusterIPSvc("default", "other", "10.96.0.10")); err != nil {
		t.Errorf("owner re-asserting its IP: %v", err)
	}
	got, err := a.Assign(ctx, clusterIPSvc("default", "web", "10.96.0.5"))
	if err != nil || got.ClusterIPs[0] != netip.MustParseAddr("10.96.0.5") {
		t.Errorf("free fixed IP: %v, %v", got.ClusterIPs, err)
	}
}

func TestAssignFamilies(t *testing.T) {
	ctx := context.Background()
	dual := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "d.db")), v4CIDR, v6CIDR)
	single := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "s.db")), v4CIDR)
	v6 := []model.AddressType{model.IPv6}
	for _, tc := range []struct {
		name    string
		a       *Assigner
		fams    []model.AddressType
		policy  string
		ips     []string
		want    []model.AddressType
		wantErr bool
	}{
		{name: "default single stack", a: dual, want: []model.AddressType{model.IPv4}},
		{name: "ask for IPv6", a: dual, fams: v6, want: v6},
		{name: "prefer dual on dual", a: dual, policy: PreferDualStack, want: []model.AddressType{model.IPv4, model.IPv6}},
		{name: "prefer dual v6 first", a: dual, policy: PreferDualStack, fams: v6, want: []model.AddressType{model.IPv6, model.IPv4}},
		{name: "require dual on dual", a: dual, policy: RequireDualStack, want: []model.AddressType{model.IPv4, model.IPv6}},
		{name: "prefer dual on single", a: single, policy: PreferDualStack, want: []model.AddressType{model.IPv4}},
		{name: "require dual on single", a: single, policy: RequireDualStack, wantErr: true},
		{name: "IPv6 on single v4", a: single, fams: v6, wantErr: true},
		{name: "single stack with two families", a: dual, fams: []model.AddressType{model.IPv4, model.IPv6}, wantErr: true},
		{name: "fixed v6 ip picks family", a: dual, ips: []string{"fd00:10:96::20"}, want: v6},
		{name: "fixed v4 ip with v6 family", a: dual, fams: v6, ips: []string{"10.96.0.20"}, wantErr: true},
		{name: "fixed v4 + dual fills v6", a: dual, policy: RequireDualStack, ips: []string{"10.96.0.21"}, want: []model.AddressType{model.IPv4, model.IPv6}},
		{name: "bad policy", a: dual, policy: "Sometimes", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := clusterIPSvc("fam", tc.name, tc.ips...)
			svc.IPFamilies, svc.IPFamilyPolicy = tc.fams, tc.policy
			got, err := tc.a.Assign(ctx, svc)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("want an error, got %v", got.ClusterIPs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var fams []model.AddressType
			for _, ip := range got.ClusterIPs {
				fams = append(fams, familyOf(ip))
				if !tc.a.ips[familyOf(ip)].Contains(ip) {
					t.Errorf("%v not in its range", ip)
				}
			}
			if !slices.Equal(fams, tc.want) || !slices.Equal(got.IPFamilies, tc.want) {
				t.Errorf("families of %v = %v (IPFamilies %v), want %v", got.ClusterIPs, fams, got.IPFamilies, tc.want)
			}
			for i, s := range tc.ips {
				if got.ClusterIPs[i] != netip.MustParseAddr(s) {
					t.Errorf("fixed %s not kept: %v", s, got.ClusterIPs)
				}
			}
		})
	}
}

func TestAssignHealthCheckAndRelease(t *testing.T) {
	ctx := context.Background()
	a := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "a.db")))
	lb := nodePortSvc("default", "lb", 0)
	lb.Type, lb.ExternalTrafficPolicy = model.TypeLoadBalancer, model.PolicyLocal
	got, err := a.Assign(ctx, lb)
	if err != nil {
		t.Fatal(err)
	}
	hc := got.HealthCheckNodePort
	if hc < 30000 || hc > 32767 || hc == got.Ports[0].NodePort {
		t.Fatalf("HealthCheckNodePort %d (nodePort %d): want a distinct port in range", hc, got.Ports[0].NodePort)
	}
	// Turning it into a ClusterIP Service releases the ports but keeps the IP.
	lb.Type, lb.ExternalTrafficPolicy = model.TypeClusterIP, ""
	cip, err := a.Assign(ctx, lb)
	if err != nil {
		t.Fatal(err)
	}
	if cip.ClusterIPs[0] != got.ClusterIPs[0] || cip.HealthCheckNodePort != 0 || cip.Ports[0].NodePort != 0 {
		t.Fatalf("as ClusterIP: %+v", cip)
	}
	// Its old ports are free for someone else now.
	if _, err := a.Assign(ctx, nodePortSvc("default", "taker", got.Ports[0].NodePort, hc)); err != nil {
		t.Fatalf("released ports not reusable: %v", err)
	}
	// Release frees the IP; releasing twice or an unknown Service is fine.
	for range 2 {
		if err := a.Release(ctx, svcName("default", "lb")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Assign(ctx, clusterIPSvc("default", "new", cip.ClusterIPs[0].String())); err != nil {
		t.Fatalf("released IP not reusable: %v", err)
	}
	// Headless: nothing allocated, no record.
	h := clusterIPSvc("default", "headless")
	h.Headless = true
	if got, err := a.Assign(ctx, h); err != nil || len(got.ClusterIPs) != 0 {
		t.Fatalf("headless: %v, %v", got.ClusterIPs, err)
	}
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, as := range list {
		names = append(names, as.Service.String())
	}
	if !slices.Equal(names, []string{"default/new", "default/taker"}) {
		t.Fatalf("List = %v", names)
	}
}

// TestAssignFullRange: a /29 holds six Services, the seventh gets ErrFull
// naming the Service; releasing one makes room.
func TestAssignFullRange(t *testing.T) {
	ctx := context.Background()
	a := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "a.db")), netip.MustParsePrefix("10.0.0.0/29"))
	seen := map[netip.Addr]bool{}
	for i := range 6 {
		got, err := a.Assign(ctx, clusterIPSvc("ns", string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		if seen[got.ClusterIPs[0]] {
			t.Fatalf("%v given twice", got.ClusterIPs[0])
		}
		seen[got.ClusterIPs[0]] = true
	}
	_, err := a.Assign(ctx, clusterIPSvc("ns", "g"))
	if !errors.Is(err, ErrFull) {
		t.Fatalf("seventh Assign: %v, want ErrFull", err)
	}
	if err := a.Release(ctx, svcName("ns", "c")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Assign(ctx, clusterIPSvc("ns", "g")); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

func TestWriteTable(t *testing.T) {
	ctx := context.Background()
	a := newAssignerT(t, openBoltT(t, filepath.Join(t.TempDir(), "a.db")), v4CIDR, v6CIDR)
	web := clusterIPSvc("default", "web", "10.96.0.10", "fd00:10:96::a")
	web.IPFamilyPolicy = RequireDualStack
	if _, err := a.Assign(ctx, web); err != nil {
		t.Fatal(err)
	}
	lb := nodePortSvc("default", "lb", 30080)
	lb.Type, lb.ExternalTrafficPolicy, lb.HealthCheckNodePort = model.TypeLoadBalancer, model.PolicyLocal, 30099
	lb.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	if _, err := a.Assign(ctx, lb); err != nil {
		t.Fatal(err)
	}
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteTable(&b, list); err != nil {
		t.Fatal(err)
	}
	want := `NAMESPACE  NAME  CLUSTER-IPS               NODE-PORTS    HEALTH-CHECK-NODE-PORT
default    lb    10.96.0.11                pa/TCP:30080  30099
default    web   10.96.0.10,fd00:10:96::a  -             -
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestAssignAll: a batch spanning several store updates; bad Services get
// their own error and block nobody; a failed Service's partial marks are
// undone so a later Service in the same batch can take those values.
func TestAssignAll(t *testing.T) {
	ctx := context.Background()
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	a := newAssignerT(t, store, netip.MustParsePrefix("10.96.0.0/22"))
	if _, err := a.Assign(ctx, nodePortSvc("pre", "x", 30005)); err != nil {
		t.Fatal(err)
	}
	var svcs []model.Service
	for i := range 250 {
		s := clusterIPSvc("batch", fmt.Sprintf("s%03d", i))
		if i%5 == 0 {
			s.Type = model.TypeNodePort
		}
		svcs = append(svcs, s)
	}
	// s010 fixes a free IP but a taken NodePort: refused, IP mark undone.
	svcs[10] = nodePortSvc("batch", "s010", 30005)
	svcs[10].ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.5")}
	// s011 then takes that IP. It names its family too, as a decoded
	// manifest does: nothing to fill in.
	svcs[11] = clusterIPSvc("batch", "s011", "10.96.0.5")
	svcs[11].IPFamilies = []model.AddressType{model.IPv4}
	// s150 asks for s011's IP: refused, naming s011 (same batch, earlier update).
	svcs[150] = clusterIPSvc("batch", "s150", "10.96.0.5")
	// s200 has a bad policy.
	svcs[200].IPFamilyPolicy = "Sometimes"
	hadIPs := make([]int, len(svcs))
	for i := range svcs {
		hadIPs[i] = len(svcs[i].ClusterIPs)
	}
	out, errs := a.AssignAll(ctx, ptrs(svcs))
	for i := range svcs {
		if len(svcs[i].ClusterIPs) != hadIPs[i] {
			t.Errorf("svc %d: AssignAll modified its input", i)
		}
	}
	wantErr := map[int]string{
		10:  `Service batch/s010: spec.ports[0].nodePort "30005": already allocated to pre/x`,
		150: `Service batch/s150: spec.clusterIP "10.96.0.5": already allocated to batch/s011`,
		200: `Service batch/s200: spec.ipFamilyPolicy "Sometimes": want SingleStack, PreferDualStack or RequireDualStack`,
	}
	ips := map[netip.Addr]string{}
	ports := map[uint16]string{30005: "pre/x"}
	for i := range svcs {
		if w, bad := wantErr[i]; bad {
			if errs[i] == nil || errs[i].Error() != w {
				t.Errorf("svc %d: error %v, want %s", i, errs[i], w)
			}
			if len(out[i].ClusterIPs) != len(svcs[i].ClusterIPs) {
				t.Errorf("svc %d: refused Service was modified: %v", i, out[i].ClusterIPs)
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("svc %d: %v", i, errs[i])
		}
		ip := out[i].ClusterIPs[0]
		if o, dup := ips[ip]; dup {
			t.Fatalf("%v given to %s and %s", ip, o, out[i].ServiceName)
		}
		ips[ip] = out[i].ServiceName.String()
		if out[i].Type == model.TypeNodePort {
			p := out[i].Ports[0].NodePort
			if o, dup := ports[p]; dup || p == 0 {
				t.Fatalf("port %d given to %s and %s", p, o, out[i].ServiceName)
			}
			ports[p] = out[i].ServiceName.String()
		}
	}
	if ips[netip.MustParseAddr("10.96.0.5")] != "batch/s011" {
		t.Errorf("10.96.0.5 went to %q, want batch/s011", ips[netip.MustParseAddr("10.96.0.5")])
	}
	m, _ := store.Snapshot(ctx)
	if m.Len() != 1+250-3 {
		t.Errorf("map holds %d records, want %d", m.Len(), 1+250-3)
	}
	if m.Revision() != 1+1 {
		t.Errorf("map revision %d: want 2 (bbolt: one update for all Services)", m.Revision())
	}
	// Re-assigning the same batch changes nothing and writes nothing.
	out2, _ := a.AssignAll(ctx, ptrs(svcs))
	for i := range svcs {
		if _, bad := wantErr[i]; !bad && out2[i].ClusterIPs[0] != out[i].ClusterIPs[0] {
			t.Fatalf("svc %d moved from %v to %v", i, out[i].ClusterIPs, out2[i].ClusterIPs)
		}
	}
	if m2, _ := store.Snapshot(ctx); m2.Revision() != m.Revision() {
		t.Errorf("unchanged batch bumped the revision %d -> %d", m.Revision(), m2.Revision())
	}
	// A Service that holds its values already is its own assignment, not
	// a copy: s011 named its IP and family; every out of the first call
	// holds its own.
	if out[11] != &svcs[11] {
		t.Errorf("s011 named its ClusterIP and family, yet was copied")
	}
	if out[12] == &svcs[12] {
		t.Errorf("s012 got a ClusterIP, yet its input was returned")
	}
	again, errs := a.AssignAll(ctx, out)
	for i := range out {
		if _, bad := wantErr[i]; bad {
			continue
		}
		if errs[i] != nil || again[i] != out[i] {
			t.Errorf("svc %d: re-assigning its own assignment gave a copy or %v", i, errs[i])
		}
	}
}

// TestIndexAcrossWriters: two Assigners on one store take turns; each
// one's cached index must notice the other's commits and releases.
func TestIndexAcrossWriters(t *testing.T) {
	ctx := context.Background()
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	small := netip.MustParsePrefix("10.0.0.0/29") // 6 addresses
	a, b := newAssignerT(t, store, small), newAssignerT(t, store, small)
	seen := map[netip.Addr]string{}
	for i := range 6 {
		w := a
		if i%2 == 1 {
			w = b
		}
		got, err := w.Assign(ctx, clusterIPSvc("x", fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("Assign %d: %v", i, err)
		}
		if o, dup := seen[got.ClusterIPs[0]]; dup {
			t.Fatalf("%v given to x/%s and x/%d", got.ClusterIPs[0], o, i)
		}
		seen[got.ClusterIPs[0]] = fmt.Sprint(i)
		// The other writer re-asserts an unchanged Service (index kept valid).
		if _, err := a.Assign(ctx, clusterIPSvc("x", "0")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Assign(ctx, clusterIPSvc("x", "full")); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	if err := b.Release(ctx, svcName("x", "3")); err != nil {
		t.Fatal(err)
	}
	got, err := a.Assign(ctx, clusterIPSvc("x", "full"))
	if err != nil {
		t.Fatalf("a did not see b's release: %v", err)
	}
	if seen[got.ClusterIPs[0]] != "3" {
		t.Fatalf("got %v, want the released address of x/3", got.ClusterIPs[0])
	}
}

// ptrs points at each of svcs, for AssignAll.
func ptrs(svcs []model.Service) []*model.Service {
	out := make([]*model.Service, len(svcs))
	for i := range svcs {
		out[i] = &svcs[i]
	}
	return out
}
