//go:build linux

package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Versions hack/controlplane.sh builds by default; the default cache
// directory is named after them.
const (
	KubeVersion = "v1.37.2"
	EtcdVersion = "v3.7.3"
)

// Identities of the generated client certificates. ProxyUser is the user
// name the API server derives for a ServiceAccount kube-system/vipproxy, so
// RBAC bindings to that ServiceAccount (deploy/rbac.yaml) apply to vipproxy
// in the tests exactly as in a cluster.
const (
	AdminUser = "vipproxy-test-admin"
	ProxyUser = "system:serviceaccount:kube-system:vipproxy"
)

// Binaries returns the directory holding kube-apiserver and etcd:
// $VIPPROXY_CONTROLPLANE, else hack/controlplane.sh's default cache
// directory. It skips t with instructions when neither holds both.
func Binaries(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("VIPPROXY_CONTROLPLANE")
	if dir == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "vipproxy", "controlplane", KubeVersion+"-etcd-"+EtcdVersion)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Skipf("k8s: control-plane binaries missing (%v); run hack/controlplane.sh and set VIPPROXY_CONTROLPLANE to the directory it prints", err)
		}
	}
	return dir
}

// ControlPlane is etcd and kube-apiserver running in the Topology's control
// namespace, with the PKI and kubeconfigs they were started with.
type ControlPlane struct {
	PKI *PKI
	// AdminKubeconfig (system:masters) and ProxyKubeconfig (ProxyUser) point
	// at https://ControlIP:APIPort, reachable from the node namespaces.
	AdminKubeconfig string
	ProxyKubeconfig string
	Etcd            *Process
	APIServer       *Process

	topo *Topology
}

// StartControlPlane generates the PKI, starts etcd and kube-apiserver from
// bin in topo's control namespace and waits until /readyz answers ok. It
// fails t on any error (with the logs' tails).
func StartControlPlane(t testing.TB, topo *Topology, bin string) *ControlPlane {
	t.Helper()
	dir := t.TempDir()
	pki, err := NewPKI(dir,
		[]net.IP{net.ParseIP(ControlIP), net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesIP)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{PKI: pki, topo: topo,
		AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig"),
		ProxyKubeconfig: filepath.Join(dir, "vipproxy.kubeconfig")}
	server := "https://" + net.JoinHostPort(ControlIP, strconv.Itoa(APIPort))
	for name, user := range map[string][]string{"admin": {AdminUser, "system:masters"}, "vipproxy": {ProxyUser}} {
		if _, _, err := pki.Client(name, user[0], user[1:]...); err != nil {
			t.Fatal(err)
		}
		if err := pki.Kubeconfig(filepath.Join(dir, name+".kubeconfig"), server, name); err != nil {
			t.Fatal(err)
		}
	}
	cp.Etcd = newProcess("etcd", topo.Control, filepath.Join(dir, "etcd.log"),
		filepath.Join(bin, "etcd"),
		"--name", "vpk8s",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "vpk8s=http://127.0.0.1:2380",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	cp.APIServer = newProcess("kube-apiserver", topo.Control, filepath.Join(dir, "kube-apiserver.log"),
		filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0",
		"--secure-port", strconv.Itoa(APIPort),
		"--advertise-address", ControlIP,
		"--tls-cert-file", pki.Path("apiserver.crt"),
		"--tls-private-key-file", pki.Path("apiserver.key"),
		"--client-ca-file", pki.CACert,
		"--service-account-key-file", pki.Path("sa.pub"),
		"--service-account-signing-key-file", pki.Path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", ServiceCIDR,
		"--service-node-port-range", "30000-32767",
		"--authorization-mode", "RBAC",
		// No controller-manager runs: nothing would create the default
		// ServiceAccounts or evaluate quotas.
		"--disable-admission-plugins", "ServiceAccount,ResourceQuota",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v", "1",
	)
	topo.Track(cp.Etcd)
	topo.Track(cp.APIServer)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("etcd log (%s), tail:\n%s", cp.Etcd.LogPath, cp.Etcd.Tail(30))
			t.Logf("kube-apiserver log (%s), tail:\n%s", cp.APIServer.LogPath, cp.APIServer.Tail(60))
		}
	})
	if err := cp.Etcd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitTCP(topo.Control, "127.0.0.1:2379", 30*time.Second, cp.Etcd); err != nil {
		t.Fatalf("%v\netcd log:\n%s", err, cp.Etcd.Tail(40))
	}
	if err := cp.StartAPIServer(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	return cp
}

// StartAPIServer (re)starts kube-apiserver and waits up to timeout for
// /readyz to answer ok.
func (cp *ControlPlane) StartAPIServer(timeout time.Duration) error {
	if err := cp.APIServer.Start(); err != nil {
		return err
	}
	if err := cp.WaitReady(timeout); err != nil {
		return fmt.Errorf("%w\nkube-apiserver log:\n%s", err, cp.APIServer.Tail(60))
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 30 s).
func (cp *ControlPlane) StopAPIServer() { cp.APIServer.Stop(30 * time.Second) }

// WaitReady polls /readyz until it answers "ok", the apiserver exits, or
// timeout passes.
func (cp *ControlPlane) WaitReady(timeout time.Duration) error {
	rc, err := cp.RESTConfig(cp.AdminKubeconfig)
	if err != nil {
		return err
	}
	rc.Timeout = 5 * time.Second
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("controlplane: client: %w", err)
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !cp.APIServer.Running() {
			return fmt.Errorf("controlplane: kube-apiserver exited: %v", cp.APIServer.ExitErr())
		}
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = fmt.Errorf("readyz: %q: %v", body, err)
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("controlplane: not ready within %v: %w", timeout, last)
}

// RESTConfig loads kubeconfig and makes it usable from the test process,
// which lives outside the bed: connections are dialled from inside the
// control namespace. QPS limits are raised for bulk test writes.
func (cp *ControlPlane) RESTConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	ns := cp.topo.Control
	rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		timeout := 5 * time.Second
		if d, ok := ctx.Deadline(); ok {
			timeout = time.Until(d)
		}
		return e2e.DialConn(ns, network, addr, e2e.DialOptions{Timeout: timeout})
	}
	rc.QPS, rc.Burst = 2000, 4000
	rc.UserAgent = "vipproxy-k8s-test"
	return rc, nil
}

// Client returns a client-go clientset for kubeconfig (AdminKubeconfig or
// ProxyKubeconfig), failing t on error.
func (cp *ControlPlane) Client(t testing.TB, kubeconfig string) *kubernetes.Clientset {
	t.Helper()
	rc, err := cp.RESTConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitTCP waits until a TCP connect from ns to addr succeeds.
func waitTCP(ns, addr string, timeout time.Duration, p *Process) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := e2e.DialConn(ns, "tcp", addr, e2e.DialOptions{Timeout: 200 * time.Millisecond})
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && !p.Running() {
			return fmt.Errorf("%s exited: %v", p.Name, p.ExitErr())
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("%s: %s not reachable within %v", p.Name, addr, timeout), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
