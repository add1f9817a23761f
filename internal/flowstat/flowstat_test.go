package flowstat

import (
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
)

func TestStats(t *testing.T) {
	ap := netip.MustParseAddrPort
	a, b, c := ap("10.244.1.5:8080"), ap("10.244.1.6:8080"), ap("10.244.1.7:8080")
	s := New()
	s.Watch(map[string][]netip.AddrPort{"default/web:http/TCP": {b, a}, "default/db:sql/TCP": {c}})
	port := uint16(40000)
	conn := func(ep netip.AddrPort, answered, refused, ended bool) {
		port++
		f := conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP, OrigSrc: netip.AddrPortFrom(netip.MustParseAddr("10.244.9.9"), port),
			OrigDst: ap("10.96.0.10:80"), ReplySrc: ep, TCPState: conntrack.TCPSynSent}
		s.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f})
		if refused {
			f.TCPState = conntrack.TCPClose
			s.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f})
			return
		}
		if answered {
			f.TCPState = conntrack.TCPSynRecv
			s.Observe(conntrack.Event{Type: conntrack.EventUpdate, Flow: f, Status: conntrack.StatusSeenReply})
			f.TCPState = conntrack.TCPEstablished
			s.Observe(conntrack.Event{Type: conntrack.EventUpdate, Flow: f, Status: conntrack.StatusSeenReply | conntrack.StatusAssured})
		}
		if ended {
			f.TCPState = conntrack.TCPTimeWait
			s.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f, Status: conntrack.StatusSeenReply | conntrack.StatusAssured})
		}
	}
	conn(a, true, false, false)
	conn(a, true, false, true)
	conn(a, false, true, false)
	conn(b, true, false, false)
	conn(c, true, false, true)
	conn(ap("10.244.1.99:8080"), true, false, false) // not watched

	top := s.Top(10)
	if len(top) != 2 || top[0].Name != "default/web:http/TCP" || top[0].New != 4 || top[1].New != 1 {
		t.Fatalf("Top(10) = %+v", top)
	}
	want := []Endpoint{{Endpoint: a, New: 3, Failed: 1, Live: 1}, {Endpoint: b, New: 1, Live: 1}}
	for i, e := range top[0].Endpoints {
		if e != want[i] {
			t.Errorf("endpoint %d: %+v, want %+v", i, e, want[i])
		}
	}
	if top[1].Endpoints[0].Live != 0 {
		t.Errorf("an ended flow is still live: %+v", top[1].Endpoints[0])
	}
	if got := s.Top(1); len(got) != 1 || got[0].Name != "default/web:http/TCP" {
		t.Errorf("Top(1) = %+v, want the busiest port only", got)
	}
	s.Watch(map[string][]netip.AddrPort{"default/db:sql/TCP": {c}})
	if got := s.Top(10); len(got) != 1 {
		t.Errorf("after Watch without web: %+v", got)
	}
}
