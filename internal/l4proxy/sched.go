package l4proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
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

// Random picks uniformly among the candidates that are not Down. Rand,
// when set, is the source of randomness (for tests); nil means the
// math/rand/v2 global source.
type Random struct {
	Rand *rand.Rand
}

// Pick implements Scheduler.
func (r *Random) Pick(cands []Candidate, _, _ netip.AddrPort) int {
	up := 0
	for _, c := range cands {
		if !c.Down {
			up++
		}
	}
	if up == 0 {
		return -1
	}
	var k int
	if r.Rand != nil {
		k = r.Rand.IntN(up)
	} else {
		k = rand.IntN(up)
	}
	for i, c := range cands {
		if c.Down {
			continue
		}
		if k == 0 {
			return i
		}
		k--
	}
	return -1
}
