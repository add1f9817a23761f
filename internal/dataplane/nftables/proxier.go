// Package nftables is vipproxy's default dataplane: one nftables table per
// IP family ("ip vipproxy", "ip6 vipproxy"), owned entirely by vipproxy.
//
// Layout. Base chains (see baseChains) jump to a few static chains that
// dispatch through verdict maps keyed by "addr . proto . port" (ClusterIPs,
// externalIPs, load-balancer IPs) and "proto . port" (NodePorts on the
// nodePortAddresses). A map element sends the packet to a chain shared by
// every port with the same policy, protocol and endpoint count, e.g.
// int-cluster-tcp-3 or ext-local-tcp-2-1, which marks for masquerade as the
// policy requires and DNATs with one rule:
//
//	dnat ip to ip daddr . tcp dport . numgen random mod 3 map @cluster-endpoints-tcp
//
// The endpoints themselves are elements of named maps keyed by
// "address . port . slot" (or "nodePort . slot"). So the table holds a
// fixed, small number of chains however many Services exist, and a
// one-endpoint change is two map-element operations. Measured with nft
// 1.0.6 at 10,000 Services × 10 endpoints: 10,000 per-port chains each
// holding an anonymous numgen map took 20 s to load, the same endpoints as
// elements of named maps 6 s (kube-proxy's per-endpoint chains are slower
// still). Only ports with ClientIP affinity get per-port chains (svc-,
// ext-, sticky-) and one chain and timeout set per endpoint, because the
// affinity lookup needs a set per endpoint; loadBalancerSourceRanges get a
// per-port fw- chain. Hairpin masquerading is one static postrouting rule
// over a set of "endpoint . endpoint" pairs. Reject (no endpoints, unknown
// port of a ClusterIP) and drop (Local policies without local endpoints,
// unallocated service-CIDR addresses) happen in filter chains after DNAT,
// where only packets that were not DNATed still carry a Service address.
//
// Sync sends one transaction per call; after a successful full sync it
// sends only differences of the ports that changed (see
// Proxier.Sync). A difference made only of map and set elements (most
// endpoint and Service changes) goes as one netlink batch instead of
// through the nft binary, and a cold start fills its maps over netlink
// before it hooks the tables in (see coldStart): nft spends seconds
// parsing the 100,000s of elements of 10,000 Services, the kernel a few
// hundred milliseconds inserting them.
//
// Files: rules.go (a ServicePort's chains and elements: the mode's
// rule-building function), ruleset.go (a family's ruleset and settings),
// build.go (the per-port fragment cache and update), refs.go
// (fragments' reference counts and the update tracker), write.go (the
// transactions of rebuild, full and partial syncs), coldstart.go (cold
// start and Cleanup), elements.go and transport.go (netlink and the nft
// binary), wire.go (elements kept in the kernel's encoding), digest.go
// (the element and rules digests), adopt.go (a restart's adoption),
// layout.go (base chains), verify.go (drift check).
package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Proxier implements dataplane.Dataplane with nftables.
type Proxier struct {
	opts dataplane.Options
	log  *slog.Logger
	tr   Transport
	b    *builder

	mu sync.Mutex
	// syncs counts Sync calls; Verify discards a count taken while one ran.
	syncs uint64
	// applied is what the last successful transaction left in force, nil
	// before the first success and after a failure.
	applied map[knftables.Family]*ruleset
	// digests and rulesDigests are the element and rules digests the
	// kernel holds (see digest.go), valid while applied is not nil.
	digests, rulesDigests map[knftables.Family]digest
	// schemas are the families' schema hashes (see schemaHash).
	schemas map[knftables.Family]digest
	// appliedPorts are the ports of the State applied is built from.
	appliedPorts []*model.ServicePort
	// stale lists chains and sets that became unused in the last partial
	// sync; they were flushed then and are deleted by the next sync.
	staleChains map[knftables.Family]map[string]bool
	staleSets   map[knftables.Family]map[string]int
}

var (
	_ dataplane.Dataplane      = (*Proxier)(nil)
	_ dataplane.AffinityReader = (*Proxier)(nil)
)

// New returns a Proxier that programs through tr (use &NFT{} for the
// kernel). It validates o.MasqueradeBit (0 means 14).
func New(o dataplane.Options, tr Transport) (*Proxier, error) {
	if tr == nil {
		return nil, errors.New("nftables: nil transport")
	}
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return nil, fmt.Errorf("nftables: masqueradeBit %d out of range 0..31", o.MasqueradeBit)
	}
	o = o.WithDefaults()
	p := &Proxier{opts: o, log: o.Log(), tr: tr}
	p.b = newBuilder(&p.opts)
	p.resetStale()
	p.schemas = map[knftables.Family]digest{}
	for _, f := range families {
		p.schemas[f] = p.schemaHash(f)
	}
	return p, nil
}

func (p *Proxier) resetStale() {
	p.staleChains = map[knftables.Family]map[string]bool{}
	p.staleSets = map[knftables.Family]map[string]int{}
	for _, f := range families {
		p.staleChains[f] = map[string]bool{}
		p.staleSets[f] = map[string]int{}
	}
}

// Mode implements dataplane.Dataplane.
func (p *Proxier) Mode() string { return "nftables" }

// Sync implements dataplane.Dataplane. A full sync runs when full is true,
// on the first call, after a failed call, and when a probe (netlink, one
// chain) finds a table gone or its base chain flushed. The first sync, and
// the first after a failure, rebuilds the tables from scratch and also
// removes kube-proxy's nftables tables: where no vipproxy table exists it
// builds them unhooked and hooks them in last (coldStart), otherwise it
// deletes and re-creates them in one transaction, so the old rules serve
// until the new ones are in. Later full syncs flush and rewrite rules and
// map contents but keep ClientIP-affinity sets. A partial sync sends
// only changed chains and map/set elements, flushes chains that became
// unused and deletes them one sync later. Nothing is sent when nothing
// changed. A failed transaction leaves the previous ruleset in force, is
// counted in metrics.NFTablesSyncFailures and makes the next sync full.
func (p *Proxier) Sync(ctx context.Context, st *model.State, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncs++
	start := time.Now()
	reset := p.applied == nil
	if !reset && !full {
		full = p.tableGone(ctx)
	}

	var existing <-chan tablesRead
	if reset {
		existing = p.readExisting(ctx) // while the build runs
	}
	var desired map[knftables.Family]*ruleset
	var want, wantRules map[knftables.Family]digest // desired's element and rules digests
	if reset || full {
		desired = p.b.build(st)
		want, wantRules = digestsOf(desired), p.rulesDigestsOf(desired)
	}
	tx := p.tr.NewTransaction()
	stale := map[knftables.Family]map[string]bool{}
	staleSets := map[knftables.Family]map[string]int{}
	var ops []ElementOp
	// The digests after a partial sync.
	next, nextRules := map[knftables.Family]digest{}, map[knftables.Family]digest{}
	el, _ := p.tr.(Elementer)
	switch {
	case reset && el != nil && p.tablesAbsent(ctx):
		return p.coldStart(ctx, el, st, desired, want, wantRules, start)
	case reset && p.adopt(ctx, existing, el, st, desired, want, wantRules, start):
		return nil
	case reset:
		for _, f := range families {
			t := &knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")}
			tx.Add(t)
			tx.Delete(&knftables.Table{Family: f, Name: TableName})
			tx.Add(t)
			p.writeAll(tx, f, desired[f], want[f])
		}
	case full:
		for _, f := range families {
			p.writeFull(tx, f, desired[f], want[f])
		}
	default:
		// The applied rulesets are updated in place; if the transaction
		// fails they are dropped and the next sync rebuilds.
		for _, f := range families {
			t := newTracker()
			p.b.update(p.fam(f), p.applied[f], st, p.appliedPorts, t)
			from := len(ops)
			stale[f], staleSets[f], ops = p.writeDelta(tx, f, p.applied[f], t, ops)
			old := p.digests[f]
			next[f] = afterOps(old, f, ops[from:])
			ops = digestOps(ops, f, digestSet, old, true, next[f])
			oldRules := p.rulesDigests[f]
			nextRules[f] = rulesAfter(oldRules, p.applied[f], t)
			ops = digestOps(ops, f, rulesDigestSet, oldRules, true, nextRules[f])
		}
	}

	kind := syncKind(reset, full)
	if tx.NumOperations() == 0 && len(ops) == 0 {
		if !reset && !full {
			p.appliedPorts = portsOf(st) // what update brought the rulesets to
		}
		p.log.Debug("nftables: nothing to sync", "took", time.Since(start))
		return nil
	}
	nops, kind, err := p.run(ctx, tx, ops, el, kind)
	if err != nil {
		metrics.NFTablesSyncFailures.Inc()
		p.applied = nil
		p.log.Error("nftables: sync failed; previous rules stay in force, next sync is full",
			"kind", kind, "operations", nops, "err", err)
		return fmt.Errorf("nftables: %s sync: %w", kind, err)
	}
	if reset || full {
		p.resetStale()
		p.applied, p.digests, p.rulesDigests = desired, want, wantRules
	} else {
		p.digests, p.rulesDigests = next, nextRules
		p.staleChains, p.staleSets = stale, staleSets
	}
	p.appliedPorts = portsOf(st)
	p.log.Debug("nftables: synced", "kind", kind, "operations", nops, "took", time.Since(start))
	return nil
}

// syncKind names a sync in logs and errors.
func syncKind(reset, full bool) string {
	switch {
	case reset:
		return "rebuild"
	case full:
		return "full"
	}
	return "partial"
}

// tableGone probes each family's table: true (logged) when one is
// missing, flushed or cannot be probed, so the sync must be full.
func (p *Proxier) tableGone(ctx context.Context) bool {
	for _, f := range families {
		ok, n, err := p.tr.Probe(ctx, f, TableName, chainNATPrerouting)
		if err != nil {
			p.log.Warn("nftables: probe failed, doing a full sync", "family", string(f), "err", err)
			return true
		}
		if !ok || n == 0 {
			p.log.Warn("nftables: table missing or flushed, doing a full sync", "family", string(f), "table", TableName)
			return true
		}
	}
	return false
}

// run applies a sync: a change of map and set elements only (most
// endpoint and Service changes) goes over netlink when the transport can
// (kind gains "-elements"); anything else, elements included, is one nft
// transaction. It returns the number of operations and the kind.
func (p *Proxier) run(ctx context.Context, tx *knftables.Transaction, ops []ElementOp, el Elementer, kind string) (int, string, error) {
	if tx.NumOperations() == 0 && el != nil {
		return len(ops), kind + "-elements", el.RunElements(ctx, ops)
	}
	elementsTx(tx, ops)
	return tx.NumOperations(), kind, p.tr.Run(ctx, tx)
}

func portsOf(st *model.State) []*model.ServicePort {
	if st == nil {
		return nil
	}
	return st.Ports
}
