//go:build linux

package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// cluster is the shared bed of TestKubernetes: topology, control plane,
// an admin client and vipproxy on both nodes (node1 with flags, node2 with
// the deployed ConfigMap's configuration).
type cluster struct {
	*Topology
	cp      *ControlPlane
	admin   *kubernetes.Clientset
	proxies []*Process // index k-1 runs on node k
	root    string     // module root (for deploy/)
}

func moduleRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("k8s: cannot locate the source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	RequireRoot(t)
	bin := Binaries(t)
	proxyBin := e2e.Binary(t)
	start := time.Now()
	c := &cluster{Topology: NewTopology(t, 2), root: moduleRoot(t)}
	c.cp = StartControlPlane(t, c.Topology, bin)
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Millisecond))
	c.admin = c.cp.Client(t, c.cp.AdminKubeconfig)
	ctx := context.Background()

	// vipproxy's permissions are exactly deploy/rbac.yaml's.
	for _, obj := range c.deployObjects(t, "rbac.yaml") {
		if err := createObject(ctx, c.admin, obj, false); err != nil {
			t.Fatalf("apply deploy/rbac.yaml: %v", err)
		}
	}
	registerNodes(t, c.admin, c.Nodes)
	c.proxies = append(c.proxies,
		StartVipproxy(t, c.Topology, c.Nodes[0], proxyBin, ProxyOptions{Kubeconfig: c.cp.ProxyKubeconfig}),
		StartVipproxy(t, c.Topology, c.Nodes[1], proxyBin, ProxyOptions{Kubeconfig: c.cp.ProxyKubeconfig,
			ConfigFile: filepath.Join(c.root, "deploy", "configmap.yaml")}))
	t.Logf("bed ready in %v", time.Since(start).Round(time.Millisecond))
	return c
}

// registerNodes creates the Node objects of nodes, with their addresses in
// the status as a kubelet sets them (status is a subresource).
func registerNodes(t testing.TB, admin kubernetes.Interface, nodes []*e2e.Node) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		obj := nodeObject(n)
		got, err := admin.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node %s: %v", n.Name, err)
		}
		if len(got.Status.Addresses) == 0 {
			got.Status = obj.Status
			if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("node %s status: %v", n.Name, err)
			}
		}
	}
}

// waitKubernetesService waits until a TCP connection from the client to
// the API server's own Service (its endpoint kept by the API server)
// succeeds, and fails t after settle.
func (c *cluster) waitKubernetesService(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		conn, err := e2e.DialConn(c.Client, "tcp", hostPort(kubernetesIP, 443), e2e.DialOptions{Timeout: 500 * time.Millisecond})
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubernetes Service %s:443 not reachable: %v", kubernetesIP, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startKubeProxy runs kube-proxy (binary kp) in mode on node with the
// admin kubeconfig and the bed's health and metrics addresses, leaving
// the global conntrack settings alone; it is killed when t ends.
func startKubeProxy(t testing.TB, topo *Topology, node *e2e.Node, kp, mode, kubeconfig string) *Process {
	t.Helper()
	p := newProcess("kube-proxy "+mode, node.NS, filepath.Join(t.TempDir(), "kube-proxy.log"),
		kp, "--proxy-mode", mode, "--hostname-override", node.Name,
		"--kubeconfig", kubeconfig, "--cluster-cidr", ClusterCIDR,
		"--healthz-bind-address", HealthzAddr, "--metrics-bind-address", MetricsAddr,
		// The conntrack table size is global: leave it alone.
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0")
	topo.Track(p)
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("kube-proxy log tail:\n%s", p.Tail(60))
		}
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeObject is the Node a kubelet would register for n.
func nodeObject(n *e2e.Node) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{corev1.LabelHostname: n.Name}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.IPv4},
			{Type: corev1.NodeHostName, Address: n.Name},
		}},
	}
}

func (c *cluster) node(k int) *e2e.Node { return c.Nodes[k-1] }

// service returns a Service in "default" (ClusterIP allocated by the API
// server unless clusterIP is set) with TCP port 80→8080 "http" and UDP port
// 53→8081 "dns".
func service(name, clusterIP string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8081)},
			},
		},
	}
	if clusterIP != "" {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIP, []string{clusterIP}
	}
	return s
}

// createService creates svc, deletes it when the test ends, and returns the
// stored object (with its ClusterIP and NodePorts).
func (c *cluster) createService(t testing.TB, svc *corev1.Service) *corev1.Service {
	t.Helper()
	got, err := c.admin.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		err := c.admin.CoreV1().Services(svc.Namespace).Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete service %s: %v", svc.Name, err)
		}
	})
	return got
}

// slice returns the IPv4 EndpointSlice "<svc>-<suffix>" of svc with eps.
func slice(svc *corev1.Service, suffix string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := e2e.Slice(svc, discoveryv1.AddressTypeIPv4, suffix, eps...)
	s.TypeMeta = metav1.TypeMeta{}
	s.Labels[discoveryv1.LabelManagedBy] = "vipproxy-k8s-test"
	return s
}

// ep is a ready endpoint of pod with the given conditions applied.
func ep(p *e2e.Pod) discoveryv1.Endpoint { return e2e.EP(p) }

// createSlice creates s and deletes it when the test ends.
func (c *cluster) createSlice(t testing.TB, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	got, err := c.admin.DiscoveryV1().EndpointSlices(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create endpointslice %s: %v", s.Name, err)
	}
	t.Cleanup(func() {
		err := c.admin.DiscoveryV1().EndpointSlices(s.Namespace).Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete endpointslice %s: %v", s.Name, err)
		}
	})
	return got
}

// setEndpoints replaces the endpoints of the stored slice named like s.
func (c *cluster) setEndpoints(t testing.TB, s *discoveryv1.EndpointSlice, eps ...discoveryv1.Endpoint) {
	t.Helper()
	api := c.admin.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := api.Get(context.Background(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get endpointslice %s: %v", s.Name, err)
	}
	cur.Endpoints = eps
	if cur.Endpoints == nil {
		cur.Endpoints = []discoveryv1.Endpoint{}
	}
	if _, err := api.Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update endpointslice %s: %v", s.Name, err)
	}
}

// updateNode applies mutate to the stored Node (retrying conflicts).
func (c *cluster) updateNode(t testing.TB, name string, mutate func(*corev1.Node)) {
	t.Helper()
	api := c.admin.CoreV1().Nodes()
	for i := 0; i < 5; i++ {
		n, err := api.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get node %s: %v", name, err)
		}
		mutate(n)
		if _, err = api.Update(context.Background(), n, metav1.UpdateOptions{}); err == nil {
			return
		} else if !apierrors.IsConflict(err) {
			t.Fatalf("update node %s: %v", name, err)
		}
	}
	t.Fatalf("update node %s: conflicts", name)
}

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

// waitFor dials addr from the client until check accepts the reply (each
// dial bounded by 500 ms) or timeout passes; it fails t then.
func (c *cluster) waitFor(t testing.TB, proto, addr string, timeout time.Duration, check func(e2e.Reply) error) e2e.Reply {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		r, err := e2e.DialWith(c.Client, proto, addr, e2e.DialOptions{Timeout: 500 * time.Millisecond})
		if err == nil {
			if err = check(r); err == nil {
				return r
			}
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: not as expected within %v: %v", proto, addr, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// from accepts replies from the named backends only.
func from(names ...string) func(e2e.Reply) error {
	return func(r e2e.Reply) error {
		if slices.Contains(names, r.Backend) {
			return nil
		}
		return fmt.Errorf("reply from %s, want one of %v", r.Backend, names)
	}
}

// spread dials addr n times and counts the answering backends; failed
// dials count under "error: ...".
func (c *cluster) spread(proto, addr string, n int) map[string]int {
	got := map[string]int{}
	for i := 0; i < n; i++ {
		r, err := e2e.DialWith(c.Client, proto, addr, e2e.DialOptions{Timeout: time.Second})
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		got[r.Backend]++
	}
	return got
}

// expectOnly asserts that n dials all reach backends in names, and
// returns the counts.
func (c *cluster) expectOnly(t testing.TB, proto, addr string, n int, names ...string) map[string]int {
	t.Helper()
	got := c.spread(proto, addr, n)
	for b := range got {
		if !slices.Contains(names, b) {
			t.Errorf("%s %s: answers %v, want only %v", proto, addr, got, names)
			break
		}
	}
	return got
}

// expectNoAnswer waits (up to settle) until a TCP connect from the client
// to addr times out — dropped, neither refused nor answered — and asserts
// that three more do too.
func (c *cluster) expectNoAnswer(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		_, err := e2e.DialWith(c.Client, "tcp", addr, e2e.DialOptions{Timeout: 700 * time.Millisecond})
		if isTimeout(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tcp %s: not dropped within %v (last: %v)", addr, settle, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		r, err := e2e.DialWith(c.Client, "tcp", addr, e2e.DialOptions{Timeout: 700 * time.Millisecond})
		switch {
		case err == nil:
			t.Errorf("tcp %s: answered by %s, want dropped", addr, r.Backend)
			return
		case !isTimeout(err):
			t.Errorf("tcp %s: %v, want a timeout (dropped)", addr, err)
			return
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// percentile returns the p-th percentile (0..100, nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}
