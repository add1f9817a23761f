package iptables

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.golden from the current output")

var ctx = context.Background()

// dumpAll returns the nat and filter tables of both families.
func dumpAll(f *Fake) string {
	return "# ipv4\n" + f.Dump(IPv4, TableNAT, TableFilter) + "# ipv6\n" + f.Dump(IPv6, TableNAT, TableFilter)
}

// dumpSets returns dumpAll and p's hairpin sets.
func dumpSets(p *Proxier, f *Fake) string {
	return dumpAll(f) + "# ipsets\n" + fakeSets(p).Dump()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to create)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

// TestGolden programs each behaviour scenario on a cold fake and compares
// the iptables-save dump, with the hairpin sets, with
// testdata/<scenario>.golden, and in kube-proxy's layout (no ipset) with
// testdata/chain-per-endpoint/<scenario>.golden.
func TestGolden(t *testing.T) {
	for _, sc := range dataplanetest.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			p, f := newFakeProxier(t, sc.Opts())
			if err := p.Sync(ctx, sc.State(), true); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, sc.Name, dumpSets(p, f))
			p, f = newFakeProxierLayout(t, sc.Opts(), false)
			if err := p.Sync(ctx, sc.State(), true); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("chain-per-endpoint", sc.Name), dumpAll(f))
		})
	}
}

// TestStateSequence applies every scenario's State in turn with partial
// syncs (forwards, then backwards) and checks that after each step the
// dump equals a cold start of that State: nothing is left behind.
func TestStateSequence(t *testing.T) {
	scs := dataplanetest.Scenarios()
	cold := map[string]string{}
	for _, sc := range scs {
		p, f := newFakeProxier(t, dataplanetest.BaseOptions())
		if err := p.Sync(ctx, sc.State(), true); err != nil {
			t.Fatal(err)
		}
		cold[sc.Name] = dumpSets(p, f)
	}
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	order := append([]dataplanetest.Scenario(nil), scs...)
	for i := len(scs) - 2; i >= 0; i-- {
		order = append(order, scs[i])
	}
	for i, sc := range order {
		if err := p.Sync(ctx, sc.State(), i == 0); err != nil {
			t.Fatalf("step %d (%s): %v", i, sc.Name, err)
		}
		if diff := cmp.Diff(cold[sc.Name], dumpSets(p, f)); diff != "" {
			t.Fatalf("step %d (%s): differs from a cold start (-cold +got):\n%s", i, sc.Name, diff)
		}
	}
	// Back to empty: only the static chains remain.
	if err := p.Sync(ctx, &model.State{}, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dumpAll(f), "VIP-SVC-") || strings.Contains(dumpAll(f), "VIP-SEP-") {
		t.Errorf("per-service chains left after syncing an empty State:\n%s", dumpAll(f))
	}
	if m := fakeSets(p).Members(hairpinKind.v4); len(m) != 0 {
		t.Errorf("hairpin members left after syncing an empty State: %q", m)
	}
}

// TestHairpinSetSharedEndpoint: an endpoint two Services share stays in
// the hairpin set until neither DNATs to it.
func TestHairpinSetSharedEndpoint(t *testing.T) {
	p, _ := newFakeProxier(t, dataplanetest.BaseOptions())
	svc := func(name, cip string, eps ...string) *model.ServicePort {
		sp := dataplanetest.Port(name, "http", model.TCP, 80, cip)
		for _, ep := range eps {
			sp.Endpoints = append(sp.Endpoints, dataplanetest.EP(ep, 8080, true))
		}
		return dataplanetest.Fill(sp)
	}
	a := svc("ns/a", "10.96.0.1", "10.1.0.1", "10.1.0.2")
	b := svc("ns/b", "10.96.0.2", "10.1.0.2")
	bUDP := dataplanetest.Fill(func() *model.ServicePort {
		sp := dataplanetest.Port("ns/b", "dns", model.UDP, 80, "10.96.0.2")
		sp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.0.2", 8080, true)}
		return sp
	}())
	m1, m2, m2u := "10.1.0.1,tcp:8080,10.1.0.1", "10.1.0.2,tcp:8080,10.1.0.2", "10.1.0.2,udp:8080,10.1.0.2"
	for i, step := range []struct {
		ports []*model.ServicePort
		want  []string
	}{
		{[]*model.ServicePort{a, b, bUDP}, []string{m1, m2, m2u}},
		{[]*model.ServicePort{b, bUDP}, []string{m2, m2u}},                                // a goes: 10.1.0.2 stays for b
		{[]*model.ServicePort{a, b}, []string{m1, m2}},                                    // the UDP port's member is its own
		{[]*model.ServicePort{svc("ns/a", "10.96.0.1", "10.1.0.1"), b}, []string{m1, m2}}, // a drops it, b keeps it
		{[]*model.ServicePort{svc("ns/a", "10.96.0.1", "10.1.0.1")}, []string{m1}},
		{nil, nil},
	} {
		if err := p.Sync(ctx, dataplanetest.NewState(step.ports...), i == 0); err != nil {
			t.Fatal(err)
		}
		if got := fakeSets(p).Members(hairpinKind.v4); !slices.Equal(got, step.want) {
			t.Errorf("step %d: members %q, want %q", i, got, step.want)
		}
	}
}

// bigState returns n ClusterIP Services with eps endpoints each.
func bigState(n, eps int) *model.State {
	var ports []*model.ServicePort
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		sp := dataplanetest.Port(fmt.Sprintf("ns/svc-%05d", i), "http", model.TCP, 80, ip.String())
		for j := 0; j < eps; j++ {
			ep := netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i >> 8), byte(i)})
			sp.Endpoints = append(sp.Endpoints, dataplanetest.EP(ep.String(), 8080, j == 0))
		}
		ports = append(ports, dataplanetest.Fill(sp))
	}
	return dataplanetest.NewState(ports...)
}

// changeOne returns st with the endpoints of Service i replaced.
func changeOne(st *model.State, i int, port uint16) *model.State {
	out := &model.State{NodeName: st.NodeName, Ports: append([]*model.ServicePort(nil), st.Ports...)}
	sp := copyPort(st.Ports[i])
	for k := range sp.Endpoints {
		sp.Endpoints[k].Port = port
	}
	out.Ports[i] = dataplanetest.Fill(&sp)
	return out
}

func TestPartialSyncWritesOnlyChangedChains(t *testing.T) {
	for _, sets := range []bool{true, false} {
		t.Run(fmt.Sprintf("hairpin-set=%v", sets), func(t *testing.T) { partialSyncWritesOnlyChanged(t, sets) })
	}
}

func partialSyncWritesOnlyChanged(t *testing.T, sets bool) {
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), sets)
	st := bigState(20, 3)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	n := len(f.Restores)
	fs := fakeSets(p)
	if sets {
		fs.Scripts()
	}
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if len(f.Restores) != n {
		t.Fatalf("same State twice wrote %d restores: %+v", len(f.Restores)-n, f.Restores[n:])
	}
	if sets {
		if s := fs.Scripts(); len(s) != 0 {
			t.Fatalf("same State twice wrote ipset scripts %q", s)
		}
	}
	saves := f.Calls["save"]
	st2 := changeOne(st, 7, 9090)
	if err := p.Sync(ctx, st2, false); err != nil {
		t.Fatal(err)
	}
	if f.Calls["save"] != saves {
		t.Errorf("partial sync ran iptables-save")
	}
	got := f.Restores[n:]
	if len(got) != 1 || got[0].Table != TableNAT || got[0].Family != IPv4 {
		t.Fatalf("want one ipv4 nat restore, got %d: %+v", len(got), got)
	}
	data := got[0].Data
	spn := st.Ports[7].Name.String()
	changed := chainsFor(spn, "TCP").svc
	other := chainsFor(st.Ports[8].Name.String(), "TCP").svc
	if !strings.Contains(data, ":"+changed+" ") {
		t.Errorf("restore does not rewrite %s:\n%s", changed, data)
	}
	if strings.Contains(data, other) || strings.Contains(data, ":"+chainServices+" ") {
		t.Errorf("restore rewrites unchanged chains:\n%s", data)
	}
	if sets {
		// The three new endpoints join the set before the restore, the
		// three old ones leave it after; no endpoint chains.
		if strings.Contains(data, "VIP-SEP-") {
			t.Errorf("endpoint chains with a hairpin set:\n%s", data)
		}
		s := fs.Scripts()
		if len(s) != 2 || strings.Count(s[0], "add VIP-HAIRPIN ") != 3 || !strings.Contains(s[0], "add VIP-HAIRPIN 10.1.0.7,tcp:9090,10.1.0.7 -exist\n") ||
			strings.Count(s[1], "del VIP-HAIRPIN ") != 3 || strings.Contains(s[1], ":9090") {
			t.Errorf("want 3 adds then 3 dels, got %q", s)
		}
	} else if c := strings.Count(data, "\n-X VIP-SEP-"); c != 3 {
		// Three old endpoint chains are deleted, three new ones written.
		t.Errorf("want 3 stale endpoint chains deleted, got %d:\n%s", c, data)
	}
	// The result equals a cold start.
	cp, cf := newFakeProxierLayout(t, dataplanetest.BaseOptions(), sets)
	if err := cp.Sync(ctx, st2, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(dumpAll(cf), dumpAll(f)); diff != "" {
		t.Errorf("partial result differs from cold start:\n%s", diff)
	}
	if sets {
		if diff := cmp.Diff(fakeSets(cp).Dump(), fs.Dump()); diff != "" {
			t.Errorf("partial sets differ from cold start:\n%s", diff)
		}
	}
}

func TestFailedRestoreForcesFull(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	st := bigState(5, 2)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	before := dumpAll(f)
	fails, partialFails := counterValue(metrics.IptablesRestoreFailures), counterValue(metrics.IptablesPartialRestoreFailures)
	boom := errors.New("boom")
	f.FailRestore = func(Family, string, []byte) error { return boom }
	st2 := changeOne(st, 2, 7070)
	if err := p.Sync(ctx, st2, false); !errors.Is(err, boom) {
		t.Fatalf("Sync = %v, want boom", err)
	}
	if got := counterValue(metrics.IptablesRestoreFailures) - fails; got != 1 {
		t.Errorf("restore failures +%v, want +1", got)
	}
	if got := counterValue(metrics.IptablesPartialRestoreFailures) - partialFails; got != 1 {
		t.Errorf("partial restore failures +%v, want +1", got)
	}
	if diff := cmp.Diff(before, dumpAll(f)); diff != "" {
		t.Errorf("failed restore changed rules:\n%s", diff)
	}
	f.FailRestore = nil
	syncFull(t, p, f, st2, "a failure")
	cp, cf := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := cp.Sync(ctx, st2, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(dumpAll(cf), dumpAll(f)); diff != "" {
		t.Errorf("after the failure and a full sync, rules differ from a cold start:\n%s", diff)
	}
}

func TestCanaryMissingForcesFull(t *testing.T) {
	for _, tc := range []struct {
		name, table, cmd string
	}{
		{"nat flushed", TableNAT, "-F " + ChainCanary},
		{"filter flushed", TableFilter, "-F " + ChainCanary},
		{"nat chains deleted", TableNAT, "-F " + ChainCanary + "\n-X " + ChainCanary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, f := newFakeProxier(t, dataplanetest.BaseOptions())
			st := bigState(3, 2)
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			want := dumpAll(f)
			// Someone flushes every chain of the table (and maybe deletes the canary).
			var flush strings.Builder
			flush.WriteString("*" + tc.table + "\n")
			for name := range f.Table(IPv4, tc.table).Chains {
				if isOurs(name) && name != ChainCanary {
					flush.WriteString("-F " + name + "\n")
				}
			}
			flush.WriteString(tc.cmd + "\nCOMMIT\n")
			if err := f.Restore(ctx, IPv4, tc.table, []byte(flush.String())); err != nil {
				t.Fatal(err)
			}
			syncFull(t, p, f, st, "a missing canary")
			if diff := cmp.Diff(want, dumpAll(f)); diff != "" {
				t.Errorf("rules not restored:\n%s", diff)
			}
		})
	}
}

func TestJumpRulesKeptFirst(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	user := "*filter\n-A FORWARD -j DROP\n-A INPUT -s 192.0.2.1 -j ACCEPT\nCOMMIT\n"
	if err := f.Restore(ctx, IPv4, TableFilter, []byte(user)); err != nil {
		t.Fatal(err)
	}
	st := bigState(2, 1)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		filter := f.Table(IPv4, TableFilter)
		for _, chain := range []string{"INPUT", "FORWARD", "OUTPUT"} {
			var want []string
			for _, j := range jumps {
				if j.table == TableFilter && j.chain == chain {
					want = append(want, j.target)
				}
			}
			rules := filter.Chains[chain].Rules
			for i, w := range want {
				if i >= len(rules) || jumpTarget(rules[i]) != w {
					t.Fatalf("%s rule %d: want jump to %s, chain is %v", chain, i+1, w, rules)
				}
			}
			for _, r := range rules[len(want):] {
				if isOurs(jumpTarget(r)) {
					t.Errorf("%s has a duplicate jump %v", chain, r)
				}
			}
		}
	}
	check()
	// Someone inserts a rule in front of ours: the next full sync puts ours first again.
	if err := f.Restore(ctx, IPv4, TableFilter, []byte("*filter\n-I FORWARD 1 -j DROP\n-I OUTPUT 2 -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	check()
	if got := len(f.Table(IPv4, TableFilter).Chains["FORWARD"].Rules); got != 4+2 {
		t.Errorf("FORWARD has %d rules, want 4 jumps + 2 user rules", got)
	}
}

func TestCleanup(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	// Cleanup of nothing succeeds.
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	user := "*nat\n:USER - [0:0]\n-A PREROUTING -j USER\n-A USER -j RETURN\nCOMMIT\n"
	if err := f.Restore(ctx, IPv4, TableNAT, []byte(user)); err != nil {
		t.Fatal(err)
	}
	before := dumpAll(f)
	for _, sc := range dataplanetest.Scenarios()[:4] {
		if err := p.Sync(ctx, sc.State(), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, dumpAll(f)); diff != "" {
		t.Errorf("Cleanup left (-before +after):\n%s", diff)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	// A Sync after Cleanup is full and works.
	if err := p.Sync(ctx, bigState(1, 1), false); err != nil {
		t.Fatal(err)
	}
	if f.Table(IPv4, TableNAT).Chains[chainServices] == nil {
		t.Errorf("Sync after Cleanup did not recreate %s", chainServices)
	}
}

func TestLargeClusterDropsComments(t *testing.T) {
	for _, tc := range []struct {
		name         string
		svcs, eps    int
		wantComments bool
	}{
		{"999 endpoints", 333, 3, true},
		{"1000 endpoints", 250, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, f := newFakeProxier(t, dataplanetest.BaseOptions())
			if err := p.Sync(ctx, bigState(tc.svcs, tc.eps), true); err != nil {
				t.Fatal(err)
			}
			nat := f.Table(IPv4, TableNAT)
			found := false
			for _, c := range nat.Chains {
				for _, r := range c.Rules {
					if a := JoinArgs(r); strings.Contains(a, "DNAT") && strings.Contains(a, "--comment") {
						found = true
					}
				}
			}
			if found != tc.wantComments {
				t.Errorf("DNAT rules have comments = %v, want %v", found, tc.wantComments)
			}
		})
	}
}

func TestProbabilityAsUpstream(t *testing.T) {
	for n, want := range map[int]string{2: "0.5000000000", 3: "0.3333333333", 7: "0.1428571429"} {
		if got := probability(1, n); got != want {
			t.Errorf("probability(1, %d) = %s, want %s", n, got, want)
		}
	}
	// Weighted: 3 of 4, then 1 of 1 (the last rule has no statistic match).
	if got := probability(3, 4); got != "0.7500000000" {
		t.Errorf("probability(3, 4) = %s, want 0.7500000000", got)
	}
}

func TestNewValidates(t *testing.T) {
	o := dataplanetest.BaseOptions()
	o.MasqueradeBit = 40
	if _, err := New(Options{Options: o, Runner: NewFake()}); err == nil || !strings.Contains(err.Error(), "MasqueradeBit 40") {
		t.Errorf("New(MasqueradeBit 40) = %v, want an error naming it", err)
	}
}

func TestBadPortSkipped(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	bad := dataplanetest.Port("ns/bad", "", "ICMP", 80, "10.96.0.5")
	// More load-balancer IPs than one port's dispatch rules can count.
	huge := dataplanetest.Port("ns/huge", "", model.TCP, 80, "10.96.0.7")
	huge.Type = model.TypeLoadBalancer
	for i := range math.MaxUint16 / 3 {
		huge.LoadBalancerIPs = append(huge.LoadBalancerIPs, netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)}))
	}
	huge.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.4", 80, true)}
	good := dataplanetest.Port("ns/good", "", model.TCP, 80, "10.96.0.6")
	good.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.3", 80, false)}
	if err := p.Sync(ctx, dataplanetest.NewState(dataplanetest.Fill(bad), dataplanetest.Fill(huge), dataplanetest.Fill(good)), true); err != nil {
		t.Fatal(err)
	}
	tr := fakeTracer{f: f, sets: fakeSets(p)}
	if v := tr.Trace(dataplanetest.TCP("10.1.1.9", "10.96.0.6", 80)); v.String() != "dnat [10.1.2.3:80]" {
		t.Errorf("good service after bad ones: %s", v)
	}
	if v := tr.Trace(dataplanetest.TCP("10.1.1.9", "10.96.0.7", 80)); strings.HasPrefix(v.String(), "dnat") {
		t.Errorf("a port with %d load-balancer IPs was programmed: %s", len(huge.LoadBalancerIPs), v)
	}
}

func TestExecBinaries(t *testing.T) {
	for _, tc := range []struct {
		variant string
		fam     Family
		name    string
		want    string
	}{
		{"", IPv4, "tables-restore", "iptables-restore"},
		{"", IPv6, "tables-save", "ip6tables-save"},
		{"legacy", IPv4, "tables-restore", "iptables-legacy-restore"},
		{"nft", IPv6, "tables", "ip6tables-nft"},
	} {
		e := &Exec{Variant: tc.variant}
		if got := e.bin(tc.fam, tc.name); got != tc.want {
			t.Errorf("bin(%v, %q) with variant %q = %q, want %q", tc.fam, tc.name, tc.variant, got, tc.want)
		}
	}
}

// failingSave makes one family's iptables-save fail.
type failingSave struct {
	*Fake
	fam Family
}

func (f failingSave) Save(ctx context.Context, fam Family, table string) ([]byte, error) {
	if fam == f.fam {
		return nil, errors.New("ip6tables-save: can't initialize ip6tables table `nat': Address family not supported by protocol")
	}
	return f.Fake.Save(ctx, fam, table)
}

func TestUnusableFamilyDropped(t *testing.T) {
	f := NewFake()
	p, err := New(Options{Options: dataplanetest.BaseOptions(), Runner: failingSave{f, IPv6}, Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, bigState(2, 1), true); err != nil {
		t.Fatalf("Sync with IPv6 unusable: %v", err)
	}
	if f.Table(IPv4, TableNAT).Chains[chainServices] == nil {
		t.Errorf("IPv4 not programmed")
	}
	// An explicitly requested family is never dropped.
	p, err = New(Options{Options: dataplanetest.BaseOptions(), Runner: failingSave{NewFake(), IPv6}, Families: []Family{IPv4, IPv6}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, bigState(2, 1), true); err == nil {
		t.Errorf("Sync with an explicitly requested unusable family succeeded")
	}
}

func TestEmptyBaseChains(t *testing.T) {
	for _, tc := range []struct {
		name, out  string
		want       []string
		tableEmpty bool
	}{
		{"empty nat", "table ip nat {\n\tchain PREROUTING {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t}\n\n\tchain POSTROUTING {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t}\n}\n", []string{"PREROUTING", "POSTROUTING"}, true},
		{"comment line", "# Warning: table ip nat is managed by iptables-nft, do not touch!\ntable ip nat {\n\tchain OUTPUT {\n\t\ttype nat hook output priority -100; policy accept;\n\t}\n}\n", []string{"OUTPUT"}, true},
		{"a rule", "table ip nat {\n\tchain POSTROUTING {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr 192.0.2.0/24 counter packets 0 bytes 0 return\n\t}\n\tchain OUTPUT {\n\t\ttype nat hook output priority -100; policy accept;\n\t}\n}\n", []string{"OUTPUT"}, false},
		{"drop policy", "table ip nat {\n\tchain PREROUTING {\n\t\ttype nat hook prerouting priority dstnat; policy drop;\n\t}\n}\n", nil, false},
		{"user chain", "table ip nat {\n\tchain USER {\n\t}\n}\n", nil, false},
		{"a set", "table ip nat {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, empty := emptyBaseChains(tc.out, TableNAT)
			if !slices.Equal(got, tc.want) || empty != tc.tableEmpty {
				t.Errorf("emptyBaseChains = %v, %v; want %v, %v", got, empty, tc.want, tc.tableEmpty)
			}
		})
	}
}

// copyPort returns a deep copy of sp (tests change the copy: ports given
// to a dataplane are read-only).
func copyPort(sp *model.ServicePort) model.ServicePort {
	c := *sp
	c.ClusterIPs = slices.Clone(sp.ClusterIPs)
	c.ExternalIPs = slices.Clone(sp.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
	c.LoadBalancerSourceRanges = slices.Clone(sp.LoadBalancerSourceRanges)
	c.Endpoints = slices.Clone(sp.Endpoints)
	c.ClusterEndpoints = slices.Clone(sp.ClusterEndpoints)
	c.LocalEndpoints = slices.Clone(sp.LocalEndpoints)
	return c
}

// TestOtherFamilyPortsNotCached checks that a family keeps no fragment
// cache entry for the ports it has no ClusterIP of, and still programs
// a port that moves to it.
func TestOtherFamilyPortsNotCached(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	web := func(ip string) *model.ServicePort {
		sp := dataplanetest.Port("default/web", "", model.TCP, 80, ip)
		sp.Endpoints = []model.Endpoint{dataplanetest.EP(map[bool]string{false: "10.1.3.1", true: "fd00:1::1"}[strings.Contains(ip, ":")], 8080, false)}
		return dataplanetest.Fill(sp)
	}
	for i, ip := range []string{"10.96.0.21", "fd00:96::21", "10.96.0.21"} {
		if err := p.Sync(ctx, dataplanetest.NewState(web(ip)), i == 0); err != nil {
			t.Fatal(err)
		}
		v6 := strings.Contains(ip, ":")
		for _, fam := range []Family{IPv4, IPv6} {
			want := 0
			if (fam == IPv6) == v6 {
				want = 1
			}
			if n := p.cache[fam].ports.Len(); n != want {
				t.Errorf("web at %s: %s cache holds %d fragments, want %d", ip, fam, n, want)
			}
		}
		if !strings.Contains(dumpAll(f), ip) {
			t.Errorf("web at %s: not programmed:\n%s", ip, dumpAll(f))
		}
	}
}

// TestRestoredFragmentsKeepNoText checks that a restored fragment keeps
// its chains' names, sums and rule counts but not their text, that a
// partial sync after it writes only the chain whose sum changed, and that
// a full sync, which compares every chain with the kernel, builds the
// texts again and repairs a chain someone flushed.
func TestRestoredFragmentsKeepNoText(t *testing.T) {
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	st := bigState(4, 2)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	released := func() (frags, texts int) {
		for _, fr := range p.applied[IPv4][TableNAT].frags {
			frags++
			for _, c := range fr.chains {
				if c.text != "" || c.sum == 0 || c.n == 0 {
					texts++
				}
			}
		}
		return frags, texts
	}
	if n, kept := released(); n != 4 || kept != 0 {
		t.Fatalf("after a cold start: %d fragments, %d chains with text or without a sum (want 4, 0)", n, kept)
	}
	for _, c := range slices.Concat(p.cache[IPv4].shared.nat, p.cache[IPv4].shared.filter) {
		if c.text != "" || c.sum == 0 {
			t.Errorf("shared chain %s kept its text or has no sum", c.name)
		}
	}
	want := dumpAll(f)

	// An endpoint's port changes: its endpoint chain and the Service chain
	// get new sums; the other Services' chains are not written.
	n := len(f.Restores)
	st2 := changeOne(st, 1, 9090)
	if err := p.Sync(ctx, st2, false); err != nil {
		t.Fatal(err)
	}
	got := f.Restores[n:]
	if len(got) != 1 {
		t.Fatalf("want one restore, got %d", len(got))
	}
	if other := chainsFor(st.Ports[2].Name.String(), "TCP").svc; strings.Contains(got[0].Data, other) {
		t.Errorf("partial sync wrote unchanged %s:\n%s", other, got[0].Data)
	}
	if _, kept := released(); kept != 0 {
		t.Errorf("after a partial sync %d chains kept their text", kept)
	}

	// Someone flushes one Service chain; a full sync puts it back.
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	victim := chainsFor(st.Ports[3].Name.String(), "TCP").svc
	if err := f.Restore(ctx, IPv4, TableNAT, []byte("*nat\n-F "+victim+"\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	p.lastFull = time.Time{} // past FullSyncInterval: a real full sync
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, dumpAll(f)); diff != "" {
		t.Errorf("full sync did not restore the flushed chain:\n%s", diff)
	}
	if _, kept := released(); kept != 0 {
		t.Errorf("after a full sync %d chains kept their text", kept)
	}

	// A new Service: the shared chains are built again, and written.
	n = len(f.Restores)
	st5 := bigState(5, 2)
	if err := p.Sync(ctx, st5, false); err != nil {
		t.Fatal(err)
	}
	if data := f.Restores[len(f.Restores)-1].Data; len(f.Restores) == n || !strings.Contains(data, ":"+chainServices+" ") {
		t.Errorf("adding a Service did not rewrite %s", chainServices)
	}
	cp, cf := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	if err := cp.Sync(ctx, st5, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(dumpAll(cf), dumpAll(f)); diff != "" {
		t.Errorf("after adding a Service, rules differ from a cold start:\n%s", diff)
	}
}

// TestReleasedChainForcesFull checks the guard against writing a chain
// whose text was given up: the sync fails without touching the kernel,
// and the next one, full, builds the texts again and succeeds.
func TestReleasedChainForcesFull(t *testing.T) {
	p, f := newFakeProxierLayout(t, dataplanetest.BaseOptions(), false)
	st := bigState(3, 2)
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	want := dumpAll(f)
	// Pretend the last restore applied no fragment: a partial sync would
	// write every (released) fragment chain again.
	p.applied[IPv4][TableNAT].frags = nil
	n := len(f.Restores)
	err := p.Sync(ctx, st, false)
	if err == nil || !strings.Contains(err.Error(), "released") {
		t.Fatalf("Sync = %v, want the released-text error", err)
	}
	if len(f.Restores) != n {
		t.Errorf("the failed sync restored %d tables", len(f.Restores)-n)
	}
	syncFull(t, p, f, st, "the guard")
	if diff := cmp.Diff(want, dumpAll(f)); diff != "" {
		t.Errorf("rules differ after the full sync:\n%s", diff)
	}
}

// syncFull runs a partial Sync of st that after must have made full: it
// reads the tables (iptables-save) first.
func syncFull(t *testing.T, p *Proxier, f *Fake, st *model.State, after string) {
	t.Helper()
	saves := f.Calls["save"]
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if f.Calls["save"] == saves {
		t.Errorf("the sync after %s was not full (no iptables-save)", after)
	}
}
