//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// kubeProxyConfig is a KubeProxyConfiguration for the e2e bed in mode.
func kubeProxyConfig(mode string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clusterCIDR: 10.244.0.0/16,fd00:10:244::/48
healthzBindAddress: %s
metricsBindAddress: %s
nodePortAddresses: [192.168.77.0/24, "fd77::/64"]
iptables: {syncPeriod: 2s, minSyncPeriod: 100ms}
nftables: {syncPeriod: 2s, minSyncPeriod: 100ms}
`, mode, HealthzAddr, MetricsAddr)
}

// startWithConfig starts vipproxy on node (node1, b.vp[0]) with a
// KubeProxyConfiguration file in mode, which tests rewrite to reload it,
// and waits until it is healthy.
func (b *bed) startWithConfig(node *Node, mode string) (*Vipproxy, string) {
	b.t.Helper()
	cfgPath := filepath.Join(b.t.TempDir(), "kube-proxy.yaml")
	writeAtomic(b.t, cfgPath, kubeProxyConfig(mode))
	v := b.NewVipproxy(node, VipproxyOptions{Mode: mode, Manifests: b.dir, ExtraArgs: []string{"--config", cfgPath}})
	if err := v.Start(); err != nil {
		b.t.Fatal(err)
	}
	b.vp[0] = v
	if err := v.WaitHealthy(20 * time.Second); err != nil {
		b.t.Fatal(err)
	}
	return v, cfgPath
}

// writeAtomic replaces path the way an editor or a ConfigMap update does.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// metricValue returns the value of the first sample of name whose labels
// contain every given label pair, or an error.
func metricValue(ns, name string, labels ...string) (float64, error) {
	_, body, err := HTTPGet(ns, MetricsAddr, "/metrics")
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, line := range strings.Split(body, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(m[1], l) {
				ok = false
			}
		}
		if ok {
			return strconv.ParseFloat(m[2], 64)
		}
	}
	return 0, fmt.Errorf("metric %s%v not found", name, labels)
}

// metricSum returns the sum of every sample of name (0 if there is none).
func metricSum(ns, name string) (float64, error) {
	_, body, err := HTTPGet(ns, MetricsAddr, "/metrics")
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				return 0, fmt.Errorf("metric %s: %w", name, err)
			}
			sum += v
		}
	}
	return sum, nil
}

// TestConfigReloadSwitchesMode changes the mode by editing the --config
// file (nftables → iptables → nftables) while a client connects through a
// ClusterIP every 10 ms: no connection may fail, each switch leaves no
// trace of the old mode, and an invalid file is rejected with the field
// named while the running mode stays.
func TestConfigReloadSwitchesMode(t *testing.T) {
	t.Parallel()
	b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{}, Before: func(b *bed) {
		svc := Service("reload", "10.96.0.190", Port("http", TCP, 80, 8080))
		b.apply("reload.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
	}})
	node := b.node(1)
	v, cfgPath := b.startWithConfig(node, "nftables")
	client := b.Pod("pod1b").NS // a pod of node1, where vipproxy runs
	b.ready(client, "tcp", "10.96.0.190:80")

	// The client: one connection every 10 ms, bounded to 90 s.
	var tried, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			tried.Add(1)
			if _, err := DialWith(client, "tcp", "10.96.0.190:80", DialOptions{Timeout: 2 * time.Second}); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	proxyMode := func(want string) error {
		_, body, err := HTTPGet(node.NS, MetricsAddr, "/proxyMode")
		if err != nil {
			return err
		}
		if body != want {
			return fmt.Errorf("/proxyMode = %q, want %q", body, want)
		}
		return nil
	}
	gone := func(what string, args ...string) func() error {
		return func() error {
			out, _ := Exec(node.NS, args...)
			if strings.Contains(out, what) {
				return fmt.Errorf("%s still present after the switch", what)
			}
			return nil
		}
	}
	steps := []struct {
		mode string
		gone func() error
	}{
		{"iptables", gone("table ip vipproxy", "nft", "list", "tables")},
		{"nftables", gone("VIP-SERVICES", "iptables-save", "-t", "nat")},
	}
	for _, st := range steps {
		time.Sleep(time.Second) // let traffic flow in the current mode
		writeAtomic(t, cfgPath, kubeProxyConfig(st.mode))
		if took, err := eventually(30*time.Second, 100*time.Millisecond, func() error { return proxyMode(st.mode) }); err != nil {
			t.Fatalf("switch to %s: %v\n", st.mode, err)
		} else {
			t.Logf("switched to %s in %v", st.mode, took)
		}
		if _, err := eventually(20*time.Second, 200*time.Millisecond, st.gone); err != nil {
			t.Errorf("switch to %s: %v", st.mode, err)
		}
	}

	// A reload of a period alone is applied in place: no new dataplane.
	builds := strings.Count(v.Log(), "building a new dataplane")
	if builds != 2 {
		t.Errorf("%d dataplanes built for two mode switches, want 2", builds)
	}
	writeAtomic(t, cfgPath, strings.Replace(kubeProxyConfig("nftables"), "nftables: {syncPeriod: 2s", "nftables: {syncPeriod: 3s", 1))
	if _, err := eventually(10*time.Second, 200*time.Millisecond, func() error {
		if n, err := metricValue(node.NS, "vipproxy_config_reloads_total", `result="applied"`); err != nil || n != 3 {
			return fmt.Errorf("vipproxy_config_reloads_total{result=applied} = %v, %v; want 3", n, err)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if n := strings.Count(v.Log(), "building a new dataplane"); n != builds {
		t.Errorf("a reload of nftables.syncPeriod alone built a new dataplane (%d builds, were %d)", n, builds)
	}

	// An invalid file is rejected, named, and changes nothing.
	writeAtomic(t, cfgPath, strings.Replace(kubeProxyConfig("nftables"), "mode: nftables", "mode: bogus", 1))
	if _, err := eventually(10*time.Second, 200*time.Millisecond, func() error {
		if line, ok := logLine(v.Log(), "config reload rejected", "mode", "bogus"); !ok {
			return fmt.Errorf("no rejection naming the field in the log (last: %q)", line)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	time.Sleep(time.Second)
	if err := proxyMode("nftables"); err != nil {
		t.Errorf("after an invalid reload: %v", err)
	}
	if n, err := metricValue(node.NS, "vipproxy_config_reloads_total", `result="applied"`); err != nil || n != 3 {
		t.Errorf("vipproxy_config_reloads_total{result=applied} = %v, %v; want 3", n, err)
	}
	if n, err := metricValue(node.NS, "vipproxy_config_reloads_total", `result="rejected"`); err != nil || n != 1 {
		t.Errorf("vipproxy_config_reloads_total{result=rejected} = %v, %v; want 1", n, err)
	}

	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	t.Logf("%d connections during two mode switches, %d failed", tried.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d connections failed during the switches; first: %v", failed.Load(), tried.Load(), firstErr.Load())
	}
	if tried.Load() < 100 {
		t.Errorf("only %d connections tried; the test would prove little", tried.Load())
	}
}

// TestHealthCheckNodePortAndMetrics checks the healthCheckNodePort of a
// LoadBalancer Service with externalTrafficPolicy Local from the external
// client as its only endpoint moves between nodes, and the metrics that
// scenario leaves.
func TestHealthCheckNodePortAndMetrics(t *testing.T) {
	t.Parallel()
	const hcPort = 32190
	svc := Service("hc", "10.96.0.191", Port("http", TCP, 80, 8080))
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30191
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = hcPort
	b := newBed(t, modeSpecs["nftables"], bedOptions{Before: func(b *bed) {
		b.apply("hc.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a"))))
	}})
	probe := func(node *Node) (int, string) {
		code, body, err := HTTPGet(b.Client, vip(node.IPv4, hcPort), "/")
		if err != nil {
			return 0, err.Error()
		}
		return code, body
	}
	expect := func(step string, want1, want2 int) {
		t.Helper()
		if _, err := eventually(10*time.Second, 200*time.Millisecond, func() error {
			for k, want := range map[int]int{1: want1, 2: want2} {
				code, body := probe(b.node(k))
				if code != want {
					return fmt.Errorf("node%d: %d %s, want %d", k, code, body, want)
				}
				n := 0
				if want == 200 {
					n = 1
				}
				if !strings.Contains(body, fmt.Sprintf(`"localEndpoints":%d`, n)) || !strings.Contains(body, `"name":"hc"`) {
					return fmt.Errorf("node%d body %s", k, body)
				}
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}
	expect("endpoint on node1", 200, 503)
	b.apply("hc.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod2a"))))
	expect("endpoint moved to node2", 503, 200)

	ns := b.node(1).NS
	for _, m := range []struct {
		name   string
		labels []string
		check  func(float64) bool
	}{
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", nil, func(v float64) bool { return v > float64(time.Now().Add(-time.Hour).Unix()) }},
		{"kubeproxy_sync_proxy_rules_service_changes_total", nil, func(v float64) bool { return v >= 2 }},
		{"kubeproxy_sync_proxy_rules_duration_seconds_count", nil, func(v float64) bool { return v >= 2 }},
		{"kubeproxy_network_programming_duration_seconds_count", nil, func(v float64) bool { return v >= 2 }},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{`traffic_policy="external"`, `ip_family="IPv4"`}, func(v float64) bool { return v == 1 }},
		{"vipproxy_proxy_mode_info", []string{`mode="nftables"`}, func(v float64) bool { return v == 1 }},
		{"kubeproxy_proxy_healthz_total", nil, func(v float64) bool { return v >= 1 }},
	} {
		v, err := metricValue(ns, m.name, m.labels...)
		if err != nil || !m.check(v) {
			t.Errorf("%s%v = %v, %v", m.name, m.labels, v, err)
		}
	}
}

// --init-only applies what needs full root privileges (the conntrack
// settings, here tcp_be_liberal, which a network namespace has its own of)
// and exits 0 without programming anything, as kube-proxy's does.
func TestInitOnly(t *testing.T) {
	t.Parallel()
	RequireRoot(t)
	topo := NewTopology(t, TopologyOptions{PodsPerNode: 1})
	ns := topo.Nodes[0].NS
	if _, err := Exec(ns, "sysctl", "-w", "net.netfilter.nf_conntrack_tcp_be_liberal=0"); err != nil {
		t.Skipf("no per-namespace conntrack sysctls: %v", err)
	}
	out, err := Exec(ns, Binary(t), "--init-only", "--manifests", t.TempDir(), "--state-dir", t.TempDir(), "--conntrack-tcp-be-liberal")
	if err != nil {
		t.Fatalf("--init-only: %v\n%s", err, out)
	}
	if got, _ := Exec(ns, "sysctl", "-n", "net.netfilter.nf_conntrack_tcp_be_liberal"); strings.TrimSpace(got) != "1" {
		t.Errorf("tcp_be_liberal = %q after --init-only --conntrack-tcp-be-liberal, want 1", got)
	}
	if tables, _ := Exec(ns, "nft", "list", "tables"); strings.Contains(tables, "vipproxy") {
		t.Errorf("--init-only programmed rules:\n%s", tables)
	}
}
