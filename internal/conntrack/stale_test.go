package conntrack

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func ep(s string, ready, serving bool) model.Endpoint {
	a := ap(s)
	return model.Endpoint{IP: a.Addr(), Port: a.Port(), Ready: ready, Serving: serving}
}

// port builds a ServicePort; name doubles as the Service name.
func port(name string, proto model.Protocol, vip string, p, nodePort uint16, eps ...model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		Name:       model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: name}, Protocol: proto},
		Protocol:   proto,
		ClusterIPs: addrs(vip),
		Port:       p,
		NodePort:   nodePort,
		Endpoints:  eps,
	}
}

// flow builds a flow orig src->dst, reply from replySrc.
func flow(proto uint8, src, dst, replySrc string) Flow {
	fam := model.IPv4
	if ap(dst).Addr().Is6() {
		fam = model.IPv6
	}
	return Flow{Family: fam, Protocol: proto, OrigSrc: ap(src), OrigDst: ap(dst), ReplySrc: ap(replySrc), ReplyDst: ap(src)}
}

func testState() *model.State {
	dns := port("dns", model.UDP, "10.96.0.10", 53, 0, ep("10.0.0.1:5353", true, true), ep("10.0.0.2:5353", false, true))
	dnsTCP := port("dns", model.TCP, "10.96.0.10", 53, 0, ep("10.0.0.1:5353", true, true))
	empty := port("empty", model.UDP, "10.96.0.20", 53, 0)
	notServing := port("notserving", model.UDP, "10.96.0.21", 53, 0, ep("10.0.0.5:53", false, false))
	ext := port("ext", model.UDP, "10.96.0.30", 500, 30500, ep("10.0.0.3:500", true, true))
	ext.Type = model.TypeLoadBalancer
	ext.ExternalIPs = addrs("192.0.2.1")
	ext.LoadBalancerIPs = addrs("192.0.2.2")
	// A ClusterIP port numbered like ext's NodePort.
	clash := port("clash", model.UDP, "10.96.0.31", 30500, 0, ep("10.0.0.4:30500", true, true))
	shared1 := port("shared1", model.UDP, "10.96.0.40", 600, 0, ep("10.0.0.6:600", true, true))
	shared1.ExternalIPs = addrs("192.0.2.9")
	shared2 := port("shared2", model.UDP, "10.96.0.41", 600, 0, ep("10.0.0.7:600", true, true))
	shared2.ExternalIPs = addrs("192.0.2.9")
	sctp := port("sctp", model.SCTP, "10.96.0.50", 9000, 0, ep("10.0.0.8:9000", true, true))
	v6 := port("v6", model.UDP, "fd00:96::10", 53, 0, ep("[fd00::1]:53", true, true))
	return &model.State{Ports: []*model.ServicePort{dns, dnsTCP, empty, notServing, ext, clash, shared1, shared2, sctp, v6}}
}

func TestStale(t *testing.T) {
	tests := []struct {
		name  string
		flow  Flow
		opts  StaleOptions
		stale bool
	}{
		{"UDP to ClusterIP DNATed to a ready endpoint is kept", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", "10.0.0.1:5353"), StaleOptions{}, false},
		{"UDP to ClusterIP DNATed to a removed endpoint is stale", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", "10.0.0.9:5353"), StaleOptions{}, true},
		{"UDP DNATed to the endpoint's old port is stale", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", "10.0.0.1:53"), StaleOptions{}, true},
		{"serving but not ready (terminating) endpoint is kept", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", "10.0.0.2:5353"), StaleOptions{}, false},
		{"endpoint neither ready nor serving is stale", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.21:53", "10.0.0.5:53"), StaleOptions{}, true},
		{"TCP to a removed endpoint is left alone", flow(ProtoTCP, "10.1.0.1:40000", "10.96.0.10:53", "10.0.0.9:5353"), StaleOptions{}, false},
		{"ICMP is left alone", flow(1, "10.1.0.1:0", "10.96.0.10:0", "10.0.0.9:0"), StaleOptions{}, false},
		{"Service with zero endpoints: every flow stale", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.20:53", "10.0.0.1:5353"), StaleOptions{}, true},
		{"flow created without endpoints (reply from VIP) stale once endpoints exist", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:53", "10.96.0.10:53"), StaleOptions{}, true},
		{"flow to VIP on another port is left alone", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.10:54", "10.96.0.10:54"), StaleOptions{}, false},
		{"flow to unknown address is left alone", flow(ProtoUDP, "10.1.0.1:40000", "10.96.9.9:53", "10.0.0.9:53"), StaleOptions{}, false},
		{"externalIP flow to a removed endpoint is stale", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.1:500", "10.0.0.9:500"), StaleOptions{}, true},
		{"externalIP flow to the endpoint is kept", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.1:500", "10.0.0.3:500"), StaleOptions{}, false},
		{"load-balancer IP flow to a removed endpoint is stale", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.2:500", "10.0.0.9:500"), StaleOptions{}, true},
		{"NodePort flow to a removed endpoint is stale", flow(ProtoUDP, "203.0.113.1:40000", "172.16.0.1:30500", "10.0.0.9:500"), StaleOptions{}, true},
		{"NodePort flow to the endpoint is kept", flow(ProtoUDP, "203.0.113.1:40000", "172.16.0.1:30500", "10.0.0.3:500"), StaleOptions{}, false},
		{"NodePort flow not DNATed (reply from node) is stale", flow(ProtoUDP, "203.0.113.1:40000", "172.16.0.1:30500", "172.16.0.1:30500"), StaleOptions{}, true},
		{"NodePort flow to a non-NodePort address is left alone",
			flow(ProtoUDP, "203.0.113.1:40000", "198.51.100.7:30500", "10.0.0.9:500"),
			StaleOptions{IsNodePortAddress: func(a netip.Addr) bool { return a == netip.MustParseAddr("172.16.0.1") }}, false},
		{"NodePort flow on an accepted NodePort address is stale",
			flow(ProtoUDP, "203.0.113.1:40000", "172.16.0.1:30500", "10.0.0.9:500"),
			StaleOptions{IsNodePortAddress: func(a netip.Addr) bool { return a == netip.MustParseAddr("172.16.0.1") }}, true},
		{"ClusterIP port equal to another Service's NodePort is not judged as NodePort", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.31:30500", "10.0.0.4:30500"), StaleOptions{}, false},
		{"TCP NodePort-numbered flow is left alone", flow(ProtoTCP, "203.0.113.1:40000", "172.16.0.1:30500", "10.0.0.9:500"), StaleOptions{}, false},
		{"shared externalIP: endpoint of either Service is kept (1)", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.9:600", "10.0.0.6:600"), StaleOptions{}, false},
		{"shared externalIP: endpoint of either Service is kept (2)", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.9:600", "10.0.0.7:600"), StaleOptions{}, false},
		{"shared externalIP: other endpoint is stale", flow(ProtoUDP, "203.0.113.1:40000", "192.0.2.9:600", "10.0.0.8:600"), StaleOptions{}, true},
		{"SCTP to a removed endpoint is stale", flow(ProtoSCTP, "10.1.0.1:40000", "10.96.0.50:9000", "10.0.0.9:9000"), StaleOptions{}, true},
		{"SCTP to the endpoint is kept", flow(ProtoSCTP, "10.1.0.1:40000", "10.96.0.50:9000", "10.0.0.8:9000"), StaleOptions{}, false},
		{"UDP flow to an SCTP-only port is left alone", flow(ProtoUDP, "10.1.0.1:40000", "10.96.0.50:9000", "10.0.0.9:9000"), StaleOptions{}, false},
		{"IPv6 flow to a removed endpoint is stale", flow(ProtoUDP, "[fd00:1::1]:40000", "[fd00:96::10]:53", "[fd00::9]:53"), StaleOptions{}, true},
		{"IPv6 flow to the endpoint is kept", flow(ProtoUDP, "[fd00:1::1]:40000", "[fd00:96::10]:53", "[fd00::1]:53"), StaleOptions{}, false},
		{"IPv4-mapped addresses from the kernel are judged as IPv4", flow(ProtoUDP, "10.1.0.1:40000", "[::ffff:10.96.0.10]:53", "[::ffff:10.0.0.9]:5353"), StaleOptions{}, true},
	}
	st := testState()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Stale(st, []Flow{tc.flow}, tc.opts)
			if (len(got) == 1) != tc.stale || len(got) > 1 {
				t.Fatalf("Stale = %v, want stale=%v", got, tc.stale)
			}
			if tc.stale && got[0] != tc.flow {
				t.Errorf("returned %v, want the flow itself", got[0])
			}
		})
	}
}

func TestStaleKeepsOrderAndNilState(t *testing.T) {
	st := testState()
	a := flow(ProtoUDP, "10.1.0.1:1", "10.96.0.20:53", "10.0.0.1:5353")
	b := flow(ProtoUDP, "10.1.0.1:2", "10.96.0.10:53", "10.0.0.1:5353")
	c := flow(ProtoUDP, "10.1.0.1:3", "10.96.0.10:53", "10.0.0.9:5353")
	if got := Stale(st, []Flow{a, b, c}, StaleOptions{}); !slices.Equal(got, []Flow{a, c}) {
		t.Errorf("Stale = %v", got)
	}
	if got := Stale(nil, []Flow{a, b, c}, StaleOptions{}); len(got) != 0 {
		t.Errorf("nil State: %v", got)
	}
}
