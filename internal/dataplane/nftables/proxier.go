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
// sends only differences of the ports whose fingerprint changed (see
// Proxier.Sync). A difference made only of map and set elements (most
// endpoint and Service changes) goes as one netlink batch instead of
// through the nft binary, and a cold start fills its maps over netlink
// before it hooks the tables in (see coldStart): nft spends seconds
// parsing the 100,000s of elements of 10,000 Services, the kernel a few
// hundred milliseconds inserting them.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
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
	// appliedPorts are the ports of the State applied is built from.
	appliedPorts []*model.ServicePort
	// stale lists chains and sets that became unused in the last partial
	// sync; they were flushed then and are deleted by the next sync.
	staleChains map[knftables.Family]map[string]bool
	staleSets   map[knftables.Family]map[string]int
	started     bool
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// New returns a Proxier that programs through tr (use &NFT{} for the
// kernel). It validates o.MasqueradeBit (0 means 14).
func New(o dataplane.Options, tr Transport) (*Proxier, error) {
	if tr == nil {
		return nil, errors.New("nftables: nil transport")
	}
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return nil, fmt.Errorf("nftables: masqueradeBit %d out of range 0..31", o.MasqueradeBit)
	}
	if o.MasqueradeBit == 0 {
		o.MasqueradeBit = 14
	}
	p := &Proxier{opts: o, log: o.Log(), tr: tr}
	p.b = newBuilder(&p.opts)
	p.resetStale()
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
		for _, f := range families {
			ok, n, err := p.tr.Probe(ctx, f, TableName, chainNATPrerouting)
			if err != nil {
				p.log.Warn("nftables: probe failed, doing a full sync", "family", string(f), "err", err)
				full = true
				break
			}
			if !ok || n == 0 {
				p.log.Warn("nftables: table missing or flushed, doing a full sync", "family", string(f), "table", TableName)
				full = true
				break
			}
		}
	}

	fps := p.b.fingerprints(st)
	var desired map[knftables.Family]*ruleset
	if reset || full {
		desired = p.b.build(st, fps)
	}
	tx := p.tr.NewTransaction()
	var removedKubeProxy []string
	stale := map[knftables.Family]map[string]bool{}
	staleSets := map[knftables.Family]map[string]int{}
	var ops []ElementOp
	el, _ := p.tr.(Elementer)
	switch {
	case reset && el != nil && p.tablesAbsent(ctx):
		return p.coldStart(ctx, el, st, desired, start)
	case reset:
		if !p.started {
			removedKubeProxy = p.removeKubeProxy(ctx, tx)
		}
		for _, f := range families {
			t := &knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")}
			tx.Add(t)
			tx.Delete(&knftables.Table{Family: f, Name: TableName})
			tx.Add(t)
			p.writeAll(tx, f, desired[f])
		}
	case full:
		for _, f := range families {
			p.writeFull(tx, f, desired[f])
		}
	default:
		// The applied rulesets are updated in place; if the transaction
		// fails they are dropped and the next sync rebuilds.
		for _, f := range families {
			t := newTracker()
			p.b.update(p.fam(f), p.applied[f], st, fps, p.appliedPorts, t)
			stale[f], staleSets[f], ops = p.writeDelta(tx, f, p.applied[f], t, ops)
		}
	}

	kind := "partial"
	if reset {
		kind = "rebuild"
	} else if full {
		kind = "full"
	}
	if tx.NumOperations() == 0 && len(ops) == 0 {
		p.log.Debug("nftables: nothing to sync", "took", time.Since(start))
		return nil
	}
	// A change of map and set elements only (most endpoint and Service
	// changes) goes over netlink when the transport can; anything else,
	// elements included, is one nft transaction.
	var err error
	nops := len(ops)
	if tx.NumOperations() == 0 && el != nil {
		kind += "-elements"
		err = el.RunElements(ctx, ops)
	} else {
		elementsTx(tx, ops)
		nops = tx.NumOperations()
		err = p.tr.Run(ctx, tx)
	}
	if err != nil {
		metrics.NFTablesSyncFailures.Inc()
		p.applied = nil
		p.log.Error("nftables: sync failed; previous rules stay in force, next sync is full",
			"kind", kind, "operations", nops, "err", err)
		return fmt.Errorf("nftables: %s sync: %w", kind, err)
	}
	if len(removedKubeProxy) > 0 {
		p.log.Info("nftables: removed kube-proxy tables", "tables", removedKubeProxy)
	}
	p.started = true
	if reset || full {
		p.resetStale()
		p.applied = desired
	} else {
		p.staleChains, p.staleSets = stale, staleSets
	}
	p.appliedPorts = portsOf(st)
	p.log.Debug("nftables: synced", "kind", kind, "operations", nops, "took", time.Since(start))
	return nil
}

func portsOf(st *model.State) []*model.ServicePort {
	if st == nil {
		return nil
	}
	return st.Ports
}

// filler is implemented by NFT: it fills unhooked maps in a pipeline of
// batches (see NFT.fill).
type filler interface {
	fill(ctx context.Context, ops []ElementOp, ready <-chan error) error
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
// one netlink batch fills the maps and sets (the bulk: at 10,000 Services
// × 10 endpoints, 110,000 elements that nft would spend seconds parsing);
// a last nft transaction adds the base chains, which hooks the complete
// tables in at once. A failure in any step is a failed sync: whatever the
// earlier steps created is unhooked, and the next sync rebuilds it
// atomically (the tables then exist).
func (p *Proxier) coldStart(ctx context.Context, el Elementer, st *model.State, desired map[knftables.Family]*ruleset, start time.Time) error {
	fail := func(step string, err error) error {
		metrics.NFTablesSyncFailures.Inc()
		p.applied = nil
		p.log.Error("nftables: cold start failed; next sync rebuilds", "step", step, "err", err)
		return fmt.Errorf("nftables: cold start (%s): %w", step, err)
	}
	tx := p.tr.NewTransaction()
	var removed []string
	if !p.started {
		removed = p.removeKubeProxy(ctx, tx)
	}
	n := 0
	for _, f := range families {
		for _, elems := range desired[f].elems {
			n += len(elems)
		}
	}
	ops := make([]ElementOp, 0, n)
	for _, f := range families {
		tx.Add(&knftables.Table{Family: f, Name: TableName, Comment: knftables.PtrTo("rules for vipproxy")})
		p.writeContainers(tx, f, false)
		p.writeContent(tx, f, desired[f], sortedKeys(desired[f].chains))
		ops = elementOps(ops, f, desired[f])
	}
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
		if err := f.fill(ctx, ops, ready); err != nil {
			return fail("tables and elements", err)
		}
	} else {
		if err := p.tr.Run(ctx, tx); err != nil {
			return fail("tables", err)
		}
		built = time.Since(start)
		if err := el.RunElements(ctx, ops); err != nil {
			return fail("elements", err)
		}
	}
	filled := time.Since(start)
	tx = p.tr.NewTransaction()
	for _, f := range families {
		writeBaseChains(tx, f)
		writeBaseRules(tx, f)
	}
	if err := p.tr.Run(ctx, tx); err != nil {
		return fail("hooks", err)
	}
	if len(removed) > 0 {
		p.log.Info("nftables: removed kube-proxy tables", "tables", removed)
	}
	p.started = true
	p.resetStale()
	p.applied = desired
	p.appliedPorts = portsOf(st)
	p.log.Debug("nftables: synced", "kind", "cold-start", "elements", len(ops), "tables", built,
		"elements-done", filled, "took", time.Since(start))
	return nil
}

// elementOps appends every element of rs, in no particular order.
func elementOps(ops []ElementOp, f knftables.Family, rs *ruleset) []ElementOp {
	for name, elems := range rs.elems {
		for k, v := range elems {
			ops = append(ops, ElementOp{Family: f, Set: name, Key: k, Value: v})
		}
	}
	return ops
}

// removeKubeProxy queues deletion of kube-proxy's tables that exist and
// returns their names.
func (p *Proxier) removeKubeProxy(ctx context.Context, tx *knftables.Transaction) []string {
	var removed []string
	for _, f := range families {
		ok, _, err := p.tr.Probe(ctx, f, kubeProxyTable, "")
		if err != nil {
			p.log.Warn("nftables: cannot probe kube-proxy table", "family", string(f), "err", err)
			continue
		}
		if ok {
			tx.Delete(&knftables.Table{Family: f, Name: kubeProxyTable})
			removed = append(removed, string(f)+" "+kubeProxyTable)
		}
	}
	return removed
}

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
	for _, name := range sortedKeys(rs.affinity) {
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

func (p *Proxier) writeElements(tx *knftables.Transaction, f knftables.Family, rs *ruleset) {
	for _, name := range sortedKeys(rs.elems) {
		for _, k := range sortedKeys(rs.elems[name]) {
			tx.Add(element(f, name, k, rs.elems[name][k]))
		}
	}
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
func (p *Proxier) writeAll(tx *knftables.Transaction, f knftables.Family, rs *ruleset) {
	p.writeContainers(tx, f, false)
	writeBaseChains(tx, f)
	p.writeContent(tx, f, rs, sortedKeys(rs.chains))
	writeBaseRules(tx, f)
	p.writeElements(tx, f, rs)
}

// writeFull rewrites a table that may hold anything we applied before (or
// nothing, if someone deleted it): all rules and static map/set contents
// are replaced, chains and affinity sets no longer wanted are deleted.
func (p *Proxier) writeFull(tx *knftables.Transaction, f knftables.Family, rs *ruleset) {
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
	for _, c := range sortedKeys(gone) {
		if _, ok := rs.chains[c]; !ok {
			tx.Add(chainObj(f, c))
			tx.Delete(chainObj(f, c))
		}
	}
	for _, s := range sortedKeys(goneSets) {
		if _, ok := rs.affinity[s]; !ok {
			tx.Add(affinitySet(f, fam, s, goneSets[s]))
			tx.Delete(&knftables.Set{Family: f, Table: TableName, Name: s})
		}
	}
	writeBaseChains(tx, f)
	p.writeContent(tx, f, rs, sortedKeys(rs.chains))
	writeBaseRules(tx, f)
	p.writeElements(tx, f, rs)
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
	for _, c := range sortedKeys(p.staleChains[f]) {
		if _, ok := rs.chains[c]; !ok {
			tx.Delete(chainObj(f, c))
		}
	}
	for _, s := range sortedKeys(p.staleSets[f]) {
		if _, ok := rs.affinity[s]; !ok {
			tx.Delete(&knftables.Set{Family: f, Table: TableName, Name: s})
		}
	}
	nextStaleChains := map[string]bool{}
	nextStaleSets := map[string]int{}

	// New affinity sets before the rules that use them. (The timeout is
	// part of the name, so a set never changes.)
	for _, s := range sortedKeys(t.affinity) {
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
	for _, c := range sortedKeys(t.chains) {
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
	// Elements: deletions first (a changed value is a delete and an add).
	ids := make([]elemID, 0, len(t.elems))
	for id := range t.elems {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].name != ids[j].name {
			return ids[i].name < ids[j].name
		}
		return ids[i].key < ids[j].key
	})
	for _, id := range ids {
		prev := t.elems[id]
		v, now := rs.elems[id.name][id.key]
		if prev.existed && (!now || v != prev.value) {
			ops = append(ops, ElementOp{Delete: true, Family: f, Set: id.name, Key: id.key, Value: prev.value})
		}
	}
	for _, id := range ids {
		prev := t.elems[id]
		v, now := rs.elems[id.name][id.key]
		if now && (!prev.existed || v != prev.value) {
			ops = append(ops, ElementOp{Family: f, Set: id.name, Key: id.key, Value: v})
		}
	}
	return nextStaleChains, nextStaleSets, ops
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

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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
	p.started = false
	p.resetStale()
	return p.deleteTables(ctx, TableName)
}

// RemoveKubeProxyTables deletes kube-proxy's nftables tables ("kube-proxy"
// in both families), as a migration from kube-proxy needs (`--cleanup
// --cleanup-kube-proxy`, and every mode once at start: they would keep
// DNATing Service traffic). It succeeds when there is nothing to remove.
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
