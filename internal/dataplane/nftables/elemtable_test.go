package nftables

import (
	"maps"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// TestElemTable runs random operations on an elemTable and a Go map side
// by side, from tables made small (many resizes) and sized, over few keys
// (long runs of deletes and re-inserts in crowded runs of slots) and many.
func TestElemTable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hint, keys int
		ops        int
	}{
		{"empty-hint", 0, 50, 20000},
		{"sized", 1000, 1200, 50000},
		{"crowded", 16, 13, 20000},
		{"large", 0, 20000, 200000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.keys)))
			tbl, ref := newElemTable(tc.hint), map[string]elem{}
			owners := []*portEntry{nil, {}, {}}
			for op := range tc.ops {
				k := "10.0." + strconv.Itoa(r.IntN(tc.keys)) + " . 80"
				switch r.IntN(3) {
				case 0, 1:
					e := elem{owner: owners[r.IntN(3)], n: int32(op)}
					tbl.Set(k, e)
					ref[k] = e
				case 2:
					tbl.Delete(k)
					delete(ref, k)
				}
				if got, ok := tbl.Get(k); ok != inRef(ref, k) || got != ref[k] {
					t.Fatalf("op %d: Get(%q) = %v, %v; want %v", op, k, got, ok, ref[k])
				}
				if tbl.Len() != len(ref) {
					t.Fatalf("op %d: Len %d, want %d", op, tbl.Len(), len(ref))
				}
				if float64(tbl.Len()) > maxLoad*float64(len(tbl.slots)) {
					t.Fatalf("op %d: %d elements in %d slots", op, tbl.Len(), len(tbl.slots))
				}
			}
			got := maps.Collect(tbl.All())
			if !maps.Equal(got, ref) {
				t.Fatalf("All yields %d elements, want %d (or they differ)", len(got), len(ref))
			}
			for k := range ref {
				if _, ok := tbl.Get(k); !ok {
					t.Fatalf("%q lost", k)
				}
			}
			n := 0
			for range tbl.Keys() {
				n++
			}
			if n != len(ref) {
				t.Fatalf("Keys yields %d, want %d", n, len(ref))
			}
		})
	}
}

func inRef(m map[string]elem, k string) bool { _, ok := m[k]; return ok }

func TestElemTableNil(t *testing.T) {
	var tbl *elemTable
	if _, ok := tbl.Get("x"); ok || tbl.Len() != 0 {
		t.Fatal("a nil table is not empty")
	}
	for range tbl.All() {
		t.Fatal("a nil table yields")
	}
}

// TestElemTableSize checks what the table is for: fewer bytes an element
// than a Go map, sized (cold start) and grown.
func TestElemTableSize(t *testing.T) {
	const n = 500000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, tc := range []struct {
		hint int
		max  float64 // bytes an element
	}{{n, 44}, {0, 56}} { // 41.3 and 51.1 when written; a Go map: 84
		before := heap()
		tbl := newElemTable(tc.hint)
		for _, k := range keys {
			tbl.Set(k, elem{n: 1})
		}
		per := float64(heap()-before) / n
		if per > tc.max {
			t.Errorf("hint %d: %.1f bytes an element, want at most %.0f", tc.hint, per, tc.max)
		}
		t.Logf("hint %d: %.1f bytes an element", tc.hint, per)
		runtime.KeepAlive(tbl)
	}
}
