//go:build linux

package k8s

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// TestMigrateFromKubeProxyIPVS: kube-proxy v1.34 runs in ipvs mode on
// node1 (a kernel with IPVS: the QEMU guests of hack/vm.sh), Services work
// through it; it stops (its rules, kube-ipvs0, virtual servers and ipsets
// stay, as after any kube-proxy exit); vipproxy starts in nftables mode:
// traffic flows, and kube-proxy's leftovers are gone.
func TestMigrateFromKubeProxyIPVS(t *testing.T) {
	if os.Getenv("VIPPROXY_E2E_REAL_IPVS") != "1" {
		t.Skip("VIPPROXY_E2E_REAL_IPVS is not 1: this kernel has no IPVS (run through hack/vm-test.sh k8s)")
	}
	kp := os.Getenv(kubeProxyEnv)
	if kp == "" {
		t.Skipf("%s is not set (hack/kubeproxy.sh builds kube-proxy)", kubeProxyEnv)
	}
	c := &cluster{Topology: NewTopology(t, 2), root: moduleRoot(t)}
	c.cp = StartControlPlane(t, c.Topology, Binaries(t))
	c.admin = c.cp.Client(t, c.cp.AdminKubeconfig)
	registerNodes(t, c.admin, c.Nodes)
	svc := c.createService(t, service("web", ""))
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	node := c.node(1)
	vip := hostPort(svc.Spec.ClusterIP, 80)

	kubeProxy := startKubeProxy(t, c.Topology, node, kp, "ipvs", c.cp.AdminKubeconfig)
	if err := WaitHealth(kubeProxy, node, "/healthz", http.StatusOK, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	// kube-proxy's /healthz is 200 before its first sync: wait for the
	// virtual server itself, and for its filter rules, which match its
	// ipsets (they cannot be destroyed while a rule matches them).
	for start := time.Now(); ; time.Sleep(time.Second) {
		out, _ := nsRun(node.NS, "ipvsadm", "-Ln")
		filter, _ := nsRun(node.NS, "iptables-save", "-t", "filter")
		if strings.Contains(out, svc.Spec.ClusterIP) && strings.Contains(filter, "--match-set KUBE-CLUSTER-IP") {
			break
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("kube-proxy is not in ipvs mode (no virtual server for %s, or no KUBE-IPVS-FILTER rules):\n%s\n%s", svc.Spec.ClusterIP, out, filter)
		}
	}
	c.waitFor(t, "tcp", vip, 2*time.Minute, from(names...))
	kubeProxy.Kill() // as a DaemonSet update does; its state stays behind
	for what, argv := range map[string][]string{
		"kube-ipvs0":        {"ip", "link", "show", "kube-ipvs0"},
		"KUBE ipsets":       {"sh", "-c", "ipset list -n | grep KUBE-"},
		"KUBE chains":       {"sh", "-c", "iptables-save | grep KUBE-SERVICES"},
		"an IPVS ClusterIP": {"sh", "-c", "ipvsadm -Ln | grep " + svc.Spec.ClusterIP},
	} {
		if _, err := nsRun(node.NS, argv...); err != nil {
			t.Fatalf("after kube-proxy stopped: no %s left over, the test would prove nothing", what)
		}
	}

	StartVipproxy(t, c.Topology, node, e2e.Binary(t), ProxyOptions{Kubeconfig: c.cp.AdminKubeconfig})
	c.waitFor(t, "tcp", vip, 2*time.Minute, from(names...))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var left []string
		if _, err := nsRun(node.NS, "ip", "link", "show", "kube-ipvs0"); err == nil {
			left = append(left, "kube-ipvs0")
		}
		if out, _ := nsRun(node.NS, "ipset", "list", "-n"); strings.Contains(out, "KUBE-") {
			left = append(left, "KUBE-* ipsets")
		}
		if out, _ := nsRun(node.NS, "iptables-save"); strings.Contains(out, "KUBE-SERVICES") || strings.Contains(out, "KUBE-IPVS-FILTER") {
			left = append(left, "KUBE-* chains")
		}
		if out, _ := nsRun(node.NS, "ipvsadm", "-Ln"); strings.Contains(out, svc.Spec.ClusterIP) {
			left = append(left, "IPVS virtual servers on kube-proxy's VIPs")
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy's IPVS leftovers still there 3 min after vipproxy started: %v", left)
		}
		time.Sleep(time.Second)
	}
	c.expectOnly(t, "tcp", vip, 10, names...)
}
