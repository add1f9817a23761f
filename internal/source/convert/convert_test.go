package convert

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipproxy/vipproxy/internal/model"
)

var cmpOpts = []cmp.Option{cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}), cmpopts.EquateEmpty()}

func ptr[T any](v T) *T { return &v }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// baseService is a valid ClusterIP Service default/web with one TCP port.
func baseService(mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80}},
		},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

// baseModel is what baseService converts to.
func baseModel(mod func(*model.Service)) model.Service {
	s := model.Service{
		ServiceName:           model.ServiceName{Namespace: "default", Name: "web"},
		Type:                  model.TypeClusterIP,
		ClusterIPs:            addrs("10.96.0.10"),
		IPFamilies:            []model.AddressType{model.IPv4},
		ExternalTrafficPolicy: model.PolicyCluster,
		InternalTrafficPolicy: model.PolicyCluster,
		Ports:                 []model.ServicePortSpec{{Name: "http", Protocol: model.TCP, Port: 80}},
	}
	if mod != nil {
		mod(&s)
	}
	return s
}

// fieldValues reduces Problems to "field=value" strings and checks that
// every Problem names the object.
func fieldValues(t *testing.T, object string, ps []model.Problem) []string {
	t.Helper()
	var out []string
	for _, p := range ps {
		if p.Object != object {
			t.Errorf("problem %v names object %q, want %q", p, p.Object, object)
		}
		if p.Reason == "" {
			t.Errorf("problem %v has no reason", p)
		}
		out = append(out, p.Field+"="+p.Value)
	}
	return out
}

func TestService(t *testing.T) {
	tests := []struct {
		name     string
		in       *corev1.Service
		want     *model.Service // nil: refused
		problems []string
	}{
		{name: "minimal ClusterIP", in: baseService(nil), want: ptr(baseModel(nil))},
		{
			name: "balancing annotation",
			in: baseService(func(s *corev1.Service) {
				s.Annotations = map[string]string{model.AnnotationBalance: "consistent-hash"}
			}),
			want: ptr(baseModel(func(m *model.Service) { m.Balance = model.BalanceConsistentHash })),
		},
		{
			name: "slow start, ejection",
			in: baseService(func(s *corev1.Service) {
				s.Annotations = map[string]string{model.AnnotationSlowStart: "30s", model.AnnotationOutlierEjection: "on", model.AnnotationDrain: "reset-after=45s"}
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.SlowStart, m.OutlierEjection, m.DrainReset = 30*time.Second, "on", 45*time.Second
			})),
		},
		{
			name: "bad slow start and ejection values: Problems, Service kept",
			in: baseService(func(s *corev1.Service) {
				s.Annotations = map[string]string{model.AnnotationSlowStart: "2h", model.AnnotationOutlierEjection: "yes", model.AnnotationDrain: "reset"}
			}),
			want:     ptr(baseModel(nil)),
			problems: []string{"metadata.annotations[vipproxy.io/slow-start]=2h", "metadata.annotations[vipproxy.io/drain]=reset", "metadata.annotations[vipproxy.io/outlier-ejection]=yes"},
		},
		{
			name: "unknown balancing: default, Service kept",
			in: baseService(func(s *corev1.Service) {
				s.Annotations = map[string]string{model.AnnotationBalance: "least-conn"}
			}),
			want:     ptr(baseModel(nil)),
			problems: []string{"metadata.annotations[vipproxy.io/lb-algorithm]=least-conn"},
		},
		{
			name:     "clusterIP only, leading zeros read as decimal with a warning",
			in:       baseService(func(s *corev1.Service) { s.Spec.ClusterIPs = nil; s.Spec.ClusterIP = "010.096.000.010" }),
			want:     ptr(baseModel(nil)),
			problems: []string{"spec.clusterIP=010.096.000.010"},
		},
		{
			name: "dual stack, IPv6 lower-cased",
			in: baseService(func(s *corev1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "FD00::A"}
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
				s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyRequireDualStack)
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.ClusterIPs = addrs("10.96.0.10", "fd00::a")
				m.IPFamilies = []model.AddressType{model.IPv4, model.IPv6}
				m.IPFamilyPolicy = "RequireDualStack"
			})),
		},
		{
			name: "no cluster IP left for the allocator",
			in: baseService(func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
				s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyPreferDualStack)
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.ClusterIPs = nil
				m.IPFamilies = []model.AddressType{model.IPv6}
				m.IPFamilyPolicy = "PreferDualStack"
			})),
		},
		{
			name: "headless without ports",
			in: baseService(func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.Ports = "None", []string{"None"}, nil
			}),
			want: ptr(baseModel(func(m *model.Service) { m.ClusterIPs, m.IPFamilies, m.Headless, m.Ports = nil, nil, true, nil })),
		},
		{
			name: "ExternalName ignores everything else",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeExternalName
				s.Spec.ExternalName = "example.com"
				s.Spec.ClusterIPs = []string{"bogus"}
			}),
			want: &model.Service{ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Type: model.TypeExternalName},
		},
		{
			name: "LoadBalancer with everything",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 80, NodePort: 30080},
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053},
					{Name: "sctp", Port: 9999, Protocol: corev1.ProtocolSCTP},
				}
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:DB8::1"}
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.7/24", " 2001:db8::/32 "}
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
				s.Spec.TrafficDistribution = ptr("PreferClose")
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.51.100.1"},
					{IP: "198.51.100.2", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
					{IP: "198.51.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
				}
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.Type = model.TypeLoadBalancer
				m.Ports = []model.ServicePortSpec{
					{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080},
					{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053},
					{Name: "sctp", Protocol: model.SCTP, Port: 9999},
				}
				m.ExternalIPs = addrs("192.0.2.1", "2001:db8::1")
				m.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}
				m.ExternalTrafficPolicy = model.PolicyLocal
				m.InternalTrafficPolicy = model.PolicyLocal
				m.HealthCheckNodePort = 32000
				m.AffinityTimeoutSeconds = 60
				m.TrafficDistribution = "PreferClose"
				m.LoadBalancerIPs = addrs("198.51.100.1", "198.51.100.2")
			})),
		},
		{
			name: "ClientIP affinity default timeout",
			in:   baseService(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
			want: ptr(baseModel(func(m *model.Service) { m.AffinityTimeoutSeconds = model.DefaultAffinityTimeoutSecs })),
		},
		{
			name: "source ranges from the legacy annotation",
			in: baseService(func(s *corev1.Service) {
				s.Annotations = map[string]string{annotationLBSourceRanges: "10.0.0.0/8, 192.168.1.1/32,bad"}
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32")}
			})),
			problems: []string{"metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges][2]=bad"},
		},
		{
			name: "non-fatal: bad externalIP, source range and ingress entries dropped",
			in: baseService(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.2.300", "fe80::1%eth0"}
				s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33", "10.0.0.0", "10.0.0.0/8"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "nope"}, {IP: "198.51.100.9", IPMode: ptr(corev1.LoadBalancerIPMode("Weird"))}, {IP: "198.51.100.1"}}
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.ExternalIPs = addrs("192.0.2.1")
				m.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
				m.LoadBalancerIPs = addrs("198.51.100.1")
			})),
			problems: []string{
				"spec.externalIPs[1]=192.0.2.300", "spec.externalIPs[2]=fe80::1%eth0",
				"spec.loadBalancerSourceRanges[0]=10.0.0.0/33", "spec.loadBalancerSourceRanges[1]=10.0.0.0",
				"status.loadBalancer.ingress[0].ip=nope", "status.loadBalancer.ingress[1].ipMode=Weird",
			},
		},
		{name: "no name", in: baseService(func(s *corev1.Service) { s.Name = "" }), problems: []string{"metadata.name="}},
		{name: "bad type", in: baseService(func(s *corev1.Service) { s.Spec.Type = "Magic" }), problems: []string{"spec.type=Magic"}},
		{name: "bad clusterIP", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIPs = nil; s.Spec.ClusterIP = "10.96.0.256" }), problems: []string{"spec.clusterIP=10.96.0.256"}},
		{name: "bad clusterIPs entry", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIP = ""; s.Spec.ClusterIPs = []string{"10.96.0.1", "xyz"} }), problems: []string{"spec.clusterIPs[1]=xyz"}},
		{name: "clusterIP disagrees with clusterIPs", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIP = "10.96.0.11" }), problems: []string{"spec.clusterIP=10.96.0.11"}},
		{name: "unspecified clusterIP", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIP = ""; s.Spec.ClusterIPs = []string{"0.0.0.0"} }), problems: []string{"spec.clusterIPs[0]=0.0.0.0"}},
		{name: "multicast clusterIP", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIP = ""; s.Spec.ClusterIPs = []string{"ff02::1"} }), problems: []string{"spec.clusterIPs[0]=ff02::1"}},
		{
			name: "loopback clusterIP allowed (userspace VIP range)",
			in:   baseService(func(s *corev1.Service) { s.Spec.ClusterIP = ""; s.Spec.ClusterIPs = []string{"127.0.100.1"} }),
			want: ptr(baseModel(func(m *model.Service) { m.ClusterIPs = addrs("127.0.100.1") })),
		},
		{name: "two IPv4 clusterIPs", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "10.96.0.11"} }), problems: []string{"spec.clusterIPs[1]=10.96.0.11"}},
		{name: "three clusterIPs", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::1", "10.0.0.1"} }), problems: []string{"spec.clusterIPs=10.96.0.10,fd00::1,10.0.0.1"}},
		{name: "None plus an IP", in: baseService(func(s *corev1.Service) { s.Spec.ClusterIP = "None"; s.Spec.ClusterIPs = []string{"None", "fd00::1"} }), problems: []string{"spec.clusterIPs=None,fd00::1"}},
		{name: "bad ipFamilies", in: baseService(func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{"IPv5"} }), problems: []string{"spec.ipFamilies[0]=IPv5"}},
		{name: "ipFamilies disagree with clusterIP", in: baseService(func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }), problems: []string{"spec.ipFamilies[0]=IPv6"}},
		{name: "duplicate ipFamilies", in: baseService(func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{"IPv4", "IPv4"} }), problems: []string{"spec.ipFamilies[1]=IPv4"}},
		{name: "bad ipFamilyPolicy", in: baseService(func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicy("Sometimes")) }), problems: []string{"spec.ipFamilyPolicy=Sometimes"}},
		{name: "no ports", in: baseService(func(s *corev1.Service) { s.Spec.Ports = nil }), problems: []string{"spec.ports="}},
		{
			name: "bad port number",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 80}, {Name: "b", Port: 70000}}
			}),
			problems: []string{"spec.ports[1].port=70000"},
		},
		{name: "zero port", in: baseService(func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }), problems: []string{"spec.ports[0].port=0"}},
		{name: "bad protocol", in: baseService(func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }), problems: []string{"spec.ports[0].protocol=ICMP"}},
		{
			name: "duplicate port name",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 80}, {Name: "a", Port: 81}}
			}),
			problems: []string{"spec.ports[1].name=a"},
		},
		{
			name: "unnamed port among several",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Port: 80}, {Name: "b", Port: 81}}
			}),
			problems: []string{"spec.ports[0].name="},
		},
		{
			name: "duplicate port and protocol",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 80}, {Name: "b", Port: 80, Protocol: "TCP"}}
			}),
			problems: []string{"spec.ports[1]=80/TCP"},
		},
		{
			name: "same port, other protocol is fine",
			in: baseService(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 53}, {Name: "b", Port: 53, Protocol: "UDP"}}
			}),
			want: ptr(baseModel(func(m *model.Service) {
				m.Ports = []model.ServicePortSpec{{Name: "a", Protocol: model.TCP, Port: 53}, {Name: "b", Protocol: model.UDP, Port: 53}}
			})),
		},
		{name: "nodePort out of range", in: baseService(func(s *corev1.Service) { s.Spec.Type = "NodePort"; s.Spec.Ports[0].NodePort = 65536 }), problems: []string{"spec.ports[0].nodePort=65536"}},
		{name: "nodePort on ClusterIP", in: baseService(func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30000 }), problems: []string{"spec.ports[0].nodePort=30000"}},
		{name: "bad sessionAffinity", in: baseService(func(s *corev1.Service) { s.Spec.SessionAffinity = "Sticky" }), problems: []string{"spec.sessionAffinity=Sticky"}},
		{
			name: "affinity timeout too long",
			in: baseService(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(86401))}}
			}),
			problems: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds=86401"},
		},
		{name: "bad externalTrafficPolicy", in: baseService(func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = "Global" }), problems: []string{"spec.externalTrafficPolicy=Global"}},
		{name: "bad internalTrafficPolicy", in: baseService(func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicy("Node"))
		}), problems: []string{"spec.internalTrafficPolicy=Node"}},
		{name: "bad healthCheckNodePort", in: baseService(func(s *corev1.Service) { s.Spec.HealthCheckNodePort = -1 }), problems: []string{"spec.healthCheckNodePort=-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ps := Service(tc.in)
			gotProblems := fieldValues(t, "Service "+tc.in.Namespace+"/"+tc.in.Name, ps)
			if diff := cmp.Diff(tc.problems, gotProblems, cmpOpts...); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			if tc.want == nil {
				if got.Name != "" || len(ps) == 0 {
					t.Fatalf("want refusal with problems, got %+v, %v", got, ps)
				}
				return
			}
			if diff := cmp.Diff(*tc.want, got, cmpOpts...); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProxied(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"no labels", nil, true},
		{"unrelated label", map[string]string{"app": "web"}, true},
		{"service-proxy-name", map[string]string{model.LabelServiceProxyName: "other-proxy"}, false},
		{"service-proxy-name empty value", map[string]string{model.LabelServiceProxyName: ""}, false},
		{"headless", map[string]string{model.LabelHeadless: ""}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Proxied(baseService(func(s *corev1.Service) { s.Labels = tc.labels })); got != tc.want {
				t.Errorf("Proxied = %v, want %v", got, tc.want)
			}
		})
	}
	if Proxied(nil) {
		t.Error("Proxied(nil) = true")
	}
}

func baseSlice(mod func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "web-abc",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
	if mod != nil {
		mod(es)
	}
	return es
}

func baseSliceModel(mod func(*model.EndpointSlice)) model.EndpointSlice {
	es := model.EndpointSlice{
		Name:        "web-abc",
		Service:     model.ServiceName{Namespace: "default", Name: "web"},
		AddressType: model.IPv4,
		Ports:       []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}},
		Endpoints:   []model.SliceEndpoint{{Address: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true}},
	}
	if mod != nil {
		mod(&es)
	}
	return es
}

func TestEndpointSlice(t *testing.T) {
	tests := []struct {
		name     string
		in       *discoveryv1.EndpointSlice
		want     model.EndpointSlice // zero: ignored or refused
		problems []string
	}{
		{name: "minimal, conditions defaulted", in: baseSlice(nil), want: baseSliceModel(nil)},
		{
			// Locations are reused from one endpoint to the next only
			// when both node and zone are the same.
			name: "locations",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				at := func(ip string, node, zone *string) discoveryv1.Endpoint {
					return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: node, Zone: zone}
				}
				es.Endpoints = []discoveryv1.Endpoint{
					at("10.0.0.1", ptr("a"), ptr("x")), at("10.0.0.2", ptr("a"), ptr("y")), at("10.0.0.3", ptr("b"), ptr("y")),
					at("10.0.0.4", ptr("b"), ptr("y")), at("10.0.0.5", nil, nil), at("10.0.0.6", ptr("b"), nil),
				}
			}),
			want: baseSliceModel(func(m *model.EndpointSlice) {
				at := func(ip, node, zone string) model.SliceEndpoint {
					return model.SliceEndpoint{Address: netip.MustParseAddr(ip), Ready: true, Serving: true, Loc: model.At(node, zone)}
				}
				m.Endpoints = []model.SliceEndpoint{
					at("10.0.0.1", "a", "x"), at("10.0.0.2", "a", "y"), at("10.0.0.3", "b", "y"),
					at("10.0.0.4", "b", "y"), at("10.0.0.5", "", ""), at("10.0.0.6", "b", ""),
				}
			}),
		},
		{
			name: "every field",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.AddressType = discoveryv1.AddressTypeIPv6
				es.Ports = []discoveryv1.EndpointPort{{Port: ptr(int32(53)), Protocol: ptr(corev1.ProtocolUDP)}, {Name: ptr("s"), Port: ptr(int32(9)), Protocol: ptr(corev1.ProtocolSCTP)}, {Name: ptr("t"), Port: ptr(int32(10))}}
				es.Endpoints = []discoveryv1.Endpoint{{
					Addresses:  []string{"FD00::0001"},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)},
					NodeName:   ptr("node-a"),
					Zone:       ptr("zone-a"),
					Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}},
				}}
			}),
			want: baseSliceModel(func(m *model.EndpointSlice) {
				m.AddressType = model.IPv6
				m.Ports = []model.EndpointPort{{Protocol: model.UDP, Port: 53}, {Name: "s", Protocol: model.SCTP, Port: 9}, {Name: "t", Protocol: model.TCP, Port: 10}}
				m.Endpoints = []model.SliceEndpoint{{
					Address: netip.MustParseAddr("fd00::1"), Ready: false, Serving: true, Terminating: true,
					Loc: model.At("node-a", "zone-a").WithHints([]string{"zone-a"}, []string{"node-a"}),
				}}
			}),
		},
		{
			name: "serving defaults to ready",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Endpoints[0].Conditions.Ready = ptr(false)
			}),
			want: baseSliceModel(func(m *model.EndpointSlice) { m.Endpoints[0].Ready, m.Endpoints[0].Serving = false, false }),
		},
		{
			name: "weight annotation applies to every endpoint",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Annotations = map[string]string{model.AnnotationWeight: " 7"}
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.9"}})
			}),
			want: baseSliceModel(func(m *model.EndpointSlice) {
				m.Endpoints[0].Weight = 7
				m.Endpoints = append(m.Endpoints, model.SliceEndpoint{Address: netip.MustParseAddr("10.0.0.9"), Ready: true, Serving: true, Weight: 7})
			}),
		},
		{
			name:     "weight out of range: weight 1, slice kept",
			in:       baseSlice(func(es *discoveryv1.EndpointSlice) { es.Annotations = map[string]string{model.AnnotationWeight: "101"} }),
			want:     baseSliceModel(nil),
			problems: []string{"metadata.annotations[vipproxy.io/weight]=101"},
		},
		{
			name: "weight not a number",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Annotations = map[string]string{model.AnnotationWeight: "heavy"}
			}),
			want:     baseSliceModel(nil),
			problems: []string{"metadata.annotations[vipproxy.io/weight]=heavy"},
		},
		{name: "FQDN ignored", in: baseSlice(func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN })},
		{name: "no service-name label ignored", in: baseSlice(func(es *discoveryv1.EndpointSlice) { es.Labels = nil })},
		{name: "bad address type", in: baseSlice(func(es *discoveryv1.EndpointSlice) { es.AddressType = "IPX" }), problems: []string{"addressType=IPX"}},
		{name: "no name", in: baseSlice(func(es *discoveryv1.EndpointSlice) { es.Name = "" }), problems: []string{"metadata.name="}},
		{
			name: "bad ports dropped",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Ports = append(es.Ports,
					discoveryv1.EndpointPort{Name: ptr("nil")},
					discoveryv1.EndpointPort{Name: ptr("big"), Port: ptr(int32(65536))},
					discoveryv1.EndpointPort{Name: ptr("proto"), Port: ptr(int32(1)), Protocol: ptr(corev1.Protocol("GRE"))})
			}),
			want:     baseSliceModel(nil),
			problems: []string{"ports[1].port=", "ports[2].port=65536", "ports[3].protocol=GRE"},
		},
		{
			name: "bad addresses dropped, leading zeros canonical",
			in: baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Endpoints = []discoveryv1.Endpoint{
					{Addresses: []string{"010.000.000.001"}},
					{Addresses: []string{"10.0.0.2", "fd00::2"}},
					{Addresses: []string{"x"}},
					{},
					{Addresses: []string{"10.0.0.5", "10.0.0.6"}},
					{Addresses: []string{"y", "10.0.0.7"}},
				}
			}),
			want: baseSliceModel(func(m *model.EndpointSlice) {
				m.Endpoints = []model.SliceEndpoint{
					{Address: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true},
					{Address: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true},
					{Address: netip.MustParseAddr("10.0.0.5"), Ready: true, Serving: true}, // the first, as kube-proxy
					{Address: netip.MustParseAddr("10.0.0.7"), Ready: true, Serving: true}, // the first valid one
				}
			}),
			problems: []string{"endpoints[0].addresses[0]=010.000.000.001", "endpoints[1].addresses[1]=fd00::2", "endpoints[2].addresses[0]=x", "endpoints[3].addresses=", "endpoints[5].addresses[0]=y"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ps := EndpointSlice(tc.in)
			gotProblems := fieldValues(t, "EndpointSlice "+tc.in.Namespace+"/"+tc.in.Name, ps)
			if diff := cmp.Diff(tc.problems, gotProblems, cmpOpts...); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got, cmpOpts...); diff != "" {
				t.Errorf("slice (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNode(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		in   *corev1.Node
		want *model.Node
	}{
		{name: "nil", in: nil, want: nil},
		{
			name: "zone, addresses, autoscaler taint, deleting",
			in: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{model.LabelTopologyZone: "z1"}, DeletionTimestamp: &now},
				Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other"}, {Key: model.TaintToBeDeletedByAutoscale, Effect: corev1.TaintEffectNoSchedule}}},
				Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
					{Type: corev1.NodeInternalIP, Address: "192.168.001.010"},
					{Type: corev1.NodeExternalIP, Address: "2001:DB8::5"},
					{Type: corev1.NodeHostName, Address: "n1"},
					{Type: corev1.NodeInternalIP, Address: "garbage"},
				}},
			},
			want: &model.Node{
				Name: "n1", Labels: map[string]string{model.LabelTopologyZone: "z1"},
				Addresses: addrs("192.168.1.10", "2001:db8::5"), Deleting: true, ToBeDeleted: true,
			},
		},
		{name: "plain", in: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, want: &model.Node{Name: "n2"}},
		{name: "pod CIDRs (NodeCIDR detection)", in: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3"},
			Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64", "bad"}}},
			want: &model.Node{Name: "n3", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}}},
		{name: "legacy podCIDR only", in: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n4"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.4.0/24"}},
			want: &model.Node{Name: "n4", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Node(tc.in)
			if diff := cmp.Diff(tc.want, got, cmpOpts...); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
			if got != nil && got.Zone() != tc.in.Labels[model.LabelTopologyZone] {
				t.Errorf("Zone() = %q", got.Zone())
			}
		})
	}
}

// TestStrict checks standalone conversion: leading zeros are refused by
// field in every address field (CVE-2021-29923), and a slice with an
// unparsable address is refused whole so that its last good version stays.
func TestStrict(t *testing.T) {
	svcTests := []struct {
		name     string
		in       *corev1.Service
		refused  bool
		problems []string
	}{
		{name: "clusterIP with leading zeros refused", refused: true,
			in:       baseService(func(s *corev1.Service) { s.Spec.ClusterIPs = nil; s.Spec.ClusterIP = "010.096.000.010" }),
			problems: []string{"spec.clusterIP=010.096.000.010"}},
		{name: "externalIP with leading zeros dropped",
			in:       baseService(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.02.2"} }),
			problems: []string{"spec.externalIPs[1]=192.0.02.2"}},
		{name: "source range with leading zeros dropped",
			in:       baseService(func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"010.0.0.0/8"} }),
			problems: []string{"spec.loadBalancerSourceRanges[0]=010.0.0.0/8"}},
		{name: "zero octet alone is fine",
			in: baseService(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.0"} })},
	}
	for _, tc := range svcTests {
		t.Run(tc.name, func(t *testing.T) {
			got, ps := StrictService(tc.in)
			if diff := cmp.Diff(tc.problems, fieldValues(t, "Service "+tc.in.Namespace+"/"+tc.in.Name, ps), cmpOpts...); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			for _, p := range ps {
				if !strings.Contains(p.Reason, "CVE-2021-29923") {
					t.Errorf("problem %v does not say why leading zeros are refused", p)
				}
			}
			if (got.Name == "") != tc.refused {
				t.Errorf("refused = %v, want %v", got.Name == "", tc.refused)
			}
		})
	}
	sliceTests := []struct {
		name    string
		addrs   []string
		refused bool
	}{
		{name: "typo refuses the slice", addrs: []string{"10.240.1.1", "10.240.1.300"}, refused: true},
		{name: "leading zeros refuse the slice", addrs: []string{"10.240.1.1", "010.240.1.2"}, refused: true},
		{name: "clean slice kept", addrs: []string{"10.240.1.1", "10.240.1.2"}},
	}
	for _, tc := range sliceTests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseSlice(func(es *discoveryv1.EndpointSlice) {
				es.Endpoints = nil
				for _, a := range tc.addrs {
					es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
				}
			})
			got, ps := StrictEndpointSlice(in)
			if (got.Name == "") != tc.refused || (len(ps) > 0) != tc.refused {
				t.Fatalf("got %+v, %v; want refused=%v", got, ps, tc.refused)
			}
			if tc.refused && ps[0].Field != "endpoints[1].addresses[0]" {
				t.Errorf("problem names %q, want endpoints[1].addresses[0]", ps[0].Field)
			}
			// Kubernetes mode keeps the lenient reading.
			if lenient, _ := EndpointSlice(in); lenient.Name == "" {
				t.Errorf("lenient conversion refused the slice")
			}
		})
	}
}
