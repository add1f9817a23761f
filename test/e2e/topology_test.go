//go:build linux

package e2e

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
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
