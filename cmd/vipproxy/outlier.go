package main

// Passive outlier ejection (vipproxy.io/outlier-ejection): the Detector of
// package outlier fed with this node's conntrack events, and the overlay
// that takes ejected endpoints out of the State every Build returns.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/flowstat"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/outlier"
)

// eventReceiver is a conntrack event subscription (conntrack.Events).
type eventReceiver interface {
	Poll() ([]conntrack.Event, error)
	Close() error
}

// serviceEventer records Events on Services (the Kubernetes source).
type serviceEventer interface {
	ServiceEvent(ctx context.Context, svc model.ServiceName, warning bool, reason, message string) error
}

// ejector owns the Detector. Build (on the loop's goroutine) calls watch
// and apply; its own goroutine feeds events and time.
type ejector struct {
	log        *slog.Logger
	invalidate func() // rebuild and sync (reconcile.Loop.Invalidate)
	// events, in Kubernetes mode, records each ejection and return as an
	// Event on the Service.
	events serviceEventer

	mu      sync.Mutex
	det     *outlier.Detector
	ejected map[netip.AddrPort]outlier.Ejection
	// suspects are the Detector's (outlier.Detector.Suspects), and
	// observe the ports of the last watch that hold one (found through
	// the suspects' groups when they change, kept up to date by watch
	// for the ports it sees rebuilt): apply observes every flow of those
	// that are sampled. sampling says the last watch
	// saw a port with SampledFlows.
	suspects map[netip.AddrPort][]string
	observe  map[*model.ServicePort]bool
	sampling bool
	started  bool
	ctx      context.Context
	// stats, when topN > 0, counts every port's endpoints' flows for the
	// per-endpoint metrics (--endpoint-metrics-services).
	stats *flowstat.Stats
	topN  int
	// watched are the ports of the last watch: a State with the same
	// port pointers (the Builder reuses unchanged ports) changes nothing.
	watched []*model.ServicePort
	// ports are the watched ports by name (ejection on, or every port
	// with endpoints when stats count), and gen the watch count.
	ports map[model.ServicePortName]*watchedPort
	gen   uint64
	// ejecting says the last watch saw a port with ejection on, and
	// known that ejecting has been set (see quietFlows).
	ejecting, known bool
}

// outlierConfig is the Detector's configuration from the --outlier-* flags.
func outlierConfig(cfg *config.Config) outlier.Config {
	return outlier.Config{Failures: cfg.OutlierFailures, Window: cfg.OutlierWindow, BaseEjection: cfg.OutlierBaseEjection,
		MaxShare: float64(cfg.OutlierMaxEjectedPercent) / 100}
}

func newEjector(ctx context.Context, cfg outlier.Config, topN int, log *slog.Logger) *ejector {
	j := &ejector{ctx: ctx, log: log, det: outlier.New(cfg), ejected: map[netip.AddrPort]outlier.Ejection{}, topN: topN,
		ports: map[model.ServicePortName]*watchedPort{}}
	if topN > 0 {
		j.stats = flowstat.New()
	}
	return j
}

// watch tells the Detector the endpoints of the ports with ejection on in
// st (as built, before apply), and starts watching conntrack the first
// time there are any.
func (j *ejector) watch(st *model.State) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if slices.Equal(j.watched, st.Ports) {
		return
	}
	// Only the ports the Builder rebuilt (new pointers) are looked at
	// again: walking 10,000 ports' endpoints on every sync cost it 20 ms.
	j.gen++
	var all map[string][]netip.AddrPort
	if j.stats != nil {
		all = make(map[string][]netip.AddrPort, len(j.ports))
	}
	ejecting, sampling := false, false
	ports := st.Ports
	if u := st.Uses; u != nil && u.OutlierEjection == 0 && j.stats == nil {
		// No port to watch (the loop would look at none of them): at
		// 50,000 ports the pass took half a millisecond of every change.
		ports, sampling = nil, u.SampledFlows > 0
	}
	for _, sp := range ports {
		ejecting = ejecting || sp.OutlierEjection
		sampling = sampling || sp.SampledFlows
		if !sp.OutlierEjection && j.stats == nil {
			continue
		}
		w := j.ports[sp.Name]
		if w == nil {
			w = &watchedPort{name: sp.Name.String()}
			j.ports[sp.Name] = w
		}
		w.gen = j.gen
		if w.sp != sp {
			delete(j.observe, w.sp)
			w.sp = sp
			reach := sp.ReachableEndpoints()
			w.eps = make([]netip.AddrPort, 0, len(reach)) // not in place: stats keep the old one
			for _, e := range reach {
				w.eps = append(w.eps, netip.AddrPortFrom(e.IP.Unmap(), e.Port))
			}
			if sp.OutlierEjection {
				j.det.SetGroup(w.name, w.eps)
				j.observeIfSuspect(w)
			} else {
				j.det.SetGroup(w.name, nil)
			}
		}
		if all != nil && len(w.eps) > 0 {
			all[w.name] = w.eps
		}
	}
	for name, w := range j.ports {
		if w.gen != j.gen {
			j.det.SetGroup(w.name, nil)
			delete(j.observe, w.sp)
			delete(j.ports, name)
		}
	}
	if j.known && ejecting != j.ejecting && j.stats == nil && j.invalidate != nil {
		j.invalidate() // quietFlows changed: build again with it
	}
	j.ejecting, j.known, j.sampling = ejecting, true, sampling
	j.watched = st.Ports // a State never changes once built: no copy (400 KB a sync at 50,000 ports)
	j.ejected = j.det.Ejected()
	if j.stats != nil {
		j.stats.Watch(all)
	}
	if len(j.ports) > 0 && !j.started {
		j.started = true
		go j.run()
	}
}

// quietFlows is BuildOptions.QuietFlows for a Build of s: whether the
// flows of ports without ejection can report no conntrack events. They
// can while vipproxy reads events for ejection only (no per-endpoint
// metrics) and some port has ejection on: as of the last watch (a change
// of it since asks for a rebuild), or before the first one from s's
// Services and the node's default.
func (j *ejector) quietFlows(s *model.Snapshot, byDefault bool) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stats != nil {
		return false
	}
	if !j.known {
		j.ejecting = slices.ContainsFunc(s.Services, func(svc *model.Service) bool {
			return svc.OutlierEjection == "on" || (svc.OutlierEjection == "" && byDefault)
		})
		j.known = true
	}
	return j.ejecting
}

// watchedPort is a port the ejector watched: its endpoints as of sp.
type watchedPort struct {
	sp   *model.ServicePort
	name string
	eps  []netip.AddrPort
	gen  uint64 // the last watch that saw it
}

// apply returns st with the ejected endpoints taken out of the ports with
// ejection on, and every flow observed of a sampled port that holds a
// suspect endpoint (ServicePort.SampledFlows cleared): copies of those
// ports; st itself is not changed. A set that would be left empty keeps
// its endpoints: the Detector never ejects a Service's last endpoint, but
// a Local set may hold only ejected ones.
func (j *ejector) apply(st *model.State) *model.State {
	j.mu.Lock()
	ejected, observe := j.ejected, j.observe
	if !j.sampling {
		observe = nil
	}
	j.mu.Unlock()
	if len(ejected) == 0 && len(observe) == 0 {
		return st
	}
	var out *model.State
	for i, sp := range st.Ports {
		if !sp.OutlierEjection {
			continue
		}
		keep := func(e model.Endpoint) bool {
			_, gone := ejected[netip.AddrPortFrom(e.IP.Unmap(), e.Port)]
			return !gone
		}
		cluster, local := sp.ClusterEndpoints, sp.LocalEndpoints
		if len(ejected) > 0 {
			cluster, local = filterKept(cluster, keep), filterKept(local, keep)
		}
		observeAll := sp.SampledFlows && len(observe) > 0 && observe[sp]
		if len(cluster) == len(sp.ClusterEndpoints) && len(local) == len(sp.LocalEndpoints) && !observeAll {
			continue
		}
		if out == nil {
			cp := *st
			cp.Ports = slices.Clone(st.Ports)
			out = &cp
		}
		cp := *sp
		cp.ClusterEndpoints, cp.LocalEndpoints = cluster, local
		cp.SampledFlows = cp.SampledFlows && !observeAll
		out.Ports[i] = &cp
	}
	if out == nil {
		return st
	}
	return out
}

// observeIfSuspect adds w's port to the observed ones when it holds a
// suspect (a port rebuilt or new since the suspects last changed).
// Called with j.mu held.
func (j *ejector) observeIfSuspect(w *watchedPort) {
	if len(j.suspects) == 0 {
		return
	}
	for _, ep := range w.eps {
		if _, ok := j.suspects[ep]; ok {
			if j.observe == nil {
				j.observe = map[*model.ServicePort]bool{}
			}
			j.observe[w.sp] = true
			return
		}
	}
}

// portsOf returns the ports of the last watch the suspects belong to
// (their groups are the ports' names). Called with j.mu held.
func (j *ejector) portsOf(suspects map[netip.AddrPort][]string) map[*model.ServicePort]bool {
	if len(suspects) == 0 {
		return nil
	}
	names := map[string]bool{}
	for _, groups := range suspects {
		for _, g := range groups {
			names[g] = true
		}
	}
	out := make(map[*model.ServicePort]bool, len(names))
	for _, w := range j.ports {
		if names[w.name] {
			out[w.sp] = true
		}
	}
	return out
}

// filterKept returns the endpoints keep accepts, or eps itself when that
// would be none of them (nil stays nil).
func filterKept(eps []model.Endpoint, keep func(model.Endpoint) bool) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	if len(out) == 0 || len(out) == len(eps) {
		return eps
	}
	return out
}

// ejections returns the endpoints ejected now, for explain.
func (j *ejector) ejections() map[netip.AddrPort]outlier.Ejection {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ejected
}

// eventPause is how long the reader lets conntrack events queue between
// reads.
const eventPause = 20 * time.Millisecond

// run feeds the Detector conntrack events and a 100 ms clock until the
// context ends. Without conntrack events (not Linux, no CAP_NET_ADMIN)
// ejection is off, and says so once.
func (j *ejector) run() {
	evs, err := subscribeConntrack()
	if err != nil {
		j.log.Error("outlier ejection is off: cannot watch conntrack events", "err", err)
		return
	}
	batches := make(chan []conntrack.Event, 256)
	go func() {
		defer close(batches)
		for {
			// Read what queued every eventPause, never waiting on the
			// socket: the kernel then never wakes this thread as it
			// queues an event, in the path of the packet that caused it
			// (a wake-up per connection put about 15 % on the first
			// packet's latency). At 5,000 connections/s, reading every
			// 5 ms cost 10 % of a core, every 20 ms 8 %
			// (TestObservationCost); the socket holds 4 MiB of events,
			// about 3,000. Detection is 20 ms later at most.
			time.Sleep(eventPause)
			got, err := evs.Poll()
			if errors.Is(err, syscall.ENOBUFS) {
				metrics.OutlierEventsLost.Inc()
				continue
			}
			if err != nil {
				if j.ctx.Err() == nil {
					j.log.Error("outlier ejection: conntrack events ended", "err", err)
				}
				return
			}
			if len(got) == 0 {
				continue
			}
			select {
			case batches <- got:
			case <-j.ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-j.ctx.Done():
			evs.Close()
			return
		case got, ok := <-batches:
			if !ok {
				return
			}
			j.step(got, time.Now())
		case now := <-tick.C:
			j.step(nil, now)
		}
	}
}

// step feeds events seen at now, advances the clock and acts on changes.
func (j *ejector) step(evs []conntrack.Event, now time.Time) {
	j.mu.Lock()
	for _, ev := range evs {
		j.det.Observe(ev, now)
		if j.stats != nil {
			j.stats.Observe(ev)
		}
	}
	j.det.Tick(now)
	changes := j.det.Changes()
	if len(changes) > 0 {
		j.ejected = j.det.Ejected()
	}
	// A sampled port's flows are all observed while it holds a suspect
	// (see apply): a change of the suspects rebuilds, when some port is
	// sampled.
	resample := false
	if j.det.SuspectsChanged() {
		j.suspects = j.det.Suspects()
		j.observe = j.portsOf(j.suspects)
		resample = j.sampling
	}
	n := len(j.ejected)
	j.mu.Unlock()
	if len(changes) == 0 {
		if resample && j.invalidate != nil {
			j.invalidate()
		}
		return
	}
	metrics.OutlierEjected.Set(float64(n))
	for _, c := range changes {
		if c.Ejected {
			for _, g := range c.Groups {
				metrics.OutlierEjections.WithLabelValues(g).Inc()
			}
			j.log.Warn("endpoint ejected", "endpoint", c.Endpoint.String(), "servicePorts", c.Groups,
				"until", c.Ejection.Until.Format(time.RFC3339), "ejections", c.Ejection.Count, "reason", c.Ejection.Reason)
		} else {
			j.log.Info("endpoint back in selection", "endpoint", c.Endpoint.String(), "servicePorts", c.Groups)
		}
		j.recordEvents(c)
	}
	j.invalidate()
}

// recordEvents records c on each Service it concerns, in the background
// (an API server that is slow or refuses must not hold up the Detector).
func (j *ejector) recordEvents(c outlier.Change) {
	if j.events == nil {
		return
	}
	seen := map[model.ServiceName]bool{}
	for _, g := range c.Groups {
		svc, ok := serviceOf(g)
		if !ok || seen[svc] {
			continue
		}
		seen[svc] = true
		reason, msg := "EndpointRestored", "endpoint "+c.Endpoint.String()+" is back in selection after its ejection"
		if c.Ejected {
			reason = "EndpointEjected"
			msg = fmt.Sprintf("endpoint %s ejected until %s (ejection %d): %s", c.Endpoint, c.Ejection.Until.Format(time.RFC3339), c.Ejection.Count, c.Ejection.Reason)
		}
		go func() {
			ctx, cancel := context.WithTimeout(j.ctx, 10*time.Second)
			defer cancel()
			if err := j.events.ServiceEvent(ctx, svc, c.Ejected, reason, msg); err != nil {
				j.log.Error("outlier ejection: event not recorded", "service", svc.String(), "err", err)
			}
		}()
	}
}

// serviceOf returns the Service of a ServicePortName's string
// ("ns/name:port/PROTO" or "ns/name/PROTO").
func serviceOf(port string) (model.ServiceName, bool) {
	ns, rest, ok := strings.Cut(port, "/")
	if !ok {
		return model.ServiceName{}, false
	}
	name := rest
	if i := strings.IndexAny(rest, ":/"); i >= 0 {
		name = rest[:i]
	}
	return model.ServiceName{Namespace: ns, Name: name}, name != ""
}

// Per-endpoint connection metrics (--endpoint-metrics-services).
var (
	endpointNewDesc = prometheus.NewDesc("vipproxy_endpoint_connections_total",
		"New TCP connections DNATed to the endpoint (conntrack), for the top Service ports", []string{"service_port", "endpoint"}, nil)
	endpointFailedDesc = prometheus.NewDesc("vipproxy_endpoint_failed_connections_total",
		"New TCP connections to the endpoint refused or unanswered (conntrack), for the top Service ports", []string{"service_port", "endpoint"}, nil)
	endpointLiveDesc = prometheus.NewDesc("vipproxy_endpoint_active_flows",
		"TCP flows to the endpoint answered and not yet ended (conntrack), for the top Service ports", []string{"service_port", "endpoint"}, nil)
)

// Describe implements prometheus.Collector.
func (j *ejector) Describe(ch chan<- *prometheus.Desc) {
	ch <- endpointNewDesc
	ch <- endpointFailedDesc
	ch <- endpointLiveDesc
}

// Collect implements prometheus.Collector: the topN ports' endpoints.
func (j *ejector) Collect(ch chan<- prometheus.Metric) {
	j.mu.Lock()
	var top []flowstat.Port
	if j.stats != nil {
		top = j.stats.Top(j.topN)
	}
	j.mu.Unlock()
	for _, p := range top {
		for _, e := range p.Endpoints {
			ep := e.Endpoint.String()
			ch <- prometheus.MustNewConstMetric(endpointNewDesc, prometheus.CounterValue, float64(e.New), p.Name, ep)
			ch <- prometheus.MustNewConstMetric(endpointFailedDesc, prometheus.CounterValue, float64(e.Failed), p.Name, ep)
			ch <- prometheus.MustNewConstMetric(endpointLiveDesc, prometheus.GaugeValue, float64(e.Live), p.Name, ep)
		}
	}
}
