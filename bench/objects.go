//go:build linux

package bench

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Namespace is the Kubernetes namespace of every generated object.
const Namespace = "bench"

// fakePodBase starts the pod range of endpoints that exist only as
// addresses (nothing answers there): 10.245.0.0 … 10.246.255.255, inside
// ClusterCIDR.
var fakePodBase = netip.MustParseAddr("10.245.0.0")

const fakePodSize = 1 << 17

// Set is one benchmark's objects: N Services with M endpoints each. Every
// SampleEvery-th Service and the last one point at the real backends; the
// rest point at addresses in a pod range where nothing answers. The
// Services named by Changes start with their endpoints on DeadPort
// (connects are refused) and are switched to BackendPort one at a time to
// measure programming latency.
type Set struct {
	N, M        int
	SampleEvery int
	Changes     []int // indices of the Services a change switches on
	// Base marks the small baseline set (BaseSet): names "base-NN",
	// ClusterIPs from 10.96.250.0, every Service real.
	Base bool
	// Annotations go on every Service, or with AnnotateHalf on half of
	// them (see Annotated).
	Annotations  map[string]string
	AnnotateHalf bool
}

// Annotated reports whether Service i carries the Annotations: every
// Service, or with AnnotateHalf those in even strides of SampleEvery, so
// that the real Services (the probes) alternate between annotated and
// plain ones.
func (s *Set) Annotated(i int) bool {
	return len(s.Annotations) > 0 && (!s.AnnotateHalf || (i/s.SampleEvery)%2 == 0)
}

// MaxN is the largest Service count a NewSet lays out: ClusterIPs run from
// 10.96.0.10 through ServiceCIDR (a /15) and stop below the baseline set's.
const MaxN = 120000

// BaseSet returns the baseline set: 10 Services × m endpoints, all pointing
// at the real backends, named and addressed apart from any NewSet (N ≤
// MaxN) so both can live in one API server.
func BaseSet(m int) *Set { return &Set{N: 10, M: m, SampleEvery: 1, Base: true} }

// NewSet lays out n Services × m endpoints with changes change targets.
func NewSet(n, m, changes int) *Set {
	s := &Set{N: n, M: m, SampleEvery: 100}
	if n < 1000 {
		s.SampleEvery = 10
	}
	if changes > n-1 {
		changes = n - 1
	}
	for k := 0; k < changes; k++ {
		// Spread over [0, n-1) so the last Service (the cold-start probe)
		// is never a change target.
		s.Changes = append(s.Changes, k*(n-1)/changes)
	}
	return s
}

// IsChange reports whether Service i is a change target.
func (s *Set) IsChange(i int) bool {
	for _, c := range s.Changes {
		if c == i {
			return true
		}
	}
	return false
}

// Real reports whether Service i points at the real backends.
func (s *Set) Real(i int) bool { return i == s.N-1 || i%s.SampleEvery == 0 || s.IsChange(i) }

// Name returns Service i's name.
func (s *Set) Name(i int) string {
	if s.Base {
		return fmt.Sprintf("base-%02d", i)
	}
	return fmt.Sprintf("svc-%05d", i)
}

// ClusterIP returns Service i's ClusterIP: 10.96.0.10 + i (10.97.250.0 + i
// in the baseline set).
func (s *Set) ClusterIP(i int) string {
	v := 10 + i
	if s.Base {
		v = 1<<16 + 250<<8 + i
	}
	return fmt.Sprintf("10.%d.%d.%d", 96+v>>16, v>>8&0xff, v&0xff)
}

// VIP returns Service i's "clusterIP:80".
func (s *Set) VIP(i int) string { return s.ClusterIP(i) + ":80" }

// Probes returns the indices of Services that answer from the start (real
// backends, not change targets), the ones first-packet latency is measured
// through.
func (s *Set) Probes() []int {
	var out []int
	for i := 0; i < s.N; i++ {
		if s.Real(i) && !s.IsChange(i) {
			out = append(out, i)
		}
	}
	return out
}

// Service returns Service i.
func (s *Set) Service(i int) *corev1.Service {
	var ann map[string]string
	if s.Annotated(i) {
		ann = s.Annotations
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name(i), Namespace: Namespace, Annotations: ann},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  s.ClusterIP(i),
			ClusterIPs: []string{s.ClusterIP(i)},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(BackendPort),
			}},
		},
	}
}

// Slice returns Service i's EndpointSlice; live selects BackendPort over
// DeadPort for a change target (other Services always use BackendPort).
func (s *Set) Slice(i int, live bool) *discoveryv1.EndpointSlice {
	port := int32(BackendPort)
	if s.IsChange(i) && !live {
		port = DeadPort
	}
	name, proto := "http", corev1.ProtocolTCP
	ready := true
	node := NodeName
	sl := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name(i) + "-1", Namespace: Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: s.Name(i),
				discoveryv1.LabelManagedBy:   "vipproxy-bench",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := 0; j < s.M; j++ {
		var addr string
		if s.Real(i) {
			addr = RealBackendIP(j)
		} else {
			a := fakePodBase.As4()
			off := uint32((i*s.M + j) % fakePodSize)
			a[1] += byte(off >> 16)
			a[2] += byte(off >> 8)
			a[3] += byte(off)
			addr = netip.AddrFrom4(a).String()
		}
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	return sl
}
