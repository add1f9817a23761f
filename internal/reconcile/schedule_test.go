package reconcile

import (
	"testing"
	"time"
)

// TestSchedule walks the schedule through event sequences at given
// times, with no clock: each step is an event at an offset from t0, and
// the expectation is the due time (as an offset) or the kind of sync the
// attempt makes.
func TestSchedule(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const (
		minSync    = 1 * time.Second
		syncPeriod = 30 * time.Second
		fullPeriod = time.Hour
	)
	// step is one event; for "due" and "attempt" the want fields apply.
	type step struct {
		ev           string // changed, reconfigured, drift, due, attempt, failed, succeeded
		at           time.Duration
		wantDue      time.Duration
		wantFull     bool
		wantPeriodic bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first snapshot syncs at once, full", []step{
			{ev: "changed", at: 0},
			{ev: "due", at: 0, wantDue: -1 << 62}, // the zero time plus minSync: long past
			{ev: "attempt", at: 0, wantFull: true},
			{ev: "succeeded", at: 0},
			{ev: "due", at: 0, wantDue: syncPeriod},
		}},
		{"a change waits minSync after the last attempt and is partial", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "changed", at: 200 * time.Millisecond},
			{ev: "due", at: 200 * time.Millisecond, wantDue: minSync},
			{ev: "attempt", at: minSync, wantFull: false, wantPeriodic: false},
		}},
		{"without changes: a periodic partial sync every syncPeriod", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "due", at: time.Second, wantDue: syncPeriod},
			{ev: "attempt", at: syncPeriod, wantFull: false, wantPeriodic: true},
			{ev: "succeeded"},
			{ev: "due", at: syncPeriod, wantDue: 2 * syncPeriod},
		}},
		{"a failure retries full after max(minSync, 1s), doubling up to syncPeriod", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true},
			{ev: "failed", at: 0},
			{ev: "due", at: 0, wantDue: time.Second},
			{ev: "changed", at: 100 * time.Millisecond}, // a change does not bypass the backoff
			{ev: "due", at: 100 * time.Millisecond, wantDue: time.Second},
			{ev: "attempt", at: time.Second, wantFull: true},
			{ev: "failed", at: time.Second},
			{ev: "due", at: time.Second, wantDue: 3 * time.Second},
			{ev: "attempt", at: 3 * time.Second, wantFull: true},
			{ev: "succeeded"},
			{ev: "due", at: 3 * time.Second, wantDue: 3*time.Second + syncPeriod},
		}},
		{"a reconfiguration syncs at once, full", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "reconfigured", at: 100 * time.Millisecond},
			{ev: "due", at: 100 * time.Millisecond, wantDue: 100 * time.Millisecond},
			{ev: "attempt", at: 100 * time.Millisecond, wantFull: true},
		}},
		{"drift asks for a full sync minSync after the last attempt", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "drift", at: 5 * time.Second},
			{ev: "due", at: 5 * time.Second, wantDue: minSync},
			{ev: "attempt", at: 5 * time.Second, wantFull: true},
		}},
		{"the hourly full sync gives way once to a waiting change", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "changed", at: fullPeriod},
			{ev: "attempt", at: fullPeriod, wantFull: false},
			{ev: "succeeded"},
			{ev: "due", at: fullPeriod, wantDue: fullPeriod}, // the deferred full sync: right after
			{ev: "attempt", at: fullPeriod, wantFull: true},
		}},
		{"an overdue full sync does not give way", []step{
			{ev: "changed", at: 0}, {ev: "attempt", at: 0, wantFull: true}, {ev: "succeeded"},
			{ev: "changed", at: fullPeriod + syncPeriod},
			{ev: "attempt", at: fullPeriod + syncPeriod, wantFull: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSchedule(minSync, syncPeriod, fullPeriod)
			full := false
			for i, st := range tc.steps {
				now := at(st.at)
				switch st.ev {
				case "changed":
					s.changed()
				case "reconfigured":
					s.reconfigured()
				case "drift":
					s.driftFound()
				case "failed":
					s.failed(now)
				case "succeeded":
					s.succeeded(full)
				case "due":
					got := s.due(now)
					if st.wantDue == -1<<62 {
						if !got.Before(now) {
							t.Errorf("step %d: due %v, want in the past", i, got)
						}
						continue
					}
					if want := at(st.wantDue); !got.Equal(want) {
						t.Errorf("step %d: due at +%v, want +%v", i, got.Sub(t0), st.wantDue)
					}
				case "attempt":
					var periodic bool
					full, periodic = s.attempt(now)
					if full != st.wantFull || periodic != st.wantPeriodic {
						t.Errorf("step %d: attempt at +%v: full %v periodic %v, want %v %v", i, st.at, full, periodic, st.wantFull, st.wantPeriodic)
					}
				default:
					t.Fatalf("unknown event %q", st.ev)
				}
			}
		})
	}
}
