package iptables

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestInvalidDropPackets(t *testing.T) {
	out := []byte(`-N VIP-FORWARD
-A VIP-FORWARD -m conntrack --ctstate INVALID -c 7 420 -j DROP
-A VIP-FORWARD -m mark --mark 0x4000/0x4000 -c 99 1000 -j ACCEPT
-A VIP-FORWARD -m conntrack --ctstate INVALID -c 3 180 -j DROP
`)
	if got := invalidDropPackets(out); got != 10 {
		t.Errorf("invalidDropPackets = %d, want 10 (the INVALID DROP rules only)", got)
	}
}

// TestKernelCTInvalidCollector: the collector reads the packet counters of
// the INVALID DROP rule from the kernel, summed over both families, as
// kube-proxy's kubeproxy_iptables_ct_state_invalid_dropped_packets_total.
// (ip6tables-nft ignores preset counters, so only IPv4's is nonzero.)
func TestKernelCTInvalidCollector(t *testing.T) {
	ns := newNetns(t)
	e := &Exec{Prefix: []string{"ip", "netns", "exec", ns}}
	for _, fam := range []Family{IPv4, IPv6} {
		nsRun(t, ns, e.bin(fam, "tables"), "-t", "filter", "-N", chainForward)
		nsRun(t, ns, e.bin(fam, "tables"), "-t", "filter", "-A", chainForward, "-m", "conntrack", "--ctstate", "INVALID", "-c", "5", "300", "-j", "DROP")
	}
	ch := make(chan prometheus.Metric, 1)
	(&CTInvalidCollector{Exec: e}).Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 5 {
		t.Errorf("collected %v, want 5 (IPv4's rule)", got)
	}
}
