// Package reconcile turns source snapshots into dataplane syncs: a
// bounded-frequency runner that coalesces bursts of changes, resyncs in
// full periodically and after failures, and keeps the health bookkeeping.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/healthcheck"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// Options configure a Loop. Zero values are documented per field.
type Options struct {
	// Dataplane receives the syncs. Required.
	Dataplane dataplane.Dataplane
	// Build turns a snapshot into the desired state. Required (usually a
	// closure over model.Build with this node's name).
	Build func(*model.Snapshot) *model.State
	// MinSyncPeriod is the least time between two syncs; 0 syncs at once.
	MinSyncPeriod time.Duration
	// SyncPeriod is the interval of periodic resyncs, which run even
	// without changes; 0 means 30s. They are partial: the dataplane checks
	// that its state is still in place (the nftables dataplane probes its
	// tables and base chains) and sends what changed.
	SyncPeriod time.Duration
	// FullSyncPeriod is the interval of full syncs, in which the dataplane
	// rewrites everything it owns; 0 means DefaultFullSyncPeriod. A full
	// sync that falls due while a change is waiting runs right after that
	// change's partial sync, so no change waits for a full rewrite (at
	// 10,000 Services one takes seconds).
	FullSyncPeriod time.Duration
	// Health is told about queued and applied updates; nil disables.
	Health *healthcheck.ProxierHealth
	// AfterSync hooks run, in order, after every successful sync (stale
	// conntrack cleanup, health-check node ports), once the sync has been
	// counted as programmed. Their failures are theirs to log; they never
	// fail the sync. They run on the loop's goroutine, so their time
	// delays the next sync: keep them proportional to the change.
	AfterSync []func(ctx context.Context, st *model.State)
	// Logger receives the loop's logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultFullSyncPeriod is the default Options.FullSyncPeriod, kube-proxy's
// interval between full syncs.
const DefaultFullSyncPeriod = time.Hour

// Loop is the reconcile loop. Create it with New and run it with Run.
type Loop struct {
	opts Options
	log  *slog.Logger

	mu         sync.Mutex
	dp         dataplane.Dataplane
	minSync    time.Duration
	syncPeriod time.Duration
	kick       chan struct{}
	forceAll   bool
	// rebuild: Invalidate was called (see Run).
	rebuild bool

	// lastState is the last State synced successfully (for hooks and tests),
	// lastDP the dataplane that synced it.
	lastState *model.State
	lastDP    dataplane.Dataplane
	// problems holds the messages of lastProblems, the Problems of the
	// last State built.
	problems     map[string]bool
	lastProblems []model.Problem
	// verified receives the result of a drift check (see verify).
	verified chan error
}

// New returns a Loop. It fails when a required option is missing.
func New(o Options) (*Loop, error) {
	if o.Dataplane == nil || o.Build == nil {
		return nil, errors.New("reconcile: Dataplane and Build are required")
	}
	if o.SyncPeriod <= 0 {
		o.SyncPeriod = 30 * time.Second
	}
	if o.FullSyncPeriod <= 0 {
		o.FullSyncPeriod = DefaultFullSyncPeriod
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Loop{opts: o, log: log, dp: o.Dataplane, minSync: o.MinSyncPeriod, syncPeriod: o.SyncPeriod,
		kick: make(chan struct{}, 1), problems: map[string]bool{}, verified: make(chan error, 1)}, nil
}

// SetDataplane swaps the dataplane (a mode change by config reload); the
// next sync, run at once, is full. The caller cleans the old one up after
// the new one has synced (see WaitSynced), so no VIP is left unserved.
func (l *Loop) SetDataplane(dp dataplane.Dataplane) {
	l.mu.Lock()
	l.dp = dp
	l.forceAll = true
	l.mu.Unlock()
	l.poke()
}

// SetPeriods changes the sync periods (config reload) and syncs at once.
func (l *Loop) SetPeriods(minSync, syncPeriod time.Duration) {
	if syncPeriod <= 0 {
		syncPeriod = 30 * time.Second
	}
	l.mu.Lock()
	l.minSync, l.syncPeriod = minSync, syncPeriod
	l.forceAll = true
	l.mu.Unlock()
	if l.opts.Health != nil {
		l.opts.Health.SetTimeout(2 * syncPeriod)
	}
	l.poke()
}

// Dataplane returns the dataplane in use.
func (l *Loop) Dataplane() dataplane.Dataplane {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dp
}

// WaitSynced waits until dp has completed a successful sync, or ctx ends.
func (l *Loop) WaitSynced(ctx context.Context, dp dataplane.Dataplane) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		l.mu.Lock()
		done := l.lastDP == dp
		l.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reconcile: waiting for %s to sync: %w", dp.Mode(), ctx.Err())
		case <-t.C:
		}
	}
}

// LastState returns the last successfully synced State, or nil.
func (l *Loop) LastState() *model.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastState
}

// Invalidate makes the loop build the last snapshot again and sync the
// result, as if a change had arrived (subject to MinSyncPeriod): for
// inputs of Build that are not in the snapshot, such as ejected endpoints.
func (l *Loop) Invalidate() {
	l.mu.Lock()
	l.rebuild = true
	l.mu.Unlock()
	l.poke()
}

func (l *Loop) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run consumes snapshots from in and syncs the dataplane until ctx is
// done; it then returns nil. Nothing is synced before the first snapshot
// (the source's "synced" point). Snapshots arriving faster than
// MinSyncPeriod are coalesced: only the newest is built. A failed sync is
// logged and counted, and retried as a full sync after a backoff that
// starts at max(MinSyncPeriod, 1s) and doubles up to SyncPeriod. A sync
// runs at least every SyncPeriod even without changes, so state removed
// behind vipproxy's back is restored, and a full one every FullSyncPeriod
// (deferred by one partial sync when a change is waiting, and by at most
// SyncPeriod). The loop itself never stops on an error.
func (l *Loop) Run(ctx context.Context, in <-chan *model.Snapshot) error {
	var (
		snap      *model.Snapshot
		pend      pendingChanges
		sched     = newSchedule(l.minSync, l.syncPeriod, l.opts.FullSyncPeriod)
		verifying bool // a drift check runs (see verify)
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		sched.minSync, sched.syncPeriod = l.minSync, l.syncPeriod
		if l.forceAll {
			sched.reconfigured()
			l.forceAll = false
		}
		l.mu.Unlock()
		wait, due := time.Hour, time.Time{}
		if snap != nil {
			due = sched.due(time.Now())
			wait = max(time.Until(due), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case s, ok := <-in:
			if !ok {
				in = nil
				break
			}
			snap = s
			sched.changed()
			pend.add(s, l.opts.Health)
		case <-l.kick:
		case <-timer.C:
		case err := <-l.verified:
			verifying = false
			if l.driftFound(err) {
				sched.driftFound()
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if snap == nil {
			continue
		}
		l.mu.Lock()
		forced, rebuild := l.forceAll, l.rebuild
		l.rebuild = false
		l.mu.Unlock()
		if rebuild {
			sched.changed()
			continue // recompute the schedule: a change is waiting
		}
		if forced || time.Now().Before(due) {
			continue // recompute the schedule with what just arrived
		}
		full, periodic := sched.attempt(time.Now())
		st, err := l.syncOnce(ctx, snap, full)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			sched.failed(time.Now())
			continue
		}
		sched.succeeded(full)
		// The dataplane is programmed: the hooks' cleanup is not part of
		// the latency of a change reaching it.
		pend.programmed()
		for _, hook := range l.opts.AfterSync {
			hook(ctx, st)
		}
		// A periodic sync (no change, not full) also starts a drift check.
		if periodic && !verifying {
			verifying = l.verify(ctx)
		}
	}
}

// pendingChanges are the snapshots received and not yet programmed, for
// the change metrics and the programming latency.
type pendingChanges struct {
	since time.Time // arrival of the oldest
	n     int
	// triggers are the EndpointSlice change trigger times of the
	// snapshots.
	triggers []model.ChangeTrigger
}

// add records a snapshot received now and counts it.
func (p *pendingChanges) add(s *model.Snapshot, health *healthcheck.ProxierHealth) {
	if p.since.IsZero() {
		p.since = time.Now()
	}
	p.triggers = append(p.triggers, s.ChangeTriggers...)
	p.n++
	metrics.ServiceChangesPending.Set(float64(p.n))
	metrics.ServiceChangesTotal.Inc()
	for _, fam := range metrics.IPFamilies {
		metrics.SyncLastQueuedTimestamp.WithLabelValues(fam).SetToCurrentTime()
	}
	if health != nil {
		health.QueuedUpdate()
	}
}

// programmed records that a sync programmed every pending change.
func (p *pendingChanges) programmed() {
	if p.since.IsZero() {
		return
	}
	observeProgramming(p.since, p.triggers)
	p.since, p.n, p.triggers = time.Time{}, 0, p.triggers[:0]
	metrics.ServiceChangesPending.Set(0)
}

// verify starts, on its own goroutine, a drift check of the dataplane if
// it is a dataplane.Verifier, and reports whether it did; the result
// arrives on l.verified. The check runs beside syncs, so a change is
// never held up by it.
func (l *Loop) verify(ctx context.Context) bool {
	l.mu.Lock()
	v, ok := l.dp.(dataplane.Verifier)
	l.mu.Unlock()
	if !ok {
		return false
	}
	go func() {
		err := v.Verify(ctx)
		select {
		case l.verified <- err:
		case <-ctx.Done():
		}
	}()
	return true
}

// driftFound reports whether a drift check's result asks for a repairing
// full sync, and logs and counts it.
func (l *Loop) driftFound(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, dataplane.ErrDrift):
		metrics.DriftRepairs.Inc()
		l.log.Warn("kernel state changed behind vipproxy's back; repairing with a full sync", "drift", err.Error())
		return true
	default:
		l.log.Log(context.Background(), slog.LevelInfo-2, "drift check failed", "err", err)
		return false
	}
}

// observeProgramming records network programming latency, as kube-proxy
// does, from each EndpointSlice change's trigger time (the time the
// EndpointSlice controller saw the change) to now, under the slice's
// family; when the changes carry none (standalone, or Service-only
// changes), from when vipproxy received the oldest of them, under every
// family (one sync programs them all).
func observeProgramming(received time.Time, triggers []model.ChangeTrigger) {
	now := time.Now()
	if len(triggers) == 0 {
		for _, fam := range metrics.IPFamilies {
			metrics.NetworkProgrammingDuration.WithLabelValues(fam).Observe(now.Sub(received).Seconds())
		}
		return
	}
	for _, t := range triggers {
		fam := "IPv4"
		if t.Family == model.IPv6 {
			fam = "IPv6"
		}
		metrics.NetworkProgrammingDuration.WithLabelValues(fam).Observe(max(now.Sub(t.Time), 0).Seconds())
	}
}

// syncOnce builds the state and syncs it once; it returns the State it
// synced. The caller runs the AfterSync hooks.
func (l *Loop) syncOnce(ctx context.Context, snap *model.Snapshot, full bool) (*model.State, error) {
	start := time.Now()
	st := l.opts.Build(snap)
	l.reportProblems(st)
	if l.opts.Health != nil {
		l.opts.Health.SyncNode(st.Node)
	}
	dp := l.Dataplane()
	err := dp.Sync(ctx, st, full)
	took := time.Since(start)
	for _, fam := range metrics.IPFamilies {
		metrics.SyncDuration.WithLabelValues(fam).Observe(took.Seconds())
	}
	if full {
		for _, fam := range metrics.IPFamilies {
			metrics.SyncFullDuration.WithLabelValues(fam).Observe(took.Seconds())
		}
	} else {
		for _, fam := range metrics.IPFamilies {
			metrics.SyncPartialDuration.WithLabelValues(fam).Observe(took.Seconds())
		}
	}
	if err != nil {
		metrics.SyncFailures.WithLabelValues(dp.Mode()).Inc()
		l.log.Error("sync failed; will retry with a full sync", "mode", dp.Mode(), "full", full, "duration", took, "err", err)
		return nil, err
	}
	for _, fam := range metrics.IPFamilies {
		metrics.SyncLastTimestamp.WithLabelValues(fam).SetToCurrentTime()
	}
	l.countNoLocal(st)
	if l.opts.Health != nil {
		l.opts.Health.Updated()
	}
	l.mu.Lock()
	l.lastState, l.lastDP = st, dp
	l.mu.Unlock()
	l.log.Log(ctx, slog.LevelInfo-2, "synced", "mode", dp.Mode(), "full", full, "duration", took,
		"servicePorts", len(st.Ports), "problems", len(st.Problems))
	return st, nil
}

// maxProblemLogsPerFile bounds the problem lines one manifest file gets
// per State; the rest are summed up in one line (the skipped-objects
// gauge and /services carry the totals).
const maxProblemLogsPerFile = 10

// reportProblems logs each problem once, when it first appears, and keeps
// the skipped-objects gauge current. It is the only place problems are
// logged. Of the new problems of one manifest file (Problem.File) only the
// first maxProblemLogsPerFile are logged one by one, then one line with
// the count of the others: a file of 100,000 broken documents costs 11
// lines, not 100,000. The same list as last time costs a comparison, not
// a rebuilt set.
func (l *Loop) reportProblems(st *model.State) {
	metrics.SkippedObjects.Set(float64(len(st.Problems)))
	if slices.Equal(st.Problems, l.lastProblems) {
		return
	}
	l.lastProblems = st.Problems
	now := make(map[string]bool, len(st.Problems))
	perFile := map[string]int{}
	var files []string // in order of first new problem
	for _, p := range st.Problems {
		msg := p.Error()
		now[msg] = true
		if l.problems[msg] {
			continue
		}
		if p.File != "" {
			n := perFile[p.File]
			if n == 0 {
				files = append(files, p.File)
			}
			perFile[p.File] = n + 1
			if n >= maxProblemLogsPerFile {
				continue
			}
		}
		l.log.Warn("skipping invalid input", "object", p.Object, "field", p.Field, "value", p.Value, "reason", p.Reason)
	}
	for _, f := range files {
		if n := perFile[f]; n > maxProblemLogsPerFile {
			l.log.Warn("more invalid input in one file; not logged one by one", "file", f,
				"logged", maxProblemLogsPerFile, "notLogged", n-maxProblemLogsPerFile)
		}
	}
	l.problems = now
}

func (l *Loop) countNoLocal(st *model.State) {
	// By traffic policy and by the family of each ClusterIP (a dual-stack
	// port counts in both), as kube-proxy's per-family proxiers count.
	var internal, external [2]int
	for _, p := range st.Ports {
		if len(p.LocalEndpoints) != 0 || len(p.Endpoints) == 0 {
			continue
		}
		for _, ip := range p.ClusterIPs {
			f := 0
			if ip.Is6() {
				f = 1
			}
			if p.InternalPolicyLocal() {
				internal[f]++
			}
			if p.ExternalPolicyLocal() {
				external[f]++
			}
		}
	}
	for f, fam := range metrics.IPFamilies {
		metrics.NoLocalEndpointsTotal.WithLabelValues("internal", fam).Set(float64(internal[f]))
		metrics.NoLocalEndpointsTotal.WithLabelValues("external", fam).Set(float64(external[f]))
	}
}
