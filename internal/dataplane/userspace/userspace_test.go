package userspace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

// tcpBackend writes its name and a newline on each connection, then echoes.
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
				io.WriteString(c, name+"\n")
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// udpBackend answers each datagram with "name:payload", on the given port
// (0: any).
func udpBackend(t testing.TB, ip, name string, port uint16) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(ip), port)))
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

// freePort returns a port free for TCP and UDP on ip right now.
func freePort(t testing.TB, ip string) uint16 {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "0"))
		ln.Close()
		if err == nil {
			pc.Close()
			if pc2, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(port))); err == nil {
				pc2.Close()
				return uint16(port)
			}
		}
	}
	t.Fatal("no free port")
	return 0
}

type conn struct {
	c    net.Conn
	r    *bufio.Reader
	name string
}

func dialName(addr netip.AddrPort) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, err
	}
	return &conn{c: c, r: r, name: strings.TrimSpace(name)}, nil
}

func (c *conn) echo(msg string) error {
	if _, err := io.WriteString(c.c, msg+"\n"); err != nil {
		return err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != msg {
		return errors.New("echo mismatch: " + got)
	}
	return nil
}

func askUDP(addr netip.AddrPort, msg string, wait time.Duration) string {
	c, err := net.Dial("udp", addr.String())
	if err != nil {
		return ""
	}
	defer c.Close()
	c.Write([]byte(msg))
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func ep(ap netip.AddrPort) model.Endpoint {
	return model.Endpoint{IP: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true}
}

// svc builds a ServicePort with the same endpoints for Cluster traffic.
func svc(name string, proto model.Protocol, vip netip.Addr, port uint16, eps ...model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		Name:             model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: name}, Protocol: proto},
		Type:             model.TypeClusterIP,
		ClusterIPs:       []netip.Addr{vip},
		Port:             port,
		Protocol:         proto,
		Endpoints:        eps,
		ClusterEndpoints: eps,
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestUnprivilegedLoopbackVIP runs the mode as it runs without
// CAP_NET_ADMIN (NoAddrs): a 127.0.0.0/8 VIP is served, a 10.96.0.0/16 VIP
// is reported as unservable, and endpoint changes keep open connections.
func TestUnprivilegedLoopbackVIP(t *testing.T) {
	vip := netip.MustParseAddr("127.77.0.10")
	port := freePort(t, vip.String())
	nodePort := freePort(t, "127.0.0.1")
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	ua := udpBackend(t, "127.0.0.2", "ua", 0)

	var logs syncBuffer
	p, err := New(Options{
		Options: dataplane.Options{
			Logger:            slog.New(slog.NewTextHandler(&logs, nil)),
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		},
		Addrs:      NoAddrs{Reason: "test: unprivileged"},
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Cleanup(context.Background()) })
	ctx := context.Background()
	vipTCP := netip.AddrPortFrom(vip, port)

	web := svc("web", model.TCP, vip, port, ep(a), ep(b))
	// NodePort with externalTrafficPolicy Local: only b is local.
	web.Type, web.NodePort, web.ExternalTrafficPolicy = model.TypeNodePort, nodePort, model.PolicyLocal
	web.LocalEndpoints = []model.Endpoint{ep(b)}
	dns := svc("dns", model.UDP, vip, port, ep(ua))
	far := svc("far", model.TCP, netip.MustParseAddr("10.96.0.10"), 80, ep(a))
	st := &model.State{Ports: []*model.ServicePort{dns, far, web}}
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "10.96.0.10") || !strings.Contains(l, "test: unprivileged") {
		t.Errorf("log does not name the unservable VIP and why:\n%s", l)
	}

	// TCP through the VIP: round robin over a and b.
	var held *conn
	for i, want := range []string{"a", "b", "a"} {
		c, err := dialName(vipTCP)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if c.name != want {
			t.Fatalf("connection %d reached %s, want %s", i, c.name, want)
		}
		if held == nil {
			held = c
			defer c.c.Close()
		} else {
			c.c.Close()
		}
	}
	// The NodePort has externalTrafficPolicy Local, but a client on the
	// node itself is short-circuited to every endpoint, as in kube-proxy.
	// (Outside clients would reach only b; TestBehaviour covers that.)
	seen := map[string]int{}
	for i := range 4 {
		c, err := dialName(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), nodePort))
		if err != nil {
			t.Fatalf("nodeport dial %d: %v", i, err)
		}
		c.c.Close()
		seen[c.name]++
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Errorf("nodeport from the node reached %v, want a and b twice each", seen)
	}
	// UDP on the same VIP and port.
	if got := askUDP(vipTCP, "q", 2*time.Second); got != "ua:q" {
		t.Errorf("udp reply %q, want ua:q", got)
	}

	// Same State again: nothing is reopened.
	before := map[listenKey]*listener{}
	for k, l := range p.listeners {
		before[k] = l
	}
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if len(p.listeners) != len(before) || len(before) != 3 {
		t.Fatalf("listeners %d then %d, want 3", len(before), len(p.listeners))
	}
	for k, l := range p.listeners {
		if before[k] != l {
			t.Errorf("listener %v reopened by an identical Sync", k)
		}
	}

	// Remove a: new connections go to b, the held connection to a lives.
	web2 := *web
	web2.Endpoints, web2.ClusterEndpoints = []model.Endpoint{ep(b)}, []model.Endpoint{ep(b)}
	st2 := &model.State{Ports: []*model.ServicePort{dns, far, &web2}}
	if err := p.Sync(ctx, st2, false); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := dialName(vipTCP)
		if err != nil {
			t.Fatal(err)
		}
		c.c.Close()
		if c.name != "b" {
			t.Fatalf("after removing a, connection %d reached %s", i, c.name)
		}
	}
	if err := held.echo("still there"); err != nil {
		t.Fatalf("held connection to a broken by the endpoint change: %v", err)
	}

	// No endpoints: refused at once by the kernel, held connection lives.
	web3 := web2
	web3.Endpoints, web3.ClusterEndpoints, web3.LocalEndpoints = nil, nil, nil
	if err := p.Sync(ctx, &model.State{Ports: []*model.ServicePort{dns, far, &web3}}, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = net.DialTimeout("tcp", vipTCP.String(), 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial without endpoints: %v, want connection refused", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("refusal took %v", d)
	}
	if err := held.echo("still there"); err != nil {
		t.Fatalf("held connection broken: %v", err)
	}

	// Empty State: every listener closed.
	if err := p.Sync(ctx, &model.State{}, false); err != nil {
		t.Fatal(err)
	}
	if len(p.listeners) != 0 || len(p.groups) != 0 {
		t.Errorf("after empty Sync: %d listeners, %d groups", len(p.listeners), len(p.groups))
	}
	if got := askUDP(vipTCP, "q", 200*time.Millisecond); got != "" {
		t.Errorf("udp still served: %q", got)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
}

// TestListenConflict checks that a port taken by another process fails
// only that listener, with an error naming the Service.
func TestListenConflict(t *testing.T) {
	vip := netip.MustParseAddr("127.77.0.11")
	taken, err := net.Listen("tcp", net.JoinHostPort(vip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tport := uint16(taken.Addr().(*net.TCPAddr).Port)
	free := freePort(t, vip.String())
	a := tcpBackend(t, "127.0.0.2", "a")
	p, err := New(Options{Addrs: NoAddrs{}, LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup(context.Background())
	st := &model.State{Ports: []*model.ServicePort{
		svc("blocked", model.TCP, vip, tport, ep(a)),
		svc("fine", model.TCP, vip, free, ep(a)),
	}}
	err = p.Sync(context.Background(), st, true)
	if err == nil || !strings.Contains(err.Error(), "default/blocked") {
		t.Fatalf("Sync error %v, want one naming default/blocked", err)
	}
	c, err := dialName(netip.AddrPortFrom(vip, free))
	if err != nil {
		t.Fatalf("the other service is not served: %v", err)
	}
	c.c.Close()
}

func TestNewUnknownScheduler(t *testing.T) {
	_, err := New(Options{Options: dataplane.Options{Scheduler: "wlcx"}, Addrs: NoAddrs{}})
	if err == nil || !strings.Contains(err.Error(), "wlcx") {
		t.Fatalf("New = %v, want an error naming wlcx", err)
	}
}

// TestLoadBalancerSourceRanges: the LB IP admits only clients inside the
// ranges; the ClusterIP of the same Service admits everyone.
func TestLoadBalancerSourceRanges(t *testing.T) {
	cip, lbip := netip.MustParseAddr("127.77.0.14"), netip.MustParseAddr("127.77.0.15")
	port := freePort(t, lbip.String())
	a := tcpBackend(t, "127.0.0.2", "a")
	p, err := New(Options{Addrs: NoAddrs{}, LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup(context.Background())
	sp := svc("lb", model.TCP, cip, port, ep(a))
	sp.Type, sp.LoadBalancerIPs = model.TypeLoadBalancer, []netip.Addr{lbip}
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("127.0.0.20/32")}
	if err := p.Sync(context.Background(), &model.State{Ports: []*model.ServicePort{sp}}, true); err != nil {
		t.Fatal(err)
	}
	from := func(src string, to netip.Addr) error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", netip.AddrPortFrom(to, port).String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = bufio.NewReader(c).ReadString('\n')
		return err
	}
	tests := []struct {
		name string
		src  string
		to   netip.Addr
		ok   bool
	}{
		{"lb ip from inside the ranges", "127.0.0.20", lbip, true},
		{"lb ip from outside the ranges", "127.0.0.21", lbip, false},
		{"cluster ip from outside the ranges", "127.0.0.21", cip, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := from(tc.src, tc.to); (err == nil) != tc.ok {
				t.Errorf("from %s to %s: err %v, want ok=%v", tc.src, tc.to, err, tc.ok)
			}
		})
	}
}
