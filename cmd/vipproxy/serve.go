package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/cpustat"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/healthcheck"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netinfo"
	"github.com/vipproxy/vipproxy/internal/reconcile"
)

// dataplaneOptions derives the options every mode shares from the config
// and this node's addresses (nodeAddrs: the Node object's, when a source
// knows it), and the addresses NodePorts (and so health-check node ports)
// are served on.
func dataplaneOptions(cfg *config.Config, nodeName string, node nodeFacts, log *slog.Logger) (dataplane.Options, []netip.Addr, error) {
	opts, nodePortAddrs, _, err := dataplaneOptionsLoopback(cfg, nodeName, node, log)
	return opts, nodePortAddrs, err
}

// dataplaneOptionsLoopback is dataplaneOptions plus the loopback addresses
// the kernel modes serve NodePorts on through the userspace proxy
// (config.NodePorts.Loopback).
func dataplaneOptionsLoopback(cfg *config.Config, nodeName string, node nodeFacts, log *slog.Logger) (dataplane.Options, []netip.Addr, []netip.Addr, error) {
	nodeAddrs := node.addrs
	local, err := netinfo.LocalAddrs()
	if err != nil {
		return dataplane.Options{}, nil, nil, err
	}
	local = netinfo.Without(local, ownAddrs())
	var bind netip.Addr
	if a, err := netip.ParseAddr(cfg.KubeProxy.BindAddress); err == nil {
		bind = a
	}
	opts := dataplane.Options{
		NodeName:      nodeName,
		NodeIPs:       netinfo.PrimaryIPs(nodeAddrs, bind, netinfo.DefaultRouteAddrs(), local),
		MasqueradeAll: cfg.MasqueradeAll(),
		MasqueradeBit: cfg.MasqueradeBit(),
		Scheduler:     cfg.Scheduler(),
		Logger:        log,
	}
	np := cfg.NodePorts()
	opts.NodePortAddresses = np.Prefixes
	switch {
	case np.Primary && len(np.Prefixes) > 0:
		// "primary" among other ranges: the primary IPs as host prefixes.
		for _, ip := range opts.NodeIPs {
			opts.NodePortAddresses = append(opts.NodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
		}
	case !np.Primary && len(np.Prefixes) == 0:
		// Loopback only (or nothing): no NodePort in the kernel, which
		// an empty list would not say (it means the primary IPs).
		opts.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	}
	switch cfg.DetectLocalMode() {
	case config.LocalModeClusterCIDR:
		opts.ClusterCIDRs = cfg.ClusterCIDRs()
	case config.LocalModeNodeCIDR:
		opts.ClusterCIDRs = node.podCIDRs
		if len(node.podCIDRs) == 0 {
			log.Warn("detectLocalMode NodeCIDR: this node's Node object has no spec.podCIDRs yet; local traffic is not detected until it has")
		}
	case config.LocalModeBridgeInterface:
		opts.PodInterface = cfg.KubeProxy.DetectLocal.BridgeInterface
	case config.LocalModeInterfaceNamePrefix:
		opts.PodInterface, opts.PodInterfacePrefix = cfg.KubeProxy.DetectLocal.InterfaceNamePrefix, true
	}
	if opts.PodInterface != "" && cfg.Mode() == config.ModeUserspace {
		log.Warn("detectLocalMode " + string(cfg.DetectLocalMode()) + " is ignored in userspace mode: a proxy socket does not see the interface a connection came in on")
	}
	// The service range is only known for sure in standalone mode, where
	// vipproxy allocates from it; in Kubernetes mode the API server owns it.
	if cfg.Standalone() {
		opts.ServiceCIDRs = cfg.ServiceCIDRs()
	}
	return opts, netinfo.NodePortAddrs(opts.NodePortAddresses, opts.NodeIPs, local), np.Loopback, nil
}

// buildOptions are the model.BuildOptions of cfg. The service range is
// known for sure only in standalone mode, where vipproxy allocates from it,
// and only there are topology hints derived.
func buildOptions(cfg *config.Config, nodeName string) model.BuildOptions {
	o := model.BuildOptions{NodeName: nodeName, ExternalIPCIDRs: cfg.ExternalIPAllowList(), OutlierEjection: cfg.OutlierEjection}
	if cfg.Standalone() {
		o.ServiceCIDRs = cfg.ServiceCIDRs()
		o.DeriveHints = true // no EndpointSlice controller writes hints there
	}
	return o
}

// defaultModeNotice returns the warning for a config that leaves the mode
// unset (kubeadm writes `mode: ""`): kube-proxy then runs iptables mode,
// vipproxy its nftables mode, and an operator swapping the image should
// know what that changes.
func defaultModeNotice(cfg *config.Config) (string, bool) {
	if !cfg.ModeDefaulted {
		return "", false
	}
	return "proxy mode not set: running nftables mode, vipproxy's default (kube-proxy's is iptables). " +
		"Unlike kube-proxy's iptables mode it serves NodePorts on the node's primary IPs only unless nodePortAddresses says otherwise, " +
		"does not answer 127.0.0.1:NodePort unless nodePortAddresses says localhost, and leaves no iptables rules to inspect (see `nft list table ip vipproxy`). " +
		"Set mode: iptables to keep kube-proxy's behaviour", true
}

// serve runs vipproxy until ctx is done. The dataplane is built once the
// source has delivered its first snapshot, so node IPs come from the Node
// object when a source knows it (as kube-proxy waits for its Node).
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	nodeName, err := cfg.NodeName()
	if err != nil {
		return err
	}
	if cfg.Mode() != config.ModeUserspace {
		applyHostSettings(cfg, log)
	}
	gcForMode, restoreGC := coldStartGC()
	coldStart := make(chan struct{}) // closed when the cold start is done
	src, closeSrc, srcReady, err := newSource(ctx, cfg, nodeName, coldStart, log)
	if err != nil {
		return err
	}
	defer closeSrc()
	health := healthcheck.NewProxierHealth(2*cfg.SyncPeriod(), nil)
	if err := startServer(ctx, log, "healthz", cfg.KubeProxy.HealthzBindAddress, health.Handler(), cfg.KubeProxy.BindAddressHardFail); err != nil {
		return err
	}
	// The metrics server answers from the start, as kube-proxy's: /metrics
	// and /debug/pprof cover the cold start; what needs the dataplane
	// answers 503 until it exists.
	p := &proxy{nodeName: nodeName, log: log}
	p.cfg.Store(cfg)
	if err := startServer(ctx, log, "metrics", cfg.KubeProxy.MetricsBindAddress, metricsHandler(&p.cfg, &p.running, p.explain), cfg.KubeProxy.BindAddressHardFail); err != nil {
		return err
	}
	log.Info("starting vipproxy", "node", nodeName, "mode", cfg.Mode(), "source", sourceName(cfg))
	if msg, ok := defaultModeNotice(cfg); ok {
		log.Warn(msg)
	}

	snaps := make(chan *model.Snapshot, 1)
	srcErr := make(chan error, 1)
	go func() { srcErr <- src.Run(ctx, snaps) }()
	var first *model.Snapshot
	select {
	case <-ctx.Done():
		return nil
	case err := <-srcErr:
		return fmt.Errorf("source: %w", err)
	case first = <-snaps:
	}
	if err := srcReady(); err != nil {
		return err // before anything is programmed
	}

	p.nodeAddrs = nodeFactsOf(first)
	opts, nodePortAddrs, loopback, err := dataplaneOptionsLoopback(cfg, nodeName, p.nodeAddrs, log)
	if err != nil {
		return err
	}
	dp, err := newDataplane(cfg, cfg.Mode(), opts)
	if err != nil {
		return fmt.Errorf("%s mode: %w", cfg.Mode(), err)
	}
	p.opts = opts
	p.setMode(dp.Mode())
	gcForMode(dp.Mode())
	p.loopback = &loopbackNodePorts{log: log.With("component", "loopback-nodeports")}
	defer p.loopback.close(context.WithoutCancel(ctx))
	if dp.Mode() == config.ModeIPTables {
		registerLoopbackMetric() // kube-proxy exports it in iptables mode
	}
	p.loopback.set(ctx, loopbackFor(dp.Mode(), loopback), opts)
	metrics.ModeInfo.WithLabelValues(dp.Mode(), cfg.Mode()).Set(1)
	log.Info("dataplane ready", "mode", dp.Mode(), "nodeIPs", opts.NodeIPs, "nodePortAddresses", nodePortAddrs)

	p.svcHealth = &healthcheck.ServiceHealth{Addrs: nodePortAddrs, Proxier: health, Logger: log.With("component", "healthcheck")}
	defer p.svcHealth.Close()
	// The loop calls Build on its own goroutine only; the Builder rebuilds
	// just the Services a snapshot changed.
	var builder model.Builder
	p.ejector = newEjector(ctx, outlierConfig(cfg), cfg.EndpointMetricsServices, log.With("component", "outlier"))
	if ev, ok := src.(serviceEventer); ok {
		p.ejector.events = ev // Kubernetes mode: Events on the Services
	}
	if cfg.EndpointMetricsServices > 0 {
		if err := metrics.Registry.Register(p.ejector); err != nil {
			log.Error("per-endpoint metrics not registered", "err", err)
		}
	}
	p.ejector.invalidate = func() {
		if l := p.running.Load(); l != nil {
			l.Invalidate()
		}
	}
	p.ramp = newRamp(p.ejector.invalidate)
	trim := newTrimmer(log.With("component", "memory"))
	go trim.run(ctx)
	p.loop, err = reconcile.New(reconcile.Options{
		Dataplane: dp,
		Build: func(s *model.Snapshot) *model.State {
			o := buildOptions(cfg, nodeName)
			o.Balances = balancesFor(*p.mode.Load())
			// Only nftables mode sets a flow's event mask: elsewhere a
			// change of QuietFlows would rebuild every port for nothing.
			o.QuietFlows = *p.mode.Load() == config.ModeNFTables && p.ejector.quietFlows(s, o.OutlierEjection)
			st := builder.Build(s, o)
			p.ejector.watch(st)
			return p.ramp.apply(p.ejector.apply(st))
		},
		MinSyncPeriod: cfg.MinSyncPeriod(),
		SyncPeriod:    cfg.SyncPeriod(),
		Health:        health,
		AfterSync: append(afterSyncHooks(cfg, dp.Mode(), opts.NodeIPs, log), p.svcHealth.Sync, p.loopback.sync, afterColdStart(restoreGC, coldStart, log), trim.afterSync,
			newDrainer(log.With("component", "drain"), func() bool { return *p.mode.Load() == config.ModeUserspace }).afterSync),
		Logger: log,
	})
	if err != nil {
		return err
	}
	p.running.Store(p.loop)
	if cfg.ConfigFile != "" {
		r := &reloader{path: cfg.ConfigFile, proxy: p, log: log.With("component", "reload")}
		go r.watch(ctx)
	}

	loopIn := make(chan *model.Snapshot, 1)
	loopIn <- first
	loopDone := make(chan error, 1)
	go func() { loopDone <- p.loop.Run(ctx, loopIn) }()
	for {
		select {
		case err := <-srcErr:
			if ctx.Err() == nil && err != nil {
				return fmt.Errorf("source: %w", err)
			}
			return <-loopDone
		case err := <-loopDone:
			return err
		case s := <-snaps:
			select {
			case loopIn <- s:
			case <-ctx.Done():
				return <-loopDone
			}
			if addrs := nodeFactsOf(s); !addrs.equal(p.currentNodeAddrs()) {
				log.Info("node addresses or pod CIDRs changed", "addresses", addrs.addrs, "podCIDRs", addrs.podCIDRs)
				if err := p.switchTo(ctx, p.cfg.Load(), addrs); err != nil {
					log.Error("rebuilding the dataplane for new node addresses failed", "err", err)
				}
			}
		}
	}
}

// nodeFacts is what the dataplane options take from this node's Node
// object: its addresses (primary IPs) and pod CIDRs (detectLocalMode
// NodeCIDR). A change of either rebuilds the dataplane.
type nodeFacts struct {
	addrs    []netip.Addr
	podCIDRs []netip.Prefix
}

func (a nodeFacts) equal(b nodeFacts) bool {
	return slices.Equal(a.addrs, b.addrs) && slices.Equal(a.podCIDRs, b.podCIDRs)
}

// nodeFactsOf returns the Node's facts from a snapshot (zero without one).
func nodeFactsOf(s *model.Snapshot) nodeFacts {
	if s == nil || s.Node == nil {
		return nodeFacts{}
	}
	return nodeFacts{addrs: s.Node.Addresses, podCIDRs: s.Node.PodCIDRs}
}

// proxy is the running proxy's mutable wiring: the config in force, the
// node addresses the dataplane was built for, and the loop.
type proxy struct {
	nodeName  string
	log       *slog.Logger
	loop      *reconcile.Loop
	running   atomic.Pointer[reconcile.Loop] // loop, for the metrics server, once it exists
	svcHealth *healthcheck.ServiceHealth
	cfg       atomic.Pointer[config.Config]
	// ejector is passive outlier ejection (outlier.go), ramp slow start
	// (ramp.go).
	ejector *ejector
	ramp    *ramp
	// mode is the running dataplane's mode (after any fallback), for the
	// balancing algorithms Build lets through.
	mode atomic.Pointer[string]

	mu        sync.Mutex // serialises switchTo
	nodeAddrs nodeFacts
	opts      dataplane.Options
	loopback  *loopbackNodePorts
}

func (p *proxy) setMode(m string) { p.mode.Store(&m) }

// balancesFor returns the balancing algorithms (the vipproxy.io/lb-algorithm
// annotation) a running mode implements, for model.BuildOptions.Balances:
// every one in the nftables and userspace modes; random and round-robin
// in iptables mode (no hash of the source there); round-robin (wrr)
// and consistent-hash (mh) in ipvs mode, which has no random scheduler. A
// Service asking for another gets the mode's default and a Problem naming
// the annotation.
func balancesFor(mode string) []model.Balance {
	switch mode {
	case config.ModeNFTables, config.ModeUserspace:
		return nil
	case config.ModeIPTables:
		return []model.Balance{model.BalanceRandom, model.BalanceRoundRobin}
	case config.ModeIPVS:
		return []model.Balance{model.BalanceRoundRobin, model.BalanceConsistentHash}
	}
	return []model.Balance{}
}

// loopbackFor is what the loopback NodePort proxy serves beside a
// dataplane running mode: nothing beside the userspace mode, which serves
// loopback NodePorts itself.
func loopbackFor(mode string, addrs []netip.Addr) []netip.Addr {
	if mode == config.ModeUserspace {
		return nil
	}
	return addrs
}

func (p *proxy) currentNodeAddrs() nodeFacts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodeAddrs
}

// switchTo makes the running proxy use next and nodeAddrs. Periods change
// in place. Anything the dataplane is built from (mode, masquerading,
// node and NodePort addresses, scheduler, …) builds a new dataplane, which
// programs everything before the old one is cleaned up, so no VIP is left
// unserved in between. On error the running dataplane stays.
func (p *proxy) switchTo(ctx context.Context, next *config.Config, nodeAddrs nodeFacts) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	opts, nodePortAddrs, loopback, err := dataplaneOptionsLoopback(next, p.nodeName, nodeAddrs, p.log)
	if err != nil {
		return err
	}
	p.loop.SetPeriods(next.MinSyncPeriod(), next.SyncPeriod())
	old := p.loop.Dataplane()
	p.nodeAddrs = nodeAddrs
	reasons := rebuildReasons(p.cfg.Load(), next, p.opts, opts)
	if len(reasons) == 0 {
		p.loopback.set(ctx, loopbackFor(old.Mode(), loopback), opts)
		return nil
	}
	p.log.Info("building a new dataplane", "changed", reasons)
	dp, err := newDataplane(next, next.Mode(), opts)
	if err != nil {
		return err
	}
	p.loopback.set(ctx, loopbackFor(dp.Mode(), loopback), opts)
	p.opts = opts
	p.setMode(dp.Mode())
	p.svcHealth.SetAddrs(nodePortAddrs)
	p.loop.SetDataplane(dp)
	waitCtx, cancel := context.WithTimeout(ctx, 2*next.SyncPeriod()+30*time.Second)
	defer cancel()
	if err := p.loop.WaitSynced(waitCtx, dp); err != nil {
		// The loop keeps retrying the new dataplane; the old rules stay
		// in place until it succeeds, so traffic keeps flowing.
		p.log.Error("new dataplane has not synced yet; old rules kept", "mode", dp.Mode(), "err", err)
		return nil
	}
	metrics.ModeInfo.Reset()
	metrics.ModeInfo.WithLabelValues(dp.Mode(), next.Mode()).Set(1)
	if old.Mode() != dp.Mode() {
		if err := old.Cleanup(ctx); err != nil {
			p.log.Error("cleanup of the previous mode failed", "mode", old.Mode(), "err", err)
		}
	}
	p.log.Info("dataplane rebuilt", "from", old.Mode(), "to", dp.Mode(), "nodeIPs", opts.NodeIPs)
	return nil
}

// metricsHandler serves /metrics, /proxyMode, /configz, /services,
// /explain (when explain is not nil) and, with profiling enabled,
// /debug/pprof. *running is nil until the dataplane exists: /proxyMode
// answers 503 until then and /services an empty list.
func metricsHandler(current *atomic.Pointer[config.Config], running *atomic.Pointer[reconcile.Loop], explain func(model.Query) (*model.Explanation, error)) http.Handler {
	cfg := current.Load()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metricsGatherer, promhttp.HandlerOpts{}))
	// As kube-proxy's metrics server: a plain liveness answer.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		loop := running.Load()
		if loop == nil {
			http.Error(w, "starting: the dataplane is not programmed yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, loop.Dataplane().Mode())
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": current.Load().KubeProxy})
	})
	mux.HandleFunc("/services", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var st *model.State
		if loop := running.Load(); loop != nil {
			st = loop.LastState()
		}
		_ = json.NewEncoder(w).Encode(servicesView(st))
	})
	if explain != nil {
		mux.HandleFunc("/explain", explainHandler(explain))
	}
	if cfg.KubeProxy.EnableProfiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// startServer serves h on addr until ctx is done. A port that cannot be
// bound is logged and retried every few seconds, as kube-proxy does; it
// never stops the proxy. An empty addr disables the server.
func startServer(ctx context.Context, log *slog.Logger, name, addr string, h http.Handler, hardFail bool) error {
	if addr == "" {
		return nil
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	// The first bind is tried here, so that --bind-address-hard-fail can
	// refuse to start, as kube-proxy does.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if hardFail {
			return fmt.Errorf("%s server: %w (--bind-address-hard-fail)", name, err)
		}
		ln = nil // retried below
	}
	go func() {
		for ctx.Err() == nil {
			if ln == nil {
				var err error
				if ln, err = net.Listen("tcp", addr); err != nil {
					log.Error("cannot serve; retrying", "server", name, "address", addr, "err", err)
					ln = nil
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Second):
					}
					continue
				}
			}
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", "server", name, "err", err)
			}
			return
		}
	}()
	return nil
}

func sourceName(cfg *config.Config) string {
	if cfg.Standalone() {
		return "manifests:" + cfg.Manifests
	}
	return "kubernetes"
}

// rebuildReasons names what a new dataplane would be built from
// differently under next than under running: the mode, a dataplane option
// (optionChanges) or a setting of the mode's own config section. Periods
// are not among them: the loop changes them in place. nil means the running
// dataplane stays.
func rebuildReasons(running, next *config.Config, a, b dataplane.Options) []string {
	var out []string
	if running.Mode() != next.Mode() {
		out = append(out, "mode")
	}
	out = append(out, optionChanges(a, b)...)
	if next.Mode() == config.ModeIPVS {
		r, n := running.KubeProxy.IPVS, next.KubeProxy.IPVS
		for _, c := range []struct {
			name string
			same bool
		}{
			{"ipvs.tcpTimeout", r.TCPTimeout == n.TCPTimeout},
			{"ipvs.tcpFinTimeout", r.TCPFinTimeout == n.TCPFinTimeout},
			{"ipvs.udpTimeout", r.UDPTimeout == n.UDPTimeout},
			{"ipvs.strictARP", r.StrictARP == n.StrictARP},
			{"ipvs.excludeCIDRs", slices.Equal(r.ExcludeCIDRs, n.ExcludeCIDRs)},
		} {
			if !c.same {
				out = append(out, c.name)
			}
		}
	}
	return out
}

// optionChanges names the fields of dataplane.Options that differ between
// a and b (the logger does not count). Every other field is read by some
// dataplane, so a change to it needs a new one.
func optionChanges(a, b dataplane.Options) []string {
	var out []string
	for _, c := range []struct {
		name string
		same bool
	}{
		{"NodeName", a.NodeName == b.NodeName},
		{"NodeIPs", slices.Equal(a.NodeIPs, b.NodeIPs)},
		{"NodePortAddresses", slices.Equal(a.NodePortAddresses, b.NodePortAddresses)},
		{"MasqueradeAll", a.MasqueradeAll == b.MasqueradeAll},
		{"MasqueradeBit", a.MasqueradeBit == b.MasqueradeBit},
		{"ClusterCIDRs", slices.Equal(a.ClusterCIDRs, b.ClusterCIDRs)},
		{"PodInterface", a.PodInterface == b.PodInterface},
		{"PodInterfacePrefix", a.PodInterfacePrefix == b.PodInterfacePrefix},
		{"ServiceCIDRs", slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs)},
		{"Scheduler", a.Scheduler == b.Scheduler},
	} {
		if !c.same {
			out = append(out, c.name)
		}
	}
	return out
}

// serviceView is one line of /services: a programmed ServicePort with the
// addresses and ports it answers on and its endpoint counts.
type serviceView struct {
	Name             string       `json:"name"`
	ClusterIPs       []netip.Addr `json:"clusterIPs,omitempty"`
	Port             uint16       `json:"port"`
	Protocol         string       `json:"protocol"`
	NodePort         uint16       `json:"nodePort,omitempty"`
	ExternalIPs      []netip.Addr `json:"externalIPs,omitempty"`
	LoadBalancerIPs  []netip.Addr `json:"loadBalancerIPs,omitempty"`
	Endpoints        int          `json:"endpoints"`
	ClusterEndpoints int          `json:"clusterEndpoints"`
	LocalEndpoints   int          `json:"localEndpoints"`
}

// servicesView lists what the last successful sync programmed, so an
// operator sees the VIPs and NodePorts standalone allocation handed out.
func servicesView(st *model.State) []serviceView {
	out := []serviceView{}
	if st == nil {
		return out
	}
	for _, p := range st.Ports {
		out = append(out, serviceView{
			Name: p.Name.String(), ClusterIPs: p.ClusterIPs, Port: p.Port, Protocol: string(p.Protocol),
			NodePort: p.NodePort, ExternalIPs: p.ExternalIPs, LoadBalancerIPs: p.LoadBalancerIPs,
			Endpoints: len(p.Endpoints), ClusterEndpoints: len(p.ClusterEndpoints), LocalEndpoints: len(p.LocalEndpoints),
		})
	}
	return out
}

// coldStartGC, unless GOGC or GOMEMLIMIT is set in the environment, lets
// the heap grow to 11× the live data (coldStartGCPercent) but no further
// than a soft limit (coldStartMemLimit: a quarter of the memory
// available, at least 1 GiB) until the first sync is done. It returns
// the function to call with the dataplane's mode once it is known (see
// iptablesColdStartGCPercent), and the one that puts both settings back.
// A cold start allocates mostly garbage (decoded manifests or lists, the
// first build, the netlink batch): at 10,000 Services the collector was a
// third of its CPU with the default GOGC. The peak is returned to the OS
// right after the first sync (see afterColdStart). After it the collector
// runs at steadyGCPercent.
func coldStartGC() (forMode func(mode string), steady func()) {
	if gcFromEnv() {
		return func(string) {}, func() {}
	}
	debug.SetGCPercent(coldStartGCPercent)
	oldLimit := debug.SetMemoryLimit(coldStartMemLimit())
	forMode = func(mode string) {
		if mode == config.ModeIPTables {
			debug.SetGCPercent(iptablesColdStartGCPercent)
		}
	}
	return forMode, func() {
		debug.SetGCPercent(steadyGCPercent)
		debug.SetMemoryLimit(oldLimit)
	}
}

// gcFromEnv reports whether the operator set the collector's pace in the
// environment (GOGC or GOMEMLIMIT): then vipproxy leaves it alone (no cold
// start or steady settings, no early collections).
func gcFromEnv() bool { return os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" }

// coldStartGCPercent is the collector's GOGC during the cold start.
const coldStartGCPercent = 1000

// iptablesColdStartGCPercent is the cold start's GOGC from the moment the
// dataplane is known to be iptables. That cold start waits on
// iptables-restore, so collecting less buys little (at 10,000 Services
// 4.75–4.79 s against 4.91 s), while the iptables build allocates about
// ten times what it keeps: at GOGC 1000 the kept rules were scattered
// among its garbage, and the spans they held stayed resident after it
// (heap in use 108 MB for 68 MB live, RSS 157 MiB; at 100: 79 MB for 61
// MB, RSS 110 MiB). The nftables build keeps a larger share of what it
// allocates: there the lower setting saved 3 MiB for a 25 % longer cold
// start.
const iptablesColdStartGCPercent = 100

// steadyGCPercent is the collector's GOGC after the cold start (unless
// GOGC or GOMEMLIMIT is set in the environment): the heap may grow to
// 1.25× its live data between collections instead of Go's default 2×.
// A proxy's live heap is its long-lived picture of the Services and a
// change allocates little of it, so the RSS a node pays through a burst of
// changes stays near the live data, for some CPU. At 10,000 Services × 10
// after 100 changes (two runs each, BENCHMARKS.md, issue 18): RSS 181–184
// MiB at GOGC 100, 162–168 at 50, 138–140 at 25; CPU per change 5.9–6.1,
// 7.2–7.6 and 8.9–10.1 ms; programming p99 16 ms, 19–23 ms, 20–24 ms.
const steadyGCPercent = 25

// afterColdStart returns an AfterSync hook that, once, after the first
// successful sync and the hooks before it (the other modes' leftovers
// cleanup, conntrack), logs how long the cold start took and what it
// cost, sets the garbage collector's steady settings and hands the heap peak
// back to the OS, so the settled RSS is the live data rather than its
// garbage. Then it closes done.
func afterColdStart(restoreGC func(), done chan<- struct{}, log *slog.Logger) func(context.Context, *model.State) {
	var once sync.Once
	return func(_ context.Context, st *model.State) {
		once.Do(func() {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			log.Info("cold start done", "servicePorts", len(st.Ports), "sinceProcessStart", time.Since(processStart).Round(time.Millisecond),
				"cpu", cpustat.Process().Round(time.Millisecond), "heapMiB", ms.HeapAlloc>>20, "gcCycles", ms.NumGC)
			restoreGC()
			debug.FreeOSMemory()
			close(done)
		})
	}
}

// processStart is when this process started (close enough: package init).
var processStart = time.Now()
