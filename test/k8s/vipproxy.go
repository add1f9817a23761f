//go:build linux

package k8s

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/test/e2e"
)

// ProxyOptions configure one vipproxy in Kubernetes mode.
type ProxyOptions struct {
	// Kubeconfig is passed as --kubeconfig (or written into the config
	// file when ConfigFile is set). Required.
	Kubeconfig string
	// ConfigFile, if set, is a KubeProxyConfiguration file to run with
	// (--config); Kubeconfig and the health/metrics addresses are set in a
	// copy of it. Empty: flags with vipproxy's defaults, nftables mode.
	ConfigFile string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// StartVipproxy runs the vipproxy binary bin in node's namespace as node
// (--hostname-override) and waits up to 60 s for /healthz to answer 200.
// The process is tracked by topo (killed by Cleanup); on failure of t its
// log's tail is printed.
func StartVipproxy(t testing.TB, topo *Topology, node *e2e.Node, bin string, o ProxyOptions) *Process {
	t.Helper()
	dir := t.TempDir()
	args := []string{bin, "--hostname-override", node.Name}
	if o.ConfigFile != "" {
		path, err := proxyConfigFile(o.ConfigFile, filepath.Join(dir, "config.conf"), o.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	} else {
		args = append(args,
			"--kubeconfig", o.Kubeconfig,
			"--proxy-mode", "nftables",
			"--cluster-cidr", ClusterCIDR,
			"--nodeport-addresses", LANCIDR,
			"--healthz-bind-address", HealthzAddr,
			"--metrics-bind-address", MetricsAddr,
			"--kube-api-qps", "50", "--kube-api-burst", "100",
			"-v", "2")
	}
	args = append(args, o.ExtraArgs...)
	p := newProcess("vipproxy "+node.Name, node.NS, filepath.Join(dir, "vipproxy-"+node.Name+".log"), args...)
	topo.Track(p)
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vipproxy on %s log (%s), tail:\n%s", node.Name, p.LogPath, p.Tail(100))
		}
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := WaitHealth(p, node, "/healthz", http.StatusOK, 60*time.Second); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, p.Tail(80))
	}
	return p
}

// WaitHealth polls path ("/healthz", "/livez") on node's health server
// until it answers code, p exits, or timeout passes.
func WaitHealth(p *Process, node *e2e.Node, path string, code int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if p != nil && !p.Running() {
			return fmt.Errorf("%s exited: %v", p.Name, p.ExitErr())
		}
		got, body, err := e2e.HTTPGet(node.NS, HealthzAddr, path)
		if err == nil && got == code {
			return nil
		}
		last = fmt.Sprintf("code %d body %q err %v", got, strings.TrimSpace(body), err)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s on %s: %s did not answer %d within %v: last %s", "vipproxy", node.Name, path, code, timeout, last)
}

// proxyConfigFile reads the KubeProxyConfiguration held by the ConfigMap
// manifest at cmPath (key config.conf), points it at kubeconfig and at the
// bed's loopback health and metrics addresses, and writes it to out. The
// rest of the deployed configuration is used as it is.
func proxyConfigFile(cmPath, out, kubeconfig string) (string, error) {
	data, err := os.ReadFile(cmPath)
	if err != nil {
		return "", fmt.Errorf("proxy config: %w", err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return "", fmt.Errorf("proxy config: %s: %w", cmPath, err)
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return "", fmt.Errorf("proxy config: %s: a %T, want a ConfigMap", cmPath, obj)
	}
	kp, err := config.DecodeFile("config.conf", []byte(cm.Data["config.conf"]))
	if err != nil {
		return "", fmt.Errorf("proxy config: %s: %w", cmPath, err)
	}
	kp.APIVersion, kp.Kind = "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"
	kp.ClientConnection.Kubeconfig = kubeconfig
	kp.HealthzBindAddress, kp.MetricsBindAddress = HealthzAddr, MetricsAddr
	b, err := yaml.Marshal(kp)
	if err != nil {
		return "", fmt.Errorf("proxy config: %w", err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return "", fmt.Errorf("proxy config: %w", err)
	}
	return out, nil
}
