package allocator

import (
	"fmt"
	"strconv"
)

// PortRange allocates ports of an inclusive NodePort range. It is not safe
// for concurrent use.
type PortRange struct {
	lo, hi uint16
	bm     bitmap
}

// NewPortRange returns an empty allocator over [lo, hi]. It fails when
// lo is 0 or lo > hi.
func NewPortRange(lo, hi uint16, opts RangeOptions) (*PortRange, error) {
	if lo == 0 || lo > hi {
		return nil, fmt.Errorf("allocator: invalid port range %d-%d", lo, hi)
	}
	size := int(hi) - int(lo) + 1
	static := 0
	if opts.StaticSubrange {
		static = NodePortStaticBandSize(size)
	}
	return &PortRange{lo: lo, hi: hi, bm: newBitmap(size, static, opts.Rand)}, nil
}

// String returns "lo-hi".
func (r *PortRange) String() string {
	return strconv.Itoa(int(r.lo)) + "-" + strconv.Itoa(int(r.hi))
}

// Bounds returns the first and last port of the range.
func (r *PortRange) Bounds() (lo, hi uint16) { return r.lo, r.hi }

// Size returns how many ports the range holds.
func (r *PortRange) Size() int { return r.bm.size }

// StaticSize returns the size of the static band.
func (r *PortRange) StaticSize() int { return r.bm.static }

// Used returns how many ports are allocated.
func (r *PortRange) Used() int { return r.bm.count }

// Free returns how many ports are left.
func (r *PortRange) Free() int { return r.bm.size - r.bm.count }

// Contains reports whether port is in the range.
func (r *PortRange) Contains(port uint16) bool { return port >= r.lo && port <= r.hi }

// InStaticBand reports whether port is in the static band.
func (r *PortRange) InStaticBand(port uint16) bool {
	return r.Contains(port) && int(port-r.lo) < r.bm.static
}

// Allocate takes port. It fails with *ErrNotInRange or ErrAllocated.
func (r *PortRange) Allocate(port uint16) error {
	if !r.Contains(port) {
		return &ErrNotInRange{Value: strconv.Itoa(int(port)), Range: r.String()}
	}
	if !r.bm.set(int(port - r.lo)) {
		return ErrAllocated
	}
	return nil
}

// AllocateNext takes a free port, dynamic band first (random start), then
// the static band. It fails with ErrFull.
func (r *PortRange) AllocateNext() (uint16, error) {
	i, ok := r.bm.next()
	if !ok {
		return 0, ErrFull
	}
	return r.lo + uint16(i), nil
}

// Release frees port; a free or out-of-range port is a no-op.
func (r *PortRange) Release(port uint16) {
	if r.Contains(port) {
		r.bm.clear(int(port - r.lo))
	}
}

// Has reports whether port is allocated.
func (r *PortRange) Has(port uint16) bool {
	return r.Contains(port) && r.bm.has(int(port-r.lo))
}

// Reset frees every port.
func (r *PortRange) Reset() { r.bm.reset() }
