package iptables

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
)

// verifyChains bounds the per-Service chains one drift check compares:
// with iptables-nft each costs a netlink dump (23 µs; 10,000 Services
// have 110,000 chains, 2.5 s). Checks take turns over the chains, so each
// is compared at least every ⌈chains/verifyChains⌉ checks.
var verifyChains = 10000

// Verify implements dataplane.Verifier. For every family and table it
// counts rules (over netlink, one dump per chain, with iptables-nft; from
// one iptables-save with iptables-legacy) and compares the rule count of
// every shared chain the last restore wrote, and of the per-Service chains
// whose turn it is (all of them up to verifyChains), and the members of
// the hairpin and ClusterIP sets (`ipset list -t`), with what the kernel
// holds; it returns an error wrapping dataplane.ErrDrift naming
// the first few differences. The reads run without the proxier's lock; a
// count that overlapped a Sync is discarded (nil). Drift also makes the
// next Sync a real full rewrite (not the shared-chain check a full Sync
// within Options.FullSyncInterval is otherwise). Before the first
// successful sync, or while a full sync is already due, it reports nil.
func (p *Proxier) Verify(ctx context.Context) error {
	type key struct {
		fam   Family
		table string
	}
	p.mu.Lock()
	if p.needFull || len(p.applied) == 0 {
		p.mu.Unlock()
		return nil
	}
	syncs := p.syncs
	p.verifyRound++
	round := p.verifyRound
	perService := 0
	for _, tables := range p.applied {
		for _, a := range tables {
			for _, f := range a.frags {
				perService += len(f.chains)
			}
		}
	}
	turns := uint32(max(1, (perService+verifyChains-1)/verifyChains))
	turn := uint32(round % uint64(turns))
	wants := map[key]map[string]int{}
	for fam, tables := range p.applied {
		for table, a := range tables {
			w := make(map[string]int, len(a.static))
			for name, c := range a.static {
				w[name] = c.n
			}
			for _, f := range a.frags {
				for _, c := range f.chains {
					if turns == 1 || chainTurn(c.name, turns) == turn {
						w[c.name] = c.n
					}
				}
			}
			wants[key{fam, table}] = w
		}
	}
	// The hairpin and ClusterIP sets: their members, counted.
	setWants := map[string]int{}
	counter, _ := p.sets.(ipset.Counter)
	for fam, fs := range p.famSets {
		if counter == nil || !fs.usable {
			continue
		}
		for k, st := range fs.state {
			setWants[k.name(fam)] = st.refs.len()
		}
	}
	p.mu.Unlock()

	var diffs []string
	for k, w := range wants {
		exists, rules, err := p.countTable(ctx, k.fam, k.table, w)
		if err != nil {
			return fmt.Errorf("iptables: verify: %w", err)
		}
		for name, n := range w {
			switch {
			case !exists[name]:
				diffs = append(diffs, fmt.Sprintf("%s %s chain %s: missing", k.fam, k.table, name))
			case rules[name] != n:
				diffs = append(diffs, fmt.Sprintf("%s %s chain %s: %d rules, want %d", k.fam, k.table, name, rules[name], n))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(setWants)) {
		n, ok, err := counter.Count(ctx, name)
		switch {
		case err != nil:
			return fmt.Errorf("iptables: verify: %w", err)
		case !ok:
			diffs = append(diffs, fmt.Sprintf("set %s: missing", name))
		case n != setWants[name]:
			diffs = append(diffs, fmt.Sprintf("set %s: %d members, want %d", name, n, setWants[name]))
		}
	}
	p.mu.Lock()
	overlapped := p.syncs != syncs
	if len(diffs) > 0 && !overlapped {
		// A full Sync within FullSyncInterval is otherwise only a check
		// of the shared chains: make the repair a real rewrite.
		p.needFull = true
	}
	p.mu.Unlock()
	if overlapped {
		return nil
	}
	return dataplane.DriftError(diffs)
}

var _ dataplane.Verifier = (*Proxier)(nil)

// ruleCounter is a Runner that can count a table's rules per chain more
// cheaply than Save; ok false means it cannot for this family.
type ruleCounter interface {
	CountRules(ctx context.Context, fam Family, table string, chains []string) (rules map[string]int, ok bool, err error)
}

// countTable counts the rules of the chains w names in one table, through
// the Runner's ruleCounter when it has one, else from Save. exists says
// which chains exist.
func (p *Proxier) countTable(ctx context.Context, fam Family, table string, w map[string]int) (exists map[string]bool, rules map[string]int, err error) {
	if rc, ok := p.run.(ruleCounter); ok {
		chains := make([]string, 0, len(w))
		for name := range w {
			chains = append(chains, name)
		}
		rules, ok, err := rc.CountRules(ctx, fam, table, chains)
		if err != nil {
			return nil, nil, fmt.Errorf("count %s %s: %w", fam, table, err)
		}
		if ok {
			exists = make(map[string]bool, len(rules))
			for name, n := range rules {
				exists[name] = n >= 0
			}
			return exists, rules, nil
		}
	}
	out, err := p.run.Save(ctx, fam, table)
	if err != nil {
		return nil, nil, fmt.Errorf("save %s %s: %w", fam, table, err)
	}
	exists, rules = countSave(out)
	return exists, rules, nil
}

// countSave counts, in iptables-save output for one table, the rules of
// every vipproxy chain and notes which of them exist, without keeping the
// rules (parseSave keeps them all).
func countSave(data []byte) (exists map[string]bool, rules map[string]int) {
	exists, rules = map[string]bool{}, map[string]int{}
	for line := range lines(data) {
		switch {
		case len(line) > 1 && line[0] == ':':
			if i := bytes.IndexByte(line, ' '); i > 1 {
				exists[string(line[1:i])] = true
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			rest := line[3:]
			if i := bytes.IndexByte(rest, ' '); i >= 0 {
				rest = rest[:i]
			}
			rules[string(rest)]++
		}
	}
	return exists, rules
}

// chainTurn spreads chain names over turns (FNV-1a).
func chainTurn(name string, turns uint32) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return h % turns
}
