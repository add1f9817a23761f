//go:build linux

package e2e

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

const (
	TCP = corev1.ProtocolTCP
	UDP = corev1.ProtocolUDP
	V4  = discoveryv1.AddressTypeIPv4
	V6  = discoveryv1.AddressTypeIPv6
)

// allEPs returns ready IPv4 endpoints for every pod.
func allEPs(topo *Topology) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	for _, p := range topo.Pods() {
		eps = append(eps, EP(p))
	}
	return eps
}

// Scenario 1: ClusterIP over TCP and UDP from a pod and from the nodes
// themselves, several ports, the same port number on TCP and UDP, and an even
// spread over 300 connections.
func TestClusterIP(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			svc := Service("web", "10.96.0.10",
				Port("http", TCP, 80, 8080),
				Port("dns", UDP, 80, 8080),
				Port("alt", TCP, 8181, 8081),
				Port("altu", UDP, 8181, 8081))
			b.apply("web.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
		}})
		b.ready(b.Pod("pod1a").NS, "tcp", "10.96.0.10:80")
		sources := []struct{ name, ns string }{
			{"pod1a", b.Pod("pod1a").NS},
			{"pod2b", b.Pod("pod2b").NS},
			{"node1", b.node(1).NS},
			{"node2", b.node(2).NS},
		}
		cases := []struct {
			proto, addr string
			port        int
		}{
			{"tcp", "10.96.0.10:80", 8080},
			{"udp", "10.96.0.10:80", 8080},
			{"tcp", "10.96.0.10:8181", 8081},
			{"udp", "10.96.0.10:8181", 8081},
		}
		for _, s := range sources {
			for _, c := range cases {
				r := b.waitFor(s.ns, c.proto, c.addr, 3*time.Second, nil)
				if r.Proto != c.proto || r.Port != c.port {
					t.Errorf("%s -> %s %s: reply %v, want %s port %d", s.name, c.proto, c.addr, r, c.proto, c.port)
				}
			}
		}
		counts := spread(b.Pod("pod1a").NS, "tcp", "10.96.0.10:80", 300, 8)
		t.Logf("300 connections: %v", counts)
		for _, p := range b.Pods() {
			// Uniform choice gives 75 each; 30 is > 5 standard deviations below.
			if counts[p.Name] < 30 {
				t.Errorf("backend %s answered %d of 300 connections, want >= 30 (uniform spread): %v", p.Name, counts[p.Name], counts)
			}
		}
		for k := range counts {
			if strings.HasPrefix(k, "error") {
				t.Errorf("failed connections: %v", counts)
				break
			}
		}
	})
}

// Scenario 2: NodePort from the external client to each node, a LoadBalancer
// ingress IP and an externalIP.
func TestNodePortLoadBalancerExternalIP(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			np := Service("np", "10.96.0.20", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			np.Spec.Type = corev1.ServiceTypeNodePort
			np.Spec.Ports[0].NodePort = 30080
			np.Spec.Ports[1].NodePort = 30080
			lb := Service("lb", "10.96.0.21", Port("http", TCP, 80, 8080))
			lb.Spec.Type = corev1.ServiceTypeLoadBalancer
			lb.Spec.Ports[0].NodePort = 30081
			lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
			ext := Service("ext", "10.96.0.22", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			ext.Spec.ExternalIPs = []string{"198.51.100.10"}
			eps := []discoveryv1.Endpoint{EP(b.Pod("pod1a")), EP(b.Pod("pod2a"))}
			b.apply("np.yaml", np, Slice(np, V4, "a", eps...))
			b.apply("lb.yaml", lb, Slice(lb, V4, "a", eps...))
			b.apply("ext.yaml", ext, Slice(ext, V4, "a", eps...))
		}})
		want := backendIn("pod1a", "pod2a")
		for _, n := range b.Nodes {
			for _, proto := range []string{"tcp", "udp"} {
				b.waitFor(b.Client, proto, vip(n.IPv4, 30080), 10*time.Second, want)
			}
			b.waitFor(b.Client, "tcp", vip(n.IPv4, 30081), 5*time.Second, want)
		}
		b.waitFor(b.Client, "tcp", "203.0.113.10:80", 5*time.Second, want)
		b.waitFor(b.Client, "tcp", "198.51.100.10:80", 5*time.Second, want)
		b.waitFor(b.Client, "udp", "198.51.100.10:80", 5*time.Second, want)
		// The NodePort is not open on other ports of the node.
		expectNoAnswer(t, "unused node port", b.Client, "tcp", vip(b.node(1).IPv4, 30082))
	})
}

// detectLocalMode NodeCIDR, BridgeInterface and InterfaceNamePrefix decide
// what is pod traffic, as in kube-proxy: pod traffic to a ClusterIP keeps
// its source; anything else (the client on the LAN; with BridgeInterface
// vp0, also the pod behind vp1) is masqueraded to the node's address.
func TestDetectLocalModes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		pods map[string]bool // pod on node1 → its traffic counts as local
	}{
		{"NodeCIDR", []string{"--detect-local-mode=NodeCIDR"}, map[string]bool{"pod1a": true, "pod1b": true}},
		{"InterfaceNamePrefix", []string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=vp"}, map[string]bool{"pod1a": true, "pod1b": true}},
		{"BridgeInterface", []string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=vp0"}, map[string]bool{"pod1a": true, "pod1b": false}},
	}
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		if mode.Userspace {
			t.Skip("the userspace mode always proxies from its own address")
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				b := newBed(t, mode, bedOptions{Nodes: []int{1}, ExtraArgs: tc.args, Before: func(b *bed) {
					svc := Service("web", "10.96.0.28", Port("http", TCP, 80, 8080))
					b.apply("web.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod2a"))))
				}})
				for name, local := range tc.pods {
					pod := b.Pod(name)
					r := b.waitFor(pod.NS, "tcp", "10.96.0.28:80", 10*time.Second, backendIn("pod2a"))
					if kept := r.Source.Addr().String() == pod.IPv4; kept != local {
						t.Errorf("%s: backend saw %v; pod traffic = %v, want %v", name, r.Source, kept, local)
					}
				}
				r := b.waitFor(b.Client, "tcp", "10.96.0.28:80", 10*time.Second, backendIn("pod2a"))
				if r.Source.Addr().String() == ClientIP {
					t.Errorf("client on the LAN reached the backend unmasqueraded (%v)", r.Source)
				}
			})
		}
	})
}

// Without a cluster CIDR, pod traffic cannot be told apart and, as in
// kube-proxy, ClusterIP traffic is not masqueraded: the backend sees the
// pod's own address. NodePort traffic (externalTrafficPolicy Cluster) is
// still masqueraded.
func TestNoClusterCIDRKeepsPodSource(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		if mode.Userspace {
			t.Skip("the userspace mode always proxies from its own address")
		}
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, NoClusterCIDR: true, Before: func(b *bed) {
			np := Service("np", "10.96.0.27", Port("http", TCP, 80, 8080))
			np.Spec.Type = corev1.ServiceTypeNodePort
			np.Spec.Ports[0].NodePort = 30087
			b.apply("np.yaml", np, Slice(np, V4, "a", EP(b.Pod("pod2a"))))
		}})
		pod := b.Pod("pod1a")
		r := b.waitFor(pod.NS, "tcp", "10.96.0.27:80", 10*time.Second, backendIn("pod2a"))
		if r.Source.Addr().String() != pod.IPv4 {
			t.Errorf("backend saw %v, want the pod's own address %s (no masquerade without a cluster CIDR)", r.Source, pod.IPv4)
		}
		r = b.waitFor(b.Client, "tcp", vip(b.node(1).IPv4, 30087), 10*time.Second, backendIn("pod2a"))
		if r.Source.Addr().String() == ClientIP {
			t.Errorf("NodePort traffic reached the backend unmasqueraded from %v", r.Source)
		}
	})
}

// Standalone with no Node object: the primary IP is the address the
// default route leaves from (the LAN), not the lowest-numbered address
// (node1's pod gateway 10.244.1.1), so a multi-homed host answers
// NodePorts on the right interface.
func TestNodePortPrimaryFromDefaultRoute(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, DefaultNodePortAddresses: true, Before: func(b *bed) {
			if err := RemoveManifest(b.dir, "nodes.yaml"); err != nil {
				t.Fatal(err)
			}
			np := Service("np", "10.96.0.26", Port("http", TCP, 80, 8080))
			np.Spec.Type = corev1.ServiceTypeNodePort
			np.Spec.Ports[0].NodePort = 30086
			b.apply("np.yaml", np, Slice(np, V4, "a", allEPs(b.Topology)...))
		}})
		b.waitFor(b.Client, "tcp", vip(b.node(1).IPv4, 30086), 10*time.Second, nil)
		if primaryNodePortsByDefault(mode.proxy()) {
			expectNoAnswer(t, "NodePort on the lowest-numbered address", b.Client, "tcp", vip("10.244.1.1", 30086))
		}
	})
}

// Without --nodeport-addresses a NodePort answers, in nftables and
// userspace mode, on the node's primary IPs, which come from the Node
// object's InternalIPs (as kube-proxy does), not on the node's other
// addresses; in iptables and ipvs mode on every local address (kube-proxy's
// per-mode defaults).
func TestNodePortDefaultAddresses(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{DefaultNodePortAddresses: true, Before: func(b *bed) {
			np := Service("np", "10.96.0.25", Port("http", TCP, 80, 8080))
			np.Spec.Type = corev1.ServiceTypeNodePort
			np.Spec.Ports[0].NodePort = 30085
			b.apply("np.yaml", np, Slice(np, V4, "a", allEPs(b.Topology)...))
		}})
		for _, n := range b.Nodes {
			b.waitFor(b.Client, "tcp", vip(n.IPv4, 30085), 10*time.Second, nil)
		}
		if primaryNodePortsByDefault(mode.proxy()) {
			// node1's pod-side address is not a primary IP.
			expectNoAnswer(t, "NodePort on a non-primary address", b.Client, "tcp", vip("10.244.1.1", 30085))
		} else {
			// iptables and ipvs mode: every local address, as kube-proxy.
			b.waitFor(b.Client, "tcp", vip("10.244.1.1", 30085), 5*time.Second, nil)
		}
	})
}

// primaryNodePortsByDefault reports whether mode serves NodePorts on the
// primary IPs only when nodePortAddresses is unset (kube-proxy's nftables
// default); iptables and ipvs mode serve every local address.
func primaryNodePortsByDefault(mode string) bool {
	return mode != "iptables" && mode != "ipvs"
}

// Scenario 3: loadBalancerSourceRanges lets the allowed client in and drops
// the other one.
func TestLoadBalancerSourceRanges(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			lb := Service("lb", "10.96.0.30", Port("http", TCP, 80, 8080))
			lb.Spec.Type = corev1.ServiceTypeLoadBalancer
			lb.Spec.Ports[0].NodePort = 30030
			lb.Spec.LoadBalancerSourceRanges = []string{ClientIP + "/32"}
			lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.30"}}
			b.apply("lb.yaml", lb, Slice(lb, V4, "a", allEPs(b.Topology)...))
		}})
		r := b.ready(b.Client, "tcp", "203.0.113.30:80")
		if got := r.Source.Addr().String(); got == ClientIP2 {
			t.Errorf("allowed dial went out from %s", got)
		}
		_, err := DialWith(b.Client, "tcp", "203.0.113.30:80", DialOptions{Source: ClientIP2})
		if err == nil {
			t.Errorf("client %s outside loadBalancerSourceRanges was answered", ClientIP2)
		} else if !isTimeout(err) && !mode.Userspace {
			// A userspace proxy's kernel completes the handshake before
			// the proxy sees the source, so it can only reset; the kernel
			// modes drop.
			t.Errorf("client %s outside loadBalancerSourceRanges: %v, want a drop (timeout)", ClientIP2, err)
		}
		if _, err := DialWith(b.Client, "tcp", "203.0.113.30:80", DialOptions{Source: ClientIP}); err != nil {
			t.Errorf("allowed client after the denied one: %v", err)
		}
		// Pods still reach the ClusterIP: source ranges guard the LB IP only.
		if _, err := Dial(b.Pod("pod1a").NS, "tcp", "10.96.0.30:80"); err != nil {
			t.Errorf("ClusterIP from pod: %v", err)
		}
	})
}

// Scenario 4: sessionAffinity ClientIP pins a client to one backend until
// timeoutSeconds of idleness pass.
func TestSessionAffinity(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			sticky := Service("sticky", "10.96.0.40", Port("http", TCP, 80, 8080))
			sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			timeout := int32(2)
			sticky.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
			plain := Service("plain", "10.96.0.41", Port("http", TCP, 80, 8080))
			long := Service("sticky-long", "10.96.0.42", Port("http", TCP, 80, 8080))
			long.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			hour := int32(3600)
			long.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &hour}}
			eps := allEPs(b.Topology)
			b.apply("sticky.yaml", sticky, Slice(sticky, V4, "a", eps...), plain, Slice(plain, V4, "a", eps...),
				long, Slice(long, V4, "a", eps...))
		}})
		ns := b.Pod("pod1a").NS
		b.ready(ns, "tcp", "10.96.0.41:80")
		b.ready(ns, "tcp", "10.96.0.40:80")
		// Control: without affinity 20 connections reach several backends.
		if c := spread(ns, "tcp", "10.96.0.41:80", 20, 1); len(c) < 2 {
			t.Errorf("control service without affinity: 20 connections all went to %v", c)
		}
		c := spread(ns, "tcp", "10.96.0.40:80", 20, 1)
		if len(c) != 1 {
			t.Fatalf("ClientIP affinity: 20 connections spread over %v, want one backend", c)
		}
		var first string
		for k := range c {
			first = k
		}
		if mode.Name == "ipvs" && realIPVS() {
			ipvsShortAffinity(t, b.node(1).NS, b.Pod("pod1a").IPv4)
		}
		explainAffinity(t, b)
		// After 2 s idle the affinity expires: some later choice differs
		// (each attempt has a 3/4 chance; 8 attempts fail by chance 1.5e-5).
		moved := false
		for i := 0; i < 8 && !moved; i++ {
			time.Sleep(2500 * time.Millisecond)
			r, err := Dial(ns, "tcp", "10.96.0.40:80")
			if err != nil {
				t.Fatalf("after expiry: %v", err)
			}
			if r.Backend != first {
				moved = true
				t.Logf("after %d expiries the client moved from %s to %s", i+1, first, r.Backend)
			} else {
				first = r.Backend
			}
		}
		if !moved {
			t.Errorf("ClientIP affinity with timeoutSeconds 2 never expired over 8 idle periods of 2.5 s")
		}
	})
}

// explainAffinity: vipproxy explain shows the affinity entry the
// dataplane holds for a client that connected (its endpoint, and the time
// left when the mode can tell), and none for a client that did not.
func explainAffinity(t *testing.T, b *bed) {
	t.Helper()
	const vip = "10.96.0.42:80"
	b.ready(b.Pod("pod1a").NS, "tcp", vip)
	r, err := Dial(b.Pod("pod1a").NS, "tcp", vip)
	if err != nil {
		t.Fatal(err)
	}
	stuck := b.Pod(r.Backend).IPv4 + ":8080"
	for _, c := range []struct{ from, want string }{
		{b.Pod("pod1a").IPv4, "sticks to " + stuck},
		{b.Pod("pod1b").IPv4, "entry:        none for " + b.Pod("pod1b").IPv4},
	} {
		out, err := Exec(b.node(1).NS, Binary(t), "explain", vip, "--from", c.from, "--metrics-address", MetricsAddr)
		if err != nil {
			t.Fatalf("vipproxy explain: %v\n%s", err, out)
		}
		t.Logf("vipproxy explain %s --from %s:\n%s", vip, c.from, out)
		if !strings.Contains(out, c.want) {
			t.Errorf("explain --from %s lacks %q", c.from, c.want)
		}
		if i := strings.Index(out, " s left"); i >= 0 {
			var left int
			fmt.Sscanf(out[strings.LastIndex(out[:i], ", ")+2:i], "%d", &left)
			if left < 3000 || left > 3600 {
				t.Errorf("explain --from %s: %d s left of a 3600 s affinity", c.from, left)
			}
		}
	}
}

// ipvsShortAffinity checks how a real IPVS kernel holds an affinity of
// 2 s: not by a persistence template (which IPVS keeps while the client's
// closed connections linger in TIME_WAIT, two minutes; kubernetes#89358)
// but by vipproxy's recent list, which remembers the client.
func ipvsShortAffinity(t *testing.T, ns, client string) {
	t.Helper()
	if out, err := Exec(ns, "ipvsadm", "-Ln", "-t", "10.96.0.40:80"); err != nil || strings.Contains(out, "persistent") {
		t.Errorf("virtual server for a 2 s affinity (want no persistence): %v\n%s", err, out)
	}
	out, err := Exec(ns, "sh", "-c", "grep -l 'src="+client+" ' /proc/net/xt_recent/VIPVS-* 2>/dev/null")
	if err != nil || strings.TrimSpace(out) == "" {
		lists, _ := Exec(ns, "sh", "-c", "head /proc/net/xt_recent/*")
		t.Errorf("no VIPVS- recent list remembers %s (%v):\n%s", client, err, lists)
	} else {
		t.Logf("client %s remembered in %s", client, strings.TrimSpace(out))
	}
}

// Scenario 5: a Service without endpoints refuses connections at once.
func TestNoEndpoints(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			none := Service("none", "10.96.0.50", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			empty := Service("empty", "10.96.0.51", Port("http", TCP, 80, 8080))
			notServing := Service("notserving", "10.96.0.52", Port("http", TCP, 80, 8080))
			ep := EP(b.Pod("pod1a"))
			ep.Conditions = Conditions(false, false, false)
			b.apply("none.yaml", none, empty, Slice(empty, V4, "a"), notServing, Slice(notServing, V4, "a", ep))
		}})
		// refused: a pod gets ECONNREFUSED (TCP RST / ICMP unreachable). A
		// UDP socket on the node itself may instead get EPERM at once from
		// sendmsg, which is how the kernel reports a locally generated packet
		// rejected in the output hook.
		refused := func(local bool, err error) bool {
			return isRefused(err) || (local && errors.Is(err, syscall.EPERM))
		}
		for _, src := range []struct {
			name, ns string
			local    bool
		}{{"pod1a", b.Pod("pod1a").NS, false}, {"node1", b.node(1).NS, true}} {
			for _, c := range []struct{ proto, addr string }{
				{"tcp", "10.96.0.50:80"}, {"udp", "10.96.0.50:80"}, {"tcp", "10.96.0.51:80"}, {"tcp", "10.96.0.52:80"},
			} {
				// Wait for the first sync, then time a fresh attempt.
				eventually(10*time.Second, 100*time.Millisecond, func() error {
					_, err := DialWith(src.ns, c.proto, c.addr, DialOptions{Timeout: 300 * time.Millisecond})
					if refused(src.local, err) {
						return nil
					}
					return err
				})
				// A drop never yields "refused"; on a loaded machine a
				// refusal may still arrive late, so the best of 3 counts.
				var tries []string
				ok := false
				for i := 0; i < 3 && !ok; i++ {
					start := time.Now()
					_, err := DialWith(src.ns, c.proto, c.addr, DialOptions{Timeout: 2 * time.Second})
					took := time.Since(start)
					ok = refused(src.local, err) && took <= time.Second
					tries = append(tries, fmt.Sprintf("%v after %v", err, took.Round(time.Millisecond)))
				}
				if !ok {
					t.Errorf("%s -> %s %s without endpoints: %q, want connection refused within 1s", src.name, c.proto, c.addr, tries)
				}
			}
		}
	})
}

// Scenario 6: externalTrafficPolicy Local answers only on nodes with a local
// endpoint and keeps the client IP; Cluster answers everywhere.
func TestExternalTrafficPolicy(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			local := Service("local", "10.96.0.60", Port("http", TCP, 80, 8080))
			local.Spec.Type = corev1.ServiceTypeLoadBalancer
			local.Spec.Ports[0].NodePort = 30060
			local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			local.Spec.HealthCheckNodePort = 32060
			local.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.60"}}
			cluster := Service("cluster", "10.96.0.61", Port("http", TCP, 80, 8080))
			cluster.Spec.Type = corev1.ServiceTypeNodePort
			cluster.Spec.Ports[0].NodePort = 30061
			cluster.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
			ep := EP(b.Pod("pod1a"))
			b.apply("etp.yaml", local, Slice(local, V4, "a", ep), cluster, Slice(cluster, V4, "a", ep))
		}})
		n1, n2 := b.node(1), b.node(2)
		// A userspace proxy cannot keep the client IP: its own connection
		// reaches the backend.
		wantSrc := ClientIP
		if mode.Userspace {
			wantSrc = "10.244.1.1"
		}
		r := b.ready(b.Client, "tcp", vip(n1.IPv4, 30060))
		if r.Backend != "pod1a" || r.Source.Addr().String() != wantSrc {
			t.Errorf("Local via node1: reply %v, want pod1a seeing %s", r, wantSrc)
		}
		r = b.ready(b.Client, "tcp", "203.0.113.60:80") // LB IP, routed to node1
		if r.Backend != "pod1a" || r.Source.Addr().String() != wantSrc {
			t.Errorf("Local via LB IP on node1: reply %v, want pod1a seeing %s", r, wantSrc)
		}
		b.ready(b.Client, "tcp", vip(n2.IPv4, 30061)) // node2 has synced
		// Kernel modes drop (as kube-proxy); a userspace proxy may refuse.
		if err := expectNoAnswer(t, "Local via node2 (no local endpoint)", b.Client, "tcp", vip(n2.IPv4, 30060)); err != nil && !isTimeout(err) {
			if mode.Userspace {
				t.Logf("Local via node2 failed with %v (not a silent drop)", err)
			} else {
				t.Errorf("Local via node2 (no local endpoint): %v, want a drop (timeout)", err)
			}
		}
		for _, n := range b.Nodes {
			r := b.ready(b.Client, "tcp", vip(n.IPv4, 30061))
			if r.Backend != "pod1a" {
				t.Errorf("Cluster via %s: reply %v, want pod1a", n.Name, r)
			}
			if n == n2 && r.Source.Addr().String() == ClientIP {
				t.Errorf("Cluster via node2 to a pod on node1: backend saw the client IP %v, want it masqueraded", r.Source)
			}
		}
		// Health check node port: 200 where the endpoint is local, 503 elsewhere.
		for _, c := range []struct {
			n    *Node
			code int
		}{{n1, 200}, {n2, 503}} {
			// The server may open just after the sync: allow 3 s.
			var code int
			var body string
			_, err := eventually(3*time.Second, 100*time.Millisecond, func() error {
				var err error
				code, body, err = HTTPGet(b.Client, vip(c.n.IPv4, 32060), "/")
				if err == nil && code != c.code {
					err = fmt.Errorf("code %d", code)
				}
				return err
			})
			if err != nil {
				t.Errorf("healthCheckNodePort on %s: code %d err %v body %q, want %d", c.n.Name, code, err, body, c.code)
			}
		}
	})
}

// Scenario 7: internalTrafficPolicy Local, the terminating-but-serving
// fallback and topology hints.
func TestInternalPolicyTerminatingTopology(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			itp := Service("itp", "10.96.0.70", Port("http", TCP, 80, 8080))
			local := corev1.ServiceInternalTrafficPolicyLocal
			itp.Spec.InternalTrafficPolicy = &local

			term := Service("term", "10.96.0.71", Port("http", TCP, 80, 8080))
			t1 := EP(b.Pod("pod1a"))
			t1.Conditions = Conditions(false, true, true) // terminating, still serving
			t2 := EP(b.Pod("pod2a"))
			t2.Conditions = Conditions(false, false, true) // terminating, not serving

			mixed := Service("mixed", "10.96.0.72", Port("http", TCP, 80, 8080))
			m1 := EP(b.Pod("pod1a"))
			m1.Conditions = Conditions(false, true, true)

			topo := Service("zonal", "10.96.0.73", Port("http", TCP, 80, 8080))
			topo.Annotations = map[string]string{"service.kubernetes.io/topology-mode": "Auto"}
			pc := corev1.ServiceTrafficDistributionPreferClose
			topo.Spec.TrafficDistribution = &pc
			var zeps []discoveryv1.Endpoint
			for _, p := range b.Pods() {
				ep := EP(p)
				zone := map[string]string{"node1": "zone-a", "node2": "zone-b"}[p.Node.Name]
				ep.Zone = &zone
				ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
				zeps = append(zeps, ep)
			}
			b.apply("itp.yaml",
				itp, Slice(itp, V4, "a", EP(b.Pod("pod2a"))),
				term, Slice(term, V4, "a", t1, t2),
				mixed, Slice(mixed, V4, "a", m1, EP(b.Pod("pod1b"))),
				topo, Slice(topo, V4, "a", zeps...))
		}})
		p1, p2 := b.Pod("pod1b").NS, b.Pod("pod2b").NS
		// internalTrafficPolicy Local: node2's pod reaches the local endpoint,
		// node1's pod has none and is dropped.
		b.waitFor(p2, "tcp", "10.96.0.70:80", 10*time.Second, backendIn("pod2a"))
		b.ready(p1, "tcp", "10.96.0.71:80") // node1 synced
		expectNoAnswer(t, "internalTrafficPolicy Local without local endpoint", p1, "tcp", "10.96.0.70:80")

		// Only terminating endpoints: the serving one takes the traffic.
		for _, ns := range []string{p1, p2} {
			if c := spread(ns, "tcp", "10.96.0.71:80", 10, 2); c["pod1a"] != 10 {
				t.Errorf("terminating fallback: %v, want all 10 on pod1a (serving, terminating)", c)
			}
			// A ready endpoint wins over a serving-terminating one.
			if c := spread(ns, "tcp", "10.96.0.72:80", 10, 2); c["pod1b"] != 10 {
				t.Errorf("ready before terminating: %v, want all 10 on pod1b", c)
			}
		}

		// Topology hints: each node keeps traffic in its zone.
		for _, c := range []struct {
			ns   string
			want []string
		}{{b.node(1).NS, []string{"pod1a", "pod1b"}}, {b.node(2).NS, []string{"pod2a", "pod2b"}}} {
			counts := spread(c.ns, "tcp", "10.96.0.73:80", 20, 2)
			if counts[c.want[0]]+counts[c.want[1]] != 20 {
				t.Errorf("topology hints from %s: %v, want all 20 on %v", c.ns, counts, c.want)
			}
		}
	})
}

// Scenario 8: an endpoint is replaced under UDP clients sending from a fixed
// source port — a pod to the ClusterIP and the external client to node2's
// NodePort; the stale conntrack entries must go so the new backend answers
// within 2 s. Scaling 1→0→1 behaves the same.
func TestEndpointReplacedUDP(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		var svc *corev1.Service
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			svc = Service("dns", "10.96.0.80", Port("dns", UDP, 53, 8080))
			svc.Spec.Type = corev1.ServiceTypeNodePort
			svc.Spec.Ports[0].NodePort = 30053
			b.apply("dns.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a"))))
		}})
		// Both flows are DNATed on node2, away from the endpoints on node1.
		probes := []struct {
			name, ns, addr string
			port           int
		}{
			{"ClusterIP from pod2b", b.Pod("pod2b").NS, "10.96.0.80:53", 40053},
			{"NodePort on node2 from client", b.Client, vip(b.node(2).IPv4, 30053), 40054},
		}
		// probeAll returns nil when every probe's outcome satisfies ok.
		probeAll := func(ok func(Reply, error) bool, want string) error {
			for _, p := range probes {
				r, err := DialWith(p.ns, "udp", p.addr, DialOptions{SourcePort: p.port, Timeout: 150 * time.Millisecond})
				if !ok(r, err) {
					return fmt.Errorf("%s: %w", p.name, backendInErr(r, err, want))
				}
			}
			return nil
		}
		from := func(name string) func(Reply, error) bool {
			return func(r Reply, err error) bool { return err == nil && r.Backend == name }
		}
		if _, err := eventually(10*time.Second, 50*time.Millisecond, func() error { return probeAll(from("pod1a"), "pod1a") }); err != nil {
			t.Fatalf("initial: %v", err)
		}
		// Keep the conntrack entries hot, then switch and time the move.
		warm := func() {
			for i := 0; i < 5; i++ {
				probeAll(func(Reply, error) bool { return true }, "")
			}
		}
		warm()
		step := func(what string, docs []any, ok func(Reply, error) bool) {
			t.Helper()
			b.apply("dns.yaml", docs...)
			took, err := eventually(4*time.Second, 50*time.Millisecond, func() error { return probeAll(ok, what) })
			if err != nil {
				t.Errorf("%s: %v", what, err)
				return
			}
			t.Logf("%s: observed after %v", what, took)
			if limit := Scaled(2 * time.Second); took > limit {
				t.Errorf("%s: took %v, want <= %v", what, took, limit)
			}
		}
		step("replaced by pod2a", []any{svc, Slice(svc, V4, "a", EP(b.Pod("pod2a")))}, from("pod2a"))
		warm()
		step("scaled to 0", []any{svc, Slice(svc, V4, "a")},
			func(r Reply, err error) bool { return err != nil })
		// Nothing answers for a while at zero endpoints.
		for i := 0; i < 5; i++ {
			if err := probeAll(func(r Reply, err error) bool { return err != nil }, "no answer"); err != nil {
				t.Errorf("scaled to 0: %v", err)
			}
		}
		step("scaled to 1 (pod1b)", []any{svc, Slice(svc, V4, "a", EP(b.Pod("pod1b")))}, from("pod1b"))
	})
}

func backendInErr(r Reply, err error, want string) error {
	if err != nil {
		return err
	}
	return &replyError{r, want}
}

type replyError struct {
	r    Reply
	want string
}

func (e *replyError) Error() string { return "reply " + e.r.String() + ", want " + e.want }

// Scenario 9: a pod reaches itself through its own Service (hairpin).
func TestHairpin(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			svc := Service("self", "10.96.0.90", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			svc.Spec.ClusterIPs = []string{"10.96.0.90", "fd00:96::5a"}
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			rds := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &rds
			p := b.Pod("pod1a")
			b.apply("self.yaml", svc, Slice(svc, V4, "a", EP(p)), Slice(svc, V6, "a", EP6(p)))
		}})
		pod := b.Pod("pod1a")
		for _, c := range []struct{ vip, self string }{{"10.96.0.90:80", pod.IPv4}, {"[fd00:96::5a]:80", pod.IPv6}} {
			for _, proto := range []string{"tcp", "udp"} {
				r := b.waitFor(pod.NS, proto, c.vip, 10*time.Second, nil)
				if r.Backend != "pod1a" {
					t.Errorf("hairpin %s %s: reply %v, want pod1a", proto, c.vip, r)
				}
				if r.Source.Addr().String() == c.self {
					t.Errorf("hairpin %s %s: backend saw its own address %v, want it masqueraded", proto, c.vip, r.Source)
				}
			}
		}
	})
}

// Scenario 10: Services labelled service.kubernetes.io/service-proxy-name and
// headless Services are not proxied.
func TestIgnoredServices(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			control := Service("control", "10.96.0.100", Port("http", TCP, 80, 8080))
			other := Service("otherproxy", "10.96.0.101", Port("http", TCP, 80, 8080))
			other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
			hl := Service("headlesssvc", "None", Port("http", TCP, 80, 8080))
			hs := Slice(hl, V4, "a", EP(b.Pod("pod1a")))
			hs.Labels["service.kubernetes.io/headless"] = ""
			eps := allEPs(b.Topology)
			b.apply("ignored.yaml", control, Slice(control, V4, "a", eps...),
				other, Slice(other, V4, "a", eps...), hl, hs)
		}})
		ns := b.Pod("pod1b").NS
		b.ready(ns, "tcp", "10.96.0.100:80")
		b.ready(b.node(2).NS, "tcp", "10.96.0.100:80")
		expectNoAnswer(t, "service-proxy-name labelled Service", ns, "tcp", "10.96.0.101:80")
		for _, n := range b.Nodes {
			rules := dumpRules(t, n.NS)
			for _, name := range []string{"headlesssvc", "otherproxy"} {
				if strings.Contains(rules, name) {
					t.Errorf("%s: rules mention ignored Service %s", n.Name, name)
				}
			}
			if !b.vp[n.Index-1].Running() {
				t.Errorf("vipproxy on %s exited", n.Name)
			}
		}
	})
}

// dumpRules returns the node namespace's nft ruleset (which includes
// iptables-nft rules).
func dumpRules(t *testing.T, ns string) string {
	t.Helper()
	out, err := Exec(ns, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	return out
}

// Scenario 14: both ClusterIPs of a dual-stack Service answer, and an IPv6
// NodePort works from the external client.
func TestDualStack(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Before: func(b *bed) {
			svc := Service("ds", "10.96.0.140", Port("http", TCP, 80, 8080), Port("dns", UDP, 80, 8080))
			svc.Spec.Type = corev1.ServiceTypeNodePort
			svc.Spec.Ports[0].NodePort = 30140
			svc.Spec.Ports[1].NodePort = 30140
			svc.Spec.ClusterIPs = []string{"10.96.0.140", "fd00:96::8c"}
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			rds := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &rds
			var v6 []discoveryv1.Endpoint
			for _, p := range b.Pods() {
				v6 = append(v6, EP6(p))
			}
			b.apply("ds.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...), Slice(svc, V6, "a", v6...))
		}})
		pod := b.Pod("pod1a")
		for _, proto := range []string{"tcp", "udp"} {
			r := b.waitFor(pod.NS, proto, "[fd00:96::8c]:80", 10*time.Second, nil)
			// The backend sees the pod's address, unless the pod reached
			// itself (hairpin, masqueraded).
			if (r.Backend != pod.Name && r.Source.Addr().String() != pod.IPv6) || r.Port != 8080 || !r.Source.Addr().Is6() {
				t.Errorf("IPv6 ClusterIP %s: reply %v, want port 8080 seeing %s", proto, r, pod.IPv6)
			}
			r = b.waitFor(pod.NS, proto, "10.96.0.140:80", 5*time.Second, nil)
			if !r.Source.Addr().Is4() {
				t.Errorf("IPv4 ClusterIP %s: reply %v", proto, r)
			}
			b.waitFor(b.node(2).NS, proto, "[fd00:96::8c]:80", 5*time.Second, nil)
			b.waitFor(b.Client, proto, vip(b.node(2).IPv6, 30140), 5*time.Second, nil)
		}
		if c := spread(pod.NS, "tcp", "[fd00:96::8c]:80", 40, 4); len(c) < 3 {
			t.Errorf("IPv6: 40 connections reached only %v", c)
		}
	})
}

// Health and metrics endpoints answer inside the node namespace.
func TestHealthAndMetrics(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		b := newBed(t, mode, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			svc := Service("web", "10.96.0.160", Port("http", TCP, 80, 8080))
			b.apply("web.yaml", svc, Slice(svc, V4, "a", allEPs(b.Topology)...))
		}})
		b.ready(b.Pod("pod1a").NS, "tcp", "10.96.0.160:80")
		ns := b.node(1).NS
		for _, path := range []string{"/healthz", "/livez"} {
			if code, body, err := HTTPGet(ns, HealthzAddr, path); err != nil || code != 200 {
				t.Errorf("GET %s: %d %q %v", path, code, body, err)
			}
		}
		_, body, err := HTTPGet(ns, MetricsAddr, "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics: %v", err)
		}
		for _, m := range []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_last_timestamp_seconds"} {
			if !strings.Contains(body, m) {
				t.Errorf("/metrics lacks %s", m)
			}
		}
	})
}

// TestLocalhostNodePorts: NodePorts on loopback addresses, served without
// route_localnet by the userspace proxy beside every kernel mode (natively
// in userspace mode). By default only iptables mode answers 127.0.0.1, as
// kube-proxy's iptables mode (iptables.localhostNodePorts true); the
// keyword "localhost" adds 127.0.0.1 and ::1 in every mode, "primary"
// beside it keeps the node IP; iptables.localhostNodePorts false turns
// loopback off in iptables mode. route_localnet is never set.
func TestLocalhostNodePorts(t *testing.T) {
	np := func(b *bed) {
		s := Service("np", "10.96.0.26", Port("http", TCP, 80, 8080), Port("dns", UDP, 53, 8081))
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort = 30086, 30087
		s.Spec.ClusterIPs = []string{"10.96.0.26", "fd00:96::1a"}
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		rds := corev1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &rds
		var v6 []discoveryv1.Endpoint
		for _, p := range b.Pods() {
			v6 = append(v6, EP6(p))
		}
		b.apply("np.yaml", s, Slice(s, V4, "a", allEPs(b.Topology)...), Slice(s, V6, "a", v6...))
	}
	routeLocalnet := func(t *testing.T, ns string) {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet").Output()
		if err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Errorf("route_localnet = %q (%v), want 0", out, err)
		}
	}
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		t.Run("default", func(t *testing.T) {
			b := newBed(t, mode, bedOptions{Nodes: []int{1}, DefaultNodePortAddresses: true, Before: np})
			ns := b.node(1).NS
			b.ready(ns, "tcp", vip(b.node(1).IPv4, 30086))
			if mode.proxy() == "iptables" {
				before, err := metricValue(ns, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total")
				if err != nil {
					t.Fatal(err)
				}
				b.ready(ns, "tcp", "127.0.0.1:30086")
				b.ready(ns, "udp", "127.0.0.1:30087")
				after, err := metricValue(ns, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total")
				if err != nil || after < before+2 {
					t.Errorf("localhost_nodeports_accepted_packets_total %v → %v (%v), want 2 more", before, after, err)
				}
				expectNoAnswer(t, "IPv6 loopback NodePort (kube-proxy's iptables mode: IPv4 only)", ns, "tcp", "[::1]:30086")
			} else {
				expectNoAnswer(t, "loopback NodePort by default in "+mode.Name+" mode", ns, "tcp", "127.0.0.1:30086")
			}
			routeLocalnet(t, ns)
		})
		t.Run("primary,localhost", func(t *testing.T) {
			b := newBed(t, mode, bedOptions{Nodes: []int{1}, DefaultNodePortAddresses: true, Before: np,
				ExtraArgs: []string{"--nodeport-addresses=primary,localhost"}})
			ns := b.node(1).NS
			b.ready(b.Client, "tcp", vip(b.node(1).IPv4, 30086))
			b.ready(ns, "tcp", "127.0.0.1:30086")
			b.ready(ns, "tcp", "[::1]:30086")
			b.ready(ns, "udp", "127.0.0.1:30087")
			// node1's pod-side address is neither primary nor loopback.
			expectNoAnswer(t, "NodePort on a non-primary address", b.Client, "tcp", vip("10.244.1.1", 30086))
			routeLocalnet(t, ns)
		})
		if mode.proxy() != "iptables" {
			return
		}
		t.Run("localhostNodePorts=false", func(t *testing.T) {
			b := newBed(t, mode, bedOptions{Nodes: []int{1}, DefaultNodePortAddresses: true, Before: np,
				ExtraArgs: []string{"--iptables-localhost-nodeports=false"}})
			ns := b.node(1).NS
			b.ready(ns, "tcp", vip(b.node(1).IPv4, 30086))
			expectNoAnswer(t, "loopback NodePort with localhostNodePorts false", ns, "tcp", "127.0.0.1:30086")
		})
	})
}
