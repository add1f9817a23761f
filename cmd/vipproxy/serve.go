package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/healthcheck"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netinfo"
	"github.com/vipproxy/vipproxy/internal/reconcile"
)

// dataplaneOptions derives the options every mode shares from the config
// and this node's addresses, and the addresses NodePorts (and so
// health-check node ports) are served on.
func dataplaneOptions(cfg *config.Config, nodeName string, log *slog.Logger) (dataplane.Options, []netip.Addr, error) {
	local, err := netinfo.LocalAddrs()
	if err != nil {
		return dataplane.Options{}, nil, err
	}
	var bind netip.Addr
	if a, err := netip.ParseAddr(cfg.KubeProxy.BindAddress); err == nil {
		bind = a
	}
	opts := dataplane.Options{
		NodeName:          nodeName,
		NodeIPs:           netinfo.PrimaryIPs(nil, bind, local),
		NodePortAddresses: cfg.NodePortPrefixes(),
		MasqueradeAll:     cfg.MasqueradeAll(),
		MasqueradeBit:     cfg.MasqueradeBit(),
		SyncPeriod:        cfg.SyncPeriod(),
		Scheduler:         cfg.Scheduler(),
		Logger:            log,
	}
	if cfg.DetectLocalMode() == config.LocalModeClusterCIDR {
		opts.ClusterCIDRs = cfg.ClusterCIDRs()
	}
	// The service range is only known for sure in standalone mode, where
	// vipproxy allocates from it; in Kubernetes mode the API server owns it.
	if cfg.Standalone() {
		opts.ServiceCIDRs = cfg.ServiceCIDRs()
	}
	return opts, netinfo.NodePortAddrs(opts.NodePortAddresses, opts.NodeIPs, local), nil
}

// serve runs vipproxy until ctx is done.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	nodeName, err := cfg.NodeName()
	if err != nil {
		return err
	}
	opts, nodePortAddrs, err := dataplaneOptions(cfg, nodeName, log)
	if err != nil {
		return err
	}
	if dp := cfg.Mode(); dp != config.ModeUserspace {
		applyHostSettings(cfg, log)
	}
	dp, err := newDataplane(cfg.Mode(), opts)
	if err != nil {
		return fmt.Errorf("%s mode: %w", cfg.Mode(), err)
	}
	metrics.ModeInfo.WithLabelValues(dp.Mode(), cfg.Mode()).Set(1)
	log.Info("starting vipproxy", "node", nodeName, "mode", dp.Mode(), "nodeIPs", opts.NodeIPs,
		"source", sourceName(cfg))

	src, closeSrc, err := newSource(ctx, cfg, nodeName, log)
	if err != nil {
		return err
	}
	defer closeSrc()

	health := healthcheck.NewProxierHealth(2*cfg.SyncPeriod(), nil)
	svcHealth := &healthcheck.ServiceHealth{Addrs: nodePortAddrs, Proxier: health, Logger: log.With("component", "healthcheck")}
	defer svcHealth.Close()
	loop, err := reconcile.New(reconcile.Options{
		Dataplane:     dp,
		Build:         func(s *model.Snapshot) *model.State { return model.Build(s, model.BuildOptions{NodeName: nodeName}) },
		MinSyncPeriod: cfg.MinSyncPeriod(),
		SyncPeriod:    cfg.SyncPeriod(),
		Health:        health,
		AfterSync:     append(afterSyncHooks(dp.Mode(), log), svcHealth.Sync),
		Logger:        log,
	})
	if err != nil {
		return err
	}

	var current atomic.Pointer[config.Config]
	current.Store(cfg)
	startServer(ctx, log, "healthz", cfg.KubeProxy.HealthzBindAddress, health.Handler())
	startServer(ctx, log, "metrics", cfg.KubeProxy.MetricsBindAddress, metricsHandler(&current, loop))
	if cfg.ConfigFile != "" {
		r := &reloader{path: cfg.ConfigFile, cfg: &current, loop: loop, nodeName: nodeName, log: log.With("component", "reload")}
		go r.watch(ctx)
	}

	snaps := make(chan *model.Snapshot, 1)
	srcErr := make(chan error, 1)
	go func() { srcErr <- src.Run(ctx, snaps) }()
	loopDone := make(chan error, 1)
	go func() { loopDone <- loop.Run(ctx, snaps) }()
	select {
	case err := <-srcErr:
		if ctx.Err() == nil && err != nil {
			return fmt.Errorf("source: %w", err)
		}
		return <-loopDone
	case err := <-loopDone:
		return err
	}
}

// metricsHandler serves /metrics, /proxyMode, /configz and, with
// profiling enabled, /debug/pprof.
func metricsHandler(current *atomic.Pointer[config.Config], loop *reconcile.Loop) http.Handler {
	cfg := current.Load()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, loop.Dataplane().Mode())
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": current.Load().KubeProxy})
	})
	mux.HandleFunc("/services", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(servicesView(loop.LastState()))
	})
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
func startServer(ctx context.Context, log *slog.Logger, name, addr string, h http.Handler) {
	if addr == "" {
		return
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		for ctx.Err() == nil {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				log.Error("cannot serve; retrying", "server", name, "address", addr, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
				continue
			}
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", "server", name, "err", err)
			}
			return
		}
	}()
}

func sourceName(cfg *config.Config) string {
	if cfg.Standalone() {
		return "manifests:" + cfg.Manifests
	}
	return "kubernetes"
}

// sameOptions reports whether two dataplane option sets program the same
// rules (the logger does not count).
func sameOptions(a, b dataplane.Options) bool {
	a.Logger, b.Logger = nil, nil
	return slices.Equal(a.NodeIPs, b.NodeIPs) && slices.Equal(a.NodePortAddresses, b.NodePortAddresses) &&
		slices.Equal(a.ClusterCIDRs, b.ClusterCIDRs) && slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs) &&
		a.NodeName == b.NodeName && a.MasqueradeAll == b.MasqueradeAll && a.MasqueradeBit == b.MasqueradeBit &&
		a.SyncPeriod == b.SyncPeriod && a.Scheduler == b.Scheduler
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
