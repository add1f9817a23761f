package allocator

import (
	"math/bits"
	"math/rand/v2"
)

// bitmap tracks which of size offsets are taken. Offsets [0, static) form
// the static band, [static, size) the dynamic band.
type bitmap struct {
	size   int
	static int
	words  []uint64
	count  int
	rand   *rand.Rand
}

func newBitmap(size, static int, r *rand.Rand) bitmap {
	if size < 0 {
		size = 0
	}
	static = min(max(static, 0), size)
	if r == nil {
		r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return bitmap{size: size, static: static, words: make([]uint64, (size+63)/64), rand: r}
}

func (b *bitmap) has(i int) bool {
	return i >= 0 && i < b.size && b.words[i/64]&(1<<(uint(i)%64)) != 0
}

// set marks i taken; it reports false when i was already taken.
func (b *bitmap) set(i int) bool {
	if b.has(i) {
		return false
	}
	b.words[i/64] |= 1 << (uint(i) % 64)
	b.count++
	return true
}

func (b *bitmap) clear(i int) {
	if b.has(i) {
		b.words[i/64] &^= 1 << (uint(i) % 64)
		b.count--
	}
}

// reset frees every offset.
func (b *bitmap) reset() {
	clear(b.words)
	b.count = 0
}

// next takes a free offset: a random start in the dynamic band scanning
// forward (wrapping inside the band), then the same in the static band.
func (b *bitmap) next() (int, bool) {
	if b.count >= b.size {
		return 0, false
	}
	if dyn := b.size - b.static; dyn > 0 {
		if i, ok := b.scan(b.static, b.size, b.rand.IntN(dyn)); ok {
			return i, true
		}
	}
	if b.static > 0 {
		if i, ok := b.scan(0, b.static, b.rand.IntN(b.static)); ok {
			return i, true
		}
	}
	return 0, false
}

// scan looks for a free offset in [lo, hi) starting at lo+start and
// wrapping to lo; it takes and returns it.
func (b *bitmap) scan(lo, hi, start int) (int, bool) {
	n := hi - lo
	for i := 0; i < n; {
		at := lo + (start+i)%n
		w := b.words[at/64] >> (uint(at) % 64)
		// Bits of this word from at up to the word end or hi, whichever is first.
		span := min(64-at%64, hi-at)
		if span < 64 {
			w &= 1<<uint(span) - 1
		}
		full := uint64(1)<<uint(span) - 1
		if span == 64 {
			full = ^uint64(0)
		}
		if w == full {
			i += span
			continue
		}
		at += bits.TrailingZeros64(^w)
		b.set(at)
		return at, true
	}
	return 0, false
}
