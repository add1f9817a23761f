//go:build linux

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// footprint lists what a mode leaves in a node namespace after a crash: the
// artifacts its start-up cleanup of other modes must remove.
func footprint(t *testing.T, ns, mode string) []string {
	t.Helper()
	var found []string
	switch mode {
	case "nftables":
		out, _ := Exec(ns, "nft", "list", "tables")
		for _, l := range strings.Split(out, "\n") {
			if l == "table ip vipproxy" || l == "table ip6 vipproxy" {
				found = append(found, l)
			}
		}
	case "iptables", "ipvs", "iptables-legacy":
		saves := []string{"iptables-save", "ip6tables-save"}
		if mode == "iptables-legacy" {
			saves = []string{"iptables-legacy-save", "ip6tables-legacy-save"}
		}
		for _, save := range saves {
			out, _ := Exec(ns, save)
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, ":VIP-") || strings.HasPrefix(l, "-A VIP-") || strings.Contains(l, "-j VIP-") {
					found = append(found, save+": "+l)
				}
			}
		}
	case "userspace":
		out, _ := Exec(ns, "ip", "-o", "addr", "show", "dev", "lo", "scope", "global")
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l != "" {
				found = append(found, l)
			}
		}
	}
	return found
}

// kube-proxy leftovers planted before vipproxy starts: its nftables table and
// its iptables portal chain, both DNATing the test VIP to pod2b.
const (
	kubeProxyNft = `
table ip kube-proxy {
	comment "rules for kube-proxy"
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.170 tcp dport 80 dnat to 10.244.2.11:8080
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.170 tcp dport 80 dnat to 10.244.2.11:8080
	}
}
`
	kubeProxyIptables = `*nat
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.170/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.2.11:8080
COMMIT
`
)

// Migration: a node ran another vipproxy mode (SIGKILLed, rules left in
// place, Service then pointing at pod2a) and kube-proxy before that (rules
// pointing at pod2b). Starting this mode must remove both, so every
// connection reaches the current endpoint pod1a and nothing is DNATed twice.
func TestMigrationRemovesLeftovers(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		prev := modeSpecs["nftables"]
		if mode.Name == "nftables" {
			prev = modeSpecs["iptables"]
		}
		for _, tool := range []string{"iptables-restore", "iptables-save", "ip6tables-save"} {
			if _, err := execLookPath(tool); err != nil {
				t.Skipf("e2e: migration test needs %s: %v", tool, err)
			}
		}
		b := newBed(t, prev, bedOptions{Nodes: []int{1}, Before: func(b *bed) {
			svc := Service("mig", "10.96.0.170", Port("http", TCP, 80, 8080))
			b.apply("mig.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod2a"))))
		}})
		node := b.node(1)
		ns := b.Pod("pod1b").NS
		b.waitFor(ns, "tcp", "10.96.0.170:80", 10*time.Second, backendIn("pod2a"))
		if !b.vp[0].Kill() {
			t.Fatal("previous vipproxy did not exit after SIGKILL")
		}
		if len(footprint(t, node.NS, prev.Name)) == 0 {
			t.Fatalf("%s left nothing behind; the test would prove nothing", prev.Name)
		}
		if _, err := runInput([]byte(kubeProxyNft), "ip", "netns", "exec", node.NS, "nft", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if _, err := runInput([]byte(kubeProxyIptables), "ip", "netns", "exec", node.NS, "iptables-restore", "--noflush"); err != nil {
			t.Fatal(err)
		}
		svc := Service("mig", "10.96.0.170", Port("http", TCP, 80, 8080))
		b.apply("mig.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a"))))

		b.setupNode(node, mode)
		v := b.NewVipproxy(node, VipproxyOptions{Mode: mode.proxy(), Manifests: b.dir})
		if err := v.Start(); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		took, err := eventually(10*time.Second, 100*time.Millisecond, func() error {
			c := spread(ns, "tcp", "10.96.0.170:80", 20, 2)
			if c["pod1a"] != 20 {
				return fmt.Errorf("20 connections: %v, want all on pod1a (pod2a: %s leftovers, pod2b: kube-proxy leftovers)", c, prev.Name)
			}
			return nil
		})
		if err != nil {
			t.Errorf("after migrating from %s: %v", prev.Name, err)
		} else {
			t.Logf("migrated from %s plus kube-proxy leftovers: all traffic on pod1a after %v", prev.Name, took)
		}
		// Leftovers are removed after vipproxy's own first sync
		// (make-before-break), so give that a bounded moment.
		if _, err := eventually(15*time.Second, 200*time.Millisecond, func() error {
			if left := footprint(t, node.NS, prev.Name); len(left) > 0 {
				return fmt.Errorf("%s leftovers still present: %q", prev.Name, left)
			}
			if out, err := Exec(node.NS, "nft", "list", "tables"); err == nil && strings.Contains(out, "table ip kube-proxy") {
				return fmt.Errorf("kube-proxy's nftables table still present")
			}
			if out, _ := Exec(node.NS, "iptables-save", "-t", "nat"); strings.Contains(out, "KUBE-SERVICES") {
				var lines []string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, "KUBE-") {
						lines = append(lines, l)
					}
				}
				return fmt.Errorf("kube-proxy's iptables chains still present: %q", lines)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})
}

// kube-proxy ran with iptables-legacy (a legacy host, or kube-proxy's image
// chose legacy): its chains in the legacy backend must go too, whatever
// mode and backend vipproxy runs, or its DNAT keeps catching the VIP.
func TestMigrationRemovesLegacyLeftovers(t *testing.T) {
	forEachMode(t, func(t *testing.T, mode modeSpec) {
		for _, tool := range []string{"iptables-legacy-restore", "iptables-legacy-save"} {
			if _, err := execLookPath(tool); err != nil {
				t.Skipf("e2e: needs %s: %v", tool, err)
			}
		}
		b := newBed(t, mode, bedOptions{Nodes: []int{}, Before: func(b *bed) {
			svc := Service("mig", "10.96.0.171", Port("http", TCP, 80, 8080))
			b.apply("mig.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a"))))
		}})
		node := b.node(1)
		legacy := strings.ReplaceAll(kubeProxyIptables, "10.96.0.170", "10.96.0.171")
		if _, err := runInput([]byte(legacy), "ip", "netns", "exec", node.NS, "iptables-legacy-restore", "--noflush"); err != nil {
			t.Fatal(err)
		}
		v := b.NewVipproxy(node, VipproxyOptions{Mode: mode.proxy(), Manifests: b.dir})
		if err := v.Start(); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		ns := b.Pod("pod1b").NS
		if _, err := eventually(15*time.Second, 200*time.Millisecond, func() error {
			if out, _ := Exec(node.NS, "iptables-legacy-save", "-t", "nat"); strings.Contains(out, "KUBE-SERVICES") {
				return fmt.Errorf("kube-proxy's legacy chains still present")
			}
			if c := spread(ns, "tcp", "10.96.0.171:80", 20, 2); c["pod1a"] != 20 {
				return fmt.Errorf("20 connections: %v, want all on pod1a (pod2b: kube-proxy's legacy DNAT)", c)
			}
			return nil
		}); err != nil {
			t.Errorf("%v\n%s", err, v.Log())
		}
		if line, ok := logLine(v.Log(), "iptables backend"); ok {
			t.Logf("log: %s", line)
		}
	})
}

// TestModeSwitchSequence: kube-proxy ran before (its nftables table and
// iptables chains are there); vipproxy starts in nftables mode and is
// switched by config reloads to iptables, ipvs (a fallback to iptables
// where the kernel has no IPVS) and back to nftables. After each step
// exactly the running mode's rules are on the node and nothing of
// kube-proxy's, the Service answers, and each leftover was removed once:
// kube-proxy's at start (package modes), each mode's rules by its own
// Cleanup when the switch left it.
func TestModeSwitchSequence(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"iptables-restore", "iptables-save", "nft"} {
		if _, err := execLookPath(tool); err != nil {
			t.Skipf("e2e: needs %s: %v", tool, err)
		}
	}
	b := newBed(t, modeSpecs["nftables"], bedOptions{Nodes: []int{}, Before: func(b *bed) {
		svc := Service("seq", "10.96.0.170", Port("http", TCP, 80, 8080))
		b.apply("seq.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a"))))
	}})
	node := b.node(1)
	if _, err := runInput([]byte(kubeProxyNft), "ip", "netns", "exec", node.NS, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if _, err := runInput([]byte(kubeProxyIptables), "ip", "netns", "exec", node.NS, "iptables-restore", "--noflush"); err != nil {
		t.Fatal(err)
	}
	v, cfgPath := b.startWithConfig(node, "nftables")
	// rules says whose rules are on the node.
	rules := func() []string {
		var owners []string
		if out, _ := Exec(node.NS, "nft", "list", "tables"); strings.Contains(out, "table ip vipproxy") {
			owners = append(owners, "nftables")
		}
		save, _ := Exec(node.NS, "iptables-save")
		if strings.Contains(save, ":VIP-") {
			owners = append(owners, "iptables")
		}
		if strings.Contains(save, ":VIPVS-") {
			owners = append(owners, "ipvs")
		}
		if out, _ := Exec(node.NS, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") || strings.Contains(save, "KUBE-SERVICES") {
			owners = append(owners, "kube-proxy")
		}
		return owners
	}
	ipvsRuns := "iptables" // the fallback, where the kernel has no IPVS
	if realIPVS() {
		ipvsRuns = "ipvs"
	}
	client := b.Pod("pod1b").NS
	for i, st := range []struct{ mode, runs string }{
		{"nftables", "nftables"}, {"iptables", "iptables"}, {"ipvs", ipvsRuns}, {"nftables", "nftables"},
	} {
		if i > 0 {
			writeAtomic(t, cfgPath, strings.Replace(kubeProxyConfig(st.mode), "\niptables:", "\nipvs: {syncPeriod: 2s, minSyncPeriod: 100ms}\niptables:", 1))
		}
		if _, err := eventually(Scaled(30*time.Second), 200*time.Millisecond, func() error {
			if _, body, err := HTTPGet(node.NS, MetricsAddr, "/proxyMode"); err != nil || body != st.runs {
				return fmt.Errorf("/proxyMode = %q (%v), want %q", body, err, st.runs)
			}
			if got := rules(); !slices.Equal(got, []string{st.runs}) {
				return fmt.Errorf("rules on the node of %v, want only %s's", got, st.runs)
			}
			if c := spread(client, "tcp", "10.96.0.170:80", 10, 2); c["pod1a"] != 10 {
				return fmt.Errorf("10 connections: %v, want all on pod1a", c)
			}
			return nil
		}); err != nil {
			t.Fatalf("step %d (%s): %v\n%s", i, st.mode, err, v.Log())
		}
		t.Logf("step %d: %s mode runs %s, alone on the node", i, st.mode, st.runs)
	}
	// Each leftover removed once: kube-proxy's at start, nftables mode's
	// table when the switch left it (once: nothing else deletes it).
	log := v.Log()
	for _, c := range []struct {
		what string
		args []string
		want int
	}{
		{"kube-proxy's iptables chains", []string{"removed kube-proxy's iptables chains", `table="nat"`}, 1},
		{"kube-proxy's nftables tables", []string{"removed tables", "kube-proxy"}, 1},
		{"the nftables mode's table", []string{"removed tables", "ip vipproxy"}, 1},
	} {
		n := 0
		for _, l := range strings.Split(log, "\n") {
			if containsAll(l, c.args...) {
				n++
			}
		}
		if n != c.want {
			t.Errorf("%s removed %d times by the log, want %d", c.what, n, c.want)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
