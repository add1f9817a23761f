package nftables

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/cpustat"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

// TestVerifyFake: after every scenario's sync, in sequence and partial,
// Verify finds no drift; removing one element or one rule from the fake
// is drift.
func TestVerifyFake(t *testing.T) {
	ctx := context.Background()
	tr := NewFakeTransport()
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, tr)
	if err != nil {
		t.Fatal(err)
	}
	for i, sc := range dataplanetest.Scenarios() {
		if err := p.Sync(ctx, dataplanetest.NewState(sc.Ports...), i == 0); err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if err := p.Verify(ctx); err != nil {
			t.Fatalf("%s: Verify right after a sync: %v", sc.Name, err)
		}
	}
	if err := p.Sync(ctx, allScenarioPorts(), true); err != nil {
		t.Fatal(err)
	}
	tr.Fake.Lock()
	tbl := tr.Fake.Tables["ip"][TableName]
	m := tbl.Maps[mapServiceIPs]
	m.Elements = m.Elements[1:]
	tr.Fake.Unlock()
	if err := p.Verify(ctx); !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), mapServiceIPs) {
		t.Fatalf("Verify after deleting an element: %v, want drift naming %s", err, mapServiceIPs)
	}
	if err := p.Sync(ctx, allScenarioPorts(), true); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatalf("Verify after the repairing full sync: %v", err)
	}
}

// TestVerifyLargeMapsExistOnly: a map with more than maxVerifiedElems
// elements is not counted (its dump would be quadratic), only required to
// exist; smaller ones still are.
func TestVerifyLargeMapsExistOnly(t *testing.T) {
	ctx := context.Background()
	p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := p.Sync(ctx, allScenarioPorts(), true); err != nil {
		t.Fatal(err)
	}
	big := p.applied["ip"].elems[mapServiceIPs].Len()
	defer func(old int) { maxVerifiedElems = old }(maxVerifiedElems)
	maxVerifiedElems = big - 1
	tr.Fake.Lock()
	tbl := tr.Fake.Tables["ip"][TableName]
	tbl.Maps[mapServiceIPs].Elements = tbl.Maps[mapServiceIPs].Elements[1:]
	tr.Fake.Unlock()
	if err := p.Verify(ctx); err != nil {
		t.Errorf("Verify counted a map over the limit: %v", err)
	}
	maxVerifiedElems = big
	if err := p.Verify(ctx); !errors.Is(err, dataplane.ErrDrift) {
		t.Errorf("Verify at the limit: %v, want drift", err)
	}
	maxVerifiedElems = big - 1
	tr.Fake.Lock()
	delete(tbl.Maps, mapServiceIPs)
	tr.Fake.Unlock()
	if err := p.Verify(ctx); !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Verify with the large map deleted: %v, want drift (missing)", err)
	}
}

// TestKernelVerify: against the kernel, Verify sees no drift after full
// and partial syncs, and sees one deleted map element and one deleted
// rule; a full sync repairs both.
func TestKernelVerify(t *testing.T) {
	ns := newNetns(t, "verify")
	ctx := context.Background()
	p := kernelProxier(t, ns)
	st := allScenarioPorts()
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatalf("Verify after the first sync: %v", err)
	}
	for i, sc := range dataplanetest.Scenarios() {
		if err := p.Sync(ctx, dataplanetest.NewState(sc.Ports...), false); err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if err := p.Verify(ctx); err != nil {
			t.Fatalf("scenario %d %s: Verify after a partial sync: %v", i, sc.Name, err)
		}
	}
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	tamper := []struct {
		name string
		do   func()
		want string
	}{
		{"one map element", func() { nsNft(t, ns, "delete element ip vipproxy service-ips { 10.96.0.10 . tcp . 80 }") }, "service-ips"},
		{"one rule", func() {
			out := nsNft(t, ns, "-a", "list chain ip vipproxy int-cluster-tcp-3")
			h := regexp.MustCompile(`# handle (\d+)`).FindAllStringSubmatch(out, -1)
			if len(h) < 2 {
				t.Fatalf("no rule handle in:\n%s", out)
			}
			nsNft(t, ns, "delete rule ip vipproxy int-cluster-tcp-3 handle "+h[len(h)-1][1])
		}, "int-cluster-tcp-3"},
	}
	for _, tc := range tamper {
		tc.do()
		err := p.Verify(ctx)
		if !errors.Is(err, dataplane.ErrDrift) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s deleted: Verify = %v, want drift naming %s", tc.name, err, tc.want)
		}
		t.Logf("%s deleted: %v", tc.name, err)
		if err := p.Sync(ctx, st, true); err != nil {
			t.Fatal(err)
		}
		if err := p.Verify(ctx); err != nil {
			t.Fatalf("after the repairing full sync: %v", err)
		}
	}
}

// BenchmarkKernelVerify measures the drift check against the kernel at
// 1,000 and 10,000 Services × 10 endpoints (VIPPROXY_BENCH_SERVICES: other
// counts) (a real table in a network
// namespace; needs root), beside the one-endpoint partial sync it saves
// and the full rewrite it replaces, from the same run.
func BenchmarkKernelVerify(b *testing.B) {
	for _, n := range benchServices(b, 1000, 10000) {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := newNetns(b, "bverify")
			ctx := context.Background()
			p := kernelProxier(b, ns)
			st := scaleState(n, 10)
			if err := p.Sync(ctx, st, true); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := p.Sync(ctx, st, true); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "full-sync-ms")
			cpu0 := cpustat.Process()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := p.Verify(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpustat.Process()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
