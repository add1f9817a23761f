package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/nfcount"
)

// Counts is what a table holds, counted (see nfcount.Counts).
type Counts nfcount.Counts

// Counter is a Transport that can count a table's rules and elements
// without decoding them: the cheap drift check of Proxier.Verify.
type Counter interface {
	// Count counts table's rules, and the elements of the sets count
	// accepts (nil: every set).
	Count(ctx context.Context, family knftables.Family, table string, count func(set string) bool) (Counts, error)
}

// Verify implements dataplane.Verifier. It compares, per family, the rule
// count of every regular chain and the element count of every static map
// and set (of up to maxVerifiedElems elements; a larger one only has to
// exist) the last sync wrote with what the kernel holds (netlink dumps
// of the table's rules and sets and of each set's elements; no rule or
// element is decoded), and returns an error wrapping dataplane.ErrDrift
// naming the first few differences. Affinity sets are not compared (the
// kernel fills them). The dumps run without the proxier's lock, so Syncs
// are not held up; a count that overlapped a Sync is discarded (nil: the
// next Verify decides). With a transport that cannot count, or before the
// first sync, it reports no drift.
func (p *Proxier) Verify(ctx context.Context) error {
	c, ok := p.tr.(Counter)
	if !ok {
		return nil
	}
	type want struct {
		rules map[string]int
		elems map[string]int
	}
	p.mu.Lock()
	if p.applied == nil {
		p.mu.Unlock()
		return nil
	}
	syncs := p.syncs
	wants := map[knftables.Family]want{}
	for _, f := range families {
		rs := p.applied[f]
		if rs == nil {
			continue
		}
		w := want{rules: make(map[string]int, len(rs.chains)), elems: make(map[string]int, len(rs.elems))}
		for name, rules := range rs.chains {
			w.rules[name] = len(rules)
		}
		for name, el := range rs.elems {
			w.elems[name] = el.Len()
		}
		wants[f] = w
	}
	p.mu.Unlock()

	var diffs []string
	for _, f := range families {
		w, ok := wants[f]
		if !ok {
			continue
		}
		got, err := c.Count(ctx, f, TableName, func(set string) bool { return w.elems[set] <= maxVerifiedElems })
		if err != nil {
			return fmt.Errorf("nftables: verify: %w", err)
		}
		for name, n := range w.rules {
			if got.Rules[name] != n {
				diffs = append(diffs, fmt.Sprintf("%s chain %s: %d rules, want %d", f, name, got.Rules[name], n))
			}
		}
		for name, n := range w.elems {
			if !got.Sets[name] {
				diffs = append(diffs, fmt.Sprintf("%s set %s: missing", f, name))
				continue
			}
			if k, counted := got.Elems[name]; counted && k != n {
				diffs = append(diffs, fmt.Sprintf("%s set %s: %d elements, want %d", f, name, k, n))
			}
		}
	}
	p.mu.Lock()
	overlapped := p.syncs != syncs
	p.mu.Unlock()
	if overlapped {
		return nil
	}
	return dataplane.DriftError(diffs)
}

var _ dataplane.Verifier = (*Proxier)(nil)

// maxVerifiedElems is the largest map or set whose elements a drift check
// counts. Dumping a map is quadratic in its size (the kernel resumes a
// dump by skipping what it sent): 100,000 elements take ~0.15 s, the
// 500,000 of a 50,000-Service endpoint map seconds, every syncPeriod. A
// larger map is checked for existence only; the hourly full sync rewrites
// its contents.
var maxVerifiedElems = 150_000 // a variable for tests

// Count implements Counter from the fake's tables.
func (f *FakeTransport) Count(_ context.Context, family knftables.Family, table string, count func(string) bool) (Counts, error) {
	f.Fake.RLock()
	defer f.Fake.RUnlock()
	c := Counts{Rules: map[string]int{}, Elems: map[string]int{}, Sets: map[string]bool{}}
	t := f.Fake.Tables[family][table]
	if t == nil {
		return c, nil
	}
	for name, ch := range t.Chains {
		c.Rules[name] = len(ch.Rules)
	}
	for name, s := range t.Sets {
		c.Sets[name] = true
		if count == nil || count(name) {
			c.Elems[name] = len(s.Elements)
		}
	}
	for name, m := range t.Maps {
		c.Sets[name] = true
		if count == nil || count(name) {
			c.Elems[name] = len(m.Elements)
		}
	}
	return c, nil
}

// Count implements Counter over netlink (package nfcount).
func (n *NFT) Count(_ context.Context, family knftables.Family, table string, count func(string) bool) (Counts, error) {
	fam, ok := nfFamilies[family]
	if !ok {
		return Counts{}, fmt.Errorf("nft count: unsupported family %q", family)
	}
	c, err := nfcount.Table(fam, table, nfcount.Options{Netns: n.Netns, Elements: true, ElementsOf: count})
	return Counts(c), err
}

var nfFamilies = map[knftables.Family]nfcount.Family{knftables.IPv4Family: nfcount.IPv4, knftables.IPv6Family: nfcount.IPv6}
