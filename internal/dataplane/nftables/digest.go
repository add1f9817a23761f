package nftables

// The element digest: each family's table keeps, in the one-element set
// digestSet, a 128-bit digest of every element of its static maps and
// sets, updated in the same transaction as the elements. A restarted
// proxier compares it with the digest of what it wants and, when they
// agree, adopts the maps without dumping them: a netlink dump of a large
// map is quadratic in its size (the kernel resumes it by skipping what
// it sent), 5.8 s for 1.1 million elements at 50,000 Services.

import (
	"net/netip"

	"sigs.k8s.io/knftables"
)

// digestSet is the set holding a table's element digest, written as an
// IPv6 address.
const digestSet = "element-digest"

// digestLayout is digestSet's element layout.
var digestLayout = elemLayout{key: []field{fieldAddr6}}

// layoutOf returns the element layout of a static map or set, or of
// digestSet.
func layoutOf(f knftables.Family, set string) (elemLayout, bool) {
	if set == digestSet {
		return digestLayout, true
	}
	l, ok := layouts[f][set]
	return l, ok
}

// digest is the XOR of elemHash over a table's static elements: an
// element added or removed changes it by its own hash, so a partial sync
// updates it from its operations alone.
type digest [16]byte

func (d *digest) add(set, key, value string) {
	h := elemHash(set, key, value)
	for i := range d {
		d[i] ^= h[i]
	}
}

// key is d as digestSet's element.
func (d digest) key() string { return netip.AddrFrom16(d).String() }

// elemHash is a 128-bit hash of one element: two 64-bit FNV-1a hashes
// with different offset bases over set, key and value, NUL-separated. It
// is stable across processes and releases (it is kept in the kernel).
func elemHash(set, key, value string) digest {
	const prime = 1099511628211
	a, b := uint64(14695981039346656037), uint64(0x6c62272e07bb0142)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			a = (a ^ uint64(s[i])) * prime
			b = (b ^ uint64(s[i])) * prime
		}
		a *= prime // the separator (a NUL byte: XOR with 0)
		b *= prime
	}
	mix(set)
	mix(key)
	mix(value)
	var d digest
	for i := range 8 {
		d[i] = byte(a >> (8 * i))
		d[8+i] = byte(b >> (8 * i))
	}
	return d
}

// digestOps appends to ops the replacement of family f's digest old
// (absent when !hadOld) by new.
func digestOps(ops []ElementOp, f knftables.Family, old digest, hadOld bool, new digest) []ElementOp {
	if hadOld && old == new {
		return ops
	}
	if hadOld {
		ops = append(ops, ElementOp{Delete: true, Family: f, Set: digestSet, Key: old.key()})
	}
	return append(ops, ElementOp{Family: f, Set: digestSet, Key: new.key()})
}

// afterOps is d changed by the operations in ops on family f's static
// elements.
func afterOps(d digest, f knftables.Family, ops []ElementOp) digest {
	for _, op := range ops {
		if op.Family == f && op.Set != digestSet {
			d.add(op.Set, op.Key, op.Value)
		}
	}
	return d
}

// digestsOf is the digest of each family's ruleset.
func digestsOf(rs map[knftables.Family]*ruleset) map[knftables.Family]digest {
	out := map[knftables.Family]digest{}
	for f, r := range rs {
		out[f] = r.sum
	}
	return out
}
