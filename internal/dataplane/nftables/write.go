package nftables

// Writing a ruleset into a transaction: all of it (a rebuild), what
// differs from the kernel's (a full sync), or what an update touched (a
// partial sync), with deferred deletion of what became unused.

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

func (p *Proxier) fam(f knftables.Family) *family {
	for _, x := range p.b.fams {
		if x.fam == f {
			return x
		}
	}
	panic("nftables: unknown family " + string(f))
}

func chainObj(f knftables.Family, name string) *knftables.Chain {
	return &knftables.Chain{Family: f, Table: TableName, Name: name}
}

func affinitySet(f knftables.Family, fam *family, name string, timeout int) *knftables.Set {
	return &knftables.Set{Family: f, Table: TableName, Name: name, Type: addrType(fam.ip),
		Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: knftables.PtrTo(time.Duration(timeout) * time.Second)}
}

// writeContainers adds the definitions of the static maps and sets.
func (p *Proxier) writeContainers(tx *knftables.Transaction, f knftables.Family, flush bool) {
	fam := p.fam(f)
	for _, m := range staticMaps(fam.ip) {
		o := &knftables.Map{Family: f, Table: TableName, Name: m.name, Type: m.typ}
		if m.typeOf {
			o.Type, o.TypeOf = "", m.typ
		}
		tx.Add(o)
		if flush {
			tx.Flush(o)
		}
	}
	for _, s := range staticSets(fam.ip) {
		o := &knftables.Set{Family: f, Table: TableName, Name: s.name, Type: s.typ}
		tx.Add(o)
		if flush {
			tx.Flush(o)
		}
	}
	for _, name := range []string{digestSet, rulesDigestSet} {
		o := &knftables.Set{Family: f, Table: TableName, Name: name, Type: "ipv6_addr"}
		tx.Add(o)
		if flush {
			tx.Flush(o)
		}
	}
}

// writeBaseChains adds the hooked chains.
func writeBaseChains(tx *knftables.Transaction, f knftables.Family) {
	for _, bc := range baseChains {
		tx.Add(&knftables.Chain{Family: f, Table: TableName, Name: bc.name,
			Type: knftables.PtrTo(bc.typ), Hook: knftables.PtrTo(bc.hook), Priority: knftables.PtrTo(bc.priority)})
	}
}

// writeBaseRules adds the base chains' fixed rules; the chains they jump
// to must exist.
func writeBaseRules(tx *knftables.Transaction, f knftables.Family) {
	for _, bc := range baseChains {
		for _, r := range bc.rules {
			tx.Add(&knftables.Rule{Family: f, Table: TableName, Chain: bc.name, Rule: r})
		}
	}
}

// writeContent adds rs's chains (which must exist and be empty), affinity
// sets and elements.
func (p *Proxier) writeContent(tx *knftables.Transaction, f knftables.Family, rs *ruleset, chains []string) {
	fam := p.fam(f)
	for _, name := range slices.Sorted(maps.Keys(rs.affinity)) {
		tx.Add(affinitySet(f, fam, name, rs.affinity[name]))
	}
	for _, name := range chains {
		tx.Add(chainObj(f, name))
	}
	for _, name := range chains {
		for _, r := range rs.chains[name] {
			tx.Add(&knftables.Rule{Family: f, Table: TableName, Chain: name, Rule: r})
		}
	}
}

// writeElements adds all of rs's elements, their digest d and rs's rules
// digest to maps and sets that are empty.
func (p *Proxier) writeElements(tx *knftables.Transaction, f knftables.Family, rs *ruleset, d digest) {
	for _, name := range slices.Sorted(maps.Keys(rs.elems)) {
		ops := make([]ElementOp, 0, rs.elems[name].Len())
		for k, e := range rs.elems[name].All() {
			ops = append(ops, ElementOp{Family: f, Set: name, Key: k, Value: e.value(), wire: true}.Text())
		}
		sortByKey(ops)
		for _, op := range ops {
			tx.Add(element(f, name, op.Key, op.Value))
		}
	}
	tx.Add(element(f, digestSet, d.key(), ""))
	tx.Add(element(f, rulesDigestSet, rulesDigest(p.schemas[f], rs).key(), ""))
}

func element(f knftables.Family, name, key, value string) *knftables.Element {
	e := &knftables.Element{Family: f, Table: TableName, Key: []string{key}}
	if value == "" {
		e.Set = name
	} else {
		e.Map = name
		e.Value = []string{value}
	}
	return e
}

// writeAll fills a freshly created (empty) table.
func (p *Proxier) writeAll(tx *knftables.Transaction, f knftables.Family, rs *ruleset, d digest) {
	p.writeContainers(tx, f, false)
	writeBaseChains(tx, f)
	p.writeContent(tx, f, rs, slices.Sorted(maps.Keys(rs.chains)))
	writeBaseRules(tx, f)
	p.writeElements(tx, f, rs, d)
}

// writeFull rewrites a table that may hold anything we applied before (or
// nothing, if someone deleted it): all rules and static map/set contents
// are replaced, chains and affinity sets no longer wanted are deleted.
func (p *Proxier) writeFull(tx *knftables.Transaction, f knftables.Family, rs *ruleset, d digest) {
	fam := p.fam(f)
	t := &knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")}
	tx.Add(t)
	tx.Flush(t)
	p.writeContainers(tx, f, true)
	old := p.applied[f]
	// Everything that may still exist but is no longer wanted. "add" first
	// so that "delete" cannot fail when someone removed it already.
	gone := map[string]bool{}
	for c := range p.staleChains[f] {
		gone[c] = true
	}
	goneSets := map[string]int{}
	for s, t := range p.staleSets[f] {
		goneSets[s] = t
	}
	if old != nil {
		for c := range old.chains {
			gone[c] = true
		}
		for s, t := range old.affinity {
			goneSets[s] = t
		}
	}
	for _, c := range slices.Sorted(maps.Keys(gone)) {
		if _, ok := rs.chains[c]; !ok {
			tx.Add(chainObj(f, c))
			tx.Delete(chainObj(f, c))
		}
	}
	for _, s := range slices.Sorted(maps.Keys(goneSets)) {
		if _, ok := rs.affinity[s]; !ok {
			tx.Add(affinitySet(f, fam, s, goneSets[s]))
			tx.Delete(&knftables.Set{Family: f, Table: TableName, Name: s})
		}
	}
	writeBaseChains(tx, f)
	p.writeContent(tx, f, rs, slices.Sorted(maps.Keys(rs.chains)))
	writeBaseRules(tx, f)
	p.writeElements(tx, f, rs, d)
}

// writeDelta sends the changes an in-place update recorded in t (rs is
// the updated ruleset): structural ones into tx, element ones appended to
// ops (deletions before additions). It returns the chains and sets that
// became unused, which take the place of the current stale lists if the
// sync succeeds, and ops.
func (p *Proxier) writeDelta(tx *knftables.Transaction, f knftables.Family, rs *ruleset, t *tracker, ops []ElementOp) (map[string]bool, map[string]int, []ElementOp) {
	fam := p.fam(f)
	// Deletions deferred from the previous sync (flushed and unreferenced
	// since then), unless wanted again.
	for _, c := range slices.Sorted(maps.Keys(p.staleChains[f])) {
		if _, ok := rs.chains[c]; !ok {
			tx.Delete(chainObj(f, c))
		}
	}
	for _, s := range slices.Sorted(maps.Keys(p.staleSets[f])) {
		if _, ok := rs.affinity[s]; !ok {
			tx.Delete(&knftables.Set{Family: f, Table: TableName, Name: s})
		}
	}
	nextStaleChains := map[string]bool{}
	nextStaleSets := map[string]int{}

	// New affinity sets before the rules that use them. (The timeout is
	// part of the name, so a set never changes.)
	for _, s := range slices.Sorted(maps.Keys(t.affinity)) {
		existed := t.affinity[s]
		timeout, now := rs.affinity[s]
		switch {
		case now && !existed:
			tx.Add(affinitySet(f, fam, s, timeout))
		case !now && existed:
			nextStaleSets[s] = p.oldTimeout(s)
		}
	}
	// Chains: new, changed, unused.
	var rewrite []string
	for _, c := range slices.Sorted(maps.Keys(t.chains)) {
		prev := t.chains[c]
		rules, now := rs.chains[c]
		switch {
		case now && !prev.existed:
			tx.Add(chainObj(f, c))
			if p.staleChains[f][c] {
				tx.Flush(chainObj(f, c))
			}
			rewrite = append(rewrite, c)
		case now && !equalRules(prev.rules, rules):
			tx.Flush(chainObj(f, c))
			rewrite = append(rewrite, c)
		case !now && prev.existed:
			// Flush now (dropping its references), delete next sync, when
			// no element refers to it any more.
			tx.Flush(chainObj(f, c))
			nextStaleChains[c] = true
		}
	}
	for _, c := range rewrite {
		for _, r := range rs.chains[c] {
			tx.Add(&knftables.Rule{Family: f, Table: TableName, Chain: c, Rule: r})
		}
	}
	return nextStaleChains, nextStaleSets, changedElementOps(f, rs, t, ops)
}

// changedElementOps appends the element changes t recorded: deletions
// first (a changed value is a delete and an add), each in (set, key)
// order.
func changedElementOps(f knftables.Family, rs *ruleset, t *tracker, ops []ElementOp) []ElementOp {
	ids := slices.SortedFunc(maps.Keys(t.elems), func(a, b elemID) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(a.key, b.key))
	})
	for _, id := range ids {
		prev := t.elems[id]
		e, now := rs.elems[id.name].Get(id.key)
		if prev.existed && (!now || e.value() != prev.value) {
			ops = append(ops, ElementOp{Delete: true, Family: f, Set: id.name, Key: id.key, Value: prev.value, wire: true})
		}
	}
	for _, id := range ids {
		prev := t.elems[id]
		e, now := rs.elems[id.name].Get(id.key)
		if now && (!prev.existed || e.value() != prev.value) {
			ops = append(ops, ElementOp{Family: f, Set: id.name, Key: id.key, Value: e.value(), wire: true})
		}
	}
	return ops
}

// oldTimeout recovers an affinity set's timeout from its name.
func (p *Proxier) oldTimeout(name string) int {
	i := strings.LastIndexByte(name, '/')
	n, _ := strconv.Atoi(name[i+1:])
	return n
}

func equalRules(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
