package conntrack

import (
	"net/netip"
	"slices"

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

// portEntry is what one UDP/SCTP ServicePort contributes to an index.
// It is computed once per ServicePort pointer: States are read-only, so a
// pointer seen before has the same contents.
type portEntry struct {
	gen      uint64      // index.gen of the last update that saw the port
	vips     []vipKey    // one per ClusterIP, externalIP and load-balancer IP
	nodePort nodePortKey // port 0: none
	serving  endpointSet // the port's serving endpoints
	vipBuf   [1]vipKey   // backs vips for a port with a single address
}

// pool is the set of ServicePorts sharing one frontend key: first and,
// rarely, rest. Their serving endpoints are pooled: merged is their union
// when there are several, nil when there is one (first.serving is used as
// is). A pool in an index map has a non-nil first.
type pool struct {
	first  *portEntry
	rest   []*portEntry
	merged endpointSet
	gen    uint64 // index.gen of the update that last merged the pool
}

func (p pool) serving() endpointSet {
	if p.merged != nil {
		return p.merged
	}
	return p.first.serving
}

// with returns p with e added.
func (p pool) with(e *portEntry) pool {
	if p.first == nil {
		p.first = e
	} else {
		p.rest = append(p.rest, e)
	}
	return p
}

// without returns p with one occurrence of e removed.
func (p pool) without(e *portEntry) pool {
	if p.first == e {
		if len(p.rest) == 0 {
			return pool{}
		}
		p.first = p.rest[0]
		p.rest = slices.Delete(p.rest, 0, 1)
	} else if i := slices.Index(p.rest, e); i >= 0 {
		p.rest = slices.Delete(p.rest, i, i+1)
	}
	return p
}

// merge sets p.merged to the union of its ports' serving endpoints, or to
// nil when there is a single port.
func (p pool) merge() pool {
	p.merged = nil
	if len(p.rest) == 0 {
		return p
	}
	n := len(p.first.serving)
	for _, e := range p.rest {
		n += len(e.serving)
	}
	p.merged = make(endpointSet, n)
	for k := range p.first.serving {
		p.merged[k] = struct{}{}
	}
	for _, e := range p.rest {
		for k := range e.serving {
			p.merged[k] = struct{}{}
		}
	}
	return p
}

// slot is one element of State.Ports as last seen by an index, with its
// entry (nil for a port that is not UDP/SCTP).
type slot struct {
	sp *model.ServicePort
	e  *portEntry
}

// index maps Service frontends of the UDP/SCTP ports of a State to their
// serving endpoints. It is maintained incrementally by update: entries of
// ServicePort pointers seen in the previous State are kept, so an update
// costs a pointer comparison per port plus work proportional to the ports
// that were added or removed. It is not safe for concurrent use.
type index struct {
	vips      map[vipKey]pool
	nodePorts map[nodePortKey]pool
	// ports holds the entry of every UDP/SCTP ServicePort in the index.
	ports map[*model.ServicePort]*portEntry
	// slots is State.Ports of the last update with entries; spare is the
	// other buffer, reused by the next update.
	slots, spare []slot
	gen          uint64
	dirtyVIPs    []vipKey
	dirtyNodes   []nodePortKey
}

func newIndex(st *model.State) *index {
	ix := &index{}
	ix.update(st)
	return ix
}

// update makes ix the index of st (nil: no ports). The result is the same
// as newIndex(st) whatever ix held before, provided that the ServicePorts
// ix has seen were not modified since (States are read-only).
func (ix *index) update(st *model.State) {
	var ps []*model.ServicePort
	if st != nil {
		ps = st.Ports
	}
	if ix.vips == nil {
		// Sized for the UDP/SCTP ports of the State, with one address
		// each, the common case. (Sized for every port, the maps held
		// 2.7 MB at 10,000 TCP Services and nothing in them.)
		n := 0
		for _, sp := range ps {
			if sp != nil && tracked(sp) {
				n++
			}
		}
		ix.vips = make(map[vipKey]pool, n)
		ix.nodePorts = map[nodePortKey]pool{}
		ix.ports = make(map[*model.ServicePort]*portEntry, n)
	}
	if len(ps) == len(ix.slots) {
		same := true
		for i, sp := range ps {
			if ix.slots[i].sp != sp {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	ix.gen++
	gen := ix.gen
	next := ix.spare[:0]
	seen := 0
	for i, sp := range ps {
		var e *portEntry
		if i < len(ix.slots) && ix.slots[i].sp == sp {
			e = ix.slots[i].e
		} else if sp != nil {
			var ok bool
			if e, ok = ix.ports[sp]; !ok {
				if e = newPortEntry(sp); e != nil {
					ix.ports[sp] = e
					ix.add(e)
				}
			}
		}
		if e != nil && e.gen != gen {
			e.gen = gen
			seen++
		}
		next = append(next, slot{sp, e})
	}
	if seen < len(ix.ports) {
		// Some ports of the previous State are gone. Every entry in
		// ix.ports is in ix.slots (ports added above have gen set).
		for _, s := range ix.slots {
			if s.e != nil && s.e.gen != gen {
				s.e.gen = gen // once, even if listed twice
				delete(ix.ports, s.sp)
				ix.remove(s.e)
			}
		}
	}
	clear(ix.slots) // drop references to the old State's ports
	ix.spare, ix.slots = ix.slots[:0], next
	ix.fixPools()
}

// tracked reports whether the index holds sp: whether it is UDP or SCTP.
func tracked(sp *model.ServicePort) bool {
	proto := protoNumber(sp.Protocol)
	return proto == ProtoUDP || proto == ProtoSCTP
}

// newPortEntry returns the entry of sp, or nil if sp is not tracked.
func newPortEntry(sp *model.ServicePort) *portEntry {
	if !tracked(sp) {
		return nil
	}
	proto := protoNumber(sp.Protocol)
	e := &portEntry{serving: make(endpointSet, len(sp.Endpoints))}
	if n := len(sp.ClusterIPs) + len(sp.ExternalIPs) + len(sp.LoadBalancerIPs); n <= len(e.vipBuf) {
		e.vips = e.vipBuf[:0]
	} else {
		e.vips = make([]vipKey, 0, n)
	}
	for _, ep := range sp.Endpoints {
		if ep.Ready || ep.Serving {
			e.serving[netip.AddrPortFrom(ep.IP.Unmap(), ep.Port)] = struct{}{}
		}
	}
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range list {
			e.vips = append(e.vips, vipKey{proto, a.Unmap(), sp.Port})
		}
	}
	if sp.NodePort != 0 {
		e.nodePort = nodePortKey{proto, sp.NodePort}
	}
	return e
}

// add puts e into the pools of its keys.
func (ix *index) add(e *portEntry) {
	for _, k := range e.vips {
		p := ix.vips[k].with(e)
		ix.vips[k] = p
		if len(p.rest) > 0 {
			ix.dirtyVIPs = append(ix.dirtyVIPs, k)
		}
	}
	if k := e.nodePort; k.port != 0 {
		p := ix.nodePorts[k].with(e)
		ix.nodePorts[k] = p
		if len(p.rest) > 0 {
			ix.dirtyNodes = append(ix.dirtyNodes, k)
		}
	}
}

// remove takes e out of the pools of its keys, deleting pools left empty.
func (ix *index) remove(e *portEntry) {
	for _, k := range e.vips {
		p := ix.vips[k].without(e)
		if p.first == nil {
			delete(ix.vips, k)
			continue
		}
		ix.vips[k] = p
		ix.dirtyVIPs = append(ix.dirtyVIPs, k)
	}
	if k := e.nodePort; k.port != 0 {
		p := ix.nodePorts[k].without(e)
		if p.first == nil {
			delete(ix.nodePorts, k)
			return
		}
		ix.nodePorts[k] = p
		ix.dirtyNodes = append(ix.dirtyNodes, k)
	}
}

// fixPools recomputes, once each, the merged endpoints of the pools add
// and remove changed in this update.
func (ix *index) fixPools() {
	for _, k := range ix.dirtyVIPs {
		if p, ok := ix.vips[k]; ok && p.gen != ix.gen {
			p = p.merge()
			p.gen = ix.gen
			ix.vips[k] = p
		}
	}
	for _, k := range ix.dirtyNodes {
		if p, ok := ix.nodePorts[k]; ok && p.gen != ix.gen {
			p = p.merge()
			p.gen = ix.gen
			ix.nodePorts[k] = p
		}
	}
	ix.dirtyVIPs, ix.dirtyNodes = ix.dirtyVIPs[:0], ix.dirtyNodes[:0]
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
		if p, ok := ix.vips[vipKey{f.Protocol, dst, f.OrigDst.Port()}]; ok {
			if _, serving := p.serving()[reply]; !serving {
				out = append(out, f)
			}
			continue
		}
		p, ok := ix.nodePorts[nodePortKey{f.Protocol, f.OrigDst.Port()}]
		if !ok || (opts.IsNodePortAddress != nil && !opts.IsNodePortAddress(dst)) {
			continue
		}
		if _, serving := p.serving()[reply]; !serving {
			out = append(out, f)
		}
	}
	return out
}
