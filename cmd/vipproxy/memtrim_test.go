package main

import (
	"context"
	"github.com/vipproxy/vipproxy/internal/config"
	"io"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
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
		{"idle, garbage under a quarter of live", now.Add(-time.Minute), 124 * mib, 100 * mib, false},
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
	if after >= before || after > live+trimSlack+live/4 {
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
