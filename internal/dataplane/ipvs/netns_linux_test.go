//go:build linux

package ipvs

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netnstest"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// newNetns creates the network namespace "vpipvs-<pid>-<n>" with lo up,
// removed when the test ends (even on failure), or skips the test when not
// root or a tool is missing.
func newNetns(t *testing.T) string {
	t.Helper()
	name := netnstest.New(t, "vpipvs", "ipset", "iptables-restore", "ip6tables-restore")
	nsRun(t, name, "ip", "link", "set", "lo", "up")
	return name
}

func nsRun(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNetns runs f on a goroutine whose OS thread is in network namespace
// ns. The thread is never switched back: it ends with the goroutine
// (runtime.LockOSThread without unlock), so no other goroutine ever runs
// in ns and the test process's own namespace is never changed.
func inNetns(t *testing.T, ns string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			t.Errorf("open netns %s: %v", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			t.Errorf("enter netns %s: %v", ns, err)
			return
		}
		f()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("netns work did not finish in 60s")
	}
}

func prefix(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// TestNetnsFallback: on this kernel (no IPVS), New with the real
// boundaries inside a private namespace falls back to iptables with one
// warning and the metric, and the returned dataplane programs iptables
// rules in that namespace.
func TestNetnsFallback(t *testing.T) {
	ns := newNetns(t)
	if _, err := exec.Command("modinfo", "ip_vs").CombinedOutput(); err == nil {
		t.Log("note: an ip_vs module exists on this machine; the test still checks Mode() against OpenNetlink")
	}
	var logs bytes.Buffer
	opts := dataplane.Options{
		NodeName: "node-a", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.10")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	}
	run := &iptables.Exec{Prefix: prefix(ns)}
	before := fallbacks(t)
	var (
		dp      dataplane.Dataplane
		err     error
		openErr error
	)
	inNetns(t, ns, func() {
		_, openErr = OpenNetlink()
		dp, err = New(Options{Options: opts, IPSet: &ipset.Exec{Prefix: prefix(ns)}, Runner: run,
			IPTables: iptables.Options{Runner: run, Families: []iptables.Family{iptables.IPv4},
				Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if openErr == nil {
		t.Skip("this kernel has IPVS; the fallback cannot be shown here")
	}
	if !errors.Is(openErr, ErrNoIPVS) {
		t.Errorf("OpenNetlink error %v does not wrap ErrNoIPVS", openErr)
	}
	if dp.Mode() != "iptables" {
		t.Fatalf("Mode() = %q, want iptables", dp.Mode())
	}
	warns := warnings(logs.String())
	if len(warns) != 1 || !strings.Contains(warns[0], "no IPVS netlink family") || !strings.Contains(warns[0], "falling back to iptables") {
		t.Fatalf("want one warning naming the missing IPVS family, got:\n%s", logs.String())
	}
	if strings.Contains(warns[0], "ipset") {
		t.Errorf("ipset works in the namespace but the warning names it: %s", warns[0])
	}
	if got := fallbacks(t) - before; got != 1 {
		t.Errorf("fallback metric rose by %v, want 1", got)
	}
	if names := nsRun(t, ns, "ipset", "list", "-n"); strings.TrimSpace(names) != "" {
		t.Errorf("probe left ipsets: %q", names)
	}

	sp := dataplanetest.Port("default/web", "", model.TCP, 80, "10.96.0.10")
	sp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.1.9", 8080, true)}
	dataplanetest.Fill(sp)
	if err := dp.Sync(ctx, dataplanetest.NewState(sp), true); err != nil {
		t.Fatalf("Sync of the fallback: %v", err)
	}
	save := nsRun(t, ns, "iptables-save", "-t", "nat")
	for _, s := range []string{"-d 10.96.0.10/32", "--to-destination 10.1.1.9:8080"} {
		if !strings.Contains(save, s) {
			t.Errorf("nat table in the namespace lacks %q:\n%s", s, save)
		}
	}
	if err := dp.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if save := nsRun(t, ns, "iptables-save", "-t", "nat"); strings.Contains(save, "10.96.0.10") {
		t.Errorf("rules left after Cleanup:\n%s", save)
	}
}

// TestNetnsRulesAndVIPs runs the IPVS proxier with a fake IPVS kernel but
// real ipset, iptables-restore, ip6tables-restore and VIP binding inside a
// private namespace: the real tools accept every set and rule, a partial
// sync changes set members only, the filter rules reject a host service
// on a VIP (an "sshd" on VIP:22) while the Service port stays open, and
// Cleanup leaves nothing.
func TestNetnsRulesAndVIPs(t *testing.T) {
	ns := newNetns(t)
	run := &iptables.Exec{Prefix: prefix(ns)}
	sets := &ipset.Exec{Prefix: prefix(ns)}
	kernel := &FakeKernel{}
	addrs := &LinkAddrs{}
	o := Options{Options: dataplanetest.BaseOptions(), Kernel: kernel, IPSet: sets, Runner: run, Addrs: addrs, Sysctl: FakeSysctl()}
	var logs bytes.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))

	lb := dataplanetest.Port("default/lb", "", model.TCP, 443, "10.96.0.50", "fd00:96::50")
	lb.Type = model.TypeLoadBalancer
	lb.NodePort = 30443
	lb.LoadBalancerIPs = addrsOf("203.0.113.60")
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	lb.ExternalIPs = addrsOf("192.168.5.6")
	lb.ExternalTrafficPolicy = model.PolicyLocal
	lb.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.1.9", 8443, true), dataplanetest.EP("fd00:10:1:1::9", 8443, true)}
	dataplanetest.Fill(lb)
	web := dataplanetest.Port("default/web", "", model.TCP, 80, "10.96.0.10")
	web.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.1.9", 8080, true)}
	dataplanetest.Fill(web)
	udp := dataplanetest.Port("default/dns", "", model.UDP, 53, "10.96.0.53")
	dataplanetest.Fill(udp)

	var p *Proxier
	var err error
	inNetns(t, ns, func() {
		if p, err = NewProxier(o); err != nil {
			return
		}
		err = p.Sync(ctx, dataplanetest.NewState(lb, web, udp), false)
	})
	if err != nil {
		t.Fatalf("first Sync against the real tools: %v", err)
	}
	if addrs.Interface() != "lo" {
		t.Logf("VIPs bound to %s (this kernel has dummy interfaces)", addrs.Interface())
	}
	for set, member := range map[string]string{
		"VIPVS-CLUSTER-IP":     "10.96.0.10,tcp:80",
		"VIPVS-LB-SRC":         "203.0.113.60,tcp:443,198.51.100.0/24",
		"VIPVS6-CLUSTER-IP":    "fd00:96::50,tcp:443",
		"VIPVS-EXTERNAL-LOCAL": "192.168.5.6,tcp:443",
		"VIPVS-NO-EP-REJECT":   "10.96.0.53,udp:53",
		"VIPVS-LOOP-BACK":      "10.1.1.9,tcp:8080,10.1.1.9",
	} {
		if out := nsRun(t, ns, "ipset", "list", set); !strings.Contains(out, member) {
			t.Errorf("set %s lacks %s:\n%s", set, member, out)
		}
	}
	addrOut := nsRun(t, ns, "ip", "addr", "show")
	for _, a := range []string{"10.96.0.10/32", "fd00:96::50/128", "203.0.113.60/32"} {
		if !strings.Contains(addrOut, a) {
			t.Errorf("VIP %s not bound:\n%s", a, addrOut)
		}
	}

	// Real traffic: a host service on VIP:22 is refused, the Service port
	// (no IPVS here, so a local listener stands in for it) is reachable.
	inNetns(t, ns, func() {
		for _, tc := range []struct {
			addr   string
			reject bool
		}{{"10.96.0.10:22", true}, {"10.96.0.10:80", false}, {"[fd00:96::50]:22", true}, {"[fd00:96::50]:443", false}} {
			l, lerr := net.Listen("tcp", tc.addr)
			if lerr != nil {
				t.Errorf("listen: %v", lerr)
				continue
			}
			c, derr := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
			l.Close()
			if c != nil {
				c.Close()
			}
			switch {
			case tc.reject && derr == nil:
				t.Errorf("%s was reachable; the unknown-port rule did not reject it", tc.addr)
			case tc.reject && !errors.Is(derr, syscall.ECONNREFUSED):
				t.Errorf("%s: %v, want connection refused (REJECT)", tc.addr, derr)
			case !tc.reject && derr != nil:
				t.Errorf("Service port %s refused: %v", tc.addr, derr)
			}
		}
	})

	// Partial sync: one endpoint more; the rules stay, the set changes.
	rulesBefore := nsRun(t, ns, "iptables-save", "-t", "filter")
	// A new port: ports given to a dataplane are read-only.
	web2 := *web
	web2.Endpoints = append(slices.Clone(web.Endpoints), dataplanetest.EP("10.1.2.9", 8080, false))
	dataplanetest.Fill(&web2)
	inNetns(t, ns, func() { err = p.Sync(ctx, dataplanetest.NewState(lb, &web2, udp), false) })
	if err != nil {
		t.Fatalf("partial Sync: %v", err)
	}
	if out := nsRun(t, ns, "ipset", "list", "VIPVS-LOOP-BACK"); !strings.Contains(out, "10.1.2.9,tcp:8080,10.1.2.9") {
		t.Errorf("partial sync did not add the member:\n%s", out)
	}
	if after := nsRun(t, ns, "iptables-save", "-t", "filter"); stripCounters(after) != stripCounters(rulesBefore) {
		t.Errorf("partial sync changed iptables rules")
	}
	if strings.Contains(logs.String(), "full sync") {
		t.Errorf("the partial sync became full (canary check against real iptables):\n%s", logs.String())
	}
	// Flushing the filter chains makes the next partial sync full.
	nsRun(t, ns, "iptables", "-F", "INPUT")
	nsRun(t, ns, "iptables", "-F", chainFilter)
	nsRun(t, ns, "iptables", "-X", chainFilter)
	inNetns(t, ns, func() { err = p.Sync(ctx, dataplanetest.NewState(lb, web, udp), false) })
	if err != nil {
		t.Fatalf("Sync after flush: %v", err)
	}
	if out := nsRun(t, ns, "iptables-save", "-t", "filter"); !strings.Contains(out, "-A INPUT -m comment --comment vipproxy-ipvs -j VIPVS-FILTER") {
		t.Errorf("flushed rules not restored:\n%s", out)
	}
	// A full sync keeps one jump per built-in chain.
	inNetns(t, ns, func() { err = p.Sync(ctx, dataplanetest.NewState(lb, web, udp), true) })
	if err != nil {
		t.Fatalf("full Sync: %v", err)
	}
	if n := strings.Count(nsRun(t, ns, "iptables-save", "-t", "nat"), "-j VIPVS-SERVICES"); n != 2 {
		t.Errorf("%d jumps to VIPVS-SERVICES, want 2 (PREROUTING, OUTPUT)", n)
	}

	inNetns(t, ns, func() { err = p.Cleanup(ctx) })
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if out := nsRun(t, ns, "ipset", "list", "-n"); strings.TrimSpace(out) != "" {
		t.Errorf("sets left: %s", out)
	}
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		if out := nsRun(t, ns, bin); strings.Contains(out, "VIPVS") {
			t.Errorf("%s: rules left:\n%s", bin, out)
		}
	}
	if out := nsRun(t, ns, "ip", "addr", "show"); strings.Contains(out, "10.96.0.10") || strings.Contains(out, "fd00:96::50") || strings.Contains(out, LoLabel) {
		t.Errorf("VIPs left:\n%s", out)
	}
}

func addrsOf(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// stripCounters drops iptables-save comment lines and [packets:bytes].
func stripCounters(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.Index(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
			l = l[:i]
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// TestNetnsSetsPastDefaultMaxElem: 7,000 Services × 10 endpoints put
// 70,000 members in the hairpin set (LOOP-BACK), past ipset's default
// maxelem of 65,536, over sets a previous release created with that
// default: the full sync replaces them (swap) and every member is in.
func TestNetnsSetsPastDefaultMaxElem(t *testing.T) {
	ns := newNetns(t)
	sets := &ipset.Exec{Prefix: prefix(ns)}
	old := "create " + setName(iptables.IPv4, setLoopBack) + " hash:ip,port,ip family inet\n" +
		"create " + setName(iptables.IPv4, setClusterIP) + " hash:ip,port family inet\n"
	if err := sets.Restore(ctx, []byte(old)); err != nil {
		t.Fatal(err)
	}
	b := &bed{kernel: &FakeKernel{}, sets: nil, ipt: iptables.NewFake(), addrs: &FakeAddrs{}, sysctl: FakeSysctl(), logs: &bytes.Buffer{}}
	p := b.newProxier(t, func(o *Options) { o.IPSet = sets; o.Families = []iptables.Family{iptables.IPv4} })
	var ports []*model.ServicePort
	for i := 0; i < 7000; i++ {
		sp := dataplanetest.Port(fmt.Sprintf("ns/s%05d", i), "", model.TCP, 80, netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String())
		for j := 0; j < 10; j++ {
			sp.Endpoints = append(sp.Endpoints, dataplanetest.EP(netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i >> 8), byte(i)}).String(), 8080, true))
		}
		ports = append(ports, dataplanetest.Fill(sp))
	}
	if err := p.Sync(ctx, dataplanetest.NewState(ports...), true); err != nil {
		t.Fatal(err)
	}
	out := nsRun(t, ns, "ipset", "list", "-t", setName(iptables.IPv4, setLoopBack))
	if !strings.Contains(out, "Number of entries: 70000") || !strings.Contains(out, fmt.Sprintf("maxelem %d", ipset.MaxElem)) {
		t.Errorf("hairpin set after the full sync:\n%s", out)
	}
}
