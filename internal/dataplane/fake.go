package dataplane

import (
	"context"
	"sync"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Fake is an in-memory Dataplane for tests of the code that drives
// dataplanes. It records every Sync and can be told to fail. The zero value
// is usable and reports mode "fake".
type Fake struct {
	// ModeName is returned by Mode ("fake" when empty).
	ModeName string

	mu       sync.Mutex
	calls    []FakeCall
	failNext int
	err      error
	cleaned  int
}

// FakeCall is one recorded Sync.
type FakeCall struct {
	State *model.State
	Full  bool
	Err   error
}

// FailNext makes the next n Syncs return err.
func (f *Fake) FailNext(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext, f.err = n, err
}

// Mode implements Dataplane.
func (f *Fake) Mode() string {
	if f.ModeName == "" {
		return "fake"
	}
	return f.ModeName
}

// Sync implements Dataplane: it records the call and fails when told to.
func (f *Fake) Sync(_ context.Context, st *model.State, full bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if f.failNext > 0 {
		f.failNext--
		err = f.err
	}
	f.calls = append(f.calls, FakeCall{State: st, Full: full, Err: err})
	return err
}

// Cleanup implements Dataplane; it counts calls.
func (f *Fake) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleaned++
	return nil
}

// Calls returns a copy of the recorded Syncs.
func (f *Fake) Calls() []FakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FakeCall(nil), f.calls...)
}

// Cleanups returns how many times Cleanup ran.
func (f *Fake) Cleanups() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cleaned
}
