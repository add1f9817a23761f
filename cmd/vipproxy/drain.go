package main

// Drain policy (vipproxy.io/drain: reset-after=DURATION): when an endpoint
// leaves such a Service, its established TCP flows through the Service are
// cut once the grace period ends, by deleting their conntrack entries: the
// client's next packet is then tracked afresh, DNATed to a current
// endpoint, which knows no such connection and answers with a reset.
// Without the annotation flows are kept, as kube-proxy keeps them.

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/model"
)

type drainKey struct {
	port model.ServicePortName
	ep   netip.AddrPort
}

// drainPort is what a drain needs of a port: its endpoints, the
// addresses its flows arrive on (VIP:port, any address:nodePort) and the
// grace period.
type drainPort struct {
	eps      map[netip.AddrPort]bool
	vips     map[netip.AddrPort]bool
	nodePort uint16
	grace    time.Duration
}

// through reports whether a flow to dst arrived through the port.
func (p drainPort) through(dst netip.AddrPort) bool {
	return p.vips[dst] || (p.nodePort != 0 && dst.Port() == p.nodePort)
}

// drainer is an AfterSync hook.
type drainer struct {
	log   *slog.Logger
	table func() (conntrack.Table, func(), error)
	// skip says the running mode has no DNAT to cut (userspace).
	skip func() bool

	mu     sync.Mutex
	prev   map[model.ServicePortName]drainPort
	timers map[drainKey]*time.Timer
}

func newDrainer(log *slog.Logger, skip func() bool) *drainer {
	return &drainer{log: log, skip: skip, table: openConntrack, prev: map[model.ServicePortName]drainPort{}, timers: map[drainKey]*time.Timer{}}
}

// afterSync compares the endpoints of the drain-reset ports of st with the
// last synced ones: an endpoint that left gets a timer, one that came back
// loses it.
func (d *drainer) afterSync(_ context.Context, st *model.State) {
	if st.Uses != nil && st.Uses.DrainReset == 0 {
		d.mu.Lock()
		none := len(d.prev) == 0
		d.mu.Unlock()
		if none {
			return // no drained port now or before: nothing to look at
		}
	}
	cur := map[model.ServicePortName]drainPort{}
	for _, sp := range st.Ports {
		if sp.DrainReset <= 0 {
			continue
		}
		p := drainPort{eps: map[netip.AddrPort]bool{}, vips: map[netip.AddrPort]bool{}, nodePort: sp.NodePort, grace: sp.DrainReset}
		for _, e := range sp.Endpoints {
			p.eps[netip.AddrPortFrom(e.IP.Unmap(), e.Port)] = true
		}
		for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, a := range list {
				p.vips[netip.AddrPortFrom(a.Unmap(), sp.Port)] = true
			}
		}
		cur[sp.Name] = p
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, old := range d.prev {
		for ep := range old.eps {
			if cur[name].eps[ep] {
				continue
			}
			k := drainKey{name, ep}
			if d.timers[k] != nil {
				continue
			}
			d.timers[k] = time.AfterFunc(old.grace, func() { d.reset(k, old) })
		}
	}
	for k, t := range d.timers {
		if cur[k.port].eps[k.ep] {
			t.Stop()
			delete(d.timers, k)
		}
	}
	d.prev = cur
}

// reset deletes the TCP conntrack entries DNATed to k.ep through p.
func (d *drainer) reset(k drainKey, p drainPort) {
	d.mu.Lock()
	delete(d.timers, k)
	d.mu.Unlock()
	if d.skip != nil && d.skip() {
		d.log.Info("drain: reset-after is not applied in userspace mode (its proxy owns the connections)", "servicePort", k.port.String(), "endpoint", k.ep.String())
		return
	}
	t, closeTable, err := d.table()
	if err != nil {
		d.log.Error("drain: cannot open conntrack", "servicePort", k.port.String(), "endpoint", k.ep.String(), "err", err)
		return
	}
	defer closeTable()
	family := model.IPv4
	if k.ep.Addr().Is6() {
		family = model.IPv6
	}
	flows, err := t.List(family)
	if err != nil {
		d.log.Error("drain: conntrack list failed", "servicePort", k.port.String(), "err", err)
		return
	}
	var cut []conntrack.Flow
	for _, f := range flows {
		if f.Protocol == conntrack.ProtoTCP && f.ReplySrc == k.ep && f.OrigDst != f.ReplySrc && p.through(f.OrigDst) {
			cut = append(cut, f)
		}
	}
	if len(cut) == 0 {
		return
	}
	n, err := t.Delete(cut)
	d.log.Info("drain: reset the flows of an endpoint that left", "servicePort", k.port.String(), "endpoint", k.ep.String(),
		"after", p.grace.String(), "flows", n, "err", err)
}
