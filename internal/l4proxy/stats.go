package l4proxy

import "sync/atomic"

// Stats are a Proxy's cumulative counters.
type Stats struct {
	// Accepted counts TCP connections this Proxy handled (not refused by
	// Allow, not diverted to Alt).
	Accepted uint64
	// Forwarded counts TCP connections connected to an endpoint.
	Forwarded uint64
	// Retried counts forwarded TCP connections that needed more than
	// one dial.
	Retried uint64
	// DialFailures counts failed TCP dials to endpoints.
	DialFailures uint64
	// Refused counts TCP connections reset because no endpoint was left
	// to try.
	Refused uint64
	// SocketDrops counts flows refused because the Limiter was full.
	SocketDrops uint64
	// Denied counts TCP connections and datagrams refused by Allow.
	Denied uint64
	// UDPSessions counts UDP sessions started.
	UDPSessions uint64
	// UDPSessionDrops counts datagrams dropped because they would have
	// started a session beyond MaxUDPSessions.
	UDPSessionDrops uint64
	// UDPNoEndpoint counts datagrams dropped for want of an endpoint.
	UDPNoEndpoint uint64
	// UDPLive is the number of UDP sessions alive now.
	UDPLive uint64
}

type counters struct {
	accepted, forwarded, retried, dialFailures, refused, socketDrops, denied atomic.Uint64
	udpSessions, udpSessionDrops, udpNoEndpoint                              atomic.Uint64
	udpLive                                                                  atomic.Int64
}

// Stats returns a snapshot of p's counters.
func (p *Proxy) Stats() Stats {
	s := &p.stats
	return Stats{
		Accepted: s.accepted.Load(), Forwarded: s.forwarded.Load(), Retried: s.retried.Load(),
		DialFailures: s.dialFailures.Load(), Refused: s.refused.Load(), SocketDrops: s.socketDrops.Load(), Denied: s.denied.Load(),
		UDPSessions: s.udpSessions.Load(), UDPSessionDrops: s.udpSessionDrops.Load(),
		UDPNoEndpoint: s.udpNoEndpoint.Load(), UDPLive: uint64(max(s.udpLive.Load(), 0)),
	}
}

// Limiter caps the sockets that one or more Proxies open towards clients
// and endpoints: a proxied TCP connection holds two, a UDP session one.
// Share one Limiter between Proxies to keep the process under its file
// limit. The zero value (Max 0) counts but does not limit; a nil *Limiter
// neither counts nor limits.
type Limiter struct {
	// Max is the most sockets held at once; zero or less means no limit.
	Max int
	n   atomic.Int64
}

// InUse returns the sockets held now.
func (l *Limiter) InUse() int {
	if l == nil {
		return 0
	}
	return int(l.n.Load())
}

func (l *Limiter) acquire(k int) bool {
	if l == nil {
		return true
	}
	if v := l.n.Add(int64(k)); l.Max > 0 && v > int64(l.Max) {
		l.n.Add(-int64(k))
		return false
	}
	return true
}

func (l *Limiter) release(k int) {
	if l != nil {
		l.n.Add(-int64(k))
	}
}
