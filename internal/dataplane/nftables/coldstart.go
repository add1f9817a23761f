package nftables

// The cold start (with no table in the kernel, the containers in one
// transaction and the elements over netlink), Cleanup, and the removal of
// kube-proxy's tables for package modes.

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// filler is implemented by NFT: it fills unhooked maps in a pipeline of
// batches (see NFT.fill).
type filler interface {
	fill(ctx context.Context, ops iter.Seq[ElementOp], count int, ready <-chan error) error
}

// tablesAbsent reports whether neither family has a vipproxy table (a
// probe error counts as present: the caller then takes the atomic path).
func (p *Proxier) tablesAbsent(ctx context.Context) bool {
	for _, f := range families {
		ok, _, err := p.tr.Probe(ctx, f, TableName, "")
		if err != nil || ok {
			return false
		}
	}
	return true
}

// coldStart programs desired into a namespace that has no vipproxy table,
// in three steps: an nft transaction creates the tables with their maps,
// sets and regular chains but no base chain, so nothing is hooked yet;
// netlink batches fill the maps and sets (the bulk: at 10,000 Services
// × 10 endpoints, 110,000 elements that nft would spend seconds parsing),
// encoded straight from the desired tables while the kernel inserts the
// batch before (see NFT.fill);
// a last nft transaction adds the base chains, which hooks the complete
// tables in at once. A failure in any step is a failed sync: whatever the
// earlier steps created is unhooked, and the next sync rebuilds it
// atomically (the tables then exist).
func (p *Proxier) coldStart(ctx context.Context, el Elementer, st *model.State, desired map[knftables.Family]*ruleset, want, wantRules map[knftables.Family]digest, start time.Time) error {
	fail := func(step string, err error) error {
		metrics.NFTablesSyncFailures.Inc()
		p.applied = nil
		p.log.Error("nftables: cold start failed; next sync rebuilds", "step", step, "err", err)
		return fmt.Errorf("nftables: cold start (%s): %w", step, err)
	}
	ruleset := time.Since(start) // the build
	tx := p.tr.NewTransaction()
	n := 0
	for _, f := range families {
		for _, elems := range desired[f].elems {
			n += elems.Len()
		}
		n++ // the digest
	}
	var seqs []iter.Seq[ElementOp]
	for _, f := range families {
		tx.Add(&knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")})
		p.writeContainers(tx, f, false)
		p.writeContent(tx, f, desired[f], slices.Sorted(maps.Keys(desired[f].chains)))
		seqs = append(seqs, elementsOf(f, desired[f]), slices.Values(digestOps(nil, f, digestSet, digest{}, false, want[f])))
	}
	ops := concat(seqs)
	var built time.Duration
	if f, ok := el.(filler); ok {
		// The nft transaction runs while the first element batch is
		// encoded; batches are encoded while the kernel inserts the last.
		ready := make(chan error, 1)
		go func() {
			err := p.tr.Run(ctx, tx)
			built = time.Since(start)
			ready <- err
		}()
		if err := f.fill(ctx, ops, n, ready); err != nil {
			return fail("tables and elements", err)
		}
	} else {
		if err := p.tr.Run(ctx, tx); err != nil {
			return fail("tables", err)
		}
		built = time.Since(start)
		if err := el.RunElements(ctx, slices.Collect(ops)); err != nil {
			return fail("elements", err)
		}
	}
	filled := time.Since(start)
	tx = p.tr.NewTransaction()
	for _, f := range families {
		writeBaseChains(tx, f)
		writeBaseRules(tx, f)
		// Last: a table that lacks it is not adopted unchanged.
		tx.Add(element(f, rulesDigestSet, wantRules[f].key(), ""))
	}
	if err := p.tr.Run(ctx, tx); err != nil {
		return fail("hooks", err)
	}
	p.resetStale()
	p.applied, p.digests, p.rulesDigests = desired, want, wantRules
	p.appliedPorts = portsOf(st)
	p.log.Debug("nftables: synced", "kind", "cold-start", "elements", n, "built", ruleset, "tables", built,
		"elements-done", filled, "took", time.Since(start))
	return nil
}

// elementsOf yields every element of rs as an addition, in no
// particular order. rs must not change while it runs.
func elementsOf(f knftables.Family, rs *ruleset) iter.Seq[ElementOp] {
	return func(yield func(ElementOp) bool) {
		for name, elems := range rs.elems {
			for k, e := range elems.All() {
				if !yield(ElementOp{Family: f, Set: name, Key: k, Value: e.value(), wire: true}) {
					return
				}
			}
		}
	}
}

// concat yields what each of seqs yields, in turn.
func concat[T any](seqs []iter.Seq[T]) iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, seq := range seqs {
			for v := range seq {
				if !yield(v) {
					return
				}
			}
		}
	}
}

// Cleanup implements dataplane.Dataplane: it deletes vipproxy's nftables
// tables of both families, in one transaction, and logs what it removed.
// It succeeds when there is nothing to remove. kube-proxy's tables are
// left alone (see RemoveKubeProxyTables).
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied = nil
	p.appliedPorts = nil
	p.resetStale()
	return p.deleteTables(ctx, TableName)
}

// RemoveKubeProxyTables deletes kube-proxy's nftables tables ("kube-proxy"
// in both families), as a migration from kube-proxy needs (package modes:
// they would keep DNATing Service traffic). It succeeds when there is
// nothing to remove.
func (p *Proxier) RemoveKubeProxyTables(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleteTables(ctx, kubeProxyTable)
}

// deleteTables deletes the named table of each family where it exists.
func (p *Proxier) deleteTables(ctx context.Context, name string) error {
	tx := p.tr.NewTransaction()
	var removed []string
	for _, f := range families {
		ok, _, err := p.tr.Probe(ctx, f, name, "")
		if err != nil {
			metrics.NFTablesCleanupFailures.Inc()
			return fmt.Errorf("nftables: cleanup: %w", err)
		}
		if ok {
			tx.Delete(&knftables.Table{Family: f, Name: name})
			removed = append(removed, string(f)+" "+name)
		}
	}
	if len(removed) == 0 {
		p.log.Info("nftables: cleanup: nothing to remove", "table", name)
		return nil
	}
	if err := p.tr.Run(ctx, tx); err != nil {
		metrics.NFTablesCleanupFailures.Inc()
		return fmt.Errorf("nftables: cleanup of %s: %w", strings.Join(removed, ", "), err)
	}
	p.log.Info("nftables: cleanup: removed tables", "tables", strings.Join(removed, ", "))
	return nil
}
