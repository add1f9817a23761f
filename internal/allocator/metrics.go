package allocator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipproxy/vipproxy/internal/metrics"
)

var (
	// repairInvalid is the number of invalid assignments the last repair
	// pass found, by kind (out_of_range, duplicate) and resource (ip, port).
	repairInvalid = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "vipproxy", Subsystem: "allocator", Name: "invalid_assignments",
		Help: "Allocations the last repair pass found out of range or held by more than one Service",
	}, []string{"kind", "resource"})
	// repairErrors counts invalid assignments reported, per pass.
	repairErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipproxy", Subsystem: "allocator", Name: "repair_errors_total",
		Help: "Invalid allocations reported by the repair loop (counted once per pass that sees them)",
	}, []string{"kind", "resource"})
	// repairLeaked is the number of records held by no live Service.
	repairLeaked = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "vipproxy", Subsystem: "allocator", Name: "leaked_services",
		Help: "Allocation records held by no live Service in the last repair pass, awaiting release",
	})
	// repairReleased counts records the repair loop released.
	repairReleased = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "vipproxy", Subsystem: "allocator", Name: "repair_released_total",
		Help: "Leaked allocation records released by the repair loop",
	})
	// allocated is the number of allocated values per range.
	allocated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "vipproxy", Subsystem: "allocator", Name: "allocated",
		Help: "Allocated values per range, as of the last repair pass",
	}, []string{"range"})
)

func init() {
	metrics.Registry.MustRegister(repairInvalid, repairErrors, repairLeaked, repairReleased, allocated)
}
