package nftables

import (
	"fmt"

	"sigs.k8s.io/knftables"
)

// TableName is the name of vipproxy's table in each family.
const TableName = "vipproxy"

// kubeProxyTable is the table kube-proxy's nftables mode uses in each family.
const kubeProxyTable = "kube-proxy"

// families are the families vipproxy programs, one table each.
var families = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}

// Names of the static chains, maps and sets.
const (
	chainServices      = "services"
	chainFirewallCheck = "firewall-check"
	chainEndpointCheck = "service-endpoints-check"
	chainNodePortCheck = "nodeport-endpoints-check"
	chainClusterIPs    = "cluster-ips-check"
	chainReject        = "reject-chain"
	chainMasquerading  = "masquerading"
	chainNATPrerouting = "nat-prerouting"

	mapServiceIPs       = "service-ips"
	mapServiceNodePorts = "service-nodeports"
	mapNoEndpointIPs    = "no-endpoint-services"
	mapNoEndpointPorts  = "no-endpoint-nodeports"
	mapFirewallIPs      = "firewall-ips"
	setClusterIPs       = "cluster-ips"
	setHairpin          = "hairpin"
)

// baseChain is a chain attached to a netfilter hook. Its rules are fixed;
// everything that depends on Services lives in maps and per-port chains.
type baseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
	rules    []string
}

// baseChains is the hook layout (one table per family, same in both).
// Order of traversal for a new connection:
//
//	prerouting: filter-prerouting-pre-dnat (firewall) → nat-prerouting (DNAT)
//	            → filter-forward / filter-input (reject/drop what was not DNATed)
//	output:     filter-output-pre-dnat → nat-output → filter-output
//	postrouting: nat-postrouting (masquerade marked and hairpin traffic)
//
// Reject and drop decisions run after DNAT on purpose: a packet whose
// destination was rewritten no longer matches a VIP there.
var baseChains = []baseChain{
	{"filter-prerouting-pre-dnat", knftables.FilterType, knftables.PreroutingHook, "dstnat - 10", []string{"ct state new jump " + chainFirewallCheck}},
	{"filter-output-pre-dnat", knftables.FilterType, knftables.OutputHook, "-110", []string{"ct state new jump " + chainFirewallCheck}},
	{chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, []string{"jump " + chainServices}},
	{"nat-output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority, []string{"jump " + chainServices}},
	{"filter-forward", knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority, []string{
		"ct state new jump " + chainEndpointCheck, "ct state new jump " + chainClusterIPs}},
	{"filter-input", knftables.FilterType, knftables.InputHook, knftables.FilterPriority, []string{
		"ct state new jump " + chainNodePortCheck, "ct state new jump " + chainEndpointCheck}},
	{"filter-output", knftables.FilterType, knftables.OutputHook, knftables.FilterPriority, []string{
		"ct state new jump " + chainEndpointCheck, "ct state new jump " + chainClusterIPs}},
	{"nat-postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, []string{"jump " + chainMasquerading}},
}

// staticMap is a map whose elements the proxier owns.
type staticMap struct {
	name, typ string
	typeOf    bool // typ is a "typeof" expression
}

// staticMaps returns the dispatch maps of a family.
func staticMaps(ip string) []staticMap {
	addr := addrType(ip)
	m := []staticMap{
		{mapServiceIPs, addr + " . inet_proto . inet_service : verdict", false},
		{mapServiceNodePorts, "inet_proto . inet_service : verdict", false},
		{mapNoEndpointIPs, addr + " . inet_proto . inet_service : verdict", false},
		{mapNoEndpointPorts, "inet_proto . inet_service : verdict", false},
		{mapFirewallIPs, addr + " . inet_proto . inet_service : verdict", false},
	}
	// Endpoint maps: (address | NodePort) . port . slot → endpoint, one per
	// policy and protocol (see portWriter.dnatIP).
	for _, pol := range []string{"cluster", "local"} {
		for _, proto := range []string{"tcp", "udp", "sctp"} {
			m = append(m,
				staticMap{endpointMap(pol, "endpoints", proto), ip + " daddr . " + proto + " dport . numgen random mod 1 : " + ip + " daddr . " + proto + " dport", true},
				staticMap{endpointMap(pol, "nodeport-endpoints", proto), proto + " dport . numgen random mod 1 : " + ip + " daddr . " + proto + " dport", true})
		}
	}
	return m
}

// staticSets returns the element sets of a family.
func staticSets(ip string) []staticMap {
	addr := addrType(ip)
	return []staticMap{
		{setClusterIPs, addr, false},
		{setHairpin, addr + " . " + addr, false},
	}
}

func addrType(ip string) string {
	if ip == "ip6" {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// staticChains returns the regular (hookless) chains whose rules depend
// only on Options, for one family. npMatch is the match for addresses that
// accept NodePorts ("" when the family has none).
func staticChains(ip, npMatch, serviceCIDRs string, masqMark uint32) map[string][]string {
	m := fmt.Sprintf("0x%x", masqMark)
	c := map[string][]string{
		chainServices:      {ip + " daddr . meta l4proto . th dport vmap @" + mapServiceIPs},
		chainFirewallCheck: {ip + " daddr . meta l4proto . th dport vmap @" + mapFirewallIPs},
		chainEndpointCheck: {ip + " daddr . meta l4proto . th dport vmap @" + mapNoEndpointIPs},
		chainNodePortCheck: nil,
		chainClusterIPs:    {ip + " daddr @" + setClusterIPs + " goto " + chainReject},
		chainReject:        {"meta l4proto tcp reject with tcp reset", "reject"},
		chainMasquerading: {
			"ct status dnat " + ip + " saddr . " + ip + " daddr @" + setHairpin + " meta mark set meta mark | " + m,
			"meta mark & " + m + " == 0 return",
			"meta mark set meta mark ^ " + m + " masquerade fully-random",
		},
	}
	if npMatch != "" {
		c[chainServices] = append(c[chainServices], npMatch+" meta l4proto . th dport vmap @"+mapServiceNodePorts)
		c[chainNodePortCheck] = []string{npMatch + " meta l4proto . th dport vmap @" + mapNoEndpointPorts}
	}
	if serviceCIDRs != "" {
		c[chainClusterIPs] = append(c[chainClusterIPs], ip+" daddr "+serviceCIDRs+" drop")
	}
	return c
}
