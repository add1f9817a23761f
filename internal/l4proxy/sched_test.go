package l4proxy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func cands(active []int, weights []int, down ...int) []Candidate {
	out := make([]Candidate, len(active))
	for i := range active {
		w := 1
		if weights != nil {
			w = weights[i]
		}
		out[i] = Candidate{
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 80),
			Weight: w, Active: active[i], Down: slices.Contains(down, i),
		}
	}
	return out
}

// TestSchedulerSequences checks the choices each scheduler makes as the
// live-flow counts evolve: after each pick the chosen candidate's Active
// count grows by one, as it does in a Proxy while connections stay open.
func TestSchedulerSequences(t *testing.T) {
	src := netip.MustParseAddrPort("192.0.2.7:40000")
	dst := netip.MustParseAddrPort("10.96.0.10:80")
	tests := []struct {
		name    string
		sched   string
		active  []int
		weights []int
		down    []int
		want    []int
	}{
		{name: "rr cycles", sched: "rr", active: []int{0, 0, 0}, want: []int{0, 1, 2, 0, 1, 2}},
		{name: "rr skips down", sched: "rr", active: []int{0, 0, 0}, down: []int{1}, want: []int{0, 2, 0, 2}},
		{name: "rr all down", sched: "rr", active: []int{0, 0}, down: []int{0, 1}, want: []int{-1}},
		{name: "lc fills the least loaded", sched: "lc", active: []int{2, 0, 1}, want: []int{1, 1, 2, 0, 1, 2}},
		{name: "lc ignores weights", sched: "lc", active: []int{0, 0}, weights: []int{1, 5}, want: []int{0, 1, 0, 1}},
		{name: "lc skips down", sched: "lc", active: []int{0, 3}, down: []int{0}, want: []int{1, 1}},
		// sed: (Active+1)/Weight. With weights 1,3: 1/1 vs 1/3 → 1;
		// 1/1 vs 2/3 → 1; 1/1 vs 3/3 tie → 0; 2/1 vs 3/3 → 1;
		// 2 vs 4/3 → 1; 2 vs 5/3 → 1; 2 vs 6/3 tie → 0; 3 vs 2 → 1.
		{name: "sed weighted", sched: "sed", active: []int{0, 0}, weights: []int{1, 3}, want: []int{1, 1, 0, 1, 1, 1, 0, 1}},
		{name: "sed equal weights is least connection", sched: "sed", active: []int{3, 1, 2}, want: []int{1, 1, 2, 0}},
		// nq: an idle candidate first, even a light one; then sed.
		{name: "nq idle first", sched: "nq", active: []int{0, 0}, weights: []int{1, 3}, want: []int{0, 1, 1, 1, 1, 1}},
		{name: "nq all down", sched: "nq", active: []int{0}, down: []int{0}, want: []int{-1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewScheduler(tc.sched)
			if err != nil {
				t.Fatal(err)
			}
			cs := cands(tc.active, tc.weights, tc.down...)
			var got []int
			for range tc.want {
				i := s.Pick(cs, src, dst)
				got = append(got, i)
				if i >= 0 {
					cs[i].Active++
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("picks = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHashSchedulers(t *testing.T) {
	cs := cands([]int{0, 0, 0, 0}, nil)
	t.Run("dh follows the destination", func(t *testing.T) {
		var s DestHash
		seen := map[int]bool{}
		for i := range 64 {
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), 80)
			first := s.Pick(cs, netip.MustParseAddrPort("192.0.2.1:1"), dst)
			// Another client, same destination: same endpoint.
			if again := s.Pick(cs, netip.MustParseAddrPort("192.0.2.99:2"), dst); again != first {
				t.Fatalf("dst %v: picks %d then %d", dst, first, again)
			}
			if want := int(ipvsHash(dst.Addr(), 0, 0)) % len(cs); first != want {
				t.Fatalf("dst %v: pick %d, want bucket owner %d", dst, first, want)
			}
			seen[first] = true
		}
		if len(seen) != len(cs) {
			t.Errorf("64 destinations used %d of %d endpoints", len(seen), len(cs))
		}
	})
	t.Run("sh follows the source and honours weights", func(t *testing.T) {
		s := SourceHash{}
		wcs := cands([]int{0, 0}, []int{1, 3})
		count := make([]int, 2)
		for i := range 256 {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))
			first := s.Pick(wcs, src, netip.AddrPort{})
			again := s.Pick(wcs, netip.AddrPortFrom(src.Addr(), 5555), netip.AddrPort{})
			if first != again {
				t.Fatalf("src %v: picks %d then %d with another port", src, first, again)
			}
			count[first]++
		}
		// Weight 3 should take about three quarters of the sources.
		if count[1] < 2*count[0] {
			t.Errorf("weights 1:3 gave counts %v", count)
		}
	})
	t.Run("sh falls back when the hashed endpoint is down", func(t *testing.T) {
		var s SourceHash
		src := netip.MustParseAddrPort("192.0.2.44:9")
		first := s.Pick(cs, src, netip.AddrPort{})
		down := cands([]int{0, 0, 0, 0}, nil, first)
		if i := s.Pick(down, src, netip.AddrPort{}); i < 0 || i == first {
			t.Errorf("with %d down picked %d", first, i)
		}
		all := cands([]int{0, 0, 0, 0}, nil, 0, 1, 2, 3)
		if i := s.Pick(all, src, netip.AddrPort{}); i != -1 {
			t.Errorf("all down picked %d", i)
		}
	})
	t.Run("dh falls back when the hashed endpoint is down", func(t *testing.T) {
		var s DestHash
		dst := netip.MustParseAddrPort("10.96.0.1:53")
		first := s.Pick(cs, netip.AddrPort{}, dst)
		down := cands([]int{0, 0, 0, 0}, nil, first)
		if i := s.Pick(down, netip.AddrPort{}, dst); i != (first+1)%4 {
			t.Errorf("with %d down picked %d, want %d", first, i, (first+1)%4)
		}
	})
}

func TestRandomScheduler(t *testing.T) {
	s := &Random{Rand: rand.New(rand.NewPCG(1, 2))}
	cs := cands([]int{0, 0, 0, 0}, nil, 2)
	count := make([]int, 4)
	for range 4000 {
		count[s.Pick(cs, netip.AddrPort{}, netip.AddrPort{})]++
	}
	if count[2] != 0 {
		t.Errorf("picked a down candidate %d times", count[2])
	}
	for _, i := range []int{0, 1, 3} {
		if count[i] < 1100 || count[i] > 1560 {
			t.Errorf("candidate %d picked %d times of 4000, want about 1333 (counts %v)", i, count[i], count)
		}
	}
}

func TestNewSchedulerUnknown(t *testing.T) {
	if _, err := NewScheduler("wlcx"); err == nil {
		t.Fatal("NewScheduler(wlcx) succeeded")
	}
	for _, n := range SchedulerNames {
		if _, err := NewScheduler(n); err != nil {
			t.Errorf("NewScheduler(%q): %v", n, err)
		}
	}
}

func TestRandomWeighted(t *testing.T) {
	s := &Random{Rand: rand.New(rand.NewPCG(3, 4))}
	cs := cands([]int{0, 0, 0}, []int{1, 3, 6})
	count := make([]int, 3)
	for range 10000 {
		count[s.Pick(cs, netip.AddrPort{}, netip.AddrPort{})]++
	}
	for i, want := range []int{1000, 3000, 6000} {
		if d := float64(count[i])/float64(want) - 1; d > 0.05 || d < -0.05 {
			t.Errorf("candidate %d picked %d times of 10000, want %d ±5%% (counts %v)", i, count[i], want, count)
		}
	}
}

func TestWeightedRoundRobin(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		down    []int
		want    []int
	}{
		{"equal weights alternate", []int{1, 1, 1}, nil, []int{0, 1, 2, 0, 1, 2}},
		{"2:1 smooth", []int{2, 1}, nil, []int{0, 1, 0, 0, 1, 0}},
		{"down skipped", []int{1, 1, 1}, []int{1}, []int{0, 2, 0, 2}},
		{"all down", []int{1}, []int{0}, []int{-1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &WeightedRoundRobin{}
			cs := cands(make([]int, len(tc.weights)), tc.weights, tc.down...)
			var got []int
			for range tc.want {
				got = append(got, s.Pick(cs, netip.AddrPort{}, netip.AddrPort{}))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("picks = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConsistentHash: a source keeps its endpoint; removing one of four
// endpoints moves its own sources and at most 5% of the others; a Down
// endpoint's sources go elsewhere and come back.
func TestConsistentHash(t *testing.T) {
	s := &ConsistentHash{}
	cs := cands([]int{0, 0, 0, 0}, nil)
	srcs := make([]netip.AddrPort, 1000)
	for i := range srcs {
		srcs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, byte(2 + i/250), byte(i % 250)}), uint16(30000+i))
	}
	before := make([]netip.AddrPort, len(srcs))
	count := make([]int, 4)
	for i, src := range srcs {
		k := s.Pick(cs, src, netip.AddrPort{})
		before[i] = cs[k].Addr
		count[k]++
		if again := s.Pick(cs, netip.AddrPortFrom(src.Addr(), 1), netip.AddrPort{}); again != k {
			t.Fatalf("source %v moved from %d to %d with another port", src.Addr(), k, again)
		}
	}
	for i, c := range count {
		if c < 180 || c > 320 {
			t.Errorf("endpoint %d got %d of 1000 sources, want about 250 (counts %v)", i, c, count)
		}
	}
	gone := cs[2].Addr
	rest := slices.Delete(slices.Clone(cs), 2, 3)
	moved := 0
	for i, src := range srcs {
		got := rest[s.Pick(rest, src, netip.AddrPort{})].Addr
		if before[i] != gone && got != before[i] {
			moved++
		}
	}
	if moved > 50 {
		t.Errorf("removing one of 4 endpoints moved %d of the other endpoints' 1000 sources, want ≤ 50", moved)
	}
	down := cands([]int{0, 0, 0, 0}, nil, 1)
	for i, src := range srcs {
		k := s.Pick(down, src, netip.AddrPort{})
		if k == 1 {
			t.Fatalf("picked a Down candidate for %v", src)
		}
		if before[i] != down[1].Addr && down[k].Addr != before[i] {
			t.Fatalf("source %v moved off a healthy endpoint while another was Down", src)
		}
	}
}
