package nftables

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestKernelAdopt: what NFT reads back from the kernel is, element for
// element, what the builder wrote (keys and values in wire form,
// verdicts included, both families); a restarted proxier adopts the
// tables without changing one element or losing an affinity entry, also
// when their element digest is the release before's (it writes the new
// one and nothing else), and a State that changed while it was down
// costs only its difference.
func TestKernelAdopt(t *testing.T) {
	ns := newNetns(t, "adopt")
	ctx := context.Background()
	first := kernelProxier(t, ns)
	st := allScenarioPorts()
	if err := first.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	kt, err := (&NFT{Netns: ns}).readTables(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		want := elemValues(first.applied[f])
		for name := range kt[f].elems {
			if len(kt[f].elems[name]) == 0 && want[name] == nil {
				delete(kt[f].elems, name) // an empty static map the ruleset has no entry for
			}
		}
		if diff := cmp.Diff(want, kt[f].elems); diff != "" {
			t.Errorf("%s: elements read back (-written +read):\n%s", f, diff)
		}
		for c := range first.applied[f].chains {
			if !kt[f].chains[c] {
				t.Errorf("%s: chain %s not read back", f, c)
			}
		}
	}
	aff := "" // the longest-lived affinity set, so the entry outlives the test
	for name, timeout := range first.applied["ip"].affinity {
		if aff == "" || timeout > first.applied["ip"].affinity[aff] {
			aff = name
		}
	}
	if aff == "" {
		t.Fatal("the scenarios have no ClientIP-affinity set")
	}
	nsNft(t, ns, "add element ip vipproxy "+aff+" { 10.9.9.9 }")
	// Affinity entries count down: compare without their expiry.
	expires := regexp.MustCompile(`expires [0-9hms]+`)
	list := func() string { return expires.ReplaceAllString(nsNft(t, ns, "list ruleset"), "expires …") }
	before := list()

	restart := func(st *model.State) string {
		t.Helper()
		var logs bytes.Buffer
		o := dataplanetest.BaseOptions()
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		p, err := New(o, &NFT{Netns: ns})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Sync(ctx, st, true); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), "adopted the existing tables") {
			t.Fatalf("restart did not adopt:\n%s", logs.String())
		}
		return logs.String()
	}
	// The digests and names match: nothing is dumped or written.
	if logs := restart(allScenarioPorts()); !strings.Contains(logs, "kind=unchanged") || !strings.Contains(logs, "mapsDumped=false") {
		t.Errorf("unchanged restart dumped or changed elements:\n%s", logs)
	}
	if after := list(); after != before {
		t.Errorf("unchanged restart changed the ruleset (affinity entry included):\n%s", cmp.Diff(before, after))
	}

	// The element digest of the release before (over nft text): the
	// restart replaces it, and writes nothing else.
	for _, f := range families {
		nsNft(t, ns, fmt.Sprintf("flush set %s vipproxy %s; add element %[1]s vipproxy %[2]s { %s }", f, digestSet, legacyDigest(f, first.applied[f]).key()))
	}
	if logs := restart(allScenarioPorts()); !strings.Contains(logs, "kind=unchanged") || !strings.Contains(logs, "digestOfReleaseBefore=true") ||
		!strings.Contains(logs, "elementChanges=4") {
		t.Errorf("restart over the release before's digest:\n%s", logs)
	}
	if after := list(); after != before {
		t.Errorf("restart over the release before's digest left another ruleset:\n%s", cmp.Diff(before, after))
	}

	// One endpoint more while down: its slot elements, nothing else.
	stB := allScenarioPorts()
	stB.Ports[0].Endpoints = append(stB.Ports[0].Endpoints, dataplanetest.EP("10.1.2.250", 8080, false))
	dataplanetest.Fill(stB.Ports[0])
	logs := restart(stB)
	if strings.Contains(logs, "elementChanges=0") || !strings.Contains(nsNft(t, ns, "list table ip vipproxy"), "10.1.2.250") {
		t.Errorf("restart with a new endpoint did not program it:\n%s", logs)
	}
	if !strings.Contains(nsNft(t, ns, "list set ip vipproxy "+aff), "10.9.9.9") {
		t.Errorf("affinity entry lost")
	}
	// The syncs after an adoption delete what it flushed: they succeed
	// (an anonymous set of a flushed rule is gone with it: adopting must
	// not take it for a set of its own to delete).
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, &NFT{Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []*model.State{allScenarioPorts(), allScenarioPorts(), dataplanetest.NoiseState()} {
		if err := p.Sync(ctx, st, i == 0); err != nil {
			t.Fatalf("sync %d after adopting: %v", i, err)
		}
	}
}
