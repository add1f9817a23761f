package iptables

// The per-family rules of the State: each ServicePort's fragment (rules.go),
// cached while the port and the family settings are unchanged.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/portcache"
	"github.com/vipproxy/vipproxy/internal/model"
)

// beLiberal is the sysctl that, at 0, makes the mode drop INVALID packets.
const beLiberal = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// famCache is one family's fragment cache: the fragments of the ports,
// reused while a port is unchanged and the family's settings (key) are
// the same.
type famCache struct {
	key   string
	ports portcache.Cache[model.ServicePortName, *fragment]
	// shared are the shared chains of the last build, and dispatch the
	// dispatch pointers, in order, they were built from.
	shared   *sharedChains
	dispatch []*dispatch
}

// sharedChains are a build's shared (static) chains of both tables.
type sharedChains struct {
	nat, filter []chainRules
	natRules    int
	filterRules int
}

// famConfigs returns the per-family rule settings.
func (p *Proxier) famConfig(fam Family, large bool) *famConfig {
	o := &p.opts
	c := &famConfig{fam: fam, mark: fmt.Sprintf("%#x", uint32(1)<<uint(o.MasqueradeBit)), masqueradeAll: o.MasqueradeAll, largeCluster: large}
	for _, pr := range o.ClusterCIDRs {
		if c.has(pr.Addr()) {
			c.clusterCIDRs = append(c.clusterCIDRs, pr.Masked())
		}
	}
	if o.PodInterface != "" {
		c.podIface = o.PodInterface
		if o.PodInterfacePrefix {
			c.podIface += "+"
		}
	}
	for _, pr := range o.ServiceCIDRs {
		if c.has(pr.Addr()) {
			c.serviceCIDRs = append(c.serviceCIDRs, pr.Masked())
		}
	}
	for _, ip := range o.NodeIPs {
		if c.has(ip) {
			c.nodeIPs = append(c.nodeIPs, ip)
		}
	}
	loopback := "127.0.0.0/8"
	if fam == IPv6 {
		loopback = "::1/128"
	}
	var prefixes []netip.Prefix
	all, given := false, false
	for _, pr := range o.NodePortAddresses {
		if !c.has(pr.Addr()) {
			continue
		}
		given = true
		if pr.Bits() == 0 {
			all = true
		}
		if !pr.Addr().IsLoopback() {
			prefixes = append(prefixes, pr.Masked())
		}
	}
	switch {
	case all:
		c.nodePortDests = [][]string{{"-m", "addrtype", "--dst-type", "LOCAL", "!", "-d", loopback}}
	case len(prefixes) > 0:
		for _, pr := range prefixes {
			c.nodePortDests = append(c.nodePortDests, []string{"-d", pr.String(), "-m", "addrtype", "--dst-type", "LOCAL"})
		}
	case given:
		// Only loopback ranges: no NodePort in the kernel (loopback
		// NodePorts are the userspace proxy's).
	default:
		// No nodePortAddresses of this family: the node's primary IPs.
		for _, ip := range c.nodeIPs {
			if !ip.IsLoopback() {
				c.nodePortDests = append(c.nodePortDests, []string{"-d", ip.String()})
			}
		}
	}
	if p.usesSets(fam) {
		c.hairpinSet, c.clusterSet = hairpinKind.name(fam), clusterKind.name(fam)
	}
	if o.DropInvalid != nil {
		c.dropInvalid = *o.DropInvalid
	} else {
		v, err := o.Sysctl.Read(beLiberal)
		c.dropInvalid = err != nil || v == "0"
	}
	return c
}

func (c *famConfig) key() string {
	return fmt.Sprint(c.fam, c.mark, c.clusterCIDRs, c.podIface, c.serviceCIDRs, c.nodeIPs, c.nodePortDests, c.masqueradeAll, c.dropInvalid, c.largeCluster, c.hairpinSet, c.clusterSet)
}

// build computes the wanted chains of every family and table. A full
// sync builds every fragment and shared chain again: a restored chain
// keeps no text (see desiredTable.release), and a full sync compares every
// chain with the kernel's.
func (p *Proxier) build(st *model.State, full bool) map[Family]map[string]*desiredTable {
	total := 0
	for _, sp := range st.Ports {
		if sp != nil {
			total += len(sp.Endpoints)
		}
	}
	large := total >= p.opts.LargeClusterEndpoints
	out := map[Family]map[string]*desiredTable{}
	for _, fam := range p.opts.Families {
		c := p.famConfig(fam, large)
		fc := p.cache[fam]
		if fc == nil {
			fc = &famCache{}
			p.cache[fam] = fc
		}
		if k := c.key(); k != fc.key {
			fc.key = k
			fc.ports.Invalidate()
			fc.shared, fc.dispatch = nil, nil
		} else if full {
			fc.ports.Invalidate()
			fc.shared, fc.dispatch = nil, nil
		}
		out[fam] = p.buildFamily(c, fc, st)
		fc.ports.Sweep()
	}
	return out
}

// clusterIP returns sp's ClusterIP of c's family, the zero Addr when it
// has none: then the family programs nothing for sp.
func (c *famConfig) clusterIP(sp *model.ServicePort) netip.Addr {
	for _, ip := range sp.ClusterIPs {
		if c.has(ip) {
			return ip
		}
	}
	return netip.Addr{}
}

// cachedFragment returns sp's fragment for c's family, from fc when sp is
// unchanged.
func cachedFragment(c *famConfig, fc *famCache, sp *model.ServicePort) *fragment {
	return fc.ports.Get(sp.Name, sp, func(sp *model.ServicePort) *fragment {
		f := buildPort(c, sp)
		if f == nil {
			return nil
		}
		f.name = sp.Name
		if old, _ := fc.ports.Previous(sp.Name); old != nil && old.dispatch.equal(f.dispatch) {
			f.dispatch = old.dispatch
		}
		return f
	})
}

func (p *Proxier) buildFamily(c *famConfig, fc *famCache, st *model.State) map[string]*desiredTable {
	nat, filter := &desiredTable{}, &desiredTable{}
	disp := make([]*dispatch, 0, len(fc.dispatch))
	for _, sp := range st.Ports {
		if sp == nil {
			continue
		}
		if why := dataplane.CheckPort(sp); why != "" {
			p.log.Warn("skipping Service port", "servicePort", sp.Name.String(), "reason", why)
			continue
		}
		if tooManyAddrs(c, sp) {
			p.log.Warn("skipping Service port", "servicePort", sp.Name.String(), "reason",
				fmt.Sprintf("%d external and %d load-balancer IPs: more rules than one port may have", len(sp.ExternalIPs), len(sp.LoadBalancerIPs)))
			continue
		}
		if !c.clusterIP(sp).IsValid() {
			// Not of this family: no fragment, and no cache entry (at
			// 10,000 IPv4 Services, 1.4 MB of the ip6 cache).
			continue
		}
		f := cachedFragment(c, fc, sp)
		if f == nil {
			continue
		}
		disp = append(disp, f.dispatch)
		nat.frags = append(nat.frags, f)
		for _, ch := range f.chains {
			nat.rules += ch.n
		}
	}
	if fc.shared == nil || !slices.Equal(disp, fc.dispatch) {
		sh := sharedLines{cips: map[netip.Addr]bool{}}
		for _, d := range disp {
			sh.add(d)
		}
		n, f := &desiredTable{}, &desiredTable{}
		natStatic(c, n, &sh)
		filterStatic(c, f, &sh)
		fc.shared = &sharedChains{nat: n.static, filter: f.static, natRules: n.rules, filterRules: f.rules}
		fc.dispatch = disp
	}
	nat.static, nat.rules = fc.shared.nat, nat.rules+fc.shared.natRules
	filter.static, filter.rules = fc.shared.filter, fc.shared.filterRules
	return map[string]*desiredTable{TableNAT: nat, TableFilter: filter}
}

// sharedLines collects the fragments' rules in the shared chains, and
// each ClusterIP with the first Service that has it.
type sharedLines struct {
	chains [numDispatch][]string // the fragments' rules in each shared chain
	noPort []string              // per ClusterIP, its first fragment's noPort
	cips   map[netip.Addr]bool
}

func (sh *sharedLines) add(f *dispatch) {
	for k := range sh.chains {
		sh.chains[k] = append(sh.chains[k], f.rules(dispatchChain(k))...)
	}
	if !sh.cips[f.clusterIP] {
		sh.cips[f.clusterIP] = true
		sh.noPort = append(sh.noPort, f.noPort)
	}
}

// clusterMasq returns, with a ClusterIP set, the rule at the head of nat
// VIP-SERVICES that marks for masquerade the traffic to the set's
// ClusterIP ports from outside the pod network: what kube-proxy's layout
// writes in every Service's chain (internalMasq), or nothing.
func clusterMasq(c *famConfig) []string {
	tail := c.unlessPod()
	if c.clusterSet == "" || tail == nil {
		return nil
	}
	var w rw
	w.add(chainServices, cat(clusterMatch(c.clusterSet), tail)...)
	return w.lines
}

// natStatic sets the nat table's shared chains: the dispatch chains with
// the fragments' rules, masquerading and the canary.
func natStatic(c *famConfig, nat *desiredTable, sh *sharedLines) {
	var w rw
	for _, d := range c.nodePortDests {
		w.add(chainServices, cat(comment("vipproxy service nodeports; NOTE: this must be the last rule in this chain"), d, []string{"-j", chainNodePorts})...)
	}
	nat.set(chainServices, append(clusterMasq(c), append(sh.chains[natServices], w.lines...)...))
	nat.set(chainNodePorts, sh.chains[natNodePorts])
	w = rw{}
	if c.hairpinSet != "" {
		w.add(chainPostrouting, cat(hairpinMatch(c.hairpinSet), []string{"-j", chainMarkMasq})...)
	}
	w.add(chainPostrouting, "-m", "mark", "!", "--mark", c.mark+"/"+c.mark, "-j", "RETURN")
	w.add(chainPostrouting, "-j", "MARK", "--xor-mark", c.mark)
	w.add(chainPostrouting, "-m", "comment", "--comment", "vipproxy service traffic requiring SNAT", "-j", "MASQUERADE", "--random-fully")
	nat.set(chainPostrouting, w.lines)
	w = rw{}
	w.add(chainMarkMasq, "-j", "MARK", "--or-mark", c.mark)
	nat.set(chainMarkMasq, w.lines)
	if len(c.clusterCIDRs) > 1 && !c.masqueradeAll && c.podIface == "" {
		w = rw{}
		for _, cidr := range c.clusterCIDRs {
			w.add(chainMasqUnlessPod, "-s", cidr.String(), "-j", "RETURN")
		}
		w.add(chainMasqUnlessPod, "-j", chainMarkMasq)
		nat.set(chainMasqUnlessPod, w.lines)
	}
	nat.set(ChainCanary, canaryLines())
}

func canaryLines() []string {
	var w rw
	w.add(ChainCanary, "-j", "RETURN")
	return w.lines
}

// filterStatic sets the filter table's shared chains: the fragments'
// reject, drop and firewall rules, unknown ports on ClusterIPs,
// unallocated service addresses, forwarding and the canary.
func filterStatic(c *famConfig, filter *desiredTable, sh *sharedLines) {
	w := rw{lines: sh.noPort}
	for _, cidr := range c.serviceCIDRs {
		w.add(chainServices, cat(comment("unallocated service IP"), []string{"-d", cidr.String(), "-j", "DROP"})...)
	}
	filter.set(chainServices, append(sh.chains[filterServices], w.lines...))
	filter.set(chainExternalServices, sh.chains[filterExternal])
	filter.set(chainNodePorts, sh.chains[filterNodePorts])
	w = rw{}
	if c.dropInvalid {
		w.add(chainForward, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	w.add(chainForward, cat(comment("vipproxy forwarding rules"), []string{"-m", "mark", "--mark", c.mark + "/" + c.mark, "-j", "ACCEPT"})...)
	if c.hairpinSet != "" {
		// What kube-proxy's layout marks in nat PREROUTING, and so
		// accepts by the rule above, is matched here by the set.
		w.add(chainForward, cat(hairpinMatch(c.hairpinSet), []string{"-j", "ACCEPT"})...)
	}
	w.add(chainForward, cat(comment("vipproxy forwarding conntrack rule"), []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"})...)
	filter.set(chainForward, w.lines)
	filter.set(chainFirewall, sh.chains[filterFW])
	w = rw{}
	w.add(chainReject, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
	w.add(chainReject, "-j", "REJECT")
	filter.set(chainReject, w.lines)
	filter.set(ChainCanary, canaryLines())
}
