package kube

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestSnapshotPatches drives a Source through random event sequences
// (updates, additions, deletions, refused objects, slices moving between
// Services, namespaces that a string sort orders differently) and
// requires every snapshot to hold exactly what a full assembly of the
// same objects holds, every Patch to name exactly the positions that
// changed since the snapshot before, and a model.Builder fed the patched
// snapshots to build what a fresh Builder builds from each.
func TestSnapshotPatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := New(Options{})
	nss := []string{"a", "a-b", "a.b", "ab", "b"}
	svcName := func(i int) (string, string) { return nss[i%len(nss)], fmt.Sprintf("s%02d", i) }
	put := func(i int, port int32, bad, warn bool) {
		ns, name := svcName(i)
		ip := fmt.Sprintf("10.96.0.%d", i+1)
		if bad {
			ip = "10.96.0.999" // refused: a Problem
		}
		o := service(name, ip, port, nil)
		o.Namespace = ns
		if warn {
			o.Spec.ExternalIPs = []string{"bogus"} // accepted, with a Problem
		}
		s.onService(o, false)
	}
	putSlice := func(i, owner, eps int) {
		ns, _ := svcName(i)
		_, svc := svcName(owner)
		ips := make([]string, eps)
		for e := range ips {
			ips[e] = fmt.Sprintf("10.1.%d.%d", i, e+1)
		}
		o := slice(fmt.Sprintf("sl%02d", i), svc, ips...)
		o.Namespace = ns
		s.onSlice(o, false)
	}
	const n = 40
	for i := range n {
		put(i, 80, false, false)
		putSlice(i, i, 2)
	}
	var builder model.Builder
	var prev *model.Snapshot
	patched := 0
	for step := range 400 {
		for range 1 + rng.IntN(3) {
			i := rng.IntN(n)
			switch r := rng.IntN(100); {
			case r < 35:
				put(i, int32(80+rng.IntN(5)), false, false)
			case r < 40:
				put(i, 80, false, rng.IntN(2) == 0)
			case r < 75:
				putSlice(i, i, 1+rng.IntN(4))
			case r < 80:
				put(i, 80, true, false)
			case r < 85:
				ns, name := svcName(i)
				o := service(name, "", 80, nil)
				o.Namespace = ns
				s.onService(o, true)
			case r < 90:
				putSlice(i, (i+len(nss))%n, 2) // same namespace, another Service
			default:
				ns, _ := svcName(i)
				o := slice(fmt.Sprintf("sl%02d", i), "x")
				o.Namespace = ns
				s.onSlice(o, true)
			}
		}
		snap := s.snapshot()
		want := fullAssembly(s)
		if !slices.Equal(snap.Services, want.Services) || !slices.Equal(snap.Slices, want.Slices) || !reflect.DeepEqual(snap.Problems, want.Problems) {
			t.Fatalf("step %d: snapshot differs from a full assembly (patch %v)", step, snap.Patch != nil)
		}
		if prev != nil && snap.Gen != prev.Gen+1 {
			t.Fatalf("step %d: Gen %d after %d", step, snap.Gen, prev.Gen)
		}
		if p := snap.Patch; p != nil {
			patched++
			if p.Base != prev.Gen || len(snap.Services) != len(prev.Services) || len(snap.Slices) != len(prev.Slices) {
				t.Fatalf("step %d: patch of %d with lengths %d/%d after %d/%d", step, p.Base, len(snap.Services), len(snap.Slices), len(prev.Services), len(prev.Slices))
			}
			if got, want := p.Services, changedAt(prev.Services, snap.Services); !slices.Equal(got, want) {
				t.Fatalf("step %d: patch names Services %v, changed %v", step, got, want)
			}
			if got, want := p.Slices, changedAt(prev.Slices, snap.Slices); !slices.Equal(got, want) {
				t.Fatalf("step %d: patch names slices %v, changed %v", step, got, want)
			}
			for i := range snap.Slices {
				if snap.Slices[i].Service != prev.Slices[i].Service || snap.Slices[i].Name != prev.Slices[i].Name {
					t.Fatalf("step %d: slice %d changed name or Service in a patch", step, i)
				}
			}
		}
		opts := model.BuildOptions{}
		got := builder.Build(snap, opts)
		var fresh model.Builder
		if ref := fresh.Build(snap, opts); !reflect.DeepEqual(got.Ports, ref.Ports) {
			t.Fatalf("step %d: Builder fed patches built %d ports, a fresh one %d", step, len(got.Ports), len(ref.Ports))
		}
		prev = snap
	}
	if patched < 100 {
		t.Errorf("%d of 400 snapshots were patches, want most in-place changes patched", patched)
	}
}

// fullAssembly is what snapshot assembles from every object, computed
// independently of the Source's indexes.
func fullAssembly(s *Source) *model.Snapshot {
	out := &model.Snapshot{}
	out.Services = accepted(s.services, &out.Problems)
	out.Slices = accepted(s.slices, &out.Problems)
	for i := 1; i < len(out.Services); i++ {
		a, b := out.Services[i-1].ServiceName, out.Services[i].ServiceName
		if a.Namespace > b.Namespace || (a.Namespace == b.Namespace && a.Name >= b.Name) {
			panic(fmt.Sprintf("not in model order: %v before %v", a, b))
		}
	}
	return out
}

// accepted lists m's accepted objects in key order, appending every
// object's Problems to problems.
func accepted[T any](m map[string]converted[T], problems *[]model.Problem) []*T {
	var out []*T
	for _, k := range slices.SortedFunc(maps.Keys(m), compareKeys) {
		if c := m[k]; c.ok {
			out = append(out, c.obj)
		}
		*problems = append(*problems, m[k].problems...)
	}
	return out
}

// changedAt lists the indices where a and b hold different objects.
func changedAt[T any](a, b []*T) []int {
	var out []int
	for i := range b {
		if a[i] != b[i] {
			out = append(out, i)
		}
	}
	return out
}
