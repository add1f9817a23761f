//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 16, point 2: a Service in another namespace whose externalIPs
// claim another Service's ClusterIP, the metadata address and loopback
// captures nothing, whichever name sorts first; the log names both
// Services.
func TestVIPHijackRefused(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			dns := Service("dns", "10.96.0.10", Port("dns", TCP, 53, 8080))
			dns.Namespace = "kube-system"
			// The attackers' namespaces sort before and after kube-system.
			for ns, clusterIP := range map[string]string{"aaa": "10.96.0.30", "zzz": "10.96.0.40"} {
				evil := Service("evil", clusterIP, Port("dns", TCP, 53, 8081))
				evil.Namespace = ns
				evil.Spec.ExternalIPs = []string{"10.96.0.10", "169.254.169.254", "127.0.0.1", "198.51.100.66"}
				b.apply("evil-"+ns+".yaml", evil, Slice(evil, V4, "a", EP(b.Pod("pod2b"))))
			}
			b.apply("dns.yaml", dns, Slice(dns, V4, "a", EP(b.Pod("pod1a"))))
		}})
		pod := b.Pod("pod1b").NS
		// The attacker's own legitimate externalIP works: its rules are programmed.
		b.waitFor(b.Client, "tcp", "198.51.100.66:53", 10*time.Second, backendIn("pod2b"))
		for i := 0; i < 20; i++ {
			for _, ns := range []string{pod, b.node(1).NS} {
				r, err := Dial(ns, "tcp", "10.96.0.10:53")
				if err != nil || r.Backend != "pod1a" || r.Port != 8080 {
					t.Fatalf("ClusterIP 10.96.0.10:53 from %s: %v, %v; want pod1a:8080 (the ClusterIP wins)", ns, r, err)
				}
			}
		}
		expectNoAnswer(t, "metadata address claimed as externalIP", pod, "tcp", "169.254.169.254:53")
		log := b.vp[0].Log()
		for _, ns := range []string{"aaa", "zzz"} {
			if line, ok := logLine(log, "service "+ns+"/evil", "10.96.0.10", "clusterip of service kube-system/dns"); !ok {
				t.Errorf("log names no conflict between %s/evil and kube-system/dns", ns)
			} else {
				t.Logf("log: %s", line)
			}
			for _, addr := range []string{"169.254.169.254", "127.0.0.1"} {
				if _, ok := logLine(log, "service "+ns+"/evil", addr, "refused"); !ok {
					t.Errorf("log does not say %s/evil's externalIP %s was refused", ns, addr)
				}
			}
		}
	})
}

// Issue 16, point 4: after a restart of the userspace mode, the VIP it
// left on lo is not taken for a node IP (the lowest-numbered address once
// was, and NodePorts moved onto the ClusterIP). No Node object, default
// nodePortAddresses, no default route: the primary IP comes from the local
// addresses.
func TestOwnVIPNeverNodeIP(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		if mode.Name != "userspace" {
			t.Skip("only the userspace mode binds VIPs on lo on this kernel")
		}
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, DefaultNodePortAddresses: true, Before: func(b *bed) {
			if err := RemoveManifest(b.dir, "nodes.yaml"); err != nil {
				t.Fatal(err)
			}
			// No default route either: the primary IP then comes from the
			// local addresses, where the VIP sorts first.
			for _, fam := range []string{"-4", "-6"} {
				if _, err := Exec(b.node(1).NS, "ip", fam, "route", "del", "default"); err != nil {
					t.Fatal(err)
				}
			}
			np := Service("np", "10.96.0.60", Port("http", TCP, 80, 8080))
			np.Spec.Type = "NodePort"
			np.Spec.Ports[0].NodePort = 30090
			b.apply("np.yaml", np, Slice(np, V4, "a", EP(b.Pod("pod2a"))))
		}})
		node := b.node(1).NS
		b.waitFor(node, "tcp", "10.96.0.60:80", 10*time.Second, backendIn("pod2a"))
		v := b.vp[0]
		if !v.Kill() {
			t.Fatal("vipproxy not reaped after SIGKILL")
		}
		if err := v.Start(); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		b.waitFor(node, "tcp", "10.96.0.60:80", 10*time.Second, backendIn("pod2a"))
		var ready []string
		for _, line := range strings.Split(v.Log(), "\n") {
			if strings.Contains(line, "dataplane ready") {
				ready = append(ready, line)
			}
		}
		if len(ready) != 2 {
			t.Fatalf("%d 'dataplane ready' lines, want 2 (one per start)", len(ready))
		}
		for _, line := range ready {
			if strings.Contains(line, "10.96.0.60") {
				t.Errorf("a VIP became a node IP: %s", line)
			}
		}
		expectNoAnswer(t, "NodePort on the ClusterIP address", node, "tcp", "10.96.0.60:30090")
	})
}

// Issue 16, point 3: the node's own listeners (sshd, the kubelet) do not
// answer on a VIP:port no Service serves, in any mode; the userspace mode,
// whose VIPs are local addresses on lo, guards them with a filter.
func TestHostListenerNotBehindVIP(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		const syncPeriod = 2 * time.Second
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, SyncPeriod: syncPeriod, Before: func(b *bed) {
			svc := Service("web", "10.96.0.70", Port("http", TCP, 80, 8080), Port("dns", UDP, 53, 8080))
			b.apply("web.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod2a"))))
		}})
		node := b.node(1)
		host, err := StartBackend(node.NS, "host", []int{2222}, []int{2222})
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		pod := b.Pod("pod1a").NS
		b.waitFor(pod, "tcp", "10.96.0.70:80", 10*time.Second, backendIn("pod2a"))
		b.waitFor(pod, "udp", "10.96.0.70:53", 5*time.Second, backendIn("pod2a"))
		// The host listener itself works on the node's address.
		b.waitFor(pod, "tcp", vip(node.IPv4, 2222), 5*time.Second, backendIn("host"))
		for _, src := range []string{pod, b.Client} {
			expectNoAnswer(t, "host TCP listener on the VIP", src, "tcp", "10.96.0.70:2222")
			expectNoAnswer(t, "host UDP listener on the VIP", src, "udp", "10.96.0.70:2222")
		}
		if mode.Name == "userspace" {
			if line, ok := logLine(b.vp[0].Log(), "vip addresses are guarded"); !ok {
				t.Errorf("userspace mode does not say its VIPs are guarded")
			} else {
				t.Logf("log: %s", line)
			}
			// The guard deleted by hand is back within one syncPeriod (drift check).
			if _, err := Exec(node.NS, "nft", "delete", "table", "inet", "vipproxy-guard"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := eventually(syncPeriod+2*time.Second, 100*time.Millisecond, func() error {
				if r, err := Dial(pod, "tcp", "10.96.0.70:2222"); err == nil {
					return fmt.Errorf("answered by %v", r)
				}
				if _, err := Exec(node.NS, "nft", "list", "table", "inet", "vipproxy-guard"); err != nil {
					return err
				}
				return nil
			}); err != nil {
				t.Errorf("guard not restored within %v: %v", syncPeriod+2*time.Second, err)
			} else {
				t.Logf("guard restored after %v", time.Since(start))
			}
		}
	})
}
