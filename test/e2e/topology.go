//go:build linux

package e2e

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
	"testing"
	"time"
)

// Addresses of the test bed. The LAN is 192.168.77.0/24 and fd77::/64 on a
// bridge inside the LAN namespace (which owns .1 / ::1). Node k (1-based) is
// 192.168.77.1k / fd77::1k and routes pod CIDR 10.244.k.0/24 and
// fd00:10:244:k::/64; its pods are 10.244.k.10+i. The client owns
// 192.168.77.100 (primary) and .101, and fd77::100; it routes pod CIDRs to their
// nodes and the VIP ranges below through node1.
const (
	LANCIDR4       = "192.168.77.0/24"
	LANCIDR6       = "fd77::/64"
	ClusterCIDR4   = "10.244.0.0/16"
	ClusterCIDR6   = "fd00:10:244::/48"
	ServiceCIDR4   = "10.96.0.0/16"
	ServiceCIDR6   = "fd00:96::/112"
	ExternalIPCIDR = "198.51.100.0/24" // externalIPs, routed to node1 by the client
	LBCIDR         = "203.0.113.0/24"  // LoadBalancer ingress IPs, routed to node1
	ClientIP       = "192.168.77.100"
	ClientIP2      = "192.168.77.101"
	ClientIP6      = "fd77::100"
	nsPrefix       = "vpe2e-"
)

// BackendTCPPorts and BackendUDPPorts are the ports every pod's backend serves.
var (
	BackendTCPPorts = []int{8080, 8081}
	BackendUDPPorts = []int{8080, 8081}
)

// Node is a node namespace: it routes its pods and runs vipproxy.
type Node struct {
	Name  string // "node1", "node2": the --hostname-override
	NS    string // network namespace name
	Index int    // 1-based
	IPv4  string // LAN address
	IPv6  string
	Pods  []*Pod
}

// Pod is a backend namespace attached to a node by a veth pair.
type Pod struct {
	Name    string // also the backend's name in replies, e.g. "pod1a"
	NS      string
	Node    *Node
	IPv4    string
	IPv6    string
	Backend *Backend
}

// TopologyOptions shape NewTopology. The zero value gives two nodes with two
// pods each.
type TopologyOptions struct {
	// PodsPerNode is the number of pods per node (default 2, at most 20).
	PodsPerNode int
}

// Topology is one test's set of namespaces. Node 1 and 2, their pods, the
// client and the LAN are all removed by Cleanup, which NewTopology registers
// with t.Cleanup.
type Topology struct {
	t      testing.TB
	ID     string
	LAN    string // LAN namespace (bridge br0)
	Client string // client namespace
	Nodes  []*Node

	mu         sync.Mutex
	namespaces []string
	backends   []*Backend
	procs      []*Vipproxy
	cleaned    bool
}

var topoSeq atomic.Int64

// NewTopology builds the bed (skipping the test when not root or when ip/nft
// are missing) and starts every pod's backend. It fails the test on any error.
func NewTopology(t testing.TB, o TopologyOptions) *Topology {
	t.Helper()
	RequireRoot(t)
	if o.PodsPerNode <= 0 {
		o.PodsPerNode = 2
	}
	if o.PodsPerNode > 20 {
		t.Fatalf("topology: PodsPerNode %d > 20", o.PodsPerNode)
	}
	id := fmt.Sprintf("%d-%d", os.Getpid(), topoSeq.Add(1))
	topo := &Topology{t: t, ID: id}
	t.Cleanup(topo.Cleanup)
	name := func(role string) string { return nsPrefix + id + "-" + role }
	topo.LAN = name("lan")
	topo.Client = name("client")
	for k := 1; k <= 2; k++ {
		n := &Node{
			Name:  "node" + strconv.Itoa(k),
			NS:    name("node" + strconv.Itoa(k)),
			Index: k,
			IPv4:  fmt.Sprintf("192.168.77.%d", 10+k),
			IPv6:  fmt.Sprintf("fd77::%d", 10+k),
		}
		for i := 0; i < o.PodsPerNode; i++ {
			pn := fmt.Sprintf("pod%d%c", k, 'a'+i)
			n.Pods = append(n.Pods, &Pod{
				Name: pn,
				NS:   name(pn),
				Node: n,
				IPv4: fmt.Sprintf("10.244.%d.%d", k, 10+i),
				IPv6: fmt.Sprintf("fd00:10:244:%d::%d", k, 10+i),
			})
		}
		topo.Nodes = append(topo.Nodes, n)
	}
	if err := topo.build(); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	for _, p := range topo.Pods() {
		b, err := StartBackend(p.NS, p.Name, BackendTCPPorts, BackendUDPPorts)
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

// settle waits until the client reaches every pod over IPv4 and IPv6: new
// veth and bridge ports take a moment (link watch) before they forward.
func (topo *Topology) settle(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range topo.Pods() {
		for _, ip := range []string{p.IPv4, p.IPv6} {
			addr := net.JoinHostPort(ip, strconv.Itoa(BackendTCPPorts[0]))
			for {
				_, err := DialWith(topo.Client, "tcp", addr, DialOptions{Timeout: 200 * time.Millisecond})
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("not settled within %v: client to %s: %w", timeout, addr, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return nil
}

// Pods returns every pod, node1's first.
func (topo *Topology) Pods() []*Pod {
	var ps []*Pod
	for _, n := range topo.Nodes {
		ps = append(ps, n.Pods...)
	}
	return ps
}

// Pod returns the pod with the given name or fails the test.
func (topo *Topology) Pod(name string) *Pod {
	for _, p := range topo.Pods() {
		if p.Name == name {
			return p
		}
	}
	topo.t.Fatalf("topology: no pod %q", name)
	return nil
}

func (topo *Topology) addNS(ns string) error {
	if _, err := run("ip", "netns", "add", ns); err != nil {
		return err
	}
	topo.mu.Lock()
	topo.namespaces = append(topo.namespaces, ns)
	topo.mu.Unlock()
	return nil
}

// build creates the namespaces and links. Batches per namespace keep the
// number of ip(8) executions small.
func (topo *Topology) build() error {
	all := []string{topo.LAN, topo.Client}
	for _, n := range topo.Nodes {
		all = append(all, n.NS)
		for _, p := range n.Pods {
			all = append(all, p.NS)
		}
	}
	for _, ns := range all {
		if err := topo.addNS(ns); err != nil {
			return err
		}
	}
	// Sysctls before links so new interfaces inherit "default".
	routers := []string{topo.LAN}
	for _, n := range topo.Nodes {
		routers = append(routers, n.NS)
	}
	for _, ns := range routers {
		fwd := "0"
		if ns != topo.LAN {
			fwd = "1"
		}
		if _, err := run("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
			"net.ipv4.ip_forward="+fwd,
			"net.ipv6.conf.all.forwarding="+fwd,
			"net.ipv4.conf.all.rp_filter=0",
			"net.ipv4.conf.default.rp_filter=0",
			"net.ipv6.conf.all.accept_dad=0",
			"net.ipv6.conf.default.accept_dad=0",
		); err != nil {
			return err
		}
	}

	lan := []string{
		"link set lo up",
		"link add br0 type bridge",
		"link set br0 up",
		"addr add 192.168.77.1/24 dev br0",
		"addr add fd77::1/64 dev br0 nodad",
	}
	for _, n := range topo.Nodes {
		port := fmt.Sprintf("n%d", n.Index)
		lan = append(lan,
			fmt.Sprintf("link add %s type veth peer name eth0 netns %s", port, n.NS),
			fmt.Sprintf("link set %s master br0", port),
			fmt.Sprintf("link set %s up", port))
	}
	lan = append(lan,
		fmt.Sprintf("link add c1 type veth peer name eth0 netns %s", topo.Client),
		"link set c1 master br0",
		"link set c1 up")
	if err := ipBatch(topo.LAN, lan); err != nil {
		return err
	}

	for _, n := range topo.Nodes {
		cmds := []string{
			"link set lo up",
			"link set eth0 up",
			fmt.Sprintf("addr add %s/24 dev eth0", n.IPv4),
			fmt.Sprintf("addr add %s/64 dev eth0 nodad", n.IPv6),
			"route add default via 192.168.77.1",
			"route add ::/0 via fd77::1",
		}
		for _, o := range topo.Nodes {
			if o == n {
				continue
			}
			cmds = append(cmds,
				fmt.Sprintf("route add 10.244.%d.0/24 via %s", o.Index, o.IPv4),
				fmt.Sprintf("route add fd00:10:244:%d::/64 via %s", o.Index, o.IPv6))
		}
		for i, p := range n.Pods {
			dev := fmt.Sprintf("vp%d", i)
			cmds = append(cmds,
				fmt.Sprintf("link add %s type veth peer name eth0 netns %s", dev, p.NS),
				fmt.Sprintf("link set %s up", dev),
				fmt.Sprintf("addr add 10.244.%d.1/32 dev %s", n.Index, dev),
				fmt.Sprintf("addr add fd00:10:244:%d::1/128 dev %s nodad", n.Index, dev),
				fmt.Sprintf("route add %s/32 dev %s", p.IPv4, dev),
				fmt.Sprintf("route add %s/128 dev %s", p.IPv6, dev))
		}
		if err := ipBatch(n.NS, cmds); err != nil {
			return err
		}
		for _, p := range n.Pods {
			gw4 := fmt.Sprintf("10.244.%d.1", n.Index)
			gw6 := fmt.Sprintf("fd00:10:244:%d::1", n.Index)
			if err := ipBatch(p.NS, []string{
				"link set lo up",
				"link set eth0 up",
				fmt.Sprintf("addr add %s/32 dev eth0", p.IPv4),
				fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.IPv6),
				fmt.Sprintf("route add %s/32 dev eth0", gw4),
				fmt.Sprintf("route add default via %s dev eth0", gw4),
				fmt.Sprintf("route add %s/128 dev eth0", gw6),
				fmt.Sprintf("route add ::/0 via %s dev eth0", gw6),
			}); err != nil {
				return err
			}
		}
	}

	client := []string{
		"link set lo up",
		"link set eth0 up",
		"addr add " + ClientIP + "/24 dev eth0",
		"addr add " + ClientIP2 + "/24 dev eth0",
		"addr add " + ClientIP6 + "/64 dev eth0 nodad",
		"route add " + ServiceCIDR4 + " via 192.168.77.11",
		"route add " + ExternalIPCIDR + " via 192.168.77.11",
		"route add " + LBCIDR + " via 192.168.77.11",
		"route add " + ServiceCIDR6 + " via fd77::11",
	}
	for _, n := range topo.Nodes {
		client = append(client,
			fmt.Sprintf("route add 10.244.%d.0/24 via %s", n.Index, n.IPv4),
			fmt.Sprintf("route add fd00:10:244:%d::/64 via %s", n.Index, n.IPv6))
	}
	return ipBatch(topo.Client, client)
}

// Cleanup stops every vipproxy the topology started (by PID), closes the
// backends and deletes the namespaces. It is safe to call more than once and
// keeps going past errors, reporting them with t.Errorf.
func (topo *Topology) Cleanup() {
	topo.mu.Lock()
	if topo.cleaned {
		topo.mu.Unlock()
		return
	}
	topo.cleaned = true
	procs, backends, namespaces := topo.procs, topo.backends, topo.namespaces
	topo.mu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
	for _, b := range backends {
		b.Close()
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if _, err := run("ip", "netns", "del", namespaces[i]); err != nil {
			topo.t.Errorf("cleanup: %v", err)
		}
	}
}

// Exec runs a command inside namespace ns (via ip netns exec) and returns its
// combined output. It is bounded by a 30 s timeout.
func Exec(ns string, args ...string) (string, error) {
	return run("ip", append([]string{"netns", "exec", ns}, args...)...)
}

// run executes a command with a 30 s bound and returns its combined output.
func run(name string, args ...string) (string, error) {
	return runInput(nil, name, args...)
}

func runInput(stdin []byte, name string, args ...string) (string, error) {
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

// ipBatch runs ip(8) commands in namespace ns in one execution.
func ipBatch(ns string, cmds []string) error {
	_, err := runInput([]byte(strings.Join(cmds, "\n")+"\n"), "ip", "-n", ns, "-batch", "-")
	if err != nil {
		return fmt.Errorf("in %s: %w\ncommands:\n%s", ns, err, strings.Join(cmds, "\n"))
	}
	return nil
}

// RequireRoot skips the test unless it runs as root on Linux with ip, nft and
// sysctl available.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("e2e: needs root (network namespaces); run as root")
	}
	for _, tool := range []string{"ip", "nft", "sysctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("e2e: %s not installed: %v", tool, err)
		}
	}
}

// ownNamespaces lists namespaces this process created and has not deleted.
func ownNamespaces() []string {
	entries, _ := os.ReadDir("/run/netns")
	var own []string
	prefix := fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			own = append(own, e.Name())
		}
	}
	return own
}

// SweepOwn deletes the namespaces this process created and did not delete.
func SweepOwn() {
	for _, ns := range ownNamespaces() {
		run("ip", "netns", "del", ns)
	}
}

// SweepStale deletes namespaces with this package's prefix whose owning test
// process (the PID in the name) no longer exists: leftovers of a killed run.
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
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		run("ip", "netns", "del", name)
	}
}

// execLookPath is exec.LookPath (a seam for the mode tool checks).
var execLookPath = exec.LookPath
