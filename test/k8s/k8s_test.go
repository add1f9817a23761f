//go:build linux

package k8s

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipproxy/vipproxy/test/e2e"
)

// TestKubernetes runs every Kubernetes-mode scenario on one bed (control
// plane start-up dominates otherwise). Subtests run in order and each
// deletes what it created; -run 'TestKubernetes/ClusterIP' selects one.
func TestKubernetes(t *testing.T) {
	c := newCluster(t)
	for _, sc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Deploy", c.testDeploy},
		{"ClusterIP", c.testClusterIP},
		{"NodePort", c.testNodePort},
		{"LoadBalancer", c.testLoadBalancer},
		{"SessionAffinity", c.testAffinity},
		{"ExternalTrafficPolicyLocal", c.testExternalLocal},
		{"InternalTrafficPolicyLocal", c.testInternalLocal},
		{"TerminatingFallback", c.testTerminating},
		{"NoEndpoints", c.testNoEndpoints},
		{"EndpointReplacement", c.testReplacement},
		{"TopologyZone", c.testTopology},
		{"NodeToBeDeleted", c.testToBeDeleted},
		{"APIServerOutage", c.testAPIServerOutage},
		{"Metrics", c.testMetrics},
		{"OutlierEjection", c.testOutlierEjection},
		{"Latency", c.testLatency},
	} {
		t.Run(sc.name, sc.fn)
	}
}

const settle = 30 * time.Second

// allPods is every pod as a ready endpoint, and their names.
func (c *cluster) allPods() ([]discoveryv1.Endpoint, []string) {
	var eps []discoveryv1.Endpoint
	var names []string
	for _, p := range c.Pods() {
		eps = append(eps, ep(p))
		names = append(names, p.Name)
	}
	return eps, names
}

func (c *cluster) testClusterIP(t *testing.T) {
	svc := c.createService(t, service("web", ""))
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	vip := svc.Spec.ClusterIP
	c.waitFor(t, "tcp", hostPort(vip, 80), settle, from(names...))
	got := c.expectOnly(t, "tcp", hostPort(vip, 80), 40, names...)
	if len(got) < 2 {
		t.Errorf("tcp %s: 40 connections all reached %v; want them spread", vip, got)
	}
	c.waitFor(t, "udp", hostPort(vip, 53), settle, from(names...))
	c.expectOnly(t, "udp", hostPort(vip, 53), 10, names...)
	r := c.waitFor(t, "tcp", hostPort(vip, 80), settle, from(names...))
	if r.Port != 8080 {
		t.Errorf("tcp %s:80 reached port %d, want targetPort 8080", vip, r.Port)
	}

	// The API server's own Service (endpoint kept by the API server itself).
	c.waitKubernetesService(t)
}

func (c *cluster) testNodePort(t *testing.T) {
	s := service("np", "")
	s.Spec.Type = corev1.ServiceTypeNodePort
	svc := c.createService(t, s)
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	var tcpPort, udpPort int32
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolTCP {
			tcpPort = p.NodePort
		} else {
			udpPort = p.NodePort
		}
	}
	if tcpPort == 0 || udpPort == 0 {
		t.Fatalf("API server allocated no NodePorts: %+v", svc.Spec.Ports)
	}
	for _, n := range c.Nodes {
		c.waitFor(t, "tcp", hostPort(n.IPv4, tcpPort), settle, from(names...))
		c.waitFor(t, "udp", hostPort(n.IPv4, udpPort), settle, from(names...))
	}
}

func (c *cluster) testLoadBalancer(t *testing.T) {
	s := service("lb", "")
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc := c.createService(t, s)
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	setIngress := func(ip string) {
		t.Helper()
		cur, err := c.admin.CoreV1().Services("default").Get(context.Background(), "lb", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		if _, err := c.admin.CoreV1().Services("default").UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status: %v", err)
		}
	}
	setIngress("203.0.113.10")
	c.waitFor(t, "tcp", "203.0.113.10:80", settle, from(names...))
	c.waitFor(t, "udp", "203.0.113.10:53", settle, from(names...))
	setIngress("203.0.113.11")
	c.waitFor(t, "tcp", "203.0.113.11:80", settle, from(names...))
	// The old ingress IP is no longer a VIP: nothing answers there.
	deadline := time.Now().Add(settle)
	for {
		_, err := e2e.DialWith(c.Client, "tcp", "203.0.113.10:80", e2e.DialOptions{Timeout: 500 * time.Millisecond})
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("203.0.113.10:80 still answers after the ingress IP was removed")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) testAffinity(t *testing.T) {
	s := service("sticky", "")
	s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	timeout := int32(60)
	s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	svc := c.createService(t, s)
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	first := c.waitFor(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), settle, from(names...))
	got := c.spread("tcp", hostPort(svc.Spec.ClusterIP, 80), 20)
	if len(got) != 1 || got[first.Backend] != 20 {
		t.Errorf("affinity: 20 connections reached %v, want all %s", got, first.Backend)
	}
}

// healthCheck fetches the Service's healthCheckNodePort on node n.
func (c *cluster) healthCheck(n *e2e.Node, port int32) (int, string, error) {
	return e2e.HTTPGet(c.Client, hostPort(n.IPv4, port), "/")
}

func (c *cluster) testExternalLocal(t *testing.T) {
	// LoadBalancer: only those get a healthCheckNodePort.
	s := service("etp", "")
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := c.createService(t, s)
	n1, n2 := c.node(1), c.node(2)
	c.createSlice(t, slice(svc, "a", ep(c.Pod("pod2a")), ep(c.Pod("pod2b"))))
	np := svc.Spec.Ports[0].NodePort
	r := c.waitFor(t, "tcp", hostPort(n2.IPv4, np), settle, from("pod2a", "pod2b"))
	if got := r.Source.Addr().String(); got != ClientIP {
		t.Errorf("externalTrafficPolicy Local: backend saw source %s, want the client's %s", got, ClientIP)
	}
	c.expectOnly(t, "tcp", hostPort(n2.IPv4, np), 10, "pod2a", "pod2b")
	c.expectNoAnswer(t, hostPort(n1.IPv4, np))

	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("no healthCheckNodePort allocated")
	}
	for _, want := range []struct {
		n     *e2e.Node
		code  int
		local string
	}{{n2, http.StatusOK, `"localEndpoints":2`}, {n1, http.StatusServiceUnavailable, `"localEndpoints":0`}} {
		deadline := time.Now().Add(settle)
		for {
			code, body, err := c.healthCheck(want.n, hc)
			compact := strings.Join(strings.Fields(body), "")
			if err == nil && code == want.code && strings.Contains(compact, want.local) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("healthCheckNodePort on %s: code %d body %q err %v; want %d with %s", want.n.Name, code, body, err, want.code, want.local)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (c *cluster) testInternalLocal(t *testing.T) {
	s := service("itp", "")
	local := corev1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &local
	svc := c.createService(t, s)
	sl := c.createSlice(t, slice(svc, "a", ep(c.Pod("pod1a")), ep(c.Pod("pod2a"))))
	vip := hostPort(svc.Spec.ClusterIP, 80)
	// The client's traffic enters at node1: only node1's endpoint is used.
	c.waitFor(t, "tcp", vip, settle, from("pod1a"))
	c.expectOnly(t, "tcp", vip, 20, "pod1a")
	// Without a local endpoint on node1 the traffic is dropped there, even
	// though pod2a is ready on node2.
	c.setEndpoints(t, sl, ep(c.Pod("pod2a")))
	c.expectNoAnswer(t, vip)
}

// withConditions returns e with its conditions replaced.
func withConditions(e discoveryv1.Endpoint, ready, serving, terminating bool) discoveryv1.Endpoint {
	e.Conditions = e2e.Conditions(ready, serving, terminating)
	return e
}

func (c *cluster) testTerminating(t *testing.T) {
	svc := c.createService(t, service("term", ""))
	p1, p2 := c.Pod("pod1a"), c.Pod("pod2a")
	sl := c.createSlice(t, slice(svc, "a", ep(p1), withConditions(ep(p2), false, true, true)))
	vip := hostPort(svc.Spec.ClusterIP, 80)
	// A ready endpoint exists: the terminating one is not used.
	c.waitFor(t, "tcp", vip, settle, from("pod1a"))
	c.expectOnly(t, "tcp", vip, 10, "pod1a")
	// No ready endpoint left: fall back to serving+terminating ones.
	c.setEndpoints(t, sl, withConditions(ep(p1), false, false, true), withConditions(ep(p2), false, true, true))
	c.waitFor(t, "tcp", vip, settle, from("pod2a"))
	c.expectOnly(t, "tcp", vip, 10, "pod2a")
	// Nothing serving: rejected.
	c.setEndpoints(t, sl, withConditions(ep(p1), false, false, true), withConditions(ep(p2), false, false, true))
	c.waitRefused(t, vip)
}

// waitRefused waits until a TCP connect to addr is actively refused (an
// RST or ICMP reject, never a silent timeout) and checks it stays so.
func (c *cluster) waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		_, err := e2e.DialWith(c.Client, "tcp", addr, e2e.DialOptions{Timeout: time.Second})
		if isRefused(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tcp %s: not refused within %v (last: %v)", addr, settle, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		start := time.Now()
		_, err := e2e.DialWith(c.Client, "tcp", addr, e2e.DialOptions{Timeout: time.Second})
		if !isRefused(err) {
			t.Errorf("tcp %s: %v, want connection refused", addr, err)
		} else if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("tcp %s: refused only after %v", addr, d)
		}
	}
}

func (c *cluster) testNoEndpoints(t *testing.T) {
	// No EndpointSlice at all, then an empty one: both are rejected.
	svc := c.createService(t, service("empty", ""))
	vip := hostPort(svc.Spec.ClusterIP, 80)
	c.waitRefused(t, vip)
	sl := c.createSlice(t, slice(svc, "a"))
	c.waitRefused(t, vip)
	// Endpoints arrive: served.
	c.setEndpoints(t, sl, ep(c.Pod("pod1b")))
	c.waitFor(t, "tcp", vip, settle, from("pod1b"))
}

func (c *cluster) testReplacement(t *testing.T) {
	svc := c.createService(t, service("repl", ""))
	sl := c.createSlice(t, slice(svc, "a", ep(c.Pod("pod1a"))))
	vip, udp := hostPort(svc.Spec.ClusterIP, 80), hostPort(svc.Spec.ClusterIP, 53)
	c.waitFor(t, "tcp", vip, settle, from("pod1a"))
	c.waitFor(t, "udp", udp, settle, from("pod1a"))
	c.setEndpoints(t, sl, ep(c.Pod("pod2b")))
	c.waitFor(t, "tcp", vip, settle, from("pod2b"))
	c.waitFor(t, "udp", udp, settle, from("pod2b"))
	c.expectOnly(t, "tcp", vip, 10, "pod2b")
	c.expectOnly(t, "udp", udp, 10, "pod2b")
	// A second slice of the same Service is merged with the first.
	c.createSlice(t, slice(svc, "b", ep(c.Pod("pod1b"))))
	c.waitFor(t, "tcp", vip, settle, from("pod1b"))
	c.expectOnly(t, "tcp", vip, 20, "pod2b", "pod1b")
}

func (c *cluster) setZone(t testing.TB, node, zone string) {
	c.updateNode(t, node, func(n *corev1.Node) {
		if zone == "" {
			delete(n.Labels, corev1.LabelTopologyZone)
		} else {
			n.Labels[corev1.LabelTopologyZone] = zone
		}
	})
}

func (c *cluster) testTopology(t *testing.T) {
	t.Cleanup(func() { c.setZone(t, "node1", ""); c.setZone(t, "node2", "") })
	c.setZone(t, "node1", "zone-a")
	c.setZone(t, "node2", "zone-b")
	svc := c.createService(t, service("topo", ""))
	hinted := func(p *e2e.Pod, zone string) discoveryv1.Endpoint {
		e := ep(p)
		e.Zone = &zone
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
		return e
	}
	c.createSlice(t, slice(svc, "a",
		hinted(c.Pod("pod1a"), "zone-a"), hinted(c.Pod("pod1b"), "zone-a"),
		hinted(c.Pod("pod2a"), "zone-b"), hinted(c.Pod("pod2b"), "zone-b")))
	vip := hostPort(svc.Spec.ClusterIP, 80)
	// node1 (where the client's traffic enters) is in zone-a.
	c.waitFor(t, "tcp", vip, settle, from("pod1a", "pod1b"))
	c.expectOnly(t, "tcp", vip, 20, "pod1a", "pod1b")
	// Relabel node1: its zone, and so its endpoints, follow the Node object.
	c.setZone(t, "node1", "zone-b")
	c.waitFor(t, "tcp", vip, settle, from("pod2a", "pod2b"))
	c.expectOnly(t, "tcp", vip, 20, "pod2a", "pod2b")
	// A zone no endpoint is hinted for: hints are ignored, all are used.
	c.setZone(t, "node1", "zone-c")
	c.waitFor(t, "tcp", vip, settle, from("pod1a", "pod1b"))

	// trafficDistribution PreferClose with zoned endpoints but no hints (the
	// EndpointSlice controller removes them on purpose, for unbalanced
	// zones): hints are followed as they are, so node1 in zone-a also
	// reaches zone-b's endpoint, as kube-proxy does; vipproxy once derived
	// the missing hints and kept every connection in zone-a.
	c.setZone(t, "node1", "zone-a")
	pc := corev1.ServiceTrafficDistributionPreferClose
	nohint := service("topo-nohint", "")
	nohint.Spec.TrafficDistribution = &pc
	svc2 := c.createService(t, nohint)
	zoned := func(p *e2e.Pod, zone string) discoveryv1.Endpoint {
		e := ep(p)
		e.Zone = &zone
		return e
	}
	c.createSlice(t, slice(svc2, "a", zoned(c.Pod("pod1a"), "zone-a"), zoned(c.Pod("pod2a"), "zone-b")))
	c.waitFor(t, "tcp", hostPort(svc2.Spec.ClusterIP, 80), settle, from("pod2a"))
}

func (c *cluster) testToBeDeleted(t *testing.T) {
	n1, n2 := c.node(1), c.node(2)
	taint := corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: strconv.FormatInt(time.Now().Unix(), 10),
		Effect: corev1.TaintEffectNoSchedule}
	c.updateNode(t, "node1", func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) })
	untaint := func() {
		c.updateNode(t, "node1", func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taint.Key })
		})
	}
	t.Cleanup(untaint)
	if err := WaitHealth(c.proxies[0], n1, "/healthz", http.StatusServiceUnavailable, settle); err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		n    *e2e.Node
		path string
		code int
	}{{n1, "/livez", 200}, {n2, "/healthz", 200}, {n2, "/livez", 200}} {
		if code, body, err := e2e.HTTPGet(k.n.NS, HealthzAddr, k.path); err != nil || code != k.code {
			t.Errorf("%s %s: code %d body %q err %v, want %d", k.n.Name, k.path, code, body, err, k.code)
		}
	}
	untaint()
	if err := WaitHealth(c.proxies[0], n1, "/healthz", http.StatusOK, settle); err != nil {
		t.Fatal(err)
	}
}

// testMetrics: /metrics of a vipproxy in Kubernetes mode carries what
// kube-proxy's does beside its own series: client-go's rest_client_*
// (component-base), kubernetes_build_info, and the kubeproxy_* series with
// kube-proxy v1.34's ip_family label.
func (c *cluster) testMetrics(t *testing.T) {
	_, body, err := e2e.HTTPGet(c.node(1).NS, MetricsAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"rest_client_requests_total{", "rest_client_request_duration_seconds_bucket{", "kubernetes_build_info{",
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		"kubeproxy_network_programming_duration_seconds_bucket{",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// testOutlierEjection: in Kubernetes mode an ejection is also an Event on
// the Service (vipproxy's RBAC is deploy/rbac.yaml's).
func (c *cluster) testOutlierEjection(t *testing.T) {
	s := service("flaky", "")
	s.Annotations = map[string]string{"vipproxy.io/outlier-ejection": "on"}
	svc := c.createService(t, s)
	eps, names := c.allPods()
	c.createSlice(t, slice(svc, "a", eps...))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	c.waitFor(t, "tcp", addr, settle, from(names...))
	victim := c.Pods()[0]
	victim.Backend.Close()
	t.Cleanup(func() {
		b, err := e2e.StartBackend(victim.NS, victim.Name, BackendPorts, BackendPorts)
		if err != nil {
			t.Errorf("restart %s: %v", victim.Name, err)
			return
		}
		victim.Backend = b
	})
	deadline := time.Now().Add(settle)
	for {
		c.spread("tcp", addr, 20)
		list, err := c.admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Kind == "Service" && ev.InvolvedObject.Name == "flaky" && ev.Reason == "EndpointEjected" {
				if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, victim.IPv4+":8080") || ev.Source.Component != "vipproxy" {
					t.Errorf("event %s: type %s, message %q, source %+v", ev.Name, ev.Type, ev.Message, ev.Source)
				}
				t.Logf("event on the Service: %s %s: %s", ev.Type, ev.Reason, ev.Message)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no EndpointEjected Event on Service flaky within %v", settle)
		}
	}
}
