package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/cpustat"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/healthcheck"
	"github.com/vipproxy/vipproxy/internal/model"
)

// benchSnapshot returns n UDP ClusterIP Services with one slice of eps
// endpoints each (UDP, so the conntrack hook has work).
func benchSnapshot(n, eps int) *model.Snapshot {
	s := &model.Snapshot{Node: &model.Node{Name: "node-1"}}
	for i := range n {
		name := model.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%05d", i)}
		s.Services = append(s.Services, &model.Service{
			ServiceName: name, Type: model.TypeClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []model.ServicePortSpec{{Name: "p", Protocol: model.UDP, Port: 53}},
		})
		sl := model.EndpointSlice{Name: name.Name + "-1", Service: name, AddressType: model.IPv4,
			Ports: []model.EndpointPort{{Name: "p", Protocol: model.UDP, Port: 5353}}}
		for e := range eps {
			sl.Endpoints = append(sl.Endpoints, model.SliceEndpoint{
				Address: netip.AddrFrom4([4]byte{10, byte(1 + e), byte(i >> 8), byte(i)}),
				Ready:   true, Serving: true, Loc: model.At(fmt.Sprintf("node-%d", e%5), "")})
		}
		s.Slices = append(s.Slices, &sl)
	}
	return s
}

// changed returns a copy of s in which one endpoint of slice i flipped
// readiness; every other object shares its arrays with s, as the
// Kubernetes source hands them over.
func changed(s *model.Snapshot, i int) *model.Snapshot {
	c := &model.Snapshot{Services: s.Services, Slices: slices.Clone(s.Slices), Node: s.Node}
	sl := c.Slices[i]
	sl.Endpoints = slices.Clone(sl.Endpoints)
	sl.Endpoints[0].Ready = !sl.Endpoints[0].Ready
	c.Slices[i] = sl
	return c
}

// nopDataplane accepts every Sync and keeps nothing (dataplane.Fake keeps
// every State, which would grow the heap across b.N iterations).
type nopDataplane struct{ dataplane.Fake }

func (*nopDataplane) Sync(context.Context, *model.State, bool) error { return nil }

// BenchmarkLoopOneChange measures one change at 10,000 Services through
// Run, from the snapshot's arrival to the end of the AfterSync hooks, with
// a dataplane that costs nothing: what the loop itself adds to the
// programming latency.
func BenchmarkLoopOneChange(b *testing.B) {
	base := benchSnapshot(10000, 10)
	snaps := [2]*model.Snapshot{base, changed(base, 777)}
	fullBuild := func(s *model.Snapshot) *model.State { return model.Build(s, model.BuildOptions{}) }
	newIncremental := func() func(s *model.Snapshot) *model.State {
		var c model.Builder
		return func(s *model.Snapshot) *model.State { return c.Build(s, model.BuildOptions{}) }
	}
	cases := []struct {
		name  string
		build func() func(*model.Snapshot) *model.State
		hooks func() []func(context.Context, *model.State)
	}{
		{"build=full/hooks=none", func() func(*model.Snapshot) *model.State { return fullBuild }, nil},
		{"build=incremental/hooks=none", newIncremental, nil},
		{"build=incremental/hooks=healthcheck", newIncremental, func() []func(context.Context, *model.State) {
			sh := &healthcheck.ServiceHealth{}
			return []func(context.Context, *model.State){sh.Sync}
		}},
		{"build=incremental/hooks=conntrack", newIncremental, func() []func(context.Context, *model.State) {
			r := &conntrack.Reconciler{Table: &conntrack.Fake{}, Logger: slog.New(slog.DiscardHandler)}
			return []func(context.Context, *model.State){func(ctx context.Context, st *model.State) { _ = r.Reconcile(ctx, st) }}
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			synced := make(chan struct{}, 1)
			var hooks []func(context.Context, *model.State)
			if tc.hooks != nil {
				hooks = tc.hooks()
			}
			hooks = append(hooks, func(context.Context, *model.State) { synced <- struct{}{} })
			l, err := New(Options{Dataplane: &nopDataplane{}, Build: tc.build(), AfterSync: hooks,
				Health: healthcheck.NewProxierHealth(0, nil), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			in := make(chan *model.Snapshot)
			done := make(chan struct{})
			go func() { _ = l.Run(ctx, in); close(done) }()
			defer func() { cancel(); <-done }()
			in <- snaps[0]
			<-synced
			b.ReportAllocs()
			cpu0 := cpustat.Process()
			n := 0
			for b.Loop() {
				n++
				in <- snaps[n%2]
				<-synced
			}
			// CPU time (GC included) per change: stable on a loaded machine.
			b.ReportMetric(float64(cpustat.Process()-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
			if st := l.LastState(); st == nil || len(st.Ports) != 10000 {
				b.Fatalf("last state has %v ports", st)
			}
		})
	}
}
