package kube

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vipproxy/vipproxy/internal/model"
)

const waitLimit = 10 * time.Second

func ptr[T any](v T) *T { return &v }

func service(name, ip string, port int32, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Port: port}},
		},
	}
}

func slice(name, svc string, ips ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}})
	}
	return es
}

func node(name, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{model.LabelTopologyZone: zone}}}
}

type harness struct {
	t      *testing.T
	client kubernetes.Interface
	out    chan *model.Snapshot
	last   *model.Snapshot
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	return startDebounce(t, 20*time.Millisecond, objs...)
}

func startDebounce(t *testing.T, debounce time.Duration, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: fake.NewClientset(objs...), out: make(chan *model.Snapshot)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- New(Options{Client: fromClientset(h.client), NodeName: "n1", Debounce: debounce}).Run(ctx, h.out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
	select {
	case h.last = <-h.out:
	case <-time.After(waitLimit):
		t.Fatal("no first snapshot")
	}
	return h
}

func (h *harness) until(what string, cond func(*model.Snapshot) bool) *model.Snapshot {
	h.t.Helper()
	if cond(h.last) {
		return h.last
	}
	deadline := time.After(waitLimit)
	for {
		select {
		case s := <-h.out:
			h.last = s
			if cond(s) {
				return s
			}
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; last: %s", what, describe(h.last))
			return nil
		}
	}
}

func describe(s *model.Snapshot) string {
	var b strings.Builder
	for _, svc := range s.Services {
		fmt.Fprintf(&b, "svc %s %v", svc.ServiceName, svc.ClusterIPs)
		for _, p := range svc.Ports {
			fmt.Fprintf(&b, " %d", p.Port)
		}
		b.WriteString("; ")
	}
	for _, sl := range s.Slices {
		fmt.Fprintf(&b, "slice %s %d endpoints; ", sl.Name, len(sl.Endpoints))
	}
	if s.Node != nil {
		fmt.Fprintf(&b, "node %+v; ", *s.Node)
	}
	for _, p := range s.Problems {
		fmt.Fprintf(&b, "problem [%s]; ", p.Error())
	}
	return b.String()
}

func svcPort(s *model.Snapshot, name string) int {
	for _, svc := range s.Services {
		if svc.Name == name && len(svc.Ports) > 0 {
			return int(svc.Ports[0].Port)
		}
	}
	return 0
}

func sliceEndpoints(s *model.Snapshot, name string) int {
	for _, sl := range s.Slices {
		if sl.Name == name {
			return len(sl.Endpoints)
		}
	}
	return -1
}

func TestInitialSnapshot(t *testing.T) {
	h := start(t,
		service("web", "10.96.0.10", 80, nil),
		service("other-proxy", "10.96.0.11", 80, map[string]string{model.LabelServiceProxyName: "foo"}),
		slice("web-1", "web", "10.0.0.1", "10.0.0.2"),
		node("n1", "z1"), node("n2", "z2"))
	s := h.last
	if len(s.Services) != 1 || svcPort(s, "web") != 80 || s.Services[0].ClusterIPs[0] != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("services: %s", describe(s))
	}
	if sliceEndpoints(s, "web-1") != 2 {
		t.Errorf("slices: %s", describe(s))
	}
	if s.Node == nil || s.Node.Name != "n1" || s.Node.Zone() != "z1" {
		t.Errorf("node: %s", describe(s))
	}
}

func TestChanges(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		do   func(t *testing.T, c kubernetes.Interface) error
		want func(*model.Snapshot) bool
	}{
		{
			name: "add Service",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.CoreV1().Services("default").Create(ctx, service("db", "10.96.0.20", 5432, nil), metav1.CreateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return svcPort(s, "db") == 5432 && svcPort(s, "web") == 80 },
		},
		{
			name: "update Service",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.CoreV1().Services("default").Update(ctx, service("web", "10.96.0.10", 81, nil), metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return svcPort(s, "web") == 81 },
		},
		{
			name: "delete Service",
			do: func(t *testing.T, c kubernetes.Interface) error {
				return c.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{})
			},
			want: func(s *model.Snapshot) bool { return len(s.Services) == 0 && sliceEndpoints(s, "web-1") == 1 },
		},
		{
			name: "Service gaining the service-proxy-name label is dropped",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.CoreV1().Services("default").Update(ctx,
					service("web", "10.96.0.10", 80, map[string]string{model.LabelServiceProxyName: "x"}), metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return len(s.Services) == 0 },
		},
		{
			name: "invalid Service is a Problem, not a Service",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.CoreV1().Services("default").Create(ctx, service("bad", "10.96.0.300", 80, nil), metav1.CreateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool {
				return len(s.Services) == 1 && len(s.Problems) == 1 &&
					s.Problems[0].Object == "Service default/bad" && s.Problems[0].Field == "spec.clusterIPs[0]"
			},
		},
		{
			name: "add EndpointSlice",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("web-2", "web", "10.0.0.5", "10.0.0.6", "10.0.0.7"), metav1.CreateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool {
				return sliceEndpoints(s, "web-2") == 3 && sliceEndpoints(s, "web-1") == 1
			},
		},
		{
			name: "update EndpointSlice",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("web-1", "web"), metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return sliceEndpoints(s, "web-1") == 0 },
		},
		{
			name: "delete EndpointSlice",
			do: func(t *testing.T, c kubernetes.Interface) error {
				return c.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{})
			},
			want: func(s *model.Snapshot) bool { return len(s.Slices) == 0 && svcPort(s, "web") == 80 },
		},
		{
			name: "headless EndpointSlice is ignored",
			do: func(t *testing.T, c kubernetes.Interface) error {
				es := slice("hl-1", "hl", "10.0.0.9")
				es.Labels[model.LabelHeadless] = ""
				if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
					return err
				}
				// A marker change processed after it.
				_, err := c.CoreV1().Services("default").Create(ctx, service("marker", "10.96.0.99", 1, nil), metav1.CreateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return svcPort(s, "marker") == 1 && sliceEndpoints(s, "hl-1") == -1 },
		},
		{
			name: "Node zone label change",
			do: func(t *testing.T, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().Update(ctx, node("n1", "z9"), metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return s.Node != nil && s.Node.Zone() == "z9" && !s.Node.ToBeDeleted },
		},
		{
			name: "Node autoscaler taint",
			do: func(t *testing.T, c kubernetes.Interface) error {
				n := node("n1", "z1")
				n.Spec.Taints = []corev1.Taint{{Key: model.TaintToBeDeletedByAutoscale, Effect: corev1.TaintEffectNoSchedule}}
				_, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return s.Node != nil && s.Node.ToBeDeleted && !s.Node.Deleting },
		},
		{
			name: "Node deletionTimestamp",
			do: func(t *testing.T, c kubernetes.Interface) error {
				n := node("n1", "z1")
				n.DeletionTimestamp = ptr(metav1.Now())
				_, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			},
			want: func(s *model.Snapshot) bool { return s.Node != nil && s.Node.Deleting },
		},
		{
			name: "other Node ignored, own Node deleted",
			do: func(t *testing.T, c kubernetes.Interface) error {
				if _, err := c.CoreV1().Nodes().Update(ctx, node("n2", "zz"), metav1.UpdateOptions{}); err != nil {
					return err
				}
				return c.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{})
			},
			want: func(s *model.Snapshot) bool { return s.Node == nil },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, service("web", "10.96.0.10", 80, nil), slice("web-1", "web", "10.0.0.1"), node("n1", "z1"), node("n2", "z2"))
			if err := tc.do(t, h.client); err != nil {
				t.Fatal(err)
			}
			h.until(tc.name, tc.want)
		})
	}
}

func TestLabelledServiceIgnored(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	for _, l := range []string{model.LabelServiceProxyName, model.LabelHeadless} {
		if _, err := h.client.CoreV1().Services("default").Create(ctx, service("skip-"+strings.ReplaceAll(l, "/", "-"), "10.96.0.5", 80, map[string]string{l: ""}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.client.CoreV1().Services("default").Create(ctx, service("marker", "10.96.0.6", 80, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := h.until("marker", func(s *model.Snapshot) bool { return svcPort(s, "marker") == 80 })
	if len(s.Services) != 1 {
		t.Errorf("labelled Services were not ignored: %s", describe(s))
	}
}

func TestNoSnapshotWithoutChange(t *testing.T) {
	h := start(t, service("web", "10.96.0.10", 80, nil))
	ctx := context.Background()
	// A status-only change that converts to the same model produces nothing.
	svc := service("web", "10.96.0.10", 80, nil)
	svc.Annotations = map[string]string{"note": "irrelevant"}
	if _, err := h.client.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-h.out:
		t.Fatalf("unexpected snapshot: %s", describe(s))
	case <-time.After(300 * time.Millisecond):
	}
}

func TestDebounceBurst(t *testing.T) {
	// A generous quiet time so a loaded machine cannot split the burst.
	h := startDebounce(t, 500*time.Millisecond)
	ctx := context.Background()
	for i := range 50 {
		if _, err := h.client.CoreV1().Services("default").Create(ctx, service(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.1.%d", i+1), 80, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	deadline := time.After(waitLimit)
	for len(h.last.Services) != 50 {
		select {
		case h.last = <-h.out:
			n++
		case <-deadline:
			t.Fatalf("timed out: %d services", len(h.last.Services))
		}
	}
	if n > 3 {
		t.Errorf("50 quick creations produced %d snapshots, want at most 3", n)
	}
}

// TestSelectors checks that the API server is asked only for what
// kube-proxy asks for: Services and EndpointSlices without the proxy-name
// and headless labels, and this node's Node.
func TestSelectors(t *testing.T) {
	h := start(t)
	want := map[string]string{
		"services":       "label=" + proxyLabelSelector(),
		"endpointslices": "label=" + proxyLabelSelector(),
		"nodes":          "field=metadata.name=n1",
	}
	seen := map[string]bool{}
	for _, a := range h.client.(*fake.Clientset).Actions() {
		la, ok := a.(k8stesting.ListAction)
		if !ok {
			continue
		}
		r := la.GetListRestrictions()
		got := "label=" + r.Labels.String()
		if a.GetResource().Resource == "nodes" {
			got = "field=" + r.Fields.String()
		}
		w, ok := want[a.GetResource().Resource]
		if !ok {
			continue
		}
		seen[a.GetResource().Resource] = true
		if got != w {
			t.Errorf("%s %s: %s, want %s", a.GetVerb(), a.GetResource().Resource, got, w)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("listed %v, want all of %v", seen, want)
	}
	if !strings.Contains(proxyLabelSelector(), "!"+model.LabelServiceProxyName) || !strings.Contains(proxyLabelSelector(), "!"+model.LabelHeadless) {
		t.Errorf("selector %q", proxyLabelSelector())
	}
}

// TestChangeTriggers: an EndpointSlice change carries the controller's
// last-change-trigger-time into the next snapshot, once; network
// programming latency is measured from it, as in kube-proxy.
func TestChangeTriggers(t *testing.T) {
	ctx := context.Background()
	h := start(t, service("web", "10.96.0.10", 80, nil))
	when := time.Date(2026, 11, 27, 9, 0, 0, 123000000, time.UTC)
	es := slice("web-1", "web", "10.0.0.1")
	es.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": when.Format(time.RFC3339Nano)}
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := h.until("the slice", func(s *model.Snapshot) bool { return sliceEndpoints(s, "web-1") == 1 })
	if len(s.ChangeTriggers) != 1 || !s.ChangeTriggers[0].Time.Equal(when) || s.ChangeTriggers[0].Family != model.IPv4 {
		t.Fatalf("ChangeTriggers = %v, want [%v]", s.ChangeTriggers, when)
	}
	// A Service change carries none (the slice's trigger was reported).
	if _, err := h.client.CoreV1().Services("default").Update(ctx, service("web", "10.96.0.10", 81, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = h.until("the Service change", func(s *model.Snapshot) bool { return svcPort(s, "web") == 81 })
	if len(s.ChangeTriggers) != 0 {
		t.Errorf("ChangeTriggers after a Service change = %v, want none", s.ChangeTriggers)
	}
}

// fromClientset adapts a client-go clientset (the fake one) to Client.
func fromClientset(c kubernetes.Interface) *Client {
	nodes := typedFuncs(c.CoreV1().Nodes().List, c.CoreV1().Nodes().Watch)
	nodes.GetFunc = func(ctx context.Context, name string, o metav1.GetOptions) (runtime.Object, error) {
		return c.CoreV1().Nodes().Get(ctx, name, o)
	}
	return &Client{
		Services:       typedFuncs(c.CoreV1().Services("").List, c.CoreV1().Services("").Watch),
		EndpointSlices: typedFuncs(c.DiscoveryV1().EndpointSlices("").List, c.DiscoveryV1().EndpointSlices("").Watch),
		Nodes:          nodes,
	}
}

// typedFuncs makes a ResourceFuncs of a typed client's List and Watch.
func typedFuncs[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error),
	watch func(context.Context, metav1.ListOptions) (watch.Interface, error)) ResourceFuncs {
	return ResourceFuncs{
		ListFunc:             func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return list(ctx, o) },
		WatchFunc:            watch,
		WatchListUnsupported: true,
	}
}
