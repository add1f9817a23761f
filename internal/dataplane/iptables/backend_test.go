package iptables

import (
	"context"
	"os/exec"
	"testing"
)

// TestKernelDetectVariant: in network namespaces with both backends, the
// backend follows kubelet's hint chain, else the one with more rules, else
// the system's.
func TestKernelDetectVariant(t *testing.T) {
	for _, bin := range []string{"iptables-legacy", "iptables-nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s", bin)
		}
	}
	ctx := context.Background()
	tests := []struct {
		name  string
		setup [][]string
		want  string
	}{
		{"empty: the system's", nil, ""},
		{"kubelet hint in legacy", [][]string{{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"}}, "legacy"},
		{"kubelet hint in nft wins over more legacy rules", [][]string{
			{"iptables-nft", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
			{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-legacy", "-t", "nat", "-A", "KUBE-SERVICES", "-j", "RETURN"},
			{"iptables-legacy", "-t", "nat", "-A", "KUBE-SERVICES", "-j", "RETURN"},
		}, "nft"},
		{"vipproxy's own canary wins over more rules elsewhere (a restart)", [][]string{
			{"iptables-nft", "-t", "nat", "-N", ChainCanary},
			{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-legacy", "-t", "nat", "-A", "KUBE-SERVICES", "-j", "RETURN"},
		}, "nft"},
		{"no hint: more rules (kube-proxy's legacy leftovers)", [][]string{
			{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-legacy", "-t", "nat", "-A", "KUBE-SERVICES", "-j", "RETURN"},
		}, "legacy"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNetns(t)
			for _, c := range tc.setup {
				nsRun(t, ns, c...)
			}
			got, why := DetectVariant(ctx, &Exec{Prefix: []string{"ip", "netns", "exec", ns}})
			if got != tc.want {
				t.Errorf("DetectVariant = %q (%s), want %q", got, why, tc.want)
			}
			t.Logf("%s: %q, %s", tc.name, got, why)
		})
	}
}
