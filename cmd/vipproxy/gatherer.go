package main

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/vipproxy/vipproxy/internal/metrics"
	// Registered in component-base's legacy registry, as in kube-proxy:
	// client-go's rest_client_* series and kubernetes_build_info.
	_ "k8s.io/component-base/metrics/prometheus/restclient"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// metricsGatherer is what /metrics serves: metrics.Registry, plus the
// series client-go and component-base report through component-base's
// legacy registry, as kube-proxy's /metrics has them
// (rest_client_requests_total, rest_client_request_duration_seconds, …,
// kubernetes_build_info). That registry's Go and process collectors are
// left out: metrics.Registry has them. It lives in the wiring, not in
// internal/metrics, because component-base brings apimachinery and
// client-go, which nothing past the source boundary may import.
var metricsGatherer prometheus.Gatherer = prometheus.Gatherers{metrics.Registry, componentBase{}}

type componentBase struct{}

func (componentBase) Gather() ([]*dto.MetricFamily, error) {
	fams, err := legacyregistry.DefaultGatherer.Gather()
	out := fams[:0]
	for _, f := range fams {
		if n := f.GetName(); strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") {
			continue
		}
		out = append(out, f)
	}
	return out, err
}
