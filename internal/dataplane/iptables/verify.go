package iptables

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane"
)

// Verify implements dataplane.Verifier. For every family and table it
// reads the table once (iptables-save) and compares the rule count of
// every chain the last restore wrote, shared and per-Service, with what
// the kernel holds; it returns an error wrapping dataplane.ErrDrift naming
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
	wants := map[key]map[string]int{}
	for fam, tables := range p.applied {
		for table, a := range tables {
			w := make(map[string]int, len(a.static))
			for name, text := range a.static {
				w[name] = strings.Count(text, "\n")
			}
			for _, f := range a.frags {
				for _, c := range f.chains {
					w[c.name] = c.n
				}
			}
			wants[key{fam, table}] = w
		}
	}
	p.mu.Unlock()

	var diffs []string
	for k, w := range wants {
		out, err := p.run.Save(ctx, k.fam, k.table)
		if err != nil {
			return fmt.Errorf("iptables: verify: save %s %s: %w", k.fam, k.table, err)
		}
		exists, rules := countSave(out)
		for name, n := range w {
			switch {
			case !exists[name]:
				diffs = append(diffs, fmt.Sprintf("%s %s chain %s: missing", k.fam, k.table, name))
			case rules[name] != n:
				diffs = append(diffs, fmt.Sprintf("%s %s chain %s: %d rules, want %d", k.fam, k.table, name, rules[name], n))
			}
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
	if len(diffs) == 0 || overlapped {
		return nil
	}
	slices.Sort(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	return fmt.Errorf("%w: %s", dataplane.ErrDrift, strings.Join(diffs, "; "))
}

var _ dataplane.Verifier = (*Proxier)(nil)

// countSave counts, in iptables-save output for one table, the rules of
// every vipproxy chain and notes which of them exist, without keeping the
// rules (parseSave keeps them all).
func countSave(data []byte) (exists map[string]bool, rules map[string]int) {
	exists, rules = map[string]bool{}, map[string]int{}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
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
