//go:build linux

package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netnstest"
)

// TestNetlinkTableInNetns proves, on a real kernel inside a private network
// namespace, that the Reconciler over a NetlinkTable deletes stale UDP
// entries (DNATed to a removed endpoint, or created before DNAT existed)
// and leaves a still-valid UDP entry and a TCP entry alone.
func TestNetlinkTableInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables, conntrack)")
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	ns := newNetns(t)
	run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	for _, a := range []string{"10.0.0.1/32", "10.0.0.2/32", "10.0.0.9/32"} {
		run(t, "ip", "netns", "exec", ns, "ip", "addr", "add", a, "dev", "lo")
	}
	// The service range is local so output routing succeeds; 10.96.0.12 has
	// no DNAT rule and is answered by a local socket (a Service that had no
	// endpoints when its flow started).
	run(t, "ip", "netns", "exec", ns, "ip", "route", "add", "local", "10.96.0.0/24", "dev", "lo")
	nftRules := `table ip vpct_test {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.10 udp dport 53 dnat to 10.0.0.1:5353
		ip daddr 10.96.0.11 udp dport 53 dnat to 10.0.0.2:5353
		ip daddr 10.96.0.10 tcp dport 53 dnat to 10.0.0.1:5353
	}
}
`
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(nftRules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}

	// Sockets are bound to the namespace they are created in.
	var (
		udp1, udp2, udpVIP, cStale, cValid, cFresh *net.UDPConn
		tcpLn                                      *net.TCPListener
		tcpConn                                    net.Conn
	)
	inNetns(t, ns, func() error {
		var err error
		listenUDP := func(s string) *net.UDPConn {
			c, e := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)))
			if e != nil && err == nil {
				err = e
			}
			return c
		}
		udp1 = listenUDP("10.0.0.1:5353")
		udp2 = listenUDP("10.0.0.2:5353")
		udpVIP = listenUDP("10.96.0.12:53")
		cStale = listenUDP("10.0.0.9:40001")
		cValid = listenUDP("10.0.0.9:40002")
		cFresh = listenUDP("10.0.0.9:40004")
		if err != nil {
			return err
		}
		tcpLn, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.1:5353")))
		if err != nil {
			return err
		}
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.9:40003"))}
		tcpConn, err = d.Dial("tcp4", "10.96.0.10:53")
		return err
	})
	for _, c := range []interface{ Close() error }{udp1, udp2, udpVIP, cStale, cValid, cFresh, tcpLn, tcpConn} {
		t.Cleanup(func() { c.Close() })
	}
	send := func(c *net.UDPConn, to string, srv *net.UDPConn) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort([]byte("ping"), netip.MustParseAddrPort(to)); err != nil {
			t.Fatalf("send to %s: %v", to, err)
		}
		srv.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 16)
		if _, _, err := srv.ReadFromUDPAddrPort(buf); err != nil {
			t.Fatalf("%s never arrived at %s: %v", to, srv.LocalAddr(), err)
		}
	}
	send(cStale, "10.96.0.10:53", udp1) // DNATed to 10.0.0.1, which the State drops
	send(cValid, "10.96.0.11:53", udp2) // DNATed to 10.0.0.2, still an endpoint
	send(cFresh, "10.96.0.12:53", udpVIP)

	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("open netns %s: %v", ns, err)
	}
	defer h.Close()
	table, err := NewNetlinkTableAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()

	type key struct {
		proto uint8
		src   string
	}
	find := func() map[key]Flow {
		t.Helper()
		flows, err := table.List(model.IPv4)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		got := map[key]Flow{}
		for _, f := range flows {
			if f.OrigSrc.Addr() == netip.MustParseAddr("10.0.0.9") {
				got[key{f.Protocol, f.OrigSrc.String()}] = f
			}
		}
		return got
	}
	staleK := key{ProtoUDP, "10.0.0.9:40001"}
	validK := key{ProtoUDP, "10.0.0.9:40002"}
	tcpK := key{ProtoTCP, "10.0.0.9:40003"}
	freshK := key{ProtoUDP, "10.0.0.9:40004"}
	before := find()
	for _, k := range []key{staleK, validK, tcpK, freshK} {
		if _, ok := before[k]; !ok {
			t.Fatalf("no conntrack entry for %v before cleanup; have %v", k, before)
		}
	}
	if f := before[staleK]; f.ReplySrc != netip.MustParseAddrPort("10.0.0.1:5353") || f.OrigDst != netip.MustParseAddrPort("10.96.0.10:53") {
		t.Fatalf("stale flow not DNATed as expected: %v", f)
	}
	if f := before[freshK]; f.ReplySrc != f.OrigDst {
		t.Fatalf("un-NATed flow has reply source %v", f.ReplySrc)
	}

	// Desired state: 10.0.0.1 was replaced by 10.0.0.2 everywhere.
	ep2 := model.Endpoint{IP: netip.MustParseAddr("10.0.0.2"), Port: 5353, Ready: true, Serving: true}
	mk := func(name string, proto model.Protocol, vip string) *model.ServicePort {
		return &model.ServicePort{
			Name:       model.ServicePortName{ServiceName: model.ServiceName{Namespace: "t", Name: name}, Protocol: proto},
			Protocol:   proto,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)},
			Port:       53,
			Endpoints:  []model.Endpoint{ep2},
		}
	}
	st := &model.State{Ports: []*model.ServicePort{
		mk("dns", model.UDP, "10.96.0.10"),
		mk("dns", model.TCP, "10.96.0.10"),
		mk("dns2", model.UDP, "10.96.0.11"),
		mk("fresh", model.UDP, "10.96.0.12"),
	}}
	deleted0 := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4"))
	r := &Reconciler{Table: table}
	if err := r.Reconcile(context.Background(), st); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	after := find()
	if f, ok := after[staleK]; ok {
		t.Errorf("stale entry survived: %v", f)
	}
	if f, ok := after[freshK]; ok {
		t.Errorf("entry created before DNAT survived: %v", f)
	}
	if _, ok := after[validK]; !ok {
		t.Errorf("valid UDP entry deleted")
	}
	if _, ok := after[tcpK]; !ok {
		t.Errorf("TCP entry deleted")
	}
	if d := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4")) - deleted0; d < 2 {
		t.Errorf("deleted_entries{ip_family=4} grew by %v, want >= 2", d)
	}

	// The fixed-port client now reaches the new endpoint: a fresh entry is
	// DNATed by the current rules (pointing 10.96.0.10 at 10.0.0.2 here).
	cmd = exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("flush chain ip vpct_test out\nadd rule ip vpct_test out ip daddr 10.96.0.10 udp dport 53 dnat to 10.0.0.2:5353\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	send(cStale, "10.96.0.10:53", udp2)
	if f, ok := find()[staleK]; !ok || f.ReplySrc != netip.MustParseAddrPort("10.0.0.2:5353") {
		t.Errorf("after cleanup the client's new entry is %v (present %v), want DNAT to 10.0.0.2:5353", f, ok)
	}
	// Second round: nothing left to delete.
	deleted1 := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4"))
	if err := r.Reconcile(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if d := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv4")) - deleted1; d != 0 {
		t.Errorf("second round deleted %v entries, want 0", d)
	}
}

// newNetns creates a network namespace named vpct-<pid>-<n> and removes it
// when the test ends.
func newNetns(t *testing.T) string {
	t.Helper()
	return netnstest.New(t, "vpct")
}

func run(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs fn on an OS thread switched into namespace name. If the
// thread cannot be switched back it is never unlocked, so the runtime
// discards it rather than reuse it in the wrong namespace.
func inNetns(t *testing.T, name string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leave netns %s: %w", name, err)
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestNetlinkTableInNetnsIPv6 is the IPv6 half: a stale entry DNATed to a
// removed endpoint goes, a valid one stays, and the IPv6 counter moves.
func TestNetlinkTableInNetnsIPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables, conntrack)")
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	ns := newNetns(t)
	run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	for _, a := range []string{"fd00::1/128", "fd00::2/128", "fd00::9/128"} {
		run(t, "ip", "netns", "exec", ns, "ip", "-6", "addr", "add", a, "dev", "lo", "nodad")
	}
	run(t, "ip", "netns", "exec", ns, "ip", "-6", "route", "add", "local", "fd00:96::/120", "dev", "lo")
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`table ip6 vpct_test {
	chain out {
		type nat hook output priority -100; policy accept;
		ip6 daddr fd00:96::10 udp dport 53 dnat to [fd00::1]:5353
		ip6 daddr fd00:96::11 udp dport 53 dnat to [fd00::2]:5353
	}
}
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	var srv1, srv2, cStale, cValid *net.UDPConn
	inNetns(t, ns, func() error {
		var err error
		listen := func(s string) *net.UDPConn {
			c, e := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)))
			if e != nil && err == nil {
				err = e
			}
			return c
		}
		srv1, srv2 = listen("[fd00::1]:5353"), listen("[fd00::2]:5353")
		cStale, cValid = listen("[fd00::9]:40001"), listen("[fd00::9]:40002")
		return err
	})
	for _, c := range []*net.UDPConn{srv1, srv2, cStale, cValid} {
		t.Cleanup(func() { c.Close() })
	}
	for _, p := range []struct {
		c, srv *net.UDPConn
		to     string
	}{{cStale, srv1, "[fd00:96::10]:53"}, {cValid, srv2, "[fd00:96::11]:53"}} {
		if _, err := p.c.WriteToUDPAddrPort([]byte("ping"), netip.MustParseAddrPort(p.to)); err != nil {
			t.Fatalf("send to %s: %v", p.to, err)
		}
		p.srv.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, _, err := p.srv.ReadFromUDPAddrPort(make([]byte, 16)); err != nil {
			t.Fatalf("%s never arrived: %v", p.to, err)
		}
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	table, err := NewNetlinkTableAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	srcs := func() map[string]Flow {
		flows, err := table.List(model.IPv6)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		m := map[string]Flow{}
		for _, f := range flows {
			if f.Protocol == ProtoUDP {
				m[f.OrigSrc.String()] = f
			}
		}
		return m
	}
	before := srcs()
	if f, ok := before["[fd00::9]:40001"]; !ok || f.ReplySrc != netip.MustParseAddrPort("[fd00::1]:5353") || f.Family != model.IPv6 {
		t.Fatalf("stale IPv6 entry missing or not DNATed: %v (present %v); all %v", f, ok, before)
	}
	if _, ok := before["[fd00::9]:40002"]; !ok {
		t.Fatalf("valid IPv6 entry missing: %v", before)
	}
	ep2 := model.Endpoint{IP: netip.MustParseAddr("fd00::2"), Port: 5353, Ready: true, Serving: true}
	mk := func(name, vip string) *model.ServicePort {
		return &model.ServicePort{
			Name:       model.ServicePortName{ServiceName: model.ServiceName{Namespace: "t", Name: name}, Protocol: model.UDP},
			Protocol:   model.UDP,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)},
			Port:       53,
			Endpoints:  []model.Endpoint{ep2},
		}
	}
	st := &model.State{Ports: []*model.ServicePort{mk("a", "fd00:96::10"), mk("b", "fd00:96::11")}}
	deleted0 := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv6"))
	if err := (&Reconciler{Table: table}).Reconcile(context.Background(), st); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	after := srcs()
	if f, ok := after["[fd00::9]:40001"]; ok {
		t.Errorf("stale IPv6 entry survived: %v", f)
	}
	if _, ok := after["[fd00::9]:40002"]; !ok {
		t.Errorf("valid IPv6 entry deleted")
	}
	if d := counterValue(t, metrics.ConntrackDeletedEntries.WithLabelValues("IPv6")) - deleted0; d != 1 {
		t.Errorf("deleted_entries{ip_family=6} grew by %v, want 1", d)
	}
}
