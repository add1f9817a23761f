//go:build linux

package modes

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipvs"
	"github.com/vipproxy/vipproxy/internal/dataplane/nftables"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

var ctx = context.Background()

// loAddrs is a fake userspace.AddrManager: the loopback addresses the
// userspace mode owns.
type loAddrs struct{ m map[netip.Addr]bool }

func (l *loAddrs) CanAdd() error               { return nil }
func (l *loAddrs) Add(ip netip.Addr) error     { l.m[ip] = true; return nil }
func (l *loAddrs) Del(ip netip.Addr) error     { delete(l.m, ip); return nil }
func (l *loAddrs) List() ([]netip.Addr, error) { return slices.Collect(mapKeys(l.m)), nil }

func mapKeys(m map[netip.Addr]bool) func(func(netip.Addr) bool) {
	return func(yield func(netip.Addr) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// node is one node's kernel state, all fakes, shared by every mode as the
// kernel is.
type node struct {
	ipt    *iptables.Fake
	nft    *deletions
	kernel *ipvs.FakeKernel
	sets   *ipset.Fake
	vips   *ipvs.FakeAddrs
	lo     *loAddrs
	// kubeProxyIPVS records the keepVirtualServers of each call.
	kubeProxyIPVS []bool
}

// deletions is a nftables transport that counts the table deletions it
// ran, by "family name".
type deletions struct {
	*nftables.FakeTransport
	deleted map[string]int
}

func (d *deletions) Run(ctx context.Context, tx *knftables.Transaction) error {
	for _, op := range strings.Split(tx.String(), "\n") {
		if f := strings.Fields(op); len(f) == 4 && f[0] == "delete" && f[1] == "table" {
			d.deleted[f[2]+" "+f[3]]++
		}
	}
	return d.FakeTransport.Run(ctx, tx)
}

func newNode() *node {
	return &node{
		ipt:    iptables.NewFake(),
		nft:    &deletions{FakeTransport: nftables.NewFakeTransport(), deleted: map[string]int{}},
		kernel: &ipvs.FakeKernel{}, sets: &ipset.Fake{}, vips: &ipvs.FakeAddrs{},
		lo: &loAddrs{m: map[netip.Addr]bool{}},
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (n *node) env() Env {
	return Env{
		Log:      quiet(),
		NodeIPs:  dataplanetest.BaseOptions().NodeIPs,
		IPVS:     ipvs.Options{Kernel: n.kernel, IPSet: n.sets, Addrs: n.vips, Sysctl: ipvs.FakeSysctl(), Runner: n.ipt},
		Variants: func() []string { return []string{"nft"} },
		IPTables: func(string) iptables.Runner { return n.ipt },
		NFT:      n.nft,
		Userspace: userspace.Options{Addrs: n.lo, Guard: userspace.NoGuard{},
			LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }},
		KubeProxyIPVS: func(_ context.Context, keep bool) (ipvs.KubeProxyLeftovers, error) {
			n.kubeProxyIPVS = append(n.kubeProxyIPVS, keep)
			return ipvs.KubeProxyLeftovers{}, nil
		},
	}
}

func opts() dataplane.Options {
	o := dataplanetest.BaseOptions()
	o.Logger = quiet()
	return o
}

// program makes mode's dataplane program the scenario ports on the node,
// as a run of that mode would (the userspace mode: its loopback VIPs).
func (n *node) program(t *testing.T, mode string) {
	t.Helper()
	st := dataplanetest.AllScenarioPorts()
	var dp dataplane.Dataplane
	var err error
	switch mode {
	case NFTables:
		dp, err = nftables.New(opts(), n.nft)
	case IPTables:
		dp, err = iptables.New(iptables.Options{Options: opts(), Runner: n.ipt, Sysctl: &sysctl.Fake{Values: map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0"}}})
	case IPVS:
		e := n.env().IPVS
		e.Options = opts()
		dp, err = ipvs.NewProxier(e)
	case Userspace:
		n.lo.m[netip.MustParseAddr("10.96.0.10")] = true
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Sync(ctx, st, true); err != nil {
		t.Fatalf("%s: %v", mode, err)
	}
}

// plantKubeProxy leaves kube-proxy's nftables table and iptables chains.
func (n *node) plantKubeProxy(t *testing.T) {
	t.Helper()
	tx := n.nft.NewTransaction()
	tx.Add(&knftables.Table{Family: knftables.IPv4Family, Name: "kube-proxy"})
	tx.Add(&knftables.Table{Family: knftables.IPv6Family, Name: "kube-proxy"})
	if err := n.nft.FakeTransport.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := n.ipt.Restore(ctx, iptables.IPv4, iptables.TableNAT, []byte("*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
}

// footprint says, per owner, what is on the node.
func (n *node) footprint() map[string][]string {
	out := map[string][]string{}
	add := func(owner, what string) { out[owner] = append(out[owner], what) }
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		for name := range n.nft.Fake.Tables[fam] {
			switch name {
			case "vipproxy":
				add(NFTables, string(fam)+" "+name)
			case "kube-proxy":
				add("kube-proxy", string(fam)+" "+name)
			}
		}
	}
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, l := range strings.Split(n.ipt.Dump(fam, "nat", "filter", "mangle", "raw"), "\n") {
			switch {
			case strings.HasPrefix(l, ":VIPVS-"):
				add(IPVS, fam.String()+" "+l)
			case strings.HasPrefix(l, ":VIP-"):
				add(IPTables, fam.String()+" "+l)
			case strings.HasPrefix(l, ":KUBE-"):
				add("kube-proxy", fam.String()+" "+l)
			}
		}
	}
	if svcs, _ := n.kernel.Services(); len(svcs) > 0 {
		add(IPVS, "virtual servers")
	}
	if names, _ := n.sets.List(ctx); len(names) > 0 {
		add(IPVS, "ipsets")
	}
	if l, _ := n.vips.List(); len(l) > 0 {
		add(IPVS, "VIPs")
	}
	if len(n.lo.m) > 0 {
		add(Userspace, "loopback VIPs")
	}
	return out
}

// TestRemoveOthers: on a node where every vipproxy mode ran and crashed
// and kube-proxy ran before, the running mode's first sync plus
// RemoveOthers leave exactly the running mode's state, nothing of
// kube-proxy's, and remove each table once.
func TestRemoveOthers(t *testing.T) {
	for _, running := range Vipproxy {
		t.Run(running, func(t *testing.T) {
			n := newNode()
			n.plantKubeProxy(t)
			for _, m := range Vipproxy {
				n.program(t, m)
			}
			for _, m := range Vipproxy {
				if len(n.footprint()[m]) == 0 {
					t.Fatalf("mode %s left nothing: the test would prove nothing", m)
				}
			}
			n.program(t, running) // the running mode's own first sync
			clear(n.nft.deleted)  // (the nftables mode replaces its table)
			if err := RemoveOthers(ctx, n.env(), running); err != nil {
				t.Fatal(err)
			}
			fp := n.footprint()
			for owner, what := range fp {
				if owner != running {
					t.Errorf("%s's state left: %q", owner, what)
				}
			}
			if len(fp[running]) == 0 {
				t.Errorf("the running mode's own state was removed")
			}
			want := map[string]int{"ip kube-proxy": 1, "ip6 kube-proxy": 1}
			if running != NFTables {
				want["ip vipproxy"], want["ip6 vipproxy"] = 1, 1
			}
			if !maps.Equal(n.nft.deleted, want) {
				t.Errorf("nftables tables deleted %v, want each once: %v", n.nft.deleted, want)
			}
			if want := []bool{running == IPVS}; !slices.Equal(n.kubeProxyIPVS, want) {
				t.Errorf("kube-proxy's IPVS removal called with keepVirtualServers %v, want %v", n.kubeProxyIPVS, want)
			}
		})
	}
}

// TestRemoveAll: --cleanup leaves nothing of any mode, and kube-proxy's
// state only when asked.
func TestRemoveAll(t *testing.T) {
	for _, kubeProxy := range []bool{false, true} {
		n := newNode()
		n.plantKubeProxy(t)
		for _, m := range Vipproxy {
			n.program(t, m)
		}
		if err := RemoveAll(ctx, n.env(), kubeProxy); err != nil {
			t.Fatal(err)
		}
		fp := n.footprint()
		for owner, what := range fp {
			if owner != "kube-proxy" {
				t.Errorf("kubeProxy=%v: %s's state left: %q", kubeProxy, owner, what)
			}
		}
		if got := len(fp["kube-proxy"]) > 0; got == kubeProxy {
			t.Errorf("kubeProxy=%v: kube-proxy's state left: %v", kubeProxy, got)
		}
		if err := RemoveAll(ctx, n.env(), kubeProxy); err != nil {
			t.Errorf("a second RemoveAll (nothing to remove): %v", err)
		}
	}
}
