package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestVerify: Verify is quiet while the kernel holds what the last sync
// wrote, and names the drift (wrapping dataplane.ErrDrift) when a virtual
// server, a real server or a weight is changed behind the Proxier; a full
// sync repairs it.
func TestVerify(t *testing.T) {
	key := ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: model.TCP}
	dest := RealServer{Addr: netip.MustParseAddr("10.1.1.9"), Port: 8080, Weight: 1}
	for _, tc := range []struct {
		name   string
		tamper func(*FakeKernel) error
	}{
		{"virtual server deleted", func(k *FakeKernel) error { return k.DelService(key) }},
		{"real server deleted", func(k *FakeKernel) error { return k.DelDest(key, dest) }},
		{"weight changed", func(k *FakeKernel) error { d := dest; d.Weight = 0; return k.UpdateDest(key, d) }},
		{"scheduler changed", func(k *FakeKernel) error {
			return k.UpdateService(VirtualServer{ServiceKey: key, Scheduler: "sh"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, nil)
			ctx := context.Background()
			if err := b.p.Verify(ctx); err != nil {
				t.Fatalf("before any sync: %v", err)
			}
			b.sync(t, state(web()), false)
			if err := b.p.Verify(ctx); err != nil {
				t.Fatalf("after a sync, nothing changed: %v", err)
			}
			if err := tc.tamper(b.kernel); err != nil {
				t.Fatal(err)
			}
			err := b.p.Verify(ctx)
			if !errors.Is(err, dataplane.ErrDrift) {
				t.Fatalf("Verify after %s = %v, want ErrDrift", tc.name, err)
			}
			t.Logf("%s: %v", tc.name, err)
			b.sync(t, state(web()), true)
			if err := b.p.Verify(ctx); err != nil {
				t.Errorf("after the repairing full sync: %v", err)
			}
		})
	}
}
