package model

import (
	"errors"
	"net/netip"
	"testing"
)

func validPort() *ServicePort {
	eps := []Endpoint{
		{IP: ip("10.0.0.1"), Port: 8080, Ready: true, Serving: true},
		{IP: ip("10.0.0.2"), Port: 8080, Ready: true, Serving: true, Local: true},
	}
	return &ServicePort{
		Name:                  ServicePortName{ServiceName: svcName("default", "web"), Port: "http", Protocol: TCP},
		Type:                  TypeLoadBalancer,
		ClusterIPs:            []netip.Addr{ip("10.96.0.10"), ip("fd00:96::10")},
		Port:                  80,
		Protocol:              TCP,
		NodePort:              30080,
		ExternalIPs:           []netip.Addr{ip("192.0.2.1")},
		LoadBalancerIPs:       []netip.Addr{ip("192.0.2.2"), ip("2001:db8::2")},
		ExternalTrafficPolicy: PolicyLocal,
		InternalTrafficPolicy: PolicyCluster,
		HealthCheckNodePort:   30999,
		LoadBalancerSourceRanges: []netip.Prefix{
			netip.MustParsePrefix("192.0.2.0/24"),
		},
		AffinityTimeoutSeconds: DefaultAffinityTimeoutSecs,
		Endpoints:              eps,
		ClusterEndpoints:       eps,
		LocalEndpoints:         eps[1:],
	}
}

func TestValidate(t *testing.T) {
	if err := validPort().Validate(); err != nil {
		t.Fatalf("valid port refused: %v", err)
	}
	tests := []struct {
		name     string
		mutate   func(p *ServicePort)
		field    string
		sentinel error
	}{
		{"empty namespace", func(p *ServicePort) { p.Name.Namespace = "" }, "metadata.namespace", nil},
		{"empty name", func(p *ServicePort) { p.Name.Name = "" }, "metadata.name", nil},
		{"bad protocol", func(p *ServicePort) { p.Protocol = "ICMP"; p.Name.Protocol = "ICMP" }, "spec.ports.protocol", nil},
		{"name protocol differs", func(p *ServicePort) { p.Name.Protocol = UDP }, "spec.ports.protocol", nil},
		{"port zero", func(p *ServicePort) { p.Port = 0 }, "spec.ports.port", nil},
		{"type ExternalName", func(p *ServicePort) { p.Type = TypeExternalName }, "spec.type", nil},
		{"no clusterIP", func(p *ServicePort) { p.ClusterIPs = nil }, "spec.clusterIPs", nil},
		{"three clusterIPs", func(p *ServicePort) { p.ClusterIPs = append(p.ClusterIPs, ip("10.96.0.11")) }, "spec.clusterIPs", nil},
		{"two clusterIPs one family", func(p *ServicePort) { p.ClusterIPs = []netip.Addr{ip("10.96.0.1"), ip("10.96.0.2")} }, "spec.clusterIPs[1]", nil},
		{"unspecified clusterIP", func(p *ServicePort) { p.ClusterIPs[0] = ip("0.0.0.0") }, "spec.clusterIPs[0]", nil},
		{"multicast clusterIP", func(p *ServicePort) { p.ClusterIPs[0] = ip("224.0.0.1") }, "spec.clusterIPs[0]", nil},
		{"IPv4-mapped clusterIP", func(p *ServicePort) { p.ClusterIPs[1] = ip("::ffff:10.96.0.1") }, "spec.clusterIPs[1]", nil},
		{"zero clusterIP", func(p *ServicePort) { p.ClusterIPs[0] = netip.Addr{} }, "spec.clusterIPs[0]", nil},
		{"duplicate externalIP", func(p *ServicePort) { p.ExternalIPs = append(p.ExternalIPs, ip("192.0.2.1")) }, "spec.externalIPs[1]", nil},
		{"externalIP of a family without clusterIP", func(p *ServicePort) { p.ClusterIPs = p.ClusterIPs[:1]; p.ExternalIPs = []netip.Addr{ip("2001:db8::9")} }, "spec.externalIPs[0]", nil},
		{"zoned LB IP", func(p *ServicePort) { p.LoadBalancerIPs[1] = ip("fe80::1%eth0") }, "status.loadBalancer.ingress[1]", nil},
		{"source range host bits", func(p *ServicePort) { p.LoadBalancerSourceRanges[0] = netip.MustParsePrefix("192.0.2.1/24") }, "spec.loadBalancerSourceRanges[0]", nil},
		{"source range invalid", func(p *ServicePort) { p.LoadBalancerSourceRanges[0] = netip.Prefix{} }, "spec.loadBalancerSourceRanges[0]", nil},
		{"nodePort on ClusterIP type", func(p *ServicePort) { p.Type = TypeClusterIP; p.HealthCheckNodePort = 0 }, "spec.ports.nodePort", nil},
		{"NodePort type without nodePort", func(p *ServicePort) { p.Type = TypeNodePort; p.NodePort = 0; p.HealthCheckNodePort = 0 }, "spec.ports.nodePort", nil},
		{"healthCheckNodePort with Cluster policy", func(p *ServicePort) { p.ExternalTrafficPolicy = PolicyCluster }, "spec.healthCheckNodePort", nil},
		{"healthCheckNodePort equals nodePort", func(p *ServicePort) { p.HealthCheckNodePort = p.NodePort }, "spec.healthCheckNodePort", nil},
		{"affinity timeout too long", func(p *ServicePort) { p.AffinityTimeoutSeconds = MaxAffinityTimeoutSecs + 1 }, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", nil},
		{"affinity timeout negative", func(p *ServicePort) { p.AffinityTimeoutSeconds = -1 }, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", nil},
		{"bad internal policy", func(p *ServicePort) { p.InternalTrafficPolicy = "Nearby" }, "spec.internalTrafficPolicy", nil},
		{"bad external policy", func(p *ServicePort) { p.ExternalTrafficPolicy = "local" }, "spec.externalTrafficPolicy", nil},
		{"bad traffic distribution", func(p *ServicePort) { p.TrafficDistribution = "PreferFar" }, "spec.trafficDistribution", nil},
		{"loopback endpoint", func(p *ServicePort) {
			p.Endpoints = []Endpoint{{IP: ip("127.0.0.1"), Port: 80}}
			p.ClusterEndpoints, p.LocalEndpoints = nil, nil
		}, "endpoints[0]", ErrLoopback},
		{"endpoint port zero", func(p *ServicePort) { p.Endpoints[1].Port = 0; p.ClusterEndpoints, p.LocalEndpoints = nil, nil }, "endpoints[1]", nil},
		{"endpoints unsorted", func(p *ServicePort) {
			p.Endpoints = []Endpoint{p.Endpoints[1], p.Endpoints[0]}
			p.ClusterEndpoints, p.LocalEndpoints = nil, nil
		}, "endpoints[1]", nil},
		{"endpoints duplicated", func(p *ServicePort) {
			p.Endpoints = []Endpoint{p.Endpoints[0], p.Endpoints[0]}
			p.ClusterEndpoints, p.LocalEndpoints = nil, nil
		}, "endpoints[1]", nil},
		{"endpoint family without clusterIP", func(p *ServicePort) {
			p.ClusterIPs = p.ClusterIPs[:1]
			p.LoadBalancerIPs = p.LoadBalancerIPs[:1]
			p.Endpoints = append(p.Endpoints, Endpoint{IP: ip("fd00::1"), Port: 80})
		}, "endpoints[2]", nil},
		{"cluster endpoint not among endpoints", func(p *ServicePort) {
			p.ClusterEndpoints = []Endpoint{{IP: ip("10.0.0.9"), Port: 8080}}
		}, "clusterEndpoints[0]", nil},
		{"local endpoint not among endpoints", func(p *ServicePort) {
			p.LocalEndpoints = []Endpoint{{IP: ip("10.0.0.2"), Port: 9090}}
		}, "localEndpoints[0]", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := validPort()
			tc.mutate(p)
			err := p.Validate()
			if err == nil {
				t.Fatalf("accepted")
			}
			var found *FieldError
			for _, fe := range FieldErrors(err) {
				if fe.Field == tc.field {
					found = fe
				}
			}
			if found == nil {
				t.Fatalf("no error for field %s; got %v", tc.field, err)
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Errorf("error %v does not wrap %v", err, tc.sentinel)
			}
			if found.Reason == "" {
				t.Errorf("empty reason")
			}
		})
	}
}
