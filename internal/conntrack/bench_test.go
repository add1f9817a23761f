package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

// BenchmarkStale judges 10 flows per Service (one in ten stale) against a
// State of n UDP Services with 10 endpoints each.
func BenchmarkStale(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		st := &model.State{}
		var flows []Flow
		for i := 0; i < n; i++ {
			vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
			sp := &model.ServicePort{Protocol: model.UDP, ClusterIPs: []netip.Addr{vip}, Port: 53, NodePort: uint16(30000 + i%2768)}
			for e := 0; e < 10; e++ {
				ip := netip.AddrFrom4([4]byte{10, byte(1 + e), byte(i >> 8), byte(i)})
				sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: ip, Port: 5353, Ready: true, Serving: true})
				reply := ip
				if e == 0 {
					reply = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}) // gone
				}
				flows = append(flows, Flow{Family: model.IPv4, Protocol: ProtoUDP,
					OrigSrc:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 100, 0, byte(e)}), uint16(40000+i%20000)),
					OrigDst:  netip.AddrPortFrom(vip, 53),
					ReplySrc: netip.AddrPortFrom(reply, 5353)})
			}
			st.Ports = append(st.Ports, sp)
		}
		b.Run(fmt.Sprintf("services=%d/flows=%d", n, len(flows)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got := Stale(st, flows, StaleOptions{}); len(got) != n {
					b.Fatalf("%d stale, want %d", len(got), n)
				}
			}
		})
	}
}

// benchState returns a State of n UDP Services with 10 ready endpoints
// each, a ClusterIP and a NodePort.
func benchState(n int) *model.State {
	st := &model.State{Ports: make([]*model.ServicePort, 0, n)}
	for i := 0; i < n; i++ {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		sp := &model.ServicePort{Protocol: model.UDP, ClusterIPs: []netip.Addr{vip}, Port: 53, NodePort: uint16(30000 + i%2768)}
		for e := 0; e < 10; e++ {
			ip := netip.AddrFrom4([4]byte{10, byte(1 + e), byte(i >> 8), byte(i)})
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: ip, Port: 5353, Ready: true, Serving: true})
		}
		st.Ports = append(st.Ports, sp)
	}
	return st
}

// BenchmarkReconcile measures the AfterSync hook at 10,000 UDP Services
// with an empty conntrack table: "unchanged" passes the same State again,
// "oneChanged" alternates between two States that differ in one
// ServicePort (a new pointer with other endpoints), as model.Builder
// produces after a change to one Service.
func BenchmarkReconcile(b *testing.B) {
	const n = 10000
	a := benchState(n)
	other := *a.Ports[n/2]
	other.Endpoints = append([]model.Endpoint(nil), other.Endpoints[1:]...)
	c := &model.State{Ports: append([]*model.ServicePort(nil), a.Ports...)}
	c.Ports[n/2] = &other
	ctx := context.Background()
	for _, bc := range []struct {
		name   string
		states []*model.State
	}{
		{"services=10000/unchanged", []*model.State{a}},
		{"services=10000/oneChanged", []*model.State{a, c}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			fake := &Fake{}
			r := &Reconciler{Table: fake}
			if err := r.Reconcile(ctx, bc.states[len(bc.states)-1]); err != nil {
				b.Fatal(err)
			}
			lists := fake.Lists
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := r.Reconcile(ctx, bc.states[i%len(bc.states)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if fake.Lists == lists {
				b.Fatal("the table was never listed")
			}
		})
	}
}
