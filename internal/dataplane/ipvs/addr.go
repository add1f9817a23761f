package ipvs

import (
	"net/netip"
	"slices"
	"sync"
)

// Addrs binds the VIP addresses of virtual servers to an interface the
// IPVS mode owns, so that packets to them are delivered locally (where
// IPVS intercepts them). Implementations: LinkAddrs (Linux) and FakeAddrs.
type Addrs interface {
	// Add binds ip; binding an owned address again is not an error.
	Add(ip netip.Addr) error
	// Del unbinds an owned address; a missing one is not an error.
	Del(ip netip.Addr) error
	// List returns the owned addresses, including those left by an
	// earlier process.
	List() ([]netip.Addr, error)
	// Cleanup removes every owned address and anything else the
	// implementation created (an interface).
	Cleanup() error
}

// FakeAddrs is an in-memory Addrs that records calls. The zero value is usable.
type FakeAddrs struct {
	mu    sync.Mutex
	addrs map[netip.Addr]bool
	calls []string
}

var _ Addrs = (*FakeAddrs)(nil)

// Add implements Addrs.
func (f *FakeAddrs) Add(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addrs == nil {
		f.addrs = map[netip.Addr]bool{}
	}
	f.addrs[ip] = true
	f.calls = append(f.calls, "add "+ip.String())
	return nil
}

// Del implements Addrs.
func (f *FakeAddrs) Del(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.addrs, ip)
	f.calls = append(f.calls, "del "+ip.String())
	return nil
}

// List implements Addrs.
func (f *FakeAddrs) List() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]netip.Addr, 0, len(f.addrs))
	for a := range f.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// Cleanup implements Addrs.
func (f *FakeAddrs) Cleanup() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs = nil
	f.calls = append(f.calls, "cleanup")
	return nil
}

// Calls returns the calls since the last Calls and forgets them.
func (f *FakeAddrs) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}
