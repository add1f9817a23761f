package dataplanetest

import (
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

func TestFill(t *testing.T) {
	for _, tc := range []struct {
		name         string
		itp, etp     model.TrafficPolicy
		nodePort     uint16
		eps          []model.Endpoint
		cluster      int // -1: nil
		local        int // -1: nil
		clusterFirst string
	}{
		{"cluster only, ready preferred", model.PolicyCluster, model.PolicyCluster, 0,
			[]model.Endpoint{TermEP("10.1.2.1", 80, false), EP("10.1.2.2", 80, true)}, 1, -1, "10.1.2.2:80"},
		{"terminating fallback", model.PolicyCluster, model.PolicyCluster, 0,
			[]model.Endpoint{TermEP("10.1.2.1", 80, false)}, 1, -1, "10.1.2.1:80"},
		{"ITP Local without NodePort uses no cluster endpoints", model.PolicyLocal, model.PolicyCluster, 0,
			[]model.Endpoint{EP("10.1.2.1", 80, false)}, -1, 0, ""},
		{"ETP Local NodePort uses both", model.PolicyCluster, model.PolicyLocal, 30000,
			[]model.Endpoint{EP("10.1.2.1", 80, false), EP("10.1.1.1", 80, true)}, 2, 1, "10.1.1.1:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := Port("default/x", "", model.TCP, 80, "10.96.0.1")
			sp.InternalTrafficPolicy, sp.ExternalTrafficPolicy = tc.itp, tc.etp
			if tc.nodePort != 0 {
				sp.Type, sp.NodePort = model.TypeNodePort, tc.nodePort
			}
			sp.Endpoints = tc.eps
			Fill(sp)
			count := func(e []model.Endpoint) int {
				if e == nil {
					return -1
				}
				return len(e)
			}
			if got := count(sp.ClusterEndpoints); got != tc.cluster {
				t.Errorf("ClusterEndpoints = %v, want %d", sp.ClusterEndpoints, tc.cluster)
			}
			if got := count(sp.LocalEndpoints); got != tc.local {
				t.Errorf("LocalEndpoints = %v, want %d", sp.LocalEndpoints, tc.local)
			}
			if tc.clusterFirst != "" && sp.ClusterEndpoints[0].String() != tc.clusterFirst {
				t.Errorf("first cluster endpoint %s, want %s", sp.ClusterEndpoints[0], tc.clusterFirst)
			}
		})
	}
}

func TestVerdictNormalizeAndString(t *testing.T) {
	v := Verdict{Action: DNAT, AffinitySeconds: 5, Targets: []Target{
		{netip.MustParseAddrPort("10.0.0.2:80"), true}, {netip.MustParseAddrPort("10.0.0.1:80"), false}}}
	if got, want := v.Normalize().String(), "dnat [10.0.0.1:80 10.0.0.2:80+masq] affinity=5s"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if v.Targets[0].Endpoint.String() != "10.0.0.2:80" {
		t.Errorf("Normalize changed its receiver's slice")
	}
	if got := (Verdict{Action: Reject}).String(); got != "reject" {
		t.Errorf("String = %q", got)
	}
}

// TestScenariosWellFormed checks the scenario table itself: unique names,
// every check names a packet, ports are filled.
func TestScenariosWellFormed(t *testing.T) {
	names := map[string]bool{}
	for _, sc := range Scenarios() {
		if names[sc.Name] {
			t.Errorf("duplicate scenario %q", sc.Name)
		}
		names[sc.Name] = true
		if len(sc.Checks) == 0 {
			t.Errorf("%s: no checks", sc.Name)
		}
		for _, c := range sc.Checks {
			if !c.Packet.Src.IsValid() || !c.Packet.Dst.IsValid() || c.Packet.DstPort == 0 || c.Packet.Proto == "" {
				t.Errorf("%s/%s: incomplete packet %+v", sc.Name, c.Name, c.Packet)
			}
			if c.Want.Action == DNAT && len(c.Want.Targets) == 0 {
				t.Errorf("%s/%s: DNAT without targets", sc.Name, c.Name)
			}
		}
	}
}
