package ipvs

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
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
			sets := &ipset.Fake{Fail: tc.ipsetFail}
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
	sets := &ipset.Fake{}
	if errs := Probe(ctx, k, sets, "nq"); errs != nil {
		t.Fatal(errs)
	}
	want(t, "kernel calls", k.Calls(), []string{"AddService TCP/192.0.2.254:1 nq", "DelService TCP/192.0.2.254:1"})
	want(t, "ipset scripts", sets.Scripts(), []string{"create VIPVS-PROBE hash:ip,port family inet -exist\ndestroy VIPVS-PROBE\n"})
	names, _ := sets.List(ctx)
	want(t, "sets left", len(names), 0)
}

// TestDestroyKubeProxySetsRetriesInUse: a set the kernel still holds
// (nf_tables frees deleted rules asynchronously) is retried until it can
// be destroyed; other failures, and a set held past the retry time, are
// errors; vipproxy's own sets are never touched.
func TestDestroyKubeProxySetsRetriesInUse(t *testing.T) {
	defer func(r, p time.Duration) { ipset.InUseRetry, ipset.InUsePause = r, p }(ipset.InUseRetry, ipset.InUsePause)
	ipset.InUseRetry, ipset.InUsePause = 200*time.Millisecond, time.Millisecond
	inUse := errors.New("ipset v7.17: Error in line 1: Set cannot be destroyed: it is in use by a kernel component")
	for _, tc := range []struct {
		name      string
		failures  int   // restores that fail before one succeeds
		err       error // what they fail with
		wantErr   bool
		wantTries int
	}{
		{"free at once", 0, nil, false, 1},
		{"held for a while", 3, inUse, false, 4},
		{"held past the retry time", 1 << 30, inUse, true, -1},
		{"another failure", 1, errors.New("ipset: permission denied"), true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries := 0
			sets := &ipset.Fake{}
			script := "create KUBE-CLUSTER-IP hash:ip,port family inet\ncreate KUBE-LOOP-BACK hash:ip,port,ip family inet\ncreate VIPVS-OWN hash:ip family inet\n"
			if err := sets.Restore(context.Background(), []byte(script)); err != nil {
				t.Fatal(err)
			}
			sets.Fail = func(string) error {
				if tries++; tries <= tc.failures {
					return tc.err
				}
				return nil
			}
			gone, _, err := destroyKubeProxySets(context.Background(), sets)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantTries > 0 && tries != tc.wantTries {
				t.Errorf("%d restores, want %d", tries, tc.wantTries)
			}
			left, _ := sets.List(context.Background())
			if !slices.Contains(left, "VIPVS-OWN") {
				t.Errorf("sets left %v: vipproxy's own set was destroyed", left)
			}
			if !tc.wantErr && (len(gone) != 2 || slices.ContainsFunc(left, func(n string) bool { return strings.HasPrefix(n, "KUBE-") })) {
				t.Errorf("destroyed %v, left %v; want both KUBE- sets gone", gone, left)
			}
		})
	}
}
