package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

func verifyState() *model.State { return dataplanetest.AllScenarioPorts() }

// TestVerifyFake: no drift after every scenario's (partial) sync; one
// rule removed from a per-Service chain is drift, repaired by a full sync.
func TestVerifyFake(t *testing.T) {
	ctx := context.Background()
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	for i, sc := range dataplanetest.Scenarios() {
		if err := p.Sync(ctx, dataplanetest.NewState(sc.Ports...), i == 0); err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if err := p.Verify(ctx); err != nil {
			t.Fatalf("%s: Verify right after a sync: %v", sc.Name, err)
		}
	}
	st := verifyState()
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	// Someone deletes the first rule of an endpoint chain: a restore that
	// redeclares (flushes) the chain and puts back all rules but the first.
	tbl := f.Table(IPv4, TableNAT)
	var victim string
	var restore strings.Builder
	for name, c := range tbl.Chains {
		if strings.HasPrefix(name, ChainPrefix+"SEP-") && len(c.Rules) > 0 {
			victim = name
			restore.WriteString("*nat\n:" + name + " - [0:0]\n")
			for _, r := range c.Rules[1:] {
				restore.WriteString("-A " + name + " " + JoinArgs(r) + "\n")
			}
			restore.WriteString("COMMIT\n")
			break
		}
	}
	if victim == "" {
		t.Fatal("no endpoint chain to tamper with")
	}
	if err := f.Restore(ctx, IPv4, TableNAT, []byte(restore.String())); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), victim) {
		t.Fatalf("Verify after deleting a rule of %s: %v", victim, err)
	}
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatalf("Verify after the repairing full sync: %v", err)
	}
	// Someone flushes the hairpin set: drift, repaired by a full sync.
	sets := fakeSets(p)
	want := len(sets.Members(hairpinKind.v4))
	if want == 0 {
		t.Fatal("the hairpin set is empty before the flush")
	}
	if err := sets.Restore(ctx, []byte("flush "+hairpinKind.v4+"\n")); err != nil {
		t.Fatal(err)
	}
	err := p.Verify(ctx)
	if !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), fmt.Sprintf("set %s: 0 members, want %d", hairpinKind.v4, want)) {
		t.Fatalf("Verify after flushing %s: %v", hairpinKind.v4, err)
	}
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); err != nil || len(sets.Members(hairpinKind.v4)) != want {
		t.Fatalf("after the repairing full sync: %v, %d members, want %d", err, len(sets.Members(hairpinKind.v4)), want)
	}
}

// TestKernelVerify: with both iptables backends in a network namespace,
// no drift after syncs; one rule deleted by hand with iptables -D is.
func TestKernelVerify(t *testing.T) {
	for _, variant := range []string{"", "legacy"} {
		t.Run("variant="+variant, func(t *testing.T) {
			ctx := context.Background()
			ns := newNetns(t)
			run := &Exec{}
			p := kernelProxier(t, ns, variant, dataplanetest.BaseOptions(), run)
			st := verifyState()
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			if err := p.Verify(ctx); err != nil {
				t.Fatalf("Verify after the first sync: %v", err)
			}
			if _, counted, err := run.CountRules(ctx, IPv4, TableNAT, []string{chainServices}); err != nil || counted != (variant == "" && run.IsNFT(ctx, IPv4)) {
				t.Fatalf("CountRules: counted %v, %v; want the netlink path exactly for iptables-nft", counted, err)
			}
			for _, sc := range dataplanetest.Scenarios() {
				if err := p.Sync(ctx, dataplanetest.NewState(sc.Ports...), false); err != nil {
					t.Fatalf("%s: %v", sc.Name, err)
				}
				if err := p.Verify(ctx); err != nil {
					t.Fatalf("%s: Verify after a partial sync: %v", sc.Name, err)
				}
			}
			if err := p.Sync(ctx, st, false); err != nil {
				t.Fatal(err)
			}
			out := nsRun(t, ns, run.bin(IPv4, "tables-save"), "-t", "nat")
			var victim string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "-A "+ChainPrefix+"SEP-") {
					victim = strings.Fields(l)[1]
					break
				}
			}
			if victim == "" {
				t.Fatalf("no endpoint chain in:\n%s", out)
			}
			nsRun(t, ns, run.bin(IPv4, "tables"), "-t", "nat", "-D", victim, "1")
			err := p.Verify(ctx)
			if !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), victim) {
				t.Fatalf("Verify after deleting a rule of %s: %v", victim, err)
			}
			t.Logf("%v", err)
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			if err := p.Verify(ctx); err != nil {
				t.Fatalf("after the repairing full sync: %v", err)
			}
			// The ClusterIP set flushed by hand: drift until a full sync.
			nsRun(t, ns, "ipset", "flush", clusterKind.v4)
			if err := p.Verify(ctx); !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), "set "+clusterKind.v4+": 0 members") {
				t.Fatalf("Verify after flushing %s: %v", clusterKind.v4, err)
			}
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			if err := p.Verify(ctx); err != nil {
				t.Fatalf("after the set's repairing full sync: %v", err)
			}
		})
	}
}

// TestVerifyTakesTurns: with more per-Service chains than one check
// compares, a rule deleted from any of them is found within
// ⌈chains/verifyChains⌉ checks, and no check before that reports drift.
func TestVerifyTakesTurns(t *testing.T) {
	old := verifyChains
	verifyChains = 4
	t.Cleanup(func() { verifyChains = old })
	ctx := context.Background()
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := p.Sync(ctx, verifyState(), true); err != nil {
		t.Fatal(err)
	}
	chains := 0
	for _, tables := range p.applied {
		for _, a := range tables {
			for _, fr := range a.frags {
				chains += len(fr.chains)
			}
		}
	}
	turns := (chains + verifyChains - 1) / verifyChains
	if turns < 3 {
		t.Fatalf("test premise: %d per-Service chains, want several turns", chains)
	}
	tbl := f.Table(IPv4, TableNAT)
	var restore strings.Builder
	for name, c := range tbl.Chains {
		if strings.HasPrefix(name, ChainPrefix+"SVC-") && len(c.Rules) > 0 {
			restore.WriteString("*nat\n:" + name + " - [0:0]\nCOMMIT\n")
			break
		}
	}
	if err := f.Restore(ctx, IPv4, TableNAT, []byte(restore.String())); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= turns; i++ {
		err := p.Verify(ctx)
		if errors.Is(err, dataplane.ErrDrift) {
			t.Logf("found at check %d of at most %d (%d chains): %v", i, turns, chains, err)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("a flushed per-Service chain was not found in %d checks", turns)
}
