package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipproxy/vipproxy/internal/allocator"
	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
	"github.com/vipproxy/vipproxy/internal/source/kube"
	"github.com/vipproxy/vipproxy/internal/source/manifests"
)

// repairInterval is how often the standalone allocation map is compared
// with the Services that exist.
const repairInterval = time.Minute

// repairStartMax bounds how long the first repair pass waits for the cold
// start to finish (see newSource).
const repairStartMax = 30 * time.Second

// newSource builds the configured source. In standalone mode it also
// opens the allocation map and starts its repair loop, once coldStart is
// closed (the first sync done: a pass is CPU the cold start wants, 0.05 s
// at 50,000 Services, and repairs can wait) or repairStartMax after the
// first snapshot, whichever comes first; the returned func
// releases what was opened. The map is opened while the source reads
// the manifests (at 50,000 Services each takes a while: 70 ms and 0.4 s);
// the source's first call to the allocator waits for it. ready reports
// how the open went: serve calls it before using the first snapshot, so
// a map that cannot be opened stops vipproxy before it programs
// anything, as it did when the open came first.
func newSource(ctx context.Context, cfg *config.Config, nodeName string, coldStart <-chan struct{}, log *slog.Logger) (src source.Source, release func(), ready func() error, err error) {
	if !cfg.Standalone() {
		src, err := kubeSource(cfg, nodeName, log)
		return src, func() {}, func() error { return nil }, err
	}
	pa := &pendingAssigner{done: make(chan struct{})}
	go func() {
		defer close(pa.done)
		store, err := allocator.OpenStore(ctx, cfg.Registry, cfg.StateDir)
		if err != nil {
			pa.err = fmt.Errorf("allocation map: %w", err)
			return
		}
		lo, hi := cfg.NodePortRange()
		a, err := allocator.NewAssigner(allocator.AssignerOptions{
			Store:          store,
			ServiceCIDRs:   cfg.ServiceCIDRs(),
			NodePortRange:  [2]uint16{lo, hi},
			StaticSubrange: cfg.FeatureEnabled("ServiceIPStaticSubrange"),
			Logger:         log.With("component", "allocator"),
		})
		if err != nil {
			store.Close()
			pa.err = fmt.Errorf("allocator: %w", err)
			return
		}
		pa.store, pa.a = store, a
	}()
	mo := manifests.Options{
		Dir:      cfg.Manifests,
		Assigner: pa,
		NodeName: nodeName,
		Logger:   log.With("component", "manifests"),
	}
	if cfg.StateDir != "" {
		mo.CacheFile, mo.CacheVersion = filepath.Join(cfg.StateDir, manifestCache), executableID()
	}
	t := &tee{src: manifests.New(mo)}
	repairCtx, stopRepair := context.WithCancel(ctx)
	t.onFirst = func() {
		go func() {
			a, err := pa.wait(repairCtx)
			if err != nil {
				return
			}
			afterColdStartOr(repairCtx, coldStart, repairStartMax, func() {
				_ = a.RunRepair(repairCtx, repairInterval, t.liveServices)
			})
		}()
	}
	release = func() {
		stopRepair()
		<-pa.done
		if pa.store != nil {
			pa.store.Close()
		}
	}
	ready = func() error {
		_, err := pa.wait(ctx)
		return err
	}
	return t, release, ready, nil
}

// afterColdStartOr calls f once coldStart is closed or max has passed,
// whichever comes first, and returns when f does; it does not call f when
// ctx ends first.
func afterColdStartOr(ctx context.Context, coldStart <-chan struct{}, max time.Duration, f func()) {
	timer := time.NewTimer(max)
	defer timer.Stop()
	select {
	case <-coldStart:
	case <-timer.C:
	case <-ctx.Done():
		return
	}
	f()
}

// manifestCache is the manifest decode cache's file in the state
// directory (see package manifests).
const manifestCache = "manifests.cache"

// executableID names this build of vipproxy for the manifest cache: its
// executable's path, size and modification time ("" when unknown, which
// turns the cache off). A new build, which may decode differently, never
// reads what an older one cached.
func executableID() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	fi, err := os.Stat(exe)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s %d %d", exe, fi.Size(), fi.ModTime().UnixNano())
}

// pendingAssigner is the Assigner of an allocation map being opened: its
// calls wait for the open to finish, and fail with its error.
type pendingAssigner struct {
	done  chan struct{} // closed when the open finished
	a     *allocator.Assigner
	store allocator.Store
	err   error
}

var _ source.BatchAssigner = (*pendingAssigner)(nil)

func (p *pendingAssigner) wait(ctx context.Context) (*allocator.Assigner, error) {
	select {
	case <-p.done:
		return p.a, p.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Assign implements source.Assigner.
func (p *pendingAssigner) Assign(ctx context.Context, svc model.Service) (model.Service, error) {
	a, err := p.wait(ctx)
	if err != nil {
		return svc, err
	}
	return a.Assign(ctx, svc)
}

// Release implements source.Assigner.
func (p *pendingAssigner) Release(ctx context.Context, name model.ServiceName) error {
	a, err := p.wait(ctx)
	if err != nil {
		return err
	}
	return a.Release(ctx, name)
}

// AssignAll implements source.BatchAssigner.
func (p *pendingAssigner) AssignAll(ctx context.Context, svcs []*model.Service) ([]*model.Service, []error) {
	a, err := p.wait(ctx)
	if err != nil {
		errs := make([]error, len(svcs))
		for i := range errs {
			errs[i] = err
		}
		return svcs, errs
	}
	return a.AssignAll(ctx, svcs)
}

// kubeSource builds the Kubernetes source from --kubeconfig / --master (or
// the in-cluster config when both are empty).
func kubeSource(cfg *config.Config, nodeName string, log *slog.Logger) (source.Source, error) {
	cc := cfg.KubeProxy.ClientConnection
	rc, err := clientcmd.BuildConfigFromFlags(cfg.Master, cc.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if cfg.Master == "" && cc.Kubeconfig == "" {
		log.Warn(inClusterWarning(rc.Host))
	}
	rc.QPS, rc.Burst = cc.QPS, int(cc.Burst)
	if cc.ContentType != "" {
		rc.ContentType = cc.ContentType
	}
	rc.UserAgent = "vipproxy"
	kube.SetWatchList(cfg.FeatureEnabled("WatchListClient"))
	client, err := kube.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	resync := cfg.KubeProxy.ConfigSyncPeriod.Duration
	return kube.New(kube.Options{Client: client, NodeName: nodeName, Resync: resync,
		Logger: log.With("component", "kube")}), nil
}

// inClusterWarning explains why the in-cluster config is a trap for a
// service proxy: host is the kubernetes Service's ClusterIP, which nothing
// but the proxy itself programs.
func inClusterWarning(host string) string {
	return "no kubeconfig: reaching the API server through the in-cluster address " + host +
		", normally the kubernetes Service's ClusterIP, which only this proxy programs. " +
		"On a node with no Service rules yet (a fresh node, or after --cleanup) vipproxy cannot reach the API server and the node never becomes ready. " +
		"Set clientConnection.kubeconfig to a kubeconfig with the API server's own address, as kubeadm's kube-proxy ConfigMap does (see deploy/configmap.yaml)"
}

// tee passes a source's snapshots on and remembers the newest, so the
// allocator's repair loop sees the same Services the proxy does.
type tee struct {
	src source.Source
	// onFirst, when set, runs once after the first snapshot (the repair
	// loop starts then: before it, "no Services" is not known).
	onFirst func()

	mu   sync.Mutex
	last *model.Snapshot
}

// Run implements source.Source.
func (t *tee) Run(ctx context.Context, out chan<- *model.Snapshot) error {
	in := make(chan *model.Snapshot)
	errc := make(chan error, 1)
	go func() { errc <- t.src.Run(ctx, in) }()
	for {
		select {
		case s := <-in:
			t.mu.Lock()
			first := t.last == nil
			t.last = s
			t.mu.Unlock()
			if first && t.onFirst != nil {
				t.onFirst()
			}
			select {
			case out <- s:
			case <-ctx.Done():
				return <-errc
			}
		case err := <-errc:
			return err
		}
	}
}

// liveServices lists the Services of the newest snapshot. Before the first
// snapshot it fails, so the repair loop never mistakes "not read yet" for
// "no Services".
func (t *tee) liveServices(context.Context) ([]model.ServiceName, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		return nil, fmt.Errorf("no snapshot yet")
	}
	names := make([]model.ServiceName, 0, len(t.last.Services))
	for _, s := range t.last.Services {
		names = append(names, s.ServiceName)
	}
	return names, nil
}

// The allocator batches a cold start's assignments through the manifests
// source.
var _ source.BatchAssigner = (*allocator.Assigner)(nil)
