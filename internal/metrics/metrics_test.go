package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestKubeProxyLabels pins the label keys of the series kube-proxy v1.34
// exports with ip_family (dashboards and recording rules select by them),
// and network_programming_duration_seconds' buckets (0.25 s to 5 min).
func TestKubeProxyLabels(t *testing.T) {
	for _, tc := range []struct {
		c      prometheus.Collector
		name   string
		labels string
	}{
		{SyncDuration, "kubeproxy_sync_proxy_rules_duration_seconds", "{ip_family}"},
		{SyncFullDuration, "kubeproxy_sync_full_proxy_rules_duration_seconds", "{ip_family}"},
		{SyncLastTimestamp, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "{ip_family}"},
		{SyncLastQueuedTimestamp, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "{ip_family}"},
		{NoLocalEndpointsTotal, "kubeproxy_sync_proxy_rules_no_local_endpoints_total", "{traffic_policy,ip_family}"},
		{IptablesRulesTotal, "kubeproxy_sync_proxy_rules_iptables_total", "{table,ip_family}"},
		{IptablesRulesLast, "kubeproxy_sync_proxy_rules_iptables_last", "{table,ip_family}"},
		{NetworkProgrammingDuration, "kubeproxy_network_programming_duration_seconds", "{ip_family}"},
	} {
		ch := make(chan *prometheus.Desc, 1)
		tc.c.Describe(ch)
		d := (<-ch).String()
		if !strings.Contains(d, `"`+tc.name+`"`) || !strings.Contains(d, "variableLabels: "+tc.labels) {
			t.Errorf("%s: %s, want variable labels %s", tc.name, d, tc.labels)
		}
	}
	b := networkProgrammingBuckets()
	if len(b) != 1+2+59+12+7 || b[1] != 0.25 || b[3] != 1 || b[len(b)-1] != 300 {
		t.Errorf("network programming buckets %v", b)
	}
}
