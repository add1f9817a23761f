package source

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestDebounceWait: one quiet period after each event, capped at
// MaxDebounces periods after the burst began, never negative.
func TestDebounceWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := 10 * time.Millisecond
	for _, tc := range []struct {
		name  string
		after time.Duration // now - since
		want  time.Duration
	}{
		{"first event", 0, p},
		{"mid burst", 50 * time.Millisecond, p},
		{"near the cap", 95 * time.Millisecond, 5 * time.Millisecond},
		{"at the cap", 100 * time.Millisecond, 0},
		{"past the cap", 150 * time.Millisecond, 0},
	} {
		if got := debounceWait(t0, t0.Add(tc.after), p); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDebounce: a burst of events 5 ms apart (each re-arming C before it
// fires) fires once, MaxDebounces periods after its first event; after
// Fired the next event starts a new burst, which fires one period later.
func TestDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDebounce(10 * time.Millisecond)
		defer d.Stop()
		start := time.Now()
		for i := 0; i < 20; i++ { // events at 0, 5, …, 95 ms
			if i > 0 {
				time.Sleep(5 * time.Millisecond)
			}
			select {
			case <-d.C:
				t.Fatalf("fired at %v, before the cap", time.Since(start))
			default:
			}
			d.Event(time.Now())
		}
		<-d.C
		if got := time.Since(start); got != 100*time.Millisecond {
			t.Errorf("burst fired at %v, want 100ms (the cap)", got)
		}
		d.Fired()
		time.Sleep(50 * time.Millisecond)
		since := time.Now()
		d.Event(since)
		<-d.C
		if got := time.Since(since); got != 10*time.Millisecond {
			t.Errorf("a new burst after Fired waited %v, want 10ms", got)
		}
	})
}
