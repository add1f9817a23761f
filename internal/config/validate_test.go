package config

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// okHost is a host that supports every mode except ipvs (like the build
// machine) and has a manifests directory and a kubeconfig file.
func okHost() *FakeHost {
	return &FakeHost{
		Paths: map[string]string{
			"nft": "/usr/sbin/nft", "iptables-restore": "/usr/sbin/iptables-restore",
			"ip6tables-restore": "/usr/sbin/ip6tables-restore", "ipset": "/usr/sbin/ipset",
			"iptables-save": "/usr/sbin/iptables-save",
		},
		Kernel: map[string]bool{"nf_tables": true, "ip_tables": true, "nf_conntrack": true, "ip_vs": false},
		Name:   "node-1",
		Files:  map[string]bool{"/srv/manifests": true, "/etc/kube.conf": false},
	}
}

func TestValidate(t *testing.T) {
	type tc struct {
		name string
		args []string // appended to --manifests=/srv/manifests unless noBase
		// file, when set, is written and passed as --config.
		file   string
		noBase bool
		host   func(h *FakeHost)
		// want are (field, value) pairs that must each appear as one
		// FieldError; empty means valid.
		want [][2]string
		// wantWarn is a substring of a warning.
		wantWarn string
		// wantParseErr is a substring of the error Parse must return.
		wantParseErr string
	}
	file := func(extra string) string {
		return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + extra
	}
	tests := []tc{
		{name: "defaults with manifests are valid", wantWarn: "without a cluster CIDR"},
		{name: "kubernetes mode valid", noBase: true, args: []string{"--kubeconfig=/etc/kube.conf", "--cluster-cidr=10.244.0.0/16"}},
		{name: "in-cluster needs no kubeconfig", noBase: true, host: func(h *FakeHost) {
			h.Env = map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
		}},
		{name: "cleanup needs no source and no nft", noBase: true, args: []string{"--cleanup", "--cleanup-kube-proxy"}, host: func(h *FakeHost) { delete(h.Paths, "nft") }},
		{name: "cleanup needs no valid host name (a fresh VM is \"(none)\")", noBase: true, args: []string{"--cleanup"}, host: func(h *FakeHost) { h.Name = "(none)" }},
		{name: "serving does", args: nil, host: func(h *FakeHost) { h.Name = "(none)" }, want: [][2]string{{"hostname", "(none)"}}},
		{name: "every valid mode", args: []string{"--proxy-mode=userspace", "--ipvs-scheduler=random"}},
		{name: "ipvs falls back with a warning", args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=sed"}, wantWarn: "no IPVS"},

		{name: "external IP allow-list", args: []string{"--external-ip-cidrs=192.0.2.0/24, 2001:db8::/32,198.51.100.0/24"}},
		{name: "external IP allow-list with a typo", args: []string{"--external-ip-cidrs=192.0.2.0/24,198.51.100.0/33"},
			want: [][2]string{{"--external-ip-cidrs", "192.0.2.0/24,198.51.100.0/33"}}},
		{name: "external IP allow-list with leading zeros", args: []string{"--external-ip-cidrs=192.0.02.0/24"},
			want: [][2]string{{"--external-ip-cidrs", "192.0.02.0/24"}}},

		{name: "write-config-to needs no source", noBase: true, args: []string{"--write-config-to=/tmp/out.yaml"}},
		{name: "write-config-to needs no kubeconfig on this host", noBase: true,
			args: []string{"--write-config-to=/tmp/out.yaml", "--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf"},
			host: func(h *FakeHost) { delete(h.Paths, "nft") }},

		// Source.
		{name: "no source", noBase: true, want: [][2]string{{"--kubeconfig", ""}}},
		{name: "kubeconfig and manifests", args: []string{"--kubeconfig=/etc/kube.conf"}, want: [][2]string{{"--manifests", "/srv/manifests"}}},
		{name: "master and manifests", args: []string{"--master=https://10.0.0.1:6443"}, want: [][2]string{{"--manifests", "/srv/manifests"}}},
		{name: "manifests dir missing", noBase: true, args: []string{"--manifests=/srv/none"}, want: [][2]string{{"--manifests", "/srv/none"}}},
		{name: "manifests is a file", noBase: true, args: []string{"--manifests=/etc/kube.conf"}, want: [][2]string{{"--manifests", "/etc/kube.conf"}}},
		{name: "kubeconfig missing", noBase: true, args: []string{"--kubeconfig=/etc/none.conf"}, want: [][2]string{{"--kubeconfig", "/etc/none.conf"}}},

		// Mode and host support.
		{name: "unknown mode", args: []string{"--proxy-mode=ebpf"}, want: [][2]string{{"--proxy-mode", "ebpf"}}},
		{name: "windows mode", args: []string{"--proxy-mode=kernelspace"}, want: [][2]string{{"--proxy-mode", "kernelspace"}}},
		{name: "nftables without nft", host: func(h *FakeHost) { delete(h.Paths, "nft") }, want: [][2]string{{"--proxy-mode", "nftables"}}},
		{name: "nftables without kernel support", host: func(h *FakeHost) { h.Kernel["nf_tables"] = false }, want: [][2]string{{"--proxy-mode", "nftables"}}},
		{name: "iptables without iptables-restore", args: []string{"--proxy-mode=iptables"}, host: func(h *FakeHost) { delete(h.Paths, "iptables-restore") }, want: [][2]string{{"--proxy-mode", "iptables"}}},
		{name: "iptables without iptables-save", args: []string{"--proxy-mode=iptables"}, host: func(h *FakeHost) { delete(h.Paths, "iptables-save") }, want: [][2]string{{"--proxy-mode", "iptables"}}},
		{name: "userspace needs nothing", args: []string{"--proxy-mode=userspace"}, host: func(h *FakeHost) { h.Paths = nil; h.Kernel = nil }},
		{name: "ipvs fallback without iptables-restore", args: []string{"--proxy-mode=ipvs"}, host: func(h *FakeHost) { delete(h.Paths, "iptables-restore") }, want: [][2]string{{"--proxy-mode", "ipvs"}}},
		{name: "iptables dual-stack without ip6tables-restore", args: []string{"--proxy-mode=iptables", "--cluster-cidr=10.0.0.0/16,fd00::/48"}, host: func(h *FakeHost) { delete(h.Paths, "ip6tables-restore") }, want: [][2]string{{"--proxy-mode", "iptables"}}},
		{name: "mode in file names the field", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("mode: ebpf\n"), want: [][2]string{{"mode", "ebpf"}}},

		// CIDRs.
		{name: "bad cluster CIDR", args: []string{"--cluster-cidr=10.244.0.0/33"}, want: [][2]string{{"--cluster-cidr", "10.244.0.0/33"}}},
		{name: "cluster CIDR not a pair", args: []string{"--cluster-cidr=10.0.0.0/16,10.1.0.0/16"}, want: [][2]string{{"--cluster-cidr", "10.0.0.0/16,10.1.0.0/16"}}},
		{name: "three cluster CIDRs", args: []string{"--cluster-cidr=10.0.0.0/16,fd00::/48,10.2.0.0/16"}, want: [][2]string{{"--cluster-cidr", "10.0.0.0/16,fd00::/48,10.2.0.0/16"}}},
		{name: "cluster CIDR in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("clusterCIDR: 10.244.0.0\n"), want: [][2]string{{"clusterCIDR", "10.244.0.0"}}},
		{name: "service range not a CIDR", args: []string{"--service-cluster-ip-range=10.96.0.0"}, want: [][2]string{{"--service-cluster-ip-range", "10.96.0.0"}}},
		{name: "service range too large", args: []string{"--service-cluster-ip-range=10.0.0.0/8"}, want: [][2]string{{"--service-cluster-ip-range", "10.0.0.0/8"}}},
		{name: "IPv6 service range too large", args: []string{"--service-cluster-ip-range=fd00::/64"}, want: [][2]string{{"--service-cluster-ip-range", "fd00::/64"}}},
		{name: "service range too small", args: []string{"--service-cluster-ip-range=10.96.0.0/32"}, want: [][2]string{{"--service-cluster-ip-range", "10.96.0.0/32"}}},
		{name: "nodeport address not a CIDR", args: []string{"--nodeport-addresses=10.0.0.1"}, want: [][2]string{{"--nodeport-addresses", "10.0.0.1"}}},
		{name: "keywords combine with CIDRs (kube-proxy 1.37)", args: []string{"--nodeport-addresses=primary,10.0.0.0/8,localhost"}},
		{name: "a word that is no keyword", args: []string{"--nodeport-addresses=primary,loopback"}, want: [][2]string{{"--nodeport-addresses", "primary,loopback"}}},
		{name: "primary alone is fine", args: []string{"--nodeport-addresses=primary"}},
		{name: "all alone is fine", args: []string{"--nodeport-addresses=all"}},
		{name: "all with others", args: []string{"--nodeport-addresses=all,10.0.0.0/8"}},
		{name: "localhost", args: []string{"--nodeport-addresses=localhost"}},
		{name: "ipvs exclude CIDR in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("ipvs:\n  excludeCIDRs: [10.0.0.0/8, nope]\n"), want: [][2]string{{"ipvs.excludeCIDRs[1]", "nope"}}},

		// Addresses.
		{name: "bind address", args: []string{"--bind-address=node1"}, want: [][2]string{{"--bind-address", "node1"}}},
		{name: "healthz address port", args: []string{"--healthz-bind-address=0.0.0.0:99999"}, want: [][2]string{{"--healthz-bind-address", "0.0.0.0:99999"}}},
		{name: "metrics address host", args: []string{"--metrics-bind-address=localhost:10249"}, want: [][2]string{{"--metrics-bind-address", "localhost:10249"}}},
		{name: "healthz and metrics clash", args: []string{"--healthz-bind-address=127.0.0.1:10249"}, want: [][2]string{{"--metrics-bind-address", "127.0.0.1:10249"}}},
		{name: "metrics address in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("metricsBindAddress: '[::1]:0'\n"), want: [][2]string{{"metricsBindAddress", "[::1]:0"}}},

		// Port ranges.
		{name: "node port range reversed", args: []string{"--service-node-port-range=32767-30000"}, want: [][2]string{{"--service-node-port-range", "32767-30000"}}},
		{name: "node port range too high", args: []string{"--service-node-port-range=65000+1000"}, want: [][2]string{{"--service-node-port-range", "65000+1000"}}},
		{name: "node port range zero", args: []string{"--service-node-port-range=0-100"}, want: [][2]string{{"--service-node-port-range", "0-100"}}},
		{name: "node port range garbage", args: []string{"--service-node-port-range=30000:32767"}, want: [][2]string{{"--service-node-port-range", "30000:32767"}}},

		// Periods.
		{name: "sync period zero", args: []string{"--iptables-sync-period=0s"}, want: [][2]string{{"--iptables-sync-period", "0s"}}},
		{name: "min above sync", args: []string{"--iptables-sync-period=5s", "--iptables-min-sync-period=10s"}, want: [][2]string{{"--iptables-min-sync-period", "10s"}}},
		{name: "negative min", args: []string{"--iptables-min-sync-period=-1s"}, want: [][2]string{{"--iptables-min-sync-period", "-1s"}}},
		{name: "ipvs min above sync", args: []string{"--proxy-mode=ipvs", "--ipvs-sync-period=5s", "--ipvs-min-sync-period=6s"}, want: [][2]string{{"--ipvs-min-sync-period", "6s"}}},
		{name: "nftables periods in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("nftables:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n"), want: [][2]string{{"nftables.minSyncPeriod", "2s"}}},
		{name: "config sync period", args: []string{"--config-sync-period=-1m"}, want: [][2]string{{"--config-sync-period", "-1m0s"}}},
		{name: "negative conntrack timeout", args: []string{"--conntrack-tcp-timeout-established=-1h"}, want: [][2]string{{"--conntrack-tcp-timeout-established", "-1h0m0s"}}},
		{name: "negative udp timeout in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("conntrack:\n  udpTimeout: -5s\n"), want: [][2]string{{"conntrack.udpTimeout", "-5s"}}},

		// Numbers.
		{name: "masquerade bit", args: []string{"--iptables-masquerade-bit=32"}, want: [][2]string{{"--iptables-masquerade-bit", "32"}}},
		{name: "masquerade bit in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("nftables:\n  masqueradeBit: -1\n"), want: [][2]string{{"nftables.masqueradeBit", "-1"}}},
		{name: "conntrack max per core", args: []string{"--conntrack-max-per-core=-1"}, want: [][2]string{{"--conntrack-max-per-core", "-1"}}},
		{name: "conntrack min in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("conntrack:\n  min: -7\n"), want: [][2]string{{"conntrack.min", "-7"}}},
		{name: "oom score adj", args: []string{"--oom-score-adj=-1001"}, want: [][2]string{{"--oom-score-adj", "-1001"}}},

		// Scheduler.
		{name: "unknown scheduler", args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=fastest"}, want: [][2]string{{"--ipvs-scheduler", "fastest"}}},
		{name: "random only in userspace", args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=random"}, want: [][2]string{{"--ipvs-scheduler", "random"}}},
		{name: "userspace refuses wrr", args: []string{"--proxy-mode=userspace", "--ipvs-scheduler=wrr"}, want: [][2]string{{"--ipvs-scheduler", "wrr"}}},
		{name: "scheduler ignored outside ipvs", args: []string{"--ipvs-scheduler=lc"}, wantWarn: `scheduler "lc" is only used`},

		// Detect-local.
		{name: "unknown detect-local mode", args: []string{"--detect-local-mode=Magic"}, want: [][2]string{{"--detect-local-mode", "Magic"}}},
		{name: "bridge without interface", args: []string{"--detect-local-mode=BridgeInterface"}, want: [][2]string{{"--pod-bridge-interface", ""}}},
		{name: "bridge interface too long", args: []string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=averyveryverylongname"}, want: [][2]string{{"--pod-bridge-interface", "averyveryverylongname"}}},
		{name: "prefix without prefix in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("detectLocalMode: InterfaceNamePrefix\n"), want: [][2]string{{"detectLocal.interfaceNamePrefix", ""}}},
		{name: "bridge with interface fine", args: []string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}},

		// Names, registry, logging, gates.
		{name: "bad hostname override", args: []string{"--hostname-override=node_1"}, want: [][2]string{{"--hostname-override", "node_1"}}},
		{name: "blank hostname override", args: []string{"--hostname-override=  "}, want: [][2]string{{"--hostname-override", "  "}}},
		{name: "bad hostname", host: func(h *FakeHost) { h.Name = "My Laptop" }, want: [][2]string{{"hostname", "My Laptop"}}},
		{name: "hostname unreadable", host: func(h *FakeHost) { h.NameErr = errors.New("boom") }, want: [][2]string{{"--hostname-override", ""}}},
		{name: "registry scheme", args: []string{"--registry=http://10.0.0.5:2379"}, want: [][2]string{{"--registry", "http://10.0.0.5:2379"}}},
		{name: "registry port", args: []string{"--registry=etcd://a:2379,b"}, want: [][2]string{{"--registry", "etcd://a:2379,b"}}},
		{name: "cleanup-kube-proxy alone", args: []string{"--cleanup-kube-proxy"}, want: [][2]string{{"--cleanup-kube-proxy", "true"}}},
		{name: "logging format", args: []string{"--logging-format=xml"}, want: [][2]string{{"--logging-format", "xml"}}},
		{name: "logging format in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("logging:\n  format: xml\n"), want: [][2]string{{"logging.format", "xml"}}},
		{name: "negative verbosity fails at parsing, as in kube-proxy", args: []string{"-v=-1"}, wantParseErr: `"-v, --v"`},
		{name: "vmodule without a level", args: []string{"--vmodule=proxier"}, wantParseErr: `"--vmodule"`},
		{name: "vmodule in the file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("logging:\n  vmodule:\n  - filePattern: proxier\n    verbosity: 4\n  format: json\n"), want: [][2]string{{"logging.vmodule", "proxier=4"}}},
		{name: "split stream needs its gate", args: []string{"--log-json-split-stream", "--logging-format=json", "--feature-gates=LoggingAlphaOptions=false"}, want: [][2]string{{"--log-json-split-stream", "true"}}},
		{name: "json needs LoggingBetaOptions", args: []string{"--logging-format=json", "--feature-gates=LoggingBetaOptions=false"}, want: [][2]string{{"--logging-format", "json"}}},
		{name: "a gate of another component warns, as kube-proxy accepts every Kubernetes gate", args: []string{"--feature-gates=InPlacePodVerticalScaling=true,TopologyAwareHints=true"}, wantWarn: `"InPlacePodVerticalScaling" is unknown to vipproxy`},
		{name: "locked feature gate", args: []string{"--feature-gates=ServiceIPStaticSubrange=false"}, want: [][2]string{{"--feature-gates", "ServiceIPStaticSubrange=false"}}},
		{name: "feature gate in file", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("featureGates:\n  Bogus: true\n"), wantWarn: `"Bogus" is unknown`},
		{name: "unknown field in file warns and is ignored, as kube-proxy", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("conntrack:\n  maxPerCorez: 5\n"), wantWarn: `unknown field "conntrack.maxPerCorez"`},
		{name: "wrong type in file stays fatal", noBase: true, args: []string{"--manifests=/srv/manifests"}, file: file("conntrack: 5\n"), wantParseErr: "conntrack"},
		{name: "hidden metrics version", args: []string{"--show-hidden-metrics-for-version=v1.33"}, want: [][2]string{{"--show-hidden-metrics-for-version", "v1.33"}}},

		// All problems at once.
		{name: "every problem reported", args: []string{"--proxy-mode=ebpf", "--cluster-cidr=x", "--iptables-masquerade-bit=40", "--service-node-port-range=9-1", "--logging-format=yaml"},
			want: [][2]string{{"--proxy-mode", "ebpf"}, {"--cluster-cidr", "x"}, {"--iptables-masquerade-bit", "40"}, {"--service-node-port-range", "9-1"}, {"--logging-format", "yaml"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if !tc.noBase {
				args = append([]string{"--manifests=/srv/manifests"}, args...)
			}
			if tc.file != "" {
				args = append(args, "--config="+writeFile(t, "kp.yaml", tc.file))
			}
			c, err := Parse(args, &bytes.Buffer{})
			if tc.wantParseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantParseErr) {
					t.Fatalf("Parse = %v, want an error naming %q", err, tc.wantParseErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			h := okHost()
			if tc.host != nil {
				tc.host(h)
			}
			err = c.Validate(h)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
			} else {
				var list ErrorList
				if !errors.As(err, &list) {
					t.Fatalf("Validate = %v, want an ErrorList", err)
				}
				for _, w := range tc.want {
					found := false
					for _, fe := range list {
						if fe.Field == w[0] && fe.Value == w[1] {
							found = true
							// The printed error names field and value.
							if !strings.Contains(err.Error(), fe.Field) || !strings.Contains(err.Error(), `"`+w[1]+`"`) {
								t.Errorf("Error() %q lacks %s / %q", err, fe.Field, w[1])
							}
						}
					}
					if !found {
						t.Errorf("no error for %s=%q in:\n%v", w[0], w[1], err)
					}
				}
				if len(list) != len(tc.want) {
					t.Errorf("got %d errors, want %d:\n%v", len(list), len(tc.want), err)
				}
				if got := strings.Count(err.Error(), "\n"); got != len(list) {
					t.Errorf("Error() has %d lines for %d problems", got, len(list))
				}
			}
			if tc.wantWarn != "" && !strings.Contains(strings.Join(c.Warnings, "\n"), tc.wantWarn) {
				t.Errorf("warnings %q lack %q", c.Warnings, tc.wantWarn)
			}
		})
	}
}

func TestValidateStateDirEmpty(t *testing.T) {
	// --state-dir= means the default, as for every empty own setting.
	if c := mustParse(t, "--manifests=/srv/manifests", "--state-dir="); c.StateDir != DefaultStateDir {
		t.Errorf("StateDir = %q", c.StateDir)
	}
	c := mustParse(t, "--manifests=/srv/manifests")
	c.StateDir = " "
	err := c.Validate(okHost())
	var list ErrorList
	if !errors.As(err, &list) || !list.Has("--state-dir") {
		t.Errorf("Validate = %v, want a --state-dir error", err)
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kp.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("mode: nftables\n")
	running := mustParse(t, "--config="+path, "--manifests=/srv/manifests", "-v=4", "--hostname-override=flag-node", "--state-dir=/tmp/st")
	if err := running.Validate(okHost()); err != nil {
		t.Fatal(err)
	}

	t.Run("valid change, mode switch", func(t *testing.T) {
		write("mode: iptables\niptables:\n  syncPeriod: 11s\nhostnameOverride: file-node\nlogging:\n  verbosity: 1\n")
		next, err := ReloadWithHost(path, running, okHost())
		if err != nil {
			t.Fatal(err)
		}
		if next.Mode() != ModeIPTables || next.SyncPeriod() != 11e9 {
			t.Errorf("mode %s sync %s", next.Mode(), next.SyncPeriod())
		}
		// Flag-level settings carried over; flags still win over the file.
		if next.Manifests != "/srv/manifests" || next.StateDir != "/tmp/st" || next.Verbosity != 4 || next.KubeProxy.HostnameOverride != "flag-node" {
			t.Errorf("flag-level settings lost: %+v", next)
		}
		if running.Mode() != ModeNFTables {
			t.Error("Reload modified the running Config")
		}
	})
	t.Run("invalid file rejected naming the field", func(t *testing.T) {
		write("mode: iptables\niptables:\n  masqueradeBit: 99\n")
		next, err := ReloadWithHost(path, running, okHost())
		var list ErrorList
		if next != nil || !errors.As(err, &list) || !list.Has("iptables.masqueradeBit") {
			t.Errorf("Reload = %v, %v; want an iptables.masqueradeBit error", next, err)
		}
	})
	t.Run("unknown field warned and ignored, as kube-proxy", func(t *testing.T) {
		write("mode: iptables\nmodez: x\n")
		next, err := ReloadWithHost(path, running, okHost())
		if err != nil || next.Mode() != ModeIPTables || !slices.ContainsFunc(next.Warnings, func(w string) bool { return strings.Contains(w, `unknown field "modez"`) }) {
			t.Errorf("Reload = %v, %v; want iptables with a warning naming modez", next, err)
		}
	})
	t.Run("undecodable file rejected", func(t *testing.T) {
		write("mode: iptables\nconntrack: 5\n")
		next, err := ReloadWithHost(path, running, okHost())
		var de *DecodeError
		if next != nil || !errors.As(err, &de) || !strings.Contains(err.Error(), "conntrack") {
			t.Errorf("Reload = %v, %v", next, err)
		}
	})
	t.Run("host cannot run new mode", func(t *testing.T) {
		write("mode: iptables\n")
		h := okHost()
		delete(h.Paths, "iptables-restore")
		if next, err := ReloadWithHost(path, running, h); next != nil || err == nil {
			t.Errorf("Reload = %v, %v", next, err)
		}
	})
}

func TestFeatureEnabled(t *testing.T) {
	tests := []struct {
		gates map[string]bool
		name  string
		want  bool
	}{
		{nil, "PreferSameTrafficDistribution", true},
		{map[string]bool{"PreferSameTrafficDistribution": false}, "PreferSameTrafficDistribution", false},
		{map[string]bool{"AllBeta": false}, "PreferSameTrafficDistribution", false},
		{map[string]bool{"AllAlpha": true}, "ComponentFlagz", true},
		{map[string]bool{"AllBeta": false}, "TopologyAwareHints", true}, // GA, locked
		{map[string]bool{"NoSuch": true}, "NoSuch", false},
	}
	for _, tc := range tests {
		c := Default()
		c.KubeProxy.FeatureGates = tc.gates
		if got := c.FeatureEnabled(tc.name); got != tc.want {
			t.Errorf("gates %v: FeatureEnabled(%s) = %v, want %v", tc.gates, tc.name, got, tc.want)
		}
	}
}

func TestParseHelpers(t *testing.T) {
	ranges := []struct {
		in     string
		lo, hi uint16
		ok     bool
	}{
		{"30000-32767", 30000, 32767, true}, {"30000+2767", 30000, 32767, true}, {"80", 80, 80, true},
		{" 1-65535 ", 1, 65535, true}, {"0-10", 0, 0, false}, {"10-9", 0, 0, false}, {"1-65536", 0, 0, false},
		{"a-b", 0, 0, false}, {"1-2-3", 0, 0, false}, {"5+-1", 0, 0, false}, {"", 0, 0, false},
	}
	for _, r := range ranges {
		lo, hi, err := parsePortRange(r.in)
		if (err == nil) != r.ok || lo != r.lo || hi != r.hi {
			t.Errorf("parsePortRange(%q) = %d, %d, %v", r.in, lo, hi, err)
		}
	}
	if p, err := parsePrefixList("010.096.0.0/12"); err != nil || p[0].String() != "10.96.0.0/12" {
		t.Errorf("leading zeros: %v %v", p, err)
	}
	if p, err := parsePrefixList("10.96.0.5/12"); err != nil || p[0].String() != "10.96.0.0/12" {
		t.Errorf("host bits: %v %v", p, err)
	}
	for _, bad := range []string{"etcd://", "etcd://:2379", "etcd://a:b", "etcd://a:1/x", "bolt:///x"} {
		if _, err := parseRegistry(bad); err == nil {
			t.Errorf("parseRegistry(%q) accepted", bad)
		}
	}
}

func TestOSHostUnknownFeature(t *testing.T) {
	if present, known := (OSHost{}).KernelFeature("no_such_feature"); present || known {
		t.Errorf("unknown feature = %v, %v", present, known)
	}
	if _, err := (OSHost{}).Stat("/nonexistent-vipproxy"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat: %v", err)
	}
}

func TestChanges(t *testing.T) {
	old := mustParse(t, "--manifests=/srv/manifests")
	same := mustParse(t, "--manifests=/srv/manifests", "--state-dir=/elsewhere")
	if got := Changes(old, same); len(got) != 0 {
		t.Errorf("Changes of equal configs = %v", got)
	}
	new := mustParse(t, "--manifests=/srv/manifests", "--proxy-mode=iptables", "--iptables-sync-period=5s",
		"--nodeport-addresses=10.0.0.0/8", "--feature-gates=AllBeta=true")
	want := []string{"featureGates.AllBeta", "iptables.syncPeriod", "mode", "nftables.syncPeriod", "nodePortAddresses"}
	if got := Changes(old, new); !slices.Equal(got, want) {
		t.Errorf("Changes = %v, want %v", got, want)
	}
	newer := mustParse(t, "--manifests=/srv/manifests", "--feature-gates=AllBeta=false")
	if got := Changes(new, newer); !slices.Contains(got, "featureGates.AllBeta") {
		t.Errorf("Changes = %v, want featureGates.AllBeta", got)
	}
}
