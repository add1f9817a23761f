package nftables

import (
	"bytes"
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestAdopt: a new proxier (a restart) that finds tables written by an
// earlier one adopts them: it never re-creates a table, changes only the
// elements that differ, keeps ClientIP-affinity entries, and after its
// next sync (which deletes the chains it flushed) the tables are exactly
// what a cold start of the new State writes. Tables that hold what is
// wanted, by both digests and by the names of their chains and sets, are
// adopted without a transaction.
func TestAdopt(t *testing.T) {
	noStray := func(*knftables.Fake) {}
	v4 := func(f *knftables.Fake) *knftables.FakeTable { return f.Tables[knftables.IPv4Family][TableName] }
	for _, tc := range []struct {
		name          string
		before, after *model.State
		damage        func(*knftables.Fake)
		elementOps    int // -1: any number; -2: no transaction at all
	}{
		{"unchanged", allScenarioPorts(), allScenarioPorts(), noStray, -2},
		// Not unchanged: a transaction flushes and refills the chains.
		{"unchanged, no rules digest (the release before)", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			delete(v4(f).Sets, rulesDigestSet)
		}, 1}, // add the rules digest
		{"unchanged, rules digest of something else", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			v4(f).Sets[rulesDigestSet].Elements[0] = &knftables.Element{Key: []string{"fd00::1"}}
		}, 2}, // replace it
		{"unchanged, two rules digests", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			s := v4(f).Sets[rulesDigestSet]
			s.Elements = append(s.Elements, &knftables.Element{Key: []string{"fd00::1"}})
		}, 1}, // flush, add
		{"unchanged, a chain more", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			v4(f).Chains["stray"] = &knftables.FakeChain{Chain: knftables.Chain{Family: knftables.IPv4Family, Table: TableName, Name: "stray"}}
		}, 0},
		{"unchanged, a chain less", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			delete(v4(f).Chains, "reject-chain")
		}, 0},
		{"unchanged, a set more", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			v4(f).Sets["affinity-stray-10800"] = &knftables.FakeSet{Set: knftables.Set{Family: knftables.IPv4Family, Table: TableName, Name: "affinity-stray-10800", Type: "ipv4_addr"}}
		}, 0},
		{"changed while down", allScenarioPorts(), dataplanetest.NoiseState(), noStray, -1},
		{"emptied while down", allScenarioPorts(), &model.State{}, noStray, -1},
		// A table written without a digest (the release before) has its
		// maps dumped and compared: stray and wrong elements are fixed and
		// a digest is added.
		{"stray and wrong elements, no digest", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			t := f.Tables[knftables.IPv4Family][TableName]
			m := t.Maps[mapServiceIPs]
			m.Elements = append(m.Elements, &knftables.Element{Key: []string{"10.96.99.99 . tcp . 99"}, Value: []string{"drop"}})
			m.Elements[0] = &knftables.Element{Key: m.Elements[0].Key, Value: []string{"drop"}}
			delete(t.Sets, digestSet)
		}, 4}, // delete stray, delete wrong, add right, add the digest
		{"no digest, nothing else changed", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			delete(f.Tables[knftables.IPv4Family][TableName].Sets, digestSet)
		}, 1},
		{"digest of something else", allScenarioPorts(), allScenarioPorts(), func(f *knftables.Fake) {
			t := f.Tables[knftables.IPv4Family][TableName]
			m := t.Maps[mapServiceIPs]
			m.Elements = m.Elements[1:]
			t.Sets[digestSet].Elements[0] = &knftables.Element{Key: []string{"fd00::1"}}
		}, 3}, // add the missing element, replace the digest
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			old, tr := newFakeProxier(t, dataplanetest.BaseOptions())
			if err := old.Sync(ctx, tc.before, true); err != nil {
				t.Fatal(err)
			}
			tr.Fake.Lock()
			tc.damage(tr.Fake)
			aff := plantAffinityEntry(t, tr.Fake)
			tr.Fake.LastTransaction = nil
			tr.Fake.Unlock()

			p, err := New(dataplanetest.BaseOptions(), tr)
			if err != nil {
				t.Fatal(err)
			}
			p.log = quietLogger()
			if err := p.Sync(ctx, tc.after, true); err != nil {
				t.Fatal(err)
			}
			if (tc.elementOps == -2) != (tr.Fake.LastTransaction == nil) {
				t.Fatalf("adopting ran a transaction: %v, want %v:\n%v", tr.Fake.LastTransaction != nil, tc.elementOps != -2, tr.Fake.LastTransaction)
			}
			last := ""
			if tr.Fake.LastTransaction != nil {
				last = tr.Fake.LastTransaction.String()
			}
			if strings.Contains(last, "delete table") {
				t.Errorf("adopting re-created a table:\n%s", last)
			}
			if n := strings.Count(last, " element "); tc.elementOps >= 0 && n != tc.elementOps {
				t.Errorf("%d element operations, want %d:\n%s", n, tc.elementOps, last)
			}
			if reflect.DeepEqual(tc.after, tc.before) {
				if !hasAffinityEntry(tr.Fake, aff) {
					t.Errorf("affinity entry %v lost", aff)
				}
			}
			if err := p.Sync(ctx, tc.after, false); err != nil {
				t.Fatal(err)
			}
			want := coldDump(t, dataplanetest.BaseOptions(), tc.after)
			got := dump(tr.Fake)
			if aff.set != "" && hasAffinityEntry(tr.Fake, aff) {
				got = strings.Replace(got, aff.line, "", 1)
				got = strings.ReplaceAll(got, "\n\n", "\n")
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after adopting and one more sync (-cold +got):\n%s", diff)
			}
		})
	}
}

// affinityEntry is a ClientIP-affinity entry planted in the fake.
type affinityEntry struct {
	set, key, line string
}

// plantAffinityEntry adds a client to the first affinity set of the IPv4
// table (the scenarios have one), as the kernel would on a first packet.
func plantAffinityEntry(t *testing.T, f *knftables.Fake) affinityEntry {
	t.Helper()
	tbl := f.Tables[knftables.IPv4Family][TableName]
	for name, s := range tbl.Sets {
		if _, static := layouts[knftables.IPv4Family][name]; static || isDigestSet(name) {
			continue
		}
		e := &knftables.Element{Family: knftables.IPv4Family, Table: TableName, Set: name, Key: []string{"10.9.9.9"}}
		s.Elements = append(s.Elements, e)
		return affinityEntry{set: name, key: "10.9.9.9", line: "add element ip vipproxy " + name + " { 10.9.9.9 }"}
	}
	t.Fatal("no affinity set to plant an entry in")
	return affinityEntry{}
}

func hasAffinityEntry(f *knftables.Fake, a affinityEntry) bool {
	s := f.Tables[knftables.IPv4Family][TableName].Sets[a.set]
	if s == nil {
		return false
	}
	for _, e := range s.Elements {
		if e.Key[0] == a.key {
			return true
		}
	}
	return false
}

// TestRulesDigestFollowsPartialSyncs: after every sync, full or partial,
// the rules digest the proxier keeps, the one in the tables and one
// computed from scratch over what it applied agree; and once a sync has
// deleted the chains the one before flushed, a restart adopts the tables
// without a transaction.
func TestRulesDigestFollowsPartialSyncs(t *testing.T) {
	ctx := context.Background()
	p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
	states := []*model.State{allScenarioPorts(), dataplanetest.NoiseState(), allScenarioPorts(), {}, dataplanetest.NoiseState(), allScenarioPorts()}
	for i, st := range states {
		for round := range 2 { // the second deletes what the first left flushed
			if err := p.Sync(ctx, st, i == 0 && round == 0); err != nil {
				t.Fatal(err)
			}
			for _, f := range families {
				want := rulesDigest(p.schemas[f], p.applied[f])
				if p.rulesDigests[f] != want {
					t.Fatalf("state %d, round %d, %s: kept rules digest %x, from scratch %x", i, round, f, p.rulesDigests[f], want)
				}
				tr.Fake.RLock()
				elems := tr.Fake.Tables[f][TableName].Sets[rulesDigestSet].Elements
				tr.Fake.RUnlock()
				if len(elems) != 1 || elems[0].Key[0] != want.key() {
					t.Fatalf("state %d, round %d, %s: the table's rules digest is %v, want %s", i, round, f, elems, want.key())
				}
			}
		}
		tr.Fake.LastTransaction = nil
		q, err := New(dataplanetest.BaseOptions(), tr)
		if err != nil {
			t.Fatal(err)
		}
		q.log = quietLogger()
		if err := q.Sync(ctx, st, true); err != nil {
			t.Fatal(err)
		}
		if tr.Fake.LastTransaction != nil {
			t.Errorf("state %d: the restart wrote a transaction:\n%s", i, tr.Fake.LastTransaction)
		}
	}
}

// TestAdoptLegacyDigest: tables whose element digest is the one the
// release before kept (over the elements' nft text) are adopted without
// dumping their maps. When nothing else differs the restart writes the
// new digest and nothing else; when a chain differs too, it adopts the
// slow way, still without a dump. The restart after it writes nothing.
func TestAdoptLegacyDigest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(*knftables.Fake)
		want   []string // in the first restart's log
	}{
		{"only the digest", func(*knftables.Fake) {}, []string{"kind=unchanged", "digestOfReleaseBefore=true", "elementChanges=4", "operations=4"}},
		{"a chain more", func(f *knftables.Fake) {
			f.Tables[knftables.IPv4Family][TableName].Chains["stray"] = &knftables.FakeChain{Chain: knftables.Chain{Family: knftables.IPv4Family, Table: TableName, Name: "stray"}}
		}, []string{"kind=adopt", "mapsDumped=false", "digestOfReleaseBefore=true", "elementChanges=4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			old, tr := newFakeProxier(t, dataplanetest.BaseOptions())
			st := allScenarioPorts()
			if err := old.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			tr.Fake.Lock()
			setTextDigests(t, tr.Fake, old.digests)
			tc.damage(tr.Fake)
			tr.Fake.Unlock()

			restart := func() (logs, tx string, p *Proxier) {
				var buf bytes.Buffer
				o := dataplanetest.BaseOptions()
				o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
				p, err := New(o, tr)
				if err != nil {
					t.Fatal(err)
				}
				tr.Fake.LastTransaction = nil
				if err = p.Sync(ctx, st, true); err != nil {
					t.Fatal(err)
				}
				for _, f := range families {
					if p.digests[f] != old.digests[f] {
						t.Errorf("%s: digest %s after the restart, want %s", f, p.digests[f].key(), old.digests[f].key())
					}
				}
				if tr.Fake.LastTransaction != nil {
					tx = tr.Fake.LastTransaction.String()
				}
				return buf.String(), tx, p
			}
			logs, tx, p := restart()
			for _, want := range tc.want {
				if !strings.Contains(logs, want) {
					t.Errorf("first restart: no %s in its log:\n%s", want, logs)
				}
			}
			if tc.name == "only the digest" && strings.Count(tx, "\n") != 4 {
				t.Errorf("first restart wrote more than the digests:\n%s", tx)
			}
			if err := p.Sync(ctx, st, false); err != nil { // deletes the stray chain
				t.Fatal(err)
			}
			if logs, _, _ := restart(); !strings.Contains(logs, "kind=unchanged") || !strings.Contains(logs, "elementChanges=0") {
				t.Errorf("second restart: not unchanged:\n%s", logs)
			}
			if diff := cmp.Diff(coldDump(t, dataplanetest.BaseOptions(), st), dump(tr.Fake)); diff != "" {
				t.Errorf("after the restarts (-cold +got):\n%s", diff)
			}
		})
	}
}

// setTextDigests replaces the element digest of each family's table in f
// with the one the release before wrote: elemHash over the elements'
// text, which the fake holds. It must differ from today's (wire).
func setTextDigests(t *testing.T, f *knftables.Fake, wire map[knftables.Family]digest) {
	t.Helper()
	for _, fam := range families {
		tab := f.Tables[fam][TableName]
		var d digest
		for name := range layouts[fam] {
			var elems []*knftables.Element
			if m := tab.Maps[name]; m != nil {
				elems = m.Elements
			} else if s := tab.Sets[name]; s != nil {
				elems = s.Elements
			}
			for _, e := range elems {
				v := ""
				if len(e.Value) > 0 {
					v = e.Value[0]
				}
				d.add(name, e.Key[0], v)
			}
		}
		if d == wire[fam] {
			t.Fatalf("%s: the text digest is the wire digest", fam)
		}
		tab.Sets[digestSet].Elements = []*knftables.Element{{Key: []string{d.key()}}}
	}
}
