package config

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustParse(t *testing.T, args ...string) *Config {
	t.Helper()
	c, err := Parse(args, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("Parse(%q): %v", args, err)
	}
	return c
}

// TestDefaults pins kube-proxy v1.34's defaults (and vipproxy's own) as
// seen through the accessors and the KubeProxyConfiguration.
func TestDefaults(t *testing.T) {
	for _, c := range []*Config{Default(), mustParse(t)} {
		kp := &c.KubeProxy
		checks := []struct {
			name      string
			got, want any
		}{
			{"apiVersion", kp.APIVersion, "kubeproxy.config.k8s.io/v1alpha1"},
			{"kind", kp.Kind, "KubeProxyConfiguration"},
			{"mode", string(kp.Mode), "nftables"},
			{"Mode()", c.Mode(), "nftables"},
			{"bindAddress", kp.BindAddress, "0.0.0.0"},
			{"healthzBindAddress", kp.HealthzBindAddress, "0.0.0.0:10256"},
			{"metricsBindAddress", kp.MetricsBindAddress, "127.0.0.1:10249"},
			{"oomScoreAdj", *kp.OOMScoreAdj, int32(-999)},
			{"iptables.syncPeriod", kp.IPTables.SyncPeriod.Duration, 30 * time.Second},
			{"iptables.minSyncPeriod", kp.IPTables.MinSyncPeriod.Duration, time.Second},
			{"iptables.masqueradeBit", *kp.IPTables.MasqueradeBit, int32(14)},
			{"iptables.localhostNodePorts", *kp.IPTables.LocalhostNodePorts, true},
			{"nftables.syncPeriod", kp.NFTables.SyncPeriod.Duration, 30 * time.Second},
			{"nftables.minSyncPeriod", kp.NFTables.MinSyncPeriod.Duration, 100 * time.Millisecond},
			{"nftables.masqueradeBit", *kp.NFTables.MasqueradeBit, int32(14)},
			{"ipvs.syncPeriod", kp.IPVS.SyncPeriod.Duration, 30 * time.Second},
			{"ipvs.minSyncPeriod", kp.IPVS.MinSyncPeriod.Duration, time.Duration(0)},
			{"Scheduler()", c.Scheduler(), "rr"},
			{"conntrack.maxPerCore", *kp.Conntrack.MaxPerCore, int32(32768)},
			{"conntrack.min", *kp.Conntrack.Min, int32(131072)},
			{"conntrack.tcpEstablishedTimeout", kp.Conntrack.TCPEstablishedTimeout.Duration, 24 * time.Hour},
			{"conntrack.tcpCloseWaitTimeout", kp.Conntrack.TCPCloseWaitTimeout.Duration, time.Hour},
			{"conntrack.tcpBeLiberal", kp.Conntrack.TCPBeLiberal, false},
			{"conntrack.udpTimeout", kp.Conntrack.UDPTimeout.Duration, time.Duration(0)},
			{"configSyncPeriod", kp.ConfigSyncPeriod.Duration, 15 * time.Minute},
			{"clientConnection.contentType", kp.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
			{"clientConnection.qps", kp.ClientConnection.QPS, float32(5)},
			{"clientConnection.burst", kp.ClientConnection.Burst, int32(10)},
			{"detectLocalMode", string(kp.DetectLocalMode), "ClusterCIDR"},
			{"nodePortAddresses", len(kp.NodePortAddresses), 0},
			{"NodePorts().Primary", c.NodePorts().Primary && c.NodePorts().Prefixes == nil, true},
			{"logging.format", kp.Logging.Format, "text"},
			{"LoggingFormat", c.LoggingFormat, "text"},
			{"Verbosity", c.Verbosity, 0},
			{"ProfilingEnabled", c.ProfilingEnabled, false},
			{"StateDir", c.StateDir, "/var/lib/vipproxy"},
			{"Registry", c.Registry, ""},
			{"RegistryFile()", c.RegistryFile(), "/var/lib/vipproxy/allocations.db"},
			{"ServiceClusterIPRange", c.ServiceClusterIPRange, "10.96.0.0/12"},
			{"ServiceCIDRs()", c.ServiceCIDRs(), []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
			{"ServiceNodePortRange", c.ServiceNodePortRange, "30000-32767"},
			{"SyncPeriod()", c.SyncPeriod(), 30 * time.Second},
			{"MinSyncPeriod()", c.MinSyncPeriod(), 100 * time.Millisecond},
			{"MasqueradeBit()", c.MasqueradeBit(), 14},
			{"PreferSameTrafficDistribution", c.FeatureEnabled("PreferSameTrafficDistribution"), true},
			{"TopologyAwareHints", c.FeatureEnabled("TopologyAwareHints"), true},
			{"unknown gate", c.FeatureEnabled("NoSuchGate"), false},
		}
		for _, ch := range checks {
			if !equalAny(ch.got, ch.want) {
				t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
			}
		}
		lo, hi := c.NodePortRange()
		if lo != 30000 || hi != 32767 {
			t.Errorf("NodePortRange() = %d-%d", lo, hi)
		}
	}
}

func equalAny(a, b any) bool {
	if pa, ok := a.([]netip.Prefix); ok {
		return slices.Equal(pa, b.([]netip.Prefix))
	}
	return a == b
}

func TestIPv6BindAddressDefaults(t *testing.T) {
	c := mustParse(t, "--bind-address=::")
	if c.KubeProxy.HealthzBindAddress != "[::]:10256" || c.KubeProxy.MetricsBindAddress != "[::1]:10249" {
		t.Errorf("healthz %q metrics %q", c.KubeProxy.HealthzBindAddress, c.KubeProxy.MetricsBindAddress)
	}
	c = mustParse(t, "--healthz-bind-address=10.0.0.1", "--metrics-bind-address=::1")
	if c.KubeProxy.HealthzBindAddress != "10.0.0.1:10256" || c.KubeProxy.MetricsBindAddress != "[::1]:10249" {
		t.Errorf("port not appended: healthz %q metrics %q", c.KubeProxy.HealthzBindAddress, c.KubeProxy.MetricsBindAddress)
	}
}

func TestVerbosityForms(t *testing.T) {
	for _, args := range [][]string{{"-v=3"}, {"-v", "3"}, {"--v=3"}, {"--v", "3"}, {"-v3"}} {
		c := mustParse(t, args...)
		if c.Verbosity != 3 || c.KubeProxy.Logging.Verbosity != 3 {
			t.Errorf("%q: Verbosity = %d, logging.verbosity = %d", args, c.Verbosity, c.KubeProxy.Logging.Verbosity)
		}
	}
}

func TestFlags(t *testing.T) {
	c := mustParse(t,
		"--kubeconfig=/etc/kube.conf", "--master=https://10.0.0.1:6443", "--hostname-override= Node-A ",
		"--proxy-mode=iptables", "--cluster-cidr=10.244.0.0/16,fd00::/56",
		"--nodeport-addresses=10.0.0.0/8", "--nodeport-addresses=fd00::/64",
		"--masquerade-all", "--iptables-sync-period=5s", "--iptables-min-sync-period=0s",
		"--iptables-masquerade-bit=3", "--ipvs-scheduler=lc", "--ipvs-sync-period=9s", "--ipvs-min-sync-period=2s",
		"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth",
		"--conntrack-max-per-core=0", "--conntrack-min=5", "--conntrack-tcp-timeout-established=2h",
		"--conntrack-tcp-timeout-close-wait=30m", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=31s",
		"--conntrack-udp-timeout-stream=121s", "--feature-gates=PreferSameTrafficDistribution=false,AllAlpha=false",
		"--profiling", "--state-dir=/srv/vip", "--registry=etcd://10.0.0.5:2379,etcd-b:2379",
		"--service-cluster-ip-range=10.0.0.0/16,fd00:96::/112", "--service-node-port-range=31000+99",
		"--logging-format=json", "--external-ip-cidrs=192.0.2.0/24,2001:db8::/32",
	)
	kp := &c.KubeProxy
	name, err := c.NodeName()
	if err != nil || name != "node-a" {
		t.Errorf("NodeName() = %q, %v", name, err)
	}
	if c.Master != "https://10.0.0.1:6443" || kp.ClientConnection.Kubeconfig != "/etc/kube.conf" {
		t.Errorf("master %q kubeconfig %q", c.Master, kp.ClientConnection.Kubeconfig)
	}
	if c.Mode() != ModeIPTables || c.SyncPeriod() != 5*time.Second || c.MinSyncPeriod() != 0 {
		t.Errorf("mode %s sync %s min %s", c.Mode(), c.SyncPeriod(), c.MinSyncPeriod())
	}
	if kp.NFTables.SyncPeriod.Duration != 5*time.Second || !kp.NFTables.MasqueradeAll || *kp.NFTables.MasqueradeBit != 3 {
		t.Errorf("iptables flags did not reach the nftables section: %+v", kp.NFTables)
	}
	if kp.IPVS.SyncPeriod.Duration != 9*time.Second || kp.IPVS.MinSyncPeriod.Duration != 2*time.Second || c.Scheduler() != "lc" {
		t.Errorf("ipvs section %+v", kp.IPVS)
	}
	if !c.MasqueradeAll() || c.MasqueradeBit() != 3 {
		t.Errorf("MasqueradeAll %v MasqueradeBit %d", c.MasqueradeAll(), c.MasqueradeBit())
	}
	wantCluster := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/56")}
	if !slices.Equal(c.ClusterCIDRs(), wantCluster) {
		t.Errorf("ClusterCIDRs() = %v", c.ClusterCIDRs())
	}
	wantExt := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if !slices.Equal(c.ExternalIPAllowList(), wantExt) {
		t.Errorf("ExternalIPAllowList() = %v", c.ExternalIPAllowList())
	}
	wantNP := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}
	if np := c.NodePorts(); !slices.Equal(np.Prefixes, wantNP) || np.Primary {
		t.Errorf("NodePorts() = %+v", np)
	}
	if c.DetectLocalMode() != LocalModeInterfaceNamePrefix || kp.DetectLocal.InterfaceNamePrefix != "veth" {
		t.Errorf("detect local %s %+v", c.DetectLocalMode(), kp.DetectLocal)
	}
	ct := kp.Conntrack
	if *ct.MaxPerCore != 0 || *ct.Min != 5 || ct.TCPEstablishedTimeout.Duration != 2*time.Hour ||
		ct.TCPCloseWaitTimeout.Duration != 30*time.Minute || !ct.TCPBeLiberal ||
		ct.UDPTimeout.Duration != 31*time.Second || ct.UDPStreamTimeout.Duration != 121*time.Second {
		t.Errorf("conntrack %+v", ct)
	}
	if c.FeatureEnabled("PreferSameTrafficDistribution") || !c.ProfilingEnabled || !kp.EnableProfiling {
		t.Errorf("feature gates %v profiling %v", kp.FeatureGates, c.ProfilingEnabled)
	}
	if c.StateDir != "/srv/vip" || !slices.Equal(c.RegistryEndpoints(), []string{"http://10.0.0.5:2379", "http://etcd-b:2379"}) {
		t.Errorf("state dir %q registry endpoints %v", c.StateDir, c.RegistryEndpoints())
	}
	if lo, hi := c.NodePortRange(); lo != 31000 || hi != 31099 {
		t.Errorf("NodePortRange() = %d-%d", lo, hi)
	}
	if got := c.ServiceCIDRs(); len(got) != 2 || got[1] != netip.MustParsePrefix("fd00:96::/112") {
		t.Errorf("ServiceCIDRs() = %v", got)
	}
	if c.LoggingFormat != "json" || kp.Logging.Format != "json" {
		t.Errorf("logging format %q / %q", c.LoggingFormat, kp.Logging.Format)
	}
	if len(c.IgnoredFlags) != 0 {
		t.Errorf("IgnoredFlags = %v without --config", c.IgnoredFlags)
	}
}

// TestPrecedence: with --config the file wins over every flag that maps
// into it (those are reported as ignored); -v, --logging-format and
// --hostname-override win over the file; vipproxy's own flags and
// --master always apply.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "kp.yaml", goodYAML+`hostnameOverride: from-file
logging:
  format: json
  verbosity: 1
`)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c *Config)
	}{
		{
			name: "file alone",
			args: []string{"--config=" + file},
			check: func(t *testing.T, c *Config) {
				if c.Mode() != ModeIPTables || c.SyncPeriod() != 10*time.Second || c.Verbosity != 1 || c.LoggingFormat != "json" {
					t.Errorf("mode %s sync %s v %d format %s", c.Mode(), c.SyncPeriod(), c.Verbosity, c.LoggingFormat)
				}
				if n, _ := c.NodeName(); n != "from-file" {
					t.Errorf("node name %q", n)
				}
				// Defaults fill what the file left out.
				if *c.KubeProxy.Conntrack.Min != 131072 || c.KubeProxy.HealthzBindAddress != "0.0.0.0:10256" {
					t.Errorf("defaults not applied: %+v", c.KubeProxy.Conntrack)
				}
			},
		},
		{
			name: "file wins over mapped flags, which are reported",
			args: []string{"--proxy-mode=ipvs", "--config=" + file, "--cluster-cidr=10.9.0.0/16", "--iptables-sync-period=1m", "--kubeconfig=/x", "--feature-gates=PreferSameTrafficDistribution=true"},
			check: func(t *testing.T, c *Config) {
				if c.Mode() != ModeIPTables || c.KubeProxy.ClusterCIDR != "10.244.0.0/16,fd00:10:244::/56" ||
					c.SyncPeriod() != 10*time.Second || c.KubeProxy.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" ||
					c.FeatureEnabled("PreferSameTrafficDistribution") {
					t.Errorf("a flag overrode the file: %+v", c.KubeProxy)
				}
				want := []string{"--proxy-mode", "--cluster-cidr", "--iptables-sync-period", "--kubeconfig", "--feature-gates"}
				if !slices.Equal(c.IgnoredFlags, want) {
					t.Errorf("IgnoredFlags = %v, want %v", c.IgnoredFlags, want)
				}
			},
		},
		{
			name: "logging flags and hostname-override win over the file",
			args: []string{"--config=" + file, "-v=5", "--logging-format=text", "--hostname-override=Flag-Node"},
			check: func(t *testing.T, c *Config) {
				if c.Verbosity != 5 || c.LoggingFormat != "text" || c.KubeProxy.Logging.Verbosity != 5 || c.KubeProxy.Logging.Format != "text" {
					t.Errorf("v %d format %s logging %+v", c.Verbosity, c.LoggingFormat, c.KubeProxy.Logging)
				}
				if n, _ := c.NodeName(); n != "flag-node" || c.KubeProxy.HostnameOverride != "flag-node" {
					t.Errorf("node name %q", n)
				}
				if len(c.IgnoredFlags) != 0 {
					t.Errorf("IgnoredFlags = %v", c.IgnoredFlags)
				}
			},
		},
		{
			name: "empty hostname-override does not clear the file's",
			args: []string{"--config=" + file, "--hostname-override="},
			check: func(t *testing.T, c *Config) {
				if n, _ := c.NodeName(); n != "from-file" {
					t.Errorf("node name %q", n)
				}
			},
		},
		{
			name: "own flags and --master apply with --config",
			args: []string{"--config=" + file, "--master=https://api:6443", "--state-dir=/tmp/s", "--service-node-port-range=1000-2000", "--cleanup", "--cleanup-kube-proxy"},
			check: func(t *testing.T, c *Config) {
				if c.Master != "https://api:6443" || c.StateDir != "/tmp/s" || c.ServiceNodePortRange != "1000-2000" || !c.Cleanup || !c.CleanupKubeProxy {
					t.Errorf("own flags lost: %+v", c)
				}
			},
		},
		{
			name: "without --config flags override defaults",
			args: []string{"--proxy-mode=ipvs", "--ipvs-sync-period=1m"},
			check: func(t *testing.T, c *Config) {
				if c.Mode() != ModeIPVS || c.SyncPeriod() != time.Minute || c.MinSyncPeriod() != 0 {
					t.Errorf("mode %s sync %s min %s", c.Mode(), c.SyncPeriod(), c.MinSyncPeriod())
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, mustParse(t, tc.args...))
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out bytes.Buffer
		c, err := Parse([]string{"--proxy-mode=iptables", arg}, &out)
		if !errors.Is(err, ErrHelp) || c != nil {
			t.Fatalf("%s: Parse = %v, %v; want nil, ErrHelp", arg, c, err)
		}
		help := out.String()
		flat := strings.Join(strings.Fields(help), " ")
		for _, want := range []string{
			"Usage:", "\nGeneral:\n", "\nSource (Kubernetes API):\n", "\nProxy:\n", "\nConntrack:\n",
			"\nHealth and metrics:\n", "\nLogging:\n", "\nvipproxy:\n",
			"--proxy-mode", `(default "nftables")`, "--conntrack-max-per-core", "(default 32768)",
			"--manifests", "--service-node-port-range", "PreferSameTrafficDistribution", "-v, --v",
		} {
			if !strings.Contains(help, want) && !strings.Contains(flat, want) {
				t.Errorf("%s: help lacks %q", arg, want)
			}
		}
		// Groups appear in order, each flag once, deprecated ones hidden.
		if strings.Index(help, "\nProxy:") > strings.Index(help, "\nConntrack:") {
			t.Error("groups out of order")
		}
		if strings.Count(help, "--cluster-cidr ") != 1 || strings.Contains(help, "--healthz-port") {
			t.Error("flag listed twice or hidden flag shown")
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--proxy-mod=ipvs"}, "unknown flag: --proxy-mod"},
		{"bad duration", []string{"--iptables-sync-period=soon"}, `"--iptables-sync-period"`},
		{"bad int", []string{"--conntrack-min=many"}, `"--conntrack-min"`},
		{"bad feature gate value", []string{"--feature-gates=A=maybe"}, `"--feature-gates"`},
		{"positional argument", []string{"nftables"}, `takes no arguments, got ["nftables"]`},
		{"missing config file", []string{"--config=/nonexistent/kp.yaml"}, "/nonexistent/kp.yaml"},
		{"bad config file", []string{"--config=" + writeFile(t, "bad.yaml", "kind: x\n")}, "config file bad.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.args, &bytes.Buffer{})
			if err == nil || c != nil {
				t.Fatalf("Parse = %v, %v; want an error", c, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if errors.Is(err, ErrHelp) {
				t.Error("error satisfies ErrHelp")
			}
		})
	}
}

func TestDeprecatedPorts(t *testing.T) {
	c := mustParse(t, "--manifests=/srv/manifests", "--healthz-port=0", "--metrics-port=9999")
	if c.KubeProxy.HealthzBindAddress != "" || c.KubeProxy.MetricsBindAddress != "127.0.0.1:9999" {
		t.Errorf("healthz %q metrics %q", c.KubeProxy.HealthzBindAddress, c.KubeProxy.MetricsBindAddress)
	}
	if len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0], "--healthz-port is deprecated") {
		t.Errorf("warnings %q", c.Warnings)
	}
	if err := c.Validate(okHost()); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if len(c.Warnings) < 2 || !strings.Contains(c.Warnings[1], "--metrics-port is deprecated") {
		t.Errorf("Validate dropped Parse's warnings: %q", c.Warnings)
	}
}

// TestNodePorts: unset nodePortAddresses follow kube-proxy's per-mode
// defaults (every local address in iptables and ipvs mode, the primary IPs
// in nftables and userspace mode); the keywords primary, all and localhost
// combine with each other and with CIDRs; loopback is served by the
// userspace proxy in the kernel modes (in iptables mode also by default,
// IPv4 only, unless iptables.localhostNodePorts is false) and natively in
// userspace mode.
func TestNodePorts(t *testing.T) {
	pf := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	ad := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	all := pf("0.0.0.0/0", "::/0")
	for _, tc := range []struct {
		mode, addrs string
		extra       []string
		want        NodePorts
	}{
		{"iptables", "", nil, NodePorts{Prefixes: all, Loopback: ad("127.0.0.1")}},
		{"iptables", "", []string{"--iptables-localhost-nodeports=false"}, NodePorts{Prefixes: all}},
		{"iptables", "localhost", []string{"--iptables-localhost-nodeports=false"}, NodePorts{}},
		{"ipvs", "", nil, NodePorts{Prefixes: all}},
		{"nftables", "", nil, NodePorts{Primary: true}},
		{"userspace", "", nil, NodePorts{Primary: true}},
		{"iptables", "primary", nil, NodePorts{Primary: true}},
		{"nftables", "all", nil, NodePorts{Prefixes: all}},
		{"nftables", "10.0.0.0/8", nil, NodePorts{Prefixes: pf("10.0.0.0/8")}},
		{"nftables", "primary,localhost", nil, NodePorts{Primary: true, Loopback: ad("127.0.0.1", "::1")}},
		{"nftables", "localhost", nil, NodePorts{Loopback: ad("127.0.0.1", "::1")}},
		{"ipvs", "127.0.0.0/8,10.0.0.0/8,primary", nil, NodePorts{Prefixes: pf("10.0.0.0/8"), Primary: true, Loopback: ad("127.0.0.1")}},
		{"iptables", "10.0.0.0/8", nil, NodePorts{Prefixes: pf("10.0.0.0/8")}},
		{"userspace", "primary,localhost", nil, NodePorts{Prefixes: pf("127.0.0.1/32", "::1/128"), Primary: true}},
	} {
		args := []string{"--manifests", "/srv/manifests", "--proxy-mode", tc.mode}
		if tc.addrs != "" {
			args = append(args, "--nodeport-addresses", tc.addrs)
		}
		c := mustParse(t, append(args, tc.extra...)...)
		if err := c.Validate(okHost()); err != nil {
			t.Errorf("mode %s nodePortAddresses %q: %v", tc.mode, tc.addrs, err)
		}
		got := c.NodePorts()
		if !slices.Equal(got.Prefixes, tc.want.Prefixes) || got.Primary != tc.want.Primary || !slices.Equal(got.Loopback, tc.want.Loopback) {
			t.Errorf("mode %s nodePortAddresses %q %v: %+v, want %+v", tc.mode, tc.addrs, tc.extra, got, tc.want)
		}
	}
}
