package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// The ipsets of the IPVS mode, by base name; setName adds the family
// prefix (VIPVS- for IPv4, VIPVS6- for IPv6). Every dynamic decision of
// the mode's iptables rules is a set lookup, so a partial sync changes
// set members only, except the sticky chains of ClientIP affinity shorter
// than persistence holds (sticky.go), rewritten when their rules change.
const (
	setClusterIP     = "CLUSTER-IP"      // ClusterIP,proto:port
	setExternal      = "EXTERNAL-IP"     // externalIP,proto:port (externalTrafficPolicy Cluster)
	setExternalLocal = "EXTERNAL-LOCAL"  // externalIP,proto:port (Local)
	setLB            = "LB"              // LB ingress IP,proto:port (Cluster)
	setLBLocal       = "LB-LOCAL"        // LB ingress IP,proto:port (Local)
	setLBFW          = "LB-FW"           // LB IP,proto:port with loadBalancerSourceRanges
	setLBSrc         = "LB-SRC"          // LB IP,proto:port,allowed source prefix
	setNodePort      = "NODE-PORT"       // nodeIP,proto:nodePort (Cluster)
	setNodePortLocal = "NODE-PORT-LOCAL" // nodeIP,proto:nodePort (Local)
	setLoopBack      = "LOOP-BACK"       // endpointIP,proto:port,endpointIP (hairpin masquerade)
	setReject        = "NO-EP-REJECT"    // VIP,proto:port of virtual servers without endpoints
	setDrop          = "NO-EP-DROP"      // same, where a Local policy says drop
	setVIPs          = "VIPS"            // every ClusterIP (unknown ports on them are rejected)
)

// setTypes gives each set's ipset type.
var setTypes = map[string]string{
	setClusterIP: "hash:ip,port", setExternal: "hash:ip,port", setExternalLocal: "hash:ip,port",
	setLB: "hash:ip,port", setLBLocal: "hash:ip,port", setLBFW: "hash:ip,port",
	setLBSrc: "hash:ip,port,net", setNodePort: "hash:ip,port", setNodePortLocal: "hash:ip,port",
	setLoopBack: "hash:ip,port,ip", setReject: "hash:ip,port", setDrop: "hash:ip,port", setVIPs: "hash:ip",
}

// setBases lists the sets in a fixed order.
var setBases = []string{setClusterIP, setExternal, setExternalLocal, setLB, setLBLocal, setLBFW, setLBSrc,
	setNodePort, setNodePortLocal, setLoopBack, setReject, setDrop, setVIPs}

// SetPrefix and SetPrefix6 start the names of vipproxy's IPv4 and IPv6
// ipsets; ChainPrefix starts its iptables chains.
const (
	SetPrefix   = "VIPVS-"
	SetPrefix6  = "VIPVS6-"
	ChainPrefix = "VIPVS-"
)

func setName(fam iptables.Family, base string) string {
	if fam == iptables.IPv6 {
		return SetPrefix6 + base
	}
	return SetPrefix + base
}

func tmpSetName(fam iptables.Family, base string) string {
	return setName(fam, "T-"+base)
}

func setCreate(fam iptables.Family, name, base string) string {
	f := "inet"
	if fam == iptables.IPv6 {
		f = "inet6"
	}
	return fmt.Sprintf("create %s %s family %s maxelem %d", name, setTypes[base], f, ipset.MaxElem)
}

func familyOf(a netip.Addr) iptables.Family {
	if a.Is4() {
		return iptables.IPv4
	}
	return iptables.IPv6
}

func protoLower(p model.Protocol) string { return strings.ToLower(string(p)) }

// member formats the ipset member "ip,proto:port".
func member(ip netip.Addr, proto model.Protocol, port uint16) string {
	return fmt.Sprintf("%s,%s:%d", ip, protoLower(proto), port)
}

// setState holds wanted members per family and set base name.
type setState map[iptables.Family]map[string]map[string]bool

func (s setState) add(fam iptables.Family, base, m string) {
	if s[fam] == nil {
		s[fam] = map[string]map[string]bool{}
	}
	if s[fam][base] == nil {
		s[fam][base] = map[string]bool{}
	}
	s[fam][base][m] = true
}

// setsFull returns the ipset script that creates every set of fam and
// replaces its content atomically: fill a new temporary set, then swap it
// with the set (and destroy the old one) or, when there is none, rename
// it. exists says which sets are there. The temporary set is always
// created anew, so a set made with other parameters (ipset's default
// maxelem, before ipset.MaxElem) is replaced, where "create -exist" would
// fail on it.
func setsFull(fam iptables.Family, want map[string]map[string]bool, exists func(string) bool) []byte {
	var b strings.Builder
	for _, base := range setBases {
		name, tmp := setName(fam, base), tmpSetName(fam, base)
		if exists(tmp) {
			b.WriteString("destroy " + tmp + "\n")
		}
		b.WriteString(setCreate(fam, tmp, base) + "\n")
		for _, m := range slices.Sorted(maps.Keys(want[base])) {
			b.WriteString("add " + tmp + " " + m + "\n")
		}
		if exists(name) {
			b.WriteString("swap " + tmp + " " + name + "\n")
			b.WriteString("destroy " + tmp + "\n")
		} else {
			b.WriteString("rename " + tmp + " " + name + "\n")
		}
	}
	return []byte(b.String())
}

// setsDiff returns the ipset script that turns have into want (nil when
// nothing changed): dels first, then adds, each sorted.
func setsDiff(fam iptables.Family, have, want map[string]map[string]bool) []byte {
	var dels, adds []string
	for _, base := range setBases {
		name := setName(fam, base)
		for m := range have[base] {
			if !want[base][m] {
				dels = append(dels, "del "+name+" "+m+" -exist")
			}
		}
		for m := range want[base] {
			if !have[base][m] {
				adds = append(adds, "add "+name+" "+m+" -exist")
			}
		}
	}
	if len(dels)+len(adds) == 0 {
		return nil
	}
	slices.Sort(dels)
	slices.Sort(adds)
	return []byte(strings.Join(append(dels, adds...), "\n") + "\n")
}

// The iptables chains of the IPVS mode and the built-in chains that jump
// to them.
const (
	chainServices    = ChainPrefix + "SERVICES"
	chainPostrouting = ChainPrefix + "POSTROUTING"
	chainMarkMasq    = ChainPrefix + "MARK-MASQ"
	chainClusterMasq = ChainPrefix + "CLUSTER-MASQ"
	chainFilter      = ChainPrefix + "FILTER"
	chainFirewall    = ChainPrefix + "FIREWALL"
	chainCIDR        = ChainPrefix + "SERVICE-CIDR"
	chainOutput      = ChainPrefix + "OUTPUT"
)

// TableMangle is the table of the rule that must run before IPVS sees the
// node's own packets (IPVS hooks LOCAL_OUT at priority -99, after mangle).
const TableMangle = "mangle"

// tables lists the tables the IPVS mode writes.
var tables = []string{iptables.TableNAT, iptables.TableFilter, TableMangle}

// jump is a rule in a built-in chain that jumps to one of ours.
type jump struct{ table, from, to string }

var jumps = []jump{
	{iptables.TableNAT, "PREROUTING", chainServices},
	{iptables.TableNAT, "OUTPUT", chainServices},
	{iptables.TableNAT, "POSTROUTING", chainPostrouting},
	{iptables.TableFilter, "INPUT", chainFilter},
	{iptables.TableFilter, "FORWARD", chainCIDR},
	{iptables.TableFilter, "OUTPUT", chainCIDR},
	{TableMangle, "OUTPUT", chainOutput},
}

// ownChains lists the chains of each table.
var ownChains = map[string][]string{
	iptables.TableNAT:    {chainServices, chainPostrouting, chainMarkMasq, chainClusterMasq, chainAffinity, chainLearn},
	iptables.TableFilter: {chainFilter, chainFirewall, chainCIDR},
	TableMangle:          {chainOutput},
}

func matchSet(fam iptables.Family, base, dirs string) string {
	return "-m set --match-set " + setName(fam, base) + " " + dirs
}

// chainRules returns the rules of every chain of table for fam. They
// depend on the options only; Service changes touch set members.
func (p *Proxier) chainRules(fam iptables.Family, table string) map[string][]string {
	r := map[string][]string{}
	add := func(chain string, rule string) { r[chain] = append(r[chain], "-A "+chain+" "+rule) }
	mark := fmt.Sprintf("%#x", uint32(1)<<p.opts.MasqueradeBit)
	switch table {
	case iptables.TableNAT:
		add(chainMarkMasq, "-j MARK --or-mark "+mark)
		add(chainPostrouting, "-j "+chainLearn)
		add(chainPostrouting, matchSet(fam, setLoopBack, "dst,dst,src")+` -m comment --comment "hairpin: endpoint to itself" -j MASQUERADE`)
		add(chainPostrouting, "-m mark ! --mark "+mark+"/"+mark+" -j RETURN")
		add(chainPostrouting, "-j MARK --xor-mark "+mark)
		add(chainPostrouting, "-j MASQUERADE --random-fully")
		cidrs := 0
		switch {
		case p.opts.MasqueradeAll:
		case p.opts.PodInterface != "":
			iface := p.opts.PodInterface
			if p.opts.PodInterfacePrefix {
				iface += "+"
			}
			add(chainClusterMasq, "-i "+iface+" -j RETURN")
			cidrs++
		default:
			for _, c := range p.opts.ClusterCIDRs {
				if familyOf(c.Addr()) == fam {
					add(chainClusterMasq, "-s "+c.String()+" -j RETURN")
					cidrs++
				}
			}
		}
		// Without a cluster CIDR of this family pod traffic cannot be told
		// apart: as kube-proxy, ClusterIP traffic is then not masqueraded
		// at all (unless masqueradeAll).
		if cidrs > 0 || p.opts.MasqueradeAll {
			add(chainClusterMasq, "-j "+chainMarkMasq)
		}
		add(chainServices, matchSet(fam, setClusterIP, "dst,dst")+" -j "+chainClusterMasq)
		for _, base := range []string{setExternal, setLB, setNodePort} {
			add(chainServices, matchSet(fam, base, "dst,dst")+" -j "+chainMarkMasq)
		}
		if p.opts.MasqueradeAll {
			for _, base := range []string{setExternalLocal, setLBLocal, setNodePortLocal} {
				add(chainServices, matchSet(fam, base, "dst,dst")+" -j "+chainMarkMasq)
			}
		}
		add(chainServices, "-j "+chainAffinity)
		r[chainAffinity], r[chainLearn] = stickyRules(p.sticky, fam)
	case iptables.TableFilter:
		add(chainFilter, matchSet(fam, setLBFW, "dst,dst")+" -j "+chainFirewall)
		add(chainFilter, matchSet(fam, setDrop, "dst,dst")+` -m comment --comment "Local policy, no local endpoints" -j DROP`)
		// TCP gets a reset: VIPs are local addresses in this mode, and on
		// Debian's 6.1 kernel an ICMP unreachable for a SYN to a local
		// address reaches the client only for the retransmitted SYN, a
		// second later (found in a real-IPVS guest); a reset refuses at once.
		add(chainFilter, "-p tcp "+matchSet(fam, setReject, "dst,dst")+` -m comment --comment "no endpoints" -j REJECT --reject-with tcp-reset`)
		add(chainFilter, matchSet(fam, setReject, "dst,dst")+` -m comment --comment "no endpoints" -j REJECT`)
		for _, base := range []string{setClusterIP, setExternal, setExternalLocal, setLB, setLBLocal} {
			add(chainFilter, matchSet(fam, base, "dst,dst")+" -j RETURN")
		}
		add(chainFilter, "-p tcp -m conntrack --ctstate NEW "+matchSet(fam, setVIPs, "dst")+` -m comment --comment "unknown port on a VIP" -j REJECT --reject-with tcp-reset`)
		add(chainFilter, "-m conntrack --ctstate NEW "+matchSet(fam, setVIPs, "dst")+` -m comment --comment "unknown port on a VIP" -j REJECT`)
		add(chainFirewall, matchSet(fam, setLBSrc, "dst,dst,src")+" -j RETURN")
		add(chainFirewall, `-m comment --comment "loadBalancerSourceRanges" -j DROP`)
		for _, c := range p.opts.ServiceCIDRs {
			if familyOf(c.Addr()) == fam {
				add(chainCIDR, "-d "+c.Masked().String()+" -m set ! --match-set "+setName(fam, setVIPs)+` dst -m comment --comment "unallocated service address" -j DROP`)
			}
		}
	case TableMangle:
		// IPVS answers the node's own packets to a virtual server without
		// real servers with ICMP unreachable before filter runs; a Local
		// policy wants them dropped.
		add(chainOutput, matchSet(fam, setDrop, "dst,dst")+` -m comment --comment "Local policy, no local endpoints" -j DROP`)
	}
	return r
}

// rulesInput returns the iptables-restore --noflush input that rewrites
// every chain of table and inserts the jumps missing from saved
// (iptables-save output of the table).
func (p *Proxier) rulesInput(fam iptables.Family, table string, saved []byte) []byte {
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, c := range ownChains[table] {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	rules := p.chainRules(fam, table)
	for _, c := range ownChains[table] {
		for _, r := range rules[c] {
			b.WriteString(r + "\n")
		}
	}
	for _, j := range jumps {
		if j.table == table && !hasJump(saved, j) {
			fmt.Fprintf(&b, "-I %s 1 -m comment --comment vipproxy-ipvs -j %s\n", j.from, j.to)
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}

func hasJump(saved []byte, j jump) bool {
	for _, l := range strings.Split(string(saved), "\n") {
		if strings.HasPrefix(l, "-A "+j.from+" ") && strings.HasSuffix(strings.TrimSpace(l), "-j "+j.to) {
			return true
		}
	}
	return false
}

// cleanupInput returns the restore input that deletes every jump to a
// VIPVS- chain found in saved and then flushes and deletes every VIPVS-
// chain found there; nil when there is none.
func cleanupInput(table string, saved []byte) []byte {
	var dels, chains []string
	for _, l := range strings.Split(string(saved), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, ":"+ChainPrefix):
			chains = append(chains, strings.Fields(l[1:])[0])
		case strings.HasPrefix(l, "-A ") && strings.Contains(l, "-j "+ChainPrefix):
			f := strings.Fields(l)
			if len(f) > 1 && !strings.HasPrefix(f[1], ChainPrefix) {
				dels = append(dels, "-D"+l[2:])
			}
		}
	}
	if len(dels)+len(chains) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, c := range chains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, d := range dels {
		b.WriteString(d + "\n")
	}
	for _, c := range chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}
