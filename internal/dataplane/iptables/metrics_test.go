package iptables

// Tests of the mode's metrics and the sysctl-driven invalid-packet drop.

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g *prometheus.GaugeVec, table string, fam Family) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.WithLabelValues(table, fam.metricLabel()).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestRulesTotalMetric: sync_proxy_rules_iptables_total counts the rules
// in vipproxy's chains per table and ip_family, as kube-proxy's; a first
// (full) sync writes them all (sync_proxy_rules_iptables_last), a sync of
// an unchanged State none.
func TestRulesTotalMetric(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	for i, st := range []*model.State{bigState(3, 2), changeOne(bigState(3, 2), 1, 9000), bigState(1, 1)} {
		if err := p.Sync(ctx, st, false); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{TableNAT, TableFilter} {
			for _, fam := range []Family{IPv4, IPv6} {
				want := strings.Count(f.Dump(fam, table), "\n-A VIP-")
				if got := gaugeValue(t, metrics.IptablesRulesTotal, table, fam); got != float64(want) {
					t.Errorf("%s %s rules gauge = %v, want %d (rules in VIP- chains)", table, fam, got, want)
				}
				if last := gaugeValue(t, metrics.IptablesRulesLast, table, fam); i == 0 && last == 0 {
					t.Errorf("%s %s: the first sync wrote no rules by the metric", table, fam)
				}
			}
		}
	}
	st := bigState(1, 1)
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if last := gaugeValue(t, metrics.IptablesRulesLast, TableNAT, IPv4); last != 0 {
		t.Errorf("a sync of an unchanged State wrote %v rules by the metric, want 0", last)
	}
}

// TestFullSyncInterval: full=true soon after a full restore only checks
// the kernel (canaries, shared chain rule counts, jump rules) and writes
// nothing when all is in place; tampering or the interval passing makes it
// a real full restore.
func TestFullSyncInterval(t *testing.T) {
	f := NewFake()
	p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: f, Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1000, 0)
	p.now = func() time.Time { return clock }
	st := bigState(4, 2)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	want := dumpAll(f)
	restores, saves := len(f.Restores), f.Calls["save"]
	clock = clock.Add(30 * time.Second)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if len(f.Restores) != restores || f.Calls["save"] != saves {
		t.Fatalf("full=true within the interval on an intact ruleset wrote %d restores, %d saves", len(f.Restores)-restores, f.Calls["save"]-saves)
	}
	for _, tc := range []struct{ name, table, data string }{
		{"filter VIP-SERVICES flushed", TableFilter, "*filter\n-F VIP-SERVICES\nCOMMIT\n"},
		{"nat jump deleted", TableNAT, "*nat\n-D PREROUTING 1\nCOMMIT\n"},
		{"rule inserted before jumps", TableFilter, "*filter\n-I FORWARD 1 -j ACCEPT\nCOMMIT\n"},
	} {
		if err := f.Restore(ctx, IPv4, tc.table, []byte(tc.data)); err != nil {
			t.Fatal(err)
		}
		saves := f.Calls["save"]
		if err := p.Sync(ctx, st, true); err != nil {
			t.Fatal(err)
		}
		if f.Calls["save"] == saves {
			t.Errorf("%s: not detected, no full restore", tc.name)
		}
		if tc.name == "rule inserted before jumps" {
			if err := f.Restore(ctx, IPv4, TableFilter, []byte("*filter\n-D FORWARD -j ACCEPT\nCOMMIT\n")); err != nil {
				t.Fatal(err)
			}
		}
		if diff := cmp.Diff(want, dumpAll(f)); diff != "" {
			t.Errorf("%s: not repaired:\n%s", tc.name, diff)
		}
	}
	saves = f.Calls["save"]
	clock = clock.Add(2 * time.Hour)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if f.Calls["save"] == saves {
		t.Errorf("full=true after the interval did not do a full restore")
	}
}

func TestInvalidDropFollowsSysctl(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name   string
		sysctl string
		err    error
		force  *bool
		want   bool
	}{
		{"not liberal", "0", nil, nil, true},
		{"liberal", "1", nil, nil, false},
		{"unreadable", "", os.ErrNotExist, nil, true},
		{"forced off", "0", nil, &no, false},
		{"forced on", "1", nil, &yes, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			fs := &sysctl.Fake{Values: map[string]string{}} // unreadable: missing
			if tc.err == nil {
				fs.Values["/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"] = tc.sysctl
			}
			p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: f, DropInvalid: tc.force, Sysctl: fs})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Sync(ctx, &model.State{}, true); err != nil {
				t.Fatal(err)
			}
			got := strings.Contains(f.Dump(IPv4, TableFilter), "-A VIP-FORWARD -m conntrack --ctstate INVALID -j DROP")
			if got != tc.want {
				t.Errorf("INVALID drop installed = %v, want %v", got, tc.want)
			}
		})
	}
}
