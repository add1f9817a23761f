package iptables

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// TestFragDelta compares fragDelta with the definition over random pairs
// of syncs: every fragment of next that is not the same pointer as its
// ServicePort's in prev is paired with that one (or nil), and gone holds
// prev's fragments whose ServicePort left; nothing else is reported
// except same-pointer pairs of moved fragments.
func TestFragDelta(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	name := func(i int) model.ServicePortName {
		return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: fmt.Sprintf("s%03d", i)}, Port: "p"}
	}
	for round := 0; round < 2000; round++ {
		var prev []*fragment
		for i := 0; i < 20; i++ {
			if rng.IntN(3) > 0 {
				prev = append(prev, &fragment{name: name(i)})
			}
		}
		byName := map[model.ServicePortName]*fragment{}
		for _, f := range prev {
			byName[f.name] = f
		}
		var next []*fragment
		for i := 0; i < 20; i++ {
			old := byName[name(i)]
			switch r := rng.IntN(4); {
			case r == 0: // absent
			case r == 1 || old == nil: // new fragment
				next = append(next, &fragment{name: name(i)})
			default: // unchanged
				next = append(next, old)
			}
		}
		pairs, gone := fragDelta(prev, next)
		got := map[model.ServicePortName]fragPair{}
		for _, pr := range pairs {
			if _, dup := got[pr.new.name]; dup {
				t.Fatalf("round %d: %v paired twice", round, pr.new.name)
			}
			got[pr.new.name] = pr
		}
		inNext := map[model.ServicePortName]bool{}
		for _, f := range next {
			inNext[f.name] = true
			old := byName[f.name]
			pr, reported := got[f.name]
			switch {
			case old != f && !reported:
				t.Fatalf("round %d: changed %v not reported", round, f.name)
			case reported && (pr.new != f || pr.old != old):
				t.Fatalf("round %d: %v paired with the wrong predecessor", round, f.name)
			}
		}
		var wantGone []*fragment
		for _, f := range prev {
			if !inNext[f.name] {
				wantGone = append(wantGone, f)
			}
		}
		if !slices.Equal(gone, wantGone) {
			t.Fatalf("round %d: gone %d fragments, want %d", round, len(gone), len(wantGone))
		}
	}
}
