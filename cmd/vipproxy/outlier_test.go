package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/outlier"
)

type recordedEvent struct {
	svc     model.ServiceName
	warning bool
	reason  string
	msg     string
}

type fakeEventer chan recordedEvent

func (f fakeEventer) ServiceEvent(_ context.Context, svc model.ServiceName, warning bool, reason, msg string) error {
	f <- recordedEvent{svc, warning, reason, msg}
	return nil
}

// TestEjectorEvents: an ejection and a return become Events on the
// Service, and the overlay takes the ejected endpoint out of the port's
// set and puts it back.
func TestEjectorEvents(t *testing.T) {
	ap := netip.MustParseAddrPort
	j := newEjector(context.Background(), outlier.Config{BaseEjection: time.Second}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	evs := make(fakeEventer, 4)
	j.events = evs
	invalidated := 0
	j.invalidate = func() { invalidated++ }
	j.started = true // no conntrack here: events are fed by hand
	sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "shop", Name: "web"}, Port: "http", Protocol: model.TCP},
		Port: 80, OutlierEjection: true}
	for _, a := range []string{"10.244.1.5:8080", "10.244.1.6:8080"} {
		e := ap(a)
		sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: e.Addr(), Port: e.Port(), Ready: true})
	}
	sp.ClusterEndpoints = sp.Endpoints
	st := &model.State{Ports: []*model.ServicePort{sp}}
	j.watch(st)

	now := time.Now()
	var batch []conntrack.Event
	for i := range 3 {
		f := conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP, OrigSrc: netip.AddrPortFrom(netip.MustParseAddr("10.244.9.9"), uint16(40000+i)),
			OrigDst: ap("10.96.0.10:80"), ReplySrc: ap("10.244.1.5:8080"), TCPState: conntrack.TCPSynSent}
		batch = append(batch, conntrack.Event{Type: conntrack.EventNew, Flow: f})
		f.TCPState = conntrack.TCPClose
		batch = append(batch, conntrack.Event{Type: conntrack.EventDestroy, Flow: f})
	}
	j.step(batch, now)
	select {
	case ev := <-evs:
		if ev.svc != (model.ServiceName{Namespace: "shop", Name: "web"}) || !ev.warning || ev.reason != "EndpointEjected" || !strings.Contains(ev.msg, "10.244.1.5:8080") {
			t.Errorf("event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the ejection")
	}
	if invalidated != 1 {
		t.Errorf("invalidated %d times, want 1", invalidated)
	}
	if got := j.apply(st).Ports[0].ClusterEndpoints; len(got) != 1 || got[0].IP != netip.MustParseAddr("10.244.1.6") {
		t.Errorf("overlay left %v", got)
	}
	j.step(nil, now.Add(2*time.Second))
	select {
	case ev := <-evs:
		if ev.warning || ev.reason != "EndpointRestored" {
			t.Errorf("event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the return")
	}
	if got := j.apply(st); got != st {
		t.Errorf("overlay after the return changed the State")
	}
	for in, want := range map[string]string{"shop/web:http/TCP": "shop/web", "shop/web/UDP": "shop/web"} {
		if svc, ok := serviceOf(in); !ok || svc.String() != want {
			t.Errorf("serviceOf(%q) = %v, %v", in, svc, ok)
		}
	}
}

// BenchmarkEjectorBuild: what the Build closure adds to a sync of 10,000
// Services with ejection and slow start on, after one port changed: the
// ejector's watch and overlay and the ramp's overlay; with sampled flows
// and one suspect endpoint, the overlay looks for it in every port.
func BenchmarkEjectorBuild(b *testing.B) {
	for _, suspect := range []bool{false, true} {
		b.Run(fmt.Sprint("suspect=", suspect), func(b *testing.B) { benchmarkEjectorBuild(b, suspect) })
	}
}

func benchmarkEjectorBuild(b *testing.B, suspect bool) {
	j := newEjector(context.Background(), outlier.Config{}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	j.started = true
	r := newRamp(nil)
	st := &model.State{}
	for s := range 10000 {
		sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "bench", Name: fmt.Sprint("svc-", s)}, Port: "http", Protocol: model.TCP},
			Port: 80, OutlierEjection: true, SlowStart: 30 * time.Second, SampledFlows: suspect}
		for e := range 10 {
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(s / 200), byte(s%200 + e)}), Port: 8080, Ready: true})
		}
		sp.ClusterEndpoints = sp.Endpoints
		st.Ports = append(st.Ports, sp)
	}
	j.watch(st)
	if suspect {
		e := st.Ports[0].Endpoints[0]
		j.suspects = map[netip.AddrPort][]string{netip.AddrPortFrom(e.IP, e.Port): {st.Ports[0].Name.String()}}
		j.observe = j.portsOf(j.suspects)
		if j.apply(st).Ports[0].SampledFlows {
			b.Fatal("the suspect's port is still sampled")
		}
	}
	r.apply(j.apply(st))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		next := &model.State{Ports: slices.Clone(st.Ports)}
		cp := *next.Ports[i%len(next.Ports)]
		next.Ports[i%len(next.Ports)] = &cp
		j.watch(next)
		r.apply(j.apply(next))
		st = next
	}
}

// TestQuietFlows: BuildOptions.QuietFlows is on while some port has
// ejection and vipproxy reads no per-endpoint metrics; before the first
// watch it comes from the Snapshot's Services and the default; a watch
// that changes it asks for a rebuild, once.
func TestQuietFlows(t *testing.T) {
	svc := func(name, ejection string) *model.Service {
		return &model.Service{ServiceName: model.ServiceName{Namespace: "shop", Name: name}, OutlierEjection: ejection}
	}
	port := func(name string, ejection bool) *model.ServicePort {
		return &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "shop", Name: name}, Protocol: model.TCP},
			Port: 80, OutlierEjection: ejection}
	}
	for _, tc := range []struct {
		name      string
		services  []*model.Service
		byDefault bool
		topN      int
		want      bool
	}{
		{"no Service with ejection", []*model.Service{svc("a", ""), svc("b", "off")}, false, 0, false},
		{"one annotated", []*model.Service{svc("a", ""), svc("b", "on")}, false, 0, true},
		{"on by default", []*model.Service{svc("a", "")}, true, 0, true},
		{"off by annotation despite the default", []*model.Service{svc("a", "off")}, true, 0, false},
		{"per-endpoint metrics read every flow", []*model.Service{svc("b", "on")}, false, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newEjector(context.Background(), outlier.Config{}, tc.topN, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if got := j.quietFlows(&model.Snapshot{Services: tc.services}, tc.byDefault); got != tc.want {
				t.Errorf("quietFlows = %v, want %v", got, tc.want)
			}
		})
	}

	// With States that count their ports with ejection (as built) and
	// without: the count lets a watch skip its pass, never what the pass
	// would have found.
	for _, counted := range []bool{false, true} {
		j := newEjector(context.Background(), outlier.Config{}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
		j.started = true // no conntrack here
		invalidated := 0
		j.invalidate = func() { invalidated++ }
		if j.quietFlows(&model.Snapshot{Services: []*model.Service{svc("a", "")}}, false) {
			t.Fatal("quiet with no ejection anywhere")
		}
		sampled := port("s", false)
		sampled.SampledFlows = true
		steps := []struct {
			ports       []*model.ServicePort
			quiet       bool
			invalidated int
			watched     int
			sampling    bool
		}{
			{[]*model.ServicePort{port("a", false)}, false, 0, 0, false},
			{[]*model.ServicePort{port("a", false), port("b", true)}, true, 1, 1, false},
			{[]*model.ServicePort{port("a", false), port("c", true)}, true, 1, 1, false},
			{[]*model.ServicePort{port("a", false)}, false, 2, 0, false},
			{[]*model.ServicePort{port("a", false), sampled}, false, 2, 0, true},
		}
		for i, s := range steps {
			st := &model.State{Ports: s.ports}
			if counted {
				withUses(st)
			}
			j.watch(st)
			if got := j.quietFlows(&model.Snapshot{}, false); got != s.quiet || invalidated != s.invalidated {
				t.Errorf("counted=%v step %d: quiet %v after %d rebuilds, want %v after %d", counted, i, got, invalidated, s.quiet, s.invalidated)
			}
			if len(j.ports) != s.watched || j.sampling != s.sampling {
				t.Errorf("counted=%v step %d: %d ports watched, sampling %v; want %d, %v", counted, i, len(j.ports), j.sampling, s.watched, s.sampling)
			}
		}
	}
}

// TestEjectorSampled: a sampled port's first refused connection (seen at
// its end only) makes its endpoint a suspect: the overlay then observes
// every flow of the ports holding it (SampledFlows cleared on a copy) and
// of no other, and one rebuild is asked for; Window after the failure the
// port is sampled again, after one more rebuild. Without a sampled port a
// suspect asks for no rebuild.
func TestEjectorSampled(t *testing.T) {
	ap := netip.MustParseAddrPort
	port := func(name string, sampled bool, eps ...string) *model.ServicePort {
		sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "shop", Name: name}, Port: "http", Protocol: model.TCP},
			Port: 80, OutlierEjection: true, SampledFlows: sampled}
		for _, a := range eps {
			e := ap(a)
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: e.Addr(), Port: e.Port(), Ready: true})
		}
		sp.ClusterEndpoints = sp.Endpoints
		return sp
	}
	refusal := func(to string) []conntrack.Event {
		f := conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP, OrigSrc: ap("10.244.9.9:40000"),
			OrigDst: ap("10.96.0.10:80"), ReplySrc: ap(to), TCPState: conntrack.TCPClose}
		return []conntrack.Event{{Type: conntrack.EventDestroy, Flow: f}}
	}
	for _, sampled := range []bool{true, false} {
		t.Run(fmt.Sprint("sampled=", sampled), func(t *testing.T) {
			j := newEjector(context.Background(), outlier.Config{Window: 10 * time.Second}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
			j.started = true // no conntrack here: events are fed by hand
			invalidated := 0
			j.invalidate = func() { invalidated++ }
			st := &model.State{Ports: []*model.ServicePort{
				port("web", sampled, "10.244.1.5:8080", "10.244.1.6:8080"),
				port("api", sampled, "10.244.1.7:8080", "10.244.1.8:8080"),
			}}
			j.watch(st)
			now := time.Now()
			j.step(refusal("10.244.1.5:8080"), now)
			got := j.apply(st)
			wantRebuilds := 0
			if sampled {
				wantRebuilds = 1
			}
			if invalidated != wantRebuilds {
				t.Errorf("rebuilds after the first failure: %d, want %d", invalidated, wantRebuilds)
			}
			if sampled && (got.Ports[0].SampledFlows || !got.Ports[1].SampledFlows || !st.Ports[0].SampledFlows) {
				t.Errorf("SampledFlows web %v api %v (the State's web %v), want false true (true)",
					got.Ports[0].SampledFlows, got.Ports[1].SampledFlows, st.Ports[0].SampledFlows)
			}
			if got.Ports[0].ClusterEndpoints == nil || len(got.Ports[0].ClusterEndpoints) != 2 {
				t.Errorf("a suspect left selection: %v", got.Ports[0].ClusterEndpoints)
			}
			// The Builder rebuilds the port (a new pointer), and a new port
			// holds the suspect too: both observed.
			rebuilt := *st.Ports[0]
			st = &model.State{Ports: []*model.ServicePort{&rebuilt, st.Ports[1], port("new", sampled, "10.244.1.5:8080")}}
			j.watch(st)
			if got := j.apply(st); sampled && (got.Ports[0].SampledFlows || got.Ports[2].SampledFlows || !got.Ports[1].SampledFlows) {
				t.Errorf("after a rebuild, SampledFlows web %v api %v new %v, want false true false",
					got.Ports[0].SampledFlows, got.Ports[1].SampledFlows, got.Ports[2].SampledFlows)
			}
			j.step(nil, now.Add(5*time.Second))
			j.step(nil, now.Add(11*time.Second))
			if invalidated != 2*wantRebuilds {
				t.Errorf("rebuilds after the window: %d, want %d", invalidated, 2*wantRebuilds)
			}
			if got := j.apply(st); got != st {
				t.Errorf("overlay with no suspect left changed the State")
			}
		})
	}
}
