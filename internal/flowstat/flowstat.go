// Package flowstat counts, per endpoint of the Service ports it watches,
// the new TCP connections, the failed ones (refused or unanswered, as
// conntrack.Event.Failed says) and the live flows, from conntrack events.
// Top picks the ports to export, so that a node with 10,000 Services does
// not export a million series.
//
// Stats does no I/O and is not safe for concurrent use.
package flowstat

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

// maxLive bounds the flows Stats remembers to count live ones.
const maxLive = 1 << 18

// Endpoint is one endpoint's counts.
type Endpoint struct {
	Endpoint netip.AddrPort
	New      uint64 // new connections (SYNs DNATed to it)
	Failed   uint64 // of them, refused or unanswered
	Live     int    // flows answered and not yet destroyed
}

// Port is one Service port's endpoints.
type Port struct {
	Name      string
	New       uint64 // over all its endpoints
	Endpoints []Endpoint
}

type counts struct {
	new, failed uint64
	live        int
}

// Stats is the counter set.
type Stats struct {
	groups map[string][]netip.AddrPort
	eps    map[netip.AddrPort]*counts
	live   map[conntrack.Flow]netip.AddrPort // answered flows, to count down at destroy
}

// New returns Stats watching nothing.
func New() *Stats {
	return &Stats{eps: map[netip.AddrPort]*counts{}, live: map[conntrack.Flow]netip.AddrPort{}}
}

// Watch replaces the watched ports (name → endpoints); counts of
// endpoints still watched are kept.
func (s *Stats) Watch(groups map[string][]netip.AddrPort) {
	s.groups = groups
	keep := map[netip.AddrPort]bool{}
	for _, eps := range groups {
		for _, ep := range eps {
			keep[ep] = true
			if s.eps[ep] == nil {
				s.eps[ep] = &counts{}
			}
		}
	}
	for ep := range s.eps {
		if !keep[ep] {
			delete(s.eps, ep)
		}
	}
}

// Observe counts one event.
func (s *Stats) Observe(ev conntrack.Event) {
	f := ev.Flow
	if f.Protocol != conntrack.ProtoTCP {
		return
	}
	c := s.eps[f.ReplySrc]
	if c == nil {
		return
	}
	key := f
	key.TCPState = 0
	switch {
	case ev.Type == conntrack.EventNew:
		c.new++
	case ev.Failed():
		c.failed++
		if _, ok := s.live[key]; ok {
			delete(s.live, key)
			c.live--
		}
	case ev.Type == conntrack.EventDestroy:
		if _, ok := s.live[key]; ok {
			delete(s.live, key)
			c.live--
		}
	case ev.Status&conntrack.StatusSeenReply != 0:
		if _, ok := s.live[key]; !ok && len(s.live) < maxLive {
			s.live[key] = f.ReplySrc
			c.live++
		}
	}
}

// Top returns the n watched ports with the most new connections (ties by
// name), each with its endpoints' counts in address order. An endpoint
// shared by ports is reported under each.
func (s *Stats) Top(n int) []Port {
	var ports []Port
	for name, eps := range s.groups {
		p := Port{Name: name}
		for _, ep := range eps {
			c := s.eps[ep]
			if c == nil {
				continue
			}
			p.New += c.new
			p.Endpoints = append(p.Endpoints, Endpoint{Endpoint: ep, New: c.new, Failed: c.failed, Live: c.live})
		}
		slices.SortFunc(p.Endpoints, func(a, b Endpoint) int { return a.Endpoint.Compare(b.Endpoint) })
		ports = append(ports, p)
	}
	slices.SortFunc(ports, func(a, b Port) int { return cmp.Or(cmp.Compare(b.New, a.New), cmp.Compare(a.Name, b.Name)) })
	if len(ports) > n {
		ports = ports[:n]
	}
	return ports
}
