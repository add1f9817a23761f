package ipvs

// The wanted state of a Sync. newFragment is the mode's rule-building
// function: what one ServicePort contributes (virtual servers, real
// servers, set members, VIPs, sticky pairs), cached while the port is
// unchanged; build is their union.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// newFragment computes what sp contributes.
func (p *Proxier) newFragment(sp *model.ServicePort) fragment {
	var f fragment
	if f.bad = dataplane.CheckPort(sp); f.bad != "" {
		return f
	}
	intEPs, extEPs := sp.InternalEndpoints(), sp.ExternalEndpoints()
	extLocal := sp.ExternalPolicyLocal()
	for _, ip := range sp.ClusterIPs {
		p.addVS(&f, sp, kindClusterIP, ip, sp.Port, intEPs, sp.InternalPolicyLocal())
	}
	for _, ip := range sp.ExternalIPs {
		p.addVS(&f, sp, kindExternal, ip, sp.Port, extEPs, extLocal)
	}
	for _, ip := range sp.LoadBalancerIPs {
		if fv := p.addVS(&f, sp, kindLB, ip, sp.Port, extEPs, extLocal); fv != nil {
			fv.members = append(fv.members, sourceRanges(sp, ip)...)
		}
	}
	if sp.NodePort != 0 {
		for _, ip := range p.npAddrs {
			// NodePorts only in the families of the Service.
			if len(sp.ClusterIPs) > 0 && !slices.ContainsFunc(sp.ClusterIPs, func(c netip.Addr) bool { return c.Is4() == ip.Is4() }) {
				continue
			}
			p.addVS(&f, sp, kindNodePort, ip, sp.NodePort, extEPs, extLocal)
		}
	}
	for _, e := range sp.ReachableEndpoints() {
		if p.wantFamily(e.IP) {
			f.loop = append(f.loop, setMember{familyOf(e.IP), setLoopBack, fmt.Sprintf("%s,%s:%d,%s", e.IP, protoLower(sp.Protocol), e.Port, e.IP)})
		}
	}
	return f
}

// vsKind is what kind of address a virtual server listens on: the sets
// its address:port goes in under a Cluster and a Local policy, and
// whether the address is a VIP the mode binds.
type vsKind struct {
	cluster, local string
	bind           bool
}

var (
	kindClusterIP = vsKind{setClusterIP, setClusterIP, true}
	kindExternal  = vsKind{setExternal, setExternalLocal, true}
	kindLB        = vsKind{setLB, setLBLocal, true}
	kindNodePort  = vsKind{setNodePort, setNodePortLocal, false}
)

// addVS adds to f the virtual server ip:port of sp over eps (those of
// ip's family), with its set members; local says a Local policy applies
// (drop when eps is empty). It returns the added fragVS, nil when ip's
// family is not programmed.
func (p *Proxier) addVS(f *fragment, sp *model.ServicePort, kind vsKind, ip netip.Addr, port uint16, eps []model.Endpoint, local bool) *fragVS {
	if !p.wantFamily(ip) {
		return nil
	}
	v := VirtualServer{ServiceKey: ServiceKey{Addr: ip, Port: port, Protocol: sp.Protocol}, Scheduler: p.scheduler(sp)}
	if t := sp.AffinityTimeoutSeconds; t > 0 && t >= p.persistenceHold(sp.Protocol) {
		v.Flags, v.Timeout = FlagPersistent, uint32(t)
	}
	if v.Scheduler == "mh" {
		// mh-fallback: a client hashed to a destination that is
		// unavailable (weight 0 while it drains after its endpoint went
		// away) is hashed again, not refused.
		v.Flags |= FlagSched1
	}
	fv := fragVS{dv: &desiredVS{vs: v, dests: map[netip.AddrPort]RealServer{}}}
	for _, e := range eps {
		if e.IP.Is4() == ip.Is4() {
			rs := RealServer{Addr: e.IP, Port: e.Port, Weight: e.W()}
			fv.dv.dests[rs.AddrPort()] = rs
		}
	}
	fv.sticky = p.stickyOf(fv.dv, sp.AffinityTimeoutSeconds, kind == kindLB && len(sp.LoadBalancerSourceRanges) > 0)
	fam, m := familyOf(ip), member(ip, sp.Protocol, port)
	add := func(base, m string) { fv.members = append(fv.members, setMember{fam, base, m}) }
	switch {
	case local && len(fv.dv.dests) == 0:
		add(kind.local, m)
		add(setDrop, m)
	case local:
		add(kind.local, m)
	case len(fv.dv.dests) == 0:
		add(kind.cluster, m)
		add(setReject, m)
	default:
		add(kind.cluster, m)
	}
	if kind.bind {
		fv.vip = ip
	}
	if kind == kindClusterIP {
		// Unknown ports are rejected on ClusterIPs only: an externalIP or
		// LB IP may be an address of a host whose other services must
		// stay reachable.
		add(setVIPs, ip.String())
	}
	f.vss = append(f.vss, fv)
	return &f.vss[len(f.vss)-1]
}

// sourceRanges returns the set members of the LB IP ip of sp with
// loadBalancerSourceRanges (LB-FW, and LB-SRC per range of ip's family);
// none without ranges.
func sourceRanges(sp *model.ServicePort, ip netip.Addr) []setMember {
	if len(sp.LoadBalancerSourceRanges) == 0 {
		return nil
	}
	fam, m := familyOf(ip), member(ip, sp.Protocol, sp.Port)
	out := []setMember{{fam, setLBFW, m}}
	for _, r := range sp.LoadBalancerSourceRanges {
		if r.Addr().Is4() == ip.Is4() {
			out = append(out, setMember{fam, setLBSrc, m + "," + r.Masked().String()})
		}
	}
	return out
}

// fragment is what one ServicePort contributes, cached across syncs
// while the ServicePort (as far as this mode reads it) and the NodePort
// addresses stay the same.
type fragment struct {
	vss  []fragVS
	loop []setMember
	bad  string // why the port is skipped, "" when it is not
}

// fragVS is one virtual server of a ServicePort with the set members and
// the VIP that come with it.
type fragVS struct {
	dv      *desiredVS
	members []setMember
	vip     netip.Addr // bound when valid
	sticky  []sticky   // affinity shorter than persistence holds (sticky.go)
}

// setMember is one member of one set.
type setMember struct {
	fam  iptables.Family
	base string
	m    string
}

// desiredVS is a wanted virtual server and its real servers.
type desiredVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

// desired is the whole wanted state of one Sync.
type desired struct {
	vss    map[ServiceKey]*desiredVS
	sets   setState
	vips   map[netip.Addr]bool
	sticky []sticky
}

// build computes the wanted virtual servers, set members and VIPs from
// the (cached) fragments of st's ports. A ServicePort that cannot be
// programmed, or whose VIP:port another ServicePort already holds, is
// skipped with a warning.
func (p *Proxier) build(st *model.State) *desired {
	d := &desired{vss: map[ServiceKey]*desiredVS{}, sets: setState{}, vips: map[netip.Addr]bool{}}
	for _, sp := range st.Ports {
		f := p.cache.Get(sp.Name, sp, p.newFragment)
		if f.bad != "" {
			p.log.Warn("skipping Service port", "servicePort", sp.Name.String(), "reason", f.bad)
			continue
		}
		for _, fv := range f.vss {
			k := fv.dv.vs.ServiceKey
			if _, dup := d.vss[k]; dup {
				p.log.Warn("skipping Service address: another Service port already uses it", "servicePort", sp.Name.String(), "virtualServer", k.String())
				continue
			}
			d.vss[k] = fv.dv
			for _, m := range fv.members {
				d.sets.add(m.fam, m.base, m.m)
			}
			if fv.vip.IsValid() {
				d.vips[fv.vip] = true
			}
			d.sticky = append(d.sticky, fv.sticky...)
		}
		for _, m := range f.loop {
			d.sets.add(m.fam, m.base, m.m)
		}
	}
	p.cache.Sweep()
	return d
}

// nodePortAddrs returns the addresses NodePort virtual servers listen on:
// the node IPs, or the local addresses inside NodePortAddresses.
func (p *Proxier) nodePortAddrs() ([]netip.Addr, error) {
	if len(p.opts.NodePortAddresses) == 0 {
		return slices.Clone(p.opts.NodeIPs), nil
	}
	local, err := p.opts.LocalAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range local {
		if a.IsLoopback() || p.bound[a] {
			continue
		}
		for _, pre := range p.opts.NodePortAddresses {
			if pre.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// scheduler returns the IPVS scheduler of sp: the configured one, unless
// the Service's vipproxy.io/lb-algorithm says round-robin (wrr: with equal
// weights it is rr, and a Service whose weights change, as slow start
// changes them, never switches schedulers, which would re-bind the
// virtual server's scheduler under traffic) or consistent-hash (mh,
// Maglev hashing of the source address, weighted).
func (p *Proxier) scheduler(sp *model.ServicePort) string {
	switch sp.Balance {
	case model.BalanceRoundRobin:
		return "wrr"
	case model.BalanceConsistentHash:
		return "mh"
	}
	return p.opts.Scheduler
}
