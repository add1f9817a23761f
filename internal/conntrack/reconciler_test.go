package conntrack

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

func TestReconcilerWithFake(t *testing.T) {
	st := testState()
	keep4 := flow(ProtoUDP, "10.1.0.1:1", "10.96.0.10:53", "10.0.0.1:5353")
	stale4 := flow(ProtoUDP, "10.1.0.1:2", "10.96.0.10:53", "10.0.0.9:5353")
	staleEmpty := flow(ProtoUDP, "10.1.0.1:3", "10.96.0.20:53", "10.0.0.1:5353")
	tcp := flow(ProtoTCP, "10.1.0.1:4", "10.96.0.10:53", "10.0.0.9:5353")
	keep6 := flow(ProtoUDP, "[fd00:1::1]:1", "[fd00:96::10]:53", "[fd00::1]:53")
	stale6 := flow(ProtoUDP, "[fd00:1::1]:2", "[fd00:96::10]:53", "[fd00::9]:53")
	fake := &Fake{}
	fake.Add(keep4, stale4, staleEmpty, tcp, keep6, stale6)

	before4 := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4"))
	before6 := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv6"))
	beforeObs := histogramCount(t, metrics.ConntrackReconcileDuration.WithLabelValues("IPv4").(prometheus.Histogram))

	r := &Reconciler{Table: fake}
	if err := r.Reconcile(context.Background(), st); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if got, want := fake.Flows(), []Flow{keep4, tcp, keep6}; !slices.Equal(got, want) {
		t.Errorf("left %v\nwant %v", got, want)
	}
	if d := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4")) - before4; d != 2 {
		t.Errorf("deleted_entries{ip_family=4} grew by %v, want 2", d)
	}
	if d := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv6")) - before6; d != 1 {
		t.Errorf("deleted_entries{ip_family=6} grew by %v, want 1", d)
	}
	if d := histogramCount(t, metrics.ConntrackReconcileDuration.WithLabelValues("IPv4").(prometheus.Histogram)) - beforeObs; d != 1 {
		t.Errorf("reconcile duration observed %d times, want 1", d)
	}

	// Level-triggered: a second round deletes nothing more and does no Delete call.
	deletes := fake.Deletes
	if err := r.Reconcile(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if fake.Deletes != deletes || len(fake.Flows()) != 3 {
		t.Errorf("second round: deletes %d→%d, flows %v", deletes, fake.Deletes, fake.Flows())
	}

	// No UDP/SCTP port: nothing listed at all.
	lists := fake.Lists
	tcpOnly := &model.State{Ports: []*model.ServicePort{port("web", model.TCP, "10.96.0.60", 80, 0)}}
	if err := r.Reconcile(context.Background(), tcpOnly); err != nil {
		t.Fatal(err)
	}
	if fake.Lists != lists {
		t.Errorf("listed the table for a TCP-only State")
	}
}

func TestReconcilerErrors(t *testing.T) {
	st := testState()
	stale6 := flow(ProtoUDP, "[fd00:1::1]:2", "[fd00:96::10]:53", "[fd00::9]:53")
	stale4 := flow(ProtoUDP, "10.1.0.1:2", "10.96.0.10:53", "10.0.0.9:5353")

	listErr := errors.New("netlink says no")
	fake := &Fake{ListErr: listErr}
	fake.Add(stale4)
	err := (&Reconciler{Table: fake}).Reconcile(context.Background(), st)
	if !errors.Is(err, listErr) {
		t.Errorf("list failure: err = %v", err)
	}
	if fake.Lists != 2 {
		t.Errorf("a failing family must not stop the other: %d lists", fake.Lists)
	}

	delErr := errors.New("delete refused")
	fake = &Fake{DeleteErr: delErr}
	fake.Add(stale4, stale6)
	err = (&Reconciler{Table: fake, Families: []model.AddressType{model.IPv4}}).Reconcile(context.Background(), st)
	if !errors.Is(err, delErr) {
		t.Errorf("delete failure: err = %v", err)
	}
	if fake.Lists != 1 {
		t.Errorf("Families not honoured: %d lists", fake.Lists)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fake = &Fake{}
	if err := (&Reconciler{Table: fake}).Reconcile(ctx, st); !errors.Is(err, context.Canceled) || fake.Lists != 0 {
		t.Errorf("cancelled ctx: err %v, lists %d", err, fake.Lists)
	}
	if err := (&Reconciler{}).Reconcile(context.Background(), st); err == nil {
		t.Errorf("nil Table accepted")
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
