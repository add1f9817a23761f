//go:build linux

package e2e

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTopology proves the bed itself, before any vipproxy: pods on both nodes,
// the nodes and the client reach each other's backends by plain routing over
// IPv4 and IPv6, TCP and UDP, and backends see the real source address.
func TestTopology(t *testing.T) {
	t.Parallel()
	topo := NewTopology(t, TopologyOptions{})
	pods := topo.Pods()
	if len(pods) != 4 {
		t.Fatalf("pods = %d, want 4", len(pods))
	}
	type src struct {
		ns   string
		ips  []string // acceptable source addresses seen by the backend
		name string
	}
	srcs := []src{
		{topo.Client, []string{ClientIP, ClientIP6}, "client"},
		{pods[0].NS, []string{pods[0].IPv4, pods[0].IPv6}, pods[0].Name},
		{pods[3].NS, []string{pods[3].IPv4, pods[3].IPv6}, pods[3].Name},
		// Nodes reach pods from their pod-side address (local pods) or LAN address.
		{topo.Nodes[0].NS, []string{"10.244.1.1", "fd00:10:244:1::1", topo.Nodes[0].IPv4, topo.Nodes[0].IPv6}, "node1"},
	}
	for _, s := range srcs {
		for _, dst := range pods {
			for _, ip := range []string{dst.IPv4, dst.IPv6} {
				for _, proto := range []string{"tcp", "udp"} {
					addr := net.JoinHostPort(ip, "8081")
					r, err := Dial(s.ns, proto, addr)
					if err != nil {
						t.Errorf("%s -> %s %s: %v", s.name, proto, addr, err)
						continue
					}
					if r.Backend != dst.Name || r.Proto != proto || r.Port != 8081 {
						t.Errorf("%s -> %s %s: reply %v, want backend %s port 8081", s.name, proto, addr, r, dst.Name)
					}
					if !contains(s.ips, r.Source.Addr().String()) {
						t.Errorf("%s -> %s %s: backend saw source %v, want one of %v", s.name, proto, addr, r.Source, s.ips)
					}
				}
			}
		}
	}
	t.Logf("sample reply: %v", mustDial(t, topo.Client, "udp", net.JoinHostPort(pods[3].IPv6, "8080")))
	// The client's second address works as a source.
	r, err := DialWith(topo.Client, "tcp", net.JoinHostPort(pods[1].IPv4, "8080"), DialOptions{Source: ClientIP2})
	if err != nil || r.Source.Addr().String() != ClientIP2 {
		t.Errorf("client from %s: reply %v err %v", ClientIP2, r, err)
	}
	// Nothing listens on 9: refused, fast.
	if _, err := Dial(pods[0].NS, "tcp", net.JoinHostPort(pods[2].IPv4, "9")); !isRefused(err) {
		t.Errorf("dial closed port: err %v, want connection refused", err)
	}
	// Streams through plain routing come back byte-exact (the helper of the
	// restart scenario), and the spread helper counts per backend.
	if err := stream(topo.Client, net.JoinHostPort(pods[2].IPv4, "8080"), 1, 20, 1024, 0); err != nil {
		t.Errorf("stream: %v", err)
	}
	if c := spread(pods[0].NS, "udp", net.JoinHostPort(pods[1].IPv4, "8080"), 20, 4); c[pods[1].Name] != 20 {
		t.Errorf("spread: %v, want 20 from %s", c, pods[1].Name)
	}
	// Cleanup removes every namespace.
	names := []string{topo.LAN, topo.Client}
	for _, p := range pods {
		names = append(names, p.NS)
	}
	topo.Cleanup()
	for _, n := range names {
		if _, err := os.Stat("/run/netns/" + n); err == nil {
			t.Errorf("namespace %s still exists after Cleanup", n)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// isRefused reports whether err is "connection refused" (TCP RST or ICMP
// port/admin unreachable surfaced as ECONNREFUSED).
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

func mustDial(t *testing.T, ns, proto, addr string) Reply {
	t.Helper()
	r, err := Dial(ns, proto, addr)
	if err != nil {
		t.Fatalf("dial %s %s from %s: %v", proto, addr, ns, err)
	}
	return r
}

// TestVipproxyHandle proves the process handle with a stand-in binary (socat
// serving /healthz): it runs inside the node namespace, becomes healthy, is
// killed by PID and restarted, and its output lands in the log.
func TestVipproxyHandle(t *testing.T) {
	t.Parallel()
	RequireRoot(t)
	if _, err := exec.LookPath("socat"); err != nil {
		t.Skip("e2e: socat not installed")
	}
	topo := NewTopology(t, TopologyOptions{PodsPerNode: 1})
	dir := t.TempDir()
	script := filepath.Join(dir, "fake-vipproxy")
	handler := filepath.Join(dir, "handler")
	// handler reads the request head, then answers 200.
	if err := os.WriteFile(handler, []byte("#!/bin/sh\n"+
		"while read -r l; do [ \"$l\" = \"$(printf '\\r')\" ] && break; done\n"+
		"printf 'HTTP/1.0 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+
		"echo \"fake vipproxy args: $*\"\n"+
		"exec socat TCP-LISTEN:10256,bind=127.0.0.1,reuseaddr,fork EXEC:"+handler+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	node := topo.Nodes[1]
	v := topo.StartVipproxy(node, VipproxyOptions{Mode: "nftables", Manifests: t.TempDir(), Binary: script})
	pid := v.PID()
	if !v.Running() || pid == 0 {
		t.Fatalf("not running after start")
	}
	// It listens in node2's namespace only.
	if _, _, err := HTTPGet(topo.Nodes[0].NS, HealthzAddr, "/healthz"); err == nil {
		t.Errorf("healthz answered in node1's namespace")
	}
	if err := v.Start(); err == nil {
		t.Errorf("Start while running succeeded")
	}
	v.Kill()
	if v.Running() || processAlive(pid) {
		t.Fatalf("still running after Kill (pid %d)", pid)
	}
	if err := v.Start(); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitHealthy(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := v.Stop(); err == nil {
		t.Errorf("Stop: socat killed by SIGTERM should report a non-zero exit")
	}
	log := v.Log()
	if strings.Count(log, "fake vipproxy args: --manifests") != 2 || !strings.Contains(log, "--hostname-override node2") {
		t.Errorf("log does not show two starts with the expected arguments:\n%s", log)
	}
}
