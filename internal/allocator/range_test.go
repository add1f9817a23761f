package allocator

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func TestStaticBandSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		want   int
	}{
		{"v4 /28 has no static band", "10.0.0.0/28", 0},
		{"v4 /27 floor 16", "10.0.0.0/27", 16},
		{"v4 /25 floor 16", "10.0.0.0/25", 16},
		{"v4 /24 size/16 = 16", "10.0.0.0/24", 16},
		{"v4 /22 size/16 = 64", "10.0.0.0/22", 64},
		{"v4 /20 size/16 = 256", "10.0.0.0/20", 256},
		{"v4 /16 capped 256", "10.0.0.0/16", 256},
		{"v4 /12 capped 256", "10.96.0.0/12", 256},
		{"v6 /108 capped 256", "fd00::/108", 256},
		{"v6 /64 capped 256", "fd00::/64", 256},
		{"v6 /124 has no static band", "fd00::/124", 0},
		{"v6 /120 floor 16", "fd00::/120", 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := netip.MustParsePrefix(tc.prefix)
			got := StaticBandSize(prefixSize(p.Addr().BitLen() - p.Bits()))
			if got != tc.want {
				t.Errorf("StaticBandSize(%s) = %d, want %d", tc.prefix, got, tc.want)
			}
			r, err := NewIPRange(p, RangeOptions{StaticSubrange: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.StaticSize() != tc.want {
				t.Errorf("IPRange(%s).StaticSize() = %d, want %d", tc.prefix, r.StaticSize(), tc.want)
			}
		})
	}
}

func TestNodePortStaticBandSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		want int
	}{
		{"tiny", 10, 0},
		{"16 ports", 16, 0},
		{"17 ports floor", 17, 16},
		{"500 ports floor", 500, 16},
		{"1000 ports size/32", 1000, 31},
		{"default 30000-32767", 2768, 86},
		{"4096 capped", 4096, 128},
		{"whole space capped", 65535, 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodePortStaticBandSize(tc.size); got != tc.want {
				t.Errorf("NodePortStaticBandSize(%d) = %d, want %d", tc.size, got, tc.want)
			}
		})
	}
}

func TestIPRangeSizes(t *testing.T) {
	for _, tc := range []struct {
		prefix      string
		size        int
		first, last string
	}{
		{"10.0.0.0/24", 254, "10.0.0.1", "10.0.0.254"},
		{"10.0.0.0/30", 2, "10.0.0.1", "10.0.0.2"},
		{"10.96.0.0/12", 1<<20 - 2, "10.96.0.1", "10.111.255.254"},
		{"fd00::/120", 255, "fd00::1", "fd00::ff"},
		{"fd00::/108", 65535, "fd00::1", "fd00::ffff"},
		{"fd00:1:2:3::/64", 65535, "fd00:1:2:3::1", "fd00:1:2:3::ffff"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			r, err := NewIPRange(netip.MustParsePrefix(tc.prefix), RangeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Size() != tc.size || r.Free() != tc.size || r.Used() != 0 {
				t.Fatalf("size/free/used = %d/%d/%d, want %d/%d/0", r.Size(), r.Free(), r.Used(), tc.size, tc.size)
			}
			first, last := netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)
			if !r.Contains(first) || !r.Contains(last) {
				t.Errorf("range must contain %s and %s", first, last)
			}
			if r.Contains(first.Prev()) || r.Contains(last.Next()) {
				t.Errorf("range must not contain %s or %s", first.Prev(), last.Next())
			}
			if r.addr(0) != first || r.addr(r.Size()-1) != last {
				t.Errorf("addr(0), addr(last) = %s, %s", r.addr(0), r.addr(r.Size()-1))
			}
		})
	}
	for _, bad := range []string{"10.0.0.0/31", "10.0.0.1/32", "fd00::1/128", "10.0.0.0/11", "10.0.0.0/8"} {
		if _, err := NewIPRange(netip.MustParsePrefix(bad), RangeOptions{}); err == nil {
			t.Errorf("NewIPRange(%s) must fail: no allocatable address or too large", bad)
		}
	}
}

// TestIPRangeFull allocates every address of small ranges: each exactly
// once, never the network / broadcast address, then ErrFull.
func TestIPRangeFull(t *testing.T) {
	for _, tc := range []struct {
		prefix  string
		static  bool
		size    int
		invalid []string
	}{
		{"192.168.1.0/28", true, 14, []string{"192.168.1.0", "192.168.1.15"}},
		{"192.168.1.0/24", true, 254, []string{"192.168.1.0", "192.168.1.255"}},
		{"192.168.1.0/24", false, 254, []string{"192.168.1.0", "192.168.1.255"}},
		{"fd00::/120", true, 255, []string{"fd00::"}},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			r, err := NewIPRange(netip.MustParsePrefix(tc.prefix), RangeOptions{StaticSubrange: tc.static, Rand: seeded(1)})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[netip.Addr]bool{}
			for i := 0; i < tc.size; i++ {
				ip, err := r.AllocateNext()
				if err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				if seen[ip] {
					t.Fatalf("%s handed out twice", ip)
				}
				if !r.Contains(ip) || !r.Has(ip) {
					t.Fatalf("%s: contains=%v has=%v", ip, r.Contains(ip), r.Has(ip))
				}
				seen[ip] = true
			}
			for _, s := range tc.invalid {
				if seen[netip.MustParseAddr(s)] {
					t.Errorf("reserved address %s handed out", s)
				}
			}
			if _, err := r.AllocateNext(); !errors.Is(err, ErrFull) {
				t.Fatalf("AllocateNext on a full range: %v, want ErrFull", err)
			}
			if r.Used() != tc.size || r.Free() != 0 {
				t.Errorf("used/free = %d/%d", r.Used(), r.Free())
			}
		})
	}
}

// TestDynamicBandFirst: AllocateNext takes the whole dynamic (upper) band
// before it touches the static (lower) band.
func TestDynamicBandFirst(t *testing.T) {
	r, err := NewIPRange(netip.MustParsePrefix("10.0.0.0/24"), RangeOptions{StaticSubrange: true, Rand: seeded(7)})
	if err != nil {
		t.Fatal(err)
	}
	// 254 usable, static band = 16 (10.0.0.1-10.0.0.16), dynamic 238.
	for i := 0; i < 238; i++ {
		ip, err := r.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if r.InStaticBand(ip) || ip.Less(netip.MustParseAddr("10.0.0.17")) {
			t.Fatalf("allocation %d took %s from the static band while the dynamic band had room", i, ip)
		}
	}
	for i := 0; i < 16; i++ {
		ip, err := r.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if !r.InStaticBand(ip) {
			t.Fatalf("after the dynamic band is full, got %s outside the static band", ip)
		}
	}
	if _, err := r.AllocateNext(); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
}

// TestGateOff: with StaticSubrange false there is one pool, so random
// starts land in the low 16 addresses too.
func TestGateOff(t *testing.T) {
	r, err := NewIPRange(netip.MustParsePrefix("10.0.0.0/24"), RangeOptions{Rand: seeded(3)})
	if err != nil {
		t.Fatal(err)
	}
	if r.StaticSize() != 0 {
		t.Fatalf("StaticSize with the gate off = %d, want 0", r.StaticSize())
	}
	low := 0
	for i := 0; i < 120; i++ {
		ip, err := r.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if ip.Less(netip.MustParseAddr("10.0.0.17")) {
			low++
		}
	}
	if low == 0 {
		t.Fatal("with one shared pool, 120 random allocations out of 254 never hit the low 16 addresses")
	}
	p, err := NewPortRange(30000, 30099, RangeOptions{Rand: seeded(3)})
	if err != nil {
		t.Fatal(err)
	}
	if p.StaticSize() != 0 {
		t.Fatalf("port StaticSize with the gate off = %d", p.StaticSize())
	}
}

func TestIPRangeTypedErrors(t *testing.T) {
	r, err := NewIPRange(netip.MustParsePrefix("10.96.0.0/24"), RangeOptions{StaticSubrange: true})
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.96.0.10")
	if err := r.Allocate(ip); err != nil {
		t.Fatal(err)
	}
	if err := r.Allocate(ip); !errors.Is(err, ErrAllocated) {
		t.Errorf("second Allocate(%s) = %v, want ErrAllocated", ip, err)
	}
	for _, s := range []string{"10.97.0.1", "10.96.0.0", "10.96.0.255", "fd00::1"} {
		err := r.Allocate(netip.MustParseAddr(s))
		var nir *ErrNotInRange
		if !errors.As(err, &nir) {
			t.Errorf("Allocate(%s) = %v, want *ErrNotInRange", s, err)
			continue
		}
		if nir.Value != s || nir.Range != "10.96.0.0/24" {
			t.Errorf("ErrNotInRange = %+v", nir)
		}
	}
}

func TestIPRangeReleaseReuse(t *testing.T) {
	r, err := NewIPRange(netip.MustParsePrefix("10.0.0.0/29"), RangeOptions{Rand: seeded(5)})
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for range 6 {
		ip, err := r.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip)
	}
	if _, err := r.AllocateNext(); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	r.Release(got[3])
	r.Release(got[3])                             // twice: no-op
	r.Release(netip.MustParseAddr("192.168.0.1")) // out of range: no-op
	if r.Has(got[3]) || r.Used() != 5 {
		t.Fatalf("after Release: has=%v used=%d", r.Has(got[3]), r.Used())
	}
	ip, err := r.AllocateNext()
	if err != nil || ip != got[3] {
		t.Fatalf("AllocateNext after release = %v, %v; want the released %s", ip, err, got[3])
	}
	r.Release(got[0])
	if err := r.Allocate(got[0]); err != nil {
		t.Fatalf("Allocate of a released IP: %v", err)
	}
}

func TestPortRange(t *testing.T) {
	p, err := NewPortRange(30000, 32767, RangeOptions{StaticSubrange: true, Rand: seeded(9)})
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 2768 || p.StaticSize() != 86 {
		t.Fatalf("size/static = %d/%d, want 2768/86", p.Size(), p.StaticSize())
	}
	for i := 0; i < 2768-86; i++ {
		port, err := p.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if port < 30086 {
			t.Fatalf("allocation %d took static port %d while the dynamic band had room", i, port)
		}
	}
	for i := 0; i < 86; i++ {
		port, err := p.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if !p.InStaticBand(port) {
			t.Fatalf("port %d not in the static band", port)
		}
	}
	if _, err := p.AllocateNext(); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	p.Release(30005)
	if err := p.Allocate(30005); err != nil {
		t.Fatalf("reuse: %v", err)
	}
	if err := p.Allocate(30005); !errors.Is(err, ErrAllocated) {
		t.Fatalf("want ErrAllocated, got %v", err)
	}
	var nir *ErrNotInRange
	if err := p.Allocate(8080); !errors.As(err, &nir) || nir.Range != "30000-32767" || nir.Value != "8080" {
		t.Fatalf("want ErrNotInRange{8080, 30000-32767}, got %v", err)
	}
	if _, err := NewPortRange(100, 99, RangeOptions{}); err == nil {
		t.Fatal("inverted range must fail")
	}
}

// TestBitmapScanWrap covers the word-skipping scan at band edges that do
// not fall on 64-bit boundaries.
func TestBitmapScanWrap(t *testing.T) {
	for _, size := range []int{1, 63, 64, 65, 130, 200} {
		for _, static := range []int{0, 1, 16} {
			b := newBitmap(size, static, seeded(uint64(size)))
			for i := 0; i < size; i++ {
				at, ok := b.next()
				if !ok {
					t.Fatalf("size %d static %d: full after %d", size, static, i)
				}
				if at < 0 || at >= size {
					t.Fatalf("offset %d out of [0,%d)", at, size)
				}
				if i < size-b.static && at < b.static {
					t.Fatalf("size %d static %d: static offset %d while dynamic had room", size, static, at)
				}
			}
			if b.count != size {
				t.Fatalf("count %d, want %d", b.count, size)
			}
			if _, ok := b.next(); ok {
				t.Fatal("next on a full bitmap succeeded")
			}
		}
	}
}
