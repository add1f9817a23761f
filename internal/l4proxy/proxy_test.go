package l4proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// tcpBackend listens on ip:0 and, for each connection, writes its name and
// a newline, then echoes until EOF and half-closes. It returns its address.
func tcpBackend(t testing.TB, ip, name string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// refusing returns an address on ip where nothing listens.
func refusing(t testing.TB, ip string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return ap
}

// serveTCP starts p on ip:0 and returns the listening address.
func serveTCP(t testing.TB, p *Proxy, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeTCP(ln)
	t.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

type client struct {
	c    net.Conn
	r    *bufio.Reader
	name string
}

// dial connects to addr from local IP from (any when ""), reads the
// backend's name and returns the connection.
func dial(t testing.TB, addr, from string) (*client, error) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading backend name: %w", err)
	}
	cl := &client{c: c, r: r, name: strings.TrimSpace(name)}
	t.Cleanup(func() { c.Close() })
	return cl, nil
}

func mustDial(t testing.TB, addr, from string) *client {
	t.Helper()
	c, err := dial(t, addr, from)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echo checks one round trip on c.
func (c *client) echo(t testing.TB, msg string) {
	t.Helper()
	if _, err := io.WriteString(c.c, msg+"\n"); err != nil {
		t.Fatalf("write to %s: %v", c.name, err)
	}
	got, err := c.r.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != msg {
		t.Fatalf("echo via %s = %q, %v; want %q", c.name, got, err, msg)
	}
}

func TestRetrySecondBackend(t *testing.T) {
	dead := refusing(t, "127.0.0.2")
	live := tcpBackend(t, "127.0.0.3", "live")
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: dead}, {Addr: live}})
	addr := serveTCP(t, p, "127.0.0.1")
	for i := range 4 {
		c := mustDial(t, addr, "")
		if c.name != "live" {
			t.Fatalf("connection %d reached %q", i, c.name)
		}
		c.echo(t, "hello")
		c.c.Close()
	}
	st := p.Stats()
	// rr over two endpoints: each connection consumes two picks (dead,
	// live), so every connection starts at the dead one and is retried.
	if st.DialFailures != 4 || st.Retried != 4 || st.Forwarded != 4 || st.Refused != 0 {
		t.Errorf("stats = %+v, want 4 dial failures, 4 retried, 4 forwarded", st)
	}
}

func TestAllEndpointsRefuse(t *testing.T) {
	tests := []struct {
		name string
		eps  []Endpoint
		want Stats
	}{
		{name: "no endpoints", want: Stats{Accepted: 1, Refused: 1}},
		{name: "all refuse", eps: []Endpoint{{Addr: refusing(t, "127.0.0.2")}, {Addr: refusing(t, "127.0.0.3")}},
			want: Stats{Accepted: 1, Refused: 1, DialFailures: 2}},
		{name: "tries bounded", eps: []Endpoint{{Addr: refusing(t, "127.0.0.2")}, {Addr: refusing(t, "127.0.0.3")},
			{Addr: refusing(t, "127.0.0.4")}, {Addr: refusing(t, "127.0.0.5")}},
			want: Stats{Accepted: 1, Refused: 1, DialFailures: DefaultMaxTries}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{}
			p.SetEndpoints(tc.eps)
			addr := serveTCP(t, p, "127.0.0.1")
			start := time.Now()
			if c, err := dial(t, addr, ""); err == nil {
				t.Fatalf("reached backend %q", c.name)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("refusal took %v", d)
			}
			waitFor(t, func() bool { return p.Stats() == tc.want }, "stats %+v, want %+v", func() []any { return []any{p.Stats(), tc.want} })
		})
	}
}

func waitFor(t testing.TB, cond func() bool, format string, args func() []any) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf(format, args()...)
}

// TestLiveCountSchedulers drives lc and sed through real connections: the
// counts the schedulers see are the connections held open.
func TestLiveCountSchedulers(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	c := tcpBackend(t, "127.0.0.4", "c")
	for _, sched := range []string{"lc", "sed", "nq"} {
		t.Run(sched, func(t *testing.T) {
			s, _ := NewScheduler(sched)
			p := &Proxy{Scheduler: s}
			p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}, {Addr: c}})
			addr := serveTCP(t, p, "127.0.0.1")
			held := map[string][]*client{}
			open := func(want string) {
				t.Helper()
				cl := mustDial(t, addr, "")
				if cl.name != want {
					t.Fatalf("connection went to %s, want %s (held a=%d b=%d c=%d)", cl.name, want,
						len(held["a"]), len(held["b"]), len(held["c"]))
				}
				held[cl.name] = append(held[cl.name], cl)
			}
			closeOne := func(name string) {
				t.Helper()
				cl := held[name][0]
				held[name] = held[name][1:]
				cl.c.Close()
				ep := map[string]netip.AddrPort{"a": a, "b": b, "c": c}[name]
				waitFor(t, func() bool { return p.Active(ep) == len(held[name]) }, "active(%s) = %d, want %d",
					func() []any { return []any{name, p.Active(ep), len(held[name])} })
			}
			for _, want := range []string{"a", "b", "c", "a", "b", "c", "a"} {
				open(want)
			}
			// a:3 b:2 c:2; free one on c, then on b: they are the least loaded.
			closeOne("c")
			open("c")
			closeOne("b")
			closeOne("b")
			open("b")
			open("b")
			// a:3 b:2 c:2: the tie goes to the earlier endpoint.
			open("b")
			open("c")
		})
	}
}

func TestAffinity(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	p := &Proxy{AffinityTimeout: 10 * time.Second, Now: clock}
	p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}})
	addr := serveTCP(t, p, "127.0.0.1")

	pick := func(from string) string {
		t.Helper()
		c := mustDial(t, addr, from)
		c.c.Close()
		return c.name
	}
	steps := []struct {
		advance time.Duration
		from    string
		want    string
	}{
		{from: "127.0.0.10", want: "a"},                            // rr: a
		{from: "127.0.0.10", want: "a"},                            // sticky
		{from: "127.0.0.11", want: "b"},                            // rr: b
		{advance: 9 * time.Second, from: "127.0.0.10", want: "a"},  // 9s < 10s: sticky, refreshed
		{advance: 9 * time.Second, from: "127.0.0.10", want: "a"},  // 9s since the refresh
		{from: "127.0.0.11", want: "a"},                            // 18s: expired, rr: a
		{advance: 10 * time.Second, from: "127.0.0.10", want: "b"}, // exactly 10s: expired, rr: b
		{from: "127.0.0.11", want: "a"},                            // expired too, rr: a
		{from: "127.0.0.10", want: "b"},                            // sticky to its new choice
	}
	for i, s := range steps {
		advance(s.advance)
		if got := pick(s.from); got != s.want {
			t.Fatalf("step %d: %s reached %s, want %s", i, s.from, got, s.want)
		}
	}
	// Affinity reports the entry and the time left, until it expires.
	advance(4 * time.Second)
	if ep, left, ok := p.Affinity(netip.MustParseAddr("127.0.0.10")); !ok || ep != b || left != 6*time.Second {
		t.Errorf("Affinity(127.0.0.10) = %v, %v, %v; want %v, 6s, true", ep, left, ok, b)
	}
	if _, _, ok := p.Affinity(netip.MustParseAddr("127.0.0.99")); ok {
		t.Error("Affinity of a client never seen: ok")
	}
	advance(6 * time.Second)
	if ep, left, ok := p.Affinity(netip.MustParseAddr("127.0.0.10")); ok {
		t.Errorf("Affinity after the timeout = %v, %v, true", ep, left)
	}

	// Affinity to a removed endpoint is forgotten.
	pick("127.0.0.10")
	p.SetEndpoints([]Endpoint{{Addr: b}})
	if got := pick("127.0.0.10"); got != "b" {
		t.Errorf("after removing a: reached %s", got)
	}
}

func TestHalfClose(t *testing.T) {
	// The backend reads until EOF, then answers with the byte count and
	// closes: this only works if the client's CloseWrite reaches it while
	// the return direction stays open.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				fmt.Fprintf(c, "got %d", n)
			}()
		}
	}()
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: ln.Addr().(*net.TCPAddr).AddrPort()}})
	addr := serveTCP(t, p, "127.0.0.1")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	payload := strings.Repeat("x", 100000)
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "got 100000" {
		t.Errorf("reply %q, want %q", got, "got 100000")
	}
	waitFor(t, func() bool { return p.Active(ln.Addr().(*net.TCPAddr).AddrPort()) == 0 }, "connection still counted", func() []any { return nil })
}

func TestEndpointChangeKeepsConnections(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveTCP(t, p, "127.0.0.1")
	old := mustDial(t, addr, "")
	if old.name != "a" {
		t.Fatalf("reached %s", old.name)
	}
	old.echo(t, "before")
	p.SetEndpoints([]Endpoint{{Addr: b}})
	for range 3 {
		if c := mustDial(t, addr, ""); c.name != "b" {
			t.Fatalf("new connection after change reached %s", c.name)
		}
	}
	old.echo(t, "after")
	// Back to a: the old connection's count was kept on a's entry... a is
	// a new entry now, so lc sees it idle; the old flow still works.
	p.SetEndpoints([]Endpoint{{Addr: a}, {Addr: b}})
	old.echo(t, "again")
}

func TestClose(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.ServeTCP(ln) }()
	c := mustDial(t, ln.Addr().String(), "")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeTCP = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeTCP did not return after Close")
	}
	if _, err := c.r.ReadString('\n'); err == nil {
		t.Error("connection still open after Close")
	}
	// A closed Proxy refuses at once.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	if err := p.ServeTCP(ln2); err != nil {
		t.Errorf("ServeTCP on closed proxy = %v", err)
	}
}

func TestSocketLimit(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	lim := &Limiter{Max: 2}
	p := &Proxy{Sockets: lim}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveTCP(t, p, "127.0.0.1")
	first := mustDial(t, addr, "")
	if _, err := dial(t, addr, ""); err == nil {
		t.Fatal("second connection served beyond the socket cap")
	}
	first.echo(t, "still here")
	first.c.Close()
	waitFor(t, func() bool { return lim.InUse() == 0 }, "sockets in use %d", func() []any { return []any{lim.InUse()} })
	mustDial(t, addr, "").echo(t, "again")
	if st := p.Stats(); st.SocketDrops != 1 {
		t.Errorf("SocketDrops = %d, want 1", st.SocketDrops)
	}
}

// TestEndpointChurn switches the endpoint set back and forth while
// clients connect: every connection must land on a live endpoint and none
// may fail (run with -race to check the locking).
func TestEndpointChurn(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	s, _ := NewScheduler("lc")
	p := &Proxy{Scheduler: s}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveTCP(t, p, "127.0.0.1")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sets := [][]Endpoint{{{Addr: a}, {Addr: b, Weight: 2}}, {{Addr: b}}, {{Addr: a}}}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			p.SetEndpoints(sets[i%len(sets)])
		}
	}()
	errs := make(chan error, 200)
	var clients sync.WaitGroup
	for range 4 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			for range 50 {
				c, err := dial(t, addr, "")
				if err != nil {
					errs <- err
					return
				}
				if c.name != "a" && c.name != "b" {
					errs <- fmt.Errorf("reached %q", c.name)
				}
				c.c.Close()
			}
		}()
	}
	clients.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestAllow(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	ua := udpBackend(t, "127.0.0.2", "ua")
	allowed := netip.MustParsePrefix("127.0.0.20/32")
	p := &Proxy{Allow: allowed.Contains}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveTCP(t, p, "127.0.0.1")
	if c, err := dial(t, addr, "127.0.0.20"); err != nil || c.name != "a" {
		t.Fatalf("allowed client: %v", err)
	}
	if c, err := dial(t, addr, "127.0.0.21"); err == nil {
		t.Fatalf("denied client reached %s", c.name)
	}
	pu := &Proxy{Allow: allowed.Contains}
	pu.SetEndpoints([]Endpoint{{Addr: ua}})
	uaddr := serveUDP(t, pu, "127.0.0.1")
	for _, tc := range []struct{ from, want string }{{"127.0.0.21", ""}, {"127.0.0.20", "ua:x"}} {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.from+":0")),
			net.UDPAddrFromAddrPort(netip.MustParseAddrPort(uaddr)))
		if err != nil {
			t.Fatal(err)
		}
		u := &udpClient{c: c}
		if got := u.ask(t, "x", 300*time.Millisecond); got != tc.want {
			t.Errorf("udp from %s: %q, want %q", tc.from, got, tc.want)
		}
		c.Close()
	}
	waitFor(t, func() bool { return p.Stats().Denied == 1 && pu.Stats().Denied == 1 }, "denied %d/%d, want 1/1",
		func() []any { return []any{p.Stats().Denied, pu.Stats().Denied} })
}

// TestAlt: clients UseAlt picks are scheduled over Alt's endpoints, TCP
// and UDP; the others over p's.
func TestAlt(t *testing.T) {
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	ua := udpBackend(t, "127.0.0.2", "ua")
	ub := udpBackend(t, "127.0.0.3", "ub")
	internal := netip.MustParseAddr("127.0.0.20")
	isInternal := func(c netip.Addr) bool { return c == internal }

	alt := &Proxy{}
	alt.SetEndpoints([]Endpoint{{Addr: b}})
	p := &Proxy{Alt: alt, UseAlt: isInternal}
	p.SetEndpoints([]Endpoint{{Addr: a}})
	addr := serveTCP(t, p, "127.0.0.1")
	for _, tc := range []struct{ from, want string }{{"127.0.0.20", "b"}, {"127.0.0.21", "a"}, {"127.0.0.20", "b"}} {
		if c := mustDial(t, addr, tc.from); c.name != tc.want {
			t.Errorf("TCP from %s reached %s, want %s", tc.from, c.name, tc.want)
		}
	}
	if p.Stats().Forwarded != 1 || alt.Stats().Forwarded != 2 {
		t.Errorf("forwarded p=%d alt=%d, want 1 and 2", p.Stats().Forwarded, alt.Stats().Forwarded)
	}

	ualt := &Proxy{}
	ualt.SetEndpoints([]Endpoint{{Addr: ub}})
	pu := &Proxy{Alt: ualt, UseAlt: isInternal}
	pu.SetEndpoints([]Endpoint{{Addr: ua}})
	uaddr := serveUDP(t, pu, "127.0.0.1")
	for _, tc := range []struct{ from, want string }{{"127.0.0.20", "ub:x"}, {"127.0.0.21", "ua:x"}} {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.from+":0")),
			net.UDPAddrFromAddrPort(netip.MustParseAddrPort(uaddr)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := (&udpClient{c: c}).ask(t, "x", 2*time.Second); got != tc.want {
			t.Errorf("UDP from %s: %q, want %q", tc.from, got, tc.want)
		}
	}
	if pu.UDPSessions() != 1 || ualt.UDPSessions() != 1 {
		t.Errorf("sessions p=%d alt=%d, want 1 and 1", pu.UDPSessions(), ualt.UDPSessions())
	}
	// Alt's endpoint goes: its diverted session ends.
	ualt.SetEndpoints(nil)
	waitFor(t, func() bool { return ualt.UDPSessions() == 0 }, "alt sessions %d after its endpoints went", func() []any { return []any{ualt.UDPSessions()} })
}
