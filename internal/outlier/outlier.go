// Package outlier ejects failing endpoints passively: it watches the
// outcome of new TCP connections to the endpoints of Services that asked
// for it (conntrack events: a SYN answered by a reset, or not answered at
// all) and takes an endpoint out of selection when its connections fail
// several times in a row, for a backoff that doubles each time it happens
// again. It never ejects more than a share of a Service's endpoints. A
// caller that sees every refusal but the other outcomes of a sample of the
// flows only (a sampled-out flow reports its end only) observes every flow
// of the endpoints Suspects names, so that a streak is broken by every
// success.
//
// A Detector is a pure state machine: events and the time come in, the
// set of ejected endpoints comes out. It does no I/O and is not safe for
// concurrent use; the caller (cmd/vipproxy) feeds it from one goroutine.
package outlier

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vipproxy/vipproxy/internal/conntrack"
)

// Config tunes a Detector. Zero fields take the defaults in brackets.
type Config struct {
	// Failures is how many new connections in a row must fail (3).
	Failures int
	// Window is the time those failures must fall within, counted from
	// the first (10 s).
	Window time.Duration
	// NoReply is how long a SYN may go unanswered before the attempt
	// counts as failed (1 s).
	NoReply time.Duration
	// BaseEjection is the first ejection's length; each further one of the
	// same endpoint doubles it, up to MaxEjection (5 s, 5 min). An
	// endpoint not ejected for MaxEjection starts again from BaseEjection.
	BaseEjection, MaxEjection time.Duration
	// MaxShare is the largest share of a Service's endpoints ejected at
	// once, in (0, 1] (0.5). A Service's last endpoint is never ejected.
	MaxShare float64
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Failures <= 0 {
		c.Failures = 3
	}
	def(&c.Window, 10*time.Second)
	def(&c.NoReply, time.Second)
	def(&c.BaseEjection, 5*time.Second)
	def(&c.MaxEjection, 5*time.Minute)
	if c.MaxShare <= 0 || c.MaxShare > 1 {
		c.MaxShare = 0.5
	}
	return c
}

// Ejection is an endpoint out of selection until Until.
type Ejection struct {
	Until time.Time
	// Count is how many times in a row (without MaxEjection healthy in
	// between) the endpoint was ejected, this one included.
	Count int
	// Reason says which failures ejected it.
	Reason string
}

// Change is one ejection or return, for logs, metrics and events.
type Change struct {
	Endpoint netip.AddrPort
	Groups   []string // the Services (ports) it belongs to
	Ejected  bool     // false: it came back
	Ejection Ejection
}

// maxPending bounds the connection attempts waiting for an answer.
const maxPending = 1 << 16

type endpoint struct {
	groups     []string
	streak     int
	first      time.Time
	lastFail   time.Time // while in Detector.suspects
	last       string    // the last failure's kind
	ejection   Ejection  // the last one (in force while the endpoint is in Detector.out)
	returnedAt time.Time
}

type attempt struct {
	ep    netip.AddrPort
	start time.Time
}

// Detector is the state machine. The zero value is not usable: see New.
type Detector struct {
	cfg    Config
	groups map[string][]netip.AddrPort
	eps    map[netip.AddrPort]*endpoint
	out    map[netip.AddrPort]*endpoint // the ejected endpoints of eps: Tick and Ejected walk these only
	// suspects are the endpoints of eps with a failure within Window
	// (see Suspects); suspectsChanged says the set changed since the
	// last SuspectsChanged.
	suspects        map[netip.AddrPort]*endpoint
	suspectsChanged bool
	pending         map[conntrack.Flow]attempt
	changes         []Change
}

// New returns a Detector watching nothing.
func New(cfg Config) *Detector {
	return &Detector{cfg: cfg.withDefaults(), eps: map[netip.AddrPort]*endpoint{},
		out: map[netip.AddrPort]*endpoint{}, suspects: map[netip.AddrPort]*endpoint{}, pending: map[conntrack.Flow]attempt{}}
}

// Watch replaces the watched Services: group name → its endpoints.
// Endpoints no longer watched are forgotten (an ejected one with them);
// the others keep their state. Only groups whose endpoints changed cost
// more than a comparison (see SetGroup).
func (d *Detector) Watch(groups map[string][]netip.AddrPort) {
	for g := range d.groups {
		if _, ok := groups[g]; !ok {
			d.SetGroup(g, nil)
		}
	}
	for g, eps := range groups {
		d.SetGroup(g, eps)
	}
}

// SetGroup replaces one watched Service's endpoints; none unwatches it.
// Endpoints it keeps keep their state (a streak, an ejection); one no
// group holds any more is forgotten, ejected or not.
func (d *Detector) SetGroup(g string, eps []netip.AddrPort) {
	old, had := d.groups[g]
	if had && slices.Equal(old, eps) {
		return
	}
	if len(old) > 0 {
		keep := make(map[netip.AddrPort]bool, len(eps))
		for _, ep := range eps {
			keep[ep] = true
		}
		for _, ep := range old {
			e := d.eps[ep]
			if e == nil || keep[ep] {
				continue
			}
			if i := slices.Index(e.groups, g); i >= 0 {
				e.groups = slices.Delete(e.groups, i, i+1)
			}
			if len(e.groups) == 0 {
				delete(d.eps, ep)
				delete(d.out, ep)
				if d.suspects[ep] != nil {
					delete(d.suspects, ep)
					d.suspectsChanged = true
				}
			}
		}
	}
	if len(eps) == 0 {
		delete(d.groups, g)
		return
	}
	if d.groups == nil {
		d.groups = map[string][]netip.AddrPort{}
	}
	d.groups[g] = slices.Clone(eps)
	for _, ep := range eps {
		e := d.eps[ep]
		if e == nil {
			e = &endpoint{}
			d.eps[ep] = e
		}
		if !slices.Contains(e.groups, g) {
			e.groups = append(e.groups, g)
		}
	}
}

// Observe takes one conntrack event seen at now. The endpoint of a flow is
// its reply source (the address a DNAT chose, or the destination itself).
func (d *Detector) Observe(ev conntrack.Event, now time.Time) {
	f := ev.Flow
	if f.Protocol != conntrack.ProtoTCP {
		return
	}
	ep := f.ReplySrc
	if _, ok := d.eps[ep]; !ok {
		return
	}
	key := f
	key.TCPState = 0
	switch {
	case ev.Type == conntrack.EventNew:
		if len(d.pending) < maxPending {
			d.pending[key] = attempt{ep, now}
		}
	case ev.Failed():
		_, pending := d.pending[key]
		delete(d.pending, key)
		if ev.Status&conntrack.StatusSeenReply == 0 && ev.Flow.TCPState == conntrack.TCPSynSent {
			// The end of an unanswered SYN's entry: its SYN_SENT timeout
			// ran out (2 min by default), long after the attempt, which
			// NoReply judged if its start was seen; or someone deleted
			// it. Neither says how the endpoint answers now (counted, a
			// burst of them at the collector's pace could eject one that
			// recovered meanwhile).
			return
		}
		if pending || ev.Type == conntrack.EventDestroy {
			d.fail(ep, "refused", now)
		}
	case ev.Status&conntrack.StatusSeenReply != 0:
		// Answered: SYN-ACK or later (in nftables mode the first event
		// after the creation is the assured one: see observedEvents).
		if _, ok := d.pending[key]; ok {
			delete(d.pending, key)
			d.eps[ep].streak = 0
		}
	case ev.Type == conntrack.EventDestroy:
		delete(d.pending, key)
	}
}

// Tick advances time: attempts unanswered for NoReply fail, ejections
// that ran out end.
func (d *Detector) Tick(now time.Time) {
	for k, a := range d.pending {
		if now.Sub(a.start) >= d.cfg.NoReply {
			delete(d.pending, k)
			if _, ok := d.eps[a.ep]; ok {
				d.fail(a.ep, "no reply within "+d.cfg.NoReply.String(), now)
			}
		}
	}
	// Only the ejected and suspect ones: a node may watch 100,000
	// endpoints, and Tick runs every batch of events (walking them all
	// cost 12 % of a core with 10,000 Services watched).
	for ep, e := range d.suspects {
		if now.Sub(e.lastFail) > d.cfg.Window {
			delete(d.suspects, ep)
			d.suspectsChanged = true
		}
	}
	for ep, e := range d.out {
		if !now.Before(e.ejection.Until) {
			e.streak, e.returnedAt = 0, now
			delete(d.out, ep)
			d.changes = append(d.changes, Change{Endpoint: ep, Groups: slices.Clone(e.groups), Ejection: e.ejection})
		}
	}
}

// fail counts a failed attempt and ejects the endpoint when its streak is
// long enough and every Service it belongs to can spare it.
func (d *Detector) fail(ep netip.AddrPort, kind string, now time.Time) {
	e := d.eps[ep]
	if d.out[ep] != nil {
		return
	}
	e.lastFail = now
	if d.suspects[ep] == nil {
		d.suspects[ep] = e
		d.suspectsChanged = true
	}
	if e.streak == 0 || now.Sub(e.first) > d.cfg.Window {
		e.streak, e.first = 0, now
	}
	e.streak++
	e.last = kind
	if e.streak < d.cfg.Failures {
		return
	}
	for _, g := range e.groups {
		eps := d.groups[g]
		out := 0
		for _, o := range eps {
			if d.out[o] != nil {
				out++
			}
		}
		if float64(out+1) > d.cfg.MaxShare*float64(len(eps)) || out+1 >= len(eps) {
			return // this Service cannot spare another endpoint
		}
	}
	count := e.ejection.Count + 1
	if !e.returnedAt.IsZero() && now.Sub(e.returnedAt) >= d.cfg.MaxEjection {
		count = 1
	}
	dur := d.cfg.BaseEjection
	for i := 1; i < count && dur < d.cfg.MaxEjection; i++ {
		dur *= 2
	}
	dur = min(dur, d.cfg.MaxEjection)
	e.streak = 0
	d.out[ep] = e
	e.ejection = Ejection{Until: now.Add(dur), Count: count,
		Reason: fmt.Sprintf("%d new connections in a row failed (last: %s)", d.cfg.Failures, kind)}
	d.changes = append(d.changes, Change{Endpoint: ep, Groups: slices.Clone(e.groups), Ejected: true, Ejection: e.ejection})
}

// Ejected returns the endpoints out of selection now.
func (d *Detector) Ejected() map[netip.AddrPort]Ejection {
	out := make(map[netip.AddrPort]Ejection, len(d.out))
	for ep, e := range d.out {
		out[ep] = e.ejection
	}
	return out
}

// Suspects returns the endpoints that failed a connection within the last
// Window, each with the groups it belongs to (a new map; the group lists
// are the caller's). Outside of it an endpoint has no streak to break,
// so a caller that sees only a sample of the flows' successes (it sees
// every failure) needs to see them all for these only: then "failed N
// times in a row" means what it says. An endpoint stays a suspect for
// Window after its last failure even when a success breaks its streak,
// so that one failing now and then does not flip in and out.
func (d *Detector) Suspects() map[netip.AddrPort][]string {
	out := make(map[netip.AddrPort][]string, len(d.suspects))
	for ep, e := range d.suspects {
		out[ep] = slices.Clone(e.groups)
	}
	return out
}

// SuspectsChanged reports whether the suspects changed since the last
// call.
func (d *Detector) SuspectsChanged() bool {
	c := d.suspectsChanged
	d.suspectsChanged = false
	return c
}

// Changes returns the ejections and returns since the last call.
func (d *Detector) Changes() []Change {
	c := d.changes
	d.changes = nil
	return c
}
