// Package l4proxy is a layer-4 (TCP and UDP) load-balancing proxy.
//
// A Proxy forwards every flow it is handed to one of its endpoints, chosen
// by a Scheduler (the IPVS set: rr, lc, dh, sh, sed, nq, plus random), with
// optional client-IP affinity. TCP connections whose first endpoint refuses
// or does not answer in time are retried on another endpoint; data is
// copied both ways with half-close, between *net.TCPConn so that the kernel
// splices where it can. UDP flows are tracked in a session table keyed by
// client address, with an idle timeout and a cap.
//
// The zero Proxy is usable: it has no endpoints (every flow is refused)
// until SetEndpoints is called, schedules round robin and has no affinity.
// Endpoint changes apply to new flows at once; established TCP connections
// drain on their own.
package l4proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults used when the matching Proxy field is zero.
const (
	DefaultDialTimeout    = time.Second
	DefaultMaxTries       = 3
	DefaultUDPIdleTimeout = 30 * time.Second
	DefaultMaxUDPSessions = 4096
)

// Endpoint is one backend of a Proxy.
type Endpoint struct {
	Addr netip.AddrPort
	// Weight is the endpoint's relative weight for the weighted
	// schedulers (sh, sed, nq). Zero or less means 1.
	Weight int
}

// Proxy forwards TCP connections and UDP datagrams to its endpoints. Set
// the option fields before the first Serve or Handle call and do not change
// them afterwards; the methods are safe for concurrent use.
type Proxy struct {
	// Scheduler chooses endpoints. Nil means round robin.
	Scheduler Scheduler
	// DialTimeout bounds each TCP dial to an endpoint. Zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxTries is how many endpoints a TCP connection tries before the
	// client connection is reset. Zero means DefaultMaxTries; it is also
	// bounded by the number of endpoints.
	MaxTries int
	// AffinityTimeout > 0 turns on client-IP affinity: a client's new
	// flows go to the endpoint its previous flow used if that flow started
	// less than AffinityTimeout ago and the endpoint is still there. Zero
	// means no affinity.
	AffinityTimeout time.Duration
	// UDPIdleTimeout ends a UDP session after no datagram in either
	// direction for this long. Zero means DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration
	// MaxUDPSessions caps the live UDP sessions of this Proxy; datagrams
	// that would start another session are dropped and counted. Zero means
	// DefaultMaxUDPSessions; negative means no cap.
	MaxUDPSessions int
	// Sockets, when set, caps the backend sockets open at once across all
	// Proxies sharing it. Nil means no cap.
	Sockets *Limiter
	// Allow, when set, admits or refuses each new flow by client address:
	// a refused TCP connection is reset, a refused datagram dropped, both
	// counted in Stats.Denied. Nil admits every client.
	Allow func(client netip.Addr) bool
	// Alt and UseAlt divert flows by client: a flow from a client UseAlt
	// reports true for (after Allow admitted it) is scheduled over Alt's
	// endpoints, with Alt's scheduler, counts, affinity and options, as if
	// Alt had received it. This is how kube-proxy's externalTrafficPolicy
	// Local short-circuits in-cluster clients to all endpoints. Either nil
	// means no diversion. Alt must not itself divert back to p.
	Alt    *Proxy
	UseAlt func(client netip.Addr) bool
	// Now is the clock for affinity. Nil means time.Now.
	Now func() time.Time
	// Logger receives per-flow failures at debug level. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Flows, when set, counts the flows this Proxy takes on: TCP
	// connections accepted (as Stats.Accepted) and UDP sessions started
	// (as Stats.UDPSessions). Proxies may share one counter; unlike Stats
	// it outlives a Proxy that is replaced.
	Flows *atomic.Uint64

	mu        sync.Mutex
	backends  []*backend
	cands     []Candidate // scratch for pick, guarded by mu
	rr        RoundRobin  // used when Scheduler is nil
	aff       map[netip.Addr]affinity
	affPuts   int
	conns     map[net.Conn]struct{}
	closers   map[io.Closer]struct{} // listeners and packet conns being served
	udpTables map[*udpTable]struct{}
	closed    bool

	stats counters
}

type backend struct {
	addr   netip.AddrPort // immutable
	weight int            // guarded by Proxy.mu
	active atomic.Int64
	gone   atomic.Bool // removed by SetEndpoints
}

type affinity struct {
	b    *backend
	last time.Time
}

// SetEndpoints replaces the endpoints. New flows use the new set at once.
// Established TCP connections to removed endpoints are left to finish; UDP
// sessions to removed endpoints are ended (as a kernel proxy flushes their
// conntrack entries), so the client's next datagram is scheduled afresh.
// Live-flow counts of endpoints that stay are kept. Duplicate addresses are
// collapsed to the first.
func (p *Proxy) SetEndpoints(eps []Endpoint) {
	p.mu.Lock()
	old := make(map[netip.AddrPort]*backend, len(p.backends))
	for _, b := range p.backends {
		old[b.addr] = b
	}
	next := make([]*backend, 0, len(eps))
	seen := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		if seen[e.Addr] {
			continue
		}
		seen[e.Addr] = true
		if e.Weight <= 0 {
			e.Weight = 1
		}
		b := old[e.Addr]
		if b == nil {
			b = &backend{addr: e.Addr}
		}
		delete(old, e.Addr)
		b.weight = e.Weight
		next = append(next, b)
	}
	p.backends = next
	for _, b := range old {
		b.gone.Store(true)
	}
	for ip, a := range p.aff {
		if a.b.gone.Load() {
			delete(p.aff, ip)
		}
	}
	tables := make([]*udpTable, 0, len(p.udpTables))
	for t := range p.udpTables {
		tables = append(tables, t)
	}
	p.mu.Unlock()
	if len(old) > 0 {
		for _, t := range tables {
			t.closeGone()
		}
	}
}

// Endpoints returns the current endpoints, weights defaulted.
func (p *Proxy) Endpoints() []Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Endpoint, len(p.backends))
	for i, b := range p.backends {
		out[i] = Endpoint{Addr: b.addr, Weight: b.weight}
	}
	return out
}

// Active returns the number of live flows to addr (zero when addr is not
// an endpoint).
func (p *Proxy) Active(addr netip.AddrPort) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.backends {
		if b.addr == addr {
			return int(b.active.Load())
		}
	}
	return 0
}

func (p *Proxy) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

func (p *Proxy) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Affinity returns the endpoint client's new flows stick to and the time
// before that entry expires; ok is false when client has none (never
// seen, expired, or its endpoint was removed).
func (p *Proxy) Affinity(client netip.Addr) (ep netip.AddrPort, left time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, found := p.aff[client.Unmap()]
	if !found || p.AffinityTimeout <= 0 || a.b.gone.Load() {
		return netip.AddrPort{}, 0, false
	}
	if left = p.AffinityTimeout - p.now().Sub(a.last); left <= 0 {
		return netip.AddrPort{}, 0, false
	}
	return a.b.addr, left, true
}

// pick chooses an endpoint for a flow from src to dst, skipping the ones in
// down, and counts the flow on it. It returns nil when none is left.
func (p *Proxy) pick(src, dst netip.AddrPort, down []*backend) *backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.backends) == 0 {
		return nil
	}
	var now time.Time
	client := src.Addr().Unmap()
	if p.AffinityTimeout > 0 {
		now = p.now()
		if a, ok := p.aff[client]; ok {
			if now.Sub(a.last) < p.AffinityTimeout && !a.b.gone.Load() && !slices.Contains(down, a.b) {
				a.last = now
				p.aff[client] = a
				a.b.active.Add(1)
				return a.b
			}
			delete(p.aff, client)
		}
	}
	p.cands = p.cands[:0]
	for _, b := range p.backends {
		p.cands = append(p.cands, Candidate{
			Addr: b.addr, Weight: b.weight,
			Active: int(b.active.Load()), Down: slices.Contains(down, b),
		})
	}
	s := p.Scheduler
	if s == nil {
		s = &p.rr
	}
	i := s.Pick(p.cands, src, dst)
	if i < 0 || i >= len(p.backends) || p.cands[i].Down {
		return nil
	}
	b := p.backends[i]
	b.active.Add(1)
	if p.AffinityTimeout > 0 {
		if p.aff == nil {
			p.aff = make(map[netip.Addr]affinity)
		}
		p.aff[client] = affinity{b: b, last: now}
		if p.affPuts++; p.affPuts >= 1024 {
			p.affPuts = 0
			for ip, a := range p.aff {
				if now.Sub(a.last) >= p.AffinityTimeout {
					delete(p.aff, ip)
				}
			}
		}
	}
	return b
}

// divert returns the Proxy that handles flows from src: p.Alt when UseAlt
// says so, else p.
func (p *Proxy) divert(src netip.AddrPort) *Proxy {
	if p.Alt != nil && p.UseAlt != nil && p.Alt != p && p.UseAlt(src.Addr().Unmap()) {
		return p.Alt
	}
	return p
}

// forget drops the affinity of client if it points at b (after b failed).
func (p *Proxy) forget(client netip.Addr, b *backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.aff[client.Unmap()]; ok && a.b == b {
		delete(p.aff, client.Unmap())
	}
}

// track registers c for Close; it reports false when the Proxy is closed.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	switch c := c.(type) {
	case net.Conn:
		if p.conns == nil {
			p.conns = make(map[net.Conn]struct{})
		}
		p.conns[c] = struct{}{}
	default:
		if p.closers == nil {
			p.closers = make(map[io.Closer]struct{})
		}
		p.closers[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if nc, ok := c.(net.Conn); ok {
		delete(p.conns, nc)
	}
	delete(p.closers, c)
}

// Close stops every Serve call of p, closes every live connection and UDP
// session and makes later Serve and Handle calls return at once. It is for
// shutting a Proxy down for good; to stop accepting while letting
// connections drain, close the listener instead.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	var cs []io.Closer
	for c := range p.closers {
		cs = append(cs, c)
	}
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	var errs []error
	for _, c := range cs {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ServeTCP accepts connections on ln and handles each in its own goroutine
// until ln is closed (then it returns nil) or the Proxy is closed.
// Temporary accept errors (such as running out of file descriptors) are
// logged and retried with a backoff of up to one second.
func (p *Proxy) ServeTCP(ln net.Listener) error {
	if !p.track(ln) {
		ln.Close()
		return nil
	}
	defer p.untrack(ln)
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.log().Warn("l4proxy: accept failed; retrying", "listener", ln.Addr().String(), "err", err, "delay", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go p.HandleConn(c)
	}
}

// HandleConn proxies one accepted TCP connection and closes it when done.
// It dials endpoints chosen by the Scheduler, at most MaxTries of them,
// each with DialTimeout; when none answers (or there are none, or the
// socket cap is reached) it resets c.
func (p *Proxy) HandleConn(c net.Conn) {
	src, dst := addrPort(c.RemoteAddr()), addrPort(c.LocalAddr())
	if p.Allow != nil && !p.Allow(src.Addr().Unmap()) {
		p.stats.denied.Add(1)
		reset(c)
		return
	}
	if q := p.divert(src); q != p {
		q.HandleConn(c)
		return
	}
	p.stats.accepted.Add(1)
	if p.Flows != nil {
		p.Flows.Add(1)
	}
	if !p.track(c) {
		c.Close()
		return
	}
	defer p.untrack(c)
	if !p.Sockets.acquire(2) {
		p.stats.socketDrops.Add(1)
		reset(c)
		return
	}
	defer p.Sockets.release(2)

	tries := p.MaxTries
	if tries <= 0 {
		tries = DefaultMaxTries
	}
	timeout := p.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	var down []*backend
	for range tries {
		b := p.pick(src, dst, down)
		if b == nil {
			break
		}
		d := net.Dialer{Timeout: timeout}
		bc, err := d.DialContext(context.Background(), "tcp", b.addr.String())
		if err != nil {
			b.active.Add(-1)
			p.stats.dialFailures.Add(1)
			p.forget(src.Addr(), b)
			p.log().Debug("l4proxy: dial failed; trying another endpoint", "client", src, "endpoint", b.addr, "err", err)
			down = append(down, b)
			continue
		}
		if len(down) > 0 {
			p.stats.retried.Add(1)
		}
		p.stats.forwarded.Add(1)
		if p.track(bc) {
			p.splice(c, bc)
			p.untrack(bc)
		}
		bc.Close()
		b.active.Add(-1)
		return
	}
	p.stats.refused.Add(1)
	reset(c)
}

// splice copies a→b and b→a until both directions end. A direction that
// ends with EOF half-closes its destination (CloseWrite) and the other
// direction goes on; one that ends with an error closes both connections.
func (p *Proxy) splice(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(b, a)
	}()
	copyHalf(a, b)
	<-done
	a.Close()
	b.Close()
}

// copyHalf copies src to dst. With two *net.TCPConn, io.Copy uses
// dst.ReadFrom, which splices on Linux.
func copyHalf(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil {
		// A reset or a write to a closed peer: abort the whole flow so the
		// other direction does not wait forever.
		reset(dst)
		src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
}

// reset closes c so that the peer sees a reset rather than an orderly end.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	if a == nil {
		return netip.AddrPort{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
