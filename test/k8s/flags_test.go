//go:build linux

package k8s

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// TestFlagsMatchKubeProxy requires every flag kube-proxy v1.34's --help
// lists (hack/kubeproxy.sh builds it) to exist in vipproxy's --help: a
// DaemonSet's command line written for kube-proxy starts vipproxy.
func TestFlagsMatchKubeProxy(t *testing.T) {
	kp := os.Getenv(kubeProxyEnv)
	if kp == "" {
		t.Skipf("%s is not set (hack/kubeproxy.sh builds kube-proxy; hack/test.sh sets it as root)", kubeProxyEnv)
	}
	flags := func(bin string) []string {
		out, _ := exec.Command(bin, "--help").CombinedOutput() // kube-proxy exits 0, vipproxy too
		var names []string
		for _, m := range regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
			names = append(names, m[1])
		}
		if len(names) < 20 {
			t.Fatalf("%s --help: only %d flags found:\n%s", bin, len(names), out)
		}
		return names
	}
	want, got := flags(kp), flags(e2e.Binary(t))
	for _, f := range want {
		if !slices.Contains(got, f) {
			t.Errorf("kube-proxy has --%s, vipproxy does not", f)
		}
	}
	t.Logf("kube-proxy: %d flags, vipproxy: %d", len(want), len(got))
}
