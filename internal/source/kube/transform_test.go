package kube

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source/convert"
)

// richMeta is metadata as the API server returns it for an object created
// by kubectl apply (svc) or the EndpointSlice controller: labels,
// last-applied-configuration, managedFields, owner references.
func richMeta(name string, i int, lastApplied string, fields string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: "default", UID: types.UID(fmt.Sprintf("6f2c9a1e-0000-4000-8000-%012d", i)),
		ResourceVersion: fmt.Sprint(100000 + i), Generation: 1,
		CreationTimestamp: metav1.Unix(1700000000, 0),
		Labels:            map[string]string{"app": name, "app.kubernetes.io/part-of": "bench", "team": "payments"},
		Annotations: map[string]string{
			"kubectl.kubernetes.io/last-applied-configuration": lastApplied,
			"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-26T03:30:00Z",
		},
		ManagedFields: []metav1.ManagedFieldsEntry{
			{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: ptr(metav1.Unix(1700000000, 0)), FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}},
			{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: ptr(metav1.Unix(1700000001, 0)), FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:loadBalancer":{}}}`)}},
		},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: types.UID("u-" + name),
			Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
	}
}

const serviceFields = `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app":{},"f:app.kubernetes.io/part-of":{},"f:team":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`

const sliceFields = `{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:annotations":{".":{},"f:endpoints.kubernetes.io/last-change-trigger-time":{}},"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"u\"}":{}}},"f:ports":{}}`

// richService is Service i of a benchmark cluster, every field vipproxy
// reads set, and much it does not.
func richService(i int) *corev1.Service {
	name := fmt.Sprintf("svc-%05d", i)
	ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
	last := fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app":%q},"name":%q,"namespace":"default"},"spec":{"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}],"selector":{"app":%q}}}`, name, name, name)
	svc := &corev1.Service{
		ObjectMeta: richMeta(name, i, last, serviceFields),
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: ptr(corev1.IPFamilyPolicySingleStack),
			Ports:           []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
			Selector:        map[string]string{"app": name},
			SessionAffinity: corev1.ServiceAffinityNone, InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyCluster),
		},
	}
	svc.OwnerReferences = nil
	return svc
}

// richSlice is the EndpointSlice of Service i with eps endpoints, as the
// EndpointSlice controller writes it.
func richSlice(i, eps int) *discoveryv1.EndpointSlice {
	svc := fmt.Sprintf("svc-%05d", i)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  richMeta(svc+"-x7k2p", i, "", sliceFields),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	es.GenerateName = svc + "-"
	es.Labels[discoveryv1.LabelServiceName] = svc
	es.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	delete(es.Annotations, "kubectl.kubernetes.io/last-applied-configuration")
	for e := range eps {
		pod := fmt.Sprintf("%s-7d9f8c6b5-%05d", svc, e)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+e, i/250, i%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(fmt.Sprintf("node-%d", e)), Zone: ptr(fmt.Sprintf("zone-%d", e%3)),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod,
				UID: types.UID(fmt.Sprintf("0b6f5e2a-0000-4000-8000-%07d%05d", i, e))},
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: fmt.Sprintf("zone-%d", e%3)}}},
		})
	}
	return es
}

func richNode() *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{model.LabelTopologyZone: "zone-1", "kubernetes.io/os": "linux"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", ProviderID: "aws:///x",
			Taints: []corev1.Taint{{Key: model.TaintToBeDeletedByAutoscale, Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeHostName, Address: "node-1"}},
			Images:    []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 1 << 20}},
		},
	}
	n.DeletionTimestamp = ptr(metav1.Unix(1700000000, 0))
	return n
}

// TestTransform: for objects with every field the converters read (and
// many they do not), the Source records the same thing from the
// transformed cache entry as from the API object; the entry keeps no part
// of the API object but the informers' metadata; the informers' key
// function works on it; and transforming twice changes nothing.
func TestTransform(t *testing.T) {
	lb := richService(1)
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.Ports[0].NodePort = 30080
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = 31000
	lb.Spec.ExternalIPs = []string{"192.0.2.1"}
	lb.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	lb.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
	lb.Spec.TrafficDistribution = ptr("PreferClose")
	lb.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] = "203.0.113.0/24"
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}}
	proxyName := richService(2)
	proxyName.Labels[model.LabelServiceProxyName] = "other"
	bad := richService(4)
	bad.Spec.Ports[0].Port = 0
	noName := richSlice(3, 2)
	delete(noName.Labels, discoveryv1.LabelServiceName)
	headless := richSlice(5, 2)
	headless.Labels[model.LabelHeadless] = ""

	tests := []struct {
		name string
		obj  func() k8sruntime.Object
		want int // Services + slices the Source holds afterwards
	}{
		{"Service", func() k8sruntime.Object { return richService(0) }, 1},
		{"Service LoadBalancer", func() k8sruntime.Object { return lb.DeepCopy() }, 1},
		{"Service with proxy-name label", func() k8sruntime.Object { return proxyName.DeepCopy() }, 0},
		{"Service refused", func() k8sruntime.Object { return bad.DeepCopy() }, 1},
		{"EndpointSlice", func() k8sruntime.Object { return richSlice(0, 3) }, 1},
		{"EndpointSlice without service-name label", func() k8sruntime.Object { return noName.DeepCopy() }, 0},
		{"EndpointSlice of a headless Service", func() k8sruntime.Object { return headless.DeepCopy() }, 0},
	}
	feed := func(s *Source, o any) {
		s.onService(o, false)
		s.onSlice(o, false)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			direct, viaCache := New(Options{}), New(Options{})
			feed(direct, tc.obj())
			entry, err := transform(tc.obj())
			if err != nil {
				t.Fatal(err)
			}
			feed(viaCache, entry)
			if !reflect.DeepEqual(direct.services, viaCache.services) || !reflect.DeepEqual(direct.slices, viaCache.slices) {
				t.Errorf("Source state differs:\n direct %+v %+v\n cached %+v %+v", direct.services, direct.slices, viaCache.services, viaCache.slices)
			}
			if n := len(viaCache.services) + len(viaCache.slices); n != tc.want {
				t.Errorf("Source holds %d objects, want %d", n, tc.want)
			}
			m, err := meta.Accessor(entry)
			if err != nil {
				t.Fatalf("cache entry %T has no metadata: %v", entry, err)
			}
			orig, _ := meta.Accessor(tc.obj())
			if m.GetManagedFields() != nil || m.GetLabels() != nil || m.GetAnnotations() != nil ||
				m.GetResourceVersion() != orig.GetResourceVersion() || m.GetUID() != orig.GetUID() {
				t.Errorf("cache entry metadata %+v", m)
			}
			if key, err := cache.MetaNamespaceKeyFunc(entry); err != nil || key != "default/"+orig.GetName() {
				t.Errorf("key %q, %v", key, err)
			}
			if again, _ := transform(entry); again != entry {
				t.Errorf("second transform made a new entry")
			}
		})
	}
}

// TestTransformNode: the stripped Node converts as the original did and
// keeps no status but addresses; tombstones pass through.
func TestTransformNode(t *testing.T) {
	want := convert.Node(richNode())
	got, _ := transform(richNode())
	n := got.(*corev1.Node)
	if c := convert.Node(n); !reflect.DeepEqual(c, want) {
		t.Errorf("conversion after transform: %+v, want %+v", c, want)
	}
	if len(n.Status.Images) != 0 || n.Spec.ProviderID != "" || n.ManagedFields != nil {
		t.Errorf("unread Node fields kept: %+v", n)
	}
	if len(want.PodCIDRs) == 0 {
		t.Errorf("the test Node's pod CIDR did not convert: %+v", want)
	}
	again, _ := transform(n)
	if c := convert.Node(again.(*corev1.Node)); !reflect.DeepEqual(c, want) {
		t.Errorf("second transform changed the conversion")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "default/x", Obj: richService(0)}
	if o, _ := transform(tomb); !reflect.DeepEqual(o, tomb) {
		t.Errorf("tombstone changed: %+v", o)
	}
}

// decoded returns a copy of obj decoded from JSON, so that, as in an
// informer, every string is its own allocation.
func decoded[T any](obj *T) *T {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkRetainedHeap10000 reports the heap retained by 10,000 Services
// and their EndpointSlices of 10 endpoints: in an informer store (API
// objects as decoded, or transform's cache entries) and in the Source's
// maps on top of that. It measures once per run; b.N only repeats it.
func BenchmarkRetainedHeap10000(b *testing.B) {
	const n, eps = 10000, 10
	for _, transformed := range []bool{false, true} {
		b.Run(fmt.Sprintf("transform=%v", transformed), func(b *testing.B) {
			var cacheMiB, sourceMiB float64
			for b.Loop() {
				h0 := heapInUse()
				svcs := cache.NewStore(cache.MetaNamespaceKeyFunc)
				sls := cache.NewStore(cache.MetaNamespaceKeyFunc)
				for i := range n {
					var svc any = decoded(richService(i))
					var es any = decoded(richSlice(i, eps))
					if transformed {
						svc, _ = transform(svc)
						es, _ = transform(es)
					}
					_ = svcs.Add(svc)
					_ = sls.Add(es)
				}
				h1 := heapInUse()
				s := New(Options{})
				for _, o := range svcs.List() {
					s.onService(o, false)
				}
				for _, o := range sls.List() {
					s.onSlice(o, false)
				}
				h2 := heapInUse()
				if snap := s.snapshot(); len(snap.Services) != n || len(snap.Slices) != n {
					b.Fatalf("%d Services, %d slices", len(snap.Services), len(snap.Slices))
				}
				runtime.KeepAlive(svcs)
				runtime.KeepAlive(sls)
				cacheMiB, sourceMiB = float64(h1-h0)/(1<<20), float64(h2-h1)/(1<<20)
			}
			b.ReportMetric(cacheMiB, "cache-MiB")
			b.ReportMetric(sourceMiB, "source-MiB")
		})
	}
}
