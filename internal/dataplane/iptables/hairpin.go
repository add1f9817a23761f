package iptables

// The mode's ipsets: hairpin and ClusterIP masquerade. kube-proxy gives
// every endpoint of every Service a chain of two rules: mark the packet for masquerade when it comes from the
// endpoint itself (a pod reaching itself through its Service: without
// SNAT the reply would not come back through the node), then DNAT. With
// iptables-nft every commit of the nat table, even of one rule, makes the
// kernel validate every rule reachable from each base chain (nf_tables'
// table validation; PREROUTING and OUTPUT both reach VIP-SERVICES, so the
// walk is done twice), and a perf profile of a one-rule restore at 10,000
// Services × 10 endpoints shows 95 % of its 0.15 s there. So where ipset
// works, vipproxy writes the layout kube-proxy's IPVS mode uses for the
// same purpose: one hash:ip,port,ip set of "endpoint,proto:port,endpoint"
// members, matched dst,dst,src in nat VIP-POSTROUTING (mark for
// masquerade) and filter VIP-FORWARD (accept, as the mark would have), and
// the balancing rules DNAT directly. The nat table shrinks from 32 to 12
// rules and from 11 to 1 chain per Service of 10 endpoints, and a one-rule
// commit at 10,000 Services from 0.15 s to 0.07 s in a namespace on this
// machine (the native "-p tcp" DNAT rules, without "-m tcp", are 0.03 s of
// that). Under ClientIP affinity an endpoint keeps its chain (the choice
// is recorded by -m recent --set as it DNATs). Where ipset is missing, or
// the kernel lacks the set match, the mode writes kube-proxy's layout.
//
// A second set, VIP-CLUSTER-IP (hash:ip,port), holds the ClusterIP ports
// whose traffic from outside the pod network is masqueraded: one rule at
// the head of nat VIP-SERVICES instead of one in every Service's chain
// (another 10,000 of the nat table's rules at 10,000 Services).
//
// A set's members are reference-counted by the fragments holding them
// (two Services may share an endpoint). A partial sync adds new members
// before its iptables restores and deletes the members no fragment holds
// after them, so a hairpin connection never meets a DNAT without its
// member; a full sync refills the set through a temporary set and a swap.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/model"
)

// setKind is one of the mode's ipsets: its names per family, its type, and
// the members a fragment holds.
type setKind struct {
	v4, v6  string
	typ     string
	pair    bool // members are ip,proto:port,ip (else ip,proto:port)
	members func(f *fragment, add func(setMember))
}

// The mode's sets. A full sync fills name+setTmp and swaps it in.
var (
	hairpinKind = &setKind{v4: "VIP-HAIRPIN", v6: "VIP6-HAIRPIN", typ: "hash:ip,port,ip", pair: true,
		members: func(f *fragment, add func(setMember)) { f.hairpin.each(add) }}
	clusterKind = &setKind{v4: "VIP-CLUSTER-IP", v6: "VIP6-CLUSTER-IP", typ: "hash:ip,port",
		members: func(f *fragment, add func(setMember)) {
			if f.masqPort != 0 {
				add(newSetMember(netip.AddrPortFrom(f.clusterIP, f.masqPort), f.proto))
			}
		}}
	setKinds = []*setKind{hairpinKind, clusterKind}
)

const setTmp = "-T"

func (k *setKind) name(fam Family) string {
	if fam == IPv6 {
		return k.v6
	}
	return k.v4
}

func (k *setKind) create(fam Family, name string) string {
	f := "inet"
	if fam == IPv6 {
		f = "inet6"
	}
	return "create " + name + " " + k.typ + " family " + f + " maxelem " + strconv.Itoa(ipset.MaxElem) + " -exist\n"
}

func (k *setKind) entry(m setMember) ipset.Entry {
	ip := netip.AddrFrom16(m.ip).Unmap()
	e := ipset.Entry{IP: ip, Proto: m.proto, Port: m.port}
	if k.pair {
		e.IP2 = ip
	}
	return e
}

// isOurSet reports whether an ipset is one of the mode's.
func isOurSet(name string) bool {
	for _, k := range setKinds {
		for _, n := range []string{k.v4, k.v6} {
			if name == n || name == n+setTmp {
				return true
			}
		}
	}
	return false
}

// hairpinMatch is the rule match of packets an endpoint sends to itself,
// after DNAT.
func hairpinMatch(set string) []string {
	return []string{"-m", "comment", "--comment", "hairpin: endpoint to itself", "-m", "set", "--match-set", set, "dst,dst,src"}
}

// clusterMatch is the rule match of packets to a ClusterIP port of the
// set, before DNAT.
func clusterMatch(set string) []string {
	return []string{"-m", "comment", "--comment", "cluster IP traffic to masquerade unless from a pod", "-m", "set", "--match-set", set, "dst,dst"}
}

// setMember is one member of a set, in 20 bytes: an address (16 bytes,
// IPv4 mapped), a port and an IP protocol number (for the hairpin set, the
// endpoint; the address is also the member's third part). A hairpin set at
// 10,000 Services × 10 endpoints counts 100,000 of them; as netip.AddrPort
// and protocol name they took 8.5 MB of the heap. What is kept holds them
// packed (see packed and memberCounts): an IPv4 member in 8 bytes.
type setMember struct {
	ip    [16]byte
	port  uint16
	proto uint8
}

func newSetMember(ap netip.AddrPort, proto model.Protocol) setMember {
	m := setMember{ip: ap.Addr().As16(), port: ap.Port()}
	switch proto {
	case model.TCP:
		m.proto = 6 // IPPROTO_TCP
	case model.UDP:
		m.proto = 17 // IPPROTO_UDP
	case model.SCTP:
		m.proto = 132 // IPPROTO_SCTP
	}
	return m
}

// pack4 returns an IPv4 member in one word, the address in the low 32
// bits, the port and protocol above it; ok is false for an IPv6 member.
// The top byte is zero.
func (m setMember) pack4() (w uint64, ok bool) {
	a := netip.AddrFrom16(m.ip)
	if !a.Is4In6() {
		return 0, false
	}
	b := a.Unmap().As4()
	return uint64(m.proto)<<48 | uint64(m.port)<<32 | uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3]), true
}

// unpack4 is pack4's inverse.
func unpack4(w uint64) setMember {
	a := netip.AddrFrom4([4]byte{byte(w >> 24), byte(w >> 16), byte(w >> 8), byte(w)})
	return setMember{ip: netip.AddrFrom16(a.As16()).As16(), port: uint16(w >> 32), proto: uint8(w >> 48)}
}

// packed is a list of members: an IPv4 member is one word (pack4), an
// IPv6 member three, a mark word (v6mark, port and protocol) and the
// address. A fragment's hairpin members at 10,000 Services × 10 were 2 MB
// as setMembers, 0.8 MB packed.
type packed []uint64

const v6mark = 1 << 56

// packMembers returns ms packed, in a list without room to spare.
func packMembers(ms []setMember) packed {
	n := 0
	for _, m := range ms {
		if _, ok := m.pack4(); ok {
			n++
		} else {
			n += 3
		}
	}
	p := make(packed, 0, n)
	for _, m := range ms {
		p = p.add(m)
	}
	return p
}

func (p packed) add(m setMember) packed {
	if w, ok := m.pack4(); ok {
		return append(p, w)
	}
	return append(p, v6mark|uint64(m.proto)<<48|uint64(m.port)<<32,
		binary.BigEndian.Uint64(m.ip[:8]), binary.BigEndian.Uint64(m.ip[8:]))
}

// each calls f with every member, in the order they were added.
func (p packed) each(f func(setMember)) {
	for i := 0; i < len(p); i++ {
		w := p[i]
		if w&v6mark == 0 {
			f(unpack4(w))
			continue
		}
		m := setMember{port: uint16(w >> 32), proto: uint8(w >> 48)}
		binary.BigEndian.PutUint64(m.ip[:8], p[i+1])
		binary.BigEndian.PutUint64(m.ip[8:], p[i+2])
		f(m)
		i += 2
	}
}

// memberCounts counts members: IPv4 ones keyed by their packed word (a
// map slot of 12 bytes instead of 24: the hairpin set's counts at
// 10,000 Services × 10 endpoints were 3.8 MB), IPv6 ones by themselves.
type memberCounts struct {
	v4 map[uint64]int32
	v6 map[setMember]int32
}

func (c *memberCounts) get(m setMember) int32 {
	if c == nil {
		return 0
	}
	if w, ok := m.pack4(); ok {
		return c.v4[w]
	}
	return c.v6[m]
}

// set sets m's count; 0 removes it.
func (c *memberCounts) set(m setMember, n int32) {
	w, ok := m.pack4()
	switch {
	case ok && n == 0:
		delete(c.v4, w)
	case ok:
		if c.v4 == nil {
			c.v4 = map[uint64]int32{}
		}
		c.v4[w] = n
	case n == 0:
		delete(c.v6, m)
	default:
		if c.v6 == nil {
			c.v6 = map[setMember]int32{}
		}
		c.v6[m] = n
	}
}

// len is the number of members counted.
func (c *memberCounts) len() int {
	if c == nil {
		return 0
	}
	return len(c.v4) + len(c.v6)
}

// setState is one family's set of one kind as vipproxy last wrote it.
type setState struct {
	// refs counts, per member, the applied fragments holding it; nil
	// before the first sync.
	refs *memberCounts
	// frags are the fragments counted in refs, in ServicePort order.
	frags []*fragment
}

// famSets is one family's sets: whether the family uses them (probed
// once), and each kind's state.
type famSets struct {
	probed, usable bool
	state          map[*setKind]*setState
}

// setChange is what one sync writes to one set: script (a full sync's
// refill) or add run ahead of the iptables restores, del once they
// succeeded; commit then records the new state.
type setChange struct {
	name     string
	script   []byte
	add, del []ipset.Entry
	commit   func()
}

// probeSets decides whether fam uses the sets: they can be created, and a
// rule matching one can be restored. It runs once.
func (p *Proxier) probeSets(ctx context.Context, fam Family) {
	fs := p.famSets[fam]
	if fs == nil {
		fs = &famSets{state: map[*setKind]*setState{}}
		p.famSets[fam] = fs
	}
	if fs.probed {
		return
	}
	fs.probed = true
	if p.sets == nil {
		return
	}
	var b strings.Builder
	for _, k := range setKinds {
		b.WriteString(k.create(fam, k.name(fam)))
	}
	if err := p.sets.Restore(ctx, []byte(b.String())); err != nil {
		p.log.Warn("ipset unusable: one chain per endpoint, as kube-proxy", "family", fam.String(), "err", err)
		return
	}
	const probe = "VIP-PROBE-SET"
	rule := "-A " + probe + " " + JoinArgs(cat(hairpinMatch(hairpinKind.name(fam)), []string{"-j", "RETURN"}))
	in := "*" + TableFilter + "\n:" + probe + " - [0:0]\n" + rule + "\n-F " + probe + "\n-X " + probe + "\nCOMMIT\n"
	if err := p.run.Restore(ctx, fam, TableFilter, []byte(in)); err != nil {
		p.log.Warn("iptables set match unusable: one chain per endpoint, as kube-proxy", "family", fam.String(), "err", err)
		return
	}
	fs.usable = true
}

// usesSets reports whether fam's rules use the sets.
func (p *Proxier) usesSets(fam Family) bool {
	fs := p.famSets[fam]
	return fs != nil && fs.usable
}

// setChanges returns the set writes of this sync.
func (p *Proxier) setChanges(desired map[Family]map[string]*desiredTable, full bool) []setChange {
	var out []setChange
	for _, fam := range p.opts.Families {
		if !p.usesSets(fam) {
			continue
		}
		for _, k := range setKinds {
			st := p.famSets[fam].state[k]
			if st == nil {
				st = &setState{}
				p.famSets[fam].state[k] = st
			}
			out = append(out, st.change(k, fam, desired[fam][TableNAT].frags, full || st.refs == nil))
		}
	}
	return out
}

func (st *setState) change(k *setKind, fam Family, frags []*fragment, full bool) setChange {
	name := k.name(fam)
	ch := setChange{name: name}
	if full {
		refs := &memberCounts{}
		var b strings.Builder
		tmp := name + setTmp
		b.WriteString(k.create(fam, name))
		b.WriteString(k.create(fam, tmp))
		b.WriteString("flush " + tmp + "\n")
		for _, f := range frags {
			k.members(f, func(m setMember) {
				n := refs.get(m) + 1
				if refs.set(m, n); n == 1 {
					b.WriteString("add " + tmp + " " + k.entry(m).String() + "\n")
				}
			})
		}
		b.WriteString("swap " + tmp + " " + name + "\ndestroy " + tmp + "\n")
		ch.script = []byte(b.String())
		ch.commit = func() { st.refs, st.frags = refs, frags }
		return ch
	}
	delta := map[setMember]int32{}
	count := func(f *fragment, d int32) {
		k.members(f, func(m setMember) { delta[m] += d })
	}
	pairs, gone := fragDelta(st.frags, frags)
	for _, pr := range pairs {
		if pr.old == pr.new {
			continue
		}
		if pr.old != nil {
			count(pr.old, -1)
		}
		count(pr.new, 1)
	}
	for _, old := range gone {
		count(old, -1)
	}
	for m, d := range delta {
		was := st.refs.get(m)
		switch now := was + d; {
		case was == 0 && now > 0:
			ch.add = append(ch.add, k.entry(m))
		case was > 0 && now == 0:
			ch.del = append(ch.del, k.entry(m))
		}
	}
	ch.commit = func() {
		for m, d := range delta {
			st.refs.set(m, st.refs.get(m)+d)
		}
		st.frags = frags
	}
	return ch
}

// restoreSets writes one half of every change: before the iptables
// restores the script or the additions, after them the deletions; a few
// members go over netlink when the runner can (ipset.Editor).
func (p *Proxier) restoreSets(ctx context.Context, changes []setChange, after bool) error {
	for _, ch := range changes {
		var err error
		switch {
		case !after && len(ch.script) > 0:
			err = p.sets.Restore(ctx, ch.script)
		case after:
			err = p.editSet(ctx, ch.name, nil, ch.del)
		default:
			err = p.editSet(ctx, ch.name, ch.add, nil)
		}
		if err != nil {
			return fmt.Errorf("iptables: ipset %s: %w", ch.name, err)
		}
	}
	return nil
}

// editSet adds and deletes members: over netlink (ipset.Editor) when they
// are few, else with one restore script.
func (p *Proxier) editSet(ctx context.Context, name string, add, del []ipset.Entry) error {
	if len(add)+len(del) == 0 {
		return nil
	}
	if e, ok := p.sets.(ipset.Editor); ok && len(add)+len(del) <= editMax {
		return e.Edit(ctx, name, add, del)
	}
	return p.sets.Restore(ctx, ipset.EditScript(name, add, del))
}

// editMax is the most members editSet sends over netlink, one message
// each; more go in one ipset restore.
const editMax = 256

// forgetSets drops what vipproxy knows of the sets' content: the next
// sync refills them.
func (p *Proxier) forgetSets() {
	for _, fs := range p.famSets {
		clear(fs.state)
	}
}

// destroySets removes the mode's sets (after its rules are gone).
func (p *Proxier) destroySets(ctx context.Context) error {
	p.forgetSets()
	if p.sets == nil {
		return nil
	}
	names, _, err := ipset.Destroy(ctx, p.sets, isOurSet)
	if len(names) > 0 {
		p.log.Info("removed the ipsets", "sets", names)
	}
	return err
}
