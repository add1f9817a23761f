package l4proxy

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// maxDatagram is the largest UDP payload. Buffers of this size are pooled;
// a session holds one only while it copies a reply (on systems other than
// Unix, also while it waits for one).
const maxDatagram = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// udpTable is the session table of one ServeUDP call.
type udpTable struct {
	p     *Proxy
	pc    net.PacketConn
	local netip.AddrPort
	mu    sync.Mutex
	m     map[netip.AddrPort]*udpSession
}

type udpSession struct {
	t      *udpTable
	q      *Proxy // the Proxy whose endpoint this is (t.p or t.p.Alt)
	client netip.AddrPort
	b      *backend
	conn   *net.UDPConn
	last   atomic.Int64 // UnixNano of the last datagram either way
	once   sync.Once
}

// ServeUDP reads datagrams from pc and forwards each to the endpoint of its
// client's session, starting a session (a connected socket to an endpoint
// chosen by the Scheduler) for a new client. Replies from the endpoint are
// sent back to the client from pc. A session ends after UDPIdleTimeout
// without traffic, when its endpoint is removed, or when the endpoint
// socket reports an error (such as ICMP port unreachable), so the next
// datagram is scheduled afresh. Datagrams that would start a session beyond
// MaxUDPSessions or the Limiter, or that find no endpoint, are dropped and
// counted. ServeUDP returns nil when pc is closed or the Proxy is closed,
// ending the sessions it started.
func (p *Proxy) ServeUDP(pc net.PacketConn) error {
	if !p.track(pc) {
		pc.Close()
		return nil
	}
	defer p.untrack(pc)
	t := &udpTable{p: p, pc: pc, local: addrPort(pc.LocalAddr()), m: make(map[netip.AddrPort]*udpSession)}
	p.mu.Lock()
	if p.udpTables == nil {
		p.udpTables = make(map[*udpTable]struct{})
	}
	p.udpTables[t] = struct{}{}
	p.mu.Unlock()
	if a := p.Alt; a != nil && a != p {
		// Sessions diverted to Alt end when Alt's endpoints go.
		a.mu.Lock()
		if a.udpTables == nil {
			a.udpTables = make(map[*udpTable]struct{})
		}
		a.udpTables[t] = struct{}{}
		a.mu.Unlock()
	}
	defer func() {
		for _, q := range []*Proxy{p, p.Alt} {
			if q != nil {
				q.mu.Lock()
				delete(q.udpTables, t)
				q.mu.Unlock()
			}
		}
		t.closeAll()
	}()

	uc, _ := pc.(*net.UDPConn)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var delay time.Duration
	for {
		var (
			n   int
			src netip.AddrPort
			err error
		)
		if uc != nil {
			n, src, err = uc.ReadFromUDPAddrPort(buf)
		} else {
			var a net.Addr
			n, a, err = pc.ReadFrom(buf)
			src = addrPort(a)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.log().Warn("l4proxy: udp read failed; retrying", "listener", t.local, "err", err, "delay", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		s := t.session(src)
		if s == nil {
			continue
		}
		s.last.Store(time.Now().UnixNano())
		if _, err := s.conn.Write(buf[:n]); err != nil {
			p.log().Debug("l4proxy: udp write to endpoint failed", "client", src, "endpoint", s.b.addr, "err", err)
		}
	}
}

// session returns src's session, starting one if needed; nil means the
// datagram is to be dropped (already counted).
func (t *udpTable) session(src netip.AddrPort) *udpSession {
	t.mu.Lock()
	s := t.m[src]
	t.mu.Unlock()
	if s != nil {
		return s
	}
	if t.p.Allow != nil && !t.p.Allow(src.Addr().Unmap()) {
		t.p.stats.denied.Add(1)
		return nil
	}
	p := t.p.divert(src)
	limit := p.MaxUDPSessions
	if limit == 0 {
		limit = DefaultMaxUDPSessions
	}
	for {
		v := p.stats.udpLive.Load()
		if limit > 0 && v >= int64(limit) {
			p.stats.udpSessionDrops.Add(1)
			return nil
		}
		if p.stats.udpLive.CompareAndSwap(v, v+1) {
			break
		}
	}
	if !p.Sockets.acquire(1) {
		p.stats.udpLive.Add(-1)
		p.stats.socketDrops.Add(1)
		return nil
	}
	tries := p.MaxTries
	if tries <= 0 {
		tries = DefaultMaxTries
	}
	var down []*backend
	for range tries {
		b := p.pick(src, t.local, down)
		if b == nil {
			break
		}
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(b.addr))
		if err != nil {
			b.active.Add(-1)
			p.log().Debug("l4proxy: udp dial failed", "client", src, "endpoint", b.addr, "err", err)
			down = append(down, b)
			continue
		}
		s = &udpSession{t: t, q: p, client: src, b: b, conn: conn}
		s.last.Store(time.Now().UnixNano())
		t.mu.Lock()
		t.m[src] = s
		t.mu.Unlock()
		p.stats.udpSessions.Add(1)
		if p.Flows != nil {
			p.Flows.Add(1)
		}
		go s.run()
		return s
	}
	p.stats.udpLive.Add(-1)
	p.Sockets.release(1)
	p.stats.udpNoEndpoint.Add(1)
	return nil
}

// run forwards replies from the endpoint to the client until the session
// idles out or fails.
func (s *udpSession) run() {
	defer s.end()
	p := s.q
	idle := p.UDPIdleTimeout
	if idle <= 0 {
		idle = DefaultUDPIdleTimeout
	}
	uc, _ := s.t.pc.(*net.UDPConn)
	for {
		deadline := time.Unix(0, s.last.Load()).Add(idle)
		if !time.Now().Before(deadline) {
			return
		}
		s.conn.SetReadDeadline(deadline)
		// Wait for a reply without holding a buffer (where the system
		// allows), so idle sessions cost a goroutine, not 64 KiB.
		if err := waitReadable(s.conn); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		bp := bufPool.Get().(*[]byte)
		buf := *bp
		n, err := s.conn.Read(buf)
		if err != nil {
			bufPool.Put(bp)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.last.Store(time.Now().UnixNano())
		if uc != nil {
			_, err = uc.WriteToUDPAddrPort(buf[:n], s.client)
		} else {
			_, err = s.t.pc.WriteTo(buf[:n], net.UDPAddrFromAddrPort(s.client))
		}
		bufPool.Put(bp)
		if err != nil {
			p.log().Debug("l4proxy: udp reply to client failed", "client", s.client, "err", err)
			if errors.Is(err, net.ErrClosed) {
				return
			}
		}
	}
}

// end removes the session and releases what it holds; it is idempotent.
func (s *udpSession) end() {
	s.once.Do(func() {
		t := s.t
		t.mu.Lock()
		if t.m[s.client] == s {
			delete(t.m, s.client)
		}
		t.mu.Unlock()
		s.conn.Close()
		s.b.active.Add(-1)
		s.q.Sockets.release(1)
		s.q.stats.udpLive.Add(-1)
	})
}

func (t *udpTable) closeGone() {
	t.mu.Lock()
	var gone []*udpSession
	for _, s := range t.m {
		if s.b.gone.Load() {
			gone = append(gone, s)
		}
	}
	t.mu.Unlock()
	for _, s := range gone {
		s.end()
	}
}

func (t *udpTable) closeAll() {
	t.mu.Lock()
	all := make([]*udpSession, 0, len(t.m))
	for _, s := range t.m {
		all = append(all, s)
	}
	t.mu.Unlock()
	for _, s := range all {
		s.end()
	}
}

// UDPSessions returns the number of live UDP sessions of p.
func (p *Proxy) UDPSessions() int {
	return int(p.stats.udpLive.Load())
}
