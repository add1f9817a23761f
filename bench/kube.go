//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipproxy/vipproxy/test/e2e"
	"github.com/vipproxy/vipproxy/test/k8s"
)

// APIPort is kube-apiserver's secure port in the control namespace.
const APIPort = 6443

// ControlPlane is etcd and kube-apiserver (built by hack/controlplane.sh)
// running in their own namespace, reachable from node namespaces at
// ControlIP once a Bed links to it.
type ControlPlane struct {
	NS         string
	Kubeconfig string // system:masters, server https://ControlIP:APIPort
	Client     *kubernetes.Clientset
	etcd, api  *Proc
}

// StartControlPlane starts etcd and kube-apiserver from the binaries in bin
// inside a new namespace, with state in dir, and waits up to 3 minutes for
// /readyz. Close stops them and deletes the namespace.
func StartControlPlane(bin, dir string) (cp *ControlPlane, err error) {
	ns, err := NewControlNS()
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{NS: ns}
	defer func() {
		if err != nil {
			cp.Close()
		}
	}()
	// The control namespace needs ControlIP before the API server starts
	// (it advertises it); a placeholder address on lo serves until a Bed
	// adds the veth, and keeps the API server reachable between beds.
	if err := run("ip", "-n", ns, "addr", "add", ControlIP+"/32", "dev", "lo"); err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	pki, err := k8s.NewPKI(dir, []net.IP{net.ParseIP(ControlIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	if _, _, err := pki.Client("admin", "vipproxy-bench-admin", "system:masters"); err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	cp.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := pki.Kubeconfig(cp.Kubeconfig, "https://"+net.JoinHostPort(ControlIP, strconv.Itoa(APIPort)), "admin"); err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	cp.etcd = newProc("etcd", ns, filepath.Join(dir, "etcd.log"),
		filepath.Join(bin, "etcd"), "--name", "vpbench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "vpbench=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn",
		"--quota-backend-bytes", strconv.Itoa(8<<30),
	)
	cp.api = newProc("kube-apiserver", ns, filepath.Join(dir, "kube-apiserver.log"),
		filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(APIPort),
		"--advertise-address", ControlIP,
		"--tls-cert-file", pki.Path("apiserver.crt"), "--tls-private-key-file", pki.Path("apiserver.key"),
		"--client-ca-file", pki.CACert,
		"--service-account-key-file", pki.Path("sa.pub"), "--service-account-signing-key-file", pki.Path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", ServiceCIDR,
		"--authorization-mode", "RBAC",
		"--disable-admission-plugins", "ServiceAccount,ResourceQuota",
		"--enable-priority-and-fairness=false",
		"--max-requests-inflight", "2000", "--max-mutating-requests-inflight", "1000",
		"--profiling=false", "--v", "1",
	)
	if err := cp.etcd.Start(); err != nil {
		return cp, err
	}
	if err := cp.api.Start(); err != nil {
		return cp, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return e2e.DialConn(ns, network, addr, e2e.DialOptions{Timeout: 5 * time.Second})
	}
	rc.QPS, rc.Burst = 5000, 10000
	rc.UserAgent = "vipproxy-bench"
	if cp.Client, err = kubernetes.NewForConfig(rc); err != nil {
		return cp, fmt.Errorf("controlplane: %w", err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			break
		}
		if !cp.api.Running() || !cp.etcd.Running() || time.Now().After(deadline) {
			return cp, fmt.Errorf("controlplane: not ready (%v)\netcd:\n%s\nkube-apiserver:\n%s", err, cp.etcd.Tail(20), cp.api.Tail(40))
		}
		time.Sleep(300 * time.Millisecond)
	}
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return cp, fmt.Errorf("controlplane: namespace: %w", err)
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{corev1.LabelHostname: NodeName}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}},
	}
	n, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return cp, fmt.Errorf("controlplane: node: %w", err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP}, {Type: corev1.NodeHostName, Address: NodeName}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return cp, fmt.Errorf("controlplane: node status: %w", err)
	}
	return cp, nil
}

// Close stops kube-apiserver and etcd and deletes the namespace.
func (cp *ControlPlane) Close() {
	if cp.api != nil {
		cp.api.Stop(20 * time.Second)
	}
	if cp.etcd != nil {
		cp.etcd.Stop(10 * time.Second)
	}
	DeleteNS(cp.NS)
}

// Load creates Services [from, to) of s with their EndpointSlices through
// the API with workers concurrent writers. Objects that exist already are
// left alone.
func (cp *ControlPlane) Load(ctx context.Context, s *Set, from, to, workers int) error {
	idx := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if _, err := cp.Client.CoreV1().Services(Namespace).Create(ctx, s.Service(i), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					errc <- fmt.Errorf("load: service %s: %w", s.Name(i), err)
					return
				}
				if _, err := cp.Client.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, s.Slice(i, false), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					errc <- fmt.Errorf("load: endpointslice %s: %w", s.Name(i), err)
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := from; i < to; i++ {
		select {
		case idx <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// SetSlice writes Service i's EndpointSlice (live or dead port) and returns
// when the write was sent (after the read of the current version).
func (cp *ControlPlane) SetSlice(ctx context.Context, s *Set, i int, live bool) (time.Time, error) {
	cur, err := cp.Client.DiscoveryV1().EndpointSlices(Namespace).Get(ctx, s.Name(i)+"-1", metav1.GetOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("endpointslice %s: %w", s.Name(i), err)
	}
	want := s.Slice(i, live)
	want.ResourceVersion = cur.ResourceVersion
	start := time.Now()
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(Namespace).Update(ctx, want, metav1.UpdateOptions{}); err != nil {
		return start, fmt.Errorf("endpointslice %s: %w", s.Name(i), err)
	}
	return start, nil
}
