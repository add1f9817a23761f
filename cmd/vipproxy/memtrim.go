package main

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Idle trimming. Go's collector lets the heap grow to twice its live data
// (GOGC=100) before it collects, and the pages of that garbage stay
// resident until they are reused: after a burst of changes at 10,000
// Services the RSS sat near 2.4× the live heap for as long as nothing
// else happened. A service proxy is idle most of the time, so once no
// sync has run for trimIdle and the heap holds much more than its live
// data, the trimmer collects and hands the free pages back to the OS
// (what afterColdStart does once after the first sync). While changes
// keep coming nothing is trimmed: collecting mid-burst would only add
// latency.
const (
	// trimIdle is how long the loop must have been quiet. The first
	// sync's end counts: the cold start trims once itself.
	trimIdle = 5 * time.Second
	// trimSlack is the garbage (resident heap beyond the live data) that
	// is not worth a collection: below it, or below a sixteenth of the
	// live heap, nothing is done. (A quarter, the steady GOGC's headroom,
	// left the heap's free pages resident once early collections kept the
	// garbage under it: 278 MiB idle at 50,000 Services against 250.)
	trimSlack = 8 << 20
)

// Early collection. With the steady GOGC the collector runs when the
// garbage since the last cycle reaches a quarter of the live heap; at
// 50,000 Services that is a cycle of 70-125 ms (115-210 ms of CPU) every
// 50 MB allocated, and a change written while it runs is programmed late:
// under a CPU hog the slowest change of a run (40 and 48 ms against 14-20
// for the others) was the one written during such a cycle. A proxy's
// changes come in bursts with quiet between them, so once the loop has
// been quiet for collectQuiet after a sync and the garbage fills at least
// collectAt of the collector's headroom, the trimmer runs the cycle then:
// it comes in the quiet, a little earlier than it would have, and the heap
// peaks lower. During a burst (a sync at least every collectQuiet) the
// collector runs as it would have. With GOGC or GOMEMLIMIT set in the
// environment there are no early collections (gcFromEnv).
const (
	collectQuiet = 250 * time.Millisecond
	collectAt    = 0.5
	// collectMin is the least garbage worth an early cycle.
	collectMin = 4 << 20
)

// trimmer returns idle heap memory to the OS and collects early in the
// quiet after a sync. Its AfterSync hook notes each sync; run checks
// collectQuiet after each and every trimIdle.
type trimmer struct {
	lastSync atomic.Int64 // unix nanoseconds
	idle     time.Duration
	quiet    time.Duration
	synced   chan struct{} // a sync ended (capacity 1)
	log      *slog.Logger
	// heap, free, gcHeap and collect are runtime hooks (tests replace
	// them).
	heap    func() (resident, live uint64)
	free    func()
	gcHeap  func() (objects, live, goal uint64)
	collect func()
}

func newTrimmer(log *slog.Logger) *trimmer {
	t := &trimmer{idle: trimIdle, quiet: collectQuiet, synced: make(chan struct{}, 1), log: log,
		heap: heapUsage, free: debug.FreeOSMemory, gcHeap: gcHeapUsage, collect: runtime.GC}
	if gcFromEnv() {
		t.collect = nil
	}
	return t
}

// afterSync is an AfterSync hook.
func (t *trimmer) afterSync(context.Context, *model.State) {
	t.lastSync.Store(time.Now().UnixNano())
	select {
	case t.synced <- struct{}{}:
	default: // run has not taken the last one yet: the same wake-up
	}
}

// run trims every idle period, and considers an early collection once
// collectQuiet passed after a sync, until ctx is done.
func (t *trimmer) run(ctx context.Context) {
	tick := time.NewTicker(t.idle)
	defer tick.Stop()
	quiet := time.NewTimer(t.quiet)
	quiet.Stop()
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.synced:
			quiet.Reset(t.quiet)
		case now := <-quiet.C:
			t.maybeCollect(now)
		case now := <-tick.C:
			t.maybeTrim(now)
		}
	}
}

// maybeCollect runs a collection when no sync ran within the quiet period
// before now, and the garbage allocated since the last cycle is at least
// collectMin and collectAt of the collector's headroom (its heap goal
// beyond the live heap). It reports whether it collected.
func (t *trimmer) maybeCollect(now time.Time) bool {
	last := t.lastSync.Load()
	if t.collect == nil || last == 0 || now.Sub(time.Unix(0, last)) < t.quiet {
		return false // off, or a sync since: its wake-up comes later
	}
	objects, live, goal := t.gcHeap()
	if goal <= live || objects <= live {
		return false // collector off, or nothing allocated
	}
	garbage := objects - live
	if garbage < collectMin || float64(garbage) < collectAt*float64(goal-live) {
		return false
	}
	start := time.Now()
	t.collect()
	t.log.Debug("collected in the quiet after a sync", "garbageMiB", garbage>>20, "liveMiB", live>>20,
		"goalMiB", goal>>20, "took", time.Since(start).Round(time.Microsecond))
	return true
}

// maybeTrim trims when no sync ran within the idle period before now and
// the heap's resident pages exceed its live data by more than
// max(trimSlack, live/16). It reports whether it trimmed.
func (t *trimmer) maybeTrim(now time.Time) bool {
	last := t.lastSync.Load()
	if last == 0 || now.Sub(time.Unix(0, last)) < t.idle {
		// Nothing before the first sync: the cold start runs with its
		// own collector settings and trims once when it is done.
		return false
	}
	resident, live := t.heap()
	if resident <= live+max(trimSlack, live/16) {
		return false
	}
	start := time.Now()
	t.free()
	after, _ := t.heap()
	t.log.Debug("returned idle heap memory to the OS", "residentMiB", resident>>20, "liveMiB", live>>20,
		"afterMiB", after>>20, "took", time.Since(start).Round(time.Microsecond))
	return true
}

// gcHeapUsage reads the bytes of heap objects (live ones and those dead
// since the last collection), the live bytes the last collection marked,
// and the heap goal at which the collector will run next.
func gcHeapUsage() (objects, live, goal uint64) {
	v := readMetrics("/memory/classes/heap/objects:bytes", "/gc/heap/live:bytes", "/gc/heap/goal:bytes")
	return v[0], v[1], v[2]
}

// heapUsage reads the heap's resident bytes (objects, dead ones not yet
// swept included, span fragmentation, and free pages not yet returned)
// and the live bytes the last collection marked.
func heapUsage() (resident, live uint64) {
	v := readMetrics("/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes",
		"/memory/classes/heap/free:bytes", "/gc/heap/live:bytes")
	return v[0] + v[1] + v[2], v[3]
}

// readMetrics reads runtime metrics of kind uint64; one this runtime does
// not know reads 0 (counts as nothing, and no early collection).
func readMetrics(names ...string) []uint64 {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	out := make([]uint64, len(s))
	for i, x := range s {
		if x.Value.Kind() == metrics.KindUint64 {
			out[i] = x.Value.Uint64()
		}
	}
	return out
}
