package main

// Slow start (vipproxy.io/slow-start): an endpoint that joins a Service's
// selection gets a small weight that grows to its full weight over the
// Service's slow-start time, rewritten by a rebuild every tenth of it.

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// rampSteps is how many weight levels a ramp has: a new endpoint starts at
// 1/rampSteps of its weight.
const rampSteps = 10

// ramp rewrites the weights of ramping endpoints. apply runs on the loop's
// goroutine (from Build); the rebuild timer calls invalidate.
type ramp struct {
	invalidate func()
	now        func() time.Time

	mu      sync.Mutex
	built   bool // a Build happened: endpoints seen later are new
	ports   map[model.ServicePortName]*rampPort
	gen     uint64 // Builds so far
	pending bool   // a rebuild is scheduled
}

// rampPort is a slow-start port as the last Build saw it.
type rampPort struct {
	in      *model.ServicePort // the port as built, before apply
	seen    map[netip.AddrPort]time.Time
	ramping bool   // an endpoint joined less than SlowStart ago
	gen     uint64 // the last Build that saw it
}

func newRamp(invalidate func()) *ramp {
	return &ramp{invalidate: invalidate, now: time.Now, ports: map[model.ServicePortName]*rampPort{}}
}

// apply returns st with the weights of endpoints that joined a slow-start
// port less than its SlowStart ago scaled down (copies of those ports),
// and schedules the next rebuild while any ramp runs. Endpoints present at
// the first Build are not new. Weights are scaled up by up to rampSteps
// (kept within model.MaxWeight·2.55, a uint8) so that a ramping endpoint
// can get a fraction of a weight-1 endpoint's share. A port the Builder
// reused (the same pointer as last time) with no ramp running is passed
// over without a look at its endpoints: that walk over 10,000 ports cost
// every sync 15 ms.
func (r *ramp) apply(st *model.State) *model.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.Uses != nil && st.Uses.SlowStart == 0 && len(r.ports) == 0 {
		r.built = true // no slow-start port now or before: nothing to look at
		return st
	}
	now := r.now()
	r.gen++
	var out *model.State
	var next time.Duration
	for i, sp := range st.Ports {
		if sp.SlowStart <= 0 {
			continue
		}
		rp := r.ports[sp.Name]
		if rp == nil {
			rp = &rampPort{seen: map[netip.AddrPort]time.Time{}}
			r.ports[sp.Name] = rp
		}
		rp.gen = r.gen
		if rp.in == sp && !rp.ramping {
			continue
		}
		rp.in = sp
		seen := rp.seen
		cur := make(map[netip.AddrPort]bool, len(seen))
		maxW, ramping := 1, false
		for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
			for _, e := range set {
				k := netip.AddrPortFrom(e.IP.Unmap(), e.Port)
				cur[k] = true
				t, ok := seen[k]
				if !ok {
					if r.built {
						t = now
					}
					seen[k] = t
				}
				maxW = max(maxW, e.W())
				ramping = ramping || (!t.IsZero() && now.Sub(t) < sp.SlowStart)
			}
		}
		for k := range seen {
			if !cur[k] {
				delete(seen, k)
			}
		}
		rp.ramping = ramping
		if !ramping {
			continue
		}
		scale := min(rampSteps, 255/maxW)
		weigh := func(eps []model.Endpoint) []model.Endpoint {
			if eps == nil {
				return nil
			}
			out := slices.Clone(eps)
			for j := range out {
				w := out[j].W() * scale
				if t := seen[netip.AddrPortFrom(out[j].IP.Unmap(), out[j].Port)]; !t.IsZero() && now.Sub(t) < sp.SlowStart {
					w = max(1, int(int64(w)*int64(now.Sub(t))/int64(sp.SlowStart)))
				}
				out[j].Weight = uint8(w)
			}
			return out
		}
		if out == nil {
			cp := *st
			cp.Ports = slices.Clone(st.Ports)
			out = &cp
		}
		p := *sp
		p.ClusterEndpoints, p.LocalEndpoints = weigh(sp.ClusterEndpoints), weigh(sp.LocalEndpoints)
		out.Ports[i] = &p
		step := max(500*time.Millisecond, sp.SlowStart/rampSteps)
		if next == 0 || step < next {
			next = step
		}
	}
	for name, rp := range r.ports {
		if rp.gen != r.gen {
			delete(r.ports, name)
		}
	}
	r.built = true
	if next > 0 && !r.pending && r.invalidate != nil {
		r.pending = true
		time.AfterFunc(next, func() {
			r.mu.Lock()
			r.pending = false
			r.mu.Unlock()
			r.invalidate()
		})
	}
	if out == nil {
		return st
	}
	return out
}
