package allocator

import (
	"errors"
	"fmt"
)

// Errors returned by the range allocators (and wrapped by Assigner).
var (
	// ErrAllocated means the value is already taken.
	ErrAllocated = errors.New("already allocated")
	// ErrFull means no value is left in the range.
	ErrFull = errors.New("range is full")
)

// ErrNotInRange means a value lies outside the allocatable range: outside
// the CIDR or port range, or one of the reserved addresses (the network
// address, the IPv4 broadcast address, or past the IPv6 cap).
// Test for it with errors.As.
type ErrNotInRange struct {
	// Value is the refused IP or port, as text.
	Value string
	// Range is the CIDR or port range ("30000-32767").
	Range string
}

func (e *ErrNotInRange) Error() string {
	return fmt.Sprintf("%s is not in the allocatable range %s", e.Value, e.Range)
}
