package main

import (
	"context"
	"log/slog"
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
	// is not worth a collection: below it, or below a quarter of the
	// live heap, nothing is done.
	trimSlack = 8 << 20
)

// trimmer returns idle heap memory to the OS. Its AfterSync hook notes
// each sync; run checks every trimIdle.
type trimmer struct {
	lastSync atomic.Int64 // unix nanoseconds
	idle     time.Duration
	log      *slog.Logger
	// heap and free are runtime hooks (tests replace them).
	heap func() (resident, live uint64)
	free func()
}

func newTrimmer(log *slog.Logger) *trimmer {
	return &trimmer{idle: trimIdle, log: log, heap: heapUsage, free: debug.FreeOSMemory}
}

// afterSync is an AfterSync hook.
func (t *trimmer) afterSync(context.Context, *model.State) { t.lastSync.Store(time.Now().UnixNano()) }

// run trims every idle period until ctx is done.
func (t *trimmer) run(ctx context.Context) {
	tick := time.NewTicker(t.idle)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.maybeTrim(now)
		}
	}
}

// maybeTrim trims when no sync ran within the idle period before now and
// the heap's resident pages exceed its live data by more than
// max(trimSlack, live/4). It reports whether it trimmed.
func (t *trimmer) maybeTrim(now time.Time) bool {
	last := t.lastSync.Load()
	if last == 0 || now.Sub(time.Unix(0, last)) < t.idle {
		// Nothing before the first sync: the cold start runs with its
		// own collector settings and trims once when it is done.
		return false
	}
	resident, live := t.heap()
	if resident <= live+max(trimSlack, live/4) {
		return false
	}
	start := time.Now()
	t.free()
	after, _ := t.heap()
	t.log.Debug("returned idle heap memory to the OS", "residentMiB", resident>>20, "liveMiB", live>>20,
		"afterMiB", after>>20, "took", time.Since(start).Round(time.Microsecond))
	return true
}

// heapUsage reads the heap's resident bytes (objects, dead ones not yet
// swept included, span fragmentation, and free pages not yet returned)
// and the live bytes the last collection marked.
func heapUsage() (resident, live uint64) {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	v := func(x metrics.Sample) uint64 {
		if x.Value.Kind() != metrics.KindUint64 {
			return 0 // unknown to this runtime: counts as nothing
		}
		return x.Value.Uint64()
	}
	return v(s[0]) + v(s[1]) + v(s[2]), v(s[3])
}
