package manifests

import (
	"slices"

	"github.com/vipproxy/vipproxy/internal/model"
)

// snapshotsEqual reports whether a and b hold the same Services, Slices,
// Node and Problems, so Run can drop a snapshot identical to the last one
// sent. It is reflect.DeepEqual typed out (that took tens of milliseconds
// at 10,000 Services, on every change), except that nil and empty slices
// are equal. Slices that share their backing array are equal without a
// walk: an unchanged file keeps its decoded objects, so most of a
// snapshot compares in O(1) per object. Gen and Patch are bookkeeping,
// not content, and are not compared (a dropped snapshot only costs the
// next one its Patch: the Builder finds a different base and compares
// every Service). TestSnapshotsEqualCoversModel fails when a model type
// gains a field this does not compare.
func snapshotsEqual(a, b *model.Snapshot) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.Services, b.Services, func(x, y *model.Service) bool { return x == y || model.ServiceEqual(x, y) }) &&
		slices.EqualFunc(a.Slices, b.Slices, func(x, y *model.EndpointSlice) bool { return x == y || model.EndpointSliceEqual(x, y) }) &&
		model.NodeEqual(a.Node, b.Node) &&
		same(a.Problems, b.Problems) &&
		slices.EqualFunc(a.ChangeTriggers, b.ChangeTriggers, func(x, y model.ChangeTrigger) bool { return x.Family == y.Family && x.Time.Equal(y.Time) })
}

// same compares two slices of comparable values, in O(1) when they share
// their backing array.
func same[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b)
}
