package iptables

import (
	"net/netip"
	"strings"
	"testing"
)

func TestRecentLastSeen(t *testing.T) {
	const list = `src=10.0.0.9 ttl: 64 last_seen: 4295000100 oldest_pkt: 1 4295000100
src=10.0.0.7 ttl: 63 last_seen: 4295001234 oldest_pkt: 2 4295000000, 4295001234
src=fd00::7 ttl: 64 last_seen: 4295009999 oldest_pkt: 1 4295009999
`
	for _, c := range []struct {
		client string
		want   uint64
		ok     bool
	}{
		{"10.0.0.7", 4295001234, true},
		{"10.0.0.9", 4295000100, true},
		{"fd00::7", 4295009999, true},
		{"10.0.0.8", 0, false},
	} {
		got, ok, err := recentLastSeen(strings.NewReader(list), netip.MustParseAddr(c.client))
		if err != nil || got != c.want || ok != c.ok {
			t.Errorf("%s: %d, %v, %v; want %d, %v", c.client, got, ok, err, c.want, c.ok)
		}
	}
	if _, _, err := recentLastSeen(strings.NewReader("src=10.0.0.7 ttl: 1 last_seen: x oldest_pkt: 1"), netip.MustParseAddr("10.0.0.7")); err == nil {
		t.Error("a malformed last_seen: no error")
	}
}

func TestNearestHZ(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want int
		ok   bool
	}{
		{248.2, 250, true}, {1003, 1000, true}, {99, 100, true}, {301, 300, true}, {500, 0, false}, {0, 0, false},
	} {
		if got, ok := nearestHZ(c.rate); got != c.want || ok != c.ok {
			t.Errorf("nearestHZ(%v) = %d, %v; want %d, %v", c.rate, got, ok, c.want, c.ok)
		}
	}
}
