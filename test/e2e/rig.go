//go:build linux

package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Rig is what a test bed made of network namespaces owns, shared by this
// package's Topology and test/k8s's: its nodes and their pods, the
// namespaces it created, and the backends and processes running in them.
// Cleanup tears it all down; NewRig registers it with t.Cleanup. The methods
// are safe for concurrent use; Nodes is set while the bed is built.
type Rig struct {
	Nodes []*Node
	t     testing.TB

	mu         sync.Mutex
	namespaces []string
	backends   []*Backend
	procs      []*Process
	cleaned    bool
}

// NewRig returns an empty rig for t and registers its Cleanup with
// t.Cleanup.
func NewRig(t testing.TB) *Rig {
	r := &Rig{t: t}
	t.Cleanup(r.Cleanup)
	return r
}

// AddNetns creates the named namespaces in order, registering each one for
// deletion by Cleanup as soon as it exists. It stops at the first error.
func (r *Rig) AddNetns(names ...string) error {
	for _, ns := range names {
		if _, err := run("ip", "netns", "add", ns); err != nil {
			return err
		}
		r.mu.Lock()
		r.namespaces = append(r.namespaces, ns)
		r.mu.Unlock()
	}
	return nil
}

// AddNodes appends nodes "node1" and "node2" to Nodes, each with
// podsPerNode pods "pod<k>a", "pod<k>b", …, their namespaces named by
// ns(name). Node k's LAN address is fmt.Sprintf(lan4, 10+k) and, unless lan6
// is "", fmt.Sprintf(lan6, 10+k); pod i of node k is 10.244.k.(10+i) and,
// with IPv6, fd00:10:244:k::(10+i). It must be called before the bed runs.
func (r *Rig) AddNodes(podsPerNode int, ns func(name string) string, lan4, lan6 string) {
	for k := 1; k <= 2; k++ {
		n := &Node{
			Name:  "node" + strconv.Itoa(k),
			NS:    ns("node" + strconv.Itoa(k)),
			Index: k,
			IPv4:  fmt.Sprintf(lan4, 10+k),
		}
		if lan6 != "" {
			n.IPv6 = fmt.Sprintf(lan6, 10+k)
		}
		for i := 0; i < podsPerNode; i++ {
			pn := fmt.Sprintf("pod%d%c", k, 'a'+i)
			p := &Pod{Name: pn, NS: ns(pn), Node: n, IPv4: fmt.Sprintf("10.244.%d.%d", k, 10+i)}
			if lan6 != "" {
				p.IPv6 = fmt.Sprintf("fd00:10:244:%d::%d", k, 10+i)
			}
			n.Pods = append(n.Pods, p)
		}
		r.Nodes = append(r.Nodes, n)
	}
}

// NodeNetns lists the namespaces of the nodes and their pods: each node's,
// then its pods'.
func (r *Rig) NodeNetns() []string {
	var all []string
	for _, n := range r.Nodes {
		all = append(all, n.NS)
		for _, p := range n.Pods {
			all = append(all, p.NS)
		}
	}
	return all
}

// WireNodes configures every node namespace, whose eth0 must already be
// attached to the LAN, and its pods' namespaces, in one ip(8) batch per
// namespace. A node gets lo and eth0 up, its LAN address (/24, and /64 for
// IPv6), default routes via the LAN gateways gw4 and gw6, routes to the
// other nodes' pod CIDRs via their LAN addresses, and per pod a veth "vp<i>"
// holding the pod gateway 10.244.k.1 (fd00:10:244:k::1) and a host route to
// the pod. A pod gets its address on eth0 and a default route via the
// gateway. IPv6 is configured only where the node or pod has an IPv6
// address.
func (r *Rig) WireNodes(gw4, gw6 string) error {
	for _, n := range r.Nodes {
		cmds := []string{"link set lo up", "link set eth0 up", fmt.Sprintf("addr add %s/24 dev eth0", n.IPv4)}
		if n.IPv6 != "" {
			cmds = append(cmds, fmt.Sprintf("addr add %s/64 dev eth0 nodad", n.IPv6))
		}
		cmds = append(cmds, "route add default via "+gw4)
		if n.IPv6 != "" {
			cmds = append(cmds, "route add ::/0 via "+gw6)
		}
		for _, o := range r.Nodes {
			if o == n {
				continue
			}
			cmds = append(cmds, fmt.Sprintf("route add 10.244.%d.0/24 via %s", o.Index, o.IPv4))
			if o.IPv6 != "" {
				cmds = append(cmds, fmt.Sprintf("route add fd00:10:244:%d::/64 via %s", o.Index, o.IPv6))
			}
		}
		for i, p := range n.Pods {
			dev := fmt.Sprintf("vp%d", i)
			cmds = append(cmds,
				fmt.Sprintf("link add %s type veth peer name eth0 netns %s", dev, p.NS),
				fmt.Sprintf("link set %s up", dev),
				fmt.Sprintf("addr add 10.244.%d.1/32 dev %s", n.Index, dev))
			if p.IPv6 != "" {
				cmds = append(cmds, fmt.Sprintf("addr add fd00:10:244:%d::1/128 dev %s nodad", n.Index, dev))
			}
			cmds = append(cmds, fmt.Sprintf("route add %s/32 dev %s", p.IPv4, dev))
			if p.IPv6 != "" {
				cmds = append(cmds, fmt.Sprintf("route add %s/128 dev %s", p.IPv6, dev))
			}
		}
		if err := IPBatch(n.NS, cmds); err != nil {
			return err
		}
		for _, p := range n.Pods {
			gw4 := fmt.Sprintf("10.244.%d.1", n.Index)
			cmds := []string{"link set lo up", "link set eth0 up", fmt.Sprintf("addr add %s/32 dev eth0", p.IPv4)}
			if p.IPv6 != "" {
				cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.IPv6))
			}
			cmds = append(cmds,
				fmt.Sprintf("route add %s/32 dev eth0", gw4),
				fmt.Sprintf("route add default via %s dev eth0", gw4))
			if p.IPv6 != "" {
				gw6 := fmt.Sprintf("fd00:10:244:%d::1", n.Index)
				cmds = append(cmds,
					fmt.Sprintf("route add %s/128 dev eth0", gw6),
					fmt.Sprintf("route add ::/0 via %s dev eth0", gw6))
			}
			if err := IPBatch(p.NS, cmds); err != nil {
				return err
			}
		}
	}
	return nil
}

// StartPods starts a Backend in every pod (serving tcp and udp ports, set
// as the pod's Backend and closed by Cleanup), then waits up to 10 s until
// namespace client reaches every pod on TCP port tcp[0]: new veth and
// bridge ports take a moment (link watch) before they forward. It stops at
// the first error.
func (r *Rig) StartPods(client string, tcp, udp []int) error {
	for _, p := range r.Pods() {
		b, err := StartBackend(p.NS, p.Name, tcp, udp)
		if err != nil {
			return err
		}
		p.Backend = b
		r.mu.Lock()
		r.backends = append(r.backends, b)
		r.mu.Unlock()
	}
	return r.settle(client, tcp[0], 10*time.Second)
}

// Track registers p to be killed (by PID) by Cleanup.
func (r *Rig) Track(p *Process) {
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
}

// Pods returns every pod, node1's first.
func (r *Rig) Pods() []*Pod {
	var ps []*Pod
	for _, n := range r.Nodes {
		ps = append(ps, n.Pods...)
	}
	return ps
}

// Pod returns the pod with the given name or fails the test.
func (r *Rig) Pod(name string) *Pod {
	for _, p := range r.Pods() {
		if p.Name == name {
			return p
		}
	}
	r.t.Fatalf("topology: no pod %q", name)
	return nil
}

// settle waits until namespace client reaches every pod on TCP port, over
// IPv4 and (where the pod has one) IPv6.
func (r *Rig) settle(client string, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range r.Pods() {
		for _, ip := range []string{p.IPv4, p.IPv6} {
			if ip == "" {
				continue
			}
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			for {
				_, err := DialWith(client, "tcp", addr, DialOptions{Timeout: 200 * time.Millisecond})
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

// Cleanup kills the tracked processes (by PID, the last tracked first),
// closes the backends and deletes the namespaces (the last created first).
// It runs once; later calls do nothing. It keeps going past errors,
// reporting them with t.Errorf.
func (r *Rig) Cleanup() {
	r.mu.Lock()
	if r.cleaned {
		r.mu.Unlock()
		return
	}
	r.cleaned = true
	procs, backends, namespaces := r.procs, r.backends, r.namespaces
	r.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Kill()
	}
	for _, b := range backends {
		b.Close()
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if _, err := run("ip", "netns", "del", namespaces[i]); err != nil {
			r.t.Errorf("cleanup: %v", err)
		}
	}
}

// OwnNetns lists the namespaces named prefix+<this process's PID>+"-…"
// that still exist: what this process created and did not delete.
func OwnNetns(prefix string) []string {
	entries, _ := os.ReadDir("/run/netns")
	var own []string
	mine := fmt.Sprintf("%s%d-", prefix, os.Getpid())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), mine) {
			own = append(own, e.Name())
		}
	}
	return own
}

// SweepOwnNetns deletes the namespaces OwnNetns(prefix) lists (a last
// resort on exit). It ignores errors.
func SweepOwnNetns(prefix string) {
	for _, ns := range OwnNetns(prefix) {
		run("ip", "netns", "del", ns)
	}
}

// SweepStaleNetns deletes namespaces named prefix+<PID>+"-…" whose owning
// process (the PID in the name) no longer exists: leftovers of a killed
// run. It ignores errors.
func SweepStaleNetns(prefix string) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(name, prefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		run("ip", "netns", "del", name)
	}
}

// IPBatch runs ip(8) commands in namespace ns in one execution (bounded by
// 30 s). The error names the namespace and lists the commands.
func IPBatch(ns string, cmds []string) error {
	_, err := runInput([]byte(strings.Join(cmds, "\n")+"\n"), "ip", "-n", ns, "-batch", "-")
	if err != nil {
		return fmt.Errorf("in %s: %w\ncommands:\n%s", ns, err, strings.Join(cmds, "\n"))
	}
	return nil
}
