package main

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestDrainer: when an endpoint leaves a port with reset-after, its TCP
// flows through the port are deleted after the grace period (and nothing
// else); an endpoint that comes back before it keeps its flows; a port
// without the annotation keeps them.
func TestDrainer(t *testing.T) {
	ap := netip.MustParseAddrPort
	ct := &conntrack.Fake{}
	d := newDrainer(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	d.table = func() (conntrack.Table, func(), error) { return ct, func() {}, nil }
	port := func(name string, grace time.Duration, eps ...string) *model.ServicePort {
		vip := map[string]string{"web": "10.96.0.10", "back": "10.96.0.12", "plain": "10.96.0.13"}[name]
		sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: name}, Protocol: model.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)}, Port: 80, DrainReset: grace}
		if name == "web" {
			sp.NodePort = 30080
		}
		for _, e := range eps {
			a := ap(e)
			sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: a.Addr(), Port: a.Port(), Ready: true})
		}
		return sp
	}
	flow := func(proto uint8, dst, ep string) conntrack.Flow {
		return conntrack.Flow{Family: model.IPv4, Protocol: proto, OrigSrc: ap("10.244.9.9:40000"), OrigDst: ap(dst), ReplySrc: ap(ep), ReplyDst: ap("10.244.9.9:40000")}
	}
	cut1 := flow(conntrack.ProtoTCP, "10.96.0.10:80", "10.244.1.5:8080")
	cut2 := flow(conntrack.ProtoTCP, "192.168.0.1:30080", "10.244.1.5:8080")
	keepUDP := flow(conntrack.ProtoUDP, "10.96.0.10:80", "10.244.1.5:8080")
	keepOther := flow(conntrack.ProtoTCP, "10.96.0.11:80", "10.244.1.5:8080") // another Service, same port number
	keepStays := flow(conntrack.ProtoTCP, "10.96.0.10:80", "10.244.1.6:8080")
	keepBack := flow(conntrack.ProtoTCP, "10.96.0.12:80", "10.244.1.7:8080")
	ct.Add(cut1, cut2, keepUDP, keepOther, keepStays, keepBack)

	ctx := context.Background()
	grace := 30 * time.Millisecond
	d.afterSync(ctx, &model.State{Ports: []*model.ServicePort{
		port("web", grace, "10.244.1.5:8080", "10.244.1.6:8080"), port("back", grace, "10.244.1.7:8080"), port("plain", 0, "10.244.1.8:8080")}})
	d.afterSync(ctx, &model.State{Ports: []*model.ServicePort{
		port("web", grace, "10.244.1.6:8080"), port("back", grace), port("plain", 0)}})
	d.afterSync(ctx, &model.State{Ports: []*model.ServicePort{
		port("web", grace, "10.244.1.6:8080"), port("back", grace, "10.244.1.7:8080"), port("plain", 0)}})
	if n := len(ct.Flows()); n != 6 {
		t.Fatalf("%d flows before the grace period ended, want 6", n)
	}
	time.Sleep(10 * grace)
	got := map[conntrack.Flow]bool{}
	for _, f := range ct.Flows() {
		got[f] = true
	}
	if got[cut1] || got[cut2] {
		t.Errorf("flows to the endpoint that left survived: %v", ct.Flows())
	}
	for _, f := range []conntrack.Flow{keepUDP, keepOther, keepStays, keepBack} {
		if !got[f] {
			t.Errorf("flow %v was cut", f)
		}
	}
}

// TestDrainerServiceGone: the endpoints of a drain-reset port whose
// Service is deleted count as left (their flows are cut after the grace
// period), also when the State counts its drained ports (none left).
func TestDrainerServiceGone(t *testing.T) {
	for _, counted := range []bool{false, true} {
		ap := netip.MustParseAddrPort
		ct := &conntrack.Fake{}
		d := newDrainer(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		d.table = func() (conntrack.Table, func(), error) { return ct, func() {}, nil }
		grace := 20 * time.Millisecond
		sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Protocol: model.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 80, DrainReset: grace,
			Endpoints: []model.Endpoint{{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080, Ready: true}}}
		ct.Add(conntrack.Flow{Family: model.IPv4, Protocol: conntrack.ProtoTCP, OrigSrc: ap("10.244.9.9:40000"), OrigDst: ap("10.96.0.10:80"),
			ReplySrc: ap("10.244.1.5:8080"), ReplyDst: ap("10.244.9.9:40000")})
		states := []*model.State{{Ports: []*model.ServicePort{sp}}, {}, {}}
		if counted {
			for _, st := range states {
				withUses(st)
			}
		}
		for _, st := range states {
			d.afterSync(context.Background(), st)
		}
		time.Sleep(10 * grace)
		if n := len(ct.Flows()); n != 0 {
			t.Errorf("counted=%v: %d flows of the deleted Service's endpoint survived", counted, n)
		}
	}
}
