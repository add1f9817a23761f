package model

import (
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.golden from the current output")

// explainState is one node's State with a Service per eligibility reason.
func explainState() *State {
	node := "node1"
	hinted := func(addr, n string, zones, nodes []string) SliceEndpoint {
		e := ready(addr, n)
		e.Loc = At(n, map[string]string{"node1": "z1", "node2": "z2"}[n]).WithHints(zones, nodes)
		return e
	}
	term := func(addr, n string, serving bool) SliceEndpoint {
		return SliceEndpoint{Address: ip(addr), Serving: serving, Terminating: true, Loc: At(n, "")}
	}
	svc := func(name, vip string, mod func(*Service)) Service {
		s := Service{ServiceName: svcName("default", name), Type: TypeClusterIP, ClusterIPs: []netip.Addr{ip(vip)},
			Ports: []ServicePortSpec{{Name: "http", Protocol: TCP, Port: 80}}}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	slice := func(svc, name string, eps ...SliceEndpoint) EndpointSlice {
		return EndpointSlice{Name: name, Service: svcName("default", svc), AddressType: IPv4,
			Ports: []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}}, Endpoints: eps}
	}
	heavy := ready("10.244.2.12", "node2")
	heavy.Weight = 4
	snap := &Snapshot{
		Node: &Node{Name: node, Labels: map[string]string{LabelTopologyZone: "z1"}},
		Services: Ptrs([]Service{
			svc("web", "10.96.0.10", func(s *Service) {
				s.AffinityTimeoutSeconds = 600
				s.Balance = BalanceConsistentHash
				s.OutlierEjection = "on"
			}),
			svc("draining", "10.96.0.11", nil),
			svc("itp-local", "10.96.0.12", func(s *Service) { s.InternalTrafficPolicy = PolicyLocal }),
			svc("etp-local", "10.96.0.13", func(s *Service) {
				s.Type = TypeNodePort
				s.Ports[0].NodePort = 30013
				s.ExternalTrafficPolicy = PolicyLocal
				s.ExternalIPs = []netip.Addr{ip("198.51.100.13")}
			}),
			svc("etp-local-remote", "10.96.0.14", func(s *Service) {
				s.Type = TypeNodePort
				s.Ports[0].NodePort = 30014
				s.ExternalTrafficPolicy = PolicyLocal
			}),
			svc("zoned", "10.96.0.15", nil),
			svc("noded", "10.96.0.16", nil),
			svc("empty", "10.96.0.17", nil),
		}),
		Slices: Ptrs([]EndpointSlice{
			slice("web", "web-a", ready("10.244.1.10", node), heavy, notReady("10.244.2.13", "node2"),
				term("10.244.2.14", "node2", true), term("10.244.2.15", "node2", false)),
			slice("draining", "draining-a", term("10.244.1.20", node, true), term("10.244.2.21", "node2", true), notReady("10.244.2.22", "node2")),
			slice("itp-local", "itp-a", ready("10.244.1.30", node), ready("10.244.2.31", "node2")),
			slice("etp-local", "etp-a", ready("10.244.1.40", node), ready("10.244.2.41", "node2")),
			slice("etp-local-remote", "etpr-a", ready("10.244.2.50", "node2")),
			slice("zoned", "zoned-a", hinted("10.244.1.60", node, []string{"z1"}, nil), hinted("10.244.2.61", "node2", []string{"z2"}, nil)),
			slice("noded", "noded-a", hinted("10.244.1.70", node, []string{"z1"}, []string{"node1"}), hinted("10.244.2.71", "node2", []string{"z1"}, []string{"node2"})),
		}),
	}
	return Build(snap, BuildOptions{NodeName: node})
}

// TestExplainGolden renders Explain for a query per eligibility reason,
// verdict and masquerade decision, and compares with
// testdata/explain.golden (go test -rewrite regenerates it).
func TestExplainGolden(t *testing.T) {
	st := explainState()
	o := ExplainOptions{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, NodeIPs: []netip.Addr{ip("192.168.0.1")}}
	queries := []struct{ dst, proto, src string }{
		{"10.96.0.10:80", "TCP", "10.244.1.99"},     // ready, not ready, terminating unused, not serving; affinity, hash, weight
		{"10.96.0.10:80", "TCP", "203.0.113.7"},     // masqueraded
		{"10.96.0.11:80", "TCP", ""},                // terminating fallback
		{"10.96.0.12:80", "TCP", "10.244.1.99"},     // internalTrafficPolicy Local: other node
		{"192.168.0.1:30013", "TCP", "203.0.113.7"}, // externalTrafficPolicy Local from outside
		{"198.51.100.13:80", "TCP", "10.244.2.9"},   // ... from a pod: short circuit
		{"192.168.0.1:30013", "TCP", "192.168.0.1"}, // ... from the node: short circuit, masqueraded
		{"192.168.0.1:30014", "TCP", "203.0.113.7"}, // Local, no local endpoint: drop
		{"10.96.0.15:80", "TCP", "10.244.1.99"},     // zone hints
		{"10.96.0.16:80", "TCP", "10.244.1.99"},     // node hints
		{"10.96.0.17:80", "TCP", "10.244.1.99"},     // no endpoints: reject
		{"10.96.0.17:81", "TCP", "10.244.1.99"},     // ClusterIP, unknown port
		{"10.97.0.1:80", "UDP", ""},                 // not a Service
	}
	var out strings.Builder
	for _, q := range queries {
		var src netip.Addr
		if q.src != "" {
			src = ip(q.src)
		}
		x := Explain(st, Query{Dst: netip.MustParseAddrPort(q.dst), Proto: Protocol(q.proto), Src: src}, o)
		out.WriteString(x.Text())
		out.WriteString("\n")
		if q.dst == "10.96.0.10:80" && q.src == "10.244.1.99" {
			p := o
			p.Ejected = map[netip.AddrPort]string{netip.MustParseAddrPort("10.244.2.12:8080"): "ejected until 2026-11-28T09:00:05Z: 3 new connections in a row failed (last: refused)"}
			out.WriteString("with an endpoint ejected:\n" + Explain(st, Query{Dst: netip.MustParseAddrPort(q.dst), Proto: TCP, Src: src}, p).Text() + "\n")
			// The source's affinity entry, as the dataplane reports it.
			for _, c := range []struct {
				what string
				ep   string
				left time.Duration
				err  error
			}{
				{"with an affinity entry", "10.244.1.10:8080", 10787 * time.Second, nil},
				{"with an affinity entry of unknown expiry", "10.244.1.10:8080", 0, nil},
				{"without an affinity entry", "", 0, nil},
				{"when the entry cannot be read", "", 0, errors.New("permission denied")},
			} {
				p := o
				p.Affinity = func(sp *ServicePort, client netip.Addr) (netip.AddrPort, time.Duration, bool, error) {
					if client != src || sp.Name.Name != "web" {
						t.Errorf("Affinity asked for %v of %v", client, sp.Name)
					}
					if c.ep == "" {
						return netip.AddrPort{}, 0, false, c.err
					}
					return netip.MustParseAddrPort(c.ep), c.left, true, nil
				}
				out.WriteString(c.what + ":\n" + Explain(st, Query{Dst: netip.MustParseAddrPort(q.dst), Proto: TCP, Src: src}, p).Text() + "\n")
			}
		}
		if q.dst == "10.96.0.15:80" {
			p := o
			p.Proxied = true
			out.WriteString("userspace mode:\n" + Explain(st, Query{Dst: netip.MustParseAddrPort(q.dst), Proto: TCP, Src: src}, p).Text() + "\n")
		}
		if _, err := json.Marshal(x); err != nil {
			t.Fatal(err)
		}
	}
	got := out.String()
	path := filepath.Join("testdata", "explain.golden")
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -rewrite to create it)", err)
	}
	if got != string(want) {
		t.Errorf("explain output differs from %s (go test -rewrite to accept):\n%s", path, got)
	}
	// Every reason and verdict appears, so a rewrite cannot lose one.
	for _, reason := range []string{
		"sticks to 10.244.1.10:8080, 10787 s left", "this client's affinity entry", "its next connection is balanced", "entry:        cannot be read",
		"+ 10.244.1.10:8080", "ready", "not ready", "terminating: used only when no endpoint is ready",
		"terminating and not serving", "serving and terminating: used because no endpoint is ready",
		"on node2, not this node (Local policy)", "ready, on this node", "short-circuited to the Cluster endpoints",
		"topology: hinted for zone(s) z2, not this node's zone z1", "topology: hinted for node(s) node2, not this node node1",
		"drop: Local policy and no usable endpoint on this node", "reject: the Service has no usable endpoint",
		"no port 81/TCP: rejected", "passed through untouched", "masquerade:   yes (source is not a pod)",
		"masquerade:   no (Local policy keeps the client's address)", "masquerade:   yes (source is this node)",
		"affinity:     ClientIP, 600 s", "- 10.244.2.12:8080       node2            weight 4   conns ?    ejected until 2026-11-28T09:00:05Z", "yes (userspace mode: the proxy connects to the endpoint from this node)", "balancing:    consistent-hash", "weight 4",
	} {
		if !strings.Contains(got, reason) {
			t.Errorf("no explanation says %q", reason)
		}
	}
}

// TestExplainEvents: the events line says what the port's flows report.
func TestExplainEvents(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		ejection, sampled, quiet, udp bool
		want                          string
	}{
		{"not read", false, false, false, false, ""},
		{"read, every flow", true, false, false, false, "read for outlier ejection: every flow reports its start, answer and end"},
		{"sampled", true, true, false, false, "sampled for outlier ejection: every flow reports its end, a sample also its start and answer"},
		{"quiet", false, false, true, false, "none: silenced while vipproxy reads the flows of Services with outlier ejection only"},
		{"UDP with ejection: not read", true, false, false, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &ServicePort{Protocol: TCP, OutlierEjection: tc.ejection, SampledFlows: tc.sampled, QuietFlows: tc.quiet}
			if tc.udp {
				sp.Protocol = UDP
			}
			if got := events(sp); got != tc.want {
				t.Errorf("events = %q, want %q", got, tc.want)
			}
		})
	}
}
