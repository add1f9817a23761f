package portcache

import (
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

func port(ep string) *model.ServicePort {
	return &model.ServicePort{
		Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: "web"}, Protocol: model.TCP}, Port: 80, Protocol: model.TCP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Endpoints:  []model.Endpoint{{IP: netip.MustParseAddr(ep), Port: 8080, Ready: true}},
	}
}

// TestCache: a value is reused for the same pointer and for an Equal
// port, rebuilt for a changed port and after Invalidate, and dropped by
// Sweep when its key was not seen.
func TestCache(t *testing.T) {
	var c Cache[string, string]
	builds := 0
	build := func(sp *model.ServicePort) string { builds++; return sp.Endpoints[0].IP.String() }
	a := port("10.0.0.1")
	for _, tc := range []struct {
		name       string
		sp         *model.ServicePort
		want       string
		wantBuilds int
	}{
		{"first", a, "10.0.0.1", 1},
		{"same pointer", a, "10.0.0.1", 1},
		{"equal copy", port("10.0.0.1"), "10.0.0.1", 1},
		{"changed", port("10.0.0.2"), "10.0.0.2", 2},
	} {
		if got := c.Get("k", tc.sp, build); got != tc.want || builds != tc.wantBuilds {
			t.Errorf("%s: got %q after %d builds, want %q after %d", tc.name, got, builds, tc.want, tc.wantBuilds)
		}
	}
	c.Invalidate()
	if c.Get("k", port("10.0.0.2"), build); builds != 3 {
		t.Errorf("after Invalidate: %d builds, want 3", builds)
	}
	c.Get("other", a, build)
	c.Sweep() // both seen: kept, marks cleared
	c.Get("k", port("10.0.0.2"), build)
	c.Sweep() // "other" not seen since the last Sweep: dropped
	if c.Len() != 1 {
		t.Errorf("%d entries after Sweep, want 1", c.Len())
	}
}

// TestLookupPutDelete: Lookup misses until Put, then hits for the same
// or an Equal port and misses for a changed one; Delete drops the entry.
func TestLookupPutDelete(t *testing.T) {
	var c Cache[string, int]
	a := port("10.0.0.1")
	if _, ok := c.Lookup("k", a); ok {
		t.Fatal("Lookup on an empty cache hit")
	}
	c.Put("k", a, 7)
	for _, tc := range []struct {
		name string
		sp   *model.ServicePort
		want bool
	}{
		{"same pointer", a, true},
		{"equal copy", port("10.0.0.1"), true},
		{"changed", port("10.0.0.2"), false},
	} {
		if v, ok := c.Lookup("k", tc.sp); ok != tc.want || (ok && v != 7) {
			t.Errorf("%s: Lookup = %d, %v; want hit %v", tc.name, v, ok, tc.want)
		}
	}
	c.Delete("k")
	if _, ok := c.Lookup("k", a); ok || c.Len() != 0 {
		t.Errorf("after Delete: hit %v, %d entries; want a miss and 0", ok, c.Len())
	}
}
