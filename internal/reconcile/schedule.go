package reconcile

import "time"

// schedule is the loop's timing state: when the next sync is due and
// whether it is full. Its methods take the current time as an argument
// and do no I/O, so the policy is tested without a clock (schedule_test.go)
// and Run only feeds it events.
//
// The policy: nothing before the first snapshot; a change syncs
// minSync after the last attempt (coalescing what arrives meanwhile); a
// reconfiguration syncs at once, full; a failure is retried full after a
// backoff that starts at max(minSync, 1 s) and doubles up to syncPeriod;
// without changes a sync runs every syncPeriod, and a full one every
// fullSyncPeriod, which gives way once to a waiting change (the change
// goes out partial, the full sync right after it) unless it is overdue by
// a syncPeriod.
type schedule struct {
	minSync, syncPeriod, fullSyncPeriod time.Duration

	lastAttempt, lastFull time.Time
	needFull              bool // the next sync is full: first, after a failure, drift, reconfiguration
	fullDeferred          bool // a due full sync gave way to a change's partial one
	dirty                 bool // a snapshot arrived since the last successful sync
	immediate             bool // a reconfiguration: sync now, ignoring minSync
	backoff               time.Duration
	retryAt               time.Time
}

func newSchedule(minSync, syncPeriod, fullSyncPeriod time.Duration) *schedule {
	return &schedule{minSync: minSync, syncPeriod: syncPeriod, fullSyncPeriod: fullSyncPeriod, needFull: true}
}

// changed records a new snapshot.
func (s *schedule) changed() { s.dirty = true }

// reconfigured records a new dataplane or new periods: the next sync is
// full and runs at once.
func (s *schedule) reconfigured() {
	s.needFull, s.dirty, s.immediate, s.retryAt = true, true, true, time.Time{}
}

// driftFound records a drift check that asks for a repairing full sync.
func (s *schedule) driftFound() { s.needFull = true }

// due returns when the next sync is due, seen at now: the earliest of the
// retry time after a failure, minSync after the last attempt when there
// is work, the periodic sync and the periodic full sync.
func (s *schedule) due(now time.Time) time.Time {
	due := now.Add(s.syncPeriod)
	if !s.lastAttempt.IsZero() {
		due = s.lastAttempt.Add(s.syncPeriod)
	}
	if !s.lastFull.IsZero() {
		due = earliest(due, s.lastFull.Add(s.fullSyncPeriod))
	}
	switch {
	case s.immediate:
		return now
	case !s.retryAt.IsZero():
		return earliest(due, s.retryAt)
	case s.dirty || s.needFull || s.fullDeferred:
		return earliest(due, s.lastAttempt.Add(s.minSync))
	}
	return due
}

// attempt records a sync starting at now and says whether it is full and
// whether it is periodic (no change, not full: a drift check goes with it).
func (s *schedule) attempt(now time.Time) (full, periodic bool) {
	fullAt := s.lastFull.Add(s.fullSyncPeriod)
	full = s.needFull || (!now.Before(fullAt) && (!s.dirty || now.Sub(fullAt) >= s.syncPeriod))
	s.fullDeferred = !full && !now.Before(fullAt)
	periodic = !s.dirty && !full
	s.lastAttempt, s.immediate = now, false
	return full, periodic
}

// failed records that the attempt failed at now: the next sync is full,
// after the backoff.
func (s *schedule) failed(now time.Time) {
	s.needFull = true
	s.backoff = min(max(s.backoff*2, s.minSync, time.Second), s.syncPeriod)
	s.retryAt = now.Add(s.backoff)
}

// succeeded records that the attempt (full or not) succeeded.
func (s *schedule) succeeded(full bool) {
	s.backoff, s.retryAt, s.needFull, s.dirty = 0, time.Time{}, false, false
	if full {
		s.lastFull = s.lastAttempt
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
