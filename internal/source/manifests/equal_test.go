package manifests

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestSnapshotsEqualCoversModel fails when a model type gains (or loses)
// a field: snapshotsEqual must then be taught to compare it, or Run would
// drop a changed snapshot as identical; and detach to copy its
// strings, or decoded objects would keep their file's bytes alive.
func TestSnapshotsEqualCoversModel(t *testing.T) {
	for _, tc := range []struct {
		v      any
		fields int
	}{
		{model.Snapshot{}, 7}, // Gen and Patch are not content
		{model.Service{}, 19}, // Balance and OutlierEjection are constants, SlowStart and DrainReset numbers: nothing to detach
		{model.EndpointSlice{}, 5},
		{model.SliceEndpoint{}, 6}, // Loc holds canonical copies of node, zone and hint names (unique.Make clones strings): nothing to detach
		// Also copied out of the file by detach:
		{model.ServiceName{}, 2},
		{model.ServicePortSpec{}, 4},
		{model.EndpointPort{}, 3},
		{model.Problem{}, 5}, // File is set from the file name, never from its bytes
	} {
		if n := reflect.TypeOf(tc.v).NumField(); n != tc.fields {
			t.Errorf("%T has %d fields, snapshotsEqual and detach handle %d: update them", tc.v, n, tc.fields)
		}
	}
}

// TestSnapshotsEqual: every field difference makes snapshots unequal,
// and copies (or shared slices) are equal.
func TestSnapshotsEqual(t *testing.T) {
	base := func() *model.Snapshot {
		return &model.Snapshot{
			Services: model.Ptrs([]model.Service{{
				ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Type: model.TypeClusterIP,
				ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, IPFamilies: []model.AddressType{model.IPv4},
				Ports: []model.ServicePortSpec{{Name: "http", Protocol: model.TCP, Port: 80}},
			}}),
			Slices: model.Ptrs([]model.EndpointSlice{{
				Name: "web-1", Service: model.ServiceName{Namespace: "default", Name: "web"}, AddressType: model.IPv4,
				Ports:     []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}},
				Endpoints: []model.SliceEndpoint{{Address: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true, Loc: model.At("", "").WithHints([]string{"z"}, nil)}},
			}}),
			Node:     &model.Node{Name: "n1"},
			Problems: []model.Problem{{Object: "o", Reason: "r"}},
		}
	}
	a := base()
	if !snapshotsEqual(a, base()) || !snapshotsEqual(a, a) {
		t.Fatal("equal snapshots compare unequal")
	}
	changes := map[string]func(s *model.Snapshot){
		"service name":     func(s *model.Snapshot) { s.Services[0].Name = "x" },
		"service type":     func(s *model.Snapshot) { s.Services[0].Type = model.TypeNodePort },
		"cluster IP":       func(s *model.Snapshot) { s.Services[0].ClusterIPs[0] = netip.MustParseAddr("10.96.0.2") },
		"headless":         func(s *model.Snapshot) { s.Services[0].Headless = true },
		"families":         func(s *model.Snapshot) { s.Services[0].IPFamilies = nil },
		"family policy":    func(s *model.Snapshot) { s.Services[0].IPFamilyPolicy = "x" },
		"external IPs":     func(s *model.Snapshot) { s.Services[0].ExternalIPs = []netip.Addr{{}} },
		"LB IPs":           func(s *model.Snapshot) { s.Services[0].LoadBalancerIPs = []netip.Addr{{}} },
		"LB ranges":        func(s *model.Snapshot) { s.Services[0].LoadBalancerSourceRanges = []netip.Prefix{{}} },
		"affinity":         func(s *model.Snapshot) { s.Services[0].AffinityTimeoutSeconds = 1 },
		"external policy":  func(s *model.Snapshot) { s.Services[0].ExternalTrafficPolicy = model.PolicyLocal },
		"internal policy":  func(s *model.Snapshot) { s.Services[0].InternalTrafficPolicy = model.PolicyLocal },
		"health port":      func(s *model.Snapshot) { s.Services[0].HealthCheckNodePort = 1 },
		"distribution":     func(s *model.Snapshot) { s.Services[0].TrafficDistribution = "x" },
		"service port":     func(s *model.Snapshot) { s.Services[0].Ports[0].NodePort = 30000 },
		"balance":          func(s *model.Snapshot) { s.Services[0].Balance = model.BalanceRoundRobin },
		"outlier ejection": func(s *model.Snapshot) { s.Services[0].OutlierEjection = "on" },
		"slow start":       func(s *model.Snapshot) { s.Services[0].SlowStart = time.Second },
		"drain":            func(s *model.Snapshot) { s.Services[0].DrainReset = time.Second },
		"weight":           func(s *model.Snapshot) { s.Slices[0].Endpoints[0].Weight = 3 },
		"no services":      func(s *model.Snapshot) { s.Services = nil },
		"slice name":       func(s *model.Snapshot) { s.Slices[0].Name = "x" },
		"slice service":    func(s *model.Snapshot) { s.Slices[0].Service.Name = "x" },
		"address type":     func(s *model.Snapshot) { s.Slices[0].AddressType = model.IPv6 },
		"slice port":       func(s *model.Snapshot) { s.Slices[0].Ports[0].Port = 1 },
		"endpoint address": func(s *model.Snapshot) { s.Slices[0].Endpoints[0].Address = netip.MustParseAddr("10.0.0.2") },
		"ready":            func(s *model.Snapshot) { s.Slices[0].Endpoints[0].Ready = false },
		"serving":          func(s *model.Snapshot) { s.Slices[0].Endpoints[0].Serving = false },
		"terminating":      func(s *model.Snapshot) { s.Slices[0].Endpoints[0].Terminating = true },
		"node name":        func(s *model.Snapshot) { e := &s.Slices[0].Endpoints[0]; e.Loc = model.At("n", e.Zone()) },
		"zone":             func(s *model.Snapshot) { e := &s.Slices[0].Endpoints[0]; e.Loc = model.At(e.NodeName(), "z") },
		"zone hints":       func(s *model.Snapshot) { e := &s.Slices[0].Endpoints[0]; e.Loc = e.Loc.WithHints(nil, nil) },
		"node hints": func(s *model.Snapshot) {
			e := &s.Slices[0].Endpoints[0]
			e.Loc = e.Loc.WithHints([]string{"z"}, []string{"n"})
		},
		"no endpoints": func(s *model.Snapshot) { s.Slices[0].Endpoints = nil },
		"node":         func(s *model.Snapshot) { s.Node = &model.Node{Name: "n2"} },
		"no node":      func(s *model.Snapshot) { s.Node = nil },
		"problem":      func(s *model.Snapshot) { s.Problems[0].Field = "f" },
		"no problems":  func(s *model.Snapshot) { s.Problems = nil },
	}
	for name, change := range changes {
		b := base()
		change(b)
		if snapshotsEqual(a, b) || snapshotsEqual(b, a) {
			t.Errorf("%s: changed snapshot compares equal", name)
		}
	}
	if snapshotsEqual(a, nil) || !snapshotsEqual(nil, nil) {
		t.Error("nil handling")
	}
}
