package ipvs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// ClientIP session affinity shorter than IPVS can keep.
//
// IPVS persistence keeps a client's template while any connection it
// scheduled still exists, and a closed TCP connection stays in IPVS's
// TIME_WAIT for 120 s (not settable), a UDP one for the UDP timeout (300 s
// by default): with persistence a client stays on its backend at least
// that long, whatever timeoutSeconds says (kubernetes#89358; kube-proxy's
// IPVS mode has the bug). For a virtual server whose timeout is shorter
// than that hold, vipproxy does not use persistence: IPVS's scheduler
// picks the backend of a client's first connection, a nat POSTROUTING rule
// records the client in a recent list per (virtual server, real server),
// and a nat rule before IPVS DNATs the client's next connections within
// timeoutSeconds of its last one straight to that backend. Each of those
// connections refreshes the entry, as in the iptables mode. The recent
// lists hold xt_recent's ip_list_tot clients each (100 by default).

// Chains of the sticky rules, both in the nat table: affinity is the last
// jump of VIPVS-SERVICES (after the masquerade marks), learn the first of
// VIPVS-POSTROUTING (before masquerading changes the source).
const (
	chainAffinity = ChainPrefix + "AFFINITY"
	chainLearn    = ChainPrefix + "AFFINITY-LEARN"
)

// tcpTimeWait is IPVS's fixed TIME_WAIT timeout in seconds.
const tcpTimeWait = 120

// defaultUDPTimeout is IPVS's UDP timeout in seconds when not configured.
const defaultUDPTimeout = 300

// persistenceHold returns how long, in seconds, IPVS keeps a persistence
// template after a client's last connection of proto ends.
func (p *Proxier) persistenceHold(proto model.Protocol) int {
	if proto == model.UDP {
		if t := p.opts.Timeouts.UDP; t > 0 {
			return int(t.Seconds())
		}
		return defaultUDPTimeout
	}
	return tcpTimeWait
}

// sticky is one (virtual server, real server) pair of a virtual server
// with affinity shorter than persistence can keep.
type sticky struct {
	vs      ServiceKey
	dest    netip.AddrPort
	timeout int
	// ranges: the virtual server has loadBalancerSourceRanges, which the
	// DNAT (that bypasses the filter INPUT check) must apply too.
	ranges bool
}

// list returns the name of the pair's recent list: unique per pair across
// both families (xt_recent lists of a namespace share one name space).
func (s sticky) list() string {
	h := sha256.Sum256([]byte(s.vs.String() + ">" + s.dest.String()))
	return ChainPrefix + hex.EncodeToString(h[:8])
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// rules returns the pair's DNAT rule (chainAffinity) and its learning rule
// (chainLearn).
func (s sticky) rules(fam iptables.Family) (dnat, learn string) {
	proto := protoLower(s.vs.Protocol)
	src := ""
	if s.ranges {
		src = " " + matchSet(fam, setLBSrc, "dst,dst,src")
	}
	dnat = fmt.Sprintf("-A %s -d %s -p %s -m %s --dport %d%s -m recent --rcheck --seconds %d --reap --name %s --rsource -j DNAT --to-destination %s",
		chainAffinity, hostPrefix(s.vs.Addr), proto, proto, s.vs.Port, src, s.timeout, s.list(), s.dest)
	learn = fmt.Sprintf("-A %s -d %s -p %s -m %s --dport %d -m conntrack --ctorigdst %s --ctorigdstport %d -m recent --set --name %s --rsource",
		chainLearn, hostPrefix(s.dest.Addr()), proto, proto, s.dest.Port(), s.vs.Addr, s.vs.Port, s.list())
	return dnat, learn
}

// stickyOf returns the pairs of dv when timeout is shorter than the
// persistence hold of its protocol (nil otherwise).
func (p *Proxier) stickyOf(dv *desiredVS, timeout int, ranges bool) []sticky {
	if timeout <= 0 || timeout >= p.persistenceHold(dv.vs.Protocol) {
		return nil
	}
	out := make([]sticky, 0, len(dv.dests))
	for _, ap := range slices.SortedFunc(maps.Keys(dv.dests), netip.AddrPort.Compare) {
		out = append(out, sticky{vs: dv.vs.ServiceKey, dest: ap, timeout: timeout, ranges: ranges})
	}
	return out
}

// stickyRules returns the rules of chainAffinity and chainLearn for fam,
// in a stable order.
func stickyRules(pairs []sticky, fam iptables.Family) (dnat, learn []string) {
	for _, s := range pairs {
		if familyOf(s.vs.Addr) != fam {
			continue
		}
		d, l := s.rules(fam)
		dnat, learn = append(dnat, d), append(learn, l)
	}
	slices.Sort(dnat)
	slices.Sort(learn)
	return dnat, learn
}

// stickyInput returns the iptables-restore --noflush input that rewrites
// the two sticky chains of fam's nat table (and nothing else).
func stickyInput(pairs []sticky, fam iptables.Family) []byte {
	dnat, learn := stickyRules(pairs, fam)
	var b strings.Builder
	b.WriteString("*" + iptables.TableNAT + "\n:" + chainAffinity + " - [0:0]\n:" + chainLearn + " - [0:0]\n")
	for _, r := range append(dnat, learn...) {
		b.WriteString(r + "\n")
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}
