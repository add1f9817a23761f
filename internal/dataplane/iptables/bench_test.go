package iptables

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// nullRunner accepts every restore without parsing it, so a benchmark
// measures vipproxy's own work (rule generation, diff, restore text).
type nullRunner struct{ bytes int }

func (n *nullRunner) Restore(_ context.Context, _ Family, _ string, data []byte) error {
	n.bytes += len(data)
	return nil
}
func (n *nullRunner) Save(_ context.Context, _ Family, table string) ([]byte, error) {
	return []byte("*" + table + "\nCOMMIT\n"), nil
}
func (n *nullRunner) ListChain(_ context.Context, _ Family, _, chain string) ([]byte, error) {
	return []byte("-N " + chain + "\n-A " + chain + " -j RETURN\n"), nil
}

// nullSets accepts every ipset script without parsing it.
type nullSets struct{}

func (nullSets) Restore(context.Context, []byte) error  { return nil }
func (nullSets) List(context.Context) ([]string, error) { return nil, nil }

func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// BenchmarkSync measures a full sync and a one-change partial sync at
// 1,000 and 10,000 Services × 10 endpoints, with the parsing Fake and with
// a runner that discards the input (with hairpin sets, and in kube-proxy's
// layout as the baseline). It reports restore bytes per sync and
// the heap held afterwards (proxier state, plus the Fake's tables).
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		st := bigState(n, 10)
		alt := [2]*model.State{changeOne(st, n/2, 9001), changeOne(st, n/2, 9002)}
		for _, runner := range []string{"fake", "null", "null-chain-per-endpoint"} {
			mk := func(b *testing.B) (*Proxier, func() int) {
				var r Runner
				var sets ipset.Runner
				var bytes func() int
				if runner == "fake" {
					f := NewFake()
					r, sets = f, &ipset.Fake{}
					bytes = func() int { return 0 }
				} else {
					nr := &nullRunner{}
					r, sets = nr, nullSets{}
					bytes = func() int { return nr.bytes }
					if runner == "null-chain-per-endpoint" {
						sets = nil // kube-proxy's layout, the baseline
					}
				}
				p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: r, IPSet: sets, Families: []Family{IPv4},
					Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
				if err != nil {
					b.Fatal(err)
				}
				return p, bytes
			}
			b.Run(fmt.Sprintf("services=%d/runner=%s/full", n, runner), func(b *testing.B) {
				base := heapMB()
				b.ReportAllocs()
				var p *Proxier
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					p, _ = mk(b)
					b.StartTimer()
					if err := p.Sync(context.Background(), st, true); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(p.LastRestoreBytes()), "restore-bytes")
				b.ReportMetric(heapMB()-base, "heap-MB")
				runtime.KeepAlive(p)
			})
			b.Run(fmt.Sprintf("services=%d/runner=%s/one-change", n, runner), func(b *testing.B) {
				base := heapMB()
				p, _ := mk(b)
				if err := p.Sync(context.Background(), st, true); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := p.Sync(context.Background(), alt[i%2], false); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(p.LastRestoreBytes()), "restore-bytes")
				b.ReportMetric(heapMB()-base, "heap-MB")
				runtime.KeepAlive(p)
			})
		}
	}
}

// BenchmarkKernelSync measures real iptables-restore (system default
// binaries, and iptables-legacy) in a namespace at 1,000 Services × 10
// endpoints: a cold full sync, then one-change partial syncs. Set
// VIPPROXY_BENCH=1 to run it; VIPPROXY_BENCH_SERVICES sets other Service
// counts ("1000,10000"), VIPPROXY_BENCH_VARIANTS the variants (",legacy";
// "" is the system default), VIPPROXY_BENCH_LAYOUTS the layouts
// ("hairpin-set,chain-per-endpoint") and VIPPROXY_BENCH_CHUNK
// restoreChunkChains.
func BenchmarkKernelSync(b *testing.B) {
	if os.Getenv("VIPPROXY_BENCH") != "1" {
		b.Skip("set VIPPROXY_BENCH=1")
	}
	counts := []int{1000}
	if v := os.Getenv("VIPPROXY_BENCH_SERVICES"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				b.Fatalf("VIPPROXY_BENCH_SERVICES: %q is not a positive count", f)
			}
			counts = append(counts, n)
		}
	}
	if v := os.Getenv("VIPPROXY_BENCH_CHUNK"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("VIPPROXY_BENCH_CHUNK: %q is not a positive count", v)
		}
		old := restoreChunkChains
		restoreChunkChains = n
		b.Cleanup(func() { restoreChunkChains = old })
	}
	variants := []string{"", "legacy"}
	if v, ok := os.LookupEnv("VIPPROXY_BENCH_VARIANTS"); ok {
		variants = strings.Split(v, ",")
	}
	layouts := []string{"hairpin-set", "chain-per-endpoint"}
	if v, ok := os.LookupEnv("VIPPROXY_BENCH_LAYOUTS"); ok {
		layouts = strings.Split(v, ",")
	}
	for _, n := range counts {
		for _, variant := range variants {
			for _, layout := range layouts {
				b.Run(fmt.Sprintf("services=%d/variant=%s/layout=%s", n, variant, layout), func(b *testing.B) {
					kernelSync(b, n, variant, layout == "hairpin-set")
				})
			}
		}
	}
}

func kernelSync(b *testing.B, n int, variant string, sets bool) {
	ns := newNetns(b)
	p := kernelProxier(b, ns, variant, dataplanetest.BaseOptions(), nil)
	if !sets {
		p.sets = nil
	}
	p.opts.Families = []Family{IPv4}
	p.opts.FullSyncInterval = -1
	st := bigState(n, 10)
	alt := [2]*model.State{changeOne(st, n/2, 9001), changeOne(st, n/2, 9002)}
	start := time.Now()
	if err := p.Sync(context.Background(), st, true); err != nil {
		b.Fatal(err)
	}
	cold := time.Since(start)
	start = time.Now()
	if err := p.Sync(context.Background(), st, true); err != nil {
		b.Fatal(err)
	}
	warm := time.Since(start)
	p.opts.FullSyncInterval = time.Hour
	start = time.Now()
	if err := p.Sync(context.Background(), st, true); err != nil {
		b.Fatal(err)
	}
	verify := time.Since(start)
	start = time.Now()
	if err := p.canaryGone(context.Background()); err != "" {
		b.Fatal(err)
	}
	canary := time.Since(start)
	start = time.Now()
	if err := p.Verify(context.Background()); err != nil {
		b.Fatal(err)
	}
	drift := time.Since(start)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.Sync(context.Background(), alt[i%2], false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cold.Milliseconds()), "cold-full-ms")
	b.ReportMetric(float64(warm.Milliseconds()), "warm-full-ms")
	b.ReportMetric(float64(canary.Milliseconds()), "canary-check-ms")
	b.ReportMetric(float64(verify.Milliseconds()), "verified-full-ms")
	b.ReportMetric(float64(drift.Milliseconds()), "drift-check-ms")
	b.ReportMetric(float64(p.LastRestoreBytes()), "restore-bytes")
	start = time.Now()
	if err := p.Cleanup(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds()), "cleanup-ms")
}
