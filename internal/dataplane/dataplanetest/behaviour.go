package dataplanetest

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Scenario is one State programmed on a fresh backend and the verdicts
// expected for a set of packets.
type Scenario struct {
	Name string
	// Options adjusts BaseOptions (nil: use them as they are).
	Options func(o *dataplane.Options)
	Ports   []*model.ServicePort
	Checks  []Check
}

// Check is one packet and the verdict expected for it.
type Check struct {
	Name   string
	Packet Packet
	Want   Verdict
}

// State returns the scenario's State.
func (s Scenario) State() *model.State { return NewState(s.Ports...) }

// Opts returns BaseOptions adjusted by s.Options.
func (s Scenario) Opts() dataplane.Options {
	o := BaseOptions()
	if s.Options != nil {
		s.Options(&o)
	}
	return o
}

// Packet constructors. Proto is set by the constructor; DstLocal is filled
// by RunBehaviour.
func pkt(proto model.Protocol, src, dst string, port uint16) Packet {
	return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, DstPort: port}
}

// TCP returns a TCP packet arriving at the node (prerouting).
func TCP(src, dst string, port uint16) Packet { return pkt(model.TCP, src, dst, port) }

// UDP returns a UDP packet arriving at the node (prerouting).
func UDP(src, dst string, port uint16) Packet { return pkt(model.UDP, src, dst, port) }

// SCTP returns an SCTP packet arriving at the node (prerouting).
func SCTP(src, dst string, port uint16) Packet { return pkt(model.SCTP, src, dst, port) }

// Local returns p as sent by a process on the node (output hook).
func (p Packet) Local() Packet { p.FromLocalNode = true; return p }

// DNATTo returns a DNAT verdict over eps ("ip:port"), all with the same
// masquerade decision.
func DNATTo(masq bool, eps ...string) Verdict {
	v := Verdict{Action: DNAT}
	for _, e := range eps {
		v.Targets = append(v.Targets, Target{Endpoint: netip.MustParseAddrPort(e), Masquerade: masq})
	}
	return v
}

// WithAffinity returns v with AffinitySeconds set.
func (v Verdict) WithAffinity(secs int) Verdict { v.AffinitySeconds = secs; return v }

// Verdicts without targets.
var (
	AcceptV = Verdict{Action: Accept}
	DropV   = Verdict{Action: Drop}
	RejectV = Verdict{Action: Reject}
)

// RunBehaviour runs every Scenario against backends made by newBackend.
// Each scenario runs twice: "cold" (a fresh backend, one full Sync) and
// "partial" (a fresh backend fully synced to a different State that
// reuses the scenario's Service names and addresses, then a non-full Sync
// to the scenario's State), so leftovers of partial syncs show up as
// wrong verdicts. newBackend must return a Dataplane and a Tracer reading
// that Dataplane's programmed rules.
func RunBehaviour(t *testing.T, newBackend func(t *testing.T, opts dataplane.Options) (dataplane.Dataplane, Tracer)) {
	t.Helper()
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			t.Run("cold", func(t *testing.T) {
				dp, tr := newBackend(t, sc.Opts())
				if err := dp.Sync(context.Background(), sc.State(), true); err != nil {
					t.Fatalf("Sync: %v", err)
				}
				runChecks(t, tr, sc.Checks)
			})
			t.Run("partial", func(t *testing.T) {
				dp, tr := newBackend(t, sc.Opts())
				if err := dp.Sync(context.Background(), NoiseState(), true); err != nil {
					t.Fatalf("Sync(noise): %v", err)
				}
				if err := dp.Sync(context.Background(), sc.State(), false); err != nil {
					t.Fatalf("Sync: %v", err)
				}
				runChecks(t, tr, append(append([]Check(nil), sc.Checks...), noiseGoneChecks...))
			})
		})
	}
}

func runChecks(t *testing.T, tr Tracer, checks []Check) {
	t.Helper()
	for _, c := range checks {
		p := c.Packet
		p.DstLocal = IsLocalAddr(p.Dst)
		got := tr.Trace(p).Normalize()
		want := c.Want.Normalize()
		if diff := cmp.Diff(want.String(), got.String()); diff != "" {
			t.Errorf("%s: %s: got %s, want %s", c.Name, p, got, want)
		}
	}
}

// NoiseState is the State the "partial" runs start from: it reuses
// default/web's name and ClusterIP with other ports and endpoints, and
// adds a Service (default/noise) no scenario has, with a NodePort,
// externalIP, LB IP with source ranges, and affinity.
func NoiseState() *model.State {
	web := Port("default/web", "http", model.TCP, 8080, "10.96.0.10", "fd00:96::10")
	web.Type = model.TypeNodePort
	web.NodePort = 30080
	web.AffinityTimeoutSeconds = 60
	web.ExternalTrafficPolicy = model.PolicyLocal
	web.Endpoints = []model.Endpoint{EP("10.1.9.9", 9999, false), EP("10.1.1.99", 9999, true), EP("fd00:10:1:9::9", 9999, false)}
	web80 := Port("default/web", "old", model.TCP, 80, "10.96.0.10", "fd00:96::10")
	web80.Endpoints = []model.Endpoint{EP("10.1.9.8", 9998, false), EP("fd00:10:1:9::8", 9998, false)}
	noise := Port("default/noise", "", model.UDP, 80, "10.96.0.200")
	noise.Type = model.TypeLoadBalancer
	noise.NodePort = 30999
	noise.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.200")}
	noise.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.201")}
	noise.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	noise.AffinityTimeoutSeconds = 30
	noise.Endpoints = []model.Endpoint{EP("10.1.9.7", 9997, false)}
	empty := Port("default/empty", "", model.TCP, 80, "10.96.0.201")
	return NewState(Fill(web), Fill(web80), Fill(noise), Fill(empty))
}

// noiseGoneChecks assert that NoiseState's default/noise and
// default/empty left nothing behind (no scenario uses their addresses).
var noiseGoneChecks = []Check{
	{"noise clusterIP gone", UDP("10.1.1.9", "10.96.0.200", 80), DropV},
	{"empty clusterIP gone", TCP("10.1.1.9", "10.96.0.201", 80), DropV},
	{"noise nodePort gone", UDP("203.0.113.7", "192.168.0.10", 30999), AcceptV},
	{"noise externalIP gone", UDP("203.0.113.7", "198.51.100.200", 80), AcceptV},
	{"noise LB IP gone", UDP("198.18.0.5", "198.51.100.201", 80), AcceptV},
}

// AllScenarioPorts returns one State holding every port of every scenario
// (the first of each name).
func AllScenarioPorts() *model.State {
	seen := map[string]bool{}
	var ports []*model.ServicePort
	for _, sc := range Scenarios() {
		for _, p := range sc.Ports {
			if !seen[p.Name.String()] {
				seen[p.Name.String()] = true
				ports = append(ports, p)
			}
		}
	}
	return NewState(ports...)
}

// Scenarios returns the behaviour scenarios. Backends may reuse them for
// golden tests.
func Scenarios() []Scenario {
	var out []Scenario

	// ClusterIP basics, unknown ports, unallocated addresses.
	{
		web := Port("default/web", "http", model.TCP, 80, "10.96.0.10")
		web.Endpoints = []model.Endpoint{EP("10.1.1.5", 8080, true), EP("10.1.2.5", 8080, false), EP("10.1.2.6", 8080, false)}
		all := []string{"10.1.1.5:8080", "10.1.2.5:8080", "10.1.2.6:8080"}
		out = append(out, Scenario{
			Name:  "clusterip-tcp",
			Ports: []*model.ServicePort{Fill(web)},
			Checks: []Check{
				{"pod reaches every endpoint without masquerade", TCP("10.1.1.9", "10.96.0.10", 80), DNATTo(false, all...)},
				{"remote pod not masqueraded", TCP("10.1.2.9", "10.96.0.10", 80), DNATTo(false, all...)},
				{"node traffic masqueraded", TCP("192.168.0.10", "10.96.0.10", 80).Local(), DNATTo(true, all...)},
				{"off-cluster source masqueraded", TCP("203.0.113.7", "10.96.0.10", 80), DNATTo(true, all...)},
				{"unknown port rejected", TCP("10.1.1.9", "10.96.0.10", 81), RejectV},
				{"other protocol rejected", UDP("10.1.1.9", "10.96.0.10", 80), RejectV},
				{"unknown port from node rejected", TCP("192.168.0.10", "10.96.0.10", 81).Local(), RejectV},
				{"unallocated service address dropped", TCP("10.1.1.9", "10.96.0.99", 80), DropV},
				{"unallocated service address dropped from node", TCP("192.168.0.10", "10.96.0.99", 80).Local(), DropV},
				{"outside service CIDR untouched", TCP("10.1.1.9", "10.97.0.10", 80), AcceptV},
				{"pod-to-pod untouched", TCP("10.1.1.9", "10.1.2.5", 8080), AcceptV},
				{"node port not opened", TCP("203.0.113.7", "192.168.0.10", 80), AcceptV},
			},
		})
	}
	{
		dns := Port("kube-system/dns", "dns", model.UDP, 53, "10.96.0.53")
		dns.Endpoints = []model.Endpoint{EP("10.1.2.10", 5353, false), EP("10.1.2.11", 5353, false)}
		dnsTCP := Port("kube-system/dns", "dns-tcp", model.TCP, 53, "10.96.0.53")
		dnsTCP.Endpoints = []model.Endpoint{EP("10.1.2.10", 5354, false)}
		out = append(out, Scenario{
			Name:  "clusterip-udp-and-tcp-same-port",
			Ports: []*model.ServicePort{Fill(dns), Fill(dnsTCP)},
			Checks: []Check{
				{"udp", UDP("10.1.1.9", "10.96.0.53", 53), DNATTo(false, "10.1.2.10:5353", "10.1.2.11:5353")},
				{"tcp", TCP("10.1.1.9", "10.96.0.53", 53), DNATTo(false, "10.1.2.10:5354")},
				{"udp from node", UDP("192.168.0.10", "10.96.0.53", 53).Local(), DNATTo(true, "10.1.2.10:5353", "10.1.2.11:5353")},
			},
		})
	}
	{
		http := Port("default/multi", "http", model.TCP, 80, "10.96.0.20")
		http.Endpoints = []model.Endpoint{EP("10.1.2.20", 8080, false)}
		https := Port("default/multi", "https", model.TCP, 443, "10.96.0.20")
		https.Endpoints = []model.Endpoint{EP("10.1.2.20", 8443, false), EP("10.1.2.21", 8443, false)}
		sctp := Port("default/multi", "diameter", model.SCTP, 3868, "10.96.0.20")
		sctp.Endpoints = []model.Endpoint{EP("10.1.2.22", 3868, false)}
		other := Port("default/other", "", model.TCP, 80, "10.96.0.21")
		other.Endpoints = []model.Endpoint{EP("10.1.2.30", 80, false)}
		out = append(out, Scenario{
			Name:  "multi-port",
			Ports: []*model.ServicePort{Fill(http), Fill(https), Fill(sctp), Fill(other)},
			Checks: []Check{
				{"port 80", TCP("10.1.1.9", "10.96.0.20", 80), DNATTo(false, "10.1.2.20:8080")},
				{"port 443", TCP("10.1.1.9", "10.96.0.20", 443), DNATTo(false, "10.1.2.20:8443", "10.1.2.21:8443")},
				{"sctp", SCTP("10.1.1.9", "10.96.0.20", 3868), DNATTo(false, "10.1.2.22:3868")},
				{"other service", TCP("10.1.1.9", "10.96.0.21", 80), DNATTo(false, "10.1.2.30:80")},
				{"other service port 443 rejected", TCP("10.1.1.9", "10.96.0.21", 443), RejectV},
				{"unused port rejected", TCP("10.1.1.9", "10.96.0.20", 8080), RejectV},
			},
		})
	}

	// NodePorts.
	nodePortSvc := func() *model.ServicePort {
		np := Port("default/np", "", model.TCP, 80, "10.96.0.30")
		np.Type = model.TypeNodePort
		np.NodePort = 30080
		np.Endpoints = []model.Endpoint{EP("10.1.1.30", 8080, true), EP("10.1.2.30", 8080, false)}
		return Fill(np)
	}
	npAll := []string{"10.1.1.30:8080", "10.1.2.30:8080"}
	out = append(out, Scenario{
		Name:  "nodeport-default-addresses",
		Ports: []*model.ServicePort{nodePortSvc()},
		Checks: []Check{
			{"external client on node IP, masqueraded", TCP("203.0.113.7", "192.168.0.10", 30080), DNATTo(true, npAll...)},
			{"pod to node IP nodeport masqueraded (ETP Cluster)", TCP("10.1.1.9", "192.168.0.10", 30080), DNATTo(true, npAll...)},
			{"node to own IP nodeport", TCP("192.168.0.10", "192.168.0.10", 30080).Local(), DNATTo(true, npAll...)},
			{"other local address is not a nodePortAddress", TCP("203.0.113.7", "10.250.0.1", 30080), AcceptV},
			{"never localhost", TCP("127.0.0.1", "127.0.0.1", 30080).Local(), AcceptV},
			{"non-local address untouched", TCP("203.0.113.7", "192.168.0.11", 30080), AcceptV},
			{"wrong protocol untouched", UDP("203.0.113.7", "192.168.0.10", 30080), AcceptV},
			{"clusterIP still works", TCP("10.1.1.9", "10.96.0.30", 80), DNATTo(false, npAll...)},
		},
	})
	out = append(out, Scenario{
		Name: "nodeport-addresses-prefix",
		Options: func(o *dataplane.Options) {
			o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}
		},
		Ports: []*model.ServicePort{nodePortSvc()},
		Checks: []Check{
			{"address inside nodePortAddresses", TCP("203.0.113.7", "10.250.0.1", 30080), DNATTo(true, npAll...)},
			{"primary IP outside nodePortAddresses", TCP("203.0.113.7", "192.168.0.10", 30080), AcceptV},
			{"non-local address in prefix untouched", TCP("203.0.113.7", "10.250.0.2", 30080), AcceptV},
			{"never localhost", TCP("127.0.0.1", "127.0.0.1", 30080).Local(), AcceptV},
		},
	})

	// externalIPs and load-balancer IPs with source ranges.
	{
		ext := Port("default/ext", "http", model.TCP, 80, "10.96.0.40")
		ext.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.10")}
		ext.Endpoints = []model.Endpoint{EP("10.1.2.40", 8080, false)}
		lb := Port("default/lb", "https", model.TCP, 443, "10.96.0.41")
		lb.Type = model.TypeLoadBalancer
		lb.NodePort = 30443
		lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.20")}
		lb.Endpoints = []model.Endpoint{EP("10.1.2.41", 8443, false)}
		fw := Port("default/fw", "", model.TCP, 80, "10.96.0.42")
		fw.Type = model.TypeLoadBalancer
		fw.NodePort = 30442
		fw.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.21")}
		fw.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.1.0.0/16")}
		fw.Endpoints = []model.Endpoint{EP("10.1.2.42", 8080, false)}
		out = append(out, Scenario{
			Name:  "external-and-loadbalancer-ips",
			Ports: []*model.ServicePort{Fill(ext), Fill(lb), Fill(fw)},
			Checks: []Check{
				{"externalIP from outside", TCP("203.0.113.7", "198.51.100.10", 80), DNATTo(true, "10.1.2.40:8080")},
				{"externalIP from pod (ETP Cluster masquerades)", TCP("10.1.1.9", "198.51.100.10", 80), DNATTo(true, "10.1.2.40:8080")},
				{"externalIP from node", TCP("192.168.0.10", "198.51.100.10", 80).Local(), DNATTo(true, "10.1.2.40:8080")},
				{"externalIP other port untouched", TCP("203.0.113.7", "198.51.100.10", 81), AcceptV},
				{"LB IP", TCP("203.0.113.7", "198.51.100.20", 443), DNATTo(true, "10.1.2.41:8443")},
				{"LB nodePort", TCP("203.0.113.7", "192.168.0.10", 30443), DNATTo(true, "10.1.2.41:8443")},
				{"source range allowed", TCP("203.0.113.7", "198.51.100.21", 80), DNATTo(true, "10.1.2.42:8080")},
				{"source range allowed pod", TCP("10.1.1.9", "198.51.100.21", 80), DNATTo(true, "10.1.2.42:8080")},
				{"source range denied", TCP("198.18.0.5", "198.51.100.21", 80), DropV},
				{"source ranges do not apply to the nodePort", TCP("198.18.0.5", "192.168.0.10", 30442), DNATTo(true, "10.1.2.42:8080")},
				{"source ranges do not apply to the clusterIP", TCP("198.18.0.5", "10.96.0.42", 80), DNATTo(true, "10.1.2.42:8080")},
				{"unfiltered LB IP from denied-elsewhere client", TCP("198.18.0.5", "198.51.100.20", 443), DNATTo(true, "10.1.2.41:8443")},
			},
		})
	}

	// No endpoints.
	{
		none := Port("default/none", "", model.TCP, 80, "10.96.0.50")
		none.Type = model.TypeLoadBalancer
		none.NodePort = 30050
		none.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.50")}
		none.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.51")}
		notReady := Port("default/notready", "", model.UDP, 53, "10.96.0.51")
		nr := EP("10.1.2.51", 53, false)
		nr.Ready, nr.Serving = false, false
		notReady.Endpoints = []model.Endpoint{nr}
		out = append(out, Scenario{
			Name:  "no-endpoints-reject",
			Ports: []*model.ServicePort{Fill(none), Fill(notReady)},
			Checks: []Check{
				{"clusterIP", TCP("10.1.1.9", "10.96.0.50", 80), RejectV},
				{"clusterIP from node", TCP("192.168.0.10", "10.96.0.50", 80).Local(), RejectV},
				{"nodePort", TCP("203.0.113.7", "192.168.0.10", 30050), RejectV},
				{"externalIP", TCP("203.0.113.7", "198.51.100.50", 80), RejectV},
				{"LB IP", TCP("203.0.113.7", "198.51.100.51", 80), RejectV},
				{"only unready endpoints", UDP("10.1.1.9", "10.96.0.51", 53), RejectV},
			},
		})
	}

	// Traffic policies.
	{
		itp := Port("default/itp", "", model.TCP, 80, "10.96.0.60")
		itp.InternalTrafficPolicy = model.PolicyLocal
		itp.Endpoints = []model.Endpoint{EP("10.1.2.60", 8080, false)}
		itpLocal := Port("default/itp-local", "", model.TCP, 80, "10.96.0.61")
		itpLocal.InternalTrafficPolicy = model.PolicyLocal
		itpLocal.Endpoints = []model.Endpoint{EP("10.1.1.61", 8080, true), EP("10.1.2.61", 8080, false)}
		itpNP := Port("default/itp-np", "", model.TCP, 80, "10.96.0.62")
		itpNP.InternalTrafficPolicy = model.PolicyLocal
		itpNP.Type = model.TypeNodePort
		itpNP.NodePort = 30062
		itpNP.Endpoints = []model.Endpoint{EP("10.1.2.62", 8080, false)}
		out = append(out, Scenario{
			Name:  "internal-traffic-policy-local",
			Ports: []*model.ServicePort{Fill(itp), Fill(itpLocal), Fill(itpNP)},
			Checks: []Check{
				{"no local endpoint: drop", TCP("10.1.1.9", "10.96.0.60", 80), DropV},
				{"no local endpoint from node: drop", TCP("192.168.0.10", "10.96.0.60", 80).Local(), DropV},
				{"local endpoint only", TCP("10.1.1.9", "10.96.0.61", 80), DNATTo(false, "10.1.1.61:8080")},
				{"clusterIP of ITP Local nodePort service drops", TCP("10.1.1.9", "10.96.0.62", 80), DropV},
				{"its nodePort uses cluster endpoints", TCP("203.0.113.7", "192.168.0.10", 30062), DNATTo(true, "10.1.2.62:8080")},
			},
		})
	}
	{
		local := Port("default/etp", "", model.TCP, 80, "10.96.0.70")
		local.Type = model.TypeLoadBalancer
		local.NodePort = 30070
		local.ExternalTrafficPolicy = model.PolicyLocal
		local.HealthCheckNodePort = 32070
		local.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.70")}
		local.Endpoints = []model.Endpoint{EP("10.1.1.70", 8080, true), EP("10.1.2.70", 8080, false)}
		noLocal := Port("default/etp-remote", "", model.TCP, 80, "10.96.0.71")
		noLocal.Type = model.TypeNodePort
		noLocal.NodePort = 30071
		noLocal.ExternalTrafficPolicy = model.PolicyLocal
		noLocal.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.71")}
		noLocal.Endpoints = []model.Endpoint{EP("10.1.2.71", 8080, false)}
		out = append(out, Scenario{
			Name:  "external-traffic-policy-local",
			Ports: []*model.ServicePort{Fill(local), Fill(noLocal)},
			Checks: []Check{
				{"nodePort keeps client IP, local endpoint only", TCP("203.0.113.7", "192.168.0.10", 30070), DNATTo(false, "10.1.1.70:8080")},
				{"LB IP keeps client IP", TCP("203.0.113.7", "198.51.100.70", 80), DNATTo(false, "10.1.1.70:8080")},
				{"clusterIP uses cluster endpoints", TCP("10.1.1.9", "10.96.0.70", 80), DNATTo(false, "10.1.1.70:8080", "10.1.2.70:8080")},
				{"pod to LB IP short-circuits to cluster endpoints", TCP("10.1.1.9", "198.51.100.70", 80), DNATTo(false, "10.1.1.70:8080", "10.1.2.70:8080")},
				{"node to LB IP masquerades to cluster endpoints", TCP("192.168.0.10", "198.51.100.70", 80).Local(), DNATTo(true, "10.1.1.70:8080", "10.1.2.70:8080")},
				{"no local endpoint: nodePort drops", TCP("203.0.113.7", "192.168.0.10", 30071), DropV},
				{"no local endpoint: externalIP drops", TCP("203.0.113.7", "198.51.100.71", 80), DropV},
				{"no local endpoint: pod still reaches cluster endpoints", TCP("10.1.1.9", "198.51.100.71", 80), DNATTo(false, "10.1.2.71:8080")},
				{"no local endpoint: clusterIP works", TCP("10.1.1.9", "10.96.0.71", 80), DNATTo(false, "10.1.2.71:8080")},
			},
		})
	}
	out = append(out, Scenario{
		Name:    "masquerade-all",
		Options: func(o *dataplane.Options) { o.MasqueradeAll = true },
		Ports:   []*model.ServicePort{nodePortSvc()},
		Checks: []Check{
			{"pod to clusterIP masqueraded", TCP("10.1.1.9", "10.96.0.30", 80), DNATTo(true, npAll...)},
			{"node to clusterIP masqueraded", TCP("192.168.0.10", "10.96.0.30", 80).Local(), DNATTo(true, npAll...)},
			{"nodePort masqueraded", TCP("203.0.113.7", "192.168.0.10", 30080), DNATTo(true, npAll...)},
		},
	})
	out = append(out, Scenario{
		Name:    "no-local-detection",
		Options: func(o *dataplane.Options) { o.ClusterCIDRs = nil },
		Ports:   []*model.ServicePort{nodePortSvc()},
		Checks: []Check{
			// As kube-proxy: without a cluster CIDR pod traffic cannot be
			// told apart, and ClusterIP traffic is not masqueraded at all.
			{"pod to clusterIP keeps its source", TCP("10.1.1.9", "10.96.0.30", 80), DNATTo(false, npAll...)},
			{"external to clusterIP not masqueraded either", TCP("203.0.113.7", "10.96.0.30", 80), DNATTo(false, npAll...)},
			{"NodePort with externalTrafficPolicy Cluster still masqueraded", TCP("203.0.113.7", "192.168.0.10", 30080), DNATTo(true, npAll...)},
		},
	})
	{
		hp := Port("default/hairpin", "", model.TCP, 80, "10.96.0.80")
		hp.Endpoints = []model.Endpoint{EP("10.1.1.80", 8080, true), EP("10.1.2.80", 8080, false)}
		out = append(out, Scenario{
			Name:  "hairpin",
			Ports: []*model.ServicePort{Fill(hp)},
			Checks: []Check{
				{"endpoint reaching itself is masqueraded", TCP("10.1.1.80", "10.96.0.80", 80), Verdict{Action: DNAT, Targets: []Target{
					{netip.MustParseAddrPort("10.1.1.80:8080"), true}, {netip.MustParseAddrPort("10.1.2.80:8080"), false}}}},
				{"other pod not masqueraded", TCP("10.1.1.9", "10.96.0.80", 80), DNATTo(false, "10.1.1.80:8080", "10.1.2.80:8080")},
			},
		})
	}
	{
		term := Port("default/term", "", model.TCP, 80, "10.96.0.90")
		term.Endpoints = []model.Endpoint{TermEP("10.1.2.90", 8080, false), TermEP("10.1.2.91", 8080, false)}
		mixed := Port("default/mixed", "", model.TCP, 80, "10.96.0.91")
		mixed.Endpoints = []model.Endpoint{TermEP("10.1.2.92", 8080, false), EP("10.1.2.93", 8080, false)}
		out = append(out, Scenario{
			Name:  "terminating-fallback",
			Ports: []*model.ServicePort{Fill(term), Fill(mixed)},
			Checks: []Check{
				{"only terminating: use them", TCP("10.1.1.9", "10.96.0.90", 80), DNATTo(false, "10.1.2.90:8080", "10.1.2.91:8080")},
				{"ready ones preferred", TCP("10.1.1.9", "10.96.0.91", 80), DNATTo(false, "10.1.2.93:8080")},
			},
		})
	}
	{
		aff := Port("default/sticky", "", model.TCP, 80, "10.96.0.100")
		aff.Type = model.TypeNodePort
		aff.NodePort = 30100
		aff.AffinityTimeoutSeconds = 10800
		aff.Endpoints = []model.Endpoint{EP("10.1.2.100", 8080, false), EP("10.1.2.101", 8080, false)}
		short := Port("default/sticky-short", "", model.UDP, 53, "10.96.0.101")
		short.AffinityTimeoutSeconds = 2
		short.Endpoints = []model.Endpoint{EP("10.1.2.102", 53, false)}
		out = append(out, Scenario{
			Name:  "session-affinity",
			Ports: []*model.ServicePort{Fill(aff), Fill(short)},
			Checks: []Check{
				{"clusterIP", TCP("10.1.1.9", "10.96.0.100", 80), DNATTo(false, "10.1.2.100:8080", "10.1.2.101:8080").WithAffinity(10800)},
				{"nodePort", TCP("203.0.113.7", "192.168.0.10", 30100), DNATTo(true, "10.1.2.100:8080", "10.1.2.101:8080").WithAffinity(10800)},
				{"short timeout", UDP("10.1.1.9", "10.96.0.101", 53), DNATTo(false, "10.1.2.102:53").WithAffinity(2)},
			},
		})
	}
	{
		// Per-Service balancing (model.Balance) and endpoint weights change
		// how often each endpoint is picked, never which ones can be.
		rr := Port("default/rr", "", model.TCP, 80, "10.96.0.120")
		rr.Type = model.TypeNodePort
		rr.NodePort = 30120
		rr.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.120")}
		rr.Balance = model.BalanceRoundRobin
		rr.OutlierEjection = true // and vipproxy reads nothing else:
		rr.SampledFlows = true    // its chains report a sample of flows
		rr.Endpoints = []model.Endpoint{EP("10.1.2.120", 8080, false), EP("10.1.2.121", 8080, false), EP("10.1.1.122", 8080, true)}
		rr.Endpoints[0].Weight = 3
		hash := Port("default/hash", "", model.TCP, 80, "10.96.0.123", "fd00:96::123")
		hash.Type = model.TypeNodePort
		hash.NodePort = 30123
		hash.ExternalTrafficPolicy = model.PolicyLocal
		hash.Balance = model.BalanceConsistentHash
		hash.OutlierEjection = true // its chains limit the conntrack events
		hash.Endpoints = []model.Endpoint{EP("10.1.1.124", 8080, true), EP("10.1.2.125", 8080, false), EP("fd00:10:1:2::123", 8080, false)}
		hash.Endpoints[0].Weight = 2
		weighted := Port("default/weighted", "", model.UDP, 53, "10.96.0.126")
		weighted.AffinityTimeoutSeconds = 60
		weighted.Balance = model.BalanceRandom
		weighted.OutlierEjection = true // UDP: events not read,
		weighted.QuietFlows = true      // so none reported
		weighted.Endpoints = []model.Endpoint{EP("10.1.2.126", 53, false), EP("10.1.2.127", 53, false)}
		weighted.Endpoints[1].Weight = 100
		out = append(out, Scenario{
			Name:  "balancing",
			Ports: []*model.ServicePort{Fill(rr), Fill(hash), Fill(weighted)},
			Checks: []Check{
				{"round-robin clusterIP", TCP("10.1.1.9", "10.96.0.120", 80), DNATTo(false, "10.1.1.122:8080", "10.1.2.120:8080", "10.1.2.121:8080")},
				{"round-robin nodePort", TCP("203.0.113.7", "192.168.0.10", 30120), DNATTo(true, "10.1.1.122:8080", "10.1.2.120:8080", "10.1.2.121:8080")},
				{"round-robin externalIP", TCP("203.0.113.7", "198.51.100.120", 80), DNATTo(true, "10.1.1.122:8080", "10.1.2.120:8080", "10.1.2.121:8080")},
				{"consistent-hash clusterIP", TCP("10.1.1.9", "10.96.0.123", 80), DNATTo(false, "10.1.1.124:8080", "10.1.2.125:8080")},
				{"consistent-hash nodePort, Local", TCP("203.0.113.7", "192.168.0.10", 30123), DNATTo(false, "10.1.1.124:8080")},
				{"consistent-hash v6 clusterIP", TCP("fd00:10:1:1::9", "fd00:96::123", 80), DNATTo(false, "[fd00:10:1:2::123]:8080")},
				{"weighted with affinity", UDP("10.1.1.9", "10.96.0.126", 53), DNATTo(false, "10.1.2.126:53", "10.1.2.127:53").WithAffinity(60)},
			},
		})
	}
	{
		v6 := Port("default/web6", "", model.TCP, 80, "fd00:96::10")
		v6.Type = model.TypeNodePort
		v6.NodePort = 30600
		v6.Endpoints = []model.Endpoint{EP("fd00:10:1:1::5", 8080, true), EP("fd00:10:1:2::5", 8080, false)}
		none6 := Port("default/none6", "", model.UDP, 53, "fd00:96::11")
		ds := Port("default/dual", "", model.TCP, 80, "10.96.0.110", "fd00:96::110")
		ds.Endpoints = []model.Endpoint{EP("10.1.2.110", 8080, false), EP("fd00:10:1:2::110", 8080, false)}
		all6 := []string{"[fd00:10:1:1::5]:8080", "[fd00:10:1:2::5]:8080"}
		out = append(out, Scenario{
			Name:  "ipv6-and-dual-stack",
			Ports: []*model.ServicePort{Fill(v6), Fill(none6), Fill(ds)},
			Checks: []Check{
				{"pod to v6 clusterIP", TCP("fd00:10:1:1::9", "fd00:96::10", 80), DNATTo(false, all6...)},
				{"node to v6 clusterIP", TCP("fd00:192::10", "fd00:96::10", 80).Local(), DNATTo(true, all6...)},
				{"v6 nodePort", TCP("2001:db8::7", "fd00:192::10", 30600), DNATTo(true, all6...)},
				{"v6 nodePort not on v4 node IP", TCP("203.0.113.7", "192.168.0.10", 30600), AcceptV},
				{"v6 nodePort never on ::1", TCP("::1", "::1", 30600).Local(), AcceptV},
				{"v6 no endpoints reject", UDP("fd00:10:1:1::9", "fd00:96::11", 53), RejectV},
				{"v6 unknown port reject", TCP("fd00:10:1:1::9", "fd00:96::10", 81), RejectV},
				{"v6 unallocated drop", TCP("fd00:10:1:1::9", "fd00:96::99", 80), DropV},
				{"dual-stack v4 VIP reaches v4 endpoints only", TCP("10.1.1.9", "10.96.0.110", 80), DNATTo(false, "10.1.2.110:8080")},
				{"dual-stack v6 VIP reaches v6 endpoints only", TCP("fd00:10:1:1::9", "fd00:96::110", 80), DNATTo(false, "[fd00:10:1:2::110]:8080")},
			},
		})
	}
	return out
}
