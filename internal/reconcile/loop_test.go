package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/healthcheck"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// snap returns a snapshot whose built state is recognisable by its node name.
func snap(name string) *model.Snapshot { return &model.Snapshot{Node: &model.Node{Name: name}} }

func build(s *model.Snapshot) *model.State { return &model.State{NodeName: s.Node.Name, Node: s.Node} }

type harness struct {
	fake *dataplane.Fake
	loop *Loop
	in   chan *model.Snapshot
	done chan struct{}
}

func start(t *testing.T, o Options) *harness {
	t.Helper()
	h := &harness{fake: &dataplane.Fake{}, in: make(chan *model.Snapshot), done: make(chan struct{})}
	o.Dataplane, o.Build = h.fake, build
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h.loop = l
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = l.Run(ctx, h.in); close(h.done) }()
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

// waitCalls waits until the fake recorded at least n syncs or fails.
func (h *harness) waitCalls(t *testing.T, n int, within time.Duration) []dataplane.FakeCall {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c := h.fake.Calls(); len(c) >= n {
			return c
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("got %d syncs, want >= %d within %v", len(h.fake.Calls()), n, within)
	return nil
}

func TestNothingBeforeFirstSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{SyncPeriod: 50 * time.Millisecond})
		time.Sleep(150 * time.Millisecond)
		if n := len(h.fake.Calls()); n != 0 {
			t.Fatalf("synced %d times before any snapshot", n)
		}
		h.in <- snap("a")
		c := h.waitCalls(t, 1, time.Second)
		if !c[0].Full || c[0].State.NodeName != "a" {
			t.Fatalf("first sync = %+v, want full sync of a", c[0])
		}
	})
}

func TestCoalescesBursts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{MinSyncPeriod: 300 * time.Millisecond, SyncPeriod: time.Hour})
		h.in <- snap("first")
		h.waitCalls(t, 1, time.Second)
		for i := range 20 {
			h.in <- snap(string(rune('a' + i)))
		}
		c := h.waitCalls(t, 2, 2*time.Second)
		time.Sleep(400 * time.Millisecond)
		c = h.fake.Calls()
		if len(c) != 2 {
			t.Fatalf("20 snapshots in a burst gave %d syncs after the first, want 1", len(c)-1)
		}
		if got := c[1].State.NodeName; got != "t" {
			t.Errorf("coalesced sync built %q, want the newest snapshot %q", got, "t")
		}
		if c[1].Full {
			t.Errorf("sync after a change was full, want partial")
		}
	})
}

func TestFailureRetriesFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{SyncPeriod: time.Hour})
		h.fake.FailNext(1, errors.New("boom"))
		h.in <- snap("a")
		c := h.waitCalls(t, 1, time.Second)
		if c[0].Err == nil {
			t.Fatal("first sync did not fail")
		}
		h.in <- snap("b") // a change during backoff must not bypass the retry delay as a partial sync
		c = h.waitCalls(t, 2, 3*time.Second)
		if !c[1].Full {
			t.Errorf("retry after failure was partial, want full")
		}
		if c[1].State.NodeName != "b" {
			t.Errorf("retry built %q, want newest snapshot b", c[1].State.NodeName)
		}
	})
}

// TestHooksOnlyAfterSuccess pins make-before-break on a mode switch: the
// AfterSync hooks (one removes the other modes' rules) run only once the
// running mode's sync succeeded, never after a failed one.
func TestHooksOnlyAfterSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var hookedAfter []int // number of syncs the fake had seen at each hook call
		var h *harness
		h = start(t, Options{SyncPeriod: time.Hour, AfterSync: []func(context.Context, *model.State){func(context.Context, *model.State) {
			mu.Lock()
			defer mu.Unlock()
			hookedAfter = append(hookedAfter, len(h.fake.Calls()))
		}}})
		h.fake.FailNext(2, errors.New("boom"))
		h.in <- snap("a")
		c := h.waitCalls(t, 3, 10*time.Second)
		synctest.Wait()
		if c[0].Err == nil || c[1].Err == nil || c[2].Err != nil {
			t.Fatalf("sync errors %v, %v, %v; want two failures, then success", c[0].Err, c[1].Err, c[2].Err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(hookedAfter) != 1 || hookedAfter[0] != 3 {
			t.Errorf("hooks ran after syncs %v, want once, after the third (the first success)", hookedAfter)
		}
	})
}

func TestPeriodicFullSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{SyncPeriod: time.Hour, FullSyncPeriod: 80 * time.Millisecond})
		h.in <- snap("a")
		c := h.waitCalls(t, 4, 2*time.Second)
		for i, call := range c {
			if !call.Full {
				t.Errorf("sync %d without changes was partial, want full", i)
			}
		}
	})
}

// Periodic resyncs between full syncs are partial (the dataplane probes
// its state and sends what changed).
func TestPeriodicSyncIsPartial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{SyncPeriod: 50 * time.Millisecond})
		h.in <- snap("a")
		c := h.waitCalls(t, 4, 2*time.Second)
		if !c[0].Full {
			t.Errorf("first sync was partial, want full")
		}
		for i, call := range c[1:] {
			if call.Full {
				t.Errorf("periodic sync %d was full, want partial (full syncs are hourly)", i+1)
			}
		}
	})
}

// A full sync that falls due while a change waits goes after the change's
// partial sync, so the change does not wait for a full rewrite.
func TestFullSyncGivesWayToChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{MinSyncPeriod: 300 * time.Millisecond, SyncPeriod: time.Hour, FullSyncPeriod: 150 * time.Millisecond})
		h.in <- snap("a")
		h.waitCalls(t, 1, time.Second)
		h.in <- snap("b") // waits for minSync; the full sync falls due first
		c := h.waitCalls(t, 3, 3*time.Second)
		if !c[0].Full || c[1].Full || !c[2].Full {
			t.Errorf("syncs full = %v, %v, %v; want true, false, true", c[0].Full, c[1].Full, c[2].Full)
		}
		if c[1].State.NodeName != "b" || c[2].State.NodeName != "b" {
			t.Errorf("syncs built %q, %q; want b, b", c[1].State.NodeName, c[2].State.NodeName)
		}
	})
}

func TestHealthAndHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		health := healthcheck.NewProxierHealth(time.Minute, nil)
		hooked := make(chan string, 10)
		h := start(t, Options{SyncPeriod: time.Hour, Health: health,
			AfterSync: []func(context.Context, *model.State){func(_ context.Context, st *model.State) { hooked <- st.NodeName }}})
		h.in <- &model.Snapshot{Node: &model.Node{Name: "n", ToBeDeleted: true}}
		select {
		case got := <-hooked:
			if got != "n" {
				t.Errorf("hook saw %q", got)
			}
		case <-time.After(time.Second):
			t.Fatal("AfterSync hook not run")
		}
		st := health.Status()
		if !st.Healthy || st.LastUpdated.IsZero() {
			t.Errorf("after sync: %+v, want healthy with lastUpdated", st)
		}
		if st.NodeEligible {
			t.Errorf("node with autoscaler taint reported eligible")
		}
		if h.loop.LastState() == nil || h.loop.LastState().NodeName != "n" {
			t.Errorf("LastState = %+v", h.loop.LastState())
		}
	})
}

func TestSetDataplaneSyncsFullAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{MinSyncPeriod: time.Hour, SyncPeriod: time.Hour})
		h.in <- snap("a")
		h.waitCalls(t, 1, time.Second)
		next := &dataplane.Fake{ModeName: "next"}
		h.loop.SetDataplane(next)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := h.loop.WaitSynced(ctx, next); err != nil {
			t.Fatal(err)
		}
		c := next.Calls()
		if len(c) != 1 || !c[0].Full || c[0].State.NodeName != "a" {
			t.Fatalf("new dataplane got %+v, want one full sync of the current snapshot", c)
		}
	})
}

// countingHandler counts the records logged at Warn.
type countingHandler struct{ warns *int }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		*h.warns++
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestReportProblemsOnce: a problem is logged when it appears, not again
// while it stays (also when the list is rebuilt with equal contents), and
// again after it went away and came back.
func TestReportProblemsOnce(t *testing.T) {
	a := model.Problem{Object: "Service ns/a", Field: "spec.ports[0].port", Reason: "bad"}
	b := model.Problem{Object: "Service ns/b", Reason: "bad"}
	steps := []struct {
		problems []model.Problem
		warns    int
	}{
		{[]model.Problem{a}, 1},
		{[]model.Problem{a}, 0},
		{append([]model.Problem(nil), a), 0},
		{[]model.Problem{a, b}, 1},
		{nil, 0},
		{[]model.Problem{b}, 1},
	}
	warns := 0
	l, err := New(Options{Dataplane: &dataplane.Fake{}, Build: build, Logger: slog.New(countingHandler{&warns})})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		warns = 0
		l.reportProblems(&model.State{Problems: s.problems})
		if warns != s.warns {
			t.Errorf("step %d: %d warnings, want %d", i, warns, s.warns)
		}
	}
}

// TestReportProblemsSummarisesPerFile: a file with many problems gets a
// bounded number of lines; problems without a file are each logged.
func TestReportProblemsSummarisesPerFile(t *testing.T) {
	var ps []model.Problem
	for i := range 100000 {
		ps = append(ps, model.Problem{Object: fmt.Sprintf("file big.yaml document %d", i+1), Reason: "missing kind", File: "big.yaml"})
	}
	for i := range 3 {
		ps = append(ps, model.Problem{Object: fmt.Sprintf("Service ns/s%d", i), Reason: "bad"})
	}
	ps = append(ps, model.Problem{Object: "file small.yaml document 1", Reason: "bad", File: "small.yaml"})
	warns := 0
	l, err := New(Options{Dataplane: &dataplane.Fake{}, Build: build, Logger: slog.New(countingHandler{&warns})})
	if err != nil {
		t.Fatal(err)
	}
	l.reportProblems(&model.State{Problems: ps})
	if want := maxProblemLogsPerFile + 1 + 3 + 1; warns != want {
		t.Errorf("%d warnings for %d problems, want %d", warns, len(ps), want)
	}
	warns = 0
	l.reportProblems(&model.State{Problems: append([]model.Problem(nil), ps...)})
	if warns != 0 {
		t.Errorf("unchanged problems logged again: %d warnings", warns)
	}
}

// verifyingFake is a Fake that is a dataplane.Verifier: its drift checks
// return the queued results, then nil.
type verifyingFake struct {
	*dataplane.Fake
	mu      sync.Mutex
	results []error
	checks  int
}

func (v *verifyingFake) Verify(context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.checks++
	if len(v.results) == 0 {
		return nil
	}
	err := v.results[0]
	v.results = v.results[1:]
	return err
}

// TestDriftRepairedByFullSync: periodic syncs start drift checks; a check
// that finds drift is followed by a full sync, one that fails otherwise
// or finds nothing is not.
func TestDriftRepairedByFullSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := &verifyingFake{Fake: &dataplane.Fake{}, results: []error{nil, errors.New("netlink: busy"), fmt.Errorf("%w: ip set service-ips: 24 elements, want 25", dataplane.ErrDrift)}}
		in := make(chan *model.Snapshot)
		l, err := New(Options{Dataplane: v, Build: build, SyncPeriod: 40 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = l.Run(ctx, in); close(done) }()
		defer func() { cancel(); <-done }()
		in <- snap("a")
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			c := v.Calls()
			v.mu.Lock()
			checks := v.checks
			v.mu.Unlock()
			if checks >= 3 && len(c) >= 2 {
				var fulls []int
				for i, call := range c {
					if call.Full {
						fulls = append(fulls, i)
					}
				}
				if len(fulls) >= 2 {
					// The first full sync is the cold start; the second repairs
					// the drift found by the third check, and no other is full.
					if len(fulls) != 2 {
						t.Fatalf("full syncs at %v of %d calls, want 2", fulls, len(c))
					}
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no repairing full sync: %d calls, %d checks", len(v.Calls()), v.checks)
	})
}

// TestObserveProgramming: latency is measured from each trigger time when
// the changes carry them, else from receipt.
func TestObserveProgramming(t *testing.T) {
	read := func(fam string) (uint64, float64) {
		var m dto.Metric
		if err := metrics.NetworkProgrammingDuration.WithLabelValues(fam).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	n0, s0 := read("IPv4")
	m0, _ := read("IPv6")
	now := time.Now()
	observeProgramming(now, []model.ChangeTrigger{{Family: model.IPv4, Time: now.Add(-3 * time.Second)}, {Family: model.IPv4, Time: now.Add(-5 * time.Second)}})
	n1, s1 := read("IPv4")
	if n1-n0 != 2 || s1-s0 < 8 || s1-s0 > 9 {
		t.Errorf("two IPv4 triggers 3 s and 5 s ago: %d samples summing %.2f s, want 2 summing about 8 s", n1-n0, s1-s0)
	}
	if m1, _ := read("IPv6"); m1 != m0 {
		t.Errorf("IPv4 slice changes observed under IPv6")
	}
	observeProgramming(now.Add(-2*time.Second), nil)
	n2, s2 := read("IPv4")
	if n2-n1 != 1 || s2-s1 < 2 || s2-s1 > 3 {
		t.Errorf("no trigger, received 2 s ago: %d samples summing %.2f s", n2-n1, s2-s1)
	}
}

// TestInvalidateRebuilds: Invalidate builds the last snapshot again and
// syncs it partially, honouring MinSyncPeriod, with no new snapshot.
func TestInvalidateRebuilds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Options{MinSyncPeriod: 200 * time.Millisecond, SyncPeriod: time.Hour})
		h.in <- snap("a")
		h.waitCalls(t, 1, time.Second)
		start := time.Now()
		h.loop.Invalidate()
		c := h.waitCalls(t, 2, time.Second)
		if took := time.Since(start); took > 250*time.Millisecond {
			t.Errorf("rebuild synced after %v, want within MinSyncPeriod", took)
		}
		if c[1].Full || c[1].State.NodeName != "a" {
			t.Errorf("rebuild sync %+v, want a partial sync of a", c[1])
		}
		time.Sleep(time.Second)
		if n := len(h.fake.Calls()); n != 2 {
			t.Errorf("%d syncs after one Invalidate, want 2", n)
		}
	})
}
