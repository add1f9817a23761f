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

// StartBackends starts a Backend in every pod (serving tcp and udp ports,
// set as the pod's Backend) and registers it to be closed by Cleanup. It
// stops at the first error.
func (r *Rig) StartBackends(tcp, udp []int) error {
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
	return nil
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

// Settle waits until namespace client reaches every pod on TCP port, over
// IPv4 and (where the pod has one) IPv6: new veth and bridge ports take a
// moment (link watch) before they forward.
func (r *Rig) Settle(client string, port int, timeout time.Duration) error {
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
