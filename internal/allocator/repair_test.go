package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/model"
)

func TestRepairReleasesLeakAfterNPasses(t *testing.T) {
	ctx := context.Background()
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	// The writer and the repairer are different instances, like two hosts
	// (or a restart), so the writer's Assign calls do not mark names live.
	writer := newAssignerT(t, store)
	rep, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{v4CIDR}, LeakThreshold: 3})
	if err != nil {
		t.Fatal(err)
	}
	keep, err := writer.Assign(ctx, clusterIPSvc("default", "keep"))
	if err != nil {
		t.Fatal(err)
	}
	leak, err := writer.Assign(ctx, clusterIPSvc("default", "leak"))
	if err != nil {
		t.Fatal(err)
	}
	live := []model.ServiceName{keep.ServiceName}
	for pass := 1; pass <= 2; pass++ {
		res, err := rep.Repair(ctx, live)
		if err != nil {
			t.Fatal(err)
		}
		if res.Leaked[leak.ServiceName] != pass || len(res.Released) != 0 {
			t.Fatalf("pass %d: leaked=%v released=%v", pass, res.Leaked, res.Released)
		}
		if _, err := writer.Assign(ctx, clusterIPSvc("default", "other", leak.ClusterIPs[0].String())); err == nil {
			t.Fatalf("pass %d: leaked IP %v already free before %d passes", pass, leak.ClusterIPs[0], 3)
		}
	}
	res, err := rep.Repair(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Released, []model.ServiceName{leak.ServiceName}) {
		t.Fatalf("pass 3 released %v, want [default/leak]", res.Released)
	}
	if _, err := writer.Assign(ctx, clusterIPSvc("default", "other", leak.ClusterIPs[0].String())); err != nil {
		t.Fatalf("after release the IP must be free: %v", err)
	}
	list, _ := rep.List(ctx)
	if len(list) != 2 || list[0].Service.Name != "keep" || list[0].ClusterIPs[0] != keep.ClusterIPs[0] {
		t.Fatalf("live Service touched: %+v", list)
	}
}

// TestRepairRacingCreation: a Service whose record exists before the
// source lists it (created between passes) is never released.
func TestRepairRacingCreation(t *testing.T) {
	ctx := context.Background()
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	writer := newAssignerT(t, store)
	rep, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{v4CIDR}, LeakThreshold: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Pass 1: the record of "new" exists, the live list (taken earlier) lacks it.
	created, err := writer.Assign(ctx, clusterIPSvc("default", "new"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := rep.Repair(ctx, nil)
	if err != nil || res.Leaked[created.ServiceName] != 1 {
		t.Fatalf("pass 1: %+v %v", res, err)
	}
	// Pass 2 onwards: the Service appears; the count resets, nothing released.
	for pass := 2; pass <= 5; pass++ {
		res, err := rep.Repair(ctx, []model.ServiceName{created.ServiceName})
		if err != nil || len(res.Released) != 0 || len(res.Leaked) != 0 {
			t.Fatalf("pass %d: %+v %v", pass, res, err)
		}
	}
	// A single missing observation restarts from one, never accumulates.
	if res, _ := rep.Repair(ctx, nil); res.Leaked[created.ServiceName] != 1 || len(res.Released) != 0 {
		t.Fatalf("after a live streak the count must restart at 1: %+v", res)
	}

	// Same-instance race: Assign on the repairer itself between passes
	// marks the name live even when the list lags, at threshold 1.
	fast, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{v4CIDR}, LeakThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	racer, err := fast.Assign(ctx, clusterIPSvc("default", "racer"))
	if err != nil {
		t.Fatal(err)
	}
	res, err = fast.Repair(ctx, []model.ServiceName{created.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(res.Released, racer.ServiceName) {
		t.Fatalf("a Service assigned during the pass was released: %+v", res)
	}
	// With no further Assign the next pass does release it (threshold 1).
	res, err = fast.Repair(ctx, []model.ServiceName{created.ServiceName})
	if err != nil || !slices.Contains(res.Released, racer.ServiceName) {
		t.Fatalf("next pass: %+v %v", res, err)
	}
}

// TestRepairReportsInvalid: out-of-range and doubly held values are
// reported (result + metric) and left alone.
func TestRepairReportsInvalid(t *testing.T) {
	ctx := context.Background()
	store := openBoltT(t, filepath.Join(t.TempDir(), "a.db"))
	rep := newAssignerT(t, store)
	ip := netip.MustParseAddr("10.96.0.50")
	stray := netip.MustParseAddr("10.200.0.1")
	err := store.Update(ctx, func(m *Map) error {
		m.Set(svcName("a", "one"), Record{ClusterIPs: []netip.Addr{ip}, NodePorts: []PortAssignment{{Protocol: model.TCP, NodePort: 30500}}})
		m.Set(svcName("a", "two"), Record{ClusterIPs: []netip.Addr{ip}, NodePorts: []PortAssignment{{Protocol: model.TCP, NodePort: 30500}}})
		m.Set(svcName("a", "stray"), Record{ClusterIPs: []netip.Addr{stray}, NodePorts: []PortAssignment{{Protocol: model.TCP, NodePort: 80}}})
		// One Service holding one port for two of its ports and as its
		// health check port holds it once: not a duplicate.
		m.Set(svcName("a", "self"), Record{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.60")},
			NodePorts:           []PortAssignment{{Protocol: model.TCP, NodePort: 30600}, {Protocol: model.UDP, NodePort: 30600}},
			HealthCheckNodePort: 30600})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	before := metricValue(t, repairErrors.WithLabelValues("duplicate", "ip"))
	live := []model.ServiceName{svcName("a", "one"), svcName("a", "two"), svcName("a", "stray"), svcName("a", "self")}
	var res RepairResult
	for range 5 {
		if res, err = rep.Repair(ctx, live); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, inv := range res.Invalid {
		got = append(got, inv.String())
	}
	want := []string{
		"duplicate ip 10.96.0.50 held by a/one, a/two",
		"out_of_range ip 10.200.0.1 held by a/stray",
		"out_of_range port 80 held by a/stray",
		"duplicate port 30500 held by a/one, a/two",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("invalid:\n got %q\nwant %q", got, want)
	}
	if v := metricValue(t, repairInvalid.WithLabelValues("out_of_range", "ip")); v != 1 {
		t.Errorf("invalid_assignments{out_of_range,ip} = %v, want 1", v)
	}
	// Distinct values in range: 10.96.0.50 and .60; 30500 and 30600.
	if v := metricValue(t, allocated.WithLabelValues(v4CIDR.String())); v != 2 {
		t.Errorf("allocated{%s} = %v, want 2", v4CIDR, v)
	}
	if v := metricValue(t, allocated.WithLabelValues(rep.ports.String())); v != 2 {
		t.Errorf("allocated{%s} = %v, want 2", rep.ports, v)
	}
	if d := metricValue(t, repairErrors.WithLabelValues("duplicate", "ip")) - before; d != 5 {
		t.Errorf("repair_errors_total{duplicate,ip} grew by %v over 5 passes, want 5", d)
	}
	m, _ := store.Snapshot(ctx)
	for _, n := range live {
		if _, ok := m.Get(n); !ok {
			t.Errorf("%v removed; invalid records must be left alone", n)
		}
	}
	if r, _ := m.Get(svcName("a", "two")); r.ClusterIPs[0] != ip {
		t.Errorf("a/two reassigned to %v", r.ClusterIPs)
	}
}

// metricValue reads a gauge or counter.
func metricValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var pb dto.Metric
	if err := (<-ch).Write(&pb); err != nil {
		t.Fatal(err)
	}
	if pb.Gauge != nil {
		return pb.Gauge.GetValue()
	}
	return pb.Counter.GetValue()
}

// TestRepairManyLeaksOnEtcd: more leaks than one etcd transaction holds
// are released in chunks.
func TestRepairManyLeaksOnEtcd(t *testing.T) {
	te := startTestEtcd(t)
	ctx := context.Background()
	store := openEtcdT(t, te, "")
	writer := newAssignerT(t, store, netip.MustParsePrefix("10.96.0.0/20"))
	var svcs []model.Service
	for i := range 300 {
		svcs = append(svcs, clusterIPSvc("leak", fmt.Sprint(i)))
	}
	if _, errs := writer.AssignAll(ctx, ptrs(svcs)); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	// More than 127 changes in one Update is refused up front, not retried forever.
	err := store.Update(ctx, func(m *Map) error {
		for _, n := range m.Names() {
			m.Delete(n)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "at most 127 fit a transaction") {
		t.Fatalf("oversized update: %v", err)
	}
	rep, err := NewAssigner(AssignerOptions{Store: store, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/20")}, LeakThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rep.Repair(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Released) != 300 {
		t.Fatalf("released %d of 300", len(res.Released))
	}
	if m, _ := store.Snapshot(ctx); m.Len() != 0 {
		t.Fatalf("%d records left", m.Len())
	}
}
