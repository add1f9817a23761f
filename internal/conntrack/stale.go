package conntrack

import (
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/model"
)

// StaleOptions tunes Stale. The zero value is kube-proxy's behaviour.
type StaleOptions struct {
	// IsNodePortAddress, when set, restricts NodePort matching to flows
	// whose original destination it accepts (the node's NodePort
	// addresses). Nil matches a NodePort on any destination address, as
	// kube-proxy does.
	IsNodePortAddress func(netip.Addr) bool
}

// Stale returns the flows that the desired State st no longer justifies,
// in the order of flows. The rules:
//
//   - Only UDP and SCTP flows are considered; TCP and every other
//     protocol are never stale.
//   - A flow whose original destination is a Service address — a
//     ClusterIP, externalIP or load-balancer IP with the port and
//     protocol of a UDP/SCTP ServicePort — is stale when its reply source
//     (address and port: the endpoint DNAT chose) is not a serving
//     endpoint of that ServicePort. So are, therefore, every flow of a
//     Service port that now has no serving endpoint, and a flow created
//     while the port had no endpoints (not DNATed: its reply source is the
//     VIP itself) once it has some.
//   - Otherwise, a flow whose original destination port is the NodePort of
//     a UDP/SCTP ServicePort (on any address, or on one accepted by
//     opts.IsNodePortAddress) is stale under the same reply-source rule.
//     A flow that matched a Service address in the rule above is never
//     judged by NodePort, so a ClusterIP port that equals another
//     Service's NodePort does not cause false deletions.
//   - "Serving" is the endpoint condition (ready implies serving) over all
//     of the port's Endpoints, whatever the traffic policies and topology
//     chose: changing policy must not cut existing flows, the same as TCP.
//   - Where several ServicePorts share an address+port+protocol (a shared
//     externalIP) or a NodePort, their endpoints are pooled.
//
// Flows to addresses vipproxy does not know (deleted Services included)
// are left alone, as kube-proxy's reconciler does. Stale does no I/O.
func Stale(st *model.State, flows []Flow, opts StaleOptions) []Flow {
	return newIndex(st).stale(flows, opts)
}

type vipKey struct {
	proto uint8
	addr  netip.Addr
	port  uint16
}

type nodePortKey struct {
	proto uint8
	port  uint16
}

type endpointSet map[netip.AddrPort]struct{}

// index maps Service frontends of the UDP/SCTP ports of a State to their
// serving endpoints.
type index struct {
	vips      map[vipKey]endpointSet
	nodePorts map[nodePortKey]endpointSet
}

func newIndex(st *model.State) *index {
	ix := &index{vips: map[vipKey]endpointSet{}, nodePorts: map[nodePortKey]endpointSet{}}
	if st == nil {
		return ix
	}
	for _, sp := range st.Ports {
		proto := protoNumber(sp.Protocol)
		if proto != ProtoUDP && proto != ProtoSCTP {
			continue
		}
		serving := make(endpointSet, len(sp.Endpoints))
		for _, e := range sp.Endpoints {
			if e.Ready || e.Serving {
				serving[netip.AddrPortFrom(e.IP.Unmap(), e.Port)] = struct{}{}
			}
		}
		for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, a := range list {
				k := vipKey{proto, a.Unmap(), sp.Port}
				ix.vips[k] = union(ix.vips[k], serving)
			}
		}
		if sp.NodePort != 0 {
			k := nodePortKey{proto, sp.NodePort}
			ix.nodePorts[k] = union(ix.nodePorts[k], serving)
		}
	}
	return ix
}

// union returns a ∪ b; it returns b itself when a is nil.
func union(a, b endpointSet) endpointSet {
	if a == nil {
		return b
	}
	out := make(endpointSet, len(a)+len(b))
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

func (ix *index) empty() bool { return len(ix.vips) == 0 && len(ix.nodePorts) == 0 }

func (ix *index) stale(flows []Flow, opts StaleOptions) []Flow {
	var out []Flow
	for _, f := range flows {
		if f.Protocol != ProtoUDP && f.Protocol != ProtoSCTP {
			continue
		}
		dst := f.OrigDst.Addr().Unmap()
		reply := netip.AddrPortFrom(f.ReplySrc.Addr().Unmap(), f.ReplySrc.Port())
		if set, ok := ix.vips[vipKey{f.Protocol, dst, f.OrigDst.Port()}]; ok {
			if _, serving := set[reply]; !serving {
				out = append(out, f)
			}
			continue
		}
		set, ok := ix.nodePorts[nodePortKey{f.Protocol, f.OrigDst.Port()}]
		if !ok || (opts.IsNodePortAddress != nil && !opts.IsNodePortAddress(dst)) {
			continue
		}
		if _, serving := set[reply]; !serving {
			out = append(out, f)
		}
	}
	return out
}
