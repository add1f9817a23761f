// Package metrics declares every Prometheus metric vipproxy exports, with
// kube-proxy's names, types and labels so existing dashboards keep working.
// Packages update them directly; cmd/vipproxy serves Registry.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const ns = "kubeproxy"

var (
	// SyncDuration is the time a Sync took, any kind, by ip_family (one
	// vipproxy sync programs every family: each gets the same observation,
	// where kube-proxy runs one proxier per family).
	SyncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "sync_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"ip_family"})
	// SyncFullDuration is the time a full Sync took, by ip_family.
	SyncFullDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "sync_full_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds for full resyncs", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"ip_family"})
	// SyncPartialDuration is the time a partial Sync took, by ip_family.
	SyncPartialDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "sync_partial_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds for partial resyncs", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"ip_family"})
	// SyncLastTimestamp is when rules were last synced successfully, by ip_family.
	SyncLastTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_last_timestamp_seconds",
		Help: "The last time proxy rules were successfully synced",
	}, []string{"ip_family"})
	// SyncLastQueuedTimestamp is when a sync was last queued, by ip_family.
	SyncLastQueuedTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
		Help: "The last time a sync of proxy rules was queued",
	}, []string{"ip_family"})
	// NetworkProgrammingDuration is the time from a source change to its
	// programming, by ip_family, in kube-proxy's buckets (0.25 s to 5 min).
	NetworkProgrammingDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "network_programming_duration_seconds",
		Help: "In Cluster Network Programming Latency in seconds", Buckets: networkProgrammingBuckets(),
	}, []string{"ip_family"})
	// EndpointChangesPending counts endpoint changes not yet synced.
	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_pending", Help: "Pending proxy rules Endpoint changes",
	})
	// EndpointChangesTotal counts endpoint changes.
	EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_total", Help: "Cumulative proxy rules Endpoint changes",
	})
	// ServiceChangesPending counts service changes not yet synced.
	ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_service_changes_pending", Help: "Pending proxy rules Service changes",
	})
	// ServiceChangesTotal counts service changes.
	ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_service_changes_total", Help: "Cumulative proxy rules Service changes",
	})
	// NoLocalEndpointsTotal counts services with Local policy and no local
	// endpoints, by traffic_policy and ip_family.
	NoLocalEndpointsTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_no_local_endpoints_total",
		Help: "Number of services with a Local traffic policy and no endpoints",
	}, []string{"traffic_policy", "ip_family"})
	// IptablesRulesTotal counts the rules vipproxy owns, by table and ip_family.
	IptablesRulesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_iptables_total", Help: "Total number of iptables rules owned by kube-proxy",
	}, []string{"table", "ip_family"})
	// IptablesRulesLast counts the rules the last sync wrote, by table and ip_family.
	IptablesRulesLast = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "sync_proxy_rules_iptables_last", Help: "Number of iptables rules written by kube-proxy in last sync",
	}, []string{"table", "ip_family"})
	// IptablesRestoreFailures counts failed iptables-restore runs.
	IptablesRestoreFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_iptables_restore_failures_total", Help: "Cumulative proxy iptables restore failures",
	})
	// IptablesPartialRestoreFailures counts failed partial restores.
	IptablesPartialRestoreFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_iptables_partial_restore_failures_total", Help: "Cumulative proxy iptables partial restore failures",
	})
	// NFTablesSyncFailures counts failed nftables transactions.
	NFTablesSyncFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_nftables_sync_failures_total", Help: "Cumulative proxy nftables sync failures",
	})
	// NFTablesCleanupFailures counts failed nftables cleanups.
	NFTablesCleanupFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "sync_proxy_rules_nftables_cleanup_failures_total", Help: "Cumulative proxy nftables cleanup failures",
	})
	// ConntrackReconcileDuration is the time stale-flow cleanup took.
	ConntrackReconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "conntrack_reconciler_sync_duration_seconds",
		Help: "ReconcileConntrackFlowsLatency latency in seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"ip_family"})
	// ConntrackDeletedEntries counts conntrack entries deleted, by ip_family.
	ConntrackDeletedEntries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "conntrack_reconciler_deleted_entries_total",
		Help: "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{"ip_family"})
	// HealthzTotal counts /healthz answers by code.
	HealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "proxy_healthz_total", Help: "Cumulative proxy healthz HTTP status",
	}, []string{"code"})
	// LivezTotal counts /livez answers by code.
	LivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "proxy_livez_total", Help: "Cumulative proxy livez HTTP status",
	}, []string{"code"})

	// ConfigReloads counts config reloads by result ("applied", "rejected").
	ConfigReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "config_reloads_total", Help: "Config file reloads by result",
	}, []string{"result"})
	// SkippedObjects is the number of objects refused as invalid at the last build.
	SkippedObjects = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "vipproxy", Name: "skipped_objects", Help: "Objects refused as invalid in the current state",
	})
	// DriftRepairs counts periodic checks that found the kernel changed
	// behind vipproxy's back, each followed by a repairing full sync.
	DriftRepairs = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "drift_repairs_total", Help: "Kernel state found changed behind vipproxy's back and repaired with a full sync",
	})
	// OutlierEjections counts endpoints taken out of selection by passive
	// outlier ejection, by Service port (only Services with ejection on:
	// the label set is bounded by them).
	OutlierEjections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "outlier_ejections_total", Help: "Endpoints ejected from selection after failed new connections, by Service port",
	}, []string{"service_port"})
	// OutlierEjected is the number of endpoints out of selection now.
	OutlierEjected = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "vipproxy", Name: "outlier_ejected_endpoints", Help: "Endpoints currently ejected by passive outlier ejection",
	})
	// OutlierEventsLost counts conntrack event bursts the kernel dropped
	// (ENOBUFS) while outlier ejection was watching.
	OutlierEventsLost = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "outlier_conntrack_events_lost_total", Help: "Conntrack event overflows (events lost) seen by outlier ejection",
	})
	// ModeInfo is 1 for the mode running, labelled with the mode asked for.
	ModeInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "vipproxy", Name: "proxy_mode_info", Help: "The proxy mode running (requested: the configured one)",
	}, []string{"mode", "requested"})
	// ModeFallbacks counts fallbacks from a requested mode to another.
	ModeFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "proxy_mode_fallbacks_total", Help: "Fallbacks from the requested proxy mode",
	}, []string{"from", "to"})
	// SyncFailures counts failed dataplane syncs by mode.
	SyncFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipproxy", Name: "sync_failures_total", Help: "Failed dataplane syncs",
	}, []string{"mode"})
)

// Registry holds every metric above plus the Go and process collectors.
var Registry = prometheus.NewRegistry()

func init() {
	// Series kube-proxy exports from its start, at zero.
	for _, fam := range IPFamilies {
		ConntrackDeletedEntries.WithLabelValues(fam)
	}
	Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		SyncDuration, SyncFullDuration, SyncPartialDuration, SyncLastTimestamp, SyncLastQueuedTimestamp,
		NetworkProgrammingDuration, EndpointChangesPending, EndpointChangesTotal,
		ServiceChangesPending, ServiceChangesTotal, NoLocalEndpointsTotal,
		IptablesRulesTotal, IptablesRulesLast, IptablesRestoreFailures, IptablesPartialRestoreFailures,
		NFTablesSyncFailures, NFTablesCleanupFailures, ConntrackReconcileDuration, ConntrackDeletedEntries,
		HealthzTotal, LivezTotal, ConfigReloads, SkippedObjects, DriftRepairs, ModeInfo, ModeFallbacks, SyncFailures,
		OutlierEjections, OutlierEjected, OutlierEventsLost,
	)
}

// IPFamilies are the ip_family label values, as kube-proxy spells them.
var IPFamilies = []string{"IPv4", "IPv6"}

// networkProgrammingBuckets are kube-proxy's: 0, 0.25 s, 0.5 s, every
// second to 59 s, every 5 s to 115 s, every 30 s to 5 min.
func networkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}
