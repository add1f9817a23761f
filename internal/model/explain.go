package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Query asks which endpoints a new connection to Dst/Proto from Src can
// reach. Src may be the zero Addr ("some client outside the cluster").
type Query struct {
	Dst   netip.AddrPort
	Proto Protocol
	Src   netip.Addr
}

// ExplainOptions are the node facts a verdict depends on besides the
// State: they decide whether a source is a pod or the node itself (the
// Local policy's short circuit, masquerading) and whether everything is
// masqueraded.
type ExplainOptions struct {
	// ClusterCIDRs are the pod ranges (local-traffic detection); empty means
	// pod traffic cannot be told apart and is not masqueraded, as the
	// dataplanes do.
	ClusterCIDRs []netip.Prefix
	// NodeIPs are this node's addresses: a source among them is the node.
	NodeIPs       []netip.Addr
	MasqueradeAll bool
	// Ejected are the endpoints passive outlier ejection took out of
	// selection, with why and until when (ports with ejection on only).
	Ejected map[netip.AddrPort]string
	// Proxied: the userspace mode, whose proxy opens its own connection to
	// the endpoint, so that the endpoint always sees this node's address.
	Proxied bool
	// Affinity, when set, looks up the source's ClientIP affinity entry
	// for a port with affinity, as the dataplane holds it: the endpoint
	// and the time left (0: unknown), ok false when there is none, or an
	// error.
	Affinity func(sp *ServicePort, src netip.Addr) (ep netip.AddrPort, left time.Duration, ok bool, err error)
}

// ExplainAffinity is a source's affinity entry: Endpoint empty when it
// has none.
type ExplainAffinity struct {
	Endpoint       string `json:"endpoint,omitempty"`
	ExpiresSeconds int    `json:"expiresSeconds,omitempty"`
	Error          string `json:"error,omitempty"`
}

// Explanation is why a connection goes where it goes. The JSON field names
// are the /explain endpoint's.
type Explanation struct {
	Query struct {
		Dst      string `json:"dst"`
		Protocol string `json:"protocol"`
		Src      string `json:"src,omitempty"`
	} `json:"query"`
	// ServicePort names the matched port ("" when nothing matched: Verdict
	// then says what happens to the packet).
	ServicePort string `json:"servicePort,omitempty"`
	// Via is how Dst matched: clusterIP, externalIP, loadBalancerIP or
	// nodePort.
	Via string `json:"via,omitempty"`
	// Policy is the traffic policy applied to this source, with why.
	Policy string `json:"policy,omitempty"`
	// Balance is the balancing algorithm ("random" when the mode's default).
	Balance string `json:"balance,omitempty"`
	// AffinitySeconds > 0: ClientIP session affinity with that timeout.
	AffinitySeconds int `json:"affinitySeconds,omitempty"`
	// AffinityEntry is the source's entry (a source given, the port with
	// affinity and ExplainOptions.Affinity set).
	AffinityEntry *ExplainAffinity `json:"affinityEntry,omitempty"`
	// Events says which conntrack events the port's flows report, when
	// vipproxy reads them or silences them (outlier ejection; see
	// ServicePort.SampledFlows and QuietFlows): what an operator's
	// `conntrack -E` on the node sees of them.
	Events string `json:"events,omitempty"`
	// Masquerade says whether the endpoint sees the node's address instead
	// of the client's, and MasqueradeWhy why.
	Masquerade    bool   `json:"masquerade"`
	MasqueradeWhy string `json:"masqueradeWhy,omitempty"`
	// Verdict: "DNAT to one of N endpoints", "reject: …" or "drop: …" or
	// "not a Service address".
	Verdict   string            `json:"verdict"`
	Endpoints []ExplainEndpoint `json:"endpoints,omitempty"`
}

// ExplainEndpoint is one endpoint of the port and whether this connection
// can reach it.
type ExplainEndpoint struct {
	Endpoint string `json:"endpoint"`
	Node     string `json:"node,omitempty"`
	Zone     string `json:"zone,omitempty"`
	Weight   int    `json:"weight"`
	Eligible bool   `json:"eligible"`
	// Reason says why the endpoint is or is not eligible.
	Reason string `json:"reason"`
	// Connections is the number of live flows to the endpoint through
	// this port (conntrack); -1 when unknown.
	Connections int `json:"connections"`
}

// events is Explanation.Events for sp.
func events(sp *ServicePort) string {
	switch {
	case sp.FlowsRead() && sp.SampledFlows:
		return "sampled for outlier ejection: every flow reports its end, a sample also its start and answer"
	case sp.FlowsRead():
		return "read for outlier ejection: every flow reports its start, answer and end"
	case sp.QuietFlows:
		return "none: silenced while vipproxy reads the flows of Services with outlier ejection only"
	}
	return ""
}

// Explain says which endpoints of which ServicePort of st a new connection
// q can reach, and why each of the others cannot: the rules of
// CategorizeEndpoints (readiness, the terminating fallback, topology hints,
// Local policies) applied as the dataplanes apply them, including the
// Local policy's short circuit for pods and the node itself and the
// masquerade decision. Connections are left at -1 (the caller fills them
// from conntrack). It never fails: an address no port owns is explained as
// such.
func Explain(st *State, q Query, o ExplainOptions) *Explanation {
	x := &Explanation{}
	x.Query.Dst, x.Query.Protocol = q.Dst.String(), string(q.Proto)
	if q.Src.IsValid() {
		x.Query.Src = q.Src.String()
	}
	dst := q.Dst.Addr().Unmap()
	sp, via := matchPort(st, dst, q.Dst.Port(), q.Proto, o.NodeIPs)
	if sp == nil {
		x.Verdict = "not a Service address of this node: " + unmatched(st, dst, q.Dst.Port(), q.Proto)
		return x
	}
	x.ServicePort, x.Via = sp.Name.String(), via
	x.Balance = string(sp.Balance)
	if x.Balance == "" {
		x.Balance = "random"
	}
	x.Events = events(sp)
	x.AffinitySeconds = sp.AffinityTimeoutSeconds
	if x.AffinitySeconds > 0 && q.Src.IsValid() && o.Affinity != nil {
		a := &ExplainAffinity{}
		ep, left, ok, err := o.Affinity(sp, q.Src.Unmap())
		switch {
		case err != nil:
			a.Error = err.Error()
		case ok:
			a.Endpoint = ep.String()
			a.ExpiresSeconds = int((left + time.Second - 1) / time.Second)
		}
		x.AffinityEntry = a
	}

	src := q.Src.Unmap()
	fromNode := src.IsValid() && (src.IsLoopback() || slices.Contains(o.NodeIPs, src))
	fromPod := src.IsValid() && slices.ContainsFunc(o.ClusterCIDRs, func(p netip.Prefix) bool { return p.Contains(src) })

	var eps []Endpoint
	local := false
	switch {
	case via == "clusterIP":
		local = sp.InternalPolicyLocal()
		x.Policy = "internalTrafficPolicy " + string(sp.InternalTrafficPolicy)
	case sp.ExternalPolicyLocal() && (fromNode || fromPod):
		x.Policy = "externalTrafficPolicy Local, but the source is " + map[bool]string{true: "this node", false: "a pod"}[fromNode] +
			": short-circuited to the Cluster endpoints"
		if sp.ClusterEndpoints == nil {
			local = true
			x.Policy = "externalTrafficPolicy Local, but the source is in the cluster: short-circuited (to the Local endpoints: the port has no Cluster set)"
		}
	default:
		local = sp.ExternalPolicyLocal()
		x.Policy = "externalTrafficPolicy " + string(sp.ExternalTrafficPolicy)
	}
	if local {
		eps = sp.LocalEndpoints
	} else {
		eps = sp.ClusterEndpoints
	}

	switch {
	case o.Proxied:
		x.Masquerade, x.MasqueradeWhy = true, "userspace mode: the proxy connects to the endpoint from this node"
	case o.MasqueradeAll:
		x.Masquerade, x.MasqueradeWhy = true, "masqueradeAll"
	case via == "clusterIP" && len(o.ClusterCIDRs) == 0:
		x.MasqueradeWhy = "no cluster CIDR: pod traffic cannot be told apart, nothing to a ClusterIP is masqueraded"
	case via == "clusterIP" && fromPod:
		x.MasqueradeWhy = "source is a pod"
	case via == "clusterIP" && !src.IsValid():
		x.Masquerade, x.MasqueradeWhy = true, "unless the client is a pod"
	case via == "clusterIP":
		x.Masquerade, x.MasqueradeWhy = true, "source is not a pod"
	case local:
		x.MasqueradeWhy = "Local policy keeps the client's address"
	case fromPod && sp.ExternalPolicyLocal():
		x.MasqueradeWhy = "source is a pod"
	case fromNode && sp.ExternalPolicyLocal():
		x.Masquerade, x.MasqueradeWhy = true, "source is this node"
	default:
		x.Masquerade, x.MasqueradeWhy = true, "Cluster policy for external traffic"
	}

	chosen := map[netip.AddrPort]bool{}
	for _, e := range eps {
		chosen[netip.AddrPortFrom(e.IP, e.Port)] = true
	}
	anyReady := slices.ContainsFunc(sp.Endpoints, func(e Endpoint) bool { return e.Ready && (!local || e.Local) })
	for _, e := range sp.Endpoints {
		if e.IP.Is4() != dst.Is4() {
			continue // the other family's endpoints serve the other family's addresses
		}
		xe := ExplainEndpoint{Endpoint: e.String(), Node: e.NodeName(), Zone: e.Zone(), Weight: e.W(), Connections: -1}
		xe.Eligible = chosen[netip.AddrPortFrom(e.IP, e.Port)]
		xe.Reason = endpointReason(&e, xe.Eligible, anyReady, local, st)
		if why, ok := o.Ejected[netip.AddrPortFrom(e.IP.Unmap(), e.Port)]; ok && sp.OutlierEjection {
			xe.Eligible, xe.Reason = false, why
		}
		x.Endpoints = append(x.Endpoints, xe)
	}
	n := 0
	for _, xe := range x.Endpoints {
		if xe.Eligible {
			n++
		}
	}
	switch {
	case n > 0:
		x.Verdict = fmt.Sprintf("DNAT to one of %d endpoint(s) (%s)", n, x.Balance)
		if x.AffinitySeconds > 0 {
			x.Verdict += fmt.Sprintf(", then the same one for this client for %d s (ClientIP affinity)", x.AffinitySeconds)
		}
		if a := x.AffinityEntry; a != nil && a.Endpoint != "" {
			for _, xe := range x.Endpoints {
				if xe.Endpoint == a.Endpoint && xe.Eligible {
					x.Verdict = "DNAT to " + a.Endpoint + ", this client's affinity entry"
				}
			}
		}
	case local && slices.ContainsFunc(sp.Endpoints, func(e Endpoint) bool { return e.Ready || e.Serving }):
		x.Verdict = "drop: Local policy and no usable endpoint on this node"
	default:
		x.Verdict = "reject: the Service has no usable endpoint"
	}
	return x
}

// endpointReason says why e is (not) eligible.
func endpointReason(e *Endpoint, eligible, anyReady, local bool, st *State) string {
	switch {
	case eligible && e.Ready:
		if local {
			return "ready, on this node"
		}
		return "ready"
	case eligible:
		return "serving and terminating: used because no endpoint is ready"
	case local && !e.Local:
		node := e.NodeName()
		if node == "" {
			node = "no node"
		}
		return "on " + node + ", not this node (Local policy)"
	case e.Terminating && e.Serving && anyReady:
		return "terminating: used only when no endpoint is ready"
	case e.Terminating && !e.Serving:
		return "terminating and not serving"
	case !e.Ready:
		return "not ready"
	}
	// Ready but not chosen: topology.
	if len(e.NodeHints()) > 0 && !slices.Contains(e.NodeHints(), st.NodeName) {
		return "topology: hinted for node(s) " + strings.Join(e.NodeHints(), ",") + ", not this node " + st.NodeName
	}
	if len(e.ZoneHints()) > 0 {
		return "topology: hinted for zone(s) " + strings.Join(e.ZoneHints(), ",") + ", not this node's zone " + quoteEmpty(st.Node.Zone())
	}
	return "not selected"
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// matchPort finds the port dst:port/proto reaches and how.
func matchPort(st *State, dst netip.Addr, port uint16, proto Protocol, nodeIPs []netip.Addr) (*ServicePort, string) {
	if st == nil {
		return nil, ""
	}
	for _, sp := range st.Ports {
		if sp.Protocol != proto {
			continue
		}
		if sp.Port == port {
			switch {
			case slices.Contains(sp.ClusterIPs, dst):
				return sp, "clusterIP"
			case slices.Contains(sp.ExternalIPs, dst):
				return sp, "externalIP"
			case slices.Contains(sp.LoadBalancerIPs, dst):
				return sp, "loadBalancerIP"
			}
		}
		if sp.NodePort != 0 && sp.NodePort == port && (slices.Contains(nodeIPs, dst) || dst.IsLoopback()) {
			return sp, "nodePort"
		}
	}
	return nil, ""
}

// unmatched says what happens to a packet to an address no port matched.
func unmatched(st *State, dst netip.Addr, port uint16, proto Protocol) string {
	if st != nil {
		for _, sp := range st.Ports {
			if slices.Contains(sp.ClusterIPs, dst) {
				return fmt.Sprintf("%s is a ClusterIP, but no port %d/%s: rejected", dst, port, proto)
			}
		}
	}
	return "passed through untouched"
}

// Text renders x for a terminal: what `vipproxy explain` prints.
func (x *Explanation) Text() string {
	var b strings.Builder
	src := x.Query.Src
	if src == "" {
		src = "any client"
	}
	fmt.Fprintf(&b, "%s/%s from %s\n", x.Query.Dst, x.Query.Protocol, src)
	if x.ServicePort == "" {
		fmt.Fprintf(&b, "  %s\n", x.Verdict)
		return b.String()
	}
	fmt.Fprintf(&b, "  service port: %s (%s)\n", x.ServicePort, x.Via)
	fmt.Fprintf(&b, "  policy:       %s\n", x.Policy)
	fmt.Fprintf(&b, "  balancing:    %s\n", x.Balance)
	if x.AffinitySeconds > 0 {
		fmt.Fprintf(&b, "  affinity:     ClientIP, %d s\n", x.AffinitySeconds)
	}
	if x.Events != "" {
		fmt.Fprintf(&b, "  events:       %s\n", x.Events)
	}
	if a := x.AffinityEntry; a != nil {
		switch {
		case a.Error != "":
			fmt.Fprintf(&b, "  entry:        cannot be read: %s\n", a.Error)
		case a.Endpoint == "":
			fmt.Fprintf(&b, "  entry:        none for %s: its next connection is balanced\n", x.Query.Src)
		case a.ExpiresSeconds > 0:
			fmt.Fprintf(&b, "  entry:        %s sticks to %s, %d s left\n", x.Query.Src, a.Endpoint, a.ExpiresSeconds)
		default:
			fmt.Fprintf(&b, "  entry:        %s sticks to %s\n", x.Query.Src, a.Endpoint)
		}
	}
	masq := "no"
	if x.Masquerade {
		masq = "yes"
	}
	fmt.Fprintf(&b, "  masquerade:   %s (%s)\n", masq, x.MasqueradeWhy)
	fmt.Fprintf(&b, "  verdict:      %s\n", x.Verdict)
	if len(x.Endpoints) > 0 {
		b.WriteString("  endpoints:\n")
	}
	for _, e := range x.Endpoints {
		mark := "-"
		if e.Eligible {
			mark = "+"
		}
		where := e.Node
		if e.Zone != "" {
			where += "/" + e.Zone
		}
		if where == "" {
			where = "?"
		}
		conns := "?"
		if e.Connections >= 0 {
			conns = fmt.Sprint(e.Connections)
		}
		fmt.Fprintf(&b, "    %s %-22s %-16s weight %-3d conns %-4s %s\n", mark, e.Endpoint, where, e.Weight, conns, e.Reason)
	}
	return b.String()
}
