package allocator

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkEtcdAssign measures one uncontended host assigning new
// Services against a real (embedded) etcd: one CAS transaction each.
func BenchmarkEtcdAssign(b *testing.B) {
	te := startTestEtcdTB(b, false)
	s, err := OpenEtcd(context.Background(), EtcdOptions{Endpoints: []string{te.clientAddr}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	a, err := NewAssigner(AssignerOptions{Store: s, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/12")}, StaticSubrange: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.Assign(ctx, clusterIPSvc("bench", fmt.Sprintf("s%d", i))); err != nil {
			b.Fatal(err)
		}
	}
}
