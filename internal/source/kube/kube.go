// Package kube is vipproxy's Kubernetes source: client-go shared
// informers on Services, discovery/v1 EndpointSlices and this node's Node,
// converted to model types as they arrive and emitted as complete
// Snapshots.
//
// Like kube-proxy, it asks the API server only for Services and
// EndpointSlices without the service.kubernetes.io/service-proxy-name and
// service.kubernetes.io/headless labels, and watches only its own Node.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source"
	"github.com/vipproxy/vipproxy/internal/source/convert"
)

// DefaultDebounce is the quiet time that ends a burst of changes. Every
// change waits for it, so it is short (informer events of one API write
// arrive together); the reconcile loop's minSyncPeriod coalesces longer
// bursts, and source.MaxDebounces caps how long a stream can delay a
// snapshot.
const DefaultDebounce = 10 * time.Millisecond

// Options configure a Source.
type Options struct {
	// Client talks to the API server (required; see NewClient).
	Client *Client
	// NodeName is this node's name; its Node is watched. "" watches none.
	NodeName string
	// Resync is the informers' resync period (0 disables resync). Resyncs
	// that change nothing produce no snapshot.
	Resync time.Duration
	// Debounce is the quiet time after a change before a snapshot is sent
	// (0 means DefaultDebounce).
	Debounce time.Duration
	// Logger receives conversion problems (nil discards).
	Logger *slog.Logger
}

// Source watches the API server. Create it with New; a Source runs once.
type Source struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	triggers []model.ChangeTrigger // EndpointSlice change trigger times since the last snapshot
	services map[string]converted[model.Service]
	slices   map[string]converted[model.EndpointSlice]
	node     *model.Node
	dirty    chan struct{}
	// svcKeys and sliceKeys are the map keys in snapshot order
	// (namespace, then name), nil when membership changed since they
	// were computed.
	svcKeys, sliceKeys []string

	// last is the last snapshot made, svcAt and sliceAt where each key's
	// object is in it; changedSvcs and changedSlices are the keys changed
	// since, in place: a snapshot that patches last (see patch). reshaped
	// says a change since last moved something (an object added,
	// deleted, refused or accepted, a slice moved to another Service,
	// Problems changed): the next snapshot is assembled in full.
	last                       *model.Snapshot
	gen                        uint64
	svcAt, sliceAt             map[string]int
	changedSvcs, changedSlices map[string]struct{}
	reshaped                   bool
}

// converted is an object as converted, with the Problems conversion found.
// ok is false when the object was refused.
type converted[T any] struct {
	obj      *T // shared by every Snapshot that holds it (read-only)
	ok       bool
	problems []model.Problem
}

var _ source.Source = (*Source)(nil)

// New returns a Source for opts with defaults applied.
func New(opts Options) *Source {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{
		opts:          opts,
		log:           log.With("source", "kube"),
		services:      map[string]converted[model.Service]{},
		slices:        map[string]converted[model.EndpointSlice]{},
		changedSvcs:   map[string]struct{}{},
		changedSlices: map[string]struct{}{},
		dirty:         make(chan struct{}, 1),
	}
}

// SetWatchList sets client-go's WatchListClient gate, which client-go
// reads when an informer is made (so it takes effect for informers made
// after): on, the informers start from a watch-list stream; off (kube-proxy
// v1.34's default, and vipproxy's: at 10,000 Services the stream took
// twice as long to sync), from one LIST. kube-proxy takes it from
// --feature-gates, whose registry holds client-go's gates; the other
// client-go gates keep their values (client-go's defaults and its
// KUBE_FEATURE_* variables).
func SetWatchList(on bool) {
	clientfeatures.ReplaceFeatureGates(watchListGate{on: on, base: clientfeatures.FeatureGates()})
}

// watchListGate is client-go's gates with WatchListClient set.
type watchListGate struct {
	on   bool
	base clientfeatures.Gates
}

// Enabled implements clientfeatures.Gates.
func (g watchListGate) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.on
	}
	return g.base.Enabled(f)
}

// proxyLabelSelector is kube-proxy's: no service-proxy-name label and no
// headless label.
func proxyLabelSelector() string {
	noProxyName, err1 := labels.NewRequirement(model.LabelServiceProxyName, selection.DoesNotExist, nil)
	noHeadless, err2 := labels.NewRequirement(model.LabelHeadless, selection.DoesNotExist, nil)
	if err := errors.Join(err1, err2); err != nil {
		panic(err) // constant input
	}
	return labels.NewSelector().Add(*noProxyName, *noHeadless).String()
}

// informer returns a shared informer on r, its list and watch options
// edited by tweak, whose cache holds transform's compact entries.
func (s *Source) informer(r Resource, obj runtime.Object, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return r.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, r), obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: s.opts.Resync})
	if err := inf.SetTransform(transform); err != nil {
		panic(err) // only fails on an informer already started
	}
	return inf
}

// Run starts the informers, waits until every cache has synced, sends the
// first snapshot and then one per debounced burst of changes. It returns
// nil when ctx is done and an error when the caches cannot sync.
func (s *Source) Run(ctx context.Context, out chan<- *model.Snapshot) error {
	if s.opts.Client == nil {
		return errors.New("kube: no client")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	sel := proxyLabelSelector()
	bySelector := func(o *metav1.ListOptions) { o.LabelSelector = sel }
	svcInf := s.informer(s.opts.Client.Services, &corev1.Service{}, bySelector)
	sliceInf := s.informer(s.opts.Client.EndpointSlices, &discoveryv1.EndpointSlice{}, bySelector)
	informers := []cache.SharedIndexInformer{svcInf, sliceInf}
	var regs []cache.ResourceEventHandlerRegistration
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandlerFuncs) error {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("kube: add event handler: %w", err)
		}
		regs = append(regs, reg)
		return nil
	}
	if err := add(svcInf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.onService(o, false) },
		UpdateFunc: func(_, o any) { s.onService(o, false) },
		DeleteFunc: func(o any) { s.onService(o, true) },
	}); err != nil {
		return err
	}
	if err := add(sliceInf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.onSlice(o, false) },
		UpdateFunc: func(_, o any) { s.onSlice(o, false) },
		DeleteFunc: func(o any) { s.onSlice(o, true) },
	}); err != nil {
		return err
	}
	if s.opts.NodeName != "" {
		// One GET of this node first, as kube-proxy fetches its Node at
		// start: the informer below keeps it current, but this answers
		// sooner, and a failure here (RBAC, a wrong node name) is logged
		// with its reason. It is also the request whose latency
		// rest_client_request_duration_seconds reports, as for kube-proxy
		// (informers' watch-list streams record none).
		if n, err := s.opts.Client.Nodes.Get(ctx, s.opts.NodeName, metav1.GetOptions{}); err != nil {
			s.log.Warn("cannot get this node's Node object; waiting for the informer", "node", s.opts.NodeName, "err", err)
		} else if t, err := transform(n); err == nil {
			s.onNode(t, false)
		}
		nodeSel := fields.OneTermEqualSelector("metadata.name", s.opts.NodeName).String()
		nodeInf := s.informer(s.opts.Client.Nodes, &corev1.Node{},
			func(o *metav1.ListOptions) { o.FieldSelector = nodeSel })
		informers = append(informers, nodeInf)
		if err := add(nodeInf, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { s.onNode(o, false) },
			UpdateFunc: func(_, o any) { s.onNode(o, false) },
			DeleteFunc: func(o any) { s.onNode(o, true) },
		}); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	synced := make([]cache.InformerSynced, 0, 2*len(informers))
	for _, inf := range informers {
		synced = append(synced, inf.HasSynced)
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	defer wg.Wait()
	defer cancel() // runs before Wait, which waits for the informers

	for _, r := range regs {
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("kube: informer caches did not sync")
	}
	s.log.Info("informer caches synced")

	// Everything seen so far goes into the first snapshot.
	select {
	case <-s.dirty:
	default:
	}
	if !send(ctx, out, s.snapshot()) {
		return nil
	}

	debounce := source.NewDebounce(s.opts.Debounce)
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.dirty:
			debounce.Event(time.Now())
		case <-debounce.C:
			debounce.Fired()
			if !send(ctx, out, s.snapshot()) {
				return nil
			}
		}
	}
}

func send(ctx context.Context, out chan<- *model.Snapshot, snap *model.Snapshot) bool {
	select {
	case out <- snap:
		return true
	case <-ctx.Done():
		return false
	}
}

// markDirty notes a change; the run loop debounces.
func (s *Source) markDirty() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

// unwrap returns the object of a delete notification, also when the
// informer only knows its final state.
func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// onService records a Service event. o is the informer's cache entry
// (*cached[model.Service], see transform) or, in tests, a *corev1.Service.
func (s *Source) onService(o any, deleted bool) {
	var c *cached[model.Service]
	switch v := unwrap(o).(type) {
	case *cached[model.Service]:
		c = v
	case *corev1.Service:
		c = cacheService(v)
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := c.Namespace + "/" + c.Name
	if store(s, s.services, &s.svcKeys, key, c.conv, deleted || c.ignored) {
		s.changedSvcs[key] = struct{}{}
	}
}

// onSlice records an EndpointSlice event. o is the informer's cache entry
// (*cached[model.EndpointSlice]) or, in tests, a *discoveryv1.EndpointSlice.
func (s *Source) onSlice(o any, deleted bool) {
	var c *cached[model.EndpointSlice]
	switch v := unwrap(o).(type) {
	case *cached[model.EndpointSlice]:
		c = v
	case *discoveryv1.EndpointSlice:
		c = cacheSlice(v)
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := c.Namespace + "/" + c.Name
	old := s.slices[key]
	if !store(s, s.slices, &s.sliceKeys, key, c.conv, deleted || c.ignored) {
		return
	}
	s.changedSlices[key] = struct{}{}
	if now := s.slices[key]; old.ok && now.ok && old.obj.Service != now.obj.Service {
		s.reshaped = true // the slice is now another Service's
	}
	if !deleted && !c.trigger.IsZero() {
		s.triggers = append(s.triggers, model.ChangeTrigger{Family: c.conv.obj.AddressType, Time: c.trigger})
	}
}

// store records c under key in m, or removes key when deleted, and marks
// the source dirty and reports true when that changed anything. *keys (the sorted keys of
// m) is reset when membership changes. The caller holds s.mu.
func store[T any](s *Source, m map[string]converted[T], keys *[]string, key string, c converted[T], deleted bool) bool {
	old, had := m[key]
	if deleted {
		if had {
			delete(m, key)
			*keys = nil
			s.reshaped = true
			s.markDirty()
			return true
		}
		return false
	}
	if had && reflect.DeepEqual(old, c) {
		return false
	}
	if !had {
		*keys = nil
	}
	if !had || old.ok != c.ok || len(old.problems) > 0 || len(c.problems) > 0 {
		s.reshaped = true
	}
	m[key] = c
	s.markDirty()
	return true
}

func (s *Source) onNode(o any, deleted bool) {
	n, ok := unwrap(o).(*corev1.Node)
	if !ok || n.Name != s.opts.NodeName {
		return
	}
	var m *model.Node
	if !deleted {
		m = convert.Node(n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if model.NodeEqual(s.node, m) {
		return
	}
	s.node = m
	s.markDirty()
}

// snapshot assembles the current state. Services and slices are sorted by
// namespace, then name (the order model.Patch asks for); Problems follow
// the same order. Snapshots are numbered (Gen); one that only replaced
// objects in place since the last is made by patch, with a model.Patch.
func (s *Source) snapshot() *model.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	snap := &model.Snapshot{Node: s.node, ChangeTriggers: s.triggers, Gen: s.gen}
	s.triggers = nil
	if s.last != nil && !s.reshaped {
		s.patch(snap)
	} else {
		s.assemble(snap)
	}
	clear(s.changedSvcs)
	clear(s.changedSlices)
	s.reshaped = false
	s.last = snap
	return snap
}

// assemble fills snap from every object, and indexes where each is.
func (s *Source) assemble(snap *model.Snapshot) {
	if s.svcKeys == nil {
		s.svcKeys = slices.SortedFunc(maps.Keys(s.services), compareKeys)
	}
	if s.sliceKeys == nil {
		s.sliceKeys = slices.SortedFunc(maps.Keys(s.slices), compareKeys)
	}
	snap.Services = make([]*model.Service, 0, len(s.svcKeys))
	snap.Slices = make([]*model.EndpointSlice, 0, len(s.sliceKeys))
	s.svcAt = make(map[string]int, len(s.svcKeys))
	s.sliceAt = make(map[string]int, len(s.sliceKeys))
	for _, k := range s.svcKeys {
		c := s.services[k]
		if c.ok {
			s.svcAt[k] = len(snap.Services)
			snap.Services = append(snap.Services, c.obj)
		}
		snap.Problems = append(snap.Problems, c.problems...)
	}
	for _, k := range s.sliceKeys {
		c := s.slices[k]
		if c.ok {
			s.sliceAt[k] = len(snap.Slices)
			snap.Slices = append(snap.Slices, c.obj)
		}
		snap.Problems = append(snap.Problems, c.problems...)
	}
}

// patch fills snap from the last snapshot with the objects changed since
// replaced where they were. Only objects without Problems, accepted
// before and after, changed (see store), so the lists keep their shape
// and their Problems.
func (s *Source) patch(snap *model.Snapshot) {
	last := s.last
	p := &model.Patch{Base: last.Gen}
	snap.Problems = last.Problems
	snap.Services, p.Services = patchList(last.Services, s.changedSvcs, s.svcAt, s.services)
	snap.Slices, p.Slices = patchList(last.Slices, s.changedSlices, s.sliceAt, s.slices)
	snap.Patch = p
}

// patchList returns last with the objects of the changed keys replaced at
// their positions (at), and those positions in order; last itself when
// nothing changed.
func patchList[T any](last []*T, changed map[string]struct{}, at map[string]int, objs map[string]converted[T]) ([]*T, []int) {
	if len(changed) == 0 {
		return last, nil
	}
	out := slices.Clone(last)
	idx := make([]int, 0, len(changed))
	for k := range changed {
		i := at[k]
		out[i] = objs[k].obj
		idx = append(idx, i)
	}
	slices.Sort(idx)
	return out, idx
}

// compareKeys orders "namespace/name" keys by namespace, then name, as
// the model compares Service names ("a/x" before "a-b/x", which a string
// comparison puts first).
func compareKeys(a, b string) int {
	an, aa, _ := strings.Cut(a, "/")
	bn, bb, _ := strings.Cut(b, "/")
	if c := strings.Compare(an, bn); c != 0 {
		return c
	}
	return strings.Compare(aa, bb)
}
