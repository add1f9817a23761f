//go:build linux

package bench

import (
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Target
		wantErr bool
	}{
		{in: "vipproxy/nftables", want: Target{Proxy: "vipproxy", Mode: "nftables"}},
		{in: "vipproxy-api/iptables", want: Target{Proxy: "vipproxy", API: true, Mode: "iptables"}},
		{in: "kube-proxy/nftables", want: Target{Proxy: "kube-proxy", API: true, Mode: "nftables"}},
		{in: "kube-proxy/userspace", wantErr: true},
		{in: "vipproxy", wantErr: true},
		{in: "envoy/nftables", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTarget(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && (got != tc.want || got.String() != tc.in) {
				t.Errorf("got %+v (%s), want %+v", got, got, tc.want)
			}
		})
	}
}

func TestSetLayout(t *testing.T) {
	cluster := netip.MustParsePrefix(ClusterCIDR)
	service := netip.MustParsePrefix(ServiceCIDR)
	for _, tc := range []struct {
		name    string
		set     *Set
		changes int
	}{
		{"small", NewSet(50, 10, 5), 5},
		{"changes capped", NewSet(5, 3, 50), 4},
		{"large", NewSet(50000, 10, 50), 50},
		{"largest", NewSet(MaxN, 2, 50), 50},
		{"base", BaseSet(10), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.set
			if len(s.Changes) != tc.changes {
				t.Errorf("%d changes, want %d", len(s.Changes), tc.changes)
			}
			if s.IsChange(s.N-1) || !s.Real(s.N-1) {
				t.Errorf("last Service must be real and never a change target")
			}
			seen := map[string]bool{}
			for i := 0; i < s.N; i++ {
				ip := netip.MustParseAddr(s.ClusterIP(i))
				if !service.Contains(ip) || seen[ip.String()] || ip == netip.MustParseAddr("10.96.0.1") {
					t.Fatalf("Service %d: ClusterIP %s duplicate or outside %s", i, ip, service)
				}
				seen[ip.String()] = true
				sl := s.Slice(i, false)
				if len(sl.Endpoints) != s.M {
					t.Fatalf("Service %d: %d endpoints, want %d", i, len(sl.Endpoints), s.M)
				}
				for _, ep := range sl.Endpoints {
					if a := netip.MustParseAddr(ep.Addresses[0]); !cluster.Contains(a) {
						t.Fatalf("Service %d: endpoint %s outside %s", i, a, cluster)
					}
				}
				wantPort := int32(BackendPort)
				if s.IsChange(i) {
					wantPort = DeadPort
				}
				if *sl.Ports[0].Port != wantPort || *s.Slice(i, true).Ports[0].Port != BackendPort {
					t.Fatalf("Service %d: ports dead %d live %d", i, *sl.Ports[0].Port, *s.Slice(i, true).Ports[0].Port)
				}
			}
			if len(s.Probes()) == 0 {
				t.Error("no probes")
			}
			if base := BaseSet(1); !s.Base && seen[base.ClusterIP(0)] {
				t.Errorf("ClusterIP %s is also the baseline set's", base.ClusterIP(0))
			}
		})
	}
}

func TestPct(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    int
		want time.Duration
	}{
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 4", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(make([]int, 0)...), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.in) == 0 {
				in := make([]time.Duration, 100)
				for i := range in {
					in[i] = time.Duration(i+1) * time.Millisecond
				}
				if got := pct(in, 99); got != 99*time.Millisecond {
					t.Errorf("p99 = %v, want 99ms", got)
				}
				return
			}
			if got := pct(tc.in, tc.p); got != tc.want {
				t.Errorf("pct(%v, %d) = %v, want %v", tc.in, tc.p, got, tc.want)
			}
		})
	}
}

func TestReadUsage(t *testing.T) {
	u, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.RSS < 1<<20 {
		t.Errorf("RSS %d bytes: implausibly small", u.RSS)
	}
	if _, err := ReadUsage(1 << 30); err == nil {
		t.Error("no error for a PID that does not exist")
	}
}

func TestLastSync(t *testing.T) {
	tests := []struct {
		name, text string
		want       float64
	}{
		{"none", "# HELP x\nx 1\n", 0},
		{"unlabelled", "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09\n", 1.7e9},
		{"per family, the larger", "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 100\n" +
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 250.5\n", 250.5},
		{"a longer name is another metric", "kubeproxy_sync_proxy_rules_last_timestamp_seconds_total 9\n", 0},
		{"comments are not samples", "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := lastSync(tc.text); got != tc.want {
				t.Errorf("lastSync = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStartHog(t *testing.T) {
	stop, err := startHog(2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	self, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	stop()
	// The hogs are waited-for children now: their CPU counts in
	// cutime+cstime.
	after, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.CPU-self.CPU < 100*time.Millisecond {
		t.Errorf("2 hogs for 300 ms added %v of CPU to their waited-for total, want at least 100 ms", after.CPU-self.CPU)
	}
}

func TestRatios(t *testing.T) {
	vip := Result{Target: Target{Proxy: "vipproxy", Mode: "nftables"}, N: 10, Cold: time.Second, ProgN: 1,
		ProgP50: time.Millisecond, ProgP99: 2 * time.Millisecond, RSS: 100, RSSSteady: 200, RSSIdle: 100, CPU: time.Second,
		Restart: Restart{Synced: 500 * time.Millisecond, Connects: 1}}
	kube := Result{Target: Target{Proxy: "kube-proxy", Mode: "nftables"}, N: 10, Cold: 100 * time.Second, ProgN: 1,
		ProgP50: 100 * time.Millisecond, ProgP99: 400 * time.Millisecond, RSS: 300, RSSSteady: 500, RSSIdle: 600, CPU: 2 * time.Second,
		Restart: Restart{Synced: 50 * time.Second, Connects: 1}}
	qs := Ratios([]Result{vip, kube})
	if len(qs) != 1 {
		t.Fatalf("%d ratios, want 1", len(qs))
	}
	want := []string{"10", "vipproxy/nftables", "kube-proxy/nftables", "100.0×", "100.0×", "200.0×", "3.0×", "2.0×", "2.5×", "6.0×", "100.0×"}
	if got := qs[0].row(); !slices.Equal(got, want) {
		t.Errorf("row = %q, want %q", got, want)
	}
}

// TestAnnotateHalf: with AnnotateHalf the probes split about evenly
// between annotated and plain Services, the Service objects carry the
// annotations exactly when Annotated says so, and without it every
// Service is annotated.
func TestAnnotateHalf(t *testing.T) {
	ann := map[string]string{"vipproxy.io/outlier-ejection": "on"}
	for _, tc := range []struct {
		name string
		n    int
		half bool
	}{
		{"small, half", 50, true},
		{"large, half", 10000, true},
		{"large, all", 10000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSet(tc.n, 2, 5)
			s.Annotations, s.AnnotateHalf = ann, tc.half
			on, off := 0, 0
			for _, i := range s.Probes() {
				if s.Annotated(i) {
					on++
				} else {
					off++
				}
			}
			// Change targets are not probes, so the halves may differ by a few.
			if tc.half && (min(on, off) == 0 || float64(min(on, off)) < 0.4*float64(on+off)) {
				t.Errorf("probes: %d annotated, %d plain; want an even split", on, off)
			}
			if !tc.half && off != 0 {
				t.Errorf("%d plain probes without AnnotateHalf", off)
			}
			for i := 0; i < s.N; i++ {
				if got := s.Service(i).Annotations["vipproxy.io/outlier-ejection"] == "on"; got != s.Annotated(i) {
					t.Fatalf("Service %d: annotated %v, Annotated says %v", i, got, s.Annotated(i))
				}
			}
		})
	}
}

// TestKeepStateDir: a restarted vipproxy gets its predecessor's state
// directory; a proxy without one is left alone.
func TestKeepStateDir(t *testing.T) {
	old := newProc("a", "ns", "log", "vipproxy", "--manifests", "m", "--state-dir", "/run-1/state", "--v", "2")
	next := newProc("a", "ns", "log", "vipproxy", "--manifests", "m", "--state-dir", "/run-1-restart/state", "--v", "2")
	keepStateDir(old, next)
	if next.Argv[4] != "/run-1/state" || next.Argv[6] != "2" {
		t.Errorf("restart argv %q, want the old state directory", next.Argv)
	}
	kp := newProc("k", "ns", "log", "kube-proxy", "--kubeconfig", "kc")
	kp2 := newProc("k", "ns", "log", "kube-proxy", "--kubeconfig", "kc2")
	keepStateDir(kp, kp2)
	if kp2.Argv[2] != "kc2" {
		t.Errorf("kube-proxy argv changed: %q", kp2.Argv)
	}
}
