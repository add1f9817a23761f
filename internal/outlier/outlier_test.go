package outlier

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
)

var t0 = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

func ep(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}), 8080)
}

// bed drives a Detector with connection attempts.
type bed struct {
	d    *Detector
	port uint16
}

func newBed(cfg Config, endpoints int) *bed {
	d := New(cfg)
	var eps []netip.AddrPort
	for i := 1; i <= endpoints; i++ {
		eps = append(eps, ep(i))
	}
	d.Watch(map[string][]netip.AddrPort{"default/web:http/TCP": eps})
	return &bed{d: d, port: 30000}
}

func (b *bed) flow(to netip.AddrPort) conntrack.Flow {
	b.port++
	return conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP,
		OrigSrc: netip.AddrPortFrom(netip.MustParseAddr("10.244.9.9"), b.port), OrigDst: netip.MustParseAddrPort("10.96.0.10:80"),
		ReplySrc: to, ReplyDst: netip.AddrPortFrom(netip.MustParseAddr("10.244.9.9"), b.port)}
}

// refused: SYN, then the kernel kills the entry at the reset.
func (b *bed) refused(to netip.AddrPort, at time.Time) {
	f := b.flow(to)
	f.TCPState = conntrack.TCPSynSent
	b.d.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f}, at)
	f.TCPState = conntrack.TCPClose
	b.d.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f}, at)
}

func (b *bed) ok(to netip.AddrPort, at time.Time) {
	f := b.flow(to)
	f.TCPState = conntrack.TCPSynSent
	b.d.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f}, at)
	f.TCPState = conntrack.TCPSynRecv
	b.d.Observe(conntrack.Event{Type: conntrack.EventUpdate, Flow: f, Status: conntrack.StatusSeenReply}, at)
}

func (b *bed) unanswered(to netip.AddrPort, at time.Time) {
	f := b.flow(to)
	f.TCPState = conntrack.TCPSynSent
	b.d.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f}, at)
}

func TestEjectAfterConsecutiveFailures(t *testing.T) {
	b := newBed(Config{}, 4)
	b.refused(ep(1), t0)
	b.refused(ep(1), t0.Add(time.Millisecond))
	if len(b.d.Ejected()) != 0 {
		t.Fatal("ejected after 2 failures, want 3")
	}
	b.ok(ep(1), t0.Add(2*time.Millisecond)) // breaks the streak
	b.refused(ep(1), t0.Add(3*time.Millisecond))
	b.refused(ep(1), t0.Add(4*time.Millisecond))
	if len(b.d.Ejected()) != 0 {
		t.Fatal("a success did not reset the streak")
	}
	b.refused(ep(1), t0.Add(5*time.Millisecond))
	got := b.d.Ejected()
	e, ok := got[ep(1)]
	if !ok || len(got) != 1 {
		t.Fatalf("ejected %v, want %v", got, ep(1))
	}
	if want := t0.Add(5*time.Millisecond + 5*time.Second); !e.Until.Equal(want) || e.Count != 1 {
		t.Errorf("ejection %+v, want until %v, count 1", e, want)
	}
	if c := b.d.Changes(); len(c) != 1 || !c[0].Ejected || c[0].Endpoint != ep(1) || c[0].Groups[0] != "default/web:http/TCP" {
		t.Errorf("changes %+v", c)
	}
	// Back after the backoff; failing again doubles it.
	b.d.Tick(t0.Add(6 * time.Second))
	if len(b.d.Ejected()) != 0 {
		t.Fatal("still ejected after its backoff")
	}
	if c := b.d.Changes(); len(c) != 1 || c[0].Ejected {
		t.Errorf("return not reported: %+v", c)
	}
	at := t0.Add(7 * time.Second)
	for range 3 {
		b.refused(ep(1), at)
	}
	if e := b.d.Ejected()[ep(1)]; e.Count != 2 || !e.Until.Equal(at.Add(10*time.Second)) {
		t.Errorf("second ejection %+v, want count 2 for 10 s", e)
	}
}

func TestWindow(t *testing.T) {
	b := newBed(Config{Window: time.Second}, 4)
	b.refused(ep(2), t0)
	b.refused(ep(2), t0.Add(600*time.Millisecond))
	b.refused(ep(2), t0.Add(1200*time.Millisecond)) // the first fell out: streak restarts
	if len(b.d.Ejected()) != 0 {
		t.Fatal("failures spread over more than the window ejected")
	}
	b.refused(ep(2), t0.Add(1300*time.Millisecond))
	b.refused(ep(2), t0.Add(1400*time.Millisecond))
	if _, ok := b.d.Ejected()[ep(2)]; !ok {
		t.Fatal("3 failures within the window did not eject")
	}
}

func TestNoReply(t *testing.T) {
	b := newBed(Config{}, 2)
	for i := range 3 {
		b.unanswered(ep(1), t0.Add(time.Duration(i)*time.Millisecond))
	}
	b.d.Tick(t0.Add(500 * time.Millisecond))
	if len(b.d.Ejected()) != 0 {
		t.Fatal("ejected before NoReply passed")
	}
	b.d.Tick(t0.Add(1100 * time.Millisecond))
	e, ok := b.d.Ejected()[ep(1)]
	if !ok {
		t.Fatal("3 unanswered SYNs did not eject")
	}
	if want := "3 new connections in a row failed (last: no reply within 1s)"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

// TestMaxShare: never more than half of a Service's endpoints, never its
// last one.
func TestMaxShare(t *testing.T) {
	for _, tc := range []struct{ endpoints, failing, want int }{{4, 4, 2}, {5, 5, 2}, {2, 2, 1}, {1, 1, 0}, {3, 1, 1}} {
		t.Run(fmt.Sprintf("%d of %d failing", tc.failing, tc.endpoints), func(t *testing.T) {
			b := newBed(Config{}, tc.endpoints)
			for i := 1; i <= tc.failing; i++ {
				for range 3 {
					b.refused(ep(i), t0)
				}
			}
			if got := len(b.d.Ejected()); got != tc.want {
				t.Errorf("%d ejected, want %d", got, tc.want)
			}
		})
	}
}

// TestUnwatched: flows to other endpoints and other protocols are
// ignored; Watch forgets endpoints that went away.
func TestUnwatched(t *testing.T) {
	b := newBed(Config{}, 2)
	for range 5 {
		b.refused(ep(9), t0)
	}
	if len(b.d.Ejected()) != 0 {
		t.Fatal("an unwatched endpoint was ejected")
	}
	for range 3 {
		b.refused(ep(1), t0)
	}
	b.d.Watch(map[string][]netip.AddrPort{"default/web:http/TCP": {ep(2), ep(3)}})
	if len(b.d.Ejected()) != 0 {
		t.Error("an endpoint no longer watched is still ejected")
	}
}

// TestSetGroup: an endpoint two Services share keeps its ejection while
// either still holds it, is forgotten when neither does, and comes back
// through Tick only while watched.
func TestSetGroup(t *testing.T) {
	d := New(Config{BaseEjection: time.Second})
	b := &bed{d: d, port: 30000}
	d.SetGroup("a", []netip.AddrPort{ep(1), ep(2), ep(3)})
	d.SetGroup("b", []netip.AddrPort{ep(1), ep(4), ep(5)})
	for range 3 {
		b.refused(ep(1), t0)
	}
	if c := d.Changes(); len(c) != 1 || len(c[0].Groups) != 2 {
		t.Fatalf("changes %+v: want one ejection from both groups", c)
	}
	steps := []struct {
		what    string
		group   string
		eps     []netip.AddrPort
		ejected bool
	}{
		{"a unchanged", "a", []netip.AddrPort{ep(1), ep(2), ep(3)}, true},
		{"a drops it, b holds it", "a", []netip.AddrPort{ep(2), ep(3)}, true},
		{"b unwatched", "b", nil, false},
		{"a takes it back: a fresh start", "a", []netip.AddrPort{ep(1), ep(2), ep(3)}, false},
	}
	for _, s := range steps {
		d.SetGroup(s.group, s.eps)
		if _, got := d.Ejected()[ep(1)]; got != s.ejected {
			t.Errorf("%s: ejected %v, want %v", s.what, got, s.ejected)
		}
	}
	if _, ok := d.groups["b"]; ok {
		t.Error("group b still held after SetGroup(b, nil)")
	}
	for range 3 {
		b.refused(ep(1), t0)
	}
	// Its only group changes around it: it stays ejected.
	d.SetGroup("a", []netip.AddrPort{ep(1), ep(2), ep(7)})
	if _, ok := d.Ejected()[ep(1)]; !ok {
		t.Error("an ejected endpoint was forgotten when its Service gained another endpoint")
	}
	d.SetGroup("a", nil)
	d.Tick(t0.Add(time.Hour))
	if c := d.Changes(); len(c) != 1 || !c[0].Ejected {
		t.Errorf("changes %+v: want only the ejection, no return of an unwatched endpoint", c)
	}
}

// BenchmarkObserve: the Detector's cost per event of a healthy connection
// (new, answered, destroyed) to one of 10 watched endpoints, with 1,000
// Service ports watched.
func BenchmarkObserve(b *testing.B) {
	d := New(Config{})
	groups := map[string][]netip.AddrPort{}
	for s := range 1000 {
		var eps []netip.AddrPort
		for e := range 10 {
			eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 245, byte(s / 25), byte(s%25*10 + e)}), 8080))
		}
		groups[fmt.Sprint("default/svc-", s)] = eps
	}
	d.Watch(groups)
	target := groups["default/svc-7"][3]
	bd := &bed{d: d}
	b.ReportAllocs()
	for b.Loop() {
		f := bd.flow(target)
		f.TCPState = conntrack.TCPSynSent
		d.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f}, t0)
		f.TCPState = conntrack.TCPEstablished
		d.Observe(conntrack.Event{Type: conntrack.EventUpdate, Flow: f, Status: conntrack.StatusSeenReply | conntrack.StatusAssured}, t0)
		f.TCPState = conntrack.TCPTimeWait
		d.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f, Status: conntrack.StatusSeenReply | conntrack.StatusAssured}, t0)
	}
}

// BenchmarkTick: one Tick of a Detector watching 10,000 Services of 10
// endpoints each, none ejected (what every batch of events and every
// 100 ms cost a node that turns ejection on for all its Services).
func BenchmarkTick(b *testing.B) {
	d := New(Config{})
	groups := map[string][]netip.AddrPort{}
	for s := range 10000 {
		var eps []netip.AddrPort
		for e := range 10 {
			eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(240 + s/10000), byte(s / 100 % 100), byte(s%100*2 + e)}), uint16(8080+s%7)))
		}
		groups[fmt.Sprint("default/svc-", s)] = eps
	}
	d.Watch(groups)
	b.ReportAllocs()
	for b.Loop() {
		d.Tick(t0)
	}
}

// refusedSampledOut: a refused attempt of a flow that reports its end
// only (a sampled port's flow outside the sample): no creation event.
func (b *bed) refusedSampledOut(to netip.AddrPort, at time.Time) {
	f := b.flow(to)
	f.TCPState = conntrack.TCPClose
	b.d.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f}, at)
}

// TestSuspects: an endpoint is a suspect from its first failure (seen from
// the end of the flow alone too) until Window after its last one, a
// success breaking its streak included; the set reports each change once.
func TestSuspects(t *testing.T) {
	cfg := Config{Failures: 3, Window: 10 * time.Second}
	type step struct {
		at          time.Duration
		do          string // "refused", "refused-end", "ok", "tick", "unwatch"
		wantSuspect bool
		wantChanged bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a refusal seen at its end only makes a suspect", []step{
			{0, "tick", false, false},
			{time.Second, "refused-end", true, true},
			{2 * time.Second, "tick", true, false},
			{11 * time.Second, "tick", true, false},
			{11*time.Second + time.Millisecond, "tick", false, true},
		}},
		{"a success breaks the streak, not the suspicion", []step{
			{0, "refused", true, true},
			{time.Second, "ok", true, false},
			{5 * time.Second, "refused-end", true, false},
			{14 * time.Second, "tick", true, false},
			{16 * time.Second, "tick", false, true},
		}},
		{"an endpoint no longer watched is no suspect", []step{
			{0, "refused", true, true},
			{time.Second, "unwatch", false, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(cfg, 4)
			for i, s := range tc.steps {
				at := t0.Add(s.at)
				switch s.do {
				case "refused":
					b.refused(ep(1), at)
				case "refused-end":
					b.refusedSampledOut(ep(1), at)
				case "ok":
					b.ok(ep(1), at)
				case "unwatch":
					b.d.Watch(map[string][]netip.AddrPort{"default/web:http/TCP": {ep(2), ep(3)}})
				}
				b.d.Tick(at)
				_, suspect := b.d.Suspects()[ep(1)]
				if changed := b.d.SuspectsChanged(); suspect != s.wantSuspect || changed != s.wantChanged {
					t.Errorf("step %d (%s at %v): suspect %v changed %v, want %v %v", i, s.do, s.at, suspect, changed, s.wantSuspect, s.wantChanged)
				}
			}
		})
	}
	// Failures seen at their ends only still eject after three in a row.
	b := newBed(cfg, 4)
	for i := range 3 {
		b.refusedSampledOut(ep(1), t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if _, out := b.d.Ejected()[ep(1)]; !out {
		t.Error("three refusals seen at their ends did not eject the endpoint")
	}
}

// TestStaleUnanswered: the end of an unanswered SYN's entry (its SYN_SENT
// timeout, minutes after the attempt, or a deletion) is no failure now:
// three of them neither eject nor make a suspect, and a pending attempt
// whose entry goes that way is dropped, not failed.
func TestStaleUnanswered(t *testing.T) {
	b := newBed(Config{}, 4)
	for i := range 3 {
		f := b.flow(ep(1))
		f.TCPState = conntrack.TCPSynSent
		b.d.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	f := b.flow(ep(1))
	f.TCPState = conntrack.TCPSynSent
	b.d.Observe(conntrack.Event{Type: conntrack.EventNew, Flow: f}, t0)
	b.d.Observe(conntrack.Event{Type: conntrack.EventDestroy, Flow: f}, t0.Add(10*time.Millisecond))
	b.d.Tick(t0.Add(5 * time.Second))
	if len(b.d.Ejected()) != 0 || len(b.d.Suspects()) != 0 {
		t.Errorf("ejected %v, suspects %v after stale unanswered ends; want none", b.d.Ejected(), b.d.Suspects())
	}
}
