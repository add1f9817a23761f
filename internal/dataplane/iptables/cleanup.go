package iptables

// What the mode removes: everything it installed (Cleanup) and, for
// package modes, kube-proxy's chains.

import (
	"context"
	"errors"
	"fmt"
)

// RemoveKubeProxyLeftovers removes kube-proxy's iptables and ipvs-mode
// chains (and every rule jumping to them) in nat, filter and mangle of each
// family, leaving kubelet's KUBE- chains alone. With onlyMarked a table is
// read only when one of kube-proxy's marker chains is in it: saving a
// table vipproxy just filled with 10,000s of rules takes iptables-nft
// seconds. It succeeds when there is nothing to remove, and logs what it
// removed.
func (p *Proxier) RemoveKubeProxyLeftovers(ctx context.Context, onlyMarked bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter, "mangle"} {
			if onlyMarked && !p.anyChain(ctx, fam, table, kubeProxyMarkers[table]) {
				continue
			}
			n, err := p.removeChains(ctx, fam, table, isKubeProxyChain)
			if err != nil {
				errs = append(errs, err)
			}
			if n > 0 {
				p.log.Info("removed kube-proxy's iptables chains", "family", fam.String(), "table", table, "chains", n)
			}
		}
	}
	return errors.Join(errs...)
}

// kubeProxyMarkers are chains kube-proxy (iptables or IPVS mode) creates
// in each table whenever it runs (see RemoveKubeProxyLeftovers).
var kubeProxyMarkers = map[string][]string{
	TableNAT:    {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"},
	TableFilter: {"KUBE-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
	"mangle":    {"KUBE-PROXY-CANARY"},
}

// anyChain reports whether one of chains exists in table (an error other
// than "not found" counts as existing, so the caller looks closer).
func (p *Proxier) anyChain(ctx context.Context, fam Family, table string, chains []string) bool {
	for _, c := range chains {
		if _, err := p.run.ListChain(ctx, fam, table, c); err == nil || !IsNotFound(err) {
			return true
		}
	}
	return false
}

// removeChains deletes the chains of one table for which remove is true,
// and every rule jumping to them; it returns how many chains it removed.
func (p *Proxier) removeChains(ctx context.Context, fam Family, table string, remove func(string) bool) (int, error) {
	out, err := p.run.Save(ctx, fam, table)
	if err != nil {
		return 0, fmt.Errorf("iptables: save %s %s: %w", fam, table, err)
	}
	saved := parseSave(out)
	inputs := removalInput(table, saved, remove, p.chunkChains(ctx, fam))
	for i, data := range inputs {
		if err := p.run.Restore(ctx, fam, table, data); err != nil {
			return 0, fmt.Errorf("iptables: restore %s %s (part %d of %d): %w", fam, table, i+1, len(inputs), err)
		}
	}
	n := 0
	for _, c := range saved.chains {
		if !saved.builtin[c] && remove(c) {
			n++
		}
	}
	return n, nil
}

// Cleanup implements dataplane.Dataplane: CleanupChains, then
// DestroySets. It succeeds when there is nothing to remove; the next Sync
// is full.
func (p *Proxier) Cleanup(ctx context.Context) error {
	return errors.Join(p.CleanupChains(ctx), p.DestroySets(ctx))
}

// CleanupChains removes every VIP- chain and every rule jumping to one,
// in the nat, filter, mangle and raw tables of each configured family,
// then removes the built-in chains iptables-nft created that are left
// empty with policy accept (and their table when it is left empty): they
// let every packet through, so removing them changes no packet's fate, and
// the nftables ruleset is as before vipproxy ran. The hairpin sets stay:
// rules of the other iptables backend may still match them (see
// DestroySets). The next Sync is full.
func (p *Proxier) CleanupChains(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter, "mangle", "raw"} {
			if _, err := p.removeChains(ctx, fam, table, isOurs); err != nil {
				errs = append(errs, err)
				continue
			}
			if d, ok := p.run.(emptyPruner); ok {
				if pruned, err := d.PruneEmpty(ctx, fam, table); err != nil {
					p.log.Warn("could not remove empty built-in chains", "family", fam.String(), "table", table, "err", err)
				} else if pruned {
					p.log.Info("removed empty built-in chains", "family", fam.String(), "table", table)
				}
			}
		}
		p.applied[fam] = nil
	}
	p.needFull = true
	clear(p.cache)
	p.forgetSets()
	return errors.Join(errs...)
}

// DestroySets destroys the hairpin ipsets (see hairpin.go). Call it once
// no rule matches them: after CleanupChains of every iptables backend.
func (p *Proxier) DestroySets(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.destroySets(ctx)
}
