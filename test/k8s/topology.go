//go:build linux

package k8s

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

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
// and their pods (each running an e2e.Backend). Cleanup (its e2e.Rig's,
// registered with t.Cleanup by NewTopology) kills the processes it tracks,
// stops the backends and deletes every namespace, in reverse order.
type Topology struct {
	*e2e.Rig
	ID      string
	LAN     string
	Control string
	Client  string
}

var topoSeq atomic.Int64

// RequireRoot skips t unless it runs as root with ip, nft and sysctl.
func RequireRoot(t testing.TB) { e2e.RequireRoot(t) }

// NewTopology builds the bed with podsPerNode pods per node (1..20) and
// starts their backends. It fails t on any error.
func NewTopology(t testing.TB, podsPerNode int) *Topology {
	t.Helper()
	RequireRoot(t)
	if podsPerNode < 1 || podsPerNode > 20 {
		t.Fatalf("topology: podsPerNode %d not in 1..20", podsPerNode)
	}
	id := fmt.Sprintf("%d-%d", os.Getpid(), topoSeq.Add(1))
	topo := &Topology{Rig: e2e.NewRig(t), ID: id}
	name := func(role string) string { return nsPrefix + id + "-" + role }
	topo.LAN, topo.Control, topo.Client = name("lan"), name("cp"), name("client")
	topo.AddNodes(podsPerNode, name, "192.168.78.%d", "")
	if err := topo.build(); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	if err := topo.StartPods(topo.Client, BackendPorts, BackendPorts); err != nil {
		t.Fatalf("topology %s: %v", id, err)
	}
	return topo
}

func (topo *Topology) build() error {
	if err := topo.AddNetns(append([]string{topo.LAN, topo.Control, topo.Client}, topo.NodeNetns()...)...); err != nil {
		return err
	}
	for _, n := range topo.Nodes {
		if _, err := e2e.Exec(n.NS, "sysctl", "-q", "-w",
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
	if err := e2e.IPBatch(topo.LAN, lan); err != nil {
		return err
	}
	if err := e2e.IPBatch(topo.Control, []string{"link set lo up", "link set eth0 up",
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
	if err := e2e.IPBatch(topo.Client, client); err != nil {
		return err
	}
	return topo.WireNodes(lanGateway, "")
}

// SweepStale deletes namespaces named by this package whose test process
// (the PID in the name) no longer exists: leftovers of a killed run.
func SweepStale() { e2e.SweepStaleNetns(nsPrefix) }
