package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

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
}

func (c *famConfig) has(a netip.Addr) bool {
	return a.IsValid() && (a.Is4() && c.fam == IPv4 || a.Is6() && !a.Is4In6() && c.fam == IPv6)
}

// chainRules is one chain's rules: text holds every line "-A CHAIN ...\n",
// n the number of lines.
type chainRules struct {
	name string
	text string
	n    int
}

func joinLines(name string, lines []string) chainRules {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return chainRules{name: name, text: b.String(), n: len(lines)}
}

// fragment is what one ServicePort contributes to one family's ruleset:
// its own nat chains, and its rules in the shared chains.
type fragment struct {
	name                                                      model.ServicePortName
	chains                                                    []chainRules
	natServices, natNodePorts                                 []string
	filterServices, filterExternal, filterNodePorts, filterFW []string
	clusterIP                                                 netip.Addr
	endpoints                                                 int
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

// validPort reports why sp cannot be programmed, or "".
func validPort(sp *model.ServicePort) string {
	switch sp.Protocol {
	case model.TCP, model.UDP, model.SCTP:
	default:
		return fmt.Sprintf("protocol %q is not TCP, UDP or SCTP", sp.Protocol)
	}
	if sp.Port == 0 {
		return "port is 0"
	}
	return ""
}

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
// reject of unknown ports on ClusterIPs that the nftables mode has.
func buildPort(c *famConfig, sp *model.ServicePort) *fragment {
	var cip netip.Addr
	for _, ip := range sp.ClusterIPs {
		if c.has(ip) {
			cip = ip
			break
		}
	}
	if !cip.IsValid() {
		return nil
	}
	spn := sp.Name.String()
	proto := strings.ToLower(string(sp.Protocol))
	port := strconv.Itoa(int(sp.Port))
	ch := chainsFor(spn, string(sp.Protocol))
	seps := &sepNames{spn: spn, proto: string(sp.Protocol), m: map[netip.AddrPort]string{}}
	var extIPs, lbIPs []netip.Addr
	for _, ip := range sp.ExternalIPs {
		if c.has(ip) {
			extIPs = append(extIPs, ip)
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if c.has(ip) {
			lbIPs = append(lbIPs, ip)
		}
	}
	var ranges []netip.Prefix
	for _, p := range sp.LoadBalancerSourceRanges {
		if c.has(p.Addr()) {
			ranges = append(ranges, p)
		}
	}
	externallyAccessible := sp.NodePort != 0 || len(extIPs) > 0 || len(lbIPs) > 0
	externalLocal := externallyAccessible && sp.ExternalTrafficPolicy == model.PolicyLocal

	clusterEPs := filterEPs(c, sp.ClusterEndpoints)
	localEPs := filterEPs(c, sp.LocalEndpoints)
	allEPs := filterEPs(c, sp.ReachableEndpoints())
	// hasEndpoints: the port has a usable endpoint anywhere (ready, or
	// serving and terminating), even when its policy cannot use it here;
	// without any, traffic is rejected rather than dropped.
	hasEndpoints := len(allEPs) > 0
	for _, e := range filterEPs(c, sp.Endpoints) {
		if e.Ready || e.Serving && e.Terminating {
			hasEndpoints = true
		}
	}

	usesClusterChain := len(clusterEPs) > 0 && sp.ClusterEndpoints != nil
	usesLocalChain := len(localEPs) > 0 && sp.LocalEndpoints != nil

	internalChain, hasInternal := ch.svc, hasEndpoints
	if sp.InternalPolicyLocal() {
		internalChain = ch.svl
		if len(localEPs) == 0 {
			hasInternal = false
		}
	}
	externalPolicyChain, hasExternal := ch.svc, hasEndpoints
	if externalLocal {
		externalPolicyChain = ch.svl
		if len(localEPs) == 0 {
			hasExternal = false
		}
	}
	usesExtChain := hasEndpoints && externallyAccessible
	lbChain := ch.ext
	usesFW := hasEndpoints && len(lbIPs) > 0 && len(ranges) > 0
	if usesFW {
		lbChain = ch.fw
	}

	var intTarget, intComment, extTarget, extComment string
	if !hasEndpoints {
		intTarget, intComment = chainReject, spn+" has no endpoints"
		extTarget, extComment = intTarget, intComment
	} else {
		if !hasInternal {
			intTarget, intComment = "DROP", spn+" has no local endpoints"
		}
		if !hasExternal {
			extTarget, extComment = "DROP", spn+" has no local endpoints"
		}
	}

	f := &fragment{clusterIP: cip, endpoints: len(allEPs)}
	var natSvc, natNP, fSvc, fExt, fNP, fFW rw
	pp := []string{"-m", proto, "-p", proto}

	// ClusterIP.
	if hasInternal {
		natSvc.add(chainServices, cat(comment(spn+" cluster IP"), pp, []string{"-d", cip.String(), "--dport", port, "-j", internalChain})...)
	} else {
		fSvc.add(chainServices, cat(comment(intComment), pp, []string{"-d", cip.String(), "--dport", port, "-j", intTarget})...)
	}
	// externalIPs.
	for _, ip := range extIPs {
		if hasEndpoints {
			natSvc.add(chainServices, cat(comment(spn+" external IP"), pp, []string{"-d", ip.String(), "--dport", port, "-j", ch.ext})...)
		}
		if !hasExternal {
			fExt.add(chainExternalServices, cat(comment(extComment), pp, []string{"-d", ip.String(), "--dport", port, "-j", extTarget})...)
		}
	}
	// Load-balancer IPs.
	for _, ip := range lbIPs {
		if hasEndpoints {
			natSvc.add(chainServices, cat(comment(spn+" loadbalancer IP"), pp, []string{"-d", ip.String(), "--dport", port, "-j", lbChain})...)
		}
		if usesFW {
			fFW.add(chainFirewall, cat(comment(spn+" traffic not accepted by "+ch.fw), pp, []string{"-d", ip.String(), "--dport", port, "-j", "DROP"})...)
		}
	}
	if !hasExternal {
		for _, ip := range lbIPs {
			fExt.add(chainExternalServices, cat(comment(extComment), pp, []string{"-d", ip.String(), "--dport", port, "-j", extTarget})...)
		}
	}
	// NodePort.
	if sp.NodePort != 0 {
		np := strconv.Itoa(int(sp.NodePort))
		if hasEndpoints {
			natNP.add(chainNodePorts, cat(comment(spn), pp, []string{"--dport", np, "-j", ch.ext})...)
		}
		if !hasExternal {
			for _, d := range c.nodePortDests {
				fExt.add(chainExternalServices, cat(comment(extComment), d, pp, []string{"--dport", np, "-j", extTarget})...)
			}
		}
	}
	// Health check node port.
	if sp.HealthCheckNodePort != 0 {
		fNP.add(chainNodePorts, cat(comment(spn+" health check node port"), []string{"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(sp.HealthCheckNodePort)), "-j", "ACCEPT"})...)
	}

	chains := map[string]*rw{}
	var order []string
	chainW := func(name string) *rw {
		if w := chains[name]; w != nil {
			return w
		}
		w := &rw{}
		chains[name] = w
		order = append(order, name)
		return w
	}

	// Internal traffic handling: masquerade what is not pod traffic (all of
	// it with masqueradeAll, none without a cluster CIDR).
	if hasInternal {
		w := chainW(internalChain)
		match := cat(comment(spn+" cluster IP"), pp, []string{"-d", cip.String(), "--dport", port})
		switch {
		case c.masqueradeAll:
			w.add(internalChain, cat(match, []string{"-j", chainMarkMasq})...)
		case c.podIface != "":
			w.add(internalChain, cat(match, []string{"!", "-i", c.podIface, "-j", chainMarkMasq})...)
		case len(c.clusterCIDRs) == 0:
			// Pod traffic cannot be told apart: as kube-proxy, masquerade
			// nothing (pods keep their source IP).
		case len(c.clusterCIDRs) == 1:
			w.add(internalChain, cat(match, []string{"!", "-s", c.clusterCIDRs[0].String(), "-j", chainMarkMasq})...)
		default:
			w.add(internalChain, cat(match, []string{"-j", chainMasqUnlessPod})...)
		}
	}
	// External traffic handling.
	if usesExtChain {
		w := chainW(ch.ext)
		if !externalLocal {
			w.add(ch.ext, cat(comment("masquerade traffic for "+spn+" external destinations"), []string{"-j", chainMarkMasq})...)
		} else {
			// Pod and node traffic to external destinations is not
			// subject to the Local policy (it would have gone out
			// to the load balancer and come back); it uses the
			// Cluster endpoints when the port has them.
			if usesClusterChain {
				if c.podIface != "" {
					w.add(ch.ext, cat(comment("pod traffic for "+spn+" external destinations"), []string{"-i", c.podIface, "-j", ch.svc})...)
				} else {
					for _, cidr := range c.clusterCIDRs {
						w.add(ch.ext, cat(comment("pod traffic for "+spn+" external destinations"), []string{"-s", cidr.String(), "-j", ch.svc})...)
					}
				}
			}
			w.add(ch.ext, cat(comment("masquerade LOCAL traffic for "+spn+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq})...)
			if usesClusterChain {
				w.add(ch.ext, cat(comment("route LOCAL traffic for "+spn+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", ch.svc})...)
			}
		}
		if hasExternal {
			w.add(ch.ext, "-j", externalPolicyChain)
		}
	}
	// Firewall chain.
	if usesFW {
		w := chainW(ch.fw)
		fwc := comment(spn + " loadbalancer IP")
		allowFromNode := false
		for _, r := range ranges {
			w.add(ch.fw, cat(fwc, []string{"-s", r.String(), "-j", ch.ext})...)
			for _, n := range c.nodeIPs {
				if r.Contains(n) {
					allowFromNode = true
				}
			}
		}
		if allowFromNode {
			for _, ip := range lbIPs {
				w.add(ch.fw, cat(fwc, []string{"-s", ip.String(), "-j", ch.ext})...)
			}
		}
		w.add(ch.fw, comment("other traffic to "+spn+" will be dropped by "+chainFirewall)...)
	}
	if usesClusterChain {
		writeBalance(c, chainW(ch.svc), ch.svc, spn, seps, sp.AffinityTimeoutSeconds, clusterEPs)
	}
	if usesLocalChain {
		writeBalance(c, chainW(ch.svl), ch.svl, spn, seps, sp.AffinityTimeoutSeconds, localEPs)
	}
	for _, ep := range allEPs {
		sep := seps.get(ep)
		w := chainW(sep)
		base := []string{}
		if !c.largeCluster {
			base = comment(spn)
		}
		w.add(sep, cat(base, []string{"-s", ep.IP.String(), "-j", chainMarkMasq})...)
		args := base
		if sp.AffinityTimeoutSeconds > 0 {
			args = cat(args, []string{"-m", "recent", "--name", sep, "--set"})
		}
		w.add(sep, cat(args, pp, []string{"-j", "DNAT", "--to-destination", netip.AddrPortFrom(ep.IP, ep.Port).String()})...)
	}
	// Every chain some rule jumps to must exist.
	for _, l := range cat(natSvc.lines, natNP.lines) {
		if t := lineTarget(l); strings.HasPrefix(t, "VIP-") && t != chainMarkMasq && t != chainMasqUnlessPod {
			chainW(t)
		}
	}
	for _, name := range order {
		for _, l := range chains[name].lines {
			if t := lineTarget(l); strings.HasPrefix(t, "VIP-SVC-") || strings.HasPrefix(t, "VIP-SVL-") || strings.HasPrefix(t, "VIP-EXT-") {
				chainW(t)
			}
		}
	}
	for _, name := range order {
		f.chains = append(f.chains, joinLines(name, chains[name].lines))
	}
	f.natServices, f.natNodePorts = natSvc.lines, natNP.lines
	f.filterServices, f.filterExternal, f.filterNodePorts, f.filterFW = fSvc.lines, fExt.lines, fNP.lines, fFW.lines
	return f
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

// writeBalance writes the affinity and random-choice rules of a service
// chain, as upstream's writeServiceToEndpointRules.
func writeBalance(c *famConfig, w *rw, chain, spn string, seps *sepNames, affinity int, eps []model.Endpoint) {
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
	n := len(eps)
	for i, ep := range eps {
		sep := seps.get(ep)
		args := cmt(ep)
		if i < n-1 {
			args = cat(args, []string{"-m", "statistic", "--mode", "random", "--probability", probability(n - i)})
		}
		w.add(chain, cat(args, []string{"-j", sep})...)
	}
}

// probability prints 1/n as upstream does.
func probability(n int) string {
	return fmt.Sprintf("%0.10f", 1.0/float64(n))
}

// portEqual reports whether a and b program the same rules.
func portEqual(a, b *model.ServicePort) bool {
	return a.Name == b.Name && a.Type == b.Type && a.Port == b.Port && a.Protocol == b.Protocol &&
		a.NodePort == b.NodePort && a.AffinityTimeoutSeconds == b.AffinityTimeoutSeconds &&
		a.InternalTrafficPolicy == b.InternalTrafficPolicy && a.ExternalTrafficPolicy == b.ExternalTrafficPolicy &&
		a.HealthCheckNodePort == b.HealthCheckNodePort && a.TrafficDistribution == b.TrafficDistribution &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) && slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) && slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		endpointsEqual(a.Endpoints, b.Endpoints) && endpointsEqual(a.ClusterEndpoints, b.ClusterEndpoints) &&
		endpointsEqual(a.LocalEndpoints, b.LocalEndpoints)
}

func endpointsEqual(a, b []model.Endpoint) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.IP != y.IP || x.Port != y.Port || x.Ready != y.Ready || x.Serving != y.Serving ||
			x.Terminating != y.Terminating || x.Local != y.Local || x.NodeName != y.NodeName || x.Zone != y.Zone {
			return false
		}
	}
	return true
}
