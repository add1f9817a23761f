package allocator

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// BenchmarkIPRangeAllocateNext allocates from a /12 (1M addresses) with
// the static band on, releasing as it goes to stay half full.
func BenchmarkIPRangeAllocateNext(b *testing.B) {
	r, err := NewIPRange(netip.MustParsePrefix("10.96.0.0/12"), RangeOptions{StaticSubrange: true, Rand: seeded(1)})
	if err != nil {
		b.Fatal(err)
	}
	for range r.Size() / 2 {
		r.AllocateNext()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ip, err := r.AllocateNext()
		if err != nil {
			b.Fatal(err)
		}
		r.Release(ip)
	}
}

// BenchmarkBoltAssign assigns new Services (one fsynced bbolt transaction
// each) into a map that already holds 5,000 Services.
func BenchmarkBoltAssign(b *testing.B) {
	b.Run("fsync", func(b *testing.B) { benchBoltAssign(b, false) })
	b.Run("nosync", func(b *testing.B) { benchBoltAssign(b, true) })
}

func benchBoltAssign(b *testing.B, noSync bool) {
	s, err := OpenBolt(filepath.Join(b.TempDir(), "a.db"))
	if err != nil {
		b.Fatal(err)
	}
	s.db.NoSync = noSync
	defer s.Close()
	a, err := NewAssigner(AssignerOptions{Store: s, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, StaticSubrange: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Update(ctx, func(m *Map) error {
		for i := range 5000 {
			m.Set(svcName("pre", fmt.Sprint(i)), Record{ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})}})
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.Assign(ctx, nodePortSvc("bench", fmt.Sprint(i), 0)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBoltAssignAllColdStart assigns 5,000 new Services with one
// AssignAll (one bbolt transaction), as a first standalone start does.
func BenchmarkBoltAssignAllColdStart(b *testing.B) { benchAssignAllColdStart(b, 5000) }

// BenchmarkBoltAssignAllColdStart50000 is the same with 50,000 Services:
// one transaction, whose puts must not go quadratic.
func BenchmarkBoltAssignAllColdStart50000(b *testing.B) { benchAssignAllColdStart(b, 50000) }

func benchAssignAllColdStart(b *testing.B, n int) {
	var svcs []model.Service
	for i := range n {
		svcs = append(svcs, nodePortSvc("bench", fmt.Sprint(i), 0))
		svcs[i].Type = model.TypeClusterIP
		svcs[i].Ports[0].NodePort = 0
	}
	in := ptrs(svcs)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, err := OpenBolt(filepath.Join(b.TempDir(), fmt.Sprint(i)+".db"))
		if err != nil {
			b.Fatal(err)
		}
		a, err := NewAssigner(AssignerOptions{Store: s, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, StaticSubrange: true})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		_, errs := a.AssignAll(context.Background(), in)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		s.Close()
	}
}

// BenchmarkBoltReassign re-assigns an unchanged Service in a map of 5,000
// (what every restart and every re-read manifest does): no store write,
// and no rebuild of the index while the map's revision stands.
func BenchmarkBoltReassign(b *testing.B) {
	s, err := OpenBolt(filepath.Join(b.TempDir(), "a.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	a, err := NewAssigner(AssignerOptions{Store: s, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, StaticSubrange: true})
	if err != nil {
		b.Fatal(err)
	}
	var svcs []model.Service
	for i := range 5000 {
		svcs = append(svcs, nodePortSvc("bench", fmt.Sprint(i), 0))
	}
	ctx := context.Background()
	if _, errs := a.AssignAll(ctx, ptrs(svcs)); errs[0] != nil {
		b.Fatal(errs[0])
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.Assign(ctx, svcs[i%len(svcs)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRepair50000 runs one repair pass over a map of 50,000
// Services, every one live but one leaked record, a NodePort on one in
// twenty (what the standalone proxy does every minute).
func BenchmarkRepair50000(b *testing.B) {
	s, err := OpenBolt(filepath.Join(b.TempDir(), "a.db"))
	if err != nil {
		b.Fatal(err)
	}
	s.db.NoSync = true
	defer s.Close()
	a, err := NewAssigner(AssignerOptions{Store: s, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, LeakThreshold: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const n = 50000
	live := make([]model.ServiceName, 0, n)
	if err := s.Update(ctx, func(m *Map) error {
		for i := range n + 1 {
			r := Record{ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})}}
			if i%20 == 0 {
				r.NodePorts = []PortAssignment{{Name: "http", Protocol: model.TCP, NodePort: uint16(30000 + i/20)}}
			}
			name := svcName("bench", fmt.Sprint(i))
			m.Set(name, r)
			if i < n {
				live = append(live, name)
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := a.Repair(ctx, live)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Leaked) != 1 || len(res.Invalid) != 0 {
			b.Fatalf("leaked %d, invalid %v", len(res.Leaked), res.Invalid)
		}
	}
}
