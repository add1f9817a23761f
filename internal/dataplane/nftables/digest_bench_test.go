package nftables

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

// BenchmarkLegacyDigest measures legacyDigest (what a restart over tables
// of the release before computes once) at 10,000 Services × 10.
func BenchmarkLegacyDigest(b *testing.B) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, _ := New(o, &discardElementer{})
	if err := p.Sync(context.Background(), scaleState(10000, 10), true); err != nil {
		b.Fatal(err)
	}
	rs := p.applied[knftables.IPv4Family]
	for b.Loop() {
		legacyDigest(knftables.IPv4Family, rs)
	}
}
