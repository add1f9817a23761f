package iptables

// The iptables-restore input of a sync: the tables as last applied, the
// chains a partial sync rewrites, chunking of large tables, and the jumps
// from the built-in chains.

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/model"
)

// desiredTable is one table's wanted vipproxy chains: the shared
// (static) chains, rebuilt every sync, and the per-ServicePort chains of
// each fragment, rebuilt only when the ServicePort changed.
type desiredTable struct {
	static []chainRules
	frags  []*fragment
	rules  int
}

func (d *desiredTable) set(name string, lines []string) {
	d.static = append(d.static, joinLines(name, lines))
	d.rules += len(lines)
}

// appliedTable is what the last successful restore of a table put in
// place: the static chains (their sums and rule counts) and the fragments
// by ServicePort.
type appliedTable struct {
	static map[string]chainSum
	frags  []*fragment // in ServicePort order; read-only
}

// chainSum is what a sync keeps of a chain it restored.
type chainSum struct {
	sum uint64
	n   int
}

func (d *desiredTable) applied() *appliedTable {
	a := &appliedTable{static: make(map[string]chainSum, len(d.static)), frags: d.frags}
	for _, c := range d.static {
		a.static[c.name] = chainSum{c.sum, c.n}
	}
	return a
}

// release gives up the text of d's chains once restored (see
// fragment.release): the shared chains' are kept, with their sums, for
// the syncs that do not change them (see buildFamily).
func (d *desiredTable) release() {
	for i := range d.static {
		d.static[i].text = ""
	}
	for _, f := range d.frags {
		f.release()
	}
}

// fragPair is a fragment of this sync and, when its ServicePort was
// there before, the fragment last applied for it (else nil).
type fragPair struct{ old, new *fragment }

// fragDelta compares the fragments of two syncs, both in ServicePort
// order: pairs holds every fragment of next that is not the same pointer
// at the same position in prev, with its predecessor by name, and gone
// the fragments of prev whose ServicePort is not in next. A fragment at
// an unchanged position costs one pointer compare; names are looked up
// for the others only (a one-change sync at 10,000 Services looked up
// every name in two maps).
func fragDelta(prev, next []*fragment) (pairs []fragPair, gone []*fragment) {
	var olds []*fragment
	for i, f := range next {
		if i < len(prev) && prev[i] == f {
			continue
		}
		pairs = append(pairs, fragPair{new: f})
		if i < len(prev) {
			olds = append(olds, prev[i])
		}
	}
	if len(prev) > len(next) {
		olds = append(olds, prev[len(next):]...)
	}
	if len(pairs) == 0 {
		return nil, olds
	}
	// A ServicePort at an unchanged position is in neither list, and
	// names are unique in each sync: olds are exactly the candidates.
	byName := make(map[model.ServicePortName]*fragment, len(olds))
	for _, f := range olds {
		byName[f.name] = f
	}
	for i := range pairs {
		n := pairs[i].new.name
		if old, ok := byName[n]; ok {
			pairs[i].old = old
			delete(byName, n)
		}
	}
	for _, f := range olds {
		if byName[f.name] == f {
			gone = append(gone, f)
		}
	}
	return pairs, gone
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// restoreChunkChains bounds the number of chains one pre-creation or
// removal restore names with iptables-nft (see restoreInput). A variable
// so tests can lower it.
var restoreChunkChains = 2000

// nftDetector is implemented by Runners that can tell whether the
// iptables binaries of a family use the nf_tables backend.
type nftDetector interface {
	IsNFT(ctx context.Context, fam Family) bool
}

// chunkChains returns the most chains one restore of fam may name where a
// sync or a removal can be split: restoreChunkChains for iptables-nft,
// where a transaction costs O(C²) in its C chains (and for Runners that
// cannot tell); no limit for iptables-legacy, which has no such cost but
// copies the whole table in every restore, so that splitting costs it
// (10,000 Services: cold start 12 s unsplit, 36 s split).
func (p *Proxier) chunkChains(ctx context.Context, fam Family) int {
	if d, ok := p.run.(nftDetector); ok && !d.IsNFT(ctx, fam) {
		return math.MaxInt
	}
	return restoreChunkChains
}

// restoreInput returns the restore inputs for one table, to be restored in
// order, or nil when there is nothing to change.
//
// The last input is the sync's one transaction: it writes the shared
// chains, rewrites changed chains and deletes stale ones. When the sync
// creates more than restoreChunkChains chains of ServicePorts whose chains
// are all new (a cold start, many new Services), those fragments are
// created first by inputs of at most about restoreChunkChains chains each.
// That keeps every step consistent: such chains are referenced only from
// the shared chains (VIP-SERVICES, VIP-NODEPORTS, …) and from each other,
// and the shared chains are written by the last input only, so until it
// commits no packet reaches them; if a later input fails, the next (full)
// sync finds them in the kernel and either keeps them (same rules) or
// deletes them (stale). The split exists because iptables-nft-restore
// (1.8.9) keeps the names a transaction mentions, and the chains it
// creates, in name-sorted linked lists: one transaction of C chains costs
// O(C²) string compares (minutes at 10,000 Services × 10 endpoints),
// while k transactions of C/k chains cost O(C²/k).
//
// Within every input, chains are created (-N) in descending name order:
// iptables-nft inserts each new chain into its sorted chain cache by
// walking from the smallest name, so descending order makes every
// insertion O(1).
func (p *Proxier) restoreInput(ctx context.Context, fam Family, table string, d *desiredTable, full bool) ([][]byte, error) {
	var td tableDiff
	if full {
		var err error
		if td, err = p.fullDiff(ctx, fam, table, d); err != nil {
			return nil, err
		}
	} else {
		td = p.partialDiff(fam, table, d)
	}
	if td.empty() {
		return nil, nil
	}
	for _, c := range td.write {
		if c.released() {
			// A chain is written from a fragment built in this sync,
			// or in a full one; this one was restored before and gave
			// its text up. Failing makes the next sync full.
			return nil, fmt.Errorf("iptables: %s %s chain %s: its rules were released after an earlier restore", fam, table, c.name)
		}
	}
	slices.Sort(td.stale)
	limit := p.chunkChains(ctx, fam)
	var tail [][]byte
	if len(td.stale) > limit {
		tail, td.stale = staleRemoval(table, td.stale, limit), nil
	}
	pre, write, exists := preCreate(table, d.frags, td.write, td.exists, limit)
	if len(write) > 0 || len(td.stale) > 0 || len(td.fixes) > 0 {
		pre = append(pre, renderRestore(table, write, td.stale, td.fixes, exists))
	}
	return append(pre, tail...), nil
}

// staleRemoval returns the inputs that remove more than limit stale
// chains after the sync's transaction: first inputs flushing at most
// limit of them each, then inputs deleting at most limit each. Once the
// transaction committed no wanted chain jumps to a stale one, and once all
// are flushed none jumps to another, so each input is valid alone, and
// bounded: one transaction deleting 100,000 chains (the endpoint chains
// of 10,000 Services, when a previous release's layout is replaced) runs
// iptables-nft's O(C²) chain lists for minutes. If an input fails, the
// next (full) sync finds what is left as stale.
func staleRemoval(table string, stale []string, limit int) [][]byte {
	var out [][]byte
	for _, op := range []string{"flush", "delete"} {
		for i := 0; i < len(stale); i += limit {
			var b bytes.Buffer
			b.WriteString("*" + table + "\n")
			for _, c := range stale[i:min(i+limit, len(stale))] {
				if op == "flush" {
					b.WriteString(":" + c + " - [0:0]\n")
				} else {
					b.WriteString("-X " + c + "\n")
				}
			}
			b.WriteString("COMMIT\n")
			out = append(out, b.Bytes())
		}
	}
	return out
}

// tableDiff is what a sync changes in one table: the chains to write, the
// stale chains to delete, the jumps to fix, and which chains the kernel
// already holds (they are flushed with ":CHAIN - [0:0]"; the others are
// created with -N, which iptables-nft-restore --noflush handles far
// faster).
type tableDiff struct {
	write  []chainRules
	stale  []string
	fixes  []string
	exists func(string) bool
}

func (td tableDiff) empty() bool {
	return len(td.write) == 0 && len(td.stale) == 0 && len(td.fixes) == 0
}

// fullDiff compares d with what iptables-save reads from the kernel.
// Chains the kernel already holds exactly (compared in canonical form,
// see canonRule) are not rewritten: rewriting costs iptables-nft far more
// than reading.
func (p *Proxier) fullDiff(ctx context.Context, fam Family, table string, d *desiredTable) (tableDiff, error) {
	var td tableDiff
	out, err := p.run.Save(ctx, fam, table)
	if err != nil {
		return td, fmt.Errorf("iptables: save %s %s: %w", fam, table, err)
	}
	saved := parseSave(out)
	want := map[string]bool{}
	all := append([]chainRules(nil), d.static...)
	for _, f := range d.frags {
		all = append(all, f.chains...)
	}
	for _, c := range all {
		want[c.name] = true
		if !sameRules(c, saved.rules[c.name], saved.has(c.name)) {
			td.write = append(td.write, c)
		}
	}
	for _, c := range saved.chains {
		if isOurs(c) && !saved.builtin[c] && !want[c] {
			td.stale = append(td.stale, c)
		}
	}
	td.fixes = jumpFixes(table, saved)
	have := make(map[string]bool, len(saved.chains))
	for _, c := range saved.chains {
		have[c] = true
	}
	td.exists = func(c string) bool { return have[c] }
	return td, nil
}

// partialDiff compares d with what the last sync applied: the static
// chains that changed and the chains of the fragments that are not the
// same pointer as before.
func (p *Proxier) partialDiff(fam Family, table string, d *desiredTable) tableDiff {
	var td tableDiff
	prev := p.applied[fam][table]
	prevChains := map[string]bool{}
	td.exists = func(c string) bool {
		_, ok := prev.static[c]
		return ok || prevChains[c]
	}
	for _, c := range d.static {
		if old, ok := prev.static[c.name]; !ok || old.sum != c.sum {
			td.write = append(td.write, c)
		}
	}
	for name := range prev.static {
		if !slices.ContainsFunc(d.static, func(c chainRules) bool { return c.name == name }) {
			td.stale = append(td.stale, name)
		}
	}
	pairs, gone := fragDelta(prev.frags, d.frags)
	for _, pr := range pairs {
		f, old := pr.new, pr.old
		if old == f {
			continue
		}
		oldSum := map[string]uint64{}
		if old != nil {
			for _, c := range old.chains {
				oldSum[c.name] = c.sum
				prevChains[c.name] = true
			}
		}
		for _, c := range f.chains {
			if sum, ok := oldSum[c.name]; !ok || sum != c.sum {
				td.write = append(td.write, c)
			}
			delete(oldSum, c.name)
		}
		for name := range oldSum {
			td.stale = append(td.stale, name)
		}
	}
	for _, old := range gone {
		for _, c := range old.chains {
			td.stale = append(td.stale, c.name)
		}
	}
	return td
}

// preCreate splits off the brand-new fragments (every chain of the
// fragment is in write and not in the kernel) when they hold more than
// limit chains. It returns the restore inputs creating them, in chunks of
// whole fragments of about limit chains, write
// without their chains, and exists updated for what those inputs create.
// The first input also creates, empty, every other chain of write that is
// not in the kernel (VIP-MARK-MASQ, …), so that every jump target of the
// fragments exists; the last restore fills them. Below the threshold it
// returns nil, write and exists unchanged.
func preCreate(table string, frags []*fragment, write []chainRules, exists func(string) bool, limit int) ([][]byte, []chainRules, func(string) bool) {
	inWrite := make(map[string]bool, len(write))
	for _, c := range write {
		inWrite[c.name] = true
	}
	var fresh []*fragment
	n := 0
	for _, f := range frags {
		if len(f.chains) == 0 {
			continue
		}
		ok := true
		for _, c := range f.chains {
			if !inWrite[c.name] || exists(c.name) {
				ok = false
				break
			}
		}
		if ok {
			fresh = append(fresh, f)
			n += len(f.chains)
		}
	}
	if n <= limit {
		return nil, write, exists
	}
	done := make(map[string]bool, n)
	for _, f := range fresh {
		for _, c := range f.chains {
			done[c.name] = true
		}
	}
	rest := make([]chainRules, 0, len(write)-n)
	var chunk []chainRules
	for _, c := range write {
		if done[c.name] {
			continue
		}
		rest = append(rest, c)
		if !exists(c.name) {
			chunk = append(chunk, chainRules{name: c.name})
			done[c.name] = true
		}
	}
	var pre [][]byte
	for i, f := range fresh {
		chunk = append(chunk, f.chains...)
		if len(chunk) >= limit || i == len(fresh)-1 {
			pre = append(pre, renderRestore(table, chunk, nil, nil, exists))
			chunk = nil
		}
	}
	return pre, rest, func(c string) bool { return done[c] || exists(c) }
}

// renderRestore returns one iptables-restore --noflush transaction for
// table: it creates (-N, in descending name order, see restoreInput) or
// flushes (when exists) every chain of write, flushes the stale chains,
// applies the jump fixes, appends write's rules and deletes the stale
// chains.
func renderRestore(table string, write []chainRules, stale, fixes []string, exists func(string) bool) []byte {
	size := 64
	var created []string
	for _, c := range write {
		size += len(c.name)*2 + 16 + len(c.text)
		if !exists(c.name) {
			created = append(created, c.name)
		}
	}
	slices.Sort(created)
	slices.Reverse(created)
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString("*" + table + "\n")
	for _, c := range created {
		b.WriteString("-N " + c + "\n")
	}
	for _, c := range write {
		if exists(c.name) {
			b.WriteString(":" + c.name + " - [0:0]\n")
		}
	}
	for _, c := range stale {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, f := range fixes {
		b.WriteString(f + "\n")
	}
	for _, c := range write {
		b.WriteString(c.text)
	}
	for _, c := range stale {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// sameRules reports whether saved (the rules of chain c in iptables-save
// output, if the chain exists) are c's rules.
func sameRules(c chainRules, saved []string, exists bool) bool {
	if !exists || len(saved) != c.n {
		return false
	}
	prefix := "-A " + c.name + " "
	text := c.text
	for i := 0; i < c.n; i++ {
		j := strings.IndexByte(text, '\n')
		if j < 0 {
			return false
		}
		line := text[:j]
		text = text[j+1:]
		if !strings.HasPrefix(line, prefix) || canonRule(line[len(prefix):]) != canonRule(saved[i]) {
			return false
		}
	}
	return true
}

// jumpFixes returns the restore lines that make vipproxy's jump rules the
// first rules of their built-in chains, in order, or nil when they already are.
func jumpFixes(table string, saved *savedTable) []string {
	var out []string
	for _, chain := range builtinChains[table] {
		var want []jump
		for _, j := range jumps {
			if j.table == table && j.chain == chain {
				want = append(want, j)
			}
		}
		rules := saved.rules[chain]
		var have []int
		for i, r := range rules {
			if isOurs(ruleTarget(r)) {
				have = append(have, i)
			}
		}
		ok := len(have) == len(want)
		for i := 0; ok && i < len(want); i++ {
			ok = have[i] == i && ruleTarget(rules[i]) == want[i].target
		}
		if ok {
			continue
		}
		for i := len(have) - 1; i >= 0; i-- {
			out = append(out, fmt.Sprintf("-D %s %d", chain, have[i]+1))
		}
		for i := len(want) - 1; i >= 0; i-- {
			out = append(out, "-I "+chain+" 1 "+JoinArgs(want[i].args()))
		}
	}
	return out
}
