package ipvs

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/metrics"
)

func fallbacks(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.ModeFallbacks.WithLabelValues("ipvs", "iptables").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// warnings returns the WARN records of a text log.
func warnings(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") {
			out = append(out, l)
		}
	}
	return out
}

func TestNew(t *testing.T) {
	noSched := func(call string) error {
		if call == "AddService" {
			return errors.New("no such file or directory")
		}
		return nil
	}
	noIPSet := func(string) error { return errors.New(`exec: "ipset": executable file not found in $PATH`) }
	cases := []struct {
		name        string
		kernelFail  func(string) error
		ipsetFail   func(string) error
		leftover    bool
		wantMode    string
		wantMissing []string
	}{
		{name: "usable", wantMode: "ipvs"},
		{name: "probe server left by a crash", leftover: true, wantMode: "ipvs"},
		{name: "scheduler module missing", kernelFail: noSched, wantMode: "iptables", wantMissing: []string{"cannot create a virtual server with scheduler", "ip_vs_sed"}},
		{name: "ipset missing", ipsetFail: noIPSet, wantMode: "iptables", wantMissing: []string{"ipset is not usable", "executable file not found"}},
		{name: "both missing", kernelFail: noSched, ipsetFail: noIPSet, wantMode: "iptables", wantMissing: []string{"ip_vs_sed", "ipset is not usable"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := &FakeKernel{}
			if tc.leftover {
				if err := k.AddService(VirtualServer{ServiceKey: ProbeService, Scheduler: "rr"}); err != nil {
					t.Fatal(err)
				}
				k.Calls()
			}
			k.Fail = tc.kernelFail
			sets := &FakeIPSet{Fail: tc.ipsetFail}
			var logs bytes.Buffer
			o := Options{Options: dataplanetest.BaseOptions(), Kernel: k, IPSet: sets, Runner: iptables.NewFake(),
				Addrs: &FakeAddrs{}, Sysctl: FakeSysctl(), IPTables: iptables.Options{Runner: iptables.NewFake()}}
			o.Scheduler = "sed"
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			before := fallbacks(t)
			dp, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			if dp.Mode() != tc.wantMode {
				t.Fatalf("Mode() = %q, want %q", dp.Mode(), tc.wantMode)
			}
			warns := warnings(logs.String())
			if tc.wantMode == "ipvs" {
				if len(warns) != 0 || fallbacks(t) != before {
					t.Errorf("no fallback expected; warnings %q, metric %v -> %v", warns, before, fallbacks(t))
				}
				if d := k.Dump(); d != "" {
					t.Errorf("probe left virtual servers:\n%s", d)
				}
				if _, ok := dp.(*Proxier); !ok {
					t.Errorf("got %T, want *Proxier", dp)
				}
				return
			}
			if _, ok := dp.(*iptables.Proxier); !ok {
				t.Errorf("got %T, want *iptables.Proxier", dp)
			}
			if len(warns) != 1 {
				t.Fatalf("want exactly one warning, got %d:\n%s", len(warns), logs.String())
			}
			for _, s := range append([]string{"falling back to iptables", "requested=ipvs", "running=iptables"}, tc.wantMissing...) {
				if !strings.Contains(warns[0], s) {
					t.Errorf("warning lacks %q: %s", s, warns[0])
				}
			}
			if got := fallbacks(t) - before; got != 1 {
				t.Errorf("fallback metric rose by %v, want 1", got)
			}
		})
	}
}

func TestProbeCallsAreHarmless(t *testing.T) {
	k := &FakeKernel{}
	sets := &FakeIPSet{}
	if errs := Probe(ctx, k, sets, "nq"); errs != nil {
		t.Fatal(errs)
	}
	want(t, "kernel calls", k.Calls(), []string{"AddService TCP/192.0.2.254:1 nq", "DelService TCP/192.0.2.254:1"})
	want(t, "ipset scripts", sets.Scripts(), []string{"create VIPVS-PROBE hash:ip,port family inet -exist\ndestroy VIPVS-PROBE\n"})
	names, _ := sets.List(ctx)
	want(t, "sets left", len(names), 0)
}
