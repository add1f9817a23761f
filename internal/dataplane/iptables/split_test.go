package iptables

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// withChunk lowers restoreChunkChains for one test.
func withChunk(t *testing.T, n int) {
	t.Helper()
	old := restoreChunkChains
	restoreChunkChains = n
	t.Cleanup(func() { restoreChunkChains = old })
}

// coldDump returns the tables a single unsplit cold start of st leaves.
func coldDump(t *testing.T, st *model.State) string {
	t.Helper()
	old := restoreChunkChains
	restoreChunkChains = 1 << 30
	defer func() { restoreChunkChains = old }()
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Restores); n != 4 {
		t.Fatalf("unsplit cold start made %d restores, want 4 (2 families × 2 tables)", n)
	}
	return dumpAll(f)
}

// createdChains returns the chains a restore input creates with -N, in order.
func createdChains(data string) []string {
	var out []string
	for _, l := range strings.Split(data, "\n") {
		if c, ok := strings.CutPrefix(l, "-N "); ok {
			out = append(out, c)
		}
	}
	return out
}

// checkPreCreation checks the restores of one table that a split sync
// made: every restore but the last only creates chains, touches no
// chain it did not create and no built-in chain, and creates them in
// descending name order.
func checkPreCreation(t *testing.T, rs []FakeRestore) {
	t.Helper()
	if len(rs) < 3 {
		t.Fatalf("want the sync split in at least 3 restores, got %d", len(rs))
	}
	for i, r := range rs {
		created := createdChains(r.Data)
		if !slices.IsSortedFunc(created, func(a, b string) int { return strings.Compare(b, a) }) {
			t.Errorf("restore %d creates chains not in descending order: %v", i, created)
		}
		if i == len(rs)-1 {
			continue
		}
		mine := map[string]bool{}
		for _, c := range created {
			mine[c] = true
		}
		for _, l := range strings.Split(r.Data, "\n") {
			switch {
			case l == "", l == "*nat", l == "COMMIT", strings.HasPrefix(l, "-N "):
			case strings.HasPrefix(l, "-A "):
				if c := strings.Fields(l)[1]; !mine[c] {
					t.Errorf("pre-creation restore %d writes chain %s it did not create: %s", i, c, l)
				}
				if c := strings.Fields(l)[1]; c == chainServices || c == chainNodePorts {
					t.Errorf("pre-creation restore %d writes shared chain %s: %s", i, c, l)
				}
			default:
				t.Errorf("pre-creation restore %d has line %q; want only -N and -A of its own chains", i, l)
			}
		}
	}
}

func natRestores(rs []FakeRestore, fam Family) []FakeRestore {
	var out []FakeRestore
	for _, r := range rs {
		if r.Table == TableNAT && r.Family == fam {
			out = append(out, r)
		}
	}
	return out
}

func TestColdStartSplitIntoChunks(t *testing.T) {
	withChunk(t, 30)
	st := bigState(40, 3) // 40 × (1 service + 3 endpoint chains) = 160 new chains
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	nat := natRestores(f.Restores, IPv4)
	checkPreCreation(t, nat)
	if got, want := len(nat), 1+(160+29)/30; got < want {
		t.Errorf("nat restores = %d, want at least %d", got, want)
	}
	for i, r := range nat[:len(nat)-1] {
		if n := len(createdChains(r.Data)); n > 30+5+4 {
			t.Errorf("pre-creation restore %d creates %d chains, want about 30", i, n)
		}
	}
	if diff := cmp.Diff(coldDump(t, st), dumpAll(f)); diff != "" {
		t.Errorf("split cold start differs from an unsplit one:\n%s", diff)
	}
	// Same State again: nothing written.
	n := len(f.Restores)
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if len(f.Restores) != n {
		t.Errorf("same State twice wrote %d restores", len(f.Restores)-n)
	}
}

func TestPartialSyncSplitsManyNewServices(t *testing.T) {
	withChunk(t, 30)
	small, big := bigState(5, 3), bigState(40, 3)
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	if err := p.Sync(ctx, small, true); err != nil {
		t.Fatal(err)
	}
	n := len(f.Restores)
	// One change stays one transaction.
	if err := p.Sync(ctx, changeOne(small, 2, 9001), false); err != nil {
		t.Fatal(err)
	}
	if got := len(f.Restores) - n; got != 1 {
		t.Errorf("one change made %d restores, want 1", got)
	}
	n, saves := len(f.Restores), f.Calls["save"]
	if err := p.Sync(ctx, big, false); err != nil {
		t.Fatal(err)
	}
	if f.Calls["save"] != saves {
		t.Errorf("partial sync ran iptables-save")
	}
	checkPreCreation(t, natRestores(f.Restores[n:], IPv4))
	if diff := cmp.Diff(coldDump(t, big), dumpAll(f)); diff != "" {
		t.Errorf("split partial sync differs from a cold start:\n%s", diff)
	}
}

func TestFailedChunkRecoveredByFullSync(t *testing.T) {
	withChunk(t, 30)
	st := bigState(40, 3)
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	boom := errors.New("boom")
	calls := 0
	f.FailRestore = func(fam Family, table string, _ []byte) error {
		if fam == IPv4 && table == TableNAT {
			calls++
			if calls == 3 {
				return boom
			}
		}
		return nil
	}
	if err := p.Sync(ctx, st, true); !errors.Is(err, boom) {
		t.Fatalf("Sync = %v, want boom", err)
	}
	// Two chunks are in the kernel, unreferenced.
	if strings.Contains(f.Dump(IPv4, TableNAT), "-A "+chainServices+" ") {
		t.Errorf("VIP-SERVICES written although the sync failed:\n%s", f.Dump(IPv4, TableNAT))
	}
	f.FailRestore = nil
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(coldDump(t, st), dumpAll(f)); diff != "" {
		t.Errorf("full sync after a failed chunk differs from a cold start:\n%s", diff)
	}
	// And from there to fewer Services: the stale chains go.
	small := bigState(3, 3)
	if err := p.Sync(ctx, small, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(coldDump(t, small), dumpAll(f)); diff != "" {
		t.Errorf("after shrinking, rules differ from a cold start:\n%s", diff)
	}
}

// TestKernelSplitColdStart runs a split cold start, a one-change partial
// sync and a split partial sync against the real binaries in a namespace
// and checks that the kernel holds the chains and rule counts of the fake.
func TestKernelSplitColdStart(t *testing.T) {
	for _, variant := range []string{"", "legacy"} {
		t.Run("variant="+variant, func(t *testing.T) {
			withChunk(t, 150)
			ns := newNetns(t)
			run := &Exec{}
			p := kernelProxier(t, ns, variant, dataplanetest.BaseOptions(), run)
			p.opts.Families = []Family{IPv4}
			p.sets = nil // kube-proxy's layout: the most chains to split
			fp, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
			fp.opts.Families = []Family{IPv4}
			steps := []struct {
				name string
				st   *model.State
				full bool
			}{
				{"cold start", bigState(100, 3), true},
				{"one change", changeOne(bigState(100, 3), 50, 9001), false},
				{"many new services", bigState(250, 3), false},
			}
			for _, s := range steps {
				n := len(f.Restores)
				if err := p.Sync(ctx, s.st, s.full); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if err := fp.Sync(ctx, s.st, s.full); err != nil {
					t.Fatal(err)
				}
				if s.name != "one change" && len(natRestores(f.Restores[n:], IPv4)) < 3 {
					t.Errorf("%s: not split (%d nat restores)", s.name, len(natRestores(f.Restores[n:], IPv4)))
				}
				want := ruleShape([]byte(f.Dump(IPv4, TableNAT)))
				got := kernelShape(t, run, IPv4, TableNAT)
				for _, m := range []map[string]int{want, got} {
					for c := range m {
						if !isOurs(c) && m[c] == 0 {
							delete(m, c)
						}
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s: nat chains/rule counts differ from the fake (-fake +kernel):\n%s", s.name, diff)
				}
			}
			// Cleanup removes the 1,000 chains in chunks of 150.
			if err := p.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			for c := range kernelShape(t, run, IPv4, TableNAT) {
				if isOurs(c) {
					t.Errorf("chain %s left after Cleanup", c)
				}
			}
		})
	}
}

func TestCleanupSplitIntoChunks(t *testing.T) {
	withChunk(t, 30)
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	// A user chain jumping to a vipproxy chain: the jump goes, the chain stays.
	if err := f.Restore(ctx, IPv4, TableNAT, []byte("*nat\n-N USER\n-A PREROUTING -j USER\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, bigState(40, 3), true); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(ctx, IPv4, TableNAT, []byte("*nat\n-A USER -j "+chainServices+"\n-A USER -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	n := len(f.Restores)
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	nat := natRestores(f.Restores[n:], IPv4)
	if len(nat) < 160/30 {
		t.Errorf("Cleanup of 160+ nat chains made %d restores, want at least %d", len(nat), 160/30)
	}
	for i, r := range nat {
		if c := strings.Count(r.Data, "\n-X "); c > 30 {
			t.Errorf("removal restore %d deletes %d chains, want at most 30", i, c)
		}
		if i > 0 && strings.Contains(r.Data, "\n-D ") {
			t.Errorf("removal restore %d deletes jump rules; only the first may:\n%s", i, r.Data)
		}
	}
	got := f.Dump(IPv4, TableNAT)
	if strings.Contains(got, ChainPrefix) {
		t.Errorf("vipproxy chains or jumps left after Cleanup:\n%s", got)
	}
	if !strings.Contains(got, "-A USER -j RETURN") || !strings.Contains(got, "-A PREROUTING -j USER") {
		t.Errorf("user rules lost by Cleanup:\n%s", got)
	}
}

// legacyRunner is a Fake that says its binaries are iptables-legacy.
type legacyRunner struct{ *Fake }

func (legacyRunner) IsNFT(context.Context, Family) bool { return false }

func TestChunkingOnlyForNFT(t *testing.T) {
	withChunk(t, 30)
	for _, tc := range []struct {
		name  string
		run   Runner
		limit int
	}{
		{"fake (backend unknown)", NewFake(), 30},
		{"legacy", legacyRunner{NewFake()}, math.MaxInt},
		{"exec nft", &Exec{Variant: "nft"}, 30},
		{"exec legacy", &Exec{Variant: "legacy"}, math.MaxInt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: tc.run, Families: []Family{IPv4}})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.chunkChains(ctx, IPv4); got != tc.limit {
				t.Errorf("chunkChains = %d, want %d", got, tc.limit)
			}
		})
	}
	// A legacy cold start and Cleanup stay one transaction per table.
	f := NewFake()
	p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: legacyRunner{f}, Families: []Family{IPv4},
		Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, bigState(40, 3), true); err != nil {
		t.Fatal(err)
	}
	if n := len(natRestores(f.Restores, IPv4)); n != 1 {
		t.Errorf("legacy cold start made %d nat restores, want 1", n)
	}
	n := len(f.Restores)
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(natRestores(f.Restores[n:], IPv4)); n != 1 {
		t.Errorf("legacy Cleanup made %d nat restores, want 1", n)
	}
}

// TestLayoutUpgradeRemovesStaleChainsInChunks: a ruleset of kube-proxy's
// layout (a chain per endpoint, as the previous release wrote it) taken
// over by a full sync with hairpin sets. The endpoint chains are stale;
// more of them than a restore may name, so they go after the sync's
// transaction, flushed then deleted in bounded restores, and the result is
// what a cold start of the new layout writes.
func TestLayoutUpgradeRemovesStaleChainsInChunks(t *testing.T) {
	withChunk(t, 30)
	st := bigState(40, 3)
	old, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	if err := old.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: f, IPSet: &ipset.Fake{},
		Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(f.Restores)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	nat := natRestores(f.Restores[n:], IPv4)
	// The transaction, then 120 endpoint chains flushed and deleted 30 at a time.
	if len(nat) != 1+4+4 {
		t.Fatalf("want 9 nat restores (the sync, 4 flushes, 4 deletions), got %d", len(nat))
	}
	if strings.Contains(nat[0].Data, "VIP-SEP-") {
		t.Errorf("the sync's transaction names endpoint chains:\n%s", nat[0].Data)
	}
	for i, r := range nat[1:] {
		flush, del := strings.Count(r.Data, "\n:VIP-SEP-"), strings.Count(r.Data, "\n-X VIP-SEP-")
		if want := 30; (i < 4 && (flush != want || del != 0)) || (i >= 4 && (del != want || flush != 0)) {
			t.Errorf("removal restore %d flushes %d and deletes %d endpoint chains:\n%s", i, flush, del, r.Data)
		}
	}
	cold, cf := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := cold.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(dumpSets(cold, cf), dumpSets(p, f)); diff != "" {
		t.Errorf("upgraded ruleset differs from a cold start (-cold +got):\n%s", diff)
	}
}

// TestKernelLayoutUpgrade: the previous release's layout (a chain per
// endpoint) in a namespace, taken over by a full sync with hairpin sets,
// its stale chains removed in bounded restores: the kernel then holds the
// chains, rule counts and set members of a cold start of the new layout,
// and a partial sync after it works.
func TestKernelLayoutUpgrade(t *testing.T) {
	withChunk(t, 50)
	ns := newNetns(t)
	run := &Exec{}
	old := kernelProxier(t, ns, "", dataplanetest.BaseOptions(), run)
	old.opts.Families = []Family{IPv4}
	old.sets = nil
	st := bigState(60, 3)
	if err := old.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if sh := kernelShape(t, run, IPv4, TableNAT); !slices.ContainsFunc(mapKeys(sh), func(c string) bool { return strings.HasPrefix(c, "VIP-SEP-") }) {
		t.Fatalf("the old layout has no endpoint chains: %v", sh)
	}
	p := kernelProxier(t, ns, "", dataplanetest.BaseOptions(), &Exec{})
	p.opts.Families = []Family{IPv4}
	fp, f := newFakeProxier(t, dataplanetest.BaseOptions())
	fp.opts.Families = []Family{IPv4}
	for i, s := range []*model.State{st, changeOne(st, 7, 9001)} {
		if err := p.Sync(ctx, s, i == 0); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		if err := fp.Sync(ctx, s, i == 0); err != nil {
			t.Fatal(err)
		}
		want, got := ruleShape([]byte(f.Dump(IPv4, TableNAT))), kernelShape(t, run, IPv4, TableNAT)
		for _, m := range []map[string]int{want, got} {
			for c := range m {
				if !isOurs(c) && m[c] == 0 {
					delete(m, c)
				}
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("sync %d: nat chains/rule counts differ from a cold start of the new layout (-fake +kernel):\n%s", i, diff)
		}
		for _, k := range setKinds {
			if diff := cmp.Diff(fakeSets(fp).Members(k.v4), kernelSetMembers(t, ns, k.v4)); diff != "" {
				t.Fatalf("sync %d: %s members differ (-fake +kernel):\n%s", i, k.v4, diff)
			}
		}
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
}
