//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
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
// client and the LAN are all removed by Cleanup (its Rig's), which
// NewTopology registers with t.Cleanup.
type Topology struct {
	*Rig
	t      testing.TB
	ID     string
	LAN    string // LAN namespace (bridge br0)
	Client string // client namespace
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
	topo := &Topology{Rig: NewRig(t), t: t, ID: id}
	name := func(role string) string { return nsPrefix + id + "-" + role }
	topo.LAN = name("lan")
	topo.Client = name("client")
	topo.AddNodes(o.PodsPerNode, name, "192.168.77.%d", "fd77::%d")
	if err := topo.build(); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	if err := topo.StartPods(topo.Client, BackendTCPPorts, BackendUDPPorts); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	return topo
}

// build creates the namespaces and links. Batches per namespace keep the
// number of ip(8) executions small.
func (topo *Topology) build() error {
	if err := topo.AddNetns(append([]string{topo.LAN, topo.Client}, topo.NodeNetns()...)...); err != nil {
		return err
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
		if _, err := Exec(ns, "sysctl", "-q", "-w",
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
	if err := IPBatch(topo.LAN, lan); err != nil {
		return err
	}

	if err := topo.WireNodes("192.168.77.1", "fd77::1"); err != nil {
		return err
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
	return IPBatch(topo.Client, client)
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
func ownNamespaces() []string { return OwnNetns(nsPrefix) }

// SweepOwn deletes the namespaces this process created and did not delete.
func SweepOwn() { SweepOwnNetns(nsPrefix) }

// SweepStale deletes namespaces with this package's prefix whose owning test
// process (the PID in the name) no longer exists: leftovers of a killed run.
func SweepStale() { SweepStaleNetns(nsPrefix) }

// execLookPath is exec.LookPath (a seam for the mode tool checks).
var execLookPath = exec.LookPath
