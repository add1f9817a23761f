package nftables

// A family's ruleset (the desired or last applied content of its table)
// and the per-family settings its rules are written with.

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// ruleset is the desired (or last applied) content of one family's table,
// apart from the fixed base chains.
type ruleset struct {
	// chains maps every regular chain to its rules.
	chains map[string][]string
	// affinity maps each ClientIP-affinity set to its timeout in seconds.
	affinity map[string]int
	// elems maps a static map or set name to its elements by key, each
	// with its value ("" for sets) and who uses it.
	elems map[string]*elemTable

	// Bookkeeping for in-place updates: each port's fragment, users of
	// shared chains and sets.
	ports     map[model.ServicePortName]*portEntry
	chainRefs map[string]int
	affRefs   map[string]int
	// served has bit i set when the ports this ruleset was built or
	// updated from (the State's Ports) have at i a port its family serves,
	// which rs.ports holds; update reads it for the ports that did not
	// change.
	served bitset
	// waiting lists, per map key, ports that were refused the key because
	// another port owned it; the first one still present gets it when the
	// owner lets go.
	waiting map[elemID][]*portEntry
	// sum is the digest of elems, kept up to date by add, remove and
	// handOver (digestOf recomputes it; at 50,000 Services the walk over
	// 731,000 elements took 0.35 s of every full sync).
	sum digest
}

func newRuleset() *ruleset {
	return &ruleset{chains: map[string][]string{}, affinity: map[string]int{}, elems: map[string]*elemTable{},
		ports: map[model.ServicePortName]*portEntry{}, chainRefs: map[string]int{}, affRefs: map[string]int{},
		waiting: map[elemID][]*portEntry{}}
}

// elem is one element of a ruleset's map or set: where its key (and a
// map key's value) is written, and who uses it. It is kept in the one
// table (at 10,000 Services, 100,000s of elements: a map per piece of
// bookkeeping cost 17 MB more than this), and small: 16 bytes, neither
// key nor value copied but read from the fragment that holds them,
// which is immutable (a key stored beside it cost 16 bytes more a slot:
// 20 MB of element tables at 50,000 Services).
type elem struct {
	// src is the port whose fragment holds the key, as its element i. For
	// a map key it is the port that owns the key (map keys are owned by
	// one port); for a set key, the first of the ports sharing it, kept
	// with its fragment while the others still share the key.
	src *portEntry
	i   int32
	// n is, for a set key, the number of ports sharing it; 0 for a map
	// key.
	n int32
}

// key is the element's key. e is an element of a table (src is set).
func (e elem) key() string { return e.src.fr.key(int(e.i)) }

// value is the element's value: "" for a set key, and for the zero elem.
func (e elem) value() string {
	if e.src == nil {
		return ""
	}
	return e.src.fr.value(int(e.i))
}

// owner is the port a map key belongs to (nil for the zero elem).
func (e elem) owner() *portEntry { return e.src }

// family holds what the layout of one family needs from Options.
type family struct {
	fam knftables.Family
	ip  string // "ip" or "ip6"
	is6 bool
	// fromPod and notFromPod match local (pod) traffic and the rest, by
	// source CIDR or incoming interface (Options.PodInterface); "" when
	// local traffic is not detected.
	fromPod, notFromPod string
	npMatch             string // match for NodePort addresses, "" when none
	svcCIDRs            string // anonymous set of service CIDRs, "" when none
	mark                string // masquerade mark as hex
	markVal             uint32
}

func (f *family) has(a netip.Addr) bool { return a.IsValid() && a.Unmap().Is6() == f.is6 }

// hasAny reports whether one of as is of family f.
func (f *family) hasAny(as []netip.Addr) bool {
	for _, a := range as {
		if f.has(a) {
			return true
		}
	}
	return false
}

// serves reports whether family f programs anything for sp. It does not
// for a single-stack Service of the other family (whose NodePort is not
// opened in f either), nor for a port with no address of f and no
// NodePort on f's node addresses. The builder skips the ports f does not
// serve before it looks at them, so that they cost f no fragment and no
// bookkeeping: at 10,000 IPv4 Services, 4.5 MB of the ip6 family's.
func (f *family) serves(sp *model.ServicePort) bool {
	vips := f.hasAny(sp.ClusterIPs)
	if len(sp.ClusterIPs) > 0 && !vips {
		return false
	}
	return vips || f.hasAny(sp.ExternalIPs) || f.hasAny(sp.LoadBalancerIPs) || (sp.NodePort != 0 && f.npMatch != "")
}

func anonSet(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return "{ " + strings.Join(items, ", ") + " }"
}

func prefixString(p netip.Prefix) string {
	p = p.Masked()
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// newFamily derives the per-family layout parameters from o.
func newFamily(fam knftables.Family, o *dataplane.Options) *family {
	f := &family{fam: fam, ip: "ip", is6: fam == knftables.IPv6Family}
	if f.is6 {
		f.ip = "ip6"
	}
	f.markVal = masqMark(o)
	f.mark = fmt.Sprintf("0x%x", f.markVal)
	var pods, svcs, nps []string
	for _, p := range o.ClusterCIDRs {
		if f.has(p.Addr()) {
			pods = append(pods, prefixString(p))
		}
	}
	for _, p := range o.ServiceCIDRs {
		if f.has(p.Addr()) {
			svcs = append(svcs, prefixString(p))
		}
	}
	if len(o.NodePortAddresses) > 0 {
		for _, p := range o.NodePortAddresses {
			if f.has(p.Addr()) {
				nps = append(nps, prefixString(p))
			}
		}
	} else {
		for _, a := range o.NodeIPs {
			if f.has(a) && !a.IsLoopback() {
				nps = append(nps, a.Unmap().String())
			}
		}
	}
	f.svcCIDRs = anonSet(svcs)
	switch {
	case o.PodInterface != "":
		name := o.PodInterface
		if o.PodInterfacePrefix {
			name += "*"
		}
		f.fromPod, f.notFromPod = `iifname "`+name+`"`, `iifname != "`+name+`"`
	case len(pods) > 0:
		set := anonSet(pods)
		f.fromPod, f.notFromPod = f.ip+" saddr "+set, f.ip+" saddr != "+set
	}
	if len(nps) > 0 {
		loop := "127.0.0.0/8"
		if f.is6 {
			loop = "::1"
		}
		f.npMatch = "fib daddr type local " + f.ip + " daddr != " + loop
		all := false
		for _, p := range nps {
			all = all || strings.HasSuffix(p, "/0")
		}
		if !all {
			f.npMatch += " " + f.ip + " daddr " + anonSet(nps)
		}
	}
	return f
}

func masqMark(o *dataplane.Options) uint32 {
	bit := o.MasqueradeBit
	if bit <= 0 || bit > 31 {
		bit = 14
	}
	return 1 << uint(bit)
}

// bitset is a set of small non-negative integers.
type bitset []uint64

func newBitset(n int) bitset { return make(bitset, (n+63)/64) }

func (b bitset) set(i int) { b[i/64] |= 1 << (i % 64) }

func (b bitset) clear(i int) { b[i/64] &^= 1 << (i % 64) }

// has reports whether i is in b (false beyond its size).
func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

// truncate removes every i ≥ n.
func (b bitset) truncate(n int) {
	for w := n / 64; w < len(b); w++ {
		if w == n/64 {
			b[w] &= 1<<(n%64) - 1
		} else {
			b[w] = 0
		}
	}
}

// count returns the number of elements.
func (b bitset) count() int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return n
}
