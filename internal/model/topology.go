package model

// UsesClusterEndpoints reports whether any traffic to p uses the Cluster
// policy: internal traffic with internalTrafficPolicy Cluster, or any
// external traffic at all (even with externalTrafficPolicy Local, traffic
// from this node to a NodePort, externalIP or LB IP short-circuits to the
// Cluster endpoints, as in kube-proxy).
func (p *ServicePort) UsesClusterEndpoints() bool {
	return !p.InternalPolicyLocal() || p.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether any traffic to p uses the Local
// policy (internalTrafficPolicy Local, or externalTrafficPolicy Local on an
// externally accessible port).
func (p *ServicePort) UsesLocalEndpoints() bool {
	return p.InternalPolicyLocal() || p.ExternalPolicyLocal()
}

// HasUsableEndpoints reports whether p has a usable endpoint anywhere in
// the cluster: a ready one, or a serving and terminating one. Dataplanes
// reject traffic (ICMP unreachable / TCP RST) when it is false, and drop
// Local-policy traffic on nodes without local endpoints when it is true.
func (p *ServicePort) HasUsableEndpoints() bool {
	for i := range p.Endpoints {
		e := &p.Endpoints[i]
		if e.Ready || (e.Serving && e.Terminating) {
			return true
		}
	}
	return false
}

// CategorizeEndpoints chooses, from sp.Endpoints, the endpoints this node
// uses for sp's Cluster-policy and Local-policy traffic. It is pure: it
// reads sp.Endpoints, sp's traffic policies, sp.TrafficDistribution and
// whether sp is externally accessible, and nothing else. These are the
// rules of kube-proxy v1.34 with every feature gate at its default, in
// order:
//
//  1. Which sets are needed. cluster is nil when no traffic of sp uses the
//     Cluster policy (UsesClusterEndpoints false: internalTrafficPolicy
//     Local and not externally accessible). local is nil when no traffic
//     uses the Local policy (UsesLocalEndpoints false). A needed set that
//     ends up empty is returned as a non-nil empty slice, so "not needed"
//     and "needed but none" can be told apart.
//  2. Usable means ready. "Ready" is the EndpointSlice condition, which
//     implies serving and not terminating.
//  3. Cluster set: the ready endpoints, filtered by topology (rule 5).
//  4. Cluster fallback: when that yields nothing — which, as topology
//     never filters to nothing, means no endpoint anywhere is ready — the
//     Cluster set is every endpoint that is serving AND terminating
//     (topology ignored). Endpoints that are neither ready nor
//     serving+terminating are never used.
//  5. Topology, applied to the Cluster set only, never to the Local set,
//     decided over the ready endpoints (not-ready ones are ignored when
//     deciding):
//     a. same node: if every ready endpoint has a node hint and at least
//     one is hinted for nodeName, keep only endpoints hinted for
//     nodeName;
//     b. else same zone: if every ready endpoint has a zone hint and at
//     least one is hinted for zone, keep only endpoints hinted for zone
//     (zone "" never matches);
//     c. else (some ready endpoint lacks hints, or no hint names this
//     node/zone) topology is ignored and every ready endpoint is kept.
//     Hints are the EndpointSlice's, followed exactly, as kube-proxy
//     does: the EndpointSlice controller removes them on purpose (for
//     unbalanced zones), and then every ready endpoint is used. Standalone
//     mode, where no controller writes hints, has Build derive them (see
//     BuildOptions.DeriveHints).
//  6. Local set: the ready endpoints on this node (Endpoint.Local); if none
//     is ready, the serving+terminating endpoints on this node; else
//     empty. This choice is made independently of the Cluster set: one may
//     fall back to terminating endpoints while the other does not.
//
// Results keep the order of sp.Endpoints. When a set is all of
// sp.Endpoints it may share sp.Endpoints' backing array; callers must
// treat every returned slice as read-only.
func CategorizeEndpoints(sp *ServicePort, nodeName, zone string) (cluster, local []Endpoint) {
	eps := sp.Endpoints
	if sp.UsesClusterEndpoints() {
		mode := topologyMode(eps, nodeName, zone)
		cluster = filterEndpoints(eps, func(e *Endpoint) bool {
			return e.Ready && availableForTopology(e, mode, nodeName, zone)
		})
		if len(cluster) == 0 {
			cluster = filterEndpoints(eps, func(e *Endpoint) bool {
				return e.Serving && e.Terminating
			})
		}
	}
	if sp.UsesLocalEndpoints() {
		local = filterEndpoints(eps, func(e *Endpoint) bool { return e.Local && e.Ready })
		if len(local) == 0 {
			local = filterEndpoints(eps, func(e *Endpoint) bool {
				return e.Local && e.Serving && e.Terminating
			})
		}
	}
	return cluster, local
}

type topoMode uint8

const (
	topoNone topoMode = iota
	topoSameZone
	topoSameNode
)

// topologyMode decides rule 5 of CategorizeEndpoints.
func topologyMode(eps []Endpoint, nodeName, zone string) topoMode {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for i := range eps {
		e := &eps[i]
		if !e.Ready {
			continue
		}
		anyReady = true
		if !e.Loc.hasNodeHints() {
			allNode = false
		} else if nodeName != "" && e.Loc.nodeHinted(nodeName) {
			forNode = true
		}
		if !e.Loc.hasZoneHints() {
			allZone = false
		} else if zone != "" && e.Loc.zoneHinted(zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topoNone
	case allNode && forNode:
		return topoSameNode
	case allZone && forZone:
		return topoSameZone
	}
	return topoNone
}

func availableForTopology(e *Endpoint, mode topoMode, nodeName, zone string) bool {
	switch mode {
	case topoSameNode:
		return e.Loc.nodeHinted(nodeName)
	case topoSameZone:
		return e.Loc.zoneHinted(zone)
	}
	return true
}

// DeriveHints gives e, when its slice left it without hints, the hints the
// v1.34 EndpointSlice controller writes for traffic distribution dist:
// PreferClose, PreferSameZone and PreferSameNode give a zone hint of the
// endpoint's own zone; PreferSameNode also a node hint of its own node. An
// endpoint without a zone (or node) gets no such hint, which by rule 5c of
// CategorizeEndpoints disables that filter.
func DeriveHints(e *Endpoint, dist string) {
	if e.Loc.hasZoneHints() || e.Loc.hasNodeHints() {
		return
	}
	switch dist {
	case DistributionPreferClose, DistributionPreferSameZone, DistributionPreferSameNode:
	default:
		return
	}
	zone, node := e.Zone(), ""
	if dist == DistributionPreferSameNode {
		node = e.NodeName()
	}
	if zone != "" || node != "" {
		e.Loc = e.Loc.withHint(zone, node)
	}
}

// filterEndpoints returns the endpoints keep accepts. When keep accepts
// all of them it returns eps itself (no copy); it never returns nil.
func filterEndpoints(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	first := -1
	for i := range eps {
		if !keep(&eps[i]) {
			first = i
			break
		}
	}
	if first < 0 {
		if eps == nil {
			return []Endpoint{}
		}
		return eps[:len(eps):len(eps)]
	}
	out := make([]Endpoint, 0, len(eps)-1)
	out = append(out, eps[:first]...)
	for i := first + 1; i < len(eps); i++ {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}
