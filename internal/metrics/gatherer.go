package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"
	// Registered in component-base's legacy registry, as in kube-proxy:
	// client-go's rest_client_* series and kubernetes_build_info.
	_ "k8s.io/component-base/metrics/prometheus/restclient"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// Gatherer is what /metrics serves: Registry, plus the series client-go
// and component-base report through component-base's legacy registry, as
// kube-proxy's /metrics has them (rest_client_requests_total,
// rest_client_request_duration_seconds, …, kubernetes_build_info). That
// registry's Go and process collectors are left out: Registry has them.
var Gatherer prometheus.Gatherer = prometheus.Gatherers{Registry, componentBase{}}

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
