package nftables

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/cpustat"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

// benchServices returns the Service counts of a kernel benchmark:
// $VIPPROXY_BENCH_SERVICES ("10000,50000") or def.
func benchServices(b *testing.B, def ...int) []int {
	v := os.Getenv("VIPPROXY_BENCH_SERVICES")
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			b.Fatalf("VIPPROXY_BENCH_SERVICES: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkKernelRestart measures the first sync of a restarted proxier
// over tables a previous one wrote (Services × 10 endpoints in a network
// namespace; needs root), from the build to the transaction: "digest",
// both digests and the names match and nothing is written; "chains", the
// element digest matches but the table has no rules digest (the release
// before), so the chains are flushed and refilled in one transaction;
// "legacy", the element digest is the one of releases before wire form
// (legacyDigest), so the restart renders every element to compare it and
// rewrites it; "dump", the table has no element digest (older releases),
// so every map is dumped and compared;
// "rebuild", the tables are deleted and re-created in one nft
// transaction (every restart before adoption).
func BenchmarkKernelRestart(b *testing.B) {
	for _, n := range benchServices(b, 10000) {
		st := scaleState(n, 10)
		for _, kind := range []string{"digest", "chains", "legacy", "dump", "rebuild"} {
			b.Run(fmt.Sprintf("services=%d/%s", n, kind), func(b *testing.B) {
				ns := newNetns(b, "brestart")
				ctx := context.Background()
				first := kernelProxier(b, ns)
				o := dataplanetest.BaseOptions()
				o.Logger = quietLogger()
				if err := first.Sync(ctx, st, true); err != nil {
					b.Fatal(err)
				}
				var tr Transport = &NFT{Netns: ns}
				if kind == "rebuild" {
					tr = struct{ Transport }{tr} // neither reads tables nor fills maps over netlink
				}
				cpu0 := cpustat.Process()
				for b.Loop() {
					if set := map[string]string{"dump": digestSet, "chains": rulesDigestSet}[kind]; set != "" {
						b.StopTimer()
						nsNft(b, ns, "flush set ip vipproxy "+set+"; flush set ip6 vipproxy "+set)
						b.StartTimer()
					}
					if kind == "legacy" {
						b.StopTimer()
						cmd := ""
						for _, f := range families {
							cmd += fmt.Sprintf("flush set %s vipproxy %s; add element %[1]s vipproxy %[2]s { %s }; ", f, digestSet, legacyDigest(f, first.applied[f]).key())
						}
						nsNft(b, ns, cmd)
						b.StartTimer()
					}
					p, err := New(o, tr)
					if err != nil {
						b.Fatal(err)
					}
					if err := p.Sync(ctx, st, true); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpustat.Process()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// BenchmarkKernelColdStart measures a cold start (Services × 10 endpoints
// into a namespace without vipproxy's tables; needs root): the build, the
// nft transaction creating the tables, the element batches over netlink
// and the hooks. cpu-ms/op is the test process's CPU (nft's is not in it).
func BenchmarkKernelColdStart(b *testing.B) {
	for _, n := range benchServices(b, 10000) {
		st := scaleState(n, 10)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := newNetns(b, "bcold")
			ctx := context.Background()
			o := dataplanetest.BaseOptions()
			o.Logger = quietLogger()
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				nsNft(b, ns, "flush ruleset")
				runtime.GC()
				b.StartTimer()
				cpu0 := cpustat.Process()
				p, err := New(o, &NFT{Netns: ns})
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Sync(ctx, st, true); err != nil {
					b.Fatal(err)
				}
				cpu += cpustat.Process() - cpu0
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
