package l4proxy

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"

	"github.com/vipproxy/vipproxy/internal/balance"
)

// Candidate is one endpoint as a Scheduler sees it.
type Candidate struct {
	Addr netip.AddrPort
	// Weight is the endpoint's weight, at least 1.
	Weight int
	// Active is the number of live flows (open TCP connections, live UDP
	// sessions) this Proxy has to the endpoint right now, including ones
	// still dialing.
	Active int
	// Down is true when the endpoint already failed for the flow being
	// scheduled; a Scheduler must not return it.
	Down bool
}

// Scheduler chooses the endpoint for a new flow.
//
// Pick returns an index into cands, or -1 when every candidate is Down (or
// cands is empty). src is the client's address and dst the address the
// client connected to. A Proxy calls Pick with its lock held, so a
// Scheduler needs no locking of its own, but one Scheduler value must not be
// shared by several Proxies. Pick must not keep cands.
type Scheduler interface {
	Pick(cands []Candidate, src, dst netip.AddrPort) int
}

// SchedulerNames lists the names NewScheduler accepts.
var SchedulerNames = []string{"rr", "lc", "dh", "sh", "sed", "nq", "random"}

// NewScheduler returns a new Scheduler by its IPVS name: rr (round robin,
// also for ""), lc (least connection), dh (destination hashing), sh (source
// hashing), sed (shortest expected delay), nq (never queue) or random. An
// unknown name is an error naming it.
func NewScheduler(name string) (Scheduler, error) {
	switch name {
	case "", "rr":
		return &RoundRobin{}, nil
	case "lc":
		return LeastConn{}, nil
	case "dh":
		return DestHash{}, nil
	case "sh":
		return SourceHash{}, nil
	case "sed":
		return ShortestExpectedDelay{}, nil
	case "nq":
		return NeverQueue{}, nil
	case "random":
		return &Random{}, nil
	}
	return nil, fmt.Errorf("l4proxy: unknown scheduler %q (want one of %v)", name, SchedulerNames)
}

// RoundRobin hands flows to the candidates in turn, skipping Down ones, as
// IPVS rr does. The zero value starts at the first candidate.
type RoundRobin struct {
	next int
}

// Pick implements Scheduler.
func (r *RoundRobin) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	n := len(cands)
	for i := 0; i < n; i++ {
		j := (r.next + i) % n
		if !cands[j].Down {
			r.next = j + 1
			return j
		}
	}
	return -1
}

// LeastConn picks the candidate with the fewest live flows, ignoring
// weights, as IPVS lc does; ties go to the earliest candidate.
type LeastConn struct{}

// Pick implements Scheduler.
func (LeastConn) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	best := -1
	for i, c := range cands {
		if c.Down {
			continue
		}
		if best < 0 || c.Active < cands[best].Active {
			best = i
		}
	}
	return best
}

// ShortestExpectedDelay picks the candidate with the smallest
// (Active+1)/Weight, as IPVS sed does; ties go to the earliest candidate.
type ShortestExpectedDelay struct{}

// Pick implements Scheduler.
func (ShortestExpectedDelay) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	return sed(cands, false)
}

// NeverQueue picks the first idle candidate (no live flows) if there is
// one, and otherwise behaves as ShortestExpectedDelay, as IPVS nq does.
type NeverQueue struct{}

// Pick implements Scheduler.
func (NeverQueue) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	return sed(cands, true)
}

func sed(cands []Candidate, idleFirst bool) int {
	best := -1
	for i, c := range cands {
		if c.Down {
			continue
		}
		if idleFirst && c.Active == 0 {
			return i
		}
		// (c.Active+1)/c.Weight < (b.Active+1)/b.Weight, cross-multiplied.
		if best < 0 || int64(cands[best].Active+1)*int64(c.Weight) > int64(c.Active+1)*int64(cands[best].Weight) {
			best = i
		}
	}
	return best
}

// hashTabSize is the size of IPVS's dh and sh bucket tables (2^8).
const hashTabBits = 8

// ipvsHash is IPVS's multiplicative hash of a folded address (plus offset
// and port for sh) into a bucket of the 256-entry table.
func ipvsHash(a netip.Addr, port uint16, offset uint32) uint32 {
	var fold uint32
	if a.Is4() || a.Is4In6() {
		b := a.Unmap().As4()
		fold = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	} else {
		b := a.As16()
		for i := 0; i < 16; i += 4 {
			fold ^= uint32(b[i])<<24 | uint32(b[i+1])<<16 | uint32(b[i+2])<<8 | uint32(b[i+3])
		}
	}
	return ((offset + uint32(port) + fold) * 2654435761) >> (32 - hashTabBits) & (1<<hashTabBits - 1)
}

// DestHash picks by a hash of the address the client connected to, as IPVS
// dh does: the 256 buckets are dealt to the candidates in order (weights
// ignored). When the hashed candidate is Down, the next one in order that
// is not Down is used, so a retry still finds an endpoint.
type DestHash struct{}

// Pick implements Scheduler.
func (DestHash) Pick(cands []Candidate, _, dst netip.AddrPort) int {
	if len(cands) == 0 {
		return -1
	}
	i := int(ipvsHash(dst.Addr(), 0, 0)) % len(cands)
	return nextUp(cands, i)
}

// SourceHash picks by a hash of the client's address, as IPVS sh does: the
// 256 buckets are dealt to the candidates in order, each taking Weight
// consecutive buckets. When the hashed candidate is Down it rehashes with
// increasing offsets as IPVS's sh-fallback does, then takes the next
// candidate in order that is not Down. Port, when true, mixes the client
// port into the hash (IPVS sh-port).
type SourceHash struct {
	Port bool
}

// Pick implements Scheduler.
func (s SourceHash) Pick(cands []Candidate, src, _ netip.AddrPort) int {
	if len(cands) == 0 {
		return -1
	}
	total := 0
	for _, c := range cands {
		total += c.Weight
	}
	bucketOwner := func(b uint32) int {
		// The bucket table repeats the weighted sequence of candidates.
		k := int(b) % total
		for i, c := range cands {
			if k < c.Weight {
				return i
			}
			k -= c.Weight
		}
		return len(cands) - 1
	}
	var port uint16
	if s.Port {
		port = src.Port()
	}
	first := bucketOwner(ipvsHash(src.Addr(), port, 0))
	if !cands[first].Down {
		return first
	}
	for off := uint32(1); off < uint32(len(cands)); off++ {
		if i := bucketOwner(ipvsHash(src.Addr(), port, off)); !cands[i].Down {
			return i
		}
	}
	return nextUp(cands, first)
}

func nextUp(cands []Candidate, from int) int {
	for k := 0; k < len(cands); k++ {
		if i := (from + k) % len(cands); !cands[i].Down {
			return i
		}
	}
	return -1
}

// Random picks among the candidates that are not Down at random, in
// proportion to their weights (uniformly when the weights are equal). Rand,
// when set, is the source of randomness (for tests); nil means the
// math/rand/v2 global source.
type Random struct {
	Rand *rand.Rand
}

// Pick implements Scheduler.
func (r *Random) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	total := 0
	for _, c := range cands {
		if !c.Down {
			total += max(c.Weight, 1)
		}
	}
	if total == 0 {
		return -1
	}
	var k int
	if r.Rand != nil {
		k = r.Rand.IntN(total)
	} else {
		k = rand.IntN(total)
	}
	for i, c := range cands {
		if c.Down {
			continue
		}
		if k < max(c.Weight, 1) {
			return i
		}
		k -= max(c.Weight, 1)
	}
	return -1
}

// WeightedRoundRobin hands flows to the candidates in turn, each as often
// as its weight in a round, interleaved (nginx's smooth weighted round
// robin: with weights 2 and 1 the order is a, b, a). With equal weights it
// is plain round robin in candidate order. Down candidates are skipped.
// The zero value is ready to use.
type WeightedRoundRobin struct {
	cur map[netip.AddrPort]int
}

// Pick implements Scheduler.
func (r *WeightedRoundRobin) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	if r.cur == nil || len(r.cur) > 2*len(cands)+8 {
		// Forget endpoints long gone (and start afresh the first time).
		old := r.cur
		r.cur = make(map[netip.AddrPort]int, len(cands))
		for _, c := range cands {
			r.cur[c.Addr] = old[c.Addr]
		}
	}
	best, total := -1, 0
	for i, c := range cands {
		if c.Down {
			continue
		}
		w := max(c.Weight, 1)
		total += w
		r.cur[c.Addr] += w
		if best < 0 || r.cur[c.Addr] > r.cur[cands[best].Addr] {
			best = i
		}
	}
	if best >= 0 {
		r.cur[cands[best].Addr] -= total
	}
	return best
}

// ConsistentHash picks by a hash of the client's address over a Maglev
// table of the candidates (balance.Maglev, keyed by endpoint address, in
// proportion to their weights): a client keeps its endpoint while that
// endpoint exists, and removing one of N endpoints moves about 1/N of the
// clients. When the hashed candidate is Down, the next slots of the table
// are tried in order. The zero value is ready to use; the table is rebuilt
// when the candidates or their weights change.
type ConsistentHash struct {
	addrs   []netip.AddrPort
	weights []int
	table   []int
}

// Pick implements Scheduler.
func (h *ConsistentHash) Pick(cands []Candidate, src, _ netip.AddrPort) int {
	if len(cands) == 0 {
		return -1
	}
	if !h.same(cands) {
		h.addrs, h.weights = make([]netip.AddrPort, len(cands)), make([]int, len(cands))
		keys := make([]string, len(cands))
		for i, c := range cands {
			h.addrs[i], h.weights[i], keys[i] = c.Addr, max(c.Weight, 1), c.Addr.String()
		}
		h.table = balance.Maglev(keys, h.weights, balance.MaglevSize(len(cands)))
	}
	a := src.Addr().Unmap().As16()
	f := fnv.New32a()
	f.Write(a[:])
	slot := int(f.Sum32() % uint32(len(h.table)))
	for k := 0; k < len(h.table); k++ {
		if i := h.table[(slot+k)%len(h.table)]; !cands[i].Down {
			return i
		}
	}
	return -1
}

// same reports whether the table was built for cands' addresses and
// weights.
func (h *ConsistentHash) same(cands []Candidate) bool {
	if h.table == nil || len(cands) != len(h.addrs) {
		return false
	}
	for i, c := range cands {
		if c.Addr != h.addrs[i] || max(c.Weight, 1) != h.weights[i] {
			return false
		}
	}
	return true
}
