// Package iptables is vipproxy's iptables mode: kube-proxy's iptables
// rules (per-Service chains, random choice, ClientIP affinity, masquerade
// mark) under vipproxy's own VIP- chain prefix, with the hairpin
// masquerade in an ipset and the DNAT in the balancing rules where ipset
// works, kube-proxy's chain per endpoint where it does not (hairpin.go),
// written with iptables-restore --noflush, one transaction per table per
// sync, with partial restores of the chains that changed, a canary chain in
// every table for flush detection, and cleanup of kube-proxy's leftovers.
//
// Performance: iptables-nft-restore (1.8.9) keeps the chain names one
// transaction mentions, and the chains it creates, in name-sorted linked
// lists, so a transaction naming C chains costs O(C²) string compares:
// one restore creating 1,000 Services × 10 endpoints (~11,000 chains) took
// 5 s, 3,000 Services 82 s, 10,000 Services (110,000 chains) more than
// 300 s (killed). So vipproxy creates many new per-Service chains in
// restores of restoreChunkChains chains before the one transaction that
// makes them reachable, creates chains in descending name order, and
// removes many chains in bounded restores too (see restoreInput and
// removalInput); with iptables-legacy, which copies the whole table in
// every restore, it does not split (see chunkChains). BenchmarkKernelSync, in a namespace on the shared 2-core
// machine (load average 2–5), iptables-nft: cold start 2.0 s / 5.8 s /
// 23 s at 1,000 / 3,000 / 10,000 Services × 10 endpoints; one-change sync
// 53 / 102 / 351 ms; a verified full sync within FullSyncInterval 0.1 /
// 0.1 / 0.3 s; a full sync of an unchanged kernel 0.8 / 2.4 / 10 s (most
// of it iptables-save); Cleanup 1.1 / 3.0 / 12.5 s. At 10,000 Services any
// nat restore, even of one rule, costs iptables-nft ~0.28 s (kernel-side
// commit of a 430,000-rule table), and rewriting the 10,000-rule
// VIP-SERVICES chain alone 1.4 s, which is why partial syncs never rewrite
// unchanged shared chains. Never depend on writing every chain being cheap.
//
// Backend: iptables-legacy-restore creates the 1,000-Service ruleset in
// 0.4 s, but vipproxy does not switch to it by itself: rules must live in
// the backend the host's iptables (kubelet, CNI plugins, firewalls) uses,
// or the two rulesets are both evaluated and neither sees the other's
// chains (KUBE-MARK-DROP, KUBE-FIREWALL, …). The default runs the
// system's iptables; Exec.Variant selects a backend explicitly.
//
// Files: rules.go (a ServicePort's rules for one family: the mode's
// rule-building function, after kube-proxy's syncProxyRules), hairpin.go
// (the hairpin sets), fragments.go
// (the per-family fragment cache and the shared chains), restore.go (the
// iptables-restore input of full and partial syncs), save.go and canon.go
// (reading iptables-save), cleanup.go (migration and Cleanup), runner.go
// and backend.go (the iptables binaries), verify.go (drift check),
// fake.go (an in-memory iptables-restore for tests).
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// Options configure the iptables mode.
type Options struct {
	dataplane.Options
	// Runner runs iptables; nil means &Exec{} (the real binaries in the
	// current network namespace).
	Runner Runner
	// Families are the IP families programmed. nil means IPv4 and IPv6,
	// except that a family whose iptables-save fails on the first Sync
	// while the other works (no IPv6 in the kernel, no ip6tables) is
	// dropped with a warning, as upstream runs one proxier per usable family.
	Families []Family
	// DropInvalid forces (true) or suppresses (false) the FORWARD rule that
	// drops conntrack INVALID packets. nil means: install it when the
	// sysctl net.netfilter.nf_conntrack_tcp_be_liberal is 0 or unreadable.
	DropInvalid *bool
	// Sysctl reads net.netfilter.nf_conntrack_tcp_be_liberal (whether to
	// drop INVALID packets); nil means sysctl.OSFS{}.
	Sysctl sysctl.FS
	// LargeClusterEndpoints is the total endpoint count from which
	// per-endpoint rules carry no comments; 0 means 1000 (upstream's value).
	LargeClusterEndpoints int
	// FullSyncInterval is the shortest time between two full restores
	// (upstream's FullSyncPeriod). A Sync with full=true sooner than that
	// after the last full restore checks the kernel instead — the canary
	// of every table and the rule count of every shared chain (VIP-SERVICES,
	// VIP-POSTROUTING, …, one cheap `iptables -S chain` each) — and does a
	// partial restore when they match, a full one when they do not. Zero
	// means one hour; negative makes every full=true Sync a full restore.
	// A full restore reads the whole table (iptables-save: ~10 s for
	// iptables-nft at 10,000 Services × 10 endpoints) and rewrites the
	// chains that differ.
	FullSyncInterval time.Duration
	// IPSet runs ipset for the hairpin and ClusterIP sets (hairpin.go).
	// nil means &ipset.Exec{} in Runner's namespace when Runner is an
	// *Exec, and no sets otherwise: kube-proxy's layout, a chain per
	// endpoint.
	IPSet ipset.Runner
}

// Proxier implements dataplane.Dataplane with iptables. Create it with New.
type Proxier struct {
	opts Options
	run  Runner
	sets ipset.Runner // nil: no hairpin set
	log  *slog.Logger

	mu    sync.Mutex
	syncs uint64 // Sync calls; Verify discards a count taken while one ran
	// verifyRound counts Verify calls: whose turn it is (see verifyChains).
	verifyRound uint64
	needFull    bool
	// applied holds, per family and table, the content of every chain
	// vipproxy last restored successfully.
	applied map[Family]map[string]*appliedTable
	cache   map[Family]*famCache
	famSets map[Family]*famSets
	// LastRestoreBytes is the size of the restore input of the last
	// Sync (all families and tables), for benchmarks.
	lastBytes int
	lastFull  time.Time
	// probe: Families were defaulted; check them on the first Sync.
	probe bool
	// now is the clock; tests replace it.
	now func() time.Time
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// New validates opts and returns a Proxier. It does not touch the kernel.
func New(opts Options) (*Proxier, error) {
	opts.Options = opts.Options.WithDefaults()
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return nil, fmt.Errorf("iptables: MasqueradeBit %d is not in [0, 31]", opts.MasqueradeBit)
	}
	probe := opts.Families == nil
	if opts.Families == nil {
		opts.Families = []Family{IPv4, IPv6}
	}
	if opts.FullSyncInterval == 0 {
		opts.FullSyncInterval = time.Hour
	}
	if opts.LargeClusterEndpoints <= 0 {
		opts.LargeClusterEndpoints = largeClusterEndpoints
	}
	if opts.Sysctl == nil {
		opts.Sysctl = sysctl.OSFS{}
	}
	run := opts.Runner
	if run == nil {
		run = &Exec{}
	}
	sets := opts.IPSet
	if e, ok := run.(*Exec); ok && sets == nil {
		sets = &ipset.Exec{Prefix: e.Prefix}
	}
	return &Proxier{
		opts:     opts,
		run:      run,
		sets:     sets,
		famSets:  map[Family]*famSets{},
		log:      opts.Log().With("mode", "iptables"),
		needFull: true,
		applied:  map[Family]map[string]*appliedTable{},
		cache:    map[Family]*famCache{},
		now:      time.Now,
		probe:    probe,
	}, nil
}

// Mode implements dataplane.Dataplane.
func (p *Proxier) Mode() string { return "iptables" }

// LastRestoreBytes returns the number of bytes of restore input the last
// Sync sent (0 when it sent nothing).
func (p *Proxier) LastRestoreBytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastBytes
}

// Sync implements dataplane.Dataplane. It restores the nat and filter
// tables of every family, each in one iptables-restore transaction. A
// partial sync (full false, previous Sync good, canaries present) writes
// only the chains whose rules changed and deletes chains no longer wanted;
// a full sync reads the table first (iptables-save), rewrites every
// vipproxy chain, deletes unknown VIP- chains and puts the jump rules back
// first in their built-in chains. Any failure marks the next Sync full.
func (p *Proxier) Sync(ctx context.Context, st *model.State, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncs++
	if st == nil {
		st = &model.State{}
	}
	if p.probe {
		p.probeFamilies(ctx)
	}
	for _, fam := range p.opts.Families {
		p.probeSets(ctx, fam)
	}
	verify := full && !p.needFull && p.opts.FullSyncInterval > 0 && p.now().Sub(p.lastFull) < p.opts.FullSyncInterval
	if p.needFull {
		full = true
	}
	if verify {
		full = false
	}
	if !full {
		if reason := p.canaryGone(ctx); reason != "" {
			p.log.Warn("vipproxy rules were flushed; doing a full sync", "reason", reason)
			full = true
		}
	}
	if verify && !full {
		if reason := p.sharedChainsChanged(ctx); reason != "" {
			p.log.Warn("vipproxy rules were changed by someone else; doing a full sync", "reason", reason)
			full = true
		}
	}
	desired := p.build(st, full)
	setWrites := p.setChanges(desired, full)
	if err := p.restoreSets(ctx, setWrites, false); err != nil {
		p.needFull = true
		p.log.Error("iptables sync failed; next sync is full", "full", full, "err", err)
		return err
	}
	written, errs := p.writeTables(ctx, desired, full)
	if len(errs) == 0 {
		if err := p.restoreSets(ctx, setWrites, true); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		p.needFull = true
		p.log.Error("iptables sync failed; next sync is full", "full", full, "err", err)
		return err
	}
	for _, ch := range setWrites {
		ch.commit()
	}
	p.needFull = false
	if full {
		p.lastFull = p.now()
	}
	p.log.Debug("iptables sync done", "full", full, "bytes", written)
	return nil
}

// tableFam names a table of a family in the rule-count metrics.
type tableFam struct{ table, fam string }

// writeTables restores every table of every family (filter before nat:
// a Service's firewall, drop and reject rules are in force before its
// DNAT makes it reachable, so a new Service is never briefly open to
// sources its loadBalancerSourceRanges deny, nor refused where it must
// drop) and sets the rule-count metrics. It returns the bytes written.
func (p *Proxier) writeTables(ctx context.Context, desired map[Family]map[string]*desiredTable, full bool) (written int, errs []error) {
	rules, last := map[tableFam]int{}, map[tableFam]int{}
	for _, fam := range p.opts.Families {
		if p.applied[fam] == nil {
			p.applied[fam] = map[string]*appliedTable{}
		}
		for _, table := range []string{TableFilter, TableNAT} {
			d := desired[fam][table]
			key := tableFam{table, fam.metricLabel()}
			rules[key] += d.rules
			n, restored, err := p.writeTable(ctx, fam, table, d, full)
			written += n
			last[key] = restored
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.applied[fam][table] = d.applied()
			d.release()
		}
	}
	p.lastBytes = written
	for k, n := range rules {
		metrics.IptablesRulesTotal.WithLabelValues(k.table, k.fam).Set(float64(n))
		metrics.IptablesRulesLast.WithLabelValues(k.table, k.fam).Set(float64(last[k]))
	}
	return written, errs
}

// writeTable restores one table to d: the bytes and rules it wrote.
func (p *Proxier) writeTable(ctx context.Context, fam Family, table string, d *desiredTable, full bool) (written, rules int, err error) {
	inputs, err := p.restoreInput(ctx, fam, table, d, full)
	if err != nil {
		return 0, 0, err
	}
	for i, data := range inputs {
		written += len(data)
		rules += bytes.Count(data, []byte("\n-A "))
		if err := p.run.Restore(ctx, fam, table, data); err != nil {
			metrics.IptablesRestoreFailures.Inc()
			if !full {
				metrics.IptablesPartialRestoreFailures.Inc()
			}
			return written, rules, fmt.Errorf("iptables: restore %s %s (part %d of %d): %w", fam, table, i+1, len(inputs), err)
		}
	}
	return written, rules, nil
}

// probeFamilies drops a defaulted family whose iptables-save fails while
// another family's works.
func (p *Proxier) probeFamilies(ctx context.Context) {
	var ok []Family
	errs := map[Family]error{}
	for _, fam := range p.opts.Families {
		if _, err := p.run.Save(ctx, fam, TableNAT); err != nil {
			errs[fam] = err
			continue
		}
		ok = append(ok, fam)
	}
	if len(ok) == 0 {
		return // nothing works: keep both and let Sync report the errors; probe again
	}
	for fam, err := range errs {
		p.log.Warn("IP family unusable, not programming it", "family", fam.String(), "err", err)
	}
	p.opts.Families = ok
	p.probe = false
}

// canaryGone checks the canary chain of every table and family and
// returns why a full sync is needed, or "". With the nf_tables backend it
// counts the canary's rules over netlink (ruleCounter): four `iptables
// -S` processes cost a one-change sync 20 ms.
func (p *Proxier) canaryGone(ctx context.Context) string {
	rc, _ := p.run.(ruleCounter)
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter} {
			if rc != nil {
				if n, ok, err := rc.CountRules(ctx, fam, table, []string{ChainCanary}); ok && err == nil {
					switch c := n[ChainCanary]; {
					case c < 0:
						return fmt.Sprintf("%s %s: chain %s missing", fam, table, ChainCanary)
					case c == 0:
						return fmt.Sprintf("%s %s: chain %s flushed", fam, table, ChainCanary)
					}
					continue
				}
			}
			out, err := p.run.ListChain(ctx, fam, table, ChainCanary)
			if err != nil {
				if IsNotFound(err) {
					return fmt.Sprintf("%s %s: chain %s missing", fam, table, ChainCanary)
				}
				return fmt.Sprintf("%s %s: listing %s: %v", fam, table, ChainCanary, err)
			}
			if !bytes.Contains(out, []byte("-A "+ChainCanary+" ")) {
				return fmt.Sprintf("%s %s: chain %s flushed", fam, table, ChainCanary)
			}
		}
	}
	return ""
}

// sharedChainsChanged compares the rule count of every shared chain in the
// kernel with what vipproxy last restored, and returns why they differ, or "".
func (p *Proxier) sharedChainsChanged(ctx context.Context) string {
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter} {
			a := p.applied[fam][table]
			if a == nil {
				return fmt.Sprintf("%s %s: never restored", fam, table)
			}
			for _, chain := range builtinChains[table] {
				var want []string
				for _, j := range jumps {
					if j.table == table && j.chain == chain {
						want = append(want, j.target)
					}
				}
				if len(want) == 0 {
					continue
				}
				out, err := p.run.ListChain(ctx, fam, table, chain)
				if err != nil {
					return fmt.Sprintf("%s %s: listing %s: %v", fam, table, chain, err)
				}
				var got []string
				for _, l := range strings.Split(string(out), "\n") {
					if strings.HasPrefix(l, "-A ") {
						if t := ruleTarget(l); isOurs(t) {
							got = append(got, t)
						} else if len(got) < len(want) {
							got = append(got, "(other)")
						}
					}
				}
				if !slices.Equal(got, want) {
					return fmt.Sprintf("%s %s: %s starts with jumps %v, want %v", fam, table, chain, got, want)
				}
			}
			for name, c := range a.static {
				out, err := p.run.ListChain(ctx, fam, table, name)
				if err != nil {
					return fmt.Sprintf("%s %s: listing %s: %v", fam, table, name, err)
				}
				if got, want := bytes.Count(out, []byte("\n-A ")), c.n; got+boolInt(bytes.HasPrefix(out, []byte("-A "))) != want {
					return fmt.Sprintf("%s %s: chain %s has %d rules, want %d", fam, table, name, got, want)
				}
			}
		}
	}
	return ""
}
