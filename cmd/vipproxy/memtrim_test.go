package main

import (
	"context"
	"github.com/vipproxy/vipproxy/internal/config"
	"io"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

func TestTrimmerDecides(t *testing.T) {
	now := time.Unix(1000, 0)
	const mib = 1 << 20
	tests := []struct {
		name           string
		lastSync       time.Time // zero: no sync yet
		resident, live uint64
		want           bool
	}{
		{"before the first sync", time.Time{}, 500 * mib, 100 * mib, false},
		{"sync within the idle period", now.Add(-trimIdle + time.Millisecond), 500 * mib, 100 * mib, false},
		{"idle, much garbage", now.Add(-trimIdle), 200 * mib, 100 * mib, true},
		{"idle, garbage under a sixteenth of live", now.Add(-time.Minute), 206 * mib, 200 * mib, false},
		{"idle, garbage over a sixteenth of live", now.Add(-time.Minute), 213 * mib, 200 * mib, true},
		{"idle, garbage under the slack", now.Add(-time.Minute), 10 * mib, 3 * mib, false},
		{"idle, garbage over the slack", now.Add(-time.Minute), 12 * mib, 3 * mib, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			freed := 0
			tr := &trimmer{idle: trimIdle, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				heap: func() (uint64, uint64) { return tc.resident, tc.live },
				free: func() { freed++ }}
			if !tc.lastSync.IsZero() {
				tr.lastSync.Store(tc.lastSync.UnixNano())
			}
			if got := tr.maybeTrim(now); got != tc.want || (freed == 1) != tc.want {
				t.Errorf("maybeTrim = %v with %d frees, want %v", got, freed, tc.want)
			}
		})
	}
}

func TestCollectorDecides(t *testing.T) {
	now := time.Unix(1000, 0)
	const mib = 1 << 20
	tests := []struct {
		name                string
		lastSync            time.Time // zero: no sync yet
		objects, live, goal uint64
		want                bool
	}{
		{"before the first sync", time.Time{}, 190 * mib, 100 * mib, 125 * mib, false},
		{"a sync within the quiet period", now.Add(-collectQuiet + time.Millisecond), 120 * mib, 100 * mib, 125 * mib, false},
		{"half the headroom filled", now.Add(-collectQuiet), 113 * mib, 100 * mib, 125 * mib, true},
		{"under half the headroom", now.Add(-time.Minute), 112 * mib, 100 * mib, 125 * mib, false},
		{"half a small headroom, under the minimum", now.Add(-time.Minute), 13 * mib, 10 * mib, 14 * mib, false},
		{"collector off", now.Add(-time.Minute), 500 * mib, 100 * mib, 0, false},
		{"nothing allocated since", now.Add(-time.Minute), 100 * mib, 100 * mib, 125 * mib, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			collected := 0
			tr := &trimmer{quiet: collectQuiet, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				gcHeap:  func() (uint64, uint64, uint64) { return tc.objects, tc.live, tc.goal },
				collect: func() { collected++ }}
			if !tc.lastSync.IsZero() {
				tr.lastSync.Store(tc.lastSync.UnixNano())
			}
			if got := tr.maybeCollect(now); got != tc.want || (collected == 1) != tc.want {
				t.Errorf("maybeCollect = %v with %d collections, want %v", got, collected, tc.want)
			}
		})
	}
}

// TestNoEarlyCollectionWithGOGC: GOGC or GOMEMLIMIT in the environment
// turns early collections off.
func TestNoEarlyCollectionWithGOGC(t *testing.T) {
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "100")
			tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)))
			tr.gcHeap = func() (uint64, uint64, uint64) { return 200 << 20, 100 << 20, 125 << 20 }
			tr.lastSync.Store(time.Unix(1000, 0).UnixNano())
			if tr.maybeCollect(time.Unix(2000, 0)) {
				t.Error("collected early with " + env + " set")
			}
		})
	}
}

// TestCollectsInTheQuiet runs the trimmer's loop: no early collection
// while syncs keep coming, one once they stop.
func TestCollectsInTheQuiet(t *testing.T) {
	var collected atomic.Int32
	tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	tr.idle, tr.quiet = time.Hour, 200*time.Millisecond
	tr.gcHeap = func() (uint64, uint64, uint64) { return 200 << 20, 100 << 20, 125 << 20 }
	tr.collect = func() { collected.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.run(ctx)
	for end := time.Now().Add(3 * tr.quiet / 2); time.Now().Before(end); {
		tr.afterSync(ctx, nil)
		time.Sleep(5 * time.Millisecond)
	}
	if n := collected.Load(); n != 0 {
		t.Fatalf("%d collections while syncs came every 5 ms", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for collected.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * tr.quiet)
	if n := collected.Load(); n != 1 {
		t.Fatalf("%d collections after the syncs stopped, want 1", n)
	}
}

// TestEarlyCollectionRuns uses the real runtime hooks: garbage filling
// more than half the collector's headroom is collected at once.
func TestEarlyCollectionRuns(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	live := make([][]byte, 0, 48)
	for range 48 {
		live = append(live, make([]byte, 1<<20))
	}
	runtime.GC()
	tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	tr.collect = runtime.GC // whatever the environment says
	objects, l, goal := tr.gcHeap()
	// Garbage up to 70 % of the headroom: no cycle of the runtime's own.
	var sink []byte
	for objects < l+(goal-l)*7/10 {
		sink = make([]byte, 256<<10)
		objects, _, _ = tr.gcHeap()
	}
	runtime.KeepAlive(sink)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	tr.afterSync(context.Background(), nil)
	if !tr.maybeCollect(time.Now().Add(collectQuiet)) {
		objects, l, goal = tr.gcHeap()
		t.Fatalf("no collection: objects %d MiB, live %d MiB, goal %d MiB", objects>>20, l>>20, goal>>20)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.NumGC == before.NumGC {
		t.Error("maybeCollect reported a collection that did not run")
	}
	if objects, l, _ := tr.gcHeap(); objects > l && objects-l > collectMin {
		t.Errorf("after the collection %d MiB of objects beyond %d MiB live", (objects-l)>>20, l>>20)
	}
	runtime.KeepAlive(live)
}

// TestTrimmerReturnsGarbage runs the real runtime hooks: garbage left by a
// burst of allocation is resident until the trimmer runs, and gone after.
func TestTrimmerReturnsGarbage(t *testing.T) {
	// No collection while the garbage is made, so all of it is resident.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var keep [][]byte
	for range 64 {
		keep = append(keep, make([]byte, 1<<20))
	}
	keep = keep[:8] // 56 MiB of garbage, 8 MiB live
	runtime.KeepAlive(keep)
	tr := newTrimmer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	tr.afterSync(context.Background(), nil)
	before, _ := heapUsage()
	if !tr.maybeTrim(time.Now().Add(trimIdle)) {
		t.Fatalf("no trim with %d MiB resident", before>>20)
	}
	after, live := heapUsage()
	if after >= before || after > live+trimSlack+live/16 {
		t.Errorf("resident heap %d MiB before, %d MiB after (live %d MiB): want less than live + slack after",
			before>>20, after>>20, live>>20)
	}
	runtime.KeepAlive(keep)
}

// TestColdStartGC: the cold start collects at GOGC=1000 under a soft
// limit, and after it at steadyGCPercent with the limit lifted; GOGC or
// GOMEMLIMIT in the environment leaves the collector alone throughout.
func TestColdStartGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	for _, env := range []struct{ name, value string }{{}, {"GOGC", "200"}, {"GOMEMLIMIT", "1GiB"}} {
		t.Run("env="+env.name, func(t *testing.T) {
			if env.name != "" {
				t.Setenv(env.name, env.value)
			}
			debug.SetGCPercent(100)
			forMode, steady := coldStartGC()
			pct, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
			debug.SetGCPercent(pct)
			wantPct, wantLimit := 1000, coldStartMemLimit()
			if env.name != "" {
				wantPct, wantLimit = 100, math.MaxInt64
			}
			if pct != wantPct || limit != wantLimit {
				t.Errorf("during the cold start: GOGC %d, limit %d; want %d, %d", pct, limit, wantPct, wantLimit)
			}
			// The mode decides the rest of the cold start: nftables keeps
			// the setting, iptables collects at iptablesColdStartGCPercent.
			for _, mode := range []string{config.ModeNFTables, config.ModeIPTables} {
				forMode(mode)
				pct = debug.SetGCPercent(-1)
				debug.SetGCPercent(pct)
				want := wantPct
				if mode == config.ModeIPTables && env.name == "" {
					want = iptablesColdStartGCPercent
				}
				if pct != want {
					t.Errorf("cold start in %s mode: GOGC %d, want %d", mode, pct, want)
				}
			}
			steady()
			pct, limit = debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
			debug.SetGCPercent(pct)
			wantPct = steadyGCPercent
			if env.name != "" {
				wantPct = 100
			}
			if pct != wantPct || limit != math.MaxInt64 {
				t.Errorf("after it: GOGC %d, limit %d; want %d, no limit", pct, limit, wantPct)
			}
		})
	}
}
