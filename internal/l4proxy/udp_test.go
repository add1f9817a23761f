package l4proxy

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// udpBackend answers each datagram with "name:payload".
func udpBackend(t testing.TB, ip, name string) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name+":"+string(buf[:n])), a)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func serveUDP(t testing.TB, p *Proxy, ip string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeUDP(pc)
	t.Cleanup(func() { p.Close() })
	return pc.LocalAddr().String()
}

// udpClient is a connected UDP socket (one client address).
type udpClient struct{ c net.Conn }

func newUDPClient(t testing.TB, addr string) *udpClient {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &udpClient{c: c}
}

// ask sends msg and returns the reply, or "" after wait without one.
func (u *udpClient) ask(t testing.TB, msg string, wait time.Duration) string {
	t.Helper()
	if _, err := u.c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	u.c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := u.c.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func TestUDPSessions(t *testing.T) {
	a := udpBackend(t, "127.0.0.2", "a")
	b := udpBackend(t, "127.0.0.3", "b")
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}})
	addr := serveUDP(t, p, "127.0.0.1")

	c1, c2 := newUDPClient(t, addr), newUDPClient(t, addr)
	for i, step := range []struct {
		c    *udpClient
		want string
	}{
		{c1, "a:1"}, {c1, "a:2"}, {c2, "b:3"}, {c1, "a:4"}, {c2, "b:5"},
	} {
		msg := strings.TrimPrefix(step.want[1:], ":")
		if got := step.c.ask(t, msg, 2*time.Second); got != step.want {
			t.Fatalf("step %d: reply %q, want %q", i, got, step.want)
		}
	}
	if st := p.Stats(); st.UDPSessions != 2 || st.UDPLive != 2 {
		t.Errorf("stats %+v, want 2 sessions started and live", st)
	}

	// Removing a ends c1's session; c1's next datagram goes to b.
	p.SetEndpoints([]Endpoint{{Addr: b}})
	waitFor(t, func() bool { return p.UDPSessions() == 1 }, "live sessions %d, want 1", func() []any { return []any{p.UDPSessions()} })
	if got := c1.ask(t, "6", 2*time.Second); got != "b:6" {
		t.Errorf("after removing a: reply %q, want b:6", got)
	}
}

func TestUDPSessionCap(t *testing.T) {
	a := udpBackend(t, "127.0.0.2", "a")
	p := &Proxy{MaxUDPSessions: 2, UDPIdleTimeout: 300 * time.Millisecond}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveUDP(t, p, "127.0.0.1")

	c1, c2, c3 := newUDPClient(t, addr), newUDPClient(t, addr), newUDPClient(t, addr)
	if got := c1.ask(t, "1", 2*time.Second); got != "a:1" {
		t.Fatalf("c1: %q", got)
	}
	if got := c2.ask(t, "2", 2*time.Second); got != "a:2" {
		t.Fatalf("c2: %q", got)
	}
	// At the cap: c3 is dropped, c1 and c2 are still served.
	if got := c3.ask(t, "3", 100*time.Millisecond); got != "" {
		t.Fatalf("c3 served beyond the cap: %q", got)
	}
	if got := c1.ask(t, "4", 2*time.Second); got != "a:4" {
		t.Fatalf("c1 at the cap: %q", got)
	}
	if got := c2.ask(t, "5", 2*time.Second); got != "a:5" {
		t.Fatalf("c2 at the cap: %q", got)
	}
	if st := p.Stats(); st.UDPSessionDrops != 1 || st.UDPLive != 2 {
		t.Errorf("stats %+v, want 1 drop, 2 live", st)
	}
	// The sessions idle out, making room for c3.
	waitFor(t, func() bool { return p.UDPSessions() == 0 }, "live sessions %d after idle timeout", func() []any { return []any{p.UDPSessions()} })
	if got := c3.ask(t, "6", 2*time.Second); got != "a:6" {
		t.Fatalf("c3 after idle timeout: %q", got)
	}
}

func TestUDPNoEndpoint(t *testing.T) {
	p := &Proxy{}
	addr := serveUDP(t, p, "127.0.0.1")
	c := newUDPClient(t, addr)
	if got := c.ask(t, "x", 100*time.Millisecond); got != "" {
		t.Fatalf("reply %q without endpoints", got)
	}
	waitFor(t, func() bool { return p.Stats().UDPNoEndpoint == 1 }, "stats %+v", func() []any { return []any{p.Stats()} })
	if p.UDPSessions() != 0 {
		t.Errorf("live sessions %d", p.UDPSessions())
	}
}

func TestUDPAffinity(t *testing.T) {
	a := udpBackend(t, "127.0.0.2", "a")
	b := udpBackend(t, "127.0.0.3", "b")
	p := &Proxy{AffinityTimeout: time.Hour}
	p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}})
	addr := serveUDP(t, p, "127.0.0.1")
	// Different client ports, same client IP: all to the first choice.
	for i := range 4 {
		if got := newUDPClient(t, addr).ask(t, "x", 2*time.Second); got != "a:x" {
			t.Fatalf("client %d: %q", i, got)
		}
	}
}

// TestUDPManyClients: every new client's first datagram starts a session
// and is answered (no datagram lost while the session is set up).
func TestUDPManyClients(t *testing.T) {
	a := udpBackend(t, "127.0.0.2", "a")
	b := udpBackend(t, "127.0.0.3", "b")
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}})
	addr := serveUDP(t, p, "127.0.0.1")
	// The clients stay open so that no two share a source port (a reused
	// port would rightly find the earlier client's session).
	for i := range 200 {
		u := newUDPClient(t, addr)
		want := []string{"a:x", "b:x"}[i%2]
		if got := u.ask(t, "x", time.Second); got != want {
			t.Fatalf("client %d: reply %q, want %q", i, got, want)
		}
	}
	if st := p.Stats(); st.UDPSessions != 200 {
		t.Errorf("sessions started %d, want 200", st.UDPSessions)
	}
}

// TestUDPSocketLimit: a shared Limiter full of another Proxy's sockets
// drops new sessions (counted) while existing ones keep working.
func TestUDPSocketLimit(t *testing.T) {
	a := udpBackend(t, "127.0.0.2", "a")
	lim := &Limiter{Max: 1}
	p := &Proxy{Sockets: lim}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveUDP(t, p, "127.0.0.1")
	c1, c2 := newUDPClient(t, addr), newUDPClient(t, addr)
	if got := c1.ask(t, "1", 2*time.Second); got != "a:1" {
		t.Fatalf("c1: %q", got)
	}
	if got := c2.ask(t, "2", 100*time.Millisecond); got != "" {
		t.Fatalf("c2 served beyond the socket cap: %q", got)
	}
	if got := c1.ask(t, "3", 2*time.Second); got != "a:3" {
		t.Fatalf("c1 at the cap: %q", got)
	}
	if st := p.Stats(); st.SocketDrops != 1 || lim.InUse() != 1 {
		t.Errorf("SocketDrops %d, in use %d; want 1, 1", st.SocketDrops, lim.InUse())
	}
}
