package allocator

// StaticBandSize returns the size of the static (lower) band of a service
// CIDR holding size addresses (2^(bits-prefixlen), network and broadcast
// included; callers pass math.MaxUint64 for IPv6 ranges too large to
// count): min(max(16, size/16), 256), or 0 when size <= 16 (a /28 or
// smaller has no static band). This is upstream's ipallocator
// calculateRangeOffset.
//
// The static band is the first StaticBandSize allocatable offsets (from the
// address after the network address up); AllocateNext takes from the rest
// (the dynamic, upper band) first.
func StaticBandSize(size uint64) int {
	return bandSize(size, 16, 16, 256)
}

// NodePortStaticBandSize returns the size of the static (lower) band of a
// NodePort range of size ports: min(max(16, size/32), 128), or 0 when
// size <= 16. This is upstream's portallocator calculateRangeOffset (a
// smaller step and cap than the IP formula).
func NodePortStaticBandSize(size int) int {
	if size < 0 {
		return 0
	}
	return bandSize(uint64(size), 16, 32, 128)
}

// bandSize computes min(max(lo, size/step), hi), or 0 when size <= lo.
func bandSize(size uint64, lo, step, hi uint64) int {
	if size <= lo {
		return 0
	}
	return int(min(max(lo, size/step), hi))
}

// prefixSize returns 2^(bits-prefixlen), saturated at math.MaxUint64.
func prefixSize(hostBits int) uint64 {
	if hostBits >= 64 {
		return 1<<64 - 1
	}
	return uint64(1) << hostBits
}
