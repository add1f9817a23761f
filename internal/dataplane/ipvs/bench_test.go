//go:build linux

package ipvs

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// benchState returns n ClusterIP+NodePort Services of 10 endpoints each;
// bump changes one endpoint of Service 0.
func benchState(n int, bump int) *model.State {
	var ports []*model.ServicePort
	for i := 0; i < n; i++ {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		sp := dataplanetest.Port(fmt.Sprintf("default/s%05d", i), "", model.TCP, 80, vip.String())
		if i < 2768 {
			sp.Type = model.TypeNodePort
			sp.NodePort = uint16(30000 + i)
		}
		for e := 0; e < 10; e++ {
			ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 4), byte((i%16)*16 + e)})
			port := uint16(8080)
			if i == 0 && e == 0 {
				port += uint16(bump)
			}
			sp.Endpoints = append(sp.Endpoints, dataplanetest.EP(ip.String(), port, e%3 == 0))
		}
		ports = append(ports, dataplanetest.Fill(sp))
	}
	return dataplanetest.NewState(ports...)
}

// BenchmarkSync measures the proxier's own work per Sync over the fakes
// (no kernel): a full sync of n Services and a partial sync after one
// endpoint change.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, full := range []bool{true, false} {
			name := fmt.Sprintf("services=%d/partial", n)
			if full {
				name = fmt.Sprintf("services=%d/full", n)
			}
			b.Run(name, func(b *testing.B) {
				k := &FakeKernel{}
				o := Options{Options: dataplanetest.BaseOptions(), Kernel: k, IPSet: &ipset.Fake{}, Runner: iptables.NewFake(),
					Addrs: &FakeAddrs{}, Sysctl: FakeSysctl(), Families: []iptables.Family{iptables.IPv4}}
				o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
				p, err := NewProxier(o)
				if err != nil {
					b.Fatal(err)
				}
				states := []*model.State{benchState(n, 0), benchState(n, 1)}
				if err := p.Sync(ctx, states[0], true); err != nil {
					b.Fatal(err)
				}
				k.Calls()
				var ru0, ru1 syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := p.Sync(ctx, states[(i+1)%2], full); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
				cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
				b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
				if !full {
					b.ReportMetric(float64(len(k.Calls()))/float64(b.N), "kernel-writes/op")
				}
			})
		}
	}
}
