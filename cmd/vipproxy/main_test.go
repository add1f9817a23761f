package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
)

// TestRunRefusesBadConfig checks that configuration errors exit 1 before
// anything is programmed, naming the flag and the bad value.
func TestRunRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"help", []string{"--help"}, 0, nil},
		{"bad cluster cidr", []string{"--manifests", dir, "--cluster-cidr", "10.0.0.0/33"}, 1, []string{"--cluster-cidr", "10.0.0.0/33"}},
		{"bad mode", []string{"--manifests", dir, "--proxy-mode", "bpf"}, 1, []string{"--proxy-mode", "bpf"}},
		{"kubeconfig and manifests", []string{"--manifests", dir, "--kubeconfig", filepath.Join(dir, "kc")}, 1, []string{"--manifests"}},
		{"unknown flag", []string{"--no-such-flag"}, 1, []string{"no-such-flag"}},
		{"bad node port range", []string{"--manifests", dir, "--service-node-port-range", "40000-30000"}, 1, []string{"--service-node-port-range", "40000-30000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(tc.args, &out, &errOut)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

func TestWriteConfigTo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kp.yaml")
	var out, errOut bytes.Buffer
	if code := run([]string{"--manifests", t.TempDir(), "--write-config-to", path, "--proxy-mode", "iptables"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"kind: KubeProxyConfiguration", "apiVersion: kubeproxy.config.k8s.io/v1alpha1", "mode: iptables"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("written config lacks %q:\n%s", w, b)
		}
	}
	// The file it wrote is a valid --config.
	if code := run([]string{"--config", path, "--manifests", t.TempDir(), "--write-config-to", path + ".2"}, &out, &errOut); code != 0 {
		t.Fatalf("re-reading the written config: exit %d: %s", code, errOut.String())
	}
}

// TestWriteConfigToWithoutSource: deploy/README's step runs
// --write-config-to with no source and a kubeconfig path of the node, not
// of this host; it writes the file and exits 0.
func TestWriteConfigToWithoutSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kp.yaml")
	for _, args := range [][]string{
		{"--write-config-to", path},
		{"--write-config-to", path, "--kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut.String())
		}
		if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "kind: KubeProxyConfiguration") {
			t.Fatalf("%v: wrote %q, %v", args, b, err)
		}
	}
}

// TestDefaultModeNotice: an unset mode (kubeadm's `mode: ""`) gets one
// warning that says nftables runs and what differs from iptables mode; a
// set mode gets none.
func TestDefaultModeNotice(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--manifests", t.TempDir()}, true},
		{[]string{"--manifests", t.TempDir(), "--proxy-mode", "nftables"}, false},
		{[]string{"--manifests", t.TempDir(), "--proxy-mode", "iptables"}, false},
		{[]string{"--manifests", t.TempDir(), "--config", writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: \"\"\n")}, true},
		{[]string{"--manifests", t.TempDir(), "--config", writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n")}, false},
	} {
		cfg, err := config.Parse(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := defaultModeNotice(cfg)
		if ok != tc.want {
			t.Errorf("%v: notice %v, want %v", tc.args, ok, tc.want)
		}
		if ok && (!strings.Contains(msg, "nftables") || !strings.Contains(msg, "iptables") || !strings.Contains(msg, "NodePort")) {
			t.Errorf("notice does not say what differs: %s", msg)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUnknownConfigFieldWarns: a config file with a field kube-proxy does
// not know is decoded leniently, as kube-proxy does, and the field is
// named in one warning at start; a value of the wrong type stays fatal.
func TestUnknownConfigFieldWarns(t *testing.T) {
	file := writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nconntrack:\n  maxPerCorez: 5\nfeatureGates:\n  InPlacePodVerticalScaling: true\n")
	out := filepath.Join(t.TempDir(), "out.yaml")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--config", file, "--manifests", t.TempDir(), "--write-config-to", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	cfg, err := config.Parse([]string{"--config", file, "--manifests", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.OSHost{}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logConfigWarnings(slog.New(slog.NewTextHandler(&logs, nil)), cfg)
	for _, want := range []string{`unknown field \"conntrack.maxPerCorez\"`, "InPlacePodVerticalScaling"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("start-up log lacks %s:\n%s", want, logs.String())
		}
	}
	bad := writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack: 5\n")
	if code := run([]string{"--config", bad, "--manifests", t.TempDir(), "--write-config-to", out}, &stdout, &stderr); code != 1 {
		t.Errorf("a value of the wrong type: exit %d, want 1", code)
	}
}

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--version"}, &out, &errOut); code != 0 {
		t.Fatalf("--version: exit %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "vipproxy ") || !strings.Contains(out.String(), "kube-proxy v1.34") {
		t.Errorf("--version printed %q", out.String())
	}
}

// TestServeRefusesUnopenableAllocationMap: an allocation map that cannot
// be opened stops vipproxy with an error naming it, though the manifests
// are read while it opens, and before the dataplane is built.
func TestServeRefusesUnopenableAllocationMap(t *testing.T) {
	manifests := t.TempDir()
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 127.0.99.1\n  ports: [{port: 18080}]\n"
	if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]string{"--manifests", manifests, "--state-dir", notADir, "--proxy-mode", "userspace",
		"--service-cluster-ip-range", "127.0.99.0/24", "--healthz-bind-address", freeAddr(t), "--metrics-bind-address", freeAddr(t)}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = serve(ctx, cfg, log)
	if ctx.Err() != nil {
		t.Fatal("vipproxy still ran 20 s after it was started with a map it cannot open")
	}
	if err == nil || !strings.Contains(err.Error(), "allocation map") {
		t.Fatalf("serve returned %v, want an error naming the allocation map", err)
	}
	if strings.Contains(logs.String(), "dataplane ready") {
		t.Errorf("the dataplane was built before the map failed:\n%s", logs.String())
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
