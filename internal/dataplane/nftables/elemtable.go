package nftables

import (
	"hash/maphash"
	"iter"
	"math/bits"
)

// elemTable holds the elements of one map or set of a ruleset by key. It
// is a hash table with open addressing (linear probing, one tag byte per
// slot, deletion by backward shift) whose size is not a power of two, so
// that it can be filled to 85 % before it grows and be made exactly as
// large as a known number of elements needs. A slot is the elem alone:
// its key is read from the fragment the elem points into (elem.key), so
// a slot costs 17 bytes, 21 an element when the table is sized for its
// content and at most 29 after it grew. A Go map of 32-byte entries
// (key and elem) rounds its tables up to powers of two and splits them
// at 7/8: 51–84 bytes an element (84 at 500,000, the size of a
// 50,000-Service endpoint map).
//
// A nil *elemTable is an empty table for reading. Every elem stored has
// its src set.
type elemTable struct {
	tags  []uint8 // 0: empty; else tagBit | 7 bits of the key's hash
	slots []elem
	n     int
}

const (
	tagBit = 0x80
	// The table grows when more than maxLoad of its slots would be
	// used, to growLoad; sized for a number of elements, to sizeLoad.
	maxLoad, growLoad, sizeLoad = 0.85, 0.6, 0.8
	minSlots                    = 8
)

// seed keys every table's hash (a table is never compared with another
// by layout, so one seed per process is enough).
var seed = maphash.MakeSeed()

// newElemTable returns a table with room for n elements.
func newElemTable(n int) *elemTable {
	t := &elemTable{}
	if n > 0 {
		t.resize(max(minSlots, int(float64(n)/sizeLoad)+1))
	}
	return t
}

// Len returns the number of elements.
func (t *elemTable) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// home returns the slot where a key of hash h is looked for first, and
// its tag.
func (t *elemTable) home(h uint64) (int, uint8) {
	i, _ := bits.Mul64(h, uint64(len(t.slots)))
	return int(i), tagBit | uint8(h)
}

// probe returns the slot of key and true, or the empty slot that ends
// its run (where it would go) and false; and key's tag. t has a slot.
func (t *elemTable) probe(key string) (int, uint8, bool) {
	i, tag := t.home(maphash.String(seed, key))
	for {
		switch t.tags[i] {
		case 0:
			return i, tag, false
		case tag:
			if t.slots[i].key() == key {
				return i, tag, true
			}
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// find returns the slot of key, or -1.
func (t *elemTable) find(key string) int {
	if t == nil || t.n == 0 {
		return -1
	}
	if i, _, ok := t.probe(key); ok {
		return i
	}
	return -1
}

// Get returns key's element and whether there is one.
func (t *elemTable) Get(key string) (elem, bool) {
	if i := t.find(key); i >= 0 {
		return t.slots[i], true
	}
	return elem{}, false
}

// Set makes e the element of its key (e.key()): one probe, whether the
// key is there or not.
func (t *elemTable) Set(e elem) {
	if len(t.slots) == 0 {
		t.resize(minSlots)
	}
	key := e.key()
	i, tag, ok := t.probe(key)
	if ok {
		t.slots[i] = e
		return
	}
	if float64(t.n+1) > maxLoad*float64(len(t.slots)) {
		t.resize(max(minSlots, int(float64(t.n+1)/growLoad)+1))
		i, tag, _ = t.probe(key)
	}
	t.tags[i], t.slots[i] = tag, e
	t.n++
}

// resize moves the elements into a table of n slots.
func (t *elemTable) resize(n int) {
	tags, slots := t.tags, t.slots
	t.tags, t.slots = make([]uint8, n), make([]elem, n)
	for i, tag := range tags {
		if tag != 0 {
			j, tag, _ := t.probe(slots[i].key())
			t.tags[j], t.slots[j] = tag, slots[i]
		}
	}
}

// Delete removes key's element, if any. The elements after it in its
// run of used slots move back where their lookups still find them, so
// no slot is ever marked deleted.
func (t *elemTable) Delete(key string) {
	i := t.find(key)
	if i < 0 {
		return
	}
	t.n--
	for j := i; ; {
		if j++; j == len(t.slots) {
			j = 0
		}
		if t.tags[j] == 0 {
			break
		}
		// The element at j may fill the hole at i unless its home lies
		// cyclically in (i, j]: then a lookup would not pass i.
		k, _ := t.home(maphash.String(seed, t.slots[j].key()))
		if (i < j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			t.tags[i], t.slots[i] = t.tags[j], t.slots[j]
			i = j
		}
	}
	t.tags[i], t.slots[i] = 0, elem{}
}

// All yields every element, in no particular order. t must not change
// while it runs.
func (t *elemTable) All() iter.Seq2[string, elem] {
	return func(yield func(string, elem) bool) {
		if t == nil {
			return
		}
		for i, tag := range t.tags {
			if tag != 0 && !yield(t.slots[i].key(), t.slots[i]) {
				return
			}
		}
	}
}
