package balance

import (
	"fmt"
	"slices"
	"testing"
)

func TestWeighted(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		want    []int
	}{
		{"empty", nil, nil},
		{"equal weights: identity", []int{3, 3, 3}, nil},
		{"one endpoint", []int{7}, nil},
		{"3:1 interleaved", []int{3, 1}, []int{0, 0, 1, 0}},
		{"gcd reduced", []int{20, 10}, []int{0, 1, 0}},
		{"2:1:1 smooth", []int{2, 1, 1}, []int{0, 1, 2, 0}},
		{"zero counts as one", []int{0, 2}, []int{1, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Weighted(tc.weights); !slices.Equal(got, tc.want) {
				t.Errorf("Weighted(%v) = %v, want %v", tc.weights, got, tc.want)
			}
		})
	}
}

func TestWeightedShares(t *testing.T) {
	weights := []int{100, 1, 37, 50, 3}
	table := Weighted(weights)
	counts := make([]int, len(weights))
	for _, i := range table {
		counts[i]++
	}
	if !slices.Equal(counts, weights) {
		t.Errorf("slots per endpoint %v, want %v", counts, weights)
	}
	// Smooth: in every prefix, each endpoint is within one slot of its
	// exact share.
	total := len(table)
	run := make([]int, len(weights))
	for k, i := range table {
		run[i]++
		for j, w := range weights {
			exact := float64((k+1)*w) / float64(total)
			if d := float64(run[j]) - exact; d > 1 || d < -1 {
				t.Fatalf("after %d slots endpoint %d has %d, exact share %.2f", k+1, j, run[j], exact)
			}
		}
	}
}

func TestWeightedScaled(t *testing.T) {
	weights := make([]int, 200)
	for i := range weights {
		weights[i] = 100 - i%2 // coprime neighbours: gcd 1, sum 19,900
	}
	weights[0] = 1
	table := Weighted(weights)
	if len(table) > MaxSlots {
		t.Fatalf("%d slots, want at most %d", len(table), MaxSlots)
	}
	seen := map[int]bool{}
	for _, i := range table {
		seen[i] = true
	}
	if len(seen) != len(weights) {
		t.Errorf("%d of %d endpoints have a slot", len(seen), len(weights))
	}
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.%d:8080", i/250, i%250+1)
	}
	return out
}

func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func TestMaglevSize(t *testing.T) {
	for _, tc := range []struct{ n, want int }{{0, 251}, {1, 251}, {2, 251}, {3, 1021}, {10, 1021}, {11, 4093}, {40, 4093}, {41, 16381}, {163, 16381}, {164, 65521}, {5000, 65521}} {
		if got := MaglevSize(tc.n); got != tc.want {
			t.Errorf("MaglevSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

// TestMaglevShares: every slot is filled and each endpoint's share is
// within 10% of its weighted share.
func TestMaglevShares(t *testing.T) {
	for _, tc := range []struct {
		name    string
		weights []int
	}{
		{"2 equal", ones(2)},
		{"10 equal", ones(10)},
		{"100 equal", ones(100)},
		{"weighted 3:1:1", []int{3, 1, 1}},
		{"weighted 1..8", []int{1, 2, 3, 4, 5, 6, 7, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.weights)
			m := MaglevSize(n)
			table := Maglev(keys(n), tc.weights, m)
			if len(table) != m {
				t.Fatalf("table has %d slots, want %d", len(table), m)
			}
			counts := make([]int, n)
			total := 0
			for _, w := range tc.weights {
				total += w
			}
			for _, i := range table {
				if i < 0 || i >= n {
					t.Fatalf("slot holds %d", i)
				}
				counts[i]++
			}
			for i, c := range counts {
				want := float64(m*tc.weights[i]) / float64(total)
				if d := float64(c)/want - 1; d > 0.10 || d < -0.10 {
					t.Errorf("endpoint %d has %d slots, want %.1f ±10%%", i, c, want)
				}
			}
		})
	}
}

// TestMaglevDisruption: removing one of N endpoints moves the removed
// endpoint's slots and at most 5% of the table besides; the table does
// not depend on the order of the other keys' indices beyond renumbering.
func TestMaglevDisruption(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5, 10, 30, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ks := keys(n)
			m := MaglevSize(n)
			before := Maglev(ks, ones(n), m)
			for gone := 0; gone < n; gone += max(1, n/5) {
				rest := slices.Delete(slices.Clone(ks), gone, gone+1)
				after := Maglev(rest, ones(n-1), m)
				moved := 0
				for s := range m {
					if before[s] == gone {
						continue
					}
					if ks[before[s]] != rest[after[s]] {
						moved++
					}
				}
				frac := float64(moved) / float64(m)
				t.Logf("removing endpoint %d of %d moved %.2f%% of the other slots", gone, n, 100*frac)
				if frac > 0.05 {
					t.Errorf("removing endpoint %d of %d moved %.1f%% of the other slots, want ≤ 5%%", gone, n, 100*frac)
				}
			}
		})
	}
}

func TestMaglevDeterministic(t *testing.T) {
	a := Maglev(keys(7), ones(7), 251)
	b := Maglev(keys(7), ones(7), 251)
	if !slices.Equal(a, b) {
		t.Error("two tables of the same keys differ")
	}
	if Maglev(nil, nil, 251) != nil {
		t.Error("table of no endpoints is not nil")
	}
}

func BenchmarkMaglev10(b *testing.B) {
	ks, ws := keys(10), ones(10)
	for b.Loop() {
		Maglev(ks, ws, MaglevSize(10))
	}
}
