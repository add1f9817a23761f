package model

// Who holds a VIP: ClusterIP claims resolved between Services (the
// oldest wins), and the externalIPs and LB IPs refused because they would
// hijack another Service's ClusterIP or a special address.

import (
	"cmp"
	"net/netip"
	"slices"
)

// candidate is one endpoint of one port before de-duplication. It holds
// no pointers, so sorting it is cheap; the Endpoint is made after.
type candidate struct {
	hi, lo uint64 // address as 16 bytes
	v6     bool
	port   uint16
	cond   uint8 // conditionRank
	rank   int32 // order of appearance: slice (by name), then index
	slice  int32 // index into Snapshot.Slices
	ep     int32 // index into that slice's Endpoints
}

func compareCandidate(x, y *candidate) int {
	if x.v6 != y.v6 {
		if x.v6 {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(x.hi, y.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(x.lo, y.lo); c != 0 {
		return c
	}
	return cmp.Compare(x.port, y.port)
}

// resolveClusterIPClaims drops from st.Ports every externalIP and
// load-balancer IP that is some Service's ClusterIP (naming that Service
// in the Problem), and every externalIP inside opts.ServiceCIDRs, with
// one Problem per Service, field and address. These checks look across
// Services, so they run on the whole State, after the per-Service cache.
// Ports that lose an address are replaced by copies (in a copy of
// st.Ports: the Builder keeps the list it had as its own); with c set, the
// copy of the previous Build is reused while it is the same, so that
// pointers stay stable and dataplanes see no change.
//
// When st.Uses counts no port that claims an address there is nothing to
// check, and no pass over the ports is made (at 50,000 Services the pass
// took 2.5 ms per change).
func (b *builder) resolveClusterIPClaims(st *State, c *Builder) {
	if st.Uses != nil && st.Uses.Claims == 0 {
		if c != nil {
			clear(c.claimCopies)
		}
		return
	}
	var owner map[netip.Addr]ServiceName
	inRange := func(a netip.Addr) bool {
		return slices.ContainsFunc(b.opts.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	refused := func(a netip.Addr, external bool) (string, bool) {
		if o, ok := owner[a]; ok {
			return "is the ClusterIP of Service " + o.String() + "; the ClusterIP wins, entry ignored", true
		}
		if external && inRange(a) {
			return "refused: inside the service range (a ClusterIP may be handed out there); entry ignored", true
		}
		return "", false
	}
	// The owners of only those ClusterIPs some port claims as an external
	// or LB IP: a set of a few addresses, then one pass over the ports (a
	// map of every ClusterIP cost 2.6 ms per Build at 10,000 Services).
	for _, sp := range st.Ports {
		for _, list := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, a := range list {
				if owner == nil {
					owner = map[netip.Addr]ServiceName{}
				}
				owner[a] = ServiceName{}
			}
		}
	}
	if owner == nil {
		if c != nil {
			clear(c.claimCopies)
		}
		return
	}
	for _, q := range st.Ports {
		for _, a := range q.ClusterIPs {
			if o, ok := owner[a]; ok && o == (ServiceName{}) {
				owner[a] = q.Name.ServiceName
			}
		}
	}
	for a, o := range owner {
		if o == (ServiceName{}) {
			delete(owner, a) // claimed by no ClusterIP
		}
	}
	var reported map[string]bool
	copies := map[*ServicePort]*ServicePort{}
	copied := false
	for i, sp := range st.Ports {
		if len(sp.ExternalIPs) == 0 && len(sp.LoadBalancerIPs) == 0 {
			continue
		}
		if !slices.ContainsFunc(sp.ExternalIPs, func(a netip.Addr) bool { _, r := refused(a, true); return r }) &&
			!slices.ContainsFunc(sp.LoadBalancerIPs, func(a netip.Addr) bool { _, r := refused(a, false); return r }) {
			continue
		}
		keep := func(field string, list []netip.Addr, external bool) []netip.Addr {
			var out []netip.Addr
			for _, a := range list {
				reason, r := refused(a, external)
				if !r {
					out = append(out, a)
					continue
				}
				key := sp.Name.ServiceName.String() + " " + field + " " + a.String()
				if reported == nil {
					reported = map[string]bool{}
				}
				if !reported[key] {
					reported[key] = true
					b.problem("Service "+sp.Name.ServiceName.String(), field, a.String(), reason)
				}
			}
			return out
		}
		ext := keep("spec.externalIPs", sp.ExternalIPs, true)
		lb := keep("status.loadBalancer.ingress", sp.LoadBalancerIPs, false)
		var cp *ServicePort
		if c != nil {
			if old := c.claimCopies[sp]; old != nil && slices.Equal(old.ExternalIPs, ext) && slices.Equal(old.LoadBalancerIPs, lb) {
				cp = old
			}
		}
		if cp == nil {
			v := *sp
			v.ExternalIPs, v.LoadBalancerIPs = ext, lb
			cp = &v
		}
		copies[sp] = cp
		if !copied {
			st.Ports, copied = slices.Clone(st.Ports), true
		}
		st.Ports[i] = cp
	}
	if c != nil {
		c.claimCopies = copies
	}
}

// mergeCandidates sorts cs by address and port and returns the best copy
// of each address+port (see Build) as Endpoints. The result is never nil.
func (b *builder) mergeCandidates(cs []candidate, dist string) []Endpoint {
	less := func(x, y candidate) int {
		if c := compareCandidate(&x, &y); c != 0 {
			return c
		}
		if c := cmp.Compare(x.cond, y.cond); c != 0 {
			return c
		}
		return cmp.Compare(x.rank, y.rank)
	}
	if !slices.IsSortedFunc(cs, less) {
		slices.SortFunc(cs, less)
	}
	out := make([]Endpoint, 0, len(cs))
	for i := range cs {
		c := &cs[i]
		if i > 0 && compareCandidate(&cs[i-1], c) == 0 {
			continue
		}
		se := &b.snap.Slices[c.slice].Endpoints[c.ep]
		out = append(out, Endpoint{
			IP:          se.Address,
			Port:        c.port,
			Ready:       se.Ready,
			Serving:     se.Serving,
			Terminating: se.Terminating,
			Weight:      se.Weight,
			Loc:         se.Loc,
			Local:       b.nodeName != "" && se.NodeName() == b.nodeName,
		})
		if b.opts.DeriveHints {
			DeriveHints(&out[len(out)-1], dist)
		}
	}
	return out
}

// hijackProblem says why a may not be an externalIP or load-balancer IP
// of any Service, or "": the node's loopback services, link-local
// neighbours (169.254.169.254, the cloud metadata address, among them),
// multicast groups and the unspecified address are never proxied to.
func hijackProblem(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback address"
	case a.IsLinkLocalUnicast():
		return "link-local address"
	}
	return vipProblem(a) // unspecified, multicast, not canonical
}

// externalIPProblem is hijackProblem plus the allow-list.
func (b *builder) externalIPProblem(a netip.Addr) string {
	if r := hijackProblem(a); r != "" {
		return r
	}
	if len(b.opts.ExternalIPCIDRs) > 0 && !slices.ContainsFunc(b.opts.ExternalIPCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return "outside --external-ip-cidrs"
	}
	return ""
}
