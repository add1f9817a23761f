package iptables

// Tests of removing what kube-proxy left behind.

import (
	"strings"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
)

// kubeProxyLeftovers is what kube-proxy's iptables mode and kubelet leave
// in nat, plus a user rule.
const kubeProxyLeftovers = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:USER-CHAIN - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -s 192.0.2.0/24 -j USER-CHAIN
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -j MASQUERADE
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-BBBBBBBBBBBBBBBB -s 10.1.2.3/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.1.2.3:6443
-A USER-CHAIN -j KUBE-MARK-MASQ
-A USER-CHAIN -j RETURN
COMMIT
`

// TestRemoveKubeProxyLeftoversMarked: with onlyMarked (package modes'
// migration after the first sync) kube-proxy's chains go and the user's
// and kubelet's stay, the user rule jumping to one goes with it.
func TestRemoveKubeProxyLeftoversMarked(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := f.Restore(ctx, IPv4, TableNAT, []byte(kubeProxyLeftovers)); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, bigState(1, 1), true); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveKubeProxyLeftovers(ctx, true); err != nil {
		t.Fatal(err)
	}
	nat := f.Table(IPv4, TableNAT)
	for name := range nat.Chains {
		if isKubeProxyChain(name) {
			t.Errorf("kube-proxy chain %s left", name)
		}
	}
	for _, keep := range []string{"KUBE-KUBELET-CANARY", "USER-CHAIN"} {
		if nat.Chains[keep] == nil {
			t.Errorf("chain %s removed", keep)
		}
	}
	if got := JoinArgs(nat.Chains["USER-CHAIN"].Rules[0]); got != "-j RETURN" {
		t.Errorf("USER-CHAIN rules = %v, want only the RETURN", nat.Chains["USER-CHAIN"].Rules)
	}
	pre := nat.Chains["PREROUTING"].Rules
	if len(pre) != 2 || jumpTarget(pre[0]) != chainServices || jumpTarget(pre[1]) != "USER-CHAIN" {
		t.Errorf("PREROUTING = %v, want VIP-SERVICES then the user rule", pre)
	}
}

// Without kube-proxy's marker chains, a marked removal reads no table:
// saving one vipproxy just filled costs iptables-nft seconds.
func TestRemoveKubeProxyLeftoversSkipsUnmarkedTables(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := p.Sync(ctx, bigState(3, 2), true); err != nil {
		t.Fatal(err)
	}
	saves := f.Calls["save"]
	if err := p.RemoveKubeProxyLeftovers(ctx, true); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls["save"] - saves; n != 0 {
		t.Errorf("a marked removal without kube-proxy's chains saved %d tables, want 0", n)
	}
	if err := p.RemoveKubeProxyLeftovers(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls["save"] - saves; n != 6 {
		t.Errorf("a thorough removal saved %d tables, want 6 (nat, filter, mangle of both families)", n)
	}
}

func TestRemoveKubeProxyLeftovers(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := f.Restore(ctx, IPv4, TableNAT, []byte(kubeProxyLeftovers)); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveKubeProxyLeftovers(ctx, false); err != nil {
		t.Fatal(err)
	}
	for name := range f.Table(IPv4, TableNAT).Chains {
		if isKubeProxyChain(name) {
			t.Errorf("kube-proxy chain %s left", name)
		}
	}
	if f.Table(IPv4, TableNAT).Chains["KUBE-KUBELET-CANARY"] == nil {
		t.Error("kubelet's chain removed")
	}
	if err := p.RemoveKubeProxyLeftovers(ctx, false); err != nil {
		t.Errorf("second removal: %v", err)
	}
}

// kubeProxyIPVSFilter is the filter table kube-proxy v1.34's ipvs mode
// writes (pkg/proxy/ipvs writeIptablesRules), with kubelet's chains.
const kubeProxyIPVSFilter = `*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-NODE-PORT -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-PROXY-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
`

// TestRemoveKubeProxyIPVSFilterChains: every chain kube-proxy's ipvs mode
// writes in filter goes, so no rule matches its ipsets any more (they
// cannot be destroyed while one does); kubelet's chains stay. Named
// explicitly rather than through isKubeProxyChain, which they test.
func TestRemoveKubeProxyIPVSFilterChains(t *testing.T) {
	p, f := newFakeProxier(t, dataplanetest.BaseOptions())
	if err := f.Restore(ctx, IPv4, TableFilter, []byte(kubeProxyIPVSFilter)); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveKubeProxyLeftovers(ctx, true); err != nil {
		t.Fatal(err)
	}
	filter := f.Table(IPv4, TableFilter)
	for _, gone := range []string{"KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL",
		"KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"} {
		if filter.Chains[gone] != nil {
			t.Errorf("kube-proxy's chain %s left", gone)
		}
	}
	for _, keep := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY"} {
		if filter.Chains[keep] == nil {
			t.Errorf("kubelet's chain %s removed", keep)
		}
	}
	for name, c := range filter.Chains {
		for _, r := range c.Rules {
			if strings.Contains(JoinArgs(r), "--match-set KUBE-") {
				t.Errorf("%s still matches a kube-proxy ipset: %s", name, JoinArgs(r))
			}
		}
	}
}
