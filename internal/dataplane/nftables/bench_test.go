package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// scaleState returns n Services with one TCP port and eps endpoints each;
// every tenth is a NodePort Service.
func scaleState(n, eps int) *model.State {
	ports := make([]*model.ServicePort, 0, n)
	for i := 0; i < n; i++ {
		sp := dataplanetest.Port(fmt.Sprintf("ns%d/svc%d", i%50, i), "http", model.TCP, 80)
		sp.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}
		if i%10 == 0 {
			sp.Type = model.TypeNodePort
			sp.NodePort = uint16(30000 + i%2700)
		}
		for j := 0; j < eps; j++ {
			k := i*eps + j
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{
				IP: netip.AddrFrom4([4]byte{10, 1 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080, Ready: true, Serving: true})
		}
		ports = append(ports, dataplanetest.Fill(sp))
	}
	return &model.State{NodeName: dataplanetest.NodeName, Ports: ports}
}

// changeOne returns st with the endpoint j of port i replaced.
func changeOne(st *model.State, i, round int) *model.State {
	out := *st
	out.Ports = append([]*model.ServicePort(nil), st.Ports...)
	sp := *st.Ports[i]
	sp.Endpoints = append([]model.Endpoint(nil), sp.Endpoints...)
	sp.Endpoints[0].IP = netip.AddrFrom4([4]byte{10, 200, byte(round >> 8), byte(round)})
	out.Ports[i] = dataplanetest.Fill(&sp)
	return &out
}

// discardTransport accepts every transaction without applying it: it
// measures the proxier's own cost (build, diff, transaction text).
type discardTransport struct{ ops int }

func (d *discardTransport) NewTransaction() *knftables.Transaction { return emptyFake.NewTransaction() }
func (d *discardTransport) Run(_ context.Context, tx *knftables.Transaction) error {
	d.ops += tx.NumOperations()
	_ = tx.String()
	return nil
}
func (d *discardTransport) Probe(_ context.Context, _ knftables.Family, _, chain string) (bool, int, error) {
	// No table before the first sync (so a cold start is one), intact after.
	return d.ops > 0, 1, nil
}

// discardElementer is a discardTransport that is also an Elementer, as NFT
// is: a cold start fills maps with element operations, partial syncs that
// change only elements skip the transaction text.
type discardElementer struct{ discardTransport }

func (d *discardElementer) RunElements(_ context.Context, ops []ElementOp) error {
	d.ops += len(ops)
	return nil
}

func heapInUseMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

// BenchmarkSync measures a full sync and a one-endpoint partial sync at
// 1,000 and 10,000 Services × 10 endpoints over a discarding transport
// (the proxier's own cost: building, diffing, rendering nft text), over a
// discarding Elementer (the same with NFT's netlink paths: a cold start
// in three steps, element-only partial syncs without text), and at
// 100 and 1,000 Services over the knftables Fake. The Fake finds each
// element by a linear reflect.DeepEqual scan and copies every table per
// transaction, so it is quadratic in map size: at 10,000 Services (100,000
// endpoint elements) it would measure only itself.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		st := scaleState(n, 10)
		for _, kind := range []string{"fake", "discard", "elementer"} {
			if kind == "fake" && n > 1000 {
				continue
			}
			newTr := func() Transport {
				switch kind {
				case "fake":
					return NewFakeTransport()
				case "elementer":
					return &discardElementer{}
				}
				return &discardTransport{}
			}
			b.Run(fmt.Sprintf("services=%d/%s/full", n, kind), func(b *testing.B) {
				o := dataplanetest.BaseOptions()
				o.Logger = quietLogger()
				base := heapInUseMiB()
				var p *Proxier
				for i := 0; i < b.N; i++ {
					p, _ = New(o, newTr())
					if err := p.Sync(context.Background(), st, true); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(heapInUseMiB()-base, "heap-MiB")
				runtime.KeepAlive(p)
			})
			b.Run(fmt.Sprintf("services=%d/%s/one-change", n, kind), func(b *testing.B) {
				o := dataplanetest.BaseOptions()
				o.Logger = quietLogger()
				p, _ := New(o, newTr())
				ctx := context.Background()
				if err := p.Sync(ctx, st, true); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := p.Sync(ctx, changeOne(st, i%n, i), false); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestKernelScale measures real nft syncs in a netns at 1,000 and 10,000
// Services × 10 endpoints. It runs only as root with VIPPROXY_BENCH=1.
func TestKernelScale(t *testing.T) {
	if os.Getenv("VIPPROXY_BENCH") != "1" {
		t.Skip("set VIPPROXY_BENCH=1 to run")
	}
	for _, n := range []int{1000, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ns := newNetns(t, "scale")
			o := dataplanetest.BaseOptions()
			o.Logger = quietLogger()
			p, err := New(o, &NFT{Netns: ns})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			st := scaleState(n, 10)
			start := time.Now()
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			full := time.Since(start)
			start = time.Now()
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			resync := time.Since(start)
			const rounds = 5
			var total, worst time.Duration
			for r := 0; r < rounds; r++ {
				next := changeOne(st, (r*7919)%n, r)
				start = time.Now()
				if err := p.Sync(ctx, next, false); err != nil {
					t.Fatal(err)
				}
				d := time.Since(start)
				total += d
				worst = max(worst, d)
				st = next
			}
			start = time.Now()
			if err := p.Sync(ctx, st, false); err != nil {
				t.Fatal(err)
			}
			noop := time.Since(start)
			t.Logf("services=%d endpoints=10: first full sync %v, full resync %v, one-change sync mean %v max %v, unchanged sync %v, heap %.1f MiB",
				n, full.Round(time.Millisecond), resync.Round(time.Millisecond), (total / rounds).Round(time.Millisecond),
				worst.Round(time.Millisecond), noop.Round(time.Millisecond), heapInUseMiB())
			runtime.KeepAlive(p)
		})
	}
}

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
