// Package iptables is vipproxy's iptables mode: kube-proxy's iptables
// rules (per-Service and per-endpoint chains, random choice, ClientIP
// affinity, masquerade mark) under vipproxy's own VIP- chain prefix,
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
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
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
	// ReadSysctl reads a sysctl by its /proc/sys path relative name
	// ("net/netfilter/nf_conntrack_tcp_be_liberal"); nil reads /proc/sys.
	ReadSysctl func(name string) (string, error)
	// LargeClusterEndpoints is the total endpoint count from which
	// per-endpoint rules carry no comments; 0 means 1000 (upstream's value).
	LargeClusterEndpoints int
	// SkipMigration disables the removal of kube-proxy's chains and of the
	// nftables tables "vipproxy" and "kube-proxy" on the first Sync.
	SkipMigration bool
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
}

// Proxier implements dataplane.Dataplane with iptables. Create it with New.
type Proxier struct {
	opts Options
	run  Runner
	log  *slog.Logger

	mu    sync.Mutex
	syncs uint64 // Sync calls; Verify discards a count taken while one ran
	// verifyRound counts Verify calls: whose turn it is (see verifyChains).
	verifyRound uint64
	needFull    bool
	migrated    bool
	// applied holds, per family and table, the content of every chain
	// vipproxy last restored successfully.
	applied map[Family]map[string]*appliedTable
	cache   map[cacheKey]*cacheEntry
	// LastRestoreBytes is the size of the restore input of the last
	// Sync (all families and tables), for benchmarks.
	lastBytes int
	lastFull  time.Time
	// probe: Families were defaulted; check them on the first Sync.
	probe bool
	// now is the clock; tests replace it.
	now func() time.Time
}

type cacheKey struct {
	fam  Family
	name model.ServicePortName
}

type cacheEntry struct {
	sp   model.ServicePort
	cfg  string
	frag *fragment
	seen bool
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// New validates opts and returns a Proxier. It does not touch the kernel.
func New(opts Options) (*Proxier, error) {
	if opts.MasqueradeBit == 0 {
		opts.MasqueradeBit = 14
	}
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
	if opts.ReadSysctl == nil {
		opts.ReadSysctl = func(name string) (string, error) {
			b, err := os.ReadFile("/proc/sys/" + name)
			return strings.TrimSpace(string(b)), err
		}
	}
	run := opts.Runner
	if run == nil {
		run = &Exec{}
	}
	return &Proxier{
		opts:     opts,
		run:      run,
		log:      opts.Log().With("mode", "iptables"),
		needFull: true,
		applied:  map[Family]map[string]*appliedTable{},
		cache:    map[cacheKey]*cacheEntry{},
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
// place: static chain contents and the fragments by ServicePort.
type appliedTable struct {
	static map[string]string
	frags  map[model.ServicePortName]*fragment
}

func (d *desiredTable) applied() *appliedTable {
	a := &appliedTable{static: make(map[string]string, len(d.static)), frags: make(map[model.ServicePortName]*fragment, len(d.frags))}
	for _, c := range d.static {
		a.static[c.name] = c.text
	}
	for _, f := range d.frags {
		a.frags[f.name] = f
	}
	return a
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
	desired := p.build(st, full)
	if verify && !full {
		if reason := p.sharedChainsChanged(ctx); reason != "" {
			p.log.Warn("vipproxy rules were changed by someone else; doing a full sync", "reason", reason)
			full = true
		}
	}
	var errs []error
	written := 0
	type tableFam struct{ table, fam string }
	rules, last := map[tableFam]int{}, map[tableFam]int{}
	for _, fam := range p.opts.Families {
		if p.applied[fam] == nil {
			p.applied[fam] = map[string]*appliedTable{}
		}
		// filter before nat: a Service's firewall, drop and reject rules
		// are in force before its DNAT makes it reachable, so a new
		// Service is never briefly open to sources its
		// loadBalancerSourceRanges deny, nor refused where it must drop.
		for _, table := range []string{TableFilter, TableNAT} {
			d := desired[fam][table]
			key := tableFam{table, fam.metricLabel()}
			rules[key] += d.rules
			last[key] = 0
			inputs, err := p.restoreInput(ctx, fam, table, d, full)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if inputs == nil {
				continue
			}
			var rerr error
			for i, data := range inputs {
				written += len(data)
				last[key] += bytes.Count(data, []byte("\n-A "))
				if err := p.run.Restore(ctx, fam, table, data); err != nil {
					metrics.IptablesRestoreFailures.Inc()
					if !full {
						metrics.IptablesPartialRestoreFailures.Inc()
					}
					rerr = fmt.Errorf("iptables: restore %s %s (part %d of %d): %w", fam, table, i+1, len(inputs), err)
					break
				}
			}
			if rerr != nil {
				errs = append(errs, rerr)
				continue
			}
			p.applied[fam][table] = d.applied()
		}
	}
	p.lastBytes = written
	for k, n := range rules {
		metrics.IptablesRulesTotal.WithLabelValues(k.table, k.fam).Set(float64(n))
		metrics.IptablesRulesLast.WithLabelValues(k.table, k.fam).Set(float64(last[k]))
	}
	if err := errors.Join(errs...); err != nil {
		p.needFull = true
		p.log.Error("iptables sync failed; next sync is full", "full", full, "err", err)
		return err
	}
	p.needFull = false
	if full {
		p.lastFull = p.now()
	}
	// Leftovers go only once our own rules are in, so a migration (or a
	// live mode change) never leaves a VIP unserved.
	if !p.migrated {
		if !p.opts.SkipMigration {
			p.migrate(ctx)
		}
		p.migrated = true
	}
	p.log.Debug("iptables sync done", "full", full, "bytes", written)
	return nil
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
// returns why a full sync is needed, or "".
func (p *Proxier) canaryGone(ctx context.Context) string {
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter} {
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
			for name, text := range a.static {
				out, err := p.run.ListChain(ctx, fam, table, name)
				if err != nil {
					return fmt.Sprintf("%s %s: listing %s: %v", fam, table, name, err)
				}
				if got, want := bytes.Count(out, []byte("\n-A ")), strings.Count(text, "\n"); got+boolInt(bytes.HasPrefix(out, []byte("-A "))) != want {
					return fmt.Sprintf("%s %s: chain %s has %d rules, want %d", fam, table, name, got, want)
				}
			}
		}
	}
	return ""
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
	var write []chainRules
	var stale, fixes []string
	// exists tells which written chains are already in the kernel (they
	// are flushed with ":CHAIN - [0:0]"); the others are created with -N,
	// which iptables-nft-restore --noflush handles far faster.
	var exists func(string) bool
	if full {
		out, err := p.run.Save(ctx, fam, table)
		if err != nil {
			return nil, fmt.Errorf("iptables: save %s %s: %w", fam, table, err)
		}
		saved := parseSave(out)
		want := map[string]bool{}
		all := append([]chainRules(nil), d.static...)
		for _, f := range d.frags {
			all = append(all, f.chains...)
		}
		// Chains the kernel already holds exactly (compared in canonical
		// form, see canonRule) are not rewritten: rewriting costs
		// iptables-nft far more than reading.
		for _, c := range all {
			want[c.name] = true
			if !sameRules(c, saved.rules[c.name], saved.has(c.name)) {
				write = append(write, c)
			}
		}
		for _, c := range saved.chains {
			if isOurs(c) && !saved.builtin[c] && !want[c] {
				stale = append(stale, c)
			}
		}
		fixes = jumpFixes(table, saved)
		if len(write) == 0 && len(stale) == 0 && len(fixes) == 0 {
			return nil, nil
		}
		have := make(map[string]bool, len(saved.chains))
		for _, c := range saved.chains {
			have[c] = true
		}
		exists = func(c string) bool { return have[c] }
	} else {
		prev := p.applied[fam][table]
		prevChains := map[string]bool{}
		exists = func(c string) bool {
			_, ok := prev.static[c]
			return ok || prevChains[c]
		}
		for _, c := range d.static {
			if old, ok := prev.static[c.name]; !ok || old != c.text {
				write = append(write, c)
			}
		}
		for name := range prev.static {
			if !slices.ContainsFunc(d.static, func(c chainRules) bool { return c.name == name }) {
				stale = append(stale, name)
			}
		}
		seen := make(map[model.ServicePortName]bool, len(d.frags))
		for _, f := range d.frags {
			seen[f.name] = true
			old := prev.frags[f.name]
			if old == f {
				continue
			}
			oldText := map[string]string{}
			if old != nil {
				for _, c := range old.chains {
					oldText[c.name] = c.text
					prevChains[c.name] = true
				}
			}
			for _, c := range f.chains {
				if t, ok := oldText[c.name]; !ok || t != c.text {
					write = append(write, c)
				}
				delete(oldText, c.name)
			}
			for name := range oldText {
				stale = append(stale, name)
			}
		}
		for name, old := range prev.frags {
			if !seen[name] {
				for _, c := range old.chains {
					stale = append(stale, c.name)
				}
			}
		}
		if len(write) == 0 && len(stale) == 0 {
			return nil, nil
		}
	}
	slices.Sort(stale)
	pre, write, exists := preCreate(table, d.frags, write, exists, p.chunkChains(ctx, fam))
	var main []byte
	if len(write) > 0 || len(stale) > 0 || len(fixes) > 0 {
		main = renderRestore(table, write, stale, fixes, exists)
	}
	if main == nil && pre == nil {
		return nil, nil
	}
	if main != nil {
		pre = append(pre, main)
	}
	return pre, nil
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

func anyUsable(eps []model.Endpoint) bool {
	for _, e := range eps {
		if e.Ready || e.Serving && e.Terminating {
			return true
		}
	}
	return false
}

// famConfigs returns the per-family rule settings.
func (p *Proxier) famConfig(fam Family, large bool) *famConfig {
	o := &p.opts
	c := &famConfig{fam: fam, mark: fmt.Sprintf("%#x", uint32(1)<<uint(o.MasqueradeBit)), masqueradeAll: o.MasqueradeAll, largeCluster: large}
	for _, pr := range o.ClusterCIDRs {
		if c.has(pr.Addr()) {
			c.clusterCIDRs = append(c.clusterCIDRs, pr.Masked())
		}
	}
	if o.PodInterface != "" {
		c.podIface = o.PodInterface
		if o.PodInterfacePrefix {
			c.podIface += "+"
		}
	}
	for _, pr := range o.ServiceCIDRs {
		if c.has(pr.Addr()) {
			c.serviceCIDRs = append(c.serviceCIDRs, pr.Masked())
		}
	}
	for _, ip := range o.NodeIPs {
		if c.has(ip) {
			c.nodeIPs = append(c.nodeIPs, ip)
		}
	}
	loopback := "127.0.0.0/8"
	if fam == IPv6 {
		loopback = "::1/128"
	}
	var prefixes []netip.Prefix
	all, given := false, false
	for _, pr := range o.NodePortAddresses {
		if !c.has(pr.Addr()) {
			continue
		}
		given = true
		if pr.Bits() == 0 {
			all = true
		}
		if !pr.Addr().IsLoopback() {
			prefixes = append(prefixes, pr.Masked())
		}
	}
	switch {
	case all:
		c.nodePortDests = [][]string{{"-m", "addrtype", "--dst-type", "LOCAL", "!", "-d", loopback}}
	case len(prefixes) > 0:
		for _, pr := range prefixes {
			c.nodePortDests = append(c.nodePortDests, []string{"-d", pr.String(), "-m", "addrtype", "--dst-type", "LOCAL"})
		}
	case given:
		// Only loopback ranges: no NodePort in the kernel (loopback
		// NodePorts are the userspace proxy's).
	default:
		// No nodePortAddresses of this family: the node's primary IPs.
		for _, ip := range c.nodeIPs {
			if !ip.IsLoopback() {
				c.nodePortDests = append(c.nodePortDests, []string{"-d", ip.String()})
			}
		}
	}
	if o.DropInvalid != nil {
		c.dropInvalid = *o.DropInvalid
	} else {
		v, err := o.ReadSysctl("net/netfilter/nf_conntrack_tcp_be_liberal")
		c.dropInvalid = err != nil || v == "0"
	}
	return c
}

func (c *famConfig) key() string {
	return fmt.Sprint(c.fam, c.mark, c.clusterCIDRs, c.podIface, c.nodeIPs, c.nodePortDests, c.masqueradeAll, c.largeCluster)
}

// build computes the wanted chains of every family and table.
func (p *Proxier) build(st *model.State, full bool) map[Family]map[string]*desiredTable {
	total := 0
	for _, sp := range st.Ports {
		if sp != nil {
			total += len(sp.Endpoints)
		}
	}
	large := total >= p.opts.LargeClusterEndpoints
	out := map[Family]map[string]*desiredTable{}
	for e := range p.cache {
		p.cache[e].seen = false
	}
	for _, fam := range p.opts.Families {
		c := p.famConfig(fam, large)
		out[fam] = p.buildFamily(c, st)
	}
	for k, e := range p.cache {
		if !e.seen {
			delete(p.cache, k)
		}
	}
	return out
}

func (p *Proxier) fragment(c *famConfig, ckey string, sp *model.ServicePort) *fragment {
	k := cacheKey{c.fam, sp.Name}
	if e := p.cache[k]; e != nil && e.cfg == ckey && portEqual(&e.sp, sp) {
		e.seen = true
		return e.frag
	}
	f := buildPort(c, sp)
	if f != nil {
		f.name = sp.Name
	}
	e := &cacheEntry{sp: copyPort(sp), cfg: ckey, frag: f, seen: true}
	p.cache[k] = e
	return f
}

func copyPort(sp *model.ServicePort) model.ServicePort {
	c := *sp
	c.ClusterIPs = slices.Clone(sp.ClusterIPs)
	c.ExternalIPs = slices.Clone(sp.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
	c.LoadBalancerSourceRanges = slices.Clone(sp.LoadBalancerSourceRanges)
	cp := func(eps []model.Endpoint) []model.Endpoint {
		if eps == nil {
			return nil
		}
		out := make([]model.Endpoint, len(eps))
		for i, e := range eps {
			e.ZoneHints = slices.Clone(e.ZoneHints)
			e.NodeHints = slices.Clone(e.NodeHints)
			out[i] = e
		}
		return out
	}
	c.Endpoints = cp(sp.Endpoints)
	c.ClusterEndpoints = cp(sp.ClusterEndpoints)
	c.LocalEndpoints = cp(sp.LocalEndpoints)
	return c
}

func (p *Proxier) buildFamily(c *famConfig, st *model.State) map[string]*desiredTable {
	nat, filter := &desiredTable{}, &desiredTable{}
	ckey := c.key()
	var natSvc, natNP, fSvc, fExt, fNP, fFW []string
	var cips []netip.Addr
	cipName := map[netip.Addr]string{}
	for _, sp := range st.Ports {
		if sp == nil {
			continue
		}
		if why := validPort(sp); why != "" {
			p.log.Warn("skipping Service port", "servicePort", sp.Name.String(), "reason", why)
			continue
		}
		f := p.fragment(c, ckey, sp)
		if f == nil {
			continue
		}
		natSvc = append(natSvc, f.natServices...)
		natNP = append(natNP, f.natNodePorts...)
		fSvc = append(fSvc, f.filterServices...)
		fExt = append(fExt, f.filterExternal...)
		fNP = append(fNP, f.filterNodePorts...)
		fFW = append(fFW, f.filterFW...)
		nat.frags = append(nat.frags, f)
		for _, ch := range f.chains {
			nat.rules += ch.n
		}
		if _, ok := cipName[f.clusterIP]; !ok {
			cipName[f.clusterIP] = sp.Name.ServiceName.String()
			cips = append(cips, f.clusterIP)
		}
	}
	var w rw
	for _, d := range c.nodePortDests {
		w.add(chainServices, cat(comment("vipproxy service nodeports; NOTE: this must be the last rule in this chain"), d, []string{"-j", chainNodePorts})...)
	}
	nat.set(chainServices, append(natSvc, w.lines...))
	nat.set(chainNodePorts, natNP)
	w = rw{}
	w.add(chainPostrouting, "-m", "mark", "!", "--mark", c.mark+"/"+c.mark, "-j", "RETURN")
	w.add(chainPostrouting, "-j", "MARK", "--xor-mark", c.mark)
	w.add(chainPostrouting, "-m", "comment", "--comment", "vipproxy service traffic requiring SNAT", "-j", "MASQUERADE", "--random-fully")
	nat.set(chainPostrouting, w.lines)
	w = rw{}
	w.add(chainMarkMasq, "-j", "MARK", "--or-mark", c.mark)
	nat.set(chainMarkMasq, w.lines)
	if len(c.clusterCIDRs) > 1 && !c.masqueradeAll && c.podIface == "" {
		w = rw{}
		for _, cidr := range c.clusterCIDRs {
			w.add(chainMasqUnlessPod, "-s", cidr.String(), "-j", "RETURN")
		}
		w.add(chainMasqUnlessPod, "-j", chainMarkMasq)
		nat.set(chainMasqUnlessPod, w.lines)
	}
	w = rw{}
	w.add(ChainCanary, "-j", "RETURN")
	canary := w.lines
	nat.set(ChainCanary, canary)

	// filter
	w = rw{}
	for _, ip := range cips {
		w.add(chainServices, cat(comment(cipName[ip]+" has no such port"), []string{"-d", ip.String(), "-j", chainReject})...)
	}
	for _, cidr := range c.serviceCIDRs {
		w.add(chainServices, cat(comment("unallocated service IP"), []string{"-d", cidr.String(), "-j", "DROP"})...)
	}
	filter.set(chainServices, append(fSvc, w.lines...))
	filter.set(chainExternalServices, fExt)
	filter.set(chainNodePorts, fNP)
	w = rw{}
	if c.dropInvalid {
		w.add(chainForward, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	w.add(chainForward, cat(comment("vipproxy forwarding rules"), []string{"-m", "mark", "--mark", c.mark + "/" + c.mark, "-j", "ACCEPT"})...)
	w.add(chainForward, cat(comment("vipproxy forwarding conntrack rule"), []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"})...)
	filter.set(chainForward, w.lines)
	filter.set(chainFirewall, fFW)
	w = rw{}
	w.add(chainReject, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
	w.add(chainReject, "-j", "REJECT")
	filter.set(chainReject, w.lines)
	filter.set(ChainCanary, canary)
	return map[string]*desiredTable{TableNAT: nat, TableFilter: filter}
}

// RemoveKubeProxyLeftovers removes kube-proxy's iptables and ipvs-mode
// chains (and every rule jumping to them) in nat, filter and mangle of each
// family, leaving kubelet's KUBE- chains alone. The other modes call it
// after their first sync when migrating from kube-proxy, and
// `--cleanup --cleanup-kube-proxy` calls it. It succeeds when there is
// nothing to remove.
func (p *Proxier) RemoveKubeProxyLeftovers(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter, "mangle"} {
			if err := p.removeChains(ctx, fam, table, isKubeProxyChain); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// migrate removes kube-proxy's iptables chains and the nftables tables of
// vipproxy's and kube-proxy's nftables modes. Failures are logged only.
func (p *Proxier) migrate(ctx context.Context) {
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter, "mangle"} {
			// Saving a table vipproxy just filled with 10,000s of rules
			// takes iptables-nft seconds, during which no change is
			// synced; kube-proxy always has one of these chains.
			if !p.anyChain(ctx, fam, table, kubeProxyMarkers[table]) {
				continue
			}
			if err := p.removeChains(ctx, fam, table, isKubeProxyChain); err != nil {
				p.log.Warn("could not remove kube-proxy leftovers", "family", fam.String(), "table", table, "err", err)
			}
		}
		for _, name := range []string{"vipproxy", "kube-proxy"} {
			if err := p.run.DeleteNFTTable(ctx, fam, name); err != nil {
				p.log.Warn("could not delete nftables table", "family", fam.String(), "table", name, "err", err)
			}
		}
	}
}

// kubeProxyMarkers are chains kube-proxy (iptables or IPVS mode) creates
// in each table whenever it runs; migrate reads a table only when one of
// them exists. (`--cleanup --cleanup-kube-proxy` reads every table.)
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
// and every rule jumping to them.
func (p *Proxier) removeChains(ctx context.Context, fam Family, table string, remove func(string) bool) error {
	out, err := p.run.Save(ctx, fam, table)
	if err != nil {
		return fmt.Errorf("iptables: save %s %s: %w", fam, table, err)
	}
	inputs := removalInput(table, parseSave(out), remove, p.chunkChains(ctx, fam))
	for i, data := range inputs {
		if err := p.run.Restore(ctx, fam, table, data); err != nil {
			return fmt.Errorf("iptables: restore %s %s (part %d of %d): %w", fam, table, i+1, len(inputs), err)
		}
	}
	return nil
}

// Cleanup implements dataplane.Dataplane: it removes every VIP- chain and
// every rule jumping to one, in the nat, filter, mangle and raw tables of
// each configured family, then removes the built-in chains iptables-nft
// created that are left empty with policy accept (and their table when it
// is left empty): they let every packet through, so removing them changes
// no packet's fate, and the nftables ruleset is as before vipproxy ran. It succeeds when there is nothing to remove; the
// next Sync is full.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, fam := range p.opts.Families {
		for _, table := range []string{TableNAT, TableFilter, "mangle", "raw"} {
			if err := p.removeChains(ctx, fam, table, isOurs); err != nil {
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
	return errors.Join(errs...)
}
