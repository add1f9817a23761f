package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// FakeKernel is an in-memory Kernel that holds virtual and real servers,
// records every write call and can dump its state. Connection counts are
// set by tests with SetConns. The zero value is empty and usable.
type FakeKernel struct {
	mu       sync.Mutex
	svcs     map[ServiceKey]*fakeSvc
	calls    []string
	timeouts Timeouts
	// Fail, when set, is consulted before every call with the call's name
	// ("AddService", …); a non-nil result is returned as the call's error.
	Fail func(call string) error
}

type fakeSvc struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

var _ Kernel = (*FakeKernel)(nil)

func (f *FakeKernel) log(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *FakeKernel) fail(call string) error {
	if f.Fail != nil {
		return f.Fail(call)
	}
	return nil
}

// Services implements Kernel.
func (f *FakeKernel) Services() ([]VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Services"); err != nil {
		return nil, err
	}
	out := make([]VirtualServer, 0, len(f.svcs))
	for _, s := range f.svcs {
		vs := s.vs
		vs.Flags |= FlagHashed // as the kernel reports them
		out = append(out, vs)
	}
	return out, nil
}

// AddService implements Kernel.
func (f *FakeKernel) AddService(vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("AddService"); err != nil {
		return err
	}
	if !validScheduler(vs.Scheduler) && vs.Scheduler != "mh" && vs.Scheduler != "wrr" && vs.Scheduler != "wlc" {
		return fmt.Errorf("add service %s: unknown scheduler %q: %w", vs.ServiceKey, vs.Scheduler, ErrNotFound)
	}
	if _, ok := f.svcs[vs.ServiceKey]; ok {
		return fmt.Errorf("add service %s: %w", vs.ServiceKey, ErrExist)
	}
	if f.svcs == nil {
		f.svcs = map[ServiceKey]*fakeSvc{}
	}
	f.svcs[vs.ServiceKey] = &fakeSvc{vs: vs, dests: map[netip.AddrPort]RealServer{}}
	f.log("AddService %s", vs)
	return nil
}

// UpdateService implements Kernel.
func (f *FakeKernel) UpdateService(vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("UpdateService"); err != nil {
		return err
	}
	s, ok := f.svcs[vs.ServiceKey]
	if !ok {
		return fmt.Errorf("update service %s: %w", vs.ServiceKey, ErrNotFound)
	}
	s.vs = vs
	f.log("UpdateService %s", vs)
	return nil
}

// DelService implements Kernel.
func (f *FakeKernel) DelService(k ServiceKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("DelService"); err != nil {
		return err
	}
	if _, ok := f.svcs[k]; !ok {
		return fmt.Errorf("delete service %s: %w", k, ErrNotFound)
	}
	delete(f.svcs, k)
	f.log("DelService %s", k)
	return nil
}

// Destinations implements Kernel.
func (f *FakeKernel) Destinations(k ServiceKey) ([]RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Destinations"); err != nil {
		return nil, err
	}
	s, ok := f.svcs[k]
	if !ok {
		return nil, fmt.Errorf("list destinations of %s: %w", k, ErrNotFound)
	}
	out := make([]RealServer, 0, len(s.dests))
	for _, d := range s.dests {
		out = append(out, d)
	}
	return out, nil
}

// AddDest implements Kernel.
func (f *FakeKernel) AddDest(k ServiceKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("AddDest"); err != nil {
		return err
	}
	s, ok := f.svcs[k]
	if !ok {
		return fmt.Errorf("add destination %s to %s: %w", rs.AddrPort(), k, ErrNotFound)
	}
	if _, ok := s.dests[rs.AddrPort()]; ok {
		return fmt.Errorf("add destination %s to %s: %w", rs.AddrPort(), k, ErrExist)
	}
	rs.ActiveConn, rs.InactiveConn = 0, 0
	s.dests[rs.AddrPort()] = rs
	f.log("AddDest %s %s", k, rs)
	return nil
}

// UpdateDest implements Kernel.
func (f *FakeKernel) UpdateDest(k ServiceKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("UpdateDest"); err != nil {
		return err
	}
	s, ok := f.svcs[k]
	if !ok {
		return fmt.Errorf("update destination %s of %s: %w", rs.AddrPort(), k, ErrNotFound)
	}
	old, ok := s.dests[rs.AddrPort()]
	if !ok {
		return fmt.Errorf("update destination %s of %s: %w", rs.AddrPort(), k, ErrNotFound)
	}
	old.Weight = rs.Weight
	s.dests[rs.AddrPort()] = old
	f.log("UpdateDest %s %s", k, rs)
	return nil
}

// DelDest implements Kernel.
func (f *FakeKernel) DelDest(k ServiceKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("DelDest"); err != nil {
		return err
	}
	s, ok := f.svcs[k]
	if !ok {
		return fmt.Errorf("delete destination %s of %s: %w", rs.AddrPort(), k, ErrNotFound)
	}
	if _, ok := s.dests[rs.AddrPort()]; !ok {
		return fmt.Errorf("delete destination %s of %s: %w", rs.AddrPort(), k, ErrNotFound)
	}
	delete(s.dests, rs.AddrPort())
	f.log("DelDest %s %s", k, rs.AddrPort())
	return nil
}

// SetTimeouts implements Kernel.
func (f *FakeKernel) SetTimeouts(t Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("SetTimeouts"); err != nil {
		return err
	}
	if t.TCP != 0 {
		f.timeouts.TCP = t.TCP
	}
	if t.TCPFin != 0 {
		f.timeouts.TCPFin = t.TCPFin
	}
	if t.UDP != 0 {
		f.timeouts.UDP = t.UDP
	}
	f.log("SetTimeouts tcp=%s tcpfin=%s udp=%s", t.TCP, t.TCPFin, t.UDP)
	return nil
}

// Timeouts returns the timeouts set so far.
func (f *FakeKernel) Timeouts() Timeouts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts
}

// SetConns sets the connection counts of a real server (as traffic would);
// it reports whether the real server exists.
func (f *FakeKernel) SetConns(k ServiceKey, dest netip.AddrPort, active, inactive int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.svcs[k]
	if !ok {
		return false
	}
	d, ok := s.dests[dest]
	if !ok {
		return false
	}
	d.ActiveConn, d.InactiveConn = active, inactive
	s.dests[dest] = d
	return true
}

// Calls returns the write calls made since the last call of Calls (or
// since creation), one line each, and forgets them.
func (f *FakeKernel) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// Dump returns the state as sorted lines, one per virtual server followed
// by its real servers indented:
//
//	TCP/10.96.0.1:80 rr
//	  -> 10.1.1.9:8080 w1
func (f *FakeKernel) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]ServiceKey, 0, len(f.svcs))
	for k := range f.svcs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ServiceKey) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
	})
	var b strings.Builder
	for _, k := range keys {
		s := f.svcs[k]
		b.WriteString(s.vs.String() + "\n")
		ds := make([]RealServer, 0, len(s.dests))
		for _, d := range s.dests {
			ds = append(ds, d)
		}
		slices.SortFunc(ds, func(a, b RealServer) int { return a.AddrPort().Compare(b.AddrPort()) })
		for _, d := range ds {
			b.WriteString("  -> " + d.String() + "\n")
		}
	}
	return b.String()
}
