package nftables

// The mode's rule-building function: port writes what one ServicePort
// contributes to one family's ruleset (chains, map and set elements),
// following kube-proxy's nftables proxier with vipproxy's shared
// dispatch chains and endpoint maps.

import (
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/balance"
	"github.com/vipproxy/vipproxy/internal/model"
)

// port adds everything of one ServicePort for w's family: the hairpin
// set members, the ClusterIP dispatch (internal), the externalIP, LB IP
// and NodePort dispatch (external) and the loadBalancerSourceRanges
// firewall.
func (w *portWriter) port(sp *model.ServicePort) {
	pc, ok := w.plan(sp)
	if !ok {
		return
	}
	hairpin := elemSet[setHairpin]
	for _, e := range w.eps(sp.ReachableEndpoints()) {
		w.arena = appendWireAddr(w.arena, e.IP)
		w.arena = appendWireAddr(w.arena, e.IP)
		w.spans = append(w.spans, span{hairpin, uint32(len(w.arena)), uint32(len(w.arena))})
	}
	if len(pc.vips) > 0 {
		w.internal(pc)
	}
	if len(pc.ext) == 0 && !pc.nodePort {
		return
	}
	w.external(pc)
	w.firewall(pc)
}

// portCtx is what port works out once for a ServicePort and family.
type portCtx struct {
	sp                  *model.ServicePort
	id, proto, port     string
	vips, extIPs, lbIPs []string
	ext                 []string // extIPs then lbIPs
	nodePort, sticky    bool
	// perPort: the port has its own chains (ClientIP affinity, or
	// round-robin, whose counter must not be shared with other ports).
	perPort           bool
	npPort, npKey     string
	hasEndpoints      bool   // a usable endpoint anywhere
	noEndpoints, mark string // verdict without endpoints; masquerade statement
	// events are the rules every chain of the port starts with, and evTag
	// the suffix of its shared chains' names (none and "" unless vipproxy
	// reads conntrack events; see observedEvents, sampledEvents and
	// quietEvents).
	events []string
	evTag  string
}

// observedEvents (one rule) limits the conntrack events the kernel
// reports for a flow of a port whose flows vipproxy reads (outlier
// ejection, per-endpoint metrics) to the ones package outlier and
// flowstat use: the entry's creation (the SYN), its assured state (the
// handshake done) and its end, instead of every state change. That is
// fewer messages for vipproxy to read (its CPU at 5,000 connections/s:
// 4.6-5.4 % of a core instead of 6.0-7.0 %) and fewer in the packets'
// path (about 4 us each: BENCHMARKS.md, "Sampled flows"). Set on the
// flow's first packet, before the conntrack entry is confirmed.
var observedEvents = []string{"ct event set new,destroy,assured"}

// sampledEvents are observedEvents for the new flows of a port with
// ServicePort.SampledFlows while its chain sees fewer than sampleAll a
// second, and for one in sampleEvery beyond that; the others report their
// end only. The kernel sends a flow's creation and assured events in the
// path of its packets (about 4 us each on a test VM's loopback, more on a
// veth path), but the end of a healthy flow from its garbage collector,
// minutes later (TIME_WAIT): so a sampled-out healthy flow costs its
// packets nothing. A refused SYN still reports at once (the kernel
// destroys the entry at the reset); an unanswered one is seen when
// observed, after which the ejector observes the endpoint's every flow
// (the SampledFlows contract). The rate keeps a quiet Service's flows all
// observed, where a sample would take long to catch a silent endpoint;
// the sample keeps a busy one's cost small. Measured: BENCHMARKS.md,
// "Sampled flows".
var sampledEvents = []string{
	"ct event set destroy",
	"limit rate " + strconv.Itoa(sampleAll) + "/second burst " + strconv.Itoa(sampleAll) + " packets " + observedEvents[0],
	"numgen random mod " + strconv.Itoa(sampleEvery) + " 0 " + observedEvents[0],
}

// sampleAll is the new flows a second a sampled port's chain observes in
// full, and sampleEvery the share (one in sampleEvery) of the flows beyond
// that it observes.
const (
	sampleAll   = 10
	sampleEvery = 8
)

// quietEvents turns off the conntrack events of a flow of a port whose
// flows vipproxy does not read while it listens (model.ServicePort
// QuietFlows): a flow that reports nothing costs the kernel no message,
// which while any listener runs is 20-30 us per TCP connect on our test
// VMs (BENCHMARKS.md, "Evening runs").
var quietEvents = []string{"ct event set 0x0"}

// lead returns rules with pc's events rules in front (a new slice).
func (pc *portCtx) lead(rules ...string) []string {
	if len(pc.events) == 0 {
		return rules
	}
	return append(slices.Clip(pc.events), rules...)
}

// plan returns sp's portCtx; ok is false when sp has nothing in w's
// family (or is invalid, which is logged).
func (w *portWriter) plan(sp *model.ServicePort) (pc portCtx, ok bool) {
	f := w.f
	pc = portCtx{sp: sp, proto: protoName(sp.Protocol)}
	if pc.proto == "" || sp.Port == 0 {
		w.b.log.Error("nftables: skipping invalid service port", "servicePort", sp.Name.String(),
			"protocol", string(sp.Protocol), "port", sp.Port)
		return pc, false
	}
	pc.id, pc.port = portID(sp.Name), strconv.Itoa(int(sp.Port))
	if !f.serves(sp) {
		return pc, false
	}
	pc.vips, pc.extIPs, pc.lbIPs = w.addrs(sp.ClusterIPs), w.addrs(sp.ExternalIPs), w.addrs(sp.LoadBalancerIPs)
	pc.ext = append(append([]string(nil), pc.extIPs...), pc.lbIPs...)
	pc.nodePort = sp.NodePort != 0 && f.npMatch != ""
	pc.hasEndpoints = slices.ContainsFunc(w.eps(sp.Endpoints), func(e model.Endpoint) bool { return e.Ready || (e.Serving && e.Terminating) }) ||
		slices.ContainsFunc(w.eps(sp.ReachableEndpoints()), func(e model.Endpoint) bool { return e.Ready || e.Serving })
	pc.noEndpoints = "goto " + chainReject
	if pc.hasEndpoints {
		pc.noEndpoints = "drop"
	}
	pc.mark = "meta mark set meta mark | " + f.mark
	pc.sticky = sp.AffinityTimeoutSeconds > 0
	pc.perPort = pc.sticky || sp.Balance == model.BalanceRoundRobin
	switch {
	case sp.FlowsRead() && sp.SampledFlows:
		pc.events, pc.evTag = sampledEvents, "-sampled"
	case sp.FlowsRead():
		pc.events, pc.evTag = observedEvents, "-observed"
	case sp.QuietFlows:
		pc.events, pc.evTag = quietEvents, "-quiet"
	}
	pc.npPort = strconv.Itoa(int(sp.NodePort))
	pc.npKey = pc.proto + " . " + pc.npPort
	return pc, true
}

// internal adds the ClusterIPs: their chain (masquerade, then the pick of
// an internal-policy endpoint) and map elements, or the no-endpoint
// verdict.
func (w *portWriter) internal(pc portCtx) {
	f, sp, proto := w.f, pc.sp, pc.proto
	internal := w.eps(sp.InternalEndpoints())
	pol := "cluster"
	if sp.InternalPolicyLocal() {
		pol = "local"
	}
	// Masquerade what is not pod traffic. Without a cluster CIDR of this
	// family pod traffic cannot be told apart and, as in kube-proxy,
	// nothing is masqueraded (pods keep their source IP), unless
	// masqueradeAll.
	var masq []string
	switch {
	case w.b.opts.MasqueradeAll:
		masq = []string{pc.mark}
	case f.notFromPod != "":
		masq = []string{f.notFromPod + " " + pc.mark}
	}
	var chain string
	switch {
	case len(internal) == 0:
	case pc.perPort:
		chain = "svc-" + pc.id
		w.chain(chain, pc.lead(append(masq, w.pick(sp, pc.id, pol, internal))...), false)
	default:
		t := w.table(sp, internal)
		chain = "int-" + pol + "-" + proto + "-" + t.tag + pc.evTag
		w.chain(chain, pc.lead(append(masq, w.dnatIP(pol, proto, t.sel))...), true)
		for _, vip := range pc.vips {
			w.endpoints(endpointMap(pol, "endpoints", proto), vip, pc.sp.Port, t.slots)
		}
	}
	for _, vip := range pc.vips {
		w.element(setClusterIPs, vip, "")
		key := vip + " . " + proto + " . " + pc.port
		if chain != "" {
			w.element(mapServiceIPs, key, "goto "+chain)
		} else {
			w.element(mapNoEndpointIPs, key, pc.noEndpoints)
		}
	}
}

// external adds the externalIPs, LB IPs and NodePort: their chains and
// map elements, or the no-endpoint verdict.
func (w *portWriter) external(pc portCtx) {
	sp, proto := pc.sp, pc.proto
	external := w.eps(sp.ExternalEndpoints())
	if pc.hasEndpoints {
		// ipChain serves external IPs, npChain NodePorts; they differ only
		// in the key of the endpoint map (address or port).
		var ipChain, npChain string
		switch {
		case pc.perPort:
			ipChain, npChain = w.externalPerPort(pc, external)
		case !sp.ExternalPolicyLocal():
			ipChain, npChain = w.externalCluster(pc, external)
		default:
			ipChain, npChain = w.externalLocal(pc, external)
		}
		if ipChain != "" {
			if len(pc.ext) == 0 && !pc.perPort {
				w.dropChain(ipChain)
			}
			if !pc.nodePort && !pc.perPort {
				w.dropChain(npChain)
			}
			for _, a := range pc.ext {
				w.element(mapServiceIPs, a+" . "+proto+" . "+pc.port, "goto "+ipChain)
			}
			if pc.nodePort {
				w.element(mapServiceNodePorts, pc.npKey, "goto "+npChain)
			}
		}
	}
	if len(external) == 0 {
		for _, a := range pc.ext {
			w.element(mapNoEndpointIPs, a+" . "+proto+" . "+pc.port, pc.noEndpoints)
		}
		if pc.nodePort {
			w.element(mapNoEndpointPorts, pc.npKey, pc.noEndpoints)
		}
	}
}

// shortCircuit returns the endpoints pod and node traffic to an external
// destination of a Local-policy port uses (it would have gone out to the
// load balancer and come back): the Cluster endpoints, or the Local ones
// when the port has no Cluster set; and the policy naming their map.
func (w *portWriter) shortCircuit(sp *model.ServicePort) ([]model.Endpoint, string) {
	if sp.ClusterEndpoints == nil {
		return w.eps(sp.LocalEndpoints), "local"
	}
	return w.eps(sp.ClusterEndpoints), "cluster"
}

// externalPerPort writes the one external chain of a port with chains of
// its own (ClientIP affinity, whose pick keeps per-endpoint timeout sets,
// or round-robin); "" when it has no rule.
func (w *portWriter) externalPerPort(pc portCtx, external []model.Endpoint) (ipChain, npChain string) {
	sp, f := pc.sp, w.f
	var rules []string
	if !sp.ExternalPolicyLocal() {
		if len(external) > 0 {
			rules = append(rules, pc.mark, w.pick(sp, pc.id, "cluster", external))
		}
	} else {
		if short, pol := w.shortCircuit(sp); len(short) > 0 {
			to := w.pick(sp, pc.id, pol, short)
			if f.fromPod != "" {
				rules = append(rules, f.fromPod+" "+to)
			}
			rules = append(rules, "fib saddr type local "+pc.mark+" "+to)
		}
		if len(external) > 0 {
			rules = append(rules, w.pick(sp, pc.id, "local", external))
		}
	}
	if len(rules) == 0 {
		return "", ""
	}
	w.chain("ext-"+pc.id, pc.lead(rules...), false)
	return "ext-" + pc.id, "ext-" + pc.id
}

// externalCluster writes the shared chains of externalTrafficPolicy
// Cluster (masquerade, then an endpoint from the cluster map) and the
// port's endpoint-map elements.
func (w *portWriter) externalCluster(pc portCtx, external []model.Endpoint) (ipChain, npChain string) {
	proto := pc.proto
	if len(external) == 0 {
		return "", ""
	}
	t := w.table(pc.sp, external)
	ipChain, npChain = "ext-cluster-"+proto+"-"+t.tag+pc.evTag, "np-cluster-"+proto+"-"+t.tag+pc.evTag
	w.chain(ipChain, pc.lead(pc.mark, w.dnatIP("cluster", proto, t.sel)), true)
	w.chain(npChain, pc.lead(pc.mark, w.dnatNP("cluster", proto, t.sel)), true)
	for _, a := range pc.ext {
		w.endpoints(endpointMap("cluster", "endpoints", proto), a, pc.sp.Port, t.slots)
	}
	if pc.nodePort {
		w.endpoints(endpointMap("cluster", "nodeport-endpoints", proto), "", pc.sp.NodePort, t.slots)
	}
	return ipChain, npChain
}

// externalLocal writes the shared chains of externalTrafficPolicy Local:
// pod and node traffic short-circuits to the Cluster endpoints (node
// traffic masqueraded), the rest goes to a local endpoint unmasqueraded.
func (w *portWriter) externalLocal(pc portCtx, external []model.Endpoint) (ipChain, npChain string) {
	f, proto := w.f, pc.proto
	short, _ := w.shortCircuit(pc.sp) // stored in the cluster maps either way
	if len(short)+len(external) == 0 {
		return "", ""
	}
	c, l := w.table(pc.sp, short), w.table(pc.sp, external)
	ipChain, npChain = "ext-local-"+proto+"-"+c.tag+"-"+l.tag+pc.evTag, "np-local-"+proto+"-"+c.tag+"-"+l.tag+pc.evTag
	var ipRules, npRules []string
	if len(c.slots) > 0 {
		if f.fromPod != "" {
			// Pod traffic to external destinations is subject to neither policy.
			ipRules = append(ipRules, f.fromPod+" "+w.dnatIP("cluster", proto, c.sel))
			npRules = append(npRules, f.fromPod+" "+w.dnatNP("cluster", proto, c.sel))
		}
		// Node traffic: its source is a local address; masquerade it.
		ipRules = append(ipRules, "fib saddr type local "+pc.mark+" "+w.dnatIP("cluster", proto, c.sel))
		npRules = append(npRules, "fib saddr type local "+pc.mark+" "+w.dnatNP("cluster", proto, c.sel))
	}
	if len(l.slots) > 0 {
		ipRules = append(ipRules, w.dnatIP("local", proto, l.sel))
		npRules = append(npRules, w.dnatNP("local", proto, l.sel))
	}
	w.chain(ipChain, pc.lead(ipRules...), true)
	w.chain(npChain, pc.lead(npRules...), true)
	for _, a := range pc.ext {
		w.endpoints(endpointMap("cluster", "endpoints", proto), a, pc.sp.Port, c.slots)
		w.endpoints(endpointMap("local", "endpoints", proto), a, pc.sp.Port, l.slots)
	}
	if pc.nodePort {
		w.endpoints(endpointMap("cluster", "nodeport-endpoints", proto), "", pc.sp.NodePort, c.slots)
		w.endpoints(endpointMap("local", "nodeport-endpoints", proto), "", pc.sp.NodePort, l.slots)
	}
	return ipChain, npChain
}

// firewall adds loadBalancerSourceRanges: checked before DNAT, on LB IPs
// only.
func (w *portWriter) firewall(pc portCtx) {
	f, sp := w.f, pc.sp
	var ranges []string
	for _, p := range sp.LoadBalancerSourceRanges {
		if f.has(p.Addr()) {
			ranges = append(ranges, prefixString(p))
		}
	}
	if len(pc.lbIPs) == 0 || len(ranges) == 0 {
		return
	}
	// As kube-proxy: when this node is inside the allowed ranges, so are
	// packets from the LB IPs themselves (a VIP-like load balancer whose
	// IP is local: the node's requests to it leave with the LB IP as
	// source).
	if w.nodeInRanges(sp.LoadBalancerSourceRanges) {
		for _, a := range pc.lbIPs {
			if !slices.ContainsFunc(sp.LoadBalancerSourceRanges, func(r netip.Prefix) bool { return r.Contains(netip.MustParseAddr(a)) }) {
				ranges = append(ranges, a)
			}
		}
	}
	sort.Strings(ranges)
	fw := "fw-" + pc.id
	w.chain(fw, []string{f.ip + " saddr != " + anonSet(ranges) + " drop"}, false)
	for _, a := range pc.lbIPs {
		w.element(mapFirewallIPs, a+" . "+pc.proto+" . "+pc.port, "goto "+fw)
	}
}

// portWriter computes one family's fragment for one ServicePort.
type portWriter struct {
	b  *builder
	f  *family
	fr *frag
	// arena holds the text of every element key and value the port
	// writes, spans where each is; elems turns them into the fragment's
	// elements, all substrings of one string: one allocation per port
	// instead of two or three per element (at 50,000 Services, 731,000
	// elements: 3.7 million allocations that the collector then marked).
	arena []byte
	spans []span
}

// span is one element in a portWriter's arena: its key is
// arena[k0:k1], its value arena[k1:v1], where k0 is the previous span's
// v1 (or 0): spans are back to back.
type span struct {
	set    uint8
	k1, v1 uint32
}

// element adds key→value, in nft syntax, to a static map (value "" for
// a set), in wire form. The writers make both from valid addresses and
// ports: one that cannot be encoded is a bug, logged, and the element
// left out.
func (w *portWriter) element(name, key, value string) {
	l := layouts[w.f.fam][name]
	k0 := len(w.arena)
	out, err := encodeFields(w.arena, l.key, key)
	if err == nil && len(l.val) > 0 {
		out, err = encodeFields(out, l.val, value)
		value = ""
	}
	if err != nil {
		w.arena = w.arena[:k0]
		w.b.log.Error("nftables: skipping an element that cannot be encoded", "map", name, "key", key, "err", err)
		return
	}
	k1 := k0 + width(l.key)
	w.arena = append(out, value...)
	w.spans = append(w.spans, span{elemSet[name], uint32(k1), uint32(len(w.arena))})
}

// elems returns the elements written so far and their text, for a
// fragment. The spans are back to back (element and endpoints append to
// the arena only), which is what lets a fragElem leave out where its key
// starts.
func (w *portWriter) elems() (string, []fragElem) {
	out := make([]fragElem, len(w.spans))
	for i, s := range w.spans {
		out[i] = fragElem{v1: s.v1, vlen: uint16(s.v1 - s.k1), set: s.set}
	}
	return string(w.arena), out
}

// chain sets the rules of one of the port's chains; shared says every
// port with this chain name has the same rules (see fragChain).
func (w *portWriter) chain(name string, rules []string, shared bool) {
	for i := range w.fr.chains {
		if w.fr.chains[i].name == name {
			w.fr.chains[i] = fragChain{name, rules, shared}
			return
		}
	}
	w.fr.chains = append(w.fr.chains, fragChain{name, rules, shared})
}

// dropChain removes one of the port's chains.
func (w *portWriter) dropChain(name string) {
	w.fr.chains = slices.DeleteFunc(w.fr.chains, func(c fragChain) bool { return c.name == name })
}

// affinitySet adds a ClientIP-affinity set with its timeout.
func (w *portWriter) affinitySet(name string, timeout int) {
	if !slices.ContainsFunc(w.fr.affinity, func(s fragSet) bool { return s.name == name }) {
		w.fr.affinity = append(w.fr.affinity, fragSet{name, timeout})
	}
}

func protoName(p model.Protocol) string {
	switch p {
	case model.TCP:
		return "tcp"
	case model.UDP:
		return "udp"
	case model.SCTP:
		return "sctp"
	}
	return ""
}

// portID names a ServicePort inside chain and set names.
func portID(n model.ServicePortName) string {
	port := n.Port
	if port == "" {
		port = "-"
	}
	return n.Namespace + "/" + n.Name + "/" + port + "/" + protoName(n.Protocol)
}

// eps returns the endpoints of in that w's family can program. It returns
// in itself when that is all of them (the common case), so callers must
// not modify the result.
func (w *portWriter) eps(in []model.Endpoint) []model.Endpoint {
	n := 0
	for _, e := range in {
		if w.f.has(e.IP) && e.Port != 0 {
			n++
		}
	}
	if n == len(in) {
		return in
	}
	if n == 0 {
		return nil
	}
	out := make([]model.Endpoint, 0, n)
	for _, e := range in {
		if w.f.has(e.IP) && e.Port != 0 {
			out = append(out, e)
		}
	}
	return out
}

func (w *portWriter) addrs(in []netip.Addr) []string {
	var out []string
	for _, a := range in {
		if w.f.has(a) {
			out = append(out, a.Unmap().String())
		}
	}
	return out
}

func (w *portWriter) endpointString(e model.Endpoint) string {
	if w.f.is6 {
		return "[" + e.IP.String() + "]:" + strconv.Itoa(int(e.Port))
	}
	return e.IP.Unmap().String() + ":" + strconv.Itoa(int(e.Port))
}

// affinitySetName names the timeout set that records the clients of
// endpoint e of port id (portID) with affinity for timeout seconds.
func affinitySetName(id string, e model.Endpoint, timeout int) string {
	return "aff-" + id + "/" + endpointName(e) + "/" + strconv.Itoa(timeout)
}

func endpointName(e model.Endpoint) string {
	return strings.ReplaceAll(e.IP.Unmap().String(), ":", "_") + "/" + strconv.Itoa(int(e.Port))
}

// pick returns the statement (rule tail) of a port with chains of its
// own that sends a packet to one of eps as sp's balancing table says
// (see table), through an anonymous map; with affinity it adds a sticky
// chain, one chain and one timeout set per endpoint, and returns a goto.
func (w *portWriter) pick(sp *model.ServicePort, id, label string, eps []model.Endpoint) string {
	proto := protoName(sp.Protocol)
	t := w.table(sp, eps)
	if sp.AffinityTimeoutSeconds > 0 {
		sticky := "sticky-" + label + "-" + id
		var rules, vmap []string
		for _, e := range eps {
			ep := "ep-" + id + "/" + endpointName(e)
			set := affinitySetName(id, e, sp.AffinityTimeoutSeconds)
			w.affinitySet(set, sp.AffinityTimeoutSeconds)
			w.chain(ep, []string{
				"update @" + set + " { " + w.f.ip + " saddr }",
				"meta l4proto " + proto + " dnat " + w.f.ip + " to " + w.endpointString(e),
			}, false)
			rules = append(rules, w.f.ip+" saddr @"+set+" goto "+ep)
		}
		for i, e := range t.slots {
			vmap = append(vmap, strconv.Itoa(i)+" : goto ep-"+id+"/"+endpointName(e))
		}
		rules = append(rules, t.sel+" vmap { "+strings.Join(vmap, " , ")+" }")
		w.chain(sticky, rules, false)
		return "goto " + sticky
	}
	if len(eps) == 1 {
		return "meta l4proto " + proto + " dnat " + w.f.ip + " to " + w.endpointString(eps[0])
	}
	items := make([]string, len(t.slots))
	for i, e := range t.slots {
		items[i] = strconv.Itoa(i) + " : " + e.IP.Unmap().String() + " . " + strconv.Itoa(int(e.Port))
	}
	return "meta l4proto " + proto + " dnat " + w.f.ip + " to " + t.sel + " map { " + strings.Join(items, ", ") + " }"
}

// hashSeed is the jhash seed of consistent-hash ports: fixed, so that a
// restart (or another node) hashes a client to the same slot.
const hashSeed = "0x76697070"

// balanceTable is a port's balancing table in one family: the endpoint
// of each slot, the expression that picks a slot, and the tag naming the
// shared chains that use it.
type balanceTable struct {
	slots []model.Endpoint
	sel   string
	tag   string
}

// table returns sp's balancing table over eps (model.Balance):
//
//   - default and random: one slot per endpoint, or weighted slots
//     (balance.Weighted) when weights differ; "numgen random mod N";
//     tag N (the shared chains of unweighted ports keep their names);
//   - round-robin: the same slots, "numgen inc mod N" (only in chains of
//     the port's own: the counter lives in the rule);
//   - consistent-hash: a Maglev table (balance.Maglev, keyed by
//     "address:port"), "jhash ip saddr mod M seed …", tag hM.
//
// eps empty: no slots, tag "0".
func (w *portWriter) table(sp *model.ServicePort, eps []model.Endpoint) balanceTable {
	if len(eps) == 0 {
		return balanceTable{tag: "0"}
	}
	weights := func() []int {
		ws := make([]int, len(eps))
		for i := range eps {
			ws[i] = eps[i].W()
		}
		return ws
	}
	if sp.Balance == model.BalanceConsistentHash {
		keys := make([]string, len(eps))
		for i := range eps {
			keys[i] = eps[i].String()
		}
		m := balance.MaglevSize(len(eps))
		idx := balance.Maglev(keys, weights(), m)
		slots := make([]model.Endpoint, len(idx))
		for i, k := range idx {
			slots[i] = eps[k]
		}
		mod := strconv.Itoa(m)
		return balanceTable{slots: slots, sel: "jhash " + w.f.ip + " saddr mod " + mod + " seed " + hashSeed, tag: "h" + mod}
	}
	slots := eps
	if !allWeightOne(eps) {
		if idx := balance.Weighted(weights()); idx != nil {
			slots = make([]model.Endpoint, len(idx))
			for i, k := range idx {
				slots[i] = eps[k]
			}
		}
	}
	n := strconv.Itoa(len(slots))
	gen := "numgen random mod "
	if sp.Balance == model.BalanceRoundRobin {
		gen = "numgen inc mod "
	}
	return balanceTable{slots: slots, sel: gen + n, tag: n}
}

func allWeightOne(eps []model.Endpoint) bool {
	for i := range eps {
		if eps[i].W() != 1 {
			return false
		}
	}
	return true
}

// dnatIP returns the statement that DNATs to the endpoint in the pol
// ("cluster" or "local") endpoint map under the packet's destination
// address, protocol and port and the slot sel picks.
//
// The maps are per protocol and the key names the protocol's own port
// field ("tcp dport"): nft 1.0.6 cannot read back a rule that combines a
// protocol match with "th dport" in a map key, so the generic form would
// break every later transaction.
func (w *portWriter) dnatIP(pol, proto, sel string) string {
	ip := w.f.ip
	return "dnat " + ip + " to " + ip + " daddr . " + proto + " dport . " + sel + " map @" + endpointMap(pol, "endpoints", proto)
}

// dnatNP is dnatIP for NodePorts: the map is keyed by port alone.
func (w *portWriter) dnatNP(pol, proto, sel string) string {
	return "dnat " + w.f.ip + " to " + proto + " dport . " + sel + " map @" + endpointMap(pol, "nodeport-endpoints", proto)
}

// nodeInRanges reports whether one of this node's IPs of w's family is in
// one of ranges.
func (w *portWriter) nodeInRanges(ranges []netip.Prefix) bool {
	for _, n := range w.b.opts.NodeIPs {
		if !w.f.has(n) {
			continue
		}
		for _, r := range ranges {
			if r.Contains(n.Unmap()) {
				return true
			}
		}
	}
	return false
}

// endpointMap names the endpoint map of a policy, kind and protocol.
func endpointMap(pol, kind, proto string) string { return pol + "-" + kind + "-" + proto }

// endpoints stores eps under addr . port . slot in an endpoint map, or
// port . slot in a NodePort one (addr ""); addr is in nft syntax, valid
// (see addrs).
func (w *portWriter) endpoints(name, addr string, port uint16, eps []model.Endpoint) {
	set := elemSet[name]
	var a netip.Addr
	if addr != "" {
		a = netip.MustParseAddr(addr)
	}
	for i, e := range eps {
		if a.IsValid() {
			w.arena = appendWireAddr(w.arena, a)
		}
		w.arena = appendWirePort(w.arena, port)
		w.arena = appendWireSlot(w.arena, i)
		k1 := len(w.arena)
		w.arena = appendWireAddr(w.arena, e.IP)
		w.arena = appendWirePort(w.arena, e.Port)
		w.spans = append(w.spans, span{set, uint32(k1), uint32(len(w.arena))})
	}
}
