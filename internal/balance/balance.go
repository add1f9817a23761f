// Package balance computes the slot tables behind vipproxy's per-Service
// balancing algorithms (model.Balance): a table maps slot numbers to
// endpoint indices, and a dataplane picks a slot per new connection (at
// random, in turn, or by a hash of the client's address) and sends the
// connection to the slot's endpoint.
//
// Weighted tables give endpoint i weights[i] slots, interleaved so that
// taking slots in turn is a smooth weighted round robin. Maglev tables
// (Eisenbud et al., NSDI 2016) give each endpoint a share of a prime-sized
// table proportional to its weight, such that removing one of N
// endpoints reassigns its slots and only a few others: a client hashed to
// a slot keeps its endpoint unless that endpoint went away.
//
// The package is pure: no I/O, no clocks, no randomness.
package balance

import "hash/fnv"

// MaxSlots bounds a Weighted table: weights whose sum exceeds it are
// scaled down (each endpoint keeps at least one slot).
const MaxSlots = 4096

// Weighted returns the slot table for endpoints with the given weights
// (each at least 1): endpoint i holds weights[i] slots (after dividing
// every weight by their greatest common divisor, and scaling down to
// MaxSlots), and slots taken in order form a smooth weighted round robin
// (nginx's: the heaviest endpoint never runs more than its share ahead).
// It returns nil when every weight is equal: the table is then the
// identity over len(weights) slots, which callers use without building it.
func Weighted(weights []int) []int {
	if len(weights) == 0 {
		return nil
	}
	equal := true
	for _, w := range weights[1:] {
		equal = equal && w == weights[0]
	}
	if equal {
		return nil
	}
	ws := reduce(weights)
	total := 0
	for _, w := range ws {
		total += w
	}
	cur := make([]int, len(ws))
	out := make([]int, 0, total)
	for range total {
		best := 0
		for i, w := range ws {
			cur[i] += w
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		out = append(out, best)
	}
	return out
}

// reduce divides weights by their gcd and scales them to at most MaxSlots
// in total; weights below 1 count as 1.
func reduce(weights []int) []int {
	ws := make([]int, len(weights))
	g, total := 0, 0
	for i, w := range weights {
		ws[i] = max(w, 1)
		g = gcd(g, ws[i])
		total += ws[i]
	}
	total /= g
	for i := range ws {
		ws[i] /= g
		if total > MaxSlots {
			ws[i] = max(1, ws[i]*MaxSlots/total)
		}
	}
	return ws
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// maglevSizes are the Maglev table sizes: primes, so that every skip
// generates a full permutation.
var maglevSizes = []int{251, 1021, 4093, 16381, 65521}

// MaglevSize returns the Maglev table size for n endpoints: the smallest
// of 251, 1021, 4093, 16381 and 65521 that is at least 100·n (65521 beyond
// 655 endpoints). At 100 slots per endpoint or more the shares differ by a
// few percent and removing one endpoint moves under 5% of the other
// endpoints' slots (TestMaglevDisruption); at 20 it moved up to 7%.
func MaglevSize(n int) int {
	for _, m := range maglevSizes {
		if m >= 100*n {
			return m
		}
	}
	return maglevSizes[len(maglevSizes)-1]
}

// Maglev returns the Maglev lookup table of size m (a prime, see
// MaglevSize) for endpoints identified by keys (stable names such as
// "10.0.0.1:80": an endpoint's preferred slots depend only on its key) with
// the given weights (each at least 1; an endpoint fills weights[i] slots
// per round). Every slot holds an endpoint index; nil when keys is empty.
func Maglev(keys []string, weights []int, m int) []int {
	n := len(keys)
	if n == 0 || m <= 0 {
		return nil
	}
	offset, skip, next := make([]int, n), make([]int, n), make([]int, n)
	for i, k := range keys {
		offset[i] = int(hash(k, 0x9e3779b97f4a7c15) % uint64(m))
		if m > 1 {
			skip[i] = int(hash(k, 0xc2b2ae3d27d4eb4f)%uint64(m-1)) + 1
		}
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			w := 1
			if i < len(weights) {
				w = max(weights[i], 1)
			}
			for ; w > 0 && filled < m; w-- {
				for {
					c := (offset[i] + next[i]*skip[i]) % m
					next[i]++
					if table[c] < 0 {
						table[c] = i
						filled++
						break
					}
				}
			}
		}
	}
	return table
}

// hash is 64-bit FNV-1a of seed's bytes, then s.
func hash(s string, seed uint64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(seed >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(s))
	return h.Sum64()
}
