package ipvs

// Tests of the proxier across syncs: sequences, failures, flushes, adopting
// the kernel's state, cleanup.

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestFullSyncAdoptsKernel: a new Proxier deletes stale virtual servers
// on its own addresses and leaves others' alone.
func TestFullSyncAdoptsKernel(t *testing.T) {
	b := newBed(t, func(o *Options) { o.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.200.0/24")} })
	mustOK := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	stale := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.77"), Port: 80, Protocol: model.TCP}, Scheduler: "rr"}
	foreign := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("172.20.0.1"), Port: 80, Protocol: model.TCP}, Scheduler: "wlc"}
	excl := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.200.1"), Port: 80, Protocol: model.TCP}, Scheduler: "rr"}
	staleNP := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("192.168.0.10"), Port: 31000, Protocol: model.TCP}, Scheduler: "rr"}
	for _, vs := range []VirtualServer{stale, foreign, excl, staleNP} {
		mustOK(b.kernel.AddService(vs))
	}
	mustOK(b.kernel.AddDest(stale.ServiceKey, RealServer{Addr: netip.MustParseAddr("10.1.1.1"), Port: 1, Weight: 1}))
	// The web VS exists with a wrong real server and the wrong scheduler.
	webVS := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: model.TCP}, Scheduler: "lc"}
	mustOK(b.kernel.AddService(webVS))
	mustOK(b.kernel.AddDest(webVS.ServiceKey, RealServer{Addr: netip.MustParseAddr("10.1.1.9"), Port: 8080, Weight: 1}))
	mustOK(b.kernel.AddDest(webVS.ServiceKey, RealServer{Addr: netip.MustParseAddr("10.1.9.9"), Port: 8080, Weight: 1}))
	b.kernel.SetConns(webVS.ServiceKey, netip.MustParseAddrPort("10.1.9.9:8080"), 2, 0) // draining
	for _, a := range addrs("10.96.0.77", "10.96.0.10", "10.96.200.1") {
		mustOK(b.addrs.Add(a))
	}
	b.clear()
	b.sync(t, state(web()), false)
	want(t, "kernel", lines(b.kernel.Dump()), []string{
		"TCP/10.96.0.10:80 rr",
		"  -> 10.1.1.9:8080 w1",
		"  -> 10.1.2.9:8080 w1",
		"  -> 10.1.9.9:8080 w0",
		"TCP/10.96.200.1:80 rr",
		"TCP/172.20.0.1:80 wlc",
	})
	got, _ := b.addrs.List()
	want(t, "bound VIPs", got, addrs("10.96.0.10"))
}

// TestSequence applies A, B, A and compares everything with a cold start
// of A: no leftovers in IPVS, ipsets, iptables or addresses.
func TestSequence(t *testing.T) {
	lb := port("default/lb", "", model.TCP, 443, "10.96.0.50", "fd00:96::50")
	lb.Type = model.TypeLoadBalancer
	lb.NodePort = 30443
	lb.LoadBalancerIPs = addrs("203.0.113.60")
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	lb.ExternalIPs = addrs("192.168.5.6")
	lb.Endpoints = []model.Endpoint{ep("10.1.1.9", 8443, true), ep("fd00:10:1:1::9", 8443, true)}
	fill(lb)
	a := state(web(), lb)
	w2 := web()
	w2.Endpoints = []model.Endpoint{ep("10.1.5.5", 9090, false)}
	w2.AffinityTimeoutSeconds = 60
	fill(w2)
	bst := state(w2, fill(port("default/udp", "", model.UDP, 53, "10.96.0.53")))

	dump := func(b *bed) string {
		got, _ := b.addrs.List()
		var as []string
		for _, a := range got {
			as = append(as, a.String())
		}
		return b.kernel.Dump() + "\n" + b.sets.Dump() + "\n" + b.ipt.Dump(iptables.IPv4, "nat", "filter") + b.ipt.Dump(iptables.IPv6, "nat", "filter") + "\n" + strings.Join(as, " ")
	}
	cold := newBed(t, nil)
	cold.sync(t, a, false)

	seq := newBed(t, nil)
	for i, st := range []*model.State{a, bst, a, bst, a} {
		seq.sync(t, st, i == 3) // one full sync in the middle
	}
	if d := cmp.Diff(dump(cold), dump(seq)); d != "" {
		t.Errorf("A,B,A,B,A differs from a cold start of A (-cold +seq):\n%s", d)
	}
}

func TestCleanup(t *testing.T) {
	b := newBed(t, nil)
	foreign := VirtualServer{ServiceKey: ServiceKey{Addr: netip.MustParseAddr("172.20.0.1"), Port: 80, Protocol: model.TCP}, Scheduler: "rr"}
	if err := b.kernel.AddService(foreign); err != nil {
		t.Fatal(err)
	}
	if err := b.sets.Restore(ctx, []byte("create OTHER hash:ip family inet\n")); err != nil {
		t.Fatal(err)
	}
	sp := web()
	sp.NodePort = 30080
	sp.Type = model.TypeNodePort
	b.sync(t, state(sp), false)
	localAddrs := func() ([]netip.Addr, error) { return addrs("127.0.0.1", "192.168.0.10", "fd00:192::10"), nil }
	// Leftover removal (no FlushLocal, no NodeIPs known): the VIP's
	// virtual server goes, the NodePort ones on the node's addresses stay.
	if err := Cleanup(ctx, Options{Kernel: b.kernel, IPSet: b.sets, Runner: b.ipt, Addrs: b.addrs, Sysctl: b.sysctl, LocalAddrs: localAddrs}); err != nil {
		t.Fatal(err)
	}
	want(t, "kernel after leftover removal", lines(b.kernel.Dump()), []string{"TCP/172.20.0.1:80 rr", "TCP/192.168.0.10:30080 rr",
		"  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1"})
	// A fresh process (--cleanup) knows nothing but the local addresses.
	err := Cleanup(ctx, Options{Kernel: b.kernel, IPSet: b.sets, Runner: b.ipt, Addrs: b.addrs, Sysctl: b.sysctl, FlushLocal: true, LocalAddrs: localAddrs})
	if err != nil {
		t.Fatal(err)
	}
	want(t, "kernel", lines(b.kernel.Dump()), []string{"TCP/172.20.0.1:80 rr"})
	names, _ := b.sets.List(ctx)
	want(t, "sets", names, []string{"OTHER"})
	got, _ := b.addrs.List()
	want(t, "addresses", len(got), 0)
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if d := b.ipt.Dump(fam, "nat", "filter"); strings.Contains(d, "VIPVS") {
			t.Errorf("%v: VIPVS rules left:\n%s", fam, d)
		}
	}
	saves := b.ipt.Calls["save"]
	if err := Cleanup(ctx, Options{Kernel: b.kernel, IPSet: b.sets, Runner: b.ipt, Addrs: b.addrs, Sysctl: b.sysctl,
		LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	// Nothing of ours left: no table is saved (a big iptables-mode table
	// takes seconds to save).
	if n := b.ipt.Calls["save"] - saves; n != 0 {
		t.Errorf("second Cleanup saved %d tables, want 0", n)
	}
}

func TestSyncFailureMakesNextFull(t *testing.T) {
	b := newBed(t, nil)
	b.sync(t, state(web()), false)
	fails := 1
	b.kernel.Fail = func(call string) error {
		if call == "AddDest" && fails > 0 {
			fails--
			return errors.New("injected")
		}
		return nil
	}
	w := web()
	w.Endpoints = append(w.Endpoints, ep("10.1.3.9", 8080, false))
	fill(w)
	b.clear()
	if err := b.p.Sync(ctx, state(w), false); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Sync error %v, want the injected one", err)
	}
	// The next partial sync is full: ipsets swapped, iptables rewritten.
	b.sync(t, state(w), false)
	want(t, "kernel calls", b.kernel.Calls(), []string{"AddDest TCP/10.96.0.10:80 10.1.3.9:8080 w1"})
	if s := strings.Join(b.sets.Scripts(), ""); !strings.Contains(s, "swap VIPVS-T-CLUSTER-IP VIPVS-CLUSTER-IP") {
		t.Errorf("no full ipset rewrite after a failure:\n%s", s)
	}
	if len(b.ipt.Restores) == 0 {
		t.Error("iptables not rewritten after a failure")
	}
	want(t, "kernel", lines(b.kernel.Dump()), []string{"TCP/10.96.0.10:80 rr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1", "  -> 10.1.3.9:8080 w1"})
}

// TestFlushedRulesTriggerFullSync: a partial sync notices that the
// iptables chains are gone and rewrites everything.
func TestFlushedRulesTriggerFullSync(t *testing.T) {
	b := newBed(t, func(o *Options) { o.Families = []iptables.Family{iptables.IPv4} })
	b.sync(t, state(web()), false)
	saved, err := b.ipt.Save(ctx, iptables.IPv4, "filter")
	if err != nil {
		t.Fatal(err)
	}
	if in := cleanupInput("filter", saved); in == nil {
		t.Fatal("no rules to remove")
	} else if err := b.ipt.Restore(ctx, iptables.IPv4, "filter", in); err != nil {
		t.Fatal(err)
	}
	b.clear()
	b.sync(t, state(web()), false)
	if !strings.Contains(b.ipt.Dump(iptables.IPv4, "filter"), "-A INPUT -m comment --comment vipproxy-ipvs -j VIPVS-FILTER") {
		t.Errorf("filter rules not restored:\n%s", b.ipt.Dump(iptables.IPv4, "filter"))
	}
	if !strings.Contains(b.logs.String(), "doing a full sync") {
		t.Errorf("no warning about the full sync:\n%s", b.logs.String())
	}
	// And the next partial sync is quiet again.
	b.clear()
	b.sync(t, state(web()), false)
	want(t, "iptables restores", len(b.ipt.Restores), 0)
}

// TestNodePortAddressesChange: a full sync that finds other local
// addresses moves the NodePort virtual servers (cached fragments of the
// old addresses are not reused).
func TestNodePortAddressesChange(t *testing.T) {
	local := addrs("10.250.0.1")
	b := newBed(t, func(o *Options) {
		o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}
		o.LocalAddrs = func() ([]netip.Addr, error) { return local, nil }
		o.Families = []iptables.Family{iptables.IPv4}
	})
	sp := web()
	sp.Type, sp.NodePort = model.TypeNodePort, 30080
	b.sync(t, state(sp), false)
	local = addrs("10.250.0.2")
	b.sync(t, state(sp), false) // partial: addresses are read on full syncs only
	want(t, "set after partial", b.sets.Members("VIPVS-NODE-PORT"), []string{"10.250.0.1,tcp:30080"})
	b.sync(t, state(sp), true)
	want(t, "kernel", lines(b.kernel.Dump()), []string{
		"TCP/10.96.0.10:80 rr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1",
		"TCP/10.250.0.2:30080 rr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1",
	})
	want(t, "set after full", b.sets.Members("VIPVS-NODE-PORT"), []string{"10.250.0.2,tcp:30080"})
}
