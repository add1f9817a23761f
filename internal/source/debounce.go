package source

import "time"

// MaxDebounces bounds how long a continuous stream of changes can delay a
// snapshot: at most MaxDebounces × the quiet period after the first
// change of a burst.
const MaxDebounces = 10

// Debounce is the timer both sources use to turn a burst of changes into
// one snapshot: each Event (re)arms C to fire after a quiet period, but
// never later than MaxDebounces periods after the burst's first Event.
// After receiving from C, call Fired. It is not safe for concurrent use.
type Debounce struct {
	// C receives when the burst is over.
	C      <-chan time.Time
	period time.Duration
	timer  *time.Timer
	since  time.Time // the burst's first Event; zero when none is pending
}

// NewDebounce returns a stopped Debounce with the given quiet period.
func NewDebounce(period time.Duration) *Debounce {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Debounce{C: t.C, period: period, timer: t}
}

// Event notes a change at now and re-arms C.
func (d *Debounce) Event(now time.Time) {
	if d.since.IsZero() {
		d.since = now
	}
	d.timer.Reset(debounceWait(d.since, now, d.period))
}

// Fired ends the burst.
func (d *Debounce) Fired() { d.since = time.Time{} }

// Stop stops the timer.
func (d *Debounce) Stop() { d.timer.Stop() }

// debounceWait is how long after now a burst that began at since ends:
// one quiet period, capped at MaxDebounces periods after since.
func debounceWait(since, now time.Time, period time.Duration) time.Duration {
	wait := period
	if limit := since.Add(MaxDebounces * period); now.Add(wait).After(limit) {
		wait = max(limit.Sub(now), 0)
	}
	return wait
}
