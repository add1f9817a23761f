package allocator

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// maxIPv6Range caps the bitmap of an IPv6 range, as upstream does: a /64
// service CIDR hands out its first 65535 addresses only.
const maxIPv6Range = 65536

// maxIPv4HostBits refuses IPv4 service CIDRs larger than a /12, as
// kube-apiserver does (the bitmap of a /12 is 128 KiB).
const maxIPv4HostBits = 20

// RangeOptions tunes IPRange and PortRange.
type RangeOptions struct {
	// StaticSubrange splits the range into a static (lower) and a dynamic
	// (upper) band (the ServiceIPStaticSubrange / ServiceNodePortStaticSubrange
	// feature gates, on by default upstream). False: one shared pool.
	StaticSubrange bool
	// Rand picks AllocateNext's random start; nil uses a randomly seeded
	// source. Tests pass a seeded one.
	Rand *rand.Rand
}

// IPRange allocates addresses of one service CIDR. The network address
// (for IPv6 the subnet-router anycast address) and the IPv4 broadcast
// address are never handed out; IPv6 ranges are capped at 65535 usable
// addresses from the start of the prefix. IPRange is not safe for
// concurrent use.
type IPRange struct {
	prefix netip.Prefix
	base   u128 // first allocatable address (network + 1)
	bm     bitmap
}

// NewIPRange returns an empty allocator over p (masked to its network).
// It fails when p is invalid, larger than an IPv4 /12, or leaves no
// allocatable address (an IPv4 /31 or /32, an IPv6 /128).
func NewIPRange(p netip.Prefix, opts RangeOptions) (*IPRange, error) {
	if !p.IsValid() {
		return nil, fmt.Errorf("allocator: invalid CIDR %v", p)
	}
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	if p.Addr().Is4() && hostBits > maxIPv4HostBits {
		return nil, fmt.Errorf("allocator: service CIDR %v is too large; for 32-bit addresses, the mask must be >= %d", p, 32-maxIPv4HostBits)
	}
	size := prefixSize(hostBits)
	usable := size
	if p.Addr().Is6() {
		usable = min(usable, maxIPv6Range)
	} else {
		usable-- // broadcast
	}
	usable-- // network / subnet-router anycast
	if usable == 0 || usable > size {
		return nil, fmt.Errorf("allocator: CIDR %v has no allocatable address", p)
	}
	static := 0
	if opts.StaticSubrange {
		static = StaticBandSize(size)
	}
	return &IPRange{
		prefix: p,
		base:   u128From(p.Addr()).add(1),
		bm:     newBitmap(int(usable), static, opts.Rand),
	}, nil
}

// Prefix returns the range's CIDR.
func (r *IPRange) Prefix() netip.Prefix { return r.prefix }

// Size returns how many addresses the range can hand out.
func (r *IPRange) Size() int { return r.bm.size }

// StaticSize returns the size of the static band (0 when the gate is off
// or the range is too small).
func (r *IPRange) StaticSize() int { return r.bm.static }

// Used returns how many addresses are allocated.
func (r *IPRange) Used() int { return r.bm.count }

// Free returns how many addresses are left.
func (r *IPRange) Free() int { return r.bm.size - r.bm.count }

// Contains reports whether ip is an allocatable address of the range.
func (r *IPRange) Contains(ip netip.Addr) bool {
	_, ok := r.offset(ip)
	return ok
}

// InStaticBand reports whether ip is allocatable and in the static band.
func (r *IPRange) InStaticBand(ip netip.Addr) bool {
	i, ok := r.offset(ip)
	return ok && i < r.bm.static
}

func (r *IPRange) offset(ip netip.Addr) (int, bool) {
	if !r.prefix.Contains(ip) {
		return 0, false
	}
	v := u128From(ip)
	if v.less(r.base) {
		return 0, false
	}
	d := v.sub(r.base)
	if d.hi != 0 || d.lo >= uint64(r.bm.size) {
		return 0, false
	}
	return int(d.lo), true
}

func (r *IPRange) addr(i int) netip.Addr {
	return r.base.add(uint64(i)).addr(r.prefix.Addr().Is4())
}

// Allocate takes ip. It fails with *ErrNotInRange when ip is not
// allocatable here and with ErrAllocated when it is taken.
func (r *IPRange) Allocate(ip netip.Addr) error {
	i, ok := r.offset(ip)
	if !ok {
		return &ErrNotInRange{Value: ip.String(), Range: r.prefix.String()}
	}
	if !r.bm.set(i) {
		return ErrAllocated
	}
	return nil
}

// AllocateNext takes a free address, from the dynamic band first (random
// start, scanning up and wrapping within the band), then from the static
// band. It fails with ErrFull.
func (r *IPRange) AllocateNext() (netip.Addr, error) {
	i, ok := r.bm.next()
	if !ok {
		return netip.Addr{}, ErrFull
	}
	return r.addr(i), nil
}

// Release frees ip. Releasing a free or out-of-range address is a no-op.
func (r *IPRange) Release(ip netip.Addr) {
	if i, ok := r.offset(ip); ok {
		r.bm.clear(i)
	}
}

// Has reports whether ip is allocated.
func (r *IPRange) Has(ip netip.Addr) bool {
	i, ok := r.offset(ip)
	return ok && r.bm.has(i)
}

// Reset frees every address.
func (r *IPRange) Reset() { r.bm.reset() }

// u128 is an address as a 128-bit unsigned integer (IPv4 in the low 32 bits).
type u128 struct{ hi, lo uint64 }

func u128From(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var v u128
	for i := 0; i < 8; i++ {
		v.hi = v.hi<<8 | uint64(b[i])
		v.lo = v.lo<<8 | uint64(b[8+i])
	}
	return v
}

func (v u128) add(n uint64) u128 {
	lo := v.lo + n
	hi := v.hi
	if lo < v.lo {
		hi++
	}
	return u128{hi, lo}
}

func (v u128) sub(w u128) u128 {
	lo := v.lo - w.lo
	hi := v.hi - w.hi
	if v.lo < w.lo {
		hi--
	}
	return u128{hi, lo}
}

func (v u128) less(w u128) bool { return v.hi < w.hi || (v.hi == w.hi && v.lo < w.lo) }

func (v u128) addr(is4 bool) netip.Addr {
	if is4 {
		return netip.AddrFrom4([4]byte{byte(v.lo >> 24), byte(v.lo >> 16), byte(v.lo >> 8), byte(v.lo)})
	}
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[7-i] = byte(v.hi >> (8 * i))
		b[15-i] = byte(v.lo >> (8 * i))
	}
	return netip.AddrFrom16(b)
}
