package kube

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Labels and annotations the converters read (convert.Proxied,
// convert.Service, convert.EndpointSlice); strip keeps only these.
var (
	serviceLabels      = []string{model.LabelServiceProxyName, model.LabelHeadless}
	serviceAnnotations = []string{corev1.AnnotationLoadBalancerSourceRangesKey}
	sliceLabels        = []string{discoveryv1.LabelServiceName, model.LabelServiceProxyName, model.LabelHeadless}
)

// strip is the informers' transform: it drops, in place, every part of a
// Service, EndpointSlice or Node that vipproxy never reads, before the
// object enters the informer cache, so the cache holds what conversion
// needs and not, for 10,000 Services, hundreds of MiB of managedFields,
// last-applied-configuration annotations and endpoint targetRefs.
//
// Kept: name, namespace, resourceVersion, uid, deletionTimestamp (the
// informers' and Node conversion's needs); for Services the labels
// serviceLabels, the annotations serviceAnnotations, all of spec but the
// selector, and status.loadBalancer; for EndpointSlices the labels
// sliceLabels, addressType, ports, and per endpoint addresses, conditions,
// nodeName, zone and hints; for Nodes all labels, spec.taints and
// status.addresses. Conversion of a stripped object equals conversion of
// the original (TestStripKeepsConversion). strip is idempotent (client-go
// may call a transform more than once on one object) and passes other
// values, such as cache.DeletedFinalStateUnknown, through unchanged.
func strip(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		stripMeta(&o.ObjectMeta, serviceLabels, serviceAnnotations)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discoveryv1.EndpointSlice:
		stripMeta(&o.ObjectMeta, sliceLabels, nil)
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.Hostname, e.DeprecatedTopology = nil, nil, nil
		}
	case *corev1.Node:
		labels := o.Labels
		stripMeta(&o.ObjectMeta, nil, nil)
		o.Labels = labels
		o.Spec = corev1.NodeSpec{Taints: o.Spec.Taints}
		o.Status = corev1.NodeStatus{Addresses: o.Status.Addresses}
	}
	return obj, nil
}

// stripMeta keeps of m what the informers need and the labels and
// annotations named.
func stripMeta(m *metav1.ObjectMeta, labels, annotations []string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	m.GenerateName = ""
	m.Labels = keepKeys(m.Labels, labels)
	m.Annotations = keepKeys(m.Annotations, annotations)
}

// keepKeys returns the entries of m whose keys are in keys, in a new map
// (nil when none), or m itself when it holds nothing else.
func keepKeys(m map[string]string, keys []string) map[string]string {
	n := 0
	for _, k := range keys {
		if _, ok := m[k]; ok {
			n++
		}
	}
	if n == len(m) {
		return m
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for _, k := range keys {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}
