package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const goodYAML = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
iptables:
  syncPeriod: 10s
  minSyncPeriod: 2s
conntrack:
  maxPerCore: 0
  tcpBeLiberal: true
nodePortAddresses: ["192.168.0.0/16"]
featureGates:
  PreferSameTrafficDistribution: false
`

const goodJSON = `{
  "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
  "kind": "KubeProxyConfiguration",
  "mode": "iptables",
  "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
  "clientConnection": {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
  "iptables": {"syncPeriod": "10s", "minSyncPeriod": "2s"},
  "conntrack": {"maxPerCore": 0, "tcpBeLiberal": true},
  "nodePortAddresses": ["192.168.0.0/16"],
  "featureGates": {"PreferSameTrafficDistribution": false}
}`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFile(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		content string
		// wantProblems are substrings that must each appear in one
		// DecodeError problem; empty means success.
		wantProblems []string
	}{
		{name: "good YAML", file: "kp.yaml", content: goodYAML},
		{name: "good JSON", file: "kp.json", content: goodJSON},
		{
			name: "duplicate key", file: "kp.yaml",
			content:      goodYAML + "conntrack:\n  maxPerCore: 5\n",
			wantProblems: []string{`key "conntrack" already set`},
		},
		{
			name: "unknown nested field", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "maxPerCore: 0", "maxPerCorez: 0", 1),
			wantProblems: []string{`unknown field "conntrack.maxPerCorez"`},
		},
		{
			name: "unknown top-level field in JSON", file: "kp.json",
			content:      strings.Replace(goodJSON, `"mode"`, `"proxyMode"`, 1),
			wantProblems: []string{`unknown field "proxyMode"`},
		},
		{
			name: "field names are case-sensitive", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "clusterCIDR:", "ClusterCIDR:", 1),
			wantProblems: []string{`unknown field "ClusterCIDR"`},
		},
		{
			name: "two unknown fields both reported", file: "kp.yaml",
			content:      goodYAML + "foo: 1\nbar: 2\n",
			wantProblems: []string{`unknown field "foo"`, `unknown field "bar"`},
		},
		{
			name: "wrong apiVersion", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "v1alpha1", "v1beta1", 1),
			wantProblems: []string{`apiVersion "kubeproxy.config.k8s.io/v1beta1" is not supported`},
		},
		{
			name: "wrong kind", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "kind: KubeProxyConfiguration", "kind: KubeletConfiguration", 1),
			wantProblems: []string{`kind "KubeletConfiguration" is not supported`},
		},
		{
			name: "missing apiVersion and kind", file: "kp.yaml",
			content:      "mode: iptables\n",
			wantProblems: []string{"apiVersion is missing", "kind is missing"},
		},
		{
			name: "wrong type", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "maxPerCore: 0", "maxPerCore: lots", 1),
			wantProblems: []string{"maxPerCore"},
		},
		{
			name: "bad duration", file: "kp.yaml",
			content:      strings.Replace(goodYAML, "syncPeriod: 10s", "syncPeriod: often", 1),
			wantProblems: []string{"often"},
		},
		{name: "empty file", file: "kp.yaml", content: "\n", wantProblems: []string{"empty"}},
		{name: "not YAML", file: "kp.yaml", content: "a: [1\n", wantProblems: []string{"not valid YAML"}},
		{name: "a list, not an object", file: "kp.yaml", content: "- 1\n", wantProblems: []string{"not a YAML or JSON object"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.file, tc.content)
			kp, err := LoadFile(path)
			if len(tc.wantProblems) == 0 {
				if err != nil {
					t.Fatalf("LoadFile: %v", err)
				}
				if kp.Mode != "iptables" || kp.ClusterCIDR != "10.244.0.0/16,fd00:10:244::/56" ||
					kp.IPTables.SyncPeriod.Duration != 10*time.Second || *kp.Conntrack.MaxPerCore != 0 ||
					!kp.Conntrack.TCPBeLiberal || kp.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" ||
					kp.FeatureGates["PreferSameTrafficDistribution"] {
					t.Errorf("decoded wrongly: %+v", kp)
				}
				return
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("LoadFile error = %v, want a *DecodeError", err)
			}
			if de.File != tc.file || !strings.HasPrefix(err.Error(), "config file "+tc.file+": ") {
				t.Errorf("error %q does not name file %s", err, tc.file)
			}
			for _, want := range tc.wantProblems {
				found := false
				for _, p := range de.Problems {
					found = found || strings.Contains(p, want)
				}
				if !found {
					t.Errorf("problems %q lack %q", de.Problems, want)
				}
			}
		})
	}
}

func TestLoadFileUnknownFieldMessage(t *testing.T) {
	path := writeFile(t, "kp.yaml", strings.Replace(goodYAML, "maxPerCore: 0", "maxPerCorez: 0", 1))
	_, err := LoadFile(path)
	if want := `config file kp.yaml: unknown field "conntrack.maxPerCorez"`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}

func TestLoadFileMissing(t *testing.T) {
	_, err := LoadFile(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want one wrapping ErrNotExist", err)
	}
}

// TestWriteConfigRoundTrip: --write-config-to output, read back with
// LoadFile and defaulted, equals what was written, for the defaults and
// for a customised configuration.
func TestWriteConfigRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"customised", []string{
			"--proxy-mode=ipvs", "--ipvs-scheduler=lc", "--cluster-cidr=10.244.0.0/16",
			"--nodeport-addresses=10.0.0.0/8,fd00::/64", "--conntrack-max-per-core=0",
			"--iptables-sync-period=7s", "--feature-gates=PreferSameTrafficDistribution=false",
			"--bind-address=::", "-v=4", "--logging-format=json", "--masquerade-all",
			"--conntrack-udp-timeout=30s", "--ipvs-exclude-cidrs=10.1.0.0/16",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.yaml")
			c, err := Parse(append(tc.args, "--write-config-to="+path), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteConfigFile(c.WriteConfigTo, c); err != nil {
				t.Fatal(err)
			}
			kp, err := LoadFile(path)
			if err != nil {
				t.Fatalf("reading back: %v", err)
			}
			SetDefaults(kp)
			var a, b bytes.Buffer
			if err := WriteConfig(&a, c); err != nil {
				t.Fatal(err)
			}
			if err := WriteConfig(&b, &Config{KubeProxy: *kp}); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(a.String(), b.String()); d != "" {
				t.Errorf("round trip changed the file (-written +reread):\n%s", d)
			}
			// And through --config: the same Config comes out.
			c2, err := Parse([]string{"--config=" + path}, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c2.KubeProxy.Conntrack, c.KubeProxy.Conntrack) ||
				c2.Mode() != c.Mode() || c2.SyncPeriod() != c.SyncPeriod() ||
				c2.Verbosity != c.Verbosity || c2.LoggingFormat != c.LoggingFormat ||
				!reflect.DeepEqual(c2.KubeProxy.NodePortAddresses, c.KubeProxy.NodePortAddresses) ||
				!reflect.DeepEqual(c2.KubeProxy.FeatureGates, c.KubeProxy.FeatureGates) ||
				c2.KubeProxy.HealthzBindAddress != c.KubeProxy.HealthzBindAddress {
				t.Errorf("--config of the written file differs:\nwrote %+v\nread  %+v", c.KubeProxy, c2.KubeProxy)
			}
		})
	}
}

func TestWriteConfigFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kp.yaml")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteConfigFile(path, Default()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !bytes.HasPrefix(data, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n")) {
		t.Errorf("file content %q", data)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("left temporary files behind: %v", ents)
	}
	if err := WriteConfigFile(filepath.Join(dir, "no", "such", "dir.yaml"), Default()); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}

// TestWriteConfigFileThroughSymlink: a symlink (as /dev/stdout is, to a
// file when output is redirected) is written through and stays a symlink.
func TestWriteConfigFileThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "out.yaml")
	if err := os.WriteFile(target, []byte("old content that is longer than nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "stdout")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteConfigFile(link, Default()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was replaced: %v %v", fi, err)
	}
	data, _ := os.ReadFile(target)
	if !bytes.HasPrefix(data, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n")) || bytes.Contains(data, []byte("old content")) {
		t.Errorf("target content %q", data)
	}
}
