package manifests

import (
	"reflect"
	"slices"

	"github.com/vipproxy/vipproxy/internal/model"
)

// snapshotsEqual reports whether a and b hold the same Services, Slices,
// Node and Problems, so Run can drop a snapshot identical to the last one
// sent. It is reflect.DeepEqual typed out (that took tens of milliseconds
// at 10,000 Services, on every change), except that nil and empty slices
// are equal. Slices that share their backing array are equal without a
// walk: an unchanged file keeps its decoded objects, so most of a
// snapshot compares in O(1) per object. TestSnapshotsEqualCoversModel
// fails when a model type gains a field this does not compare.
func snapshotsEqual(a, b *model.Snapshot) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.Services, b.Services, serviceEqual) &&
		slices.EqualFunc(a.Slices, b.Slices, sliceEqual) &&
		reflect.DeepEqual(a.Node, b.Node) &&
		same(a.Problems, b.Problems)
}

// same compares two slices of comparable values, in O(1) when they share
// their backing array.
func same[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b)
}

func serviceEqual(a, b model.Service) bool {
	return a.ServiceName == b.ServiceName &&
		a.Type == b.Type &&
		same(a.ClusterIPs, b.ClusterIPs) &&
		a.Headless == b.Headless &&
		same(a.IPFamilies, b.IPFamilies) &&
		a.IPFamilyPolicy == b.IPFamilyPolicy &&
		same(a.ExternalIPs, b.ExternalIPs) &&
		same(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		same(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		a.AffinityTimeoutSeconds == b.AffinityTimeoutSeconds &&
		a.ExternalTrafficPolicy == b.ExternalTrafficPolicy &&
		a.InternalTrafficPolicy == b.InternalTrafficPolicy &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		a.TrafficDistribution == b.TrafficDistribution &&
		same(a.Ports, b.Ports)
}

func sliceEqual(a, b model.EndpointSlice) bool {
	if a.Name != b.Name || a.Service != b.Service || a.AddressType != b.AddressType ||
		!same(a.Ports, b.Ports) || len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	if len(a.Endpoints) == 0 || &a.Endpoints[0] == &b.Endpoints[0] {
		return true
	}
	return slices.EqualFunc(a.Endpoints, b.Endpoints, func(x, y model.SliceEndpoint) bool {
		return same(x.Addresses, y.Addresses) &&
			x.Ready == y.Ready && x.Serving == y.Serving && x.Terminating == y.Terminating &&
			x.NodeName == y.NodeName && x.Zone == y.Zone &&
			same(x.ZoneHints, y.ZoneHints) && same(x.NodeHints, y.NodeHints)
	})
}
