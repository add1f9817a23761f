package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/maphash"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/balance"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Chain names. vipproxy's chains start with ChainPrefix so they never
// collide with kube-proxy's KUBE- chains.
const (
	ChainPrefix           = "VIP-"
	chainServices         = "VIP-SERVICES"
	chainExternalServices = "VIP-EXTERNAL-SERVICES"
	chainNodePorts        = "VIP-NODEPORTS"
	chainPostrouting      = "VIP-POSTROUTING"
	chainMarkMasq         = "VIP-MARK-MASQ"
	chainMasqUnlessPod    = "VIP-MASQ-UNLESS-POD"
	chainForward          = "VIP-FORWARD"
	chainFirewall         = "VIP-PROXY-FIREWALL"
	// chainReject (filter) refuses a connection: TCP with a reset, which
	// is immediate and not subject to the kernel's ICMP rate limit (an
	// ICMP port unreachable can be suppressed, and the client then waits
	// for its SYN retransmit), everything else with ICMP port unreachable.
	chainReject = "VIP-REJECT"
	// ChainCanary is the empty-but-one-rule chain whose absence (or
	// emptiness) in any table tells vipproxy its rules were flushed.
	ChainCanary = "VIP-CANARY"
)

// largeClusterEndpoints is the endpoint count from which comments on
// per-endpoint rules are dropped, as upstream does.
const largeClusterEndpoints = 1000

// jump is one rule in a built-in chain that enters vipproxy's chains.
type jump struct {
	table, chain, target, comment string
	extra                         []string
}

// jumps are kept first in their built-in chains, in this order.
var jumps = []jump{
	{TableFilter, "INPUT", chainFirewall, "vipproxy load balancer firewall", ctNew},
	{TableFilter, "INPUT", chainNodePorts, "vipproxy health check service ports", nil},
	{TableFilter, "INPUT", chainExternalServices, "vipproxy externally-visible service portals", ctNew},
	{TableFilter, "FORWARD", chainFirewall, "vipproxy load balancer firewall", ctNew},
	{TableFilter, "FORWARD", chainForward, "vipproxy forwarding rules", nil},
	{TableFilter, "FORWARD", chainServices, "vipproxy service portals", ctNew},
	{TableFilter, "FORWARD", chainExternalServices, "vipproxy externally-visible service portals", ctNew},
	{TableFilter, "OUTPUT", chainFirewall, "vipproxy load balancer firewall", ctNew},
	{TableFilter, "OUTPUT", chainServices, "vipproxy service portals", ctNew},
	{TableNAT, "PREROUTING", chainServices, "vipproxy service portals", nil},
	{TableNAT, "OUTPUT", chainServices, "vipproxy service portals", nil},
	{TableNAT, "POSTROUTING", chainPostrouting, "vipproxy postrouting rules", nil},
}

var ctNew = []string{"-m", "conntrack", "--ctstate", "NEW"}

func (j jump) args() []string {
	a := []string{"-m", "comment", "--comment", j.comment}
	a = append(a, j.extra...)
	return append(a, "-j", j.target)
}

// hashName returns the 16-character base32 SHA-256 prefix upstream uses
// for per-service chain names.
func hashName(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "")))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}

// portChains are the per-ServicePort chain names.
type portChains struct {
	svc, svl, ext, fw string
}

func chainsFor(spn string, proto string) portChains {
	h := hashName(spn, proto)
	return portChains{svc: "VIP-SVC-" + h, svl: "VIP-SVL-" + h, ext: "VIP-EXT-" + h, fw: "VIP-FW-" + h}
}

func endpointChain(spn, proto string, ep model.Endpoint) string {
	return "VIP-SEP-" + hashName(spn, proto, ep.String())
}

// sepNames memoizes endpoint chain names within one buildPort.
type sepNames struct {
	spn, proto string
	m          map[netip.AddrPort]string
}

func (s *sepNames) get(ep model.Endpoint) string {
	k := netip.AddrPortFrom(ep.IP, ep.Port)
	if n, ok := s.m[k]; ok {
		return n
	}
	n := endpointChain(s.spn, s.proto, ep)
	s.m[k] = n
	return n
}

// famConfig is everything rule generation needs besides the ServicePort,
// for one family.
type famConfig struct {
	fam           Family
	mark          string // "0x4000"
	clusterCIDRs  []netip.Prefix
	podIface      string // "-i" value for pod traffic ("br0", "veth+"); wins over clusterCIDRs
	serviceCIDRs  []netip.Prefix
	nodeIPs       []netip.Addr
	nodePortDests [][]string // destination matches of NodePort traffic
	masqueradeAll bool
	dropInvalid   bool
	largeCluster  bool
	// hairpinSet names the family's hairpin ipset (see hairpin.go), or
	// is "" for kube-proxy's layout: a chain per endpoint that marks
	// traffic from the endpoint itself for masquerade before its DNAT.
	hairpinSet string
	// clusterSet names the family's ClusterIP-masquerade ipset (see
	// hairpin.go and clusterMasq), or is "": the rule in every Service's
	// internal chain.
	clusterSet string
}

func (c *famConfig) has(a netip.Addr) bool {
	return a.IsValid() && (a.Is4() && c.fam == IPv4 || a.Is6() && !a.Is4In6() && c.fam == IPv6)
}

// chainRules is one chain's rules: text holds every line "-A CHAIN ...\n",
// n the number of lines, and sum the text's hash. A fragment's chains
// give their text up once restored (see fragment.release): sum is what a
// partial sync compares them by, and a full sync builds them again.
type chainRules struct {
	name string
	text string
	sum  uint64
	n    int
}

// textSeed seeds the hashes of chain texts: random per process, so no
// Service's content can be chosen to collide with another version of its
// chain (a collision would leave the old rules in place).
var textSeed = maphash.MakeSeed()

// released reports whether c's text was given up after its restore.
func (c chainRules) released() bool { return c.text == "" && c.n > 0 }

func joinLines(name string, lines []string) chainRules {
	// Sized first: the text is kept for the port's life, and a Builder
	// grown by doubling keeps its spare room in the string it returns
	// (a quarter of it on average).
	n := len(lines)
	for _, l := range lines {
		n += len(l)
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	text := b.String()
	return chainRules{name: name, text: text, sum: maphash.String(textSeed, text), n: len(lines)}
}

// fragment is what one ServicePort contributes to one family's ruleset:
// its own nat chains, and its rules in the shared chains (dispatch).
type fragment struct {
	name   model.ServicePortName
	chains []chainRules
	*dispatch
	endpoints int
	// hairpin lists, with a hairpin set, the endpoints the port DNATs
	// to as members of the set, packed: 8 bytes each for IPv4 and no
	// pointer, where a netip.AddrPort takes 32 with one.
	hairpin packed
	proto   model.Protocol
	// masqPort is, with a ClusterIP set, the port whose ClusterIP
	// traffic is masqueraded unless it comes from a pod (0: none).
	masqPort uint16
}

// release gives up the text of f's chains, keeping their names, sums and
// rule counts: once a restore put them in the kernel, a partial sync only
// compares a rebuilt fragment's chains with them, and a full sync
// rebuilds every fragment (see Proxier.build). At 10,000 Services × 10
// endpoints the texts were 12.2 of the 29.65 MB the dataplane kept
// (BenchmarkSync, runner=null).
func (f *fragment) release() {
	for i := range f.chains {
		f.chains[i].text = ""
	}
}

// dispatch is a fragment's rules in the shared chains. A rebuilt fragment
// whose dispatch equals its predecessor's takes the predecessor's pointer
// (an endpoint change leaves it alone), so that a sync whose fragments all
// have the same dispatch pointers as the last one reuses the shared
// chains' text instead of joining 10,000s of lines again (see
// buildFamily).
type dispatch struct {
	// lines are the rules, shared chain by shared chain (dispatchChain
	// order): chain k's are lines[ends[k-1]:ends[k]]. One list instead
	// of one per chain: 80 bytes a port instead of 192 and up to six
	// arrays (1.1 MB at 10,000 Services).
	lines     []string
	ends      [numDispatch]uint16
	clusterIP netip.Addr
	// noPort is filter VIP-SERVICES' reject of the ClusterIP's other
	// ports, written once per ClusterIP (by its first fragment).
	noPort string
}

// tooManyAddrs reports whether sp has more external and load-balancer
// addresses than a port's dispatch rules can count (ends are 16 bits):
// at most 1 rule for its cluster IP, 2 per external IP, 3 per
// load-balancer IP, 1 and one per node port destination for its node
// port, 1 for its health check. No real Service comes near; one that does
// is skipped.
func tooManyAddrs(c *famConfig, sp *model.ServicePort) bool {
	return 1+2*len(sp.ExternalIPs)+3*len(sp.LoadBalancerIPs)+1+len(c.nodePortDests)+1 > math.MaxUint16
}

// dispatchChain is one of the shared chains a port writes rules in.
type dispatchChain int

const (
	natServices     dispatchChain = iota // nat VIP-SERVICES
	natNodePorts                         // nat VIP-NODEPORTS
	filterServices                       // filter VIP-SERVICES
	filterExternal                       // filter VIP-EXTERNAL-SERVICES
	filterNodePorts                      // filter VIP-NODEPORTS
	filterFW                             // filter VIP-FIREWALL
	numDispatch
)

// rules returns the port's rules in chain k.
func (d *dispatch) rules(k dispatchChain) []string {
	start := uint16(0)
	if k > 0 {
		start = d.ends[k-1]
	}
	return d.lines[start:d.ends[k]]
}

func (d *dispatch) equal(o *dispatch) bool {
	return d.clusterIP == o.clusterIP && d.noPort == o.noPort && d.ends == o.ends && slices.Equal(d.lines, o.lines)
}

// rw accumulates rule lines.
type rw struct{ lines []string }

func (w *rw) add(chain string, args ...string) {
	w.lines = append(w.lines, "-A "+chain+" "+JoinArgs(args))
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func comment(c string) []string { return []string{"-m", "comment", "--comment", c} }

func filterEPs(c *famConfig, eps []model.Endpoint) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range eps {
		if c.has(e.IP) && e.Port != 0 {
			out = append(out, e)
		}
	}
	return out
}

// buildPort returns sp's fragment for family c.fam, or nil when sp has no
// ClusterIP of that family. It follows kube-proxy's iptables proxier
// (syncProxyRules) rule for rule, with vipproxy's chain names, plus the
// reject of unknown ports on ClusterIPs that the nftables mode has: the
// plan decides which chains the port uses and where its traffic goes,
// then the dispatch rules (VIP-SERVICES, VIP-NODEPORTS and the filter
// chains) and the port's own chains are written from it.
func buildPort(c *famConfig, sp *model.ServicePort) *fragment {
	pl := planPort(c, sp)
	if pl == nil {
		return nil
	}
	f := &fragment{dispatch: &dispatch{clusterIP: pl.cip}, endpoints: len(pl.allEPs), proto: sp.Protocol}
	var w rw
	w.add(chainServices, cat(comment(sp.Name.ServiceName.String()+" has no such port"), []string{"-d", pl.cip.String(), "-j", chainReject})...)
	f.noPort = w.lines[0]
	pl.dispatch(f)
	pl.chains(f)
	return f
}

// portPlan is what buildPort decides for one ServicePort and family
// before it writes a rule.
type portPlan struct {
	c                            *famConfig
	sp                           *model.ServicePort
	spn, port                    string
	pp                           []string // -m proto -p proto
	ch                           portChains
	cip                          netip.Addr
	extIPs, lbIPs                []netip.Addr
	ranges                       []netip.Prefix
	clusterEPs, localEPs, allEPs []model.Endpoint
	hasEndpoints                 bool // a usable endpoint anywhere: else reject
	hasInternal, hasExternal     bool // the policy has endpoints here: else drop
	externallyAccessible         bool
	externalLocal                bool
	usesClusterChain             bool
	usesLocalChain               bool
	usesExtChain, usesFW         bool
	internalChain, externalChain string // the policy chains (SVC or SVL)
	lbChain                      string // EXT, or FW with source ranges
	intTarget, intComment        string // when !hasInternal
	extTarget, extComment        string // when !hasExternal
}

// planPort computes sp's plan for c.fam; nil without a ClusterIP of it.
func planPort(c *famConfig, sp *model.ServicePort) *portPlan {
	pl := &portPlan{c: c, sp: sp, cip: c.clusterIP(sp)}
	if !pl.cip.IsValid() {
		return nil
	}
	pl.spn = sp.Name.String()
	proto := strings.ToLower(string(sp.Protocol))
	pl.port, pl.pp = strconv.Itoa(int(sp.Port)), []string{"-m", proto, "-p", proto}
	pl.ch = chainsFor(pl.spn, string(sp.Protocol))
	pl.extIPs = slices.DeleteFunc(slices.Clone(sp.ExternalIPs), func(ip netip.Addr) bool { return !c.has(ip) })
	pl.lbIPs = slices.DeleteFunc(slices.Clone(sp.LoadBalancerIPs), func(ip netip.Addr) bool { return !c.has(ip) })
	pl.ranges = slices.DeleteFunc(slices.Clone(sp.LoadBalancerSourceRanges), func(p netip.Prefix) bool { return !c.has(p.Addr()) })
	pl.externallyAccessible = sp.NodePort != 0 || len(pl.extIPs) > 0 || len(pl.lbIPs) > 0
	pl.externalLocal = pl.externallyAccessible && sp.ExternalTrafficPolicy == model.PolicyLocal

	pl.clusterEPs, pl.localEPs = filterEPs(c, sp.ClusterEndpoints), filterEPs(c, sp.LocalEndpoints)
	pl.allEPs = filterEPs(c, sp.ReachableEndpoints())
	// hasEndpoints: the port has a usable endpoint anywhere (ready, or
	// serving and terminating), even when its policy cannot use it here;
	// without any, traffic is rejected rather than dropped.
	pl.hasEndpoints = len(pl.allEPs) > 0 || slices.ContainsFunc(filterEPs(c, sp.Endpoints), func(e model.Endpoint) bool {
		return e.Ready || e.Serving && e.Terminating
	})
	pl.usesClusterChain = len(pl.clusterEPs) > 0 && sp.ClusterEndpoints != nil
	pl.usesLocalChain = len(pl.localEPs) > 0 && sp.LocalEndpoints != nil

	pl.internalChain, pl.hasInternal = pl.ch.svc, pl.hasEndpoints
	if sp.InternalPolicyLocal() {
		pl.internalChain, pl.hasInternal = pl.ch.svl, pl.hasEndpoints && len(pl.localEPs) > 0
	}
	pl.externalChain, pl.hasExternal = pl.ch.svc, pl.hasEndpoints
	if pl.externalLocal {
		pl.externalChain, pl.hasExternal = pl.ch.svl, pl.hasEndpoints && len(pl.localEPs) > 0
	}
	pl.usesExtChain = pl.hasEndpoints && pl.externallyAccessible
	pl.usesFW = pl.hasEndpoints && len(pl.lbIPs) > 0 && len(pl.ranges) > 0
	pl.lbChain = pl.ch.ext
	if pl.usesFW {
		pl.lbChain = pl.ch.fw
	}
	switch {
	case !pl.hasEndpoints:
		pl.intTarget, pl.intComment = chainReject, pl.spn+" has no endpoints"
		pl.extTarget, pl.extComment = pl.intTarget, pl.intComment
	default:
		if !pl.hasInternal {
			pl.intTarget, pl.intComment = "DROP", pl.spn+" has no local endpoints"
		}
		if !pl.hasExternal {
			pl.extTarget, pl.extComment = "DROP", pl.spn+" has no local endpoints"
		}
	}
	return pl
}

// dispatch writes the port's rules in the shared chains: nat
// VIP-SERVICES and VIP-NODEPORTS (to its chains), filter VIP-SERVICES,
// VIP-EXTERNAL-SERVICES, VIP-NODEPORTS and VIP-FIREWALL (reject, drop,
// health check, source ranges).
func (pl *portPlan) dispatch(f *fragment) {
	var w [numDispatch]rw // the rules of each shared chain
	spn, pp, port := pl.spn, pl.pp, pl.port
	dst := func(ip netip.Addr, target string) []string {
		return []string{"-d", ip.String(), "--dport", port, "-j", target}
	}
	if pl.hasInternal {
		w[natServices].add(chainServices, cat(comment(spn+" cluster IP"), pp, dst(pl.cip, pl.internalChain))...)
	} else {
		w[filterServices].add(chainServices, cat(comment(pl.intComment), pp, dst(pl.cip, pl.intTarget))...)
	}
	for _, ip := range pl.extIPs {
		if pl.hasEndpoints {
			w[natServices].add(chainServices, cat(comment(spn+" external IP"), pp, dst(ip, pl.ch.ext))...)
		}
		if !pl.hasExternal {
			w[filterExternal].add(chainExternalServices, cat(comment(pl.extComment), pp, dst(ip, pl.extTarget))...)
		}
	}
	for _, ip := range pl.lbIPs {
		if pl.hasEndpoints {
			w[natServices].add(chainServices, cat(comment(spn+" loadbalancer IP"), pp, dst(ip, pl.lbChain))...)
		}
		if pl.usesFW {
			w[filterFW].add(chainFirewall, cat(comment(spn+" traffic not accepted by "+pl.ch.fw), pp, dst(ip, "DROP"))...)
		}
	}
	if !pl.hasExternal {
		for _, ip := range pl.lbIPs {
			w[filterExternal].add(chainExternalServices, cat(comment(pl.extComment), pp, dst(ip, pl.extTarget))...)
		}
	}
	if pl.sp.NodePort != 0 {
		np := strconv.Itoa(int(pl.sp.NodePort))
		if pl.hasEndpoints {
			w[natNodePorts].add(chainNodePorts, cat(comment(spn), pp, []string{"--dport", np, "-j", pl.ch.ext})...)
		}
		if !pl.hasExternal {
			for _, d := range pl.c.nodePortDests {
				w[filterExternal].add(chainExternalServices, cat(comment(pl.extComment), d, pp, []string{"--dport", np, "-j", pl.extTarget})...)
			}
		}
	}
	if pl.sp.HealthCheckNodePort != 0 {
		w[filterNodePorts].add(chainNodePorts, cat(comment(spn+" health check node port"), []string{"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(pl.sp.HealthCheckNodePort)), "-j", "ACCEPT"})...)
	}
	n := 0
	for k := range w {
		n += len(w[k].lines)
	}
	f.lines = make([]string, 0, n) // fits 16-bit ends (see tooManyAddrs)
	for k := range w {
		f.lines = append(f.lines, w[k].lines...)
		f.ends[k] = uint16(len(f.lines))
	}
}

// chainSet collects a port's chains in the order they were first written.
type chainSet struct {
	m     map[string]*rw
	order []string
}

func (cs *chainSet) get(name string) *rw {
	if w := cs.m[name]; w != nil {
		return w
	}
	if cs.m == nil {
		cs.m = map[string]*rw{}
	}
	w := &rw{}
	cs.m[name] = w
	cs.order = append(cs.order, name)
	return w
}

// chains writes the port's own chains: the internal policy chain's
// masquerade, EXT, FW, SVC/SVL (balance) and one SEP per endpoint, and
// an empty chain for every one of its chains a rule jumps to.
func (pl *portPlan) chains(f *fragment) {
	var cs chainSet
	if pl.hasInternal {
		pl.internalMasq(cs.get(pl.internalChain), f)
	}
	if pl.usesExtChain {
		pl.extChain(cs.get(pl.ch.ext))
	}
	if pl.usesFW {
		pl.fwChain(cs.get(pl.ch.fw))
	}
	c, sp, spn := pl.c, pl.sp, pl.spn
	seps := &sepNames{spn: spn, proto: string(sp.Protocol), m: map[netip.AddrPort]string{}}
	if pl.usesClusterChain {
		pl.writeBalance(cs.get(pl.ch.svc), pl.ch.svc, seps, pl.clusterEPs)
	}
	if pl.usesLocalChain {
		pl.writeBalance(cs.get(pl.ch.svl), pl.ch.svl, seps, pl.localEPs)
	}
	if c.hairpinSet != "" {
		ms := make([]setMember, 0, len(pl.allEPs))
		for _, ep := range pl.allEPs {
			m := newSetMember(netip.AddrPortFrom(ep.IP, ep.Port), sp.Protocol)
			if !slices.Contains(ms, m) {
				ms = append(ms, m)
			}
		}
		f.hairpin = packMembers(ms)
	}
	for _, ep := range pl.allEPs {
		if !pl.endpointChains() {
			break
		}
		sep := seps.get(ep)
		w := cs.get(sep)
		base := []string{}
		if !c.largeCluster {
			base = comment(spn)
		}
		if c.hairpinSet == "" {
			w.add(sep, cat(base, []string{"-s", ep.IP.String(), "-j", chainMarkMasq})...)
		}
		args := base
		if sp.AffinityTimeoutSeconds > 0 {
			args = cat(args, []string{"-m", "recent", "--name", sep, "--set"})
		}
		w.add(sep, cat(args, pl.dnat(ep))...)
	}
	// Every chain some rule jumps to must exist.
	for _, l := range f.lines[:f.ends[natNodePorts]] {
		if t := lineTarget(l); strings.HasPrefix(t, "VIP-") && t != chainMarkMasq && t != chainMasqUnlessPod {
			cs.get(t)
		}
	}
	for _, name := range cs.order {
		for _, l := range cs.m[name].lines {
			if t := lineTarget(l); strings.HasPrefix(t, "VIP-SVC-") || strings.HasPrefix(t, "VIP-SVL-") || strings.HasPrefix(t, "VIP-EXT-") {
				cs.get(t)
			}
		}
	}
	f.chains = make([]chainRules, 0, len(cs.order))
	for _, name := range cs.order {
		f.chains = append(f.chains, joinLines(name, cs.m[name].lines))
	}
}

// internalMasq writes the internal traffic's masquerade: what is not pod
// traffic (all of it with masqueradeAll, none without a cluster CIDR).
func (pl *portPlan) internalMasq(w *rw, f *fragment) {
	c, chain := pl.c, pl.internalChain
	if c.clusterSet != "" {
		if c.unlessPod() != nil {
			f.masqPort = pl.sp.Port
		}
		return
	}
	if tail := c.unlessPod(); tail != nil {
		w.add(chain, cat(comment(pl.spn+" cluster IP"), pl.pp, []string{"-d", pl.cip.String(), "--dport", pl.port}, tail)...)
	}
}

// unlessPod returns the end of a rule that marks for masquerade what does
// not come from a pod (everything with masqueradeAll), or nil when pod
// traffic cannot be told apart (no cluster CIDR, no pod interface): as
// kube-proxy, nothing is masqueraded then (pods keep their source IP).
func (c *famConfig) unlessPod() []string {
	switch {
	case c.masqueradeAll:
		return []string{"-j", chainMarkMasq}
	case c.podIface != "":
		return []string{"!", "-i", c.podIface, "-j", chainMarkMasq}
	case len(c.clusterCIDRs) == 0:
		return nil
	case len(c.clusterCIDRs) == 1:
		return []string{"!", "-s", c.clusterCIDRs[0].String(), "-j", chainMarkMasq}
	default:
		return []string{"-j", chainMasqUnlessPod}
	}
}

// extChain writes the EXT chain: masquerade, then the external policy
// chain; under a Local policy pod and node traffic (which would have gone
// out to the load balancer and come back) uses the Cluster endpoints.
func (pl *portPlan) extChain(w *rw) {
	c, ext, spn := pl.c, pl.ch.ext, pl.spn
	if !pl.externalLocal {
		w.add(ext, cat(comment("masquerade traffic for "+spn+" external destinations"), []string{"-j", chainMarkMasq})...)
	} else {
		if pl.usesClusterChain {
			if c.podIface != "" {
				w.add(ext, cat(comment("pod traffic for "+spn+" external destinations"), []string{"-i", c.podIface, "-j", pl.ch.svc})...)
			} else {
				for _, cidr := range c.clusterCIDRs {
					w.add(ext, cat(comment("pod traffic for "+spn+" external destinations"), []string{"-s", cidr.String(), "-j", pl.ch.svc})...)
				}
			}
		}
		w.add(ext, cat(comment("masquerade LOCAL traffic for "+spn+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq})...)
		if pl.usesClusterChain {
			w.add(ext, cat(comment("route LOCAL traffic for "+spn+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", pl.ch.svc})...)
		}
	}
	if pl.hasExternal {
		w.add(ext, "-j", pl.externalChain)
	}
}

// fwChain writes the FW chain: the allowed source ranges (and the LB IPs
// themselves when a range holds a node IP) go on to EXT; the rest falls
// through to VIP-FIREWALL's drop.
func (pl *portPlan) fwChain(w *rw) {
	fw := pl.ch.fw
	fwc := comment(pl.spn + " loadbalancer IP")
	allowFromNode := false
	for _, r := range pl.ranges {
		w.add(fw, cat(fwc, []string{"-s", r.String(), "-j", pl.ch.ext})...)
		allowFromNode = allowFromNode || slices.ContainsFunc(pl.c.nodeIPs, r.Contains)
	}
	if allowFromNode {
		for _, ip := range pl.lbIPs {
			w.add(fw, cat(fwc, []string{"-s", ip.String(), "-j", pl.ch.ext})...)
		}
	}
	w.add(fw, comment("other traffic to "+pl.spn+" will be dropped by "+chainFirewall)...)
}

func lineTarget(l string) string {
	i := strings.LastIndex(l, " -j ")
	if i < 0 {
		return ""
	}
	t := l[i+4:]
	if j := strings.IndexByte(t, ' '); j >= 0 {
		t = t[:j]
	}
	return t
}

// endpointChains reports whether the port has a chain per endpoint: in
// kube-proxy's layout always (the hairpin mark, then the DNAT); with a
// hairpin set only under ClientIP affinity, whose endpoint chain records
// the choice (-m recent --set) as it DNATs. Otherwise the balancing rules
// DNAT themselves.
func (pl *portPlan) endpointChains() bool {
	return pl.c.hairpinSet == "" || pl.sp.AffinityTimeoutSeconds > 0
}

// dnat returns the matches and target that DNAT to ep. With a hairpin set
// the protocol match is "-p" alone, which iptables-nft compiles to native
// expressions; "-m tcp" would add an xtables-compat match to each of
// these (10 × N) rules, and every commit of the nat table validates every
// rule (see hairpin.go).
func (pl *portPlan) dnat(ep model.Endpoint) []string {
	pp := pl.pp
	if pl.c.hairpinSet != "" {
		pp = pp[2:]
	}
	return cat(pp, []string{"-j", "DNAT", "--to-destination", netip.AddrPortFrom(ep.IP, ep.Port).String()})
}

// writeBalance writes the affinity and random-choice rules of a service
// chain, as upstream's writeServiceToEndpointRules; without endpoint
// chains the random-choice rules DNAT themselves.
func (pl *portPlan) writeBalance(w *rw, chain string, seps *sepNames, eps []model.Endpoint) {
	c, spn, affinity := pl.c, pl.spn, pl.sp.AffinityTimeoutSeconds
	cmt := func(ep model.Endpoint) []string {
		if c.largeCluster {
			return nil
		}
		return comment(spn + " -> " + ep.String())
	}
	if affinity > 0 {
		for _, ep := range eps {
			sep := seps.get(ep)
			w.add(chain, cat(cmt(ep), []string{"-m", "recent", "--name", sep, "--rcheck", "--seconds", strconv.Itoa(affinity), "--reap", "-j", sep})...)
		}
	}
	to := func(ep model.Endpoint, args []string) {
		if pl.endpointChains() {
			w.add(chain, cat(args, []string{"-j", seps.get(ep)})...)
		} else {
			w.add(chain, cat(args, pl.dnat(ep))...)
		}
	}
	weights := make([]int, len(eps))
	rest := 0
	for i := range eps {
		weights[i] = eps[i].W()
		rest += weights[i]
	}
	if pl.sp.Balance == model.BalanceRoundRobin {
		// One rule per slot of the weighted table, each taking every
		// (slots left)th connection that reaches it: the slots in turn.
		slots := balance.Weighted(weights)
		if slots == nil {
			slots = make([]int, len(eps))
			for i := range slots {
				slots[i] = i
			}
		}
		for k, i := range slots {
			args := cmt(eps[i])
			if k < len(slots)-1 {
				args = cat(args, []string{"-m", "statistic", "--mode", "nth", "--every", strconv.Itoa(len(slots) - k), "--packet", "0"})
			}
			to(eps[i], args)
		}
		return
	}
	n := len(eps)
	for i, ep := range eps {
		args := cmt(ep)
		if i < n-1 {
			args = cat(args, []string{"-m", "statistic", "--mode", "random", "--probability", probability(weights[i], rest)})
		}
		rest -= weights[i]
		to(ep, args)
	}
}

// probability prints w/rest as upstream prints 1/n: the chance of taking
// an endpoint of weight w when the endpoints not yet passed weigh rest.
func probability(w, rest int) string {
	return fmt.Sprintf("%0.10f", float64(w)/float64(rest))
}
