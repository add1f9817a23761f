package conntrack

import "github.com/vipproxy/vipproxy/internal/model"

// Table is the conntrack table of one network namespace.
type Table interface {
	// List returns every entry of the family (model.IPv4 or model.IPv6),
	// whatever its protocol. An error means the list is unusable.
	List(family model.AddressType) ([]Flow, error)
	// Delete removes the given entries, matching each on all of its
	// fields, and returns how many it removed. Entries that are already
	// gone are not errors (and may or may not be counted). On error some
	// entries may have been removed; the count says how many.
	Delete(flows []Flow) (int, error)
}
