package nftables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestInternSharesChains: every fragment's shared chains are the
// builder's one copy, and its map verdicts jump to them, after a full
// build and after a partial update that makes a new shared chain; private
// chains stay the port's own.
func TestInternSharesChains(t *testing.T) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, NewFakeTransport())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st := scaleState(60, 3)
	st.Ports[7].AffinityTimeoutSeconds = 600 // one port with private sticky chains
	if err := p.Sync(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	// A fourth endpoint on port 3: its fragment is built by update and
	// jumps to int-cluster-tcp-4, a chain no other port has.
	next := changeOne(st, 3, 1)
	sp := *next.Ports[3]
	sp.Endpoints = append(sp.Endpoints[:len(sp.Endpoints):len(sp.Endpoints)], model.Endpoint{IP: sp.Endpoints[0].IP.Next(), Port: 8080, Ready: true, Serving: true})
	next.Ports[3] = dataplanetest.Fill(&sp)
	if err := p.Sync(ctx, next, false); err != nil {
		t.Fatal(err)
	}

	tab := p.b.shared[knftables.IPv4Family]
	shared, private, verdicts := 0, 0, 0
	for name, pe := range p.applied[knftables.IPv4Family].ports {
		for _, c := range pe.fr.chains {
			s := tab[c.name]
			switch {
			case !c.shared:
				private++
				if s != nil {
					t.Errorf("%s: private chain %s is in the shared table", name, c.name)
				}
			case s == nil:
				t.Errorf("%s: shared chain %s not interned", name, c.name)
			case unsafe.StringData(c.name) != unsafe.StringData(s.name) || &c.rules[0] != &s.rules[0]:
				t.Errorf("%s: shared chain %s is a copy, not the builder's", name, c.name)
			default:
				shared++
			}
		}
		for i := range pe.fr.elems {
			if to, ok := strings.CutPrefix(pe.fr.value(i), "goto "); ok && tab[to] != nil {
				verdicts++
			}
		}
	}
	if tab["int-cluster-tcp-4"] == nil {
		t.Error("the chain made by the partial update is not interned")
	}
	if shared < 60 || verdicts < 59 || private == 0 {
		t.Errorf("checked %d shared chains, %d verdicts, %d private chains; want >= 60, >= 59, > 0", shared, verdicts, private)
	}
}

// TestObservedEvents: every chain a TCP port with outlier ejection sends
// its flows through starts with the observed-events rules (the
// sampled-events ones for a SampledFlows port), every chain of a
// QuietFlows port with the quiet one, and their shared chains are not the
// ones of other ports; the other ports have no such rule.
func TestObservedEvents(t *testing.T) {
	tcp := dataplanetest.Port("default/seen", "", model.TCP, 80, "10.96.0.10")
	tcp.Type = model.TypeLoadBalancer
	tcp.NodePort = 30080
	tcp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.10")}
	tcp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.10", 8080, false), dataplanetest.EP("10.1.1.11", 8080, true)}
	local := *tcp
	local.Name.Name, local.ClusterIPs, local.NodePort = "seen-local", []netip.Addr{netip.MustParseAddr("10.96.0.11")}, 30081
	local.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.11")}
	local.ExternalTrafficPolicy = model.PolicyLocal
	sticky := *tcp
	sticky.Name.Name, sticky.ClusterIPs, sticky.NodePort = "seen-sticky", []netip.Addr{netip.MustParseAddr("10.96.0.12")}, 30082
	sticky.ExternalIPs = nil
	sticky.AffinityTimeoutSeconds = 60
	plain := *tcp
	plain.Name.Name, plain.ClusterIPs, plain.NodePort = "plain", []netip.Addr{netip.MustParseAddr("10.96.0.13")}, 30083
	plain.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.13")}
	quiet := plain
	quiet.Name.Name, quiet.ClusterIPs, quiet.NodePort = "quiet", []netip.Addr{netip.MustParseAddr("10.96.0.15")}, 30085
	quiet.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.15")}
	quiet.QuietFlows = true
	sampled := *tcp
	sampled.Name.Name, sampled.ClusterIPs, sampled.NodePort = "sampled", []netip.Addr{netip.MustParseAddr("10.96.0.16")}, 30086
	sampled.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.16")}
	sampled.SampledFlows = true
	sampledLocal := local
	sampledLocal.Name.Name, sampledLocal.ClusterIPs, sampledLocal.NodePort = "sampled-local", []netip.Addr{netip.MustParseAddr("10.96.0.17")}, 30087
	sampledLocal.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.17")}
	sampledLocal.SampledFlows = true
	udp := dataplanetest.Port("default/seen-udp", "", model.UDP, 53, "10.96.0.14")
	udp.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.14", 53, false)}
	for _, sp := range []*model.ServicePort{tcp, &local, &sticky, &sampled, &sampledLocal, udp} {
		sp.OutlierEjection = true
	}
	ports := []*model.ServicePort{dataplanetest.Fill(tcp), dataplanetest.Fill(&local), dataplanetest.Fill(&sticky), dataplanetest.Fill(&plain),
		dataplanetest.Fill(&quiet), dataplanetest.Fill(&sampled), dataplanetest.Fill(&sampledLocal), dataplanetest.Fill(udp)}

	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, NewFakeTransport())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(context.Background(), &model.State{Ports: ports}, true); err != nil {
		t.Fatal(err)
	}
	// kind is the events rules a port's chains start with, by tag.
	kinds := map[string][]string{"-observed": observedEvents, "-sampled": sampledEvents, "-quiet": quietEvents}
	kindOf := func(n model.ServicePortName) string {
		switch {
		case n.Protocol != model.TCP || n.Name == "plain":
			return ""
		case n.Name == "quiet":
			return "-quiet"
		case strings.HasPrefix(n.Name, "sampled"):
			return "-sampled"
		}
		return "-observed"
	}
	seen := map[string]map[string]bool{}
	for name, pe := range p.applied[knftables.IPv4Family].ports {
		kind := kindOf(name)
		targets := map[string]bool{}
		for i := range pe.fr.elems {
			if to, ok := strings.CutPrefix(pe.fr.value(i), "goto "); ok {
				targets[to] = true
			}
		}
		if len(targets) == 0 {
			t.Fatalf("%s: no chain to check", name)
		}
		for _, c := range pe.fr.chains {
			if !targets[c.name] {
				continue // sticky and endpoint chains: reached through the port's own
			}
			for tag, rules := range kinds {
				has := len(c.rules) >= len(rules) && slices.Equal(c.rules[:len(rules)], rules)
				if has != (kind == tag) {
					t.Errorf("%s: chain %s: %s events rules first %v, want %v (rules %q)", name, c.name, tag, has, kind == tag, c.rules)
				}
				if c.shared && strings.HasSuffix(c.name, tag) != (kind == tag) {
					t.Errorf("%s: shared chain %s: want it tagged %q", name, c.name, kind)
				}
			}
			if seen[kind] == nil {
				seen[kind] = map[string]bool{}
			}
			seen[kind][c.name] = true
			delete(targets, c.name)
		}
		if len(targets) > 0 {
			t.Errorf("%s: map verdicts to chains it does not write: %v", name, targets)
		}
	}
	want := map[string][]string{
		"-observed": {"int-cluster-tcp-2-observed", "ext-cluster-tcp-2-observed", "np-cluster-tcp-2-observed", "svc-" + portID(sticky.Name)},
		"-quiet":    {"int-cluster-tcp-2-quiet", "ext-cluster-tcp-2-quiet", "np-cluster-tcp-2-quiet"},
		"-sampled":  {"int-cluster-tcp-2-sampled", "ext-cluster-tcp-2-sampled", "np-cluster-tcp-2-sampled"},
	}
	for kind, chains := range want {
		for _, c := range chains {
			if !seen[kind][c] {
				t.Errorf("no %s chain %s among %v", kind, c, seen[kind])
			}
		}
	}
}

// TestUnservedPortsCostNothing checks that a family keeps nothing for the
// ports it does not serve: IPv4 Services leave the ip6 ruleset and the
// ip6 fragment cache without ports.
func TestUnservedPortsCostNothing(t *testing.T) {
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, &discardElementer{})
	if err != nil {
		t.Fatal(err)
	}
	st := scaleState(100, 2)
	ctx := context.Background()
	for i, full := range []bool{true, false} {
		if i > 0 {
			st = changeOne(st, 7, i)
		}
		if err := p.Sync(ctx, st, full); err != nil {
			t.Fatal(err)
		}
		if n := len(p.applied[knftables.IPv4Family].ports); n != 100 {
			t.Errorf("sync %d: ip ruleset holds %d ports, want 100", i, n)
		}
		if n := len(p.applied[knftables.IPv6Family].ports); n != 0 {
			t.Errorf("sync %d: ip6 ruleset holds %d ports, want 0", i, n)
		}
		if n := p.b.cache[knftables.IPv6Family].Len(); n != 0 {
			t.Errorf("sync %d: ip6 cache holds %d fragments, want 0", i, n)
		}
	}
}

func TestBitset(t *testing.T) {
	for _, tc := range []struct {
		size, trunc int
		set         []int
		want        int
	}{
		{0, 0, nil, 0},
		{10, 10, []int{0, 9}, 2},
		{130, 64, []int{0, 63, 64, 129}, 2},
		{130, 65, []int{0, 63, 64, 129}, 3},
		{130, 129, []int{0, 63, 64, 128, 129}, 4},
	} {
		b := newBitset(tc.size)
		for _, i := range tc.set {
			b.set(i)
		}
		b.truncate(tc.trunc)
		if got := b.count(); got != tc.want {
			t.Errorf("%+v: count %d, want %d", tc, got, tc.want)
		}
		for _, i := range tc.set {
			if b.has(i) != (i < tc.trunc) {
				t.Errorf("%+v: has(%d) = %v", tc, i, b.has(i))
			}
			b.clear(i)
			if b.has(i) {
				t.Errorf("%+v: has(%d) after clear", tc, i)
			}
		}
		if b.has(tc.size + 64) {
			t.Errorf("%+v: has beyond the size", tc)
		}
	}
}
