package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

// TestQuietFlows (issue 19): while vipproxy reads conntrack events for
// outlier ejection (nftables mode), the flows of a Service without it
// report no event at all, and those of the Service with it report their
// creation, their assured state and nothing else in between: seen by a
// second listener on the node's conntrack table.
func TestQuietFlows(t *testing.T) {
	const watched, plain = "10.96.0.170:80", "10.96.0.171:80"
	b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{1}, Before: func(b *bed) {
		w := Service("watched", "10.96.0.170", Port("http", TCP, 80, 8080))
		w.Annotations = map[string]string{"vipproxy.io/outlier-ejection": "on"}
		p := Service("plain", "10.96.0.171", Port("http", TCP, 80, 8080))
		b.apply("quiet.yaml", w, Slice(w, V4, "a", allEPs(b.Topology)...), p, Slice(p, V4, "a", allEPs(b.Topology)...))
	}})
	ns := b.Client
	b.ready(ns, "tcp", watched)
	b.ready(ns, "tcp", plain)

	h, err := netns.GetFromName(b.node(1).NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ev, err := conntrack.SubscribeEvents(int(h), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()

	const n = 20
	for _, addr := range []string{watched, plain} {
		for range n {
			if _, err := DialWith(ns, "tcp", addr, DialOptions{Timeout: Scaled(time.Second)}); err != nil {
				t.Fatalf("connect %s: %v", addr, err)
			}
		}
	}
	type tally struct{ created, assured, other int }
	seen := map[netip.AddrPort]*tally{netip.MustParseAddrPort(watched): {}, netip.MustParseAddrPort(plain): {}}
	for deadline := time.Now().Add(Scaled(time.Second)); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		evs, err := ev.Poll()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			c := seen[e.Flow.OrigDst]
			switch {
			case c == nil:
			case e.Type == conntrack.EventNew:
				c.created++
			case e.Type == conntrack.EventUpdate && e.Status&conntrack.StatusAssured != 0:
				c.assured++
			default:
				c.other++
				t.Logf("%s: event %+v", e.Flow.OrigDst, e)
			}
		}
	}
	w, p := seen[netip.MustParseAddrPort(watched)], seen[netip.MustParseAddrPort(plain)]
	t.Logf("watched Service: %d created, %d assured, %d other; plain Service: %+v", w.created, w.assured, w.other, *p)
	if w.created != n || w.assured != n || w.other != 0 {
		t.Errorf("watched Service: %d created, %d assured, %d other events; want %d, %d, 0", w.created, w.assured, w.other, n, n)
	}
	if *p != (tally{}) {
		t.Errorf("plain Service's flows reported %+v; want no event", *p)
	}
}
