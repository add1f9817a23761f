package dataplanetest

import (
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// The node every scenario runs on. Addresses are chosen so that each
// class (pod on this node, pod elsewhere, node, external client, service
// range) is recognisable in a failure message.
var (
	NodeName = "node-a"
	// NodeIPv4 and NodeIPv6 are the node's primary IPs (Options.NodeIPs).
	NodeIPv4 = netip.MustParseAddr("192.168.0.10")
	NodeIPv6 = netip.MustParseAddr("fd00:192::10")
	// OtherLocalIPv4/6 are further addresses of the node, outside the
	// default nodePortAddresses.
	OtherLocalIPv4 = netip.MustParseAddr("10.250.0.1")
	OtherLocalIPv6 = netip.MustParseAddr("fd00:250::1")

	ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:10:1::/48")}
	ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/108")}

	// LocalPod is a pod on this node; RemotePod a pod on another node.
	LocalPod     = netip.MustParseAddr("10.1.1.9")
	RemotePod    = netip.MustParseAddr("10.1.2.9")
	LocalPod6    = netip.MustParseAddr("fd00:10:1:1::9")
	ExtClient    = netip.MustParseAddr("203.0.113.7")
	ExtClient6   = netip.MustParseAddr("2001:db8::7")
	DeniedClient = netip.MustParseAddr("198.18.0.5")
)

// MasqueradeBit is the fwmark bit scenarios use.
const MasqueradeBit = 14

// BaseOptions returns the Options every scenario starts from: cluster-CIDR
// local detection, service CIDRs set, default nodePortAddresses (node IPs).
func BaseOptions() dataplane.Options {
	return dataplane.Options{
		NodeName:      NodeName,
		NodeIPs:       []netip.Addr{NodeIPv4, NodeIPv6},
		MasqueradeBit: MasqueradeBit,
		ClusterCIDRs:  slices.Clone(ClusterCIDRs),
		ServiceCIDRs:  slices.Clone(ServiceCIDRs),
	}
}

// IsLocalAddr reports whether a is an address of the scenario node
// (primary IPs, the other local addresses, loopback).
func IsLocalAddr(a netip.Addr) bool {
	return a == NodeIPv4 || a == NodeIPv6 || a == OtherLocalIPv4 || a == OtherLocalIPv6 || a.IsLoopback()
}

// Port returns a ServicePort of type ClusterIP (NodePort when nodePort is
// set on the result) with Cluster policies. Call Fill after setting
// Endpoints and policies.
func Port(svc, portName string, proto model.Protocol, port uint16, clusterIPs ...string) *model.ServicePort {
	ns, name := splitName(svc)
	sp := &model.ServicePort{
		Name:                  model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: portName, Protocol: proto},
		Type:                  model.TypeClusterIP,
		Port:                  port,
		Protocol:              proto,
		InternalTrafficPolicy: model.PolicyCluster,
		ExternalTrafficPolicy: model.PolicyCluster,
	}
	for _, ip := range clusterIPs {
		sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr(ip))
	}
	return sp
}

func splitName(s string) (string, string) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:]
		}
	}
	return "default", s
}

// EP returns a ready, serving endpoint; local marks it as running on this node.
func EP(ip string, port uint16, local bool) model.Endpoint {
	e := model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, Local: local}
	if local {
		e.Loc = model.At(NodeName, "")
	} else {
		e.Loc = model.At("node-b", "")
	}
	return e
}

// TermEP returns a serving, terminating (not ready) endpoint.
func TermEP(ip string, port uint16, local bool) model.Endpoint {
	e := EP(ip, port, local)
	e.Ready = false
	e.Terminating = true
	return e
}

// Fill sorts sp.Endpoints and selects ClusterEndpoints and LocalEndpoints
// with model.CategorizeEndpoints, exactly as model.Build does for a node
// without a zone. It returns sp.
func Fill(sp *model.ServicePort) *model.ServicePort {
	slices.SortFunc(sp.Endpoints, func(a, b model.Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	// The one selection function, without topology (no node zone).
	sp.ClusterEndpoints, sp.LocalEndpoints = model.CategorizeEndpoints(sp, "", "")
	return sp
}

// NewState returns a State of ports sorted by name as model.Build does.
func NewState(ports ...*model.ServicePort) *model.State {
	ps := slices.Clone(ports)
	slices.SortStableFunc(ps, func(a, b *model.ServicePort) int {
		as, bs := a.Name.String(), b.Name.String()
		switch {
		case as < bs:
			return -1
		case as > bs:
			return 1
		}
		return 0
	})
	return &model.State{NodeName: NodeName, Ports: ps}
}
