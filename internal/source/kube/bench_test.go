package kube

import (
	"fmt"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// loaded10000 is a Source that has seen 10,000 Services, each with a
// slice of 10 endpoints.
func loaded10000() *Source {
	s := New(Options{})
	for i := range 10000 {
		s.onService(service(fmt.Sprintf("s%05d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, nil), false)
		ips := make([]string, 10)
		for e := range ips {
			ips[e] = fmt.Sprintf("10.1%02d.%d.%d", i/65000, (i/250)%250, e+1)
		}
		s.onSlice(slice(fmt.Sprintf("s%05d-1", i), fmt.Sprintf("s%05d", i), ips...), false)
	}
	return s
}

// BenchmarkSnapshot10000 assembles a snapshot of 10,000 converted Services
// and 10,000 slices of 10 endpoints in full (done once per debounced
// burst that added, deleted or refused an object; in-place changes are
// patched: BenchmarkOneChange10000).
func BenchmarkSnapshot10000(b *testing.B) {
	s := loaded10000()
	b.ResetTimer()
	for range b.N {
		s.reshaped = true
		snap := s.snapshot()
		if len(snap.Services) != 10000 || len(snap.Slices) != 10000 {
			b.Fatalf("%d services, %d slices", len(snap.Services), len(snap.Slices))
		}
	}
}

// BenchmarkOnServiceUpdate converts one changed Service in the event
// handler (the per-event cost).
func BenchmarkOnServiceUpdate(b *testing.B) {
	s := New(Options{})
	for i := range b.N {
		s.onService(service("web", "10.96.0.10", int32(1+i%60000), nil), false)
	}
}

// BenchmarkOneChange10000 changes one Service of 10,000 (with a slice of
// 10 endpoints each), then assembles the snapshot and builds it with the
// Builder that built the one before: the source and model cost of one
// change in Kubernetes mode.
func BenchmarkOneChange10000(b *testing.B) {
	s := loaded10000()
	var builder model.Builder
	builder.Build(s.snapshot(), model.BuildOptions{})
	b.ResetTimer()
	for i := range b.N {
		s.onService(service("s05000", "10.96.20.1", int32(81+i%2), nil), false)
		st := builder.Build(s.snapshot(), model.BuildOptions{})
		if len(st.Ports) != 10000 {
			b.Fatalf("%d ports", len(st.Ports))
		}
	}
}
