//go:build linux

package k8s

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// Addresses of the bed (IPv4 only). The LAN is 192.168.78.0/24 on a bridge
// in the LAN namespace (which owns .1 and does not forward). The control
// plane owns .5, node k owns .1k and routes pod CIDR 10.244.k.0/24 (pods
// 10.244.k.10+i), the client owns .100 and routes the pod CIDRs to their
// nodes and the Service, external and load-balancer ranges through node1.
const (
	LANCIDR      = "192.168.78.0/24"
	ControlIP    = "192.168.78.5"
	ClientIP     = "192.168.78.100"
	ClusterCIDR  = "10.244.0.0/16"
	ServiceCIDR  = "10.96.0.0/16"
	LBCIDR       = "203.0.113.0/24"
	APIPort      = 6443
	HealthzAddr  = "127.0.0.1:10256"
	MetricsAddr  = "127.0.0.1:10249"
	nsPrefix     = "vpk8s-"
	lanGateway   = "192.168.78.1"
	kubernetesIP = "10.96.0.1" // the apiserver's own Service, first IP of ServiceCIDR
)

// BackendPorts are the TCP and UDP ports every pod's backend serves.
var BackendPorts = []int{8080, 8081}

// Topology is one bed's namespaces: LAN, control plane, client, two nodes
// and their pods (each running an e2e.Backend). Cleanup (registered with
// t.Cleanup by NewTopology) stops what the bed started and deletes every
// namespace, in reverse order.
type Topology struct {
	t       testing.TB
	ID      string
	LAN     string
	Control string
	Client  string
	Nodes   []*e2e.Node

	mu         sync.Mutex
	namespaces []string
	backends   []*e2e.Backend
	procs      []*Process
	cleaned    bool
}

var topoSeq atomic.Int64

// RequireRoot skips t unless it runs as root with ip, nft and sysctl.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("k8s: needs root (network namespaces); run as root")
	}
	for _, tool := range []string{"ip", "nft", "sysctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("k8s: %s not installed: %v", tool, err)
		}
	}
}

// NewTopology builds the bed with podsPerNode pods per node (1..20) and
// starts their backends. It fails t on any error.
func NewTopology(t testing.TB, podsPerNode int) *Topology {
	t.Helper()
	RequireRoot(t)
	if podsPerNode < 1 || podsPerNode > 20 {
		t.Fatalf("topology: podsPerNode %d not in 1..20", podsPerNode)
	}
	id := fmt.Sprintf("%d-%d", os.Getpid(), topoSeq.Add(1))
	topo := &Topology{t: t, ID: id}
	t.Cleanup(topo.Cleanup)
	name := func(role string) string { return nsPrefix + id + "-" + role }
	topo.LAN, topo.Control, topo.Client = name("lan"), name("cp"), name("client")
	for k := 1; k <= 2; k++ {
		n := &e2e.Node{Name: "node" + strconv.Itoa(k), NS: name("node" + strconv.Itoa(k)), Index: k,
			IPv4: fmt.Sprintf("192.168.78.%d", 10+k)}
		for i := 0; i < podsPerNode; i++ {
			pn := fmt.Sprintf("pod%d%c", k, 'a'+i)
			n.Pods = append(n.Pods, &e2e.Pod{Name: pn, NS: name(pn), Node: n, IPv4: fmt.Sprintf("10.244.%d.%d", k, 10+i)})
		}
		topo.Nodes = append(topo.Nodes, n)
	}
	if err := topo.build(); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	for _, p := range topo.Pods() {
		b, err := e2e.StartBackend(p.NS, p.Name, BackendPorts, BackendPorts)
		if err != nil {
			t.Fatalf("topology %s: %v", id, err)
		}
		p.Backend = b
		topo.mu.Lock()
		topo.backends = append(topo.backends, b)
		topo.mu.Unlock()
	}
	if err := topo.settle(10 * time.Second); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	return topo
}

// Pods returns every pod, node1's first.
func (topo *Topology) Pods() []*e2e.Pod {
	var ps []*e2e.Pod
	for _, n := range topo.Nodes {
		ps = append(ps, n.Pods...)
	}
	return ps
}

// Pod returns the named pod or fails the test.
func (topo *Topology) Pod(name string) *e2e.Pod {
	for _, p := range topo.Pods() {
		if p.Name == name {
			return p
		}
	}
	topo.t.Fatalf("topology: no pod %q", name)
	return nil
}

// Track registers p to be killed by Cleanup.
func (topo *Topology) Track(p *Process) {
	topo.mu.Lock()
	topo.procs = append(topo.procs, p)
	topo.mu.Unlock()
}

// settle waits until the client reaches every pod and the control plane:
// new veth and bridge ports take a moment before they forward.
func (topo *Topology) settle(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range topo.Pods() {
		addr := net.JoinHostPort(p.IPv4, strconv.Itoa(BackendPorts[0]))
		for {
			_, err := e2e.DialWith(topo.Client, "tcp", addr, e2e.DialOptions{Timeout: 200 * time.Millisecond})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("not settled within %v: client to %s: %w", timeout, addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func (topo *Topology) build() error {
	all := []string{topo.LAN, topo.Control, topo.Client}
	for _, n := range topo.Nodes {
		all = append(all, n.NS)
		for _, p := range n.Pods {
			all = append(all, p.NS)
		}
	}
	for _, ns := range all {
		if _, err := run(nil, "ip", "netns", "add", ns); err != nil {
			return err
		}
		topo.mu.Lock()
		topo.namespaces = append(topo.namespaces, ns)
		topo.mu.Unlock()
	}
	for _, n := range topo.Nodes {
		if _, err := run(nil, "ip", "netns", "exec", n.NS, "sysctl", "-q", "-w",
			"net.ipv4.ip_forward=1",
			"net.ipv4.conf.all.rp_filter=0",
			"net.ipv4.conf.default.rp_filter=0"); err != nil {
			return err
		}
	}
	lan := []string{"link set lo up", "link add br0 type bridge", "link set br0 up",
		"addr add " + lanGateway + "/24 dev br0"}
	attach := func(port, ns string) {
		lan = append(lan,
			fmt.Sprintf("link add %s type veth peer name eth0 netns %s", port, ns),
			fmt.Sprintf("link set %s master br0", port),
			fmt.Sprintf("link set %s up", port))
	}
	for _, n := range topo.Nodes {
		attach(fmt.Sprintf("n%d", n.Index), n.NS)
	}
	attach("cp", topo.Control)
	attach("c1", topo.Client)
	if err := ipBatch(topo.LAN, lan); err != nil {
		return err
	}
	if err := ipBatch(topo.Control, []string{"link set lo up", "link set eth0 up",
		"addr add " + ControlIP + "/24 dev eth0",
		// Replies to pods (the kubernetes Service's endpoint) go back via their node.
		"route add 10.244.1.0/24 via 192.168.78.11",
		"route add 10.244.2.0/24 via 192.168.78.12",
	}); err != nil {
		return err
	}
	client := []string{"link set lo up", "link set eth0 up", "addr add " + ClientIP + "/24 dev eth0",
		"route add " + ServiceCIDR + " via " + topo.Nodes[0].IPv4,
		"route add " + LBCIDR + " via " + topo.Nodes[0].IPv4}
	for _, n := range topo.Nodes {
		client = append(client, fmt.Sprintf("route add 10.244.%d.0/24 via %s", n.Index, n.IPv4))
	}
	if err := ipBatch(topo.Client, client); err != nil {
		return err
	}
	for _, n := range topo.Nodes {
		cmds := []string{"link set lo up", "link set eth0 up",
			fmt.Sprintf("addr add %s/24 dev eth0", n.IPv4),
			"route add default via " + lanGateway}
		for _, o := range topo.Nodes {
			if o != n {
				cmds = append(cmds, fmt.Sprintf("route add 10.244.%d.0/24 via %s", o.Index, o.IPv4))
			}
		}
		for i, p := range n.Pods {
			dev := fmt.Sprintf("vp%d", i)
			cmds = append(cmds,
				fmt.Sprintf("link add %s type veth peer name eth0 netns %s", dev, p.NS),
				fmt.Sprintf("link set %s up", dev),
				fmt.Sprintf("addr add 10.244.%d.1/32 dev %s", n.Index, dev),
				fmt.Sprintf("route add %s/32 dev %s", p.IPv4, dev))
		}
		if err := ipBatch(n.NS, cmds); err != nil {
			return err
		}
		for _, p := range n.Pods {
			gw := fmt.Sprintf("10.244.%d.1", n.Index)
			if err := ipBatch(p.NS, []string{"link set lo up", "link set eth0 up",
				fmt.Sprintf("addr add %s/32 dev eth0", p.IPv4),
				fmt.Sprintf("route add %s/32 dev eth0", gw),
				fmt.Sprintf("route add default via %s dev eth0", gw)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Cleanup kills the bed's processes, stops the backends and deletes the
// namespaces. It runs once; later calls do nothing.
func (topo *Topology) Cleanup() {
	topo.mu.Lock()
	if topo.cleaned {
		topo.mu.Unlock()
		return
	}
	topo.cleaned = true
	procs, backends, namespaces := topo.procs, topo.backends, topo.namespaces
	topo.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Kill()
	}
	for _, b := range backends {
		b.Close()
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if _, err := run(nil, "ip", "netns", "del", namespaces[i]); err != nil {
			topo.t.Errorf("cleanup: %v", err)
		}
	}
}

// SweepStale deletes namespaces named by this package whose test process
// (the PID in the name) no longer exists: leftovers of a killed run.
func SweepStale() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, nsPrefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(name, nsPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue
		}
		run(nil, "ip", "netns", "del", name)
	}
}

// run executes a command with a 30 s bound and returns its combined output.
func run(stdin []byte, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func ipBatch(ns string, cmds []string) error {
	if _, err := run([]byte(strings.Join(cmds, "\n")+"\n"), "ip", "-n", ns, "-batch", "-"); err != nil {
		return fmt.Errorf("in %s: %w", ns, err)
	}
	return nil
}
