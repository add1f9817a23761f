package nftables

// The element digest: each family's table keeps, in the one-element set
// digestSet, a 128-bit digest of every element of its static maps and
// sets (in wire form), updated in the same transaction as the elements.
// A restarted proxier compares it with the digest of what it wants and,
// when they agree, adopts the maps without dumping them: a netlink dump
// of a large map is quadratic in its size (the kernel resumes it by
// skipping what it sent), 5.8 s for 1.1 million elements at 50,000
// Services.

import (
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"sync"

	"sigs.k8s.io/knftables"
)

// digestSet is the set holding a table's element digest, written as an
// IPv6 address.
const digestSet = "element-digest"

// rulesDigestSet holds the table's rules digest (see rulesDigest), as
// digestSet its element digest.
const rulesDigestSet = "rules-digest"

// isDigestSet reports whether a set holds a digest.
func isDigestSet(name string) bool { return name == digestSet || name == rulesDigestSet }

// digestLayout is digestSet's element layout.
var digestLayout = elemLayout{key: []field{fieldAddr6}}

// layoutOf returns the element layout of a static map or set, or of
// digestSet.
func layoutOf(f knftables.Family, set string) (elemLayout, bool) {
	if isDigestSet(set) {
		return digestLayout, true
	}
	l, ok := layouts[f][set]
	return l, ok
}

// digest is the XOR of elemHash over a table's static elements: an
// element added or removed changes it by its own hash, so a partial sync
// updates it from its operations alone.
type digest [16]byte

func (d *digest) add(set, key, value string) { d.xor(elemHash(set, key, value)) }

// key is d as digestSet's element.
func (d digest) key() string { return netip.AddrFrom16(d).String() }

// elemHash is a 128-bit hash of one element: two 64-bit FNV-1a hashes
// with different offset bases over set, key and value, NUL-separated. It
// is stable across processes and releases (it is kept in the kernel).
func elemHash(set, key, value string) digest {
	h := newFNV128()
	h.mix(set)
	h.mix(key)
	h.mix(value)
	return h.sum()
}

// fnv128 is two 64-bit FNV-1a hashes with different offset bases, of
// strings each followed by a NUL byte.
type fnv128 struct{ a, b uint64 }

const fnvPrime = 1099511628211

func newFNV128() fnv128 { return fnv128{14695981039346656037, 0x6c62272e07bb0142} }

func (h *fnv128) mix(s string) { mixInto(h, s) }

// mixInto mixes s, then a NUL byte, into h.
func mixInto[T string | []byte](h *fnv128, s T) {
	a, b := h.a, h.b
	for i := 0; i < len(s); i++ {
		a = (a ^ uint64(s[i])) * fnvPrime
		b = (b ^ uint64(s[i])) * fnvPrime
	}
	h.a, h.b = a*fnvPrime, b*fnvPrime // the separator (a NUL byte: XOR with 0)
}

func (h *fnv128) sum() digest {
	var d digest
	for i := range 8 {
		d[i] = byte(h.a >> (8 * i))
		d[8+i] = byte(h.b >> (8 * i))
	}
	return d
}

func (d *digest) xor(o digest) {
	for i := range d {
		d[i] ^= o[i]
	}
}

// The rules digest: each family's table also keeps, in rulesDigestSet,
// a digest of everything but the elements of its static maps and sets:
// the definitions of its containers and base chains, the base chains'
// rules (schemaHash), and every other chain with its rules and every
// ClientIP-affinity set by name (which holds its timeout). It is the XOR
// of one hash per chain and per set, so a partial sync updates it from
// the chains and sets it changed (rulesAfter). A restarted proxier whose
// tables hold the rules digest and element digest it wants, and exactly
// the chains and sets it wants, has nothing to write (adoptUnchanged):
// the transaction that flushes and refills the chains made the kernel
// check every verdict map's jumps again, 0.14 s at 50,000 Services. Chains
// and sets left for deletion by the next sync are not in the digest; a
// table that has some fails the name check instead. Like the element
// digest it trusts that nobody else edits the rules: the hourly full sync
// rewrites them.

// chainHash is the hash of chain name with rules.
func chainHash(name string, rules []string) digest {
	h := newFNV128()
	h.mix("chain")
	h.mix(name)
	for _, r := range rules {
		h.mix(r)
	}
	return h.sum()
}

// affinityHash is the hash of affinity set name.
func affinityHash(name string) digest {
	h := newFNV128()
	h.mix("set")
	h.mix(name)
	return h.sum()
}

// rulesDigest is the rules digest of a table holding rs, whose schema
// hash is schema.
func rulesDigest(schema digest, rs *ruleset) digest {
	d := schema
	for name, rules := range rs.chains {
		d.xor(chainHash(name, rules))
	}
	for name := range rs.affinity {
		d.xor(affinityHash(name))
	}
	return d
}

// rulesDigestsOf is the rules digest of each family's ruleset.
func (p *Proxier) rulesDigestsOf(rs map[knftables.Family]*ruleset) map[knftables.Family]digest {
	out := map[knftables.Family]digest{}
	for f, r := range rs {
		out[f] = rulesDigest(p.schemas[f], r)
	}
	return out
}

// schemaHash is the hash of what every table of family f holds whatever
// the Services: its containers' definitions and its base chains with
// their rules, as nft text.
func (p *Proxier) schemaHash(f knftables.Family) digest {
	tx := p.tr.NewTransaction()
	p.writeContainers(tx, f, false)
	writeBaseChains(tx, f)
	writeBaseRules(tx, f)
	h := newFNV128()
	h.mix("schema")
	h.mix(tx.String())
	return h.sum()
}

// rulesAfter is rules digest d after the changes t recorded, rs being
// the updated ruleset.
func rulesAfter(d digest, rs *ruleset, t *tracker) digest {
	for name, prev := range t.chains {
		rules, now := rs.chains[name]
		if prev.existed && now && equalRules(prev.rules, rules) {
			continue
		}
		if prev.existed {
			d.xor(chainHash(name, prev.rules))
		}
		if now {
			d.xor(chainHash(name, rules))
		}
	}
	for name, existed := range t.affinity {
		if _, now := rs.affinity[name]; now != existed {
			d.xor(affinityHash(name))
		}
	}
	return d
}

// digestOps appends to ops the replacement of family f's digest old
// (absent when !hadOld) by new, in set (digestSet or rulesDigestSet).
func digestOps(ops []ElementOp, f knftables.Family, set string, old digest, hadOld bool, new digest) []ElementOp {
	if hadOld && old == new {
		return ops
	}
	if hadOld {
		ops = append(ops, ElementOp{Delete: true, Family: f, Set: set, Key: old.key()})
	}
	return append(ops, ElementOp{Family: f, Set: set, Key: new.key()})
}

// afterOps is d changed by the operations in ops on family f's static
// elements.
func afterOps(d digest, f knftables.Family, ops []ElementOp) digest {
	for _, op := range ops {
		if op.Family == f && !isDigestSet(op.Set) {
			d.add(op.Set, op.Key, op.Value)
		}
	}
	return d
}

// legacyDigest is the element digest of rs as releases before wire
// form kept it: the same XOR, of the hashes of the elements' nft text
// (elemHash). A restart over such a table computes it once. It walks the
// ports' fragments, whose elements lie together in memory, hashing each
// element the table holds as that very one (a set key once, from the
// first port sharing it; a map key from its owner), rendered into a
// buffer, the ports split among the CPUs. A walk over the tables' slots
// instead visits a fragment per element: at 50,000 Services it added
// 0.39 s to a restart, this walk 0.1–0.2 s (BenchmarkKernelRestart,
// "legacy" against "digest").
func legacyDigest(f knftables.Family, rs *ruleset) digest {
	ports := slices.Collect(maps.Values(rs.ports))
	n := runtime.GOMAXPROCS(0)
	parts := make([]digest, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			var m *elemTable // the table and layout of the run of elements i is in
			var l elemLayout
			set := -1
			for _, pe := range ports[w*len(ports)/n : (w+1)*len(ports)/n] {
				fr := pe.fr
				for i := range fr.elems {
					fe := &fr.elems[i]
					name, key := fe.name(), fr.key(i)
					if int(fe.set) != set {
						m, l, set = rs.elems[name], layouts[f][name], int(fe.set)
					}
					if e, ok := m.Get(key); !ok || e.src != pe || int(e.i) != i {
						continue
					}
					h := newFNV128()
					h.mix(name)
					buf, _ = appendText(buf[:0], l.key, key)
					mixInto(&h, buf)
					buf = buf[:0]
					if len(l.val) > 0 {
						buf, _ = appendText(buf, l.val, fr.value(i))
					} else {
						buf = append(buf, fr.value(i)...)
					}
					mixInto(&h, buf)
					parts[w].xor(h.sum())
				}
			}
		}()
	}
	wg.Wait()
	var d digest
	for _, p := range parts {
		d.xor(p)
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
