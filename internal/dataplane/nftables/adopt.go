package nftables

// Adopting what the kernel holds: the first sync of a proxier that finds
// vipproxy's tables already there (a restart, an upgrade, or the sync
// after a failed one) reads them back and changes only what differs,
// instead of deleting and re-creating the tables.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// kernelTable is what one family's vipproxy table holds in the kernel.
type kernelTable struct {
	chains map[string]bool // every chain, base chains included
	sets   map[string]bool // every set and map
	// elems holds the elements of the static maps and sets (see
	// elemLayouts) by map, key → value, in the form the proxier keeps
	// them (wire.go); nil when they were not read.
	elems map[string]map[string]string
	// digests and rulesDigests hold the elements of digestSet and
	// rulesDigestSet: one digest each normally.
	digests, rulesDigests []digest
}

// digest returns the table's element digest, if it exists (k is not nil)
// and has exactly one.
func (k *kernelTable) digest() (digest, bool) {
	if k == nil || len(k.digests) != 1 {
		return digest{}, false
	}
	return k.digests[0], true
}

// rulesDigest returns the table's rules digest, as digest.
func (k *kernelTable) rulesDigest() (digest, bool) {
	if k == nil || len(k.rulesDigests) != 1 {
		return digest{}, false
	}
	return k.rulesDigests[0], true
}

// digestsOf returns where the elements of digest set name go.
func (k *kernelTable) digestsOf(name string) *[]digest {
	if name == rulesDigestSet {
		return &k.rulesDigests
	}
	return &k.digests
}

func newKernelTable() *kernelTable {
	return &kernelTable{chains: map[string]bool{}, sets: map[string]bool{}}
}

// tableReader is implemented by transports that can read vipproxy's
// tables back: structure and digests, and the static elements too when
// elements is true. A family whose table does not exist has no entry.
type tableReader interface {
	readTables(ctx context.Context, elements bool) (map[knftables.Family]*kernelTable, error)
}

// tablesRead is what a tableReader read.
type tablesRead struct {
	tables map[knftables.Family]*kernelTable
	err    error
}

// readExisting starts reading the tables back, when the transport can, and
// returns where the result arrives (nil when it cannot). Sync starts it
// before its build, so the kernel's dump and the build overlap.
func (p *Proxier) readExisting(ctx context.Context) <-chan tablesRead {
	rd, ok := p.tr.(tableReader)
	if !ok {
		return nil
	}
	ch := make(chan tablesRead, 1)
	go func() {
		t, err := rd.readTables(ctx, false)
		ch <- tablesRead{t, err}
	}()
	return ch
}

// adopt brings tables that exist but that this proxier did not write (or
// no longer trusts) to desired in one atomic transaction that touches
// only what differs: map and set elements are added, changed and deleted
// one by one, affinity sets keep their entries, chains that are no
// longer wanted are flushed now and deleted by the next sync (as after a
// partial sync), and the wanted chains are flushed and refilled
// (their rules are not read back; with shared chains there are few). It
// reports false, having changed nothing, when the transport cannot read
// tables (existing is nil), finds none, or the read or the transaction
// fails: the caller then rebuilds.
func (p *Proxier) adopt(ctx context.Context, existing <-chan tablesRead, el Elementer, st *model.State, desired map[knftables.Family]*ruleset, want, wantRules map[knftables.Family]digest, start time.Time) bool {
	if existing == nil {
		return false
	}
	r := <-existing
	kt, err := r.tables, r.err
	if err != nil {
		p.log.Warn("nftables: cannot read the existing tables; rebuilding them", "err", err)
		return false
	}
	if len(kt) == 0 {
		return false // nothing to adopt: a rebuild creates the tables
	}
	// A table whose element digest is the one the release before kept
	// for what is wanted (legacyDigest) holds the wanted elements: it is
	// adopted as if it held today's digest, which is then written.
	legacy := map[knftables.Family]bool{}
	accept := maps.Clone(want)
	for _, f := range families {
		if d, ok := kt[f].digest(); ok && d != want[f] && d == legacyDigest(f, desired[f]) {
			legacy[f], accept[f] = true, d
		}
	}
	changed := adoptUnchanged(kt, desired, accept, wantRules)
	if changed == "" {
		var ops []ElementOp
		for _, f := range families {
			if legacy[f] {
				ops = digestOps(ops, f, digestSet, accept[f], true, want[f])
			}
		}
		if len(ops) > 0 {
			if _, _, err := p.run(ctx, p.tr.NewTransaction(), ops, el, "adopt"); err != nil {
				metrics.NFTablesSyncFailures.Inc()
				p.log.Warn("nftables: rewriting the existing tables' element digest failed; rebuilding them", "err", err)
				return false
			}
		}
		p.applied, p.digests, p.rulesDigests = desired, want, wantRules
		p.appliedPorts = portsOf(st)
		p.log.Info("nftables: adopted the existing tables", "kind", "unchanged", "elementChanges", len(ops), "mapsDumped", false,
			"digestOfReleaseBefore", len(legacy) > 0, "operations", len(ops), "took", time.Since(start).Round(time.Millisecond))
		return true
	}
	// The elements are read only where the table's digest is neither the
	// digest wanted nor the release before's for it.
	var dumped []knftables.Family
	for _, f := range families {
		if d, ok := kt[f].digest(); !ok || (d != want[f] && !legacy[f]) {
			dumped = append(dumped, f)
		}
	}
	if len(dumped) > 0 {
		full, err := p.tr.(tableReader).readTables(ctx, true)
		if err != nil {
			p.log.Warn("nftables: cannot read the existing tables' elements; rebuilding them", "err", err)
			return false
		}
		for _, f := range dumped {
			switch {
			case kt[f] == nil: // no table: every element is added
			case full[f] != nil:
				kt[f].elems = full[f].elems
			default: // gone since
				kt[f].elems = map[string]map[string]string{}
			}
		}
	}
	read := time.Since(start)
	tx := p.tr.NewTransaction()
	stale := map[knftables.Family]map[string]bool{}
	staleSets := map[knftables.Family]map[string]int{}
	var ops []ElementOp
	for _, f := range families {
		k := kt[f]
		if k == nil {
			k = newKernelTable()
			k.elems = map[string]map[string]string{}
		}
		stale[f], staleSets[f] = p.writeAdopt(tx, f, k, desired[f])
		oldRules, hadRules := k.rulesDigest()
		ops = digestOps(ops, f, rulesDigestSet, oldRules, hadRules, wantRules[f])
		if k.elems != nil { // else the digest says they are what is wanted
			ops = adoptElementOps(ops, f, k, desired[f])
		}
		old, had := k.digest()
		ops = digestOps(ops, f, digestSet, old, had, want[f])
	}
	nops, kind, err := p.run(ctx, tx, ops, el, "adopt")
	if err != nil {
		metrics.NFTablesSyncFailures.Inc()
		p.log.Warn("nftables: adopting the existing tables failed; rebuilding them", "operations", nops, "err", err)
		return false
	}
	p.staleChains, p.staleSets = stale, staleSets
	p.applied, p.digests, p.rulesDigests = desired, want, wantRules
	p.appliedPorts = portsOf(st)
	p.log.Info("nftables: adopted the existing tables", "kind", kind, "changed", changed, "elementChanges", len(ops), "mapsDumped", len(dumped) > 0, "digestOfReleaseBefore", len(legacy) > 0,
		"operations", nops, "read", read.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return true
}

// writeAdopt writes into tx what brings k's structure to rs: containers
// and affinity sets added (kept if there), rs's chains and the base
// chains flushed and refilled, k's other chains flushed. It returns those
// other chains, and k's sets that rs does not use, for deletion by the
// next sync.
func (p *Proxier) writeAdopt(tx *knftables.Transaction, f knftables.Family, k *kernelTable, rs *ruleset) (map[string]bool, map[string]int) {
	fam := p.fam(f)
	tx.Add(&knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")})
	p.writeContainers(tx, f, false)
	for _, name := range []string{digestSet, rulesDigestSet} {
		if ds := k.digestsOf(name); len(*ds) > 1 {
			tx.Flush(&knftables.Set{Family: f, Table: TableName, Name: name})
			*ds = nil
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rs.affinity)) {
		tx.Add(affinitySet(f, fam, name, rs.affinity[name]))
	}
	chains := slices.Sorted(maps.Keys(rs.chains))
	for _, c := range chains {
		tx.Add(chainObj(f, c))
		if k.chains[c] {
			tx.Flush(chainObj(f, c))
		}
	}
	for _, c := range chains {
		for _, r := range rs.chains[c] {
			tx.Add(&knftables.Rule{Family: f, Table: TableName, Chain: c, Rule: r})
		}
	}
	writeBaseChains(tx, f)
	base := map[string]bool{}
	for _, bc := range baseChains {
		base[bc.name] = true
		if k.chains[bc.name] {
			tx.Flush(chainObj(f, bc.name))
		}
	}
	writeBaseRules(tx, f)
	stale := map[string]bool{}
	for _, c := range slices.Sorted(maps.Keys(k.chains)) {
		if _, want := rs.chains[c]; !want && !base[c] {
			tx.Flush(chainObj(f, c))
			stale[c] = true
		}
	}
	static := layouts[f]
	staleSets := map[string]int{}
	for s := range k.sets {
		if _, want := rs.affinity[s]; !want && !hasKey(static, s) && !isDigestSet(s) {
			staleSets[s] = p.oldTimeout(s)
		}
	}
	return stale, staleSets
}

// adoptUnchanged returns "" when the tables kt already hold desired:
// every family's table exists and holds the element and rules digests
// wanted, and exactly the chains and sets desired has (no chain or set
// left for deletion, none added by hand). Then nothing needs writing.
// Otherwise it says what differs first.
func adoptUnchanged(kt map[knftables.Family]*kernelTable, desired map[knftables.Family]*ruleset, want, wantRules map[knftables.Family]digest) string {
	for _, f := range families {
		k, rs := kt[f], desired[f]
		if k == nil {
			return string(f) + ": no table"
		}
		if d, ok := k.digest(); !ok || d != want[f] {
			return string(f) + ": element digest"
		}
		if d, ok := k.rulesDigest(); !ok || d != wantRules[f] {
			return string(f) + ": rules digest"
		}
		chains := slices.Collect(maps.Keys(rs.chains))
		for _, bc := range baseChains {
			chains = append(chains, bc.name)
		}
		sets := append(slices.Collect(maps.Keys(rs.affinity)), digestSet, rulesDigestSet)
		sets = slices.AppendSeq(sets, maps.Keys(layouts[f]))
		if why := sameNames(k.chains, chains); why != "" {
			return string(f) + ": chains: " + why
		}
		if why := sameNames(k.sets, sets); why != "" {
			return string(f) + ": sets: " + why
		}
	}
	return ""
}

// sameNames returns "" when have holds exactly the (distinct) names
// want, else what differs.
func sameNames(have map[string]bool, want []string) string {
	for _, name := range want {
		if !have[name] {
			return "no " + name
		}
	}
	if len(have) != len(want) {
		return fmt.Sprintf("%d, want %d", len(have), len(want))
	}
	return ""
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

// adoptElementOps appends what turns k's elements into rs's: deletions
// (of elements rs lacks or holds with another value) first, then
// additions.
func adoptElementOps(ops []ElementOp, f knftables.Family, k *kernelTable, rs *ruleset) []ElementOp {
	for _, name := range slices.Sorted(maps.Keys(k.elems)) {
		want := rs.elems[name]
		from := len(ops)
		for key, v := range k.elems[name] {
			if e, ok := want.Get(key); !ok || e.value() != v {
				ops = append(ops, ElementOp{Delete: true, Family: f, Set: name, Key: key, Value: v, wire: true})
			}
		}
		sortByKey(ops[from:])
	}
	for _, name := range slices.Sorted(maps.Keys(rs.elems)) {
		have := k.elems[name]
		from := len(ops)
		for key, e := range rs.elems[name].All() {
			if v, ok := have[key]; !ok || v != e.value() {
				ops = append(ops, ElementOp{Family: f, Set: name, Key: key, Value: e.value(), wire: true})
			}
		}
		sortByKey(ops[from:])
	}
	return ops
}

// sortByKey orders one map's operations by key, so that a transaction
// reads the same every time.
func sortByKey(ops []ElementOp) {
	slices.SortFunc(ops, func(a, b ElementOp) int { return strings.Compare(a.Key, b.Key) })
}

// readTables implements tableReader for the fake.
func (f *FakeTransport) readTables(_ context.Context, elements bool) (map[knftables.Family]*kernelTable, error) {
	f.Fake.RLock()
	defer f.Fake.RUnlock()
	out := map[knftables.Family]*kernelTable{}
	for _, fam := range families {
		t := f.Fake.Tables[fam][TableName]
		if t == nil {
			continue
		}
		k := newKernelTable()
		for name := range t.Chains {
			k.chains[name] = true
		}
		if elements {
			k.elems = map[string]map[string]string{}
		}
		add := func(name string, elems []*knftables.Element) error {
			k.sets[name] = true
			if isDigestSet(name) {
				ds := k.digestsOf(name)
				for _, e := range elems {
					if a, err := netip.ParseAddr(e.Key[0]); err == nil && a.Is6() {
						*ds = append(*ds, digest(a.As16()))
					}
				}
				return nil
			}
			if !elements || !hasKey(layouts[fam], name) {
				return nil
			}
			m := map[string]string{}
			for _, e := range elems {
				v := ""
				if len(e.Value) > 0 {
					v = e.Value[0]
				}
				key, v, err := wireOf(layouts[fam][name], e.Key[0], v)
				if err != nil {
					return fmt.Errorf("%s %s element %s: %w", fam, name, e.Key[0], err)
				}
				m[key] = v
			}
			k.elems[name] = m
			return nil
		}
		for name, s := range t.Sets {
			if err := add(name, s.Elements); err != nil {
				return nil, err
			}
		}
		for name, m := range t.Maps {
			if err := add(name, m.Elements); err != nil {
				return nil, err
			}
		}
		out[fam] = k
	}
	return out, nil
}

// readTables implements tableReader over netlink: the chain and set
// names of each family's table, its digest and, with elements, the
// elements of its static maps and sets, decoded into the syntax the
// builder writes (TestKernelAdopt checks the round trip). The element
// dumps, the bulk, run two at a time.
func (n *NFT) readTables(_ context.Context, elements bool) (map[knftables.Family]*kernelTable, error) {
	conn, closeNS, err := n.conn()
	if err != nil {
		return nil, fmt.Errorf("nft netlink: %w", err)
	}
	defer closeNS()
	var jobs []elemDump
	out := map[knftables.Family]*kernelTable{}
	for _, f := range families {
		k, js, err := n.readTable(conn, f, elements)
		if err != nil {
			return nil, err
		}
		if k != nil {
			out[f] = k
			jobs = append(jobs, js...)
		}
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = n.dump(j)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// elemDump is one static map or set to read into m.
type elemDump struct {
	f    knftables.Family
	name string
	m    map[string]string
}

// readTable reads family f's table (nil when there is none): its chains,
// sets and digest, and with elements the dumps of its static maps and
// sets still to run.
func (n *NFT) readTable(conn *gnft.Conn, f knftables.Family, elements bool) (*kernelTable, []elemDump, error) {
	t, err := conn.ListTableOfFamily(TableName, gnftFamilies[f])
	if err != nil {
		if errors.Is(err, unix.ENOENT) || isNotFound(err) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("nft netlink: table %s %s: %w", f, TableName, err)
	}
	k := newKernelTable()
	chains, err := conn.ListChainsOfTableFamily(gnftFamilies[f])
	if err != nil {
		return nil, nil, fmt.Errorf("nft netlink: chains of %s %s: %w", f, TableName, err)
	}
	for _, c := range chains {
		if c.Table != nil && c.Table.Name == TableName {
			k.chains[c.Name] = true
		}
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return nil, nil, fmt.Errorf("nft netlink: sets of %s %s: %w", f, TableName, err)
	}
	if elements {
		k.elems = map[string]map[string]string{}
	}
	var jobs []elemDump
	for _, s := range sets {
		if s.Anonymous {
			// A rule's own set or map ({ a, b } or vmap { … }): it goes
			// with the rule, and is nobody's to adopt or delete.
			continue
		}
		k.sets[s.Name] = true
		switch {
		case isDigestSet(s.Name):
			ds := k.digestsOf(s.Name)
			err := nfcount.Elements(nfFamilies[f], TableName, s.Name, nfcount.Options{Netns: n.Netns}, func(e nfcount.Element) error {
				if len(e.Key) != 16 {
					return fmt.Errorf("%s: a %d-byte element", s.Name, len(e.Key))
				}
				*ds = append(*ds, digest(e.Key))
				return nil
			})
			if err != nil {
				return nil, nil, fmt.Errorf("nft netlink: %s %s %s: %w", f, TableName, s.Name, err)
			}
		case elements && hasKey(layouts[f], s.Name):
			m := map[string]string{}
			k.elems[s.Name] = m
			jobs = append(jobs, elemDump{f, s.Name, m})
		}
	}
	return k, jobs, nil
}

// dump reads j's elements into j.m.
func (n *NFT) dump(j elemDump) error {
	l := layouts[j.f][j.name]
	err := nfcount.Elements(nfFamilies[j.f], TableName, j.name, nfcount.Options{Netns: n.Netns}, func(e nfcount.Element) error {
		key, val, err := wireElement(l, e)
		j.m[key] = val
		return err
	})
	if err != nil {
		return fmt.Errorf("nft netlink: %s %s %s: %w", j.f, TableName, j.name, err)
	}
	return nil
}
