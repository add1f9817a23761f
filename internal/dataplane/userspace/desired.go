package userspace

// What one State asks of the mode: the groups (a Service port's
// endpoints per family and traffic kind, each one l4proxy.Proxy) and the
// listeners (proto, VIP:port) that feed them.

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/l4proxy"
	"github.com/vipproxy/vipproxy/internal/model"
)

// desired is what one State asks for.
type desired struct {
	groups    map[groupKey][]l4proxy.Endpoint
	listeners map[listenKey]groupKey
	vips      map[netip.Addr]bool
}

func (p *Proxier) desired(st *model.State, nodeAddrs []netip.Addr) *desired {
	d := &desired{
		groups:    map[groupKey][]l4proxy.Endpoint{},
		listeners: map[listenKey]groupKey{},
		vips:      map[netip.Addr]bool{},
	}
	if st == nil {
		return d
	}
	for _, sp := range st.Ports {
		if sp.Protocol != model.TCP && sp.Protocol != model.UDP {
			if !p.warned[sp.Name] {
				p.warned[sp.Name] = true
				p.log.Warn("userspace: protocol not proxied (Go has no portable SCTP sockets)", "service", sp.Name.String())
			}
			continue
		}
		if sp.NodePort != 0 {
			for _, ip := range nodeAddrs {
				p.addListener(d, sp, ip, sp.NodePort, true, "")
			}
		}
		if p.o.NodePortsOnly {
			continue
		}
		for _, ip := range sp.ClusterIPs {
			d.vips[ip.Unmap()] = true
			p.addListener(d, sp, ip, sp.Port, false, "")
		}
		for _, ip := range sp.ExternalIPs {
			d.vips[ip.Unmap()] = true
			p.addListener(d, sp, ip, sp.Port, true, "")
		}
		var ranges []string
		for _, r := range sp.LoadBalancerSourceRanges {
			ranges = append(ranges, r.Masked().String())
		}
		for _, ip := range sp.LoadBalancerIPs {
			d.vips[ip.Unmap()] = true
			p.addListener(d, sp, ip, sp.Port, true, strings.Join(ranges, ","))
		}
	}
	// Groups without endpoints are not needed, unless a listener serves
	// them (an alt group refuses outside clients itself).
	served := map[groupKey]bool{}
	for _, gk := range d.listeners {
		served[gk] = true
	}
	for k, eps := range d.groups {
		if len(eps) == 0 && !served[k] {
			delete(d.groups, k)
		}
	}
	return d
}

// endpoints returns (and records in d) the endpoints of group gk of sp:
// its internal or external endpoints of gk's family.
func (d *desired) endpoints(sp *model.ServicePort, gk groupKey) []l4proxy.Endpoint {
	eps, ok := d.groups[gk]
	if ok {
		return eps
	}
	src := sp.InternalEndpoints()
	if gk.external {
		src = sp.ExternalEndpoints()
	}
	for _, e := range src {
		if e.IP.Unmap().Is6() == gk.v6 {
			eps = append(eps, l4proxy.Endpoint{Addr: netip.AddrPortFrom(e.IP.Unmap(), e.Port), Weight: e.W()})
		}
	}
	d.groups[gk] = eps
	return eps
}

// addListener adds the listener ip:port of sp to d (external: a NodePort,
// externalIP or LB IP; ranges: its loadBalancerSourceRanges). An address
// another Service claimed first stays the first's (logged once).
func (p *Proxier) addListener(d *desired, sp *model.ServicePort, ip netip.Addr, port uint16, external bool, ranges string) {
	ip = ip.Unmap()
	if !ip.IsValid() || port == 0 {
		return
	}
	gk := groupKey{name: sp.Name, external: external, v6: ip.Is6(), affinity: sp.AffinityTimeoutSeconds, ranges: ranges, balance: sp.Balance}
	// externalTrafficPolicy Local: in-cluster clients still reach every
	// (Cluster) endpoint, as kube-proxy short-circuits them. With
	// internalTrafficPolicy Local too there are no Cluster endpoints, and
	// no short-circuit.
	if external && sp.ExternalPolicyLocal() && !sp.InternalPolicyLocal() && len(d.endpoints(sp, gk.altKey())) > 0 {
		gk.alt = true
	}
	if len(d.endpoints(sp, gk)) == 0 && !gk.alt {
		return // no listener: the kernel refuses
	}
	lk := listenKey{proto: sp.Protocol, addr: netip.AddrPortFrom(ip, port)}
	if other, taken := d.listeners[lk]; taken && other != gk {
		if p.warned[sp.Name] {
			return
		}
		p.warned[sp.Name] = true
		p.log.Warn("userspace: address claimed by two services; keeping the first",
			"proto", sp.Protocol, "addr", lk.addr.String(), "kept", other.name.String(), "skipped", sp.Name.String())
		return
	}
	d.listeners[lk] = gk
}

// groupKey identifies the listeners that share one l4proxy.Proxy: one
// ServicePort, internal or external traffic, one family; load-balancer IPs
// with source ranges get their own group, filtered by those ranges. The
// affinity timeout and ranges are part of the key because a Proxy's options
// are fixed.
type groupKey struct {
	name     model.ServicePortName
	external bool
	v6       bool
	affinity int
	balance  model.Balance
	ranges   string // loadBalancerSourceRanges, for LB IP listeners only
	// alt: flows from in-cluster clients (pods in ClusterCIDRs, the node
	// itself) go to altKey()'s group: externalTrafficPolicy Local's
	// short-circuit to the cluster endpoints.
	alt bool
}

// altKey is the group in-cluster clients of an alt group are diverted to.
func (k groupKey) altKey() groupKey {
	return groupKey{name: k.name, v6: k.v6, affinity: k.affinity, balance: k.balance}
}

type listenKey struct {
	proto model.Protocol
	addr  netip.AddrPort
}

func (p *Proxier) nodePortAddrs(local []netip.Addr) []netip.Addr {
	if len(p.o.NodePortAddresses) == 0 {
		return slices.Clone(p.o.NodeIPs)
	}
	// Unlike the kernel modes, loopback NodePort addresses work here: a
	// socket needs no route_localnet. vipproxy's own VIP addresses (found
	// by refreshOwned, also those left by an earlier run) are never node
	// addresses, even inside a nodePortAddresses prefix.
	var out []netip.Addr
	for _, a := range local {
		if p.vips[a] == vipOwned {
			continue
		}
		for _, pf := range p.o.NodePortAddresses {
			if pf.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	return out
}
