package nftables

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/name.golden (or rewrites it).
func golden(t *testing.T, name, got string) {
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
		t.Fatalf("%v (run go test -rewrite to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; go test -rewrite updates it):\n%s", path, diff)
	}
}

// TestGolden pins the complete ruleset of every behaviour scenario.
func TestGolden(t *testing.T) {
	for _, sc := range dataplanetest.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			p, tr := newFakeProxier(t, sc.Opts())
			if err := p.Sync(context.Background(), sc.State(), true); err != nil {
				t.Fatal(err)
			}
			golden(t, sc.Name, tr.Fake.Dump())
		})
	}
}

// TestGoldenPartial pins what a partial sync sends for one endpoint
// change: one map element of the rule's numgen map is a rule rewrite of
// one chain, nothing else.
func TestGoldenPartial(t *testing.T) {
	sc := dataplanetest.Scenarios()[0]
	p, tr := newFakeProxier(t, sc.Opts())
	ctx := context.Background()
	if err := p.Sync(ctx, sc.State(), true); err != nil {
		t.Fatal(err)
	}
	st := sc.State()
	sp := *st.Ports[0]
	sp.Endpoints = append([]model.Endpoint{dataplanetest.EP("10.1.2.4", 8080, false)}, sp.Endpoints[1:]...)
	st.Ports[0] = dataplanetest.Fill(&sp)
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	golden(t, "partial-endpoint-change", tr.Fake.LastTransaction.String())
}

// runCounter counts transactions run on a FakeTransport.
type runCounter struct {
	*FakeTransport
	runs int
	last string
}

func (r *runCounter) Run(ctx context.Context, tx *knftables.Transaction) error {
	r.runs++
	r.last = tx.String()
	return r.FakeTransport.Run(ctx, tx)
}

func coldDump(t *testing.T, o dataplane.Options, st *model.State) string {
	t.Helper()
	p, tr := newFakeProxier(t, o)
	if err := p.Sync(context.Background(), st, true); err != nil {
		t.Fatal(err)
	}
	return dump(tr.Fake)
}

// dump is the Fake's dump with set and map elements sorted (the Fake keeps
// insertion order, nftables has none); rules keep their order.
func dump(f *knftables.Fake) string {
	var other, elems []string
	for _, l := range strings.Split(f.Dump(), "\n") {
		if strings.HasPrefix(l, "add element ") {
			elems = append(elems, l)
		} else if l != "" {
			other = append(other, l)
		}
	}
	sort.Strings(elems)
	return strings.Join(append(other, elems...), "\n")
}

// TestStateSequences applies sequences of States with partial syncs and
// compares what is left with a cold start of the last State, so leftovers
// of any diff show up. The last State is synced twice: chains that became
// unused are deleted one sync after they were flushed.
func TestStateSequences(t *testing.T) {
	scs := dataplanetest.Scenarios()
	byName := map[string]*model.State{"empty": dataplanetest.NewState(), "noise": dataplanetest.NoiseState(), "all": allScenarioPorts()}
	for _, sc := range scs {
		byName[sc.Name] = sc.State()
	}
	// Two Services claiming one ClusterIP and port: the one that sorts
	// first owns it, whatever the order of changes.
	conflict := func(names ...string) *model.State {
		var ps []*model.ServicePort
		for _, n := range names {
			sp := dataplanetest.Port("default/"+n, "", model.TCP, 80, "10.96.0.10")
			sp.Type, sp.NodePort = model.TypeNodePort, 30080
			sp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2."+strconv.Itoa(int(n[0])), 8080, false)}
			if n == "a2" {
				sp.Name.Name = "a"
				sp.Endpoints = append(sp.Endpoints, dataplanetest.EP("10.1.2.99", 8080, false))
			}
			ps = append(ps, dataplanetest.Fill(sp))
		}
		return dataplanetest.NewState(ps...)
	}
	byName["conflict-ab"] = conflict("a", "b")
	byName["conflict-b"] = conflict("b")
	byName["conflict-a2b"] = conflict("a2", "b")
	byName["conflict-bc"] = conflict("b", "c")
	// A port that moves between the families, and ports that share their
	// objects between States at moved indices (update reads what it
	// keeps of an unchanged port by index), one served by no family.
	fam := func(name, ip string) *model.ServicePort {
		sp := dataplanetest.Port("default/"+name, "", model.TCP, 80, ip)
		sp.Endpoints = []model.Endpoint{dataplanetest.EP(map[bool]string{false: "10.1.3.1", true: "fd00:1::1"}[strings.Contains(ip, ":")], 8080, false)}
		return dataplanetest.Fill(sp)
	}
	other, web4, web6 := fam("other", "10.96.0.20"), fam("web", "10.96.0.21"), fam("web", "fd00:96::21")
	none := dataplanetest.Fill(dataplanetest.Port("default/aaa", "", model.TCP, 80)) // no address: no family serves it
	byName["fam-v4"] = dataplanetest.NewState(other, web4)
	byName["fam-v6"] = dataplanetest.NewState(other, web6)
	byName["fam-v4-none"] = dataplanetest.NewState(none, other, web4)
	byName["fam-other"] = dataplanetest.NewState(other)
	seqs := [][]string{
		{"clusterip-tcp", "noise", "clusterip-tcp"},
		{"noise", "session-affinity", "noise"},
		{"session-affinity", "empty", "session-affinity"},
		{"all", "empty"},
		{"empty", "all"},
		{"all", "noise", "hairpin", "all"},
		{"external-traffic-policy-local", "external-and-loadbalancer-ips", "no-endpoints-reject", "external-traffic-policy-local"},
		{"ipv6-and-dual-stack", "multi-port", "ipv6-and-dual-stack"},
		{"conflict-ab", "conflict-b", "conflict-ab"},
		{"conflict-b", "conflict-ab"},
		{"conflict-ab", "conflict-a2b", "conflict-bc", "conflict-b", "conflict-a2b"},
		{"fam-v4", "fam-v6", "fam-v4"},
		{"fam-v6", "fam-other", "fam-v6"},
		{"fam-v4", "fam-v4-none", "fam-other"},
		{"fam-v4-none", "fam-v4", "fam-v6", "fam-v4-none"},
	}
	for _, seq := range seqs {
		for _, fast := range []bool{false, true} {
			name := strings.Join(seq, ",")
			if fast {
				name += "/elementer"
			}
			t.Run(name, func(t *testing.T) { testSequence(t, byName, seq, fast) })
		}
	}
}

// elemCounter is a runCounter that is also an Elementer, so the proxier
// takes its netlink paths (cold start in three steps, element-only
// partial syncs); element batches count as runs.
type elemCounter struct{ *runCounter }

func (e elemCounter) RunElements(ctx context.Context, ops []ElementOp) error {
	tx := e.NewTransaction()
	elementsTx(tx, ops)
	return e.runCounter.Run(ctx, tx)
}

func testSequence(t *testing.T, byName map[string]*model.State, seq []string, fast bool) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	ft := NewFakeTransport()
	rc := &runCounter{FakeTransport: ft}
	var tr Transport = rc
	if fast {
		tr = elemCounter{rc}
	}
	p, err := New(o, tr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, name := range seq {
		if err := p.Sync(ctx, byName[name], i == 0); err != nil {
			t.Fatalf("sync %d (%s): %v", i, name, err)
		}
		checkSums(t, p, fmt.Sprintf("sync %d (%s)", i, name))
	}
	last := byName[seq[len(seq)-1]]
	if err := p.Sync(ctx, last, false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(coldDump(t, o, last), dump(ft.Fake)); diff != "" {
		t.Errorf("after %v, ruleset differs from a cold start (-cold +got):\n%s", seq, diff)
	}
	// Nothing left to do: the same State sends nothing.
	runs := rc.runs
	if err := p.Sync(ctx, last, false); err != nil {
		t.Fatal(err)
	}
	if rc.runs != runs {
		t.Errorf("unchanged State sent a transaction:\n%s", rc.last)
	}
	// A periodic full sync of an intact table converges as well.
	if err := p.Sync(ctx, byName["noise"], true); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, last, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(coldDump(t, o, last), dump(ft.Fake)); diff != "" {
		t.Errorf("after full syncs, ruleset differs from a cold start (-cold +got):\n%s", diff)
	}
}

// checkSums requires each applied ruleset's running digest to be the
// digest of its elements, and the digest the proxier last wrote.
func checkSums(t *testing.T, p *Proxier, step string) {
	t.Helper()
	for _, f := range families {
		rs := p.applied[f]
		if want := digestOf(rs); rs.sum != want {
			t.Errorf("%s: %s running digest %s, elements' digest %s", step, f, rs.sum.key(), want.key())
		}
		if p.digests[f] != rs.sum {
			t.Errorf("%s: %s digest written %s, running digest %s", step, f, p.digests[f].key(), rs.sum.key())
		}
	}
}

// digestOf is the digest of rs's elements.
func digestOf(rs *ruleset) digest {
	var d digest
	for name, elems := range rs.elems {
		for k, e := range elems.All() {
			d.add(name, k, e.value())
		}
	}
	return d
}

// elemValues returns rs's elements as values by key by map or set name.
func elemValues(rs *ruleset) map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, elems := range rs.elems {
		m := map[string]string{}
		for k, e := range elems.All() {
			m[k] = e.value()
		}
		out[name] = m
	}
	return out
}

func TestSyncFailure(t *testing.T) {
	p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
	ctx := context.Background()
	st := allScenarioPorts()
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	before := tr.Fake.Dump()
	failures := counterValue(t, metrics.NFTablesSyncFailures)
	boom := errors.New("boom")
	tr.Err = boom
	if err := p.Sync(ctx, dataplanetest.NoiseState(), false); !errors.Is(err, boom) {
		t.Fatalf("Sync error = %v, want wrapped %v", err, boom)
	}
	if got := counterValue(t, metrics.NFTablesSyncFailures); got != failures+1 {
		t.Errorf("NFTablesSyncFailures = %v, want %v", got, failures+1)
	}
	if tr.Fake.Dump() != before {
		t.Errorf("failed sync changed the ruleset")
	}
	// The next sync, even a partial one, no longer trusts what it applied:
	// it reads the tables back and adopts them, ending where a cold start
	// of the same State does. The failed transaction changed nothing, so
	// the tables' digests and names say they hold st: nothing is written.
	tr.Fake.LastTransaction = nil
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if tr.Fake.LastTransaction != nil {
		t.Errorf("sync after failure wrote the tables it could adopt unchanged:\n%s", tr.Fake.LastTransaction)
	}
	// After a failure that leaves the tables other than wanted (a change
	// made by hand meanwhile), the adopting transaction re-creates nothing.
	tr.Err = boom
	if err := p.Sync(ctx, dataplanetest.NoiseState(), false); !errors.Is(err, boom) {
		t.Fatalf("Sync error = %v, want wrapped %v", err, boom)
	}
	tr.Fake.Lock()
	delete(tr.Fake.Tables[knftables.IPv4Family][TableName].Chains, "reject-chain")
	tr.Fake.Unlock()
	if err := p.Sync(ctx, st, false); err != nil {
		t.Fatal(err)
	}
	if last := tr.Fake.LastTransaction.String(); strings.Contains(last, "delete table") || !strings.Contains(last, "flush chain ip vipproxy services") {
		t.Errorf("sync after failure did not adopt the tables:\n%s", last)
	}
	if diff := cmp.Diff(coldDump(t, dataplanetest.BaseOptions(), st), dump(tr.Fake)); diff != "" {
		t.Errorf("after adopting (-cold +got):\n%s", diff)
	}
}

func TestTableGoneOrFlushed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(f *knftables.Fake)
	}{
		{"deleted", func(f *knftables.Fake) { delete(f.Tables[knftables.IPv6Family], TableName) }},
		{"flushed", func(f *knftables.Fake) {
			for _, c := range f.Tables[knftables.IPv4Family][TableName].Chains {
				c.Rules = nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
			ctx := context.Background()
			st := allScenarioPorts()
			if err := p.Sync(ctx, st, true); err != nil {
				t.Fatal(err)
			}
			want := tr.Fake.Dump()
			tr.Fake.Lock()
			tc.damage(tr.Fake)
			tr.Fake.Unlock()
			if err := p.Sync(ctx, st, false); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, tr.Fake.Dump()); diff != "" {
				t.Errorf("not restored (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBadPortsDoNotBlockOthers: an invalid port and a port whose address
// conflicts with an earlier one are skipped; everything else is programmed.
func TestBadPortsDoNotBlockOthers(t *testing.T) {
	good := dataplanetest.Port("default/good", "", model.TCP, 80, "10.96.0.10")
	good.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.5", 8080, false)}
	dup := dataplanetest.Port("default/zz-dup", "", model.TCP, 80, "10.96.0.10")
	dup.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.6", 8080, false)}
	bad := dataplanetest.Port("default/bad", "", model.Protocol("ICMP"), 80, "10.96.0.11")
	zero := dataplanetest.Port("default/zero", "", model.TCP, 0, "10.96.0.12")
	other := dataplanetest.Port("default/other", "", model.UDP, 53, "10.96.0.13")
	other.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.7", 53, false)}
	st := dataplanetest.NewState(dataplanetest.Fill(good), dataplanetest.Fill(dup), bad, zero, dataplanetest.Fill(other))
	p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := p.Sync(context.Background(), st, true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	tracer := &fakeTracer{fake: tr.Fake}
	for _, c := range []struct {
		pkt  dataplanetest.Packet
		want dataplanetest.Verdict
	}{
		{dataplanetest.TCP("10.1.1.9", "10.96.0.10", 80), dataplanetest.DNATTo(false, "10.1.2.5:8080")},
		{dataplanetest.UDP("10.1.1.9", "10.96.0.13", 53), dataplanetest.DNATTo(false, "10.1.2.7:53")},
		{dataplanetest.TCP("10.1.1.9", "10.96.0.12", 80), dataplanetest.DropV},
	} {
		if got := tracer.Trace(c.pkt).Normalize(); got.String() != c.want.Normalize().String() {
			t.Errorf("%s: got %s, want %s", c.pkt, got, c.want)
		}
	}
}

func TestCleanup(t *testing.T) {
	p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
	ctx := context.Background()
	// Nothing to remove: success.
	if err := p.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup on empty: %v", err)
	}
	tx := tr.NewTransaction()
	tx.Add(&knftables.Table{Family: knftables.IPv4Family, Name: "kube-proxy"})
	tx.Add(&knftables.Table{Family: knftables.IPv4Family, Name: "other"})
	if err := tr.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, allScenarioPorts(), true); err != nil {
		t.Fatal(err)
	}
	if tr.Fake.Tables[knftables.IPv4Family]["kube-proxy"] == nil {
		t.Errorf("the first sync removed kube-proxy's table (package modes does, after it)")
	}
	tx = tr.NewTransaction()
	tx.Add(&knftables.Table{Family: knftables.IPv6Family, Name: "kube-proxy"})
	if err := tr.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	// Cleanup removes only vipproxy's tables; kube-proxy's go only when
	// asked (--cleanup-kube-proxy).
	if got, want := tr.Fake.Dump(), "add table ip kube-proxy\nadd table ip other\nadd table ip6 kube-proxy\n"; got != want {
		t.Errorf("after Cleanup: %q, want %q", got, want)
	}
	if err := p.RemoveKubeProxyTables(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Fake.Dump(), "add table ip other\n"; got != want {
		t.Errorf("after RemoveKubeProxyTables: %q, want %q", got, want)
	}
	if err := p.RemoveKubeProxyTables(ctx); err != nil {
		t.Fatalf("RemoveKubeProxyTables with nothing to remove: %v", err)
	}
	// Sync works again after Cleanup.
	if err := p.Sync(ctx, allScenarioPorts(), false); err != nil {
		t.Fatal(err)
	}
	if tr.Fake.Tables[knftables.IPv4Family][TableName] == nil {
		t.Errorf("sync after Cleanup did not recreate the table")
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(dataplane.Options{MasqueradeBit: 40}, NewFakeTransport()); err == nil {
		t.Errorf("MasqueradeBit 40 accepted")
	}
	if _, err := New(dataplane.Options{}, nil); err == nil {
		t.Errorf("nil transport accepted")
	}
	o := dataplane.Options{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, NodeIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	f := newFamily(knftables.IPv4Family, &o)
	if f.npMatch != "fib daddr type local ip daddr != 127.0.0.0/8" {
		t.Errorf("npMatch for 0.0.0.0/0 = %q", f.npMatch)
	}
	o.NodePortAddresses = nil
	if f := newFamily(knftables.IPv4Family, &o); f.npMatch != "" {
		t.Errorf("loopback node IP opened NodePorts: %q", f.npMatch)
	}
}

func TestBatchElements(t *testing.T) {
	in := "add table ip t\n" +
		"add element ip t m { 1 : a }\n" +
		"add element ip t m { 2 : b }\n" +
		"add element ip t s { x }\n" +
		"delete element ip t m { 3 }\n" +
		"delete element ip t m { 4 }\n" +
		"add rule ip t c ip saddr { 1.2.3.4 } drop\n" +
		"add element ip t m { 5 : c }\n"
	want := "add table ip t\n" +
		"add element ip t m { 1 : a, 2 : b }\n" +
		"add element ip t s { x }\n" +
		"delete element ip t m { 3, 4 }\n" +
		"add rule ip t c ip saddr { 1.2.3.4 } drop\n" +
		"add element ip t m { 5 : c }\n"
	if got := batchElements(in); got != want {
		t.Errorf("batchElements:\n%s\nwant:\n%s", got, want)
	}
}

// TestSourceRangesAllowLBIPsFromNode: when this node is inside a
// Service's loadBalancerSourceRanges, packets from the LB IPs themselves
// pass the firewall too (kube-proxy's rule for VIP-like load balancers),
// and only then.
func TestSourceRangesAllowLBIPsFromNode(t *testing.T) {
	for _, c := range []struct {
		name   string
		ranges []string
		want   string
	}{
		{"node inside", []string{"203.0.113.0/24", dataplanetest.NodeIPv4.String() + "/32"},
			"ip saddr != { " + dataplanetest.NodeIPv4.String() + ", 198.51.100.7, 203.0.113.0/24 } drop"},
		{"node outside", []string{"203.0.113.0/24"}, "ip saddr != 203.0.113.0/24 drop"},
		{"LB IP already allowed", []string{"198.51.100.0/24", dataplanetest.NodeIPv4.String() + "/32"},
			"ip saddr != { " + dataplanetest.NodeIPv4.String() + ", 198.51.100.0/24 } drop"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sp := dataplanetest.Port("default/lb", "http", model.TCP, 80, "10.96.0.50")
			sp.Type = model.TypeLoadBalancer
			sp.NodePort = 30050
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.7")}
			for _, r := range c.ranges {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
			sp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.3", 8080, false)}
			p, tr := newFakeProxier(t, dataplanetest.BaseOptions())
			if err := p.Sync(context.Background(), dataplanetest.NewState(dataplanetest.Fill(sp)), true); err != nil {
				t.Fatal(err)
			}
			var fw []string
			for _, l := range strings.Split(tr.Fake.Dump(), "\n") {
				if strings.HasPrefix(l, "add rule ip vipproxy fw-") {
					fw = append(fw, l)
				}
			}
			if len(fw) != 1 || !strings.HasSuffix(fw[0], c.want) {
				t.Errorf("firewall rules %q, want one ending in %q", fw, c.want)
			}
		})
	}
}
