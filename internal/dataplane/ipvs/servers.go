package ipvs

// Virtual and real servers in the kernel: reading them, moving them to
// the wanted state, and draining removed TCP real servers (graceful
// termination).

import (
	"errors"
	"maps"
	"net/netip"
	"slices"

	"github.com/vipproxy/vipproxy/internal/model"
)

// excluded reports whether a is inside ExcludeCIDRs.
func (p *Proxier) excluded(a netip.Addr) bool {
	for _, c := range p.opts.ExcludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// ours reports whether a kernel virtual server belongs to vipproxy: its
// address is a VIP vipproxy bound or a NodePort address, and it is not in
// ExcludeCIDRs.
func (p *Proxier) ours(a netip.Addr) bool {
	if p.excluded(a) {
		return false
	}
	return p.bound[a] || slices.Contains(p.npAddrs, a)
}

// readKernel rebuilds bound, applied and pending from the kernel: every virtual
// server that is ours (see ours) or that this Proxier made.
func (p *Proxier) readKernel() error {
	addrs, err := p.opts.Addrs.List()
	if err != nil {
		return err
	}
	p.bound = map[netip.Addr]bool{}
	for _, a := range addrs {
		p.bound[a] = true
	}
	svcs, err := p.opts.Kernel.Services()
	if err != nil {
		return err
	}
	// Addresses of virtual servers this Proxier made stay its own even
	// when they are no NodePort address any more.
	made := map[netip.Addr]bool{}
	for k := range p.applied {
		made[k.Addr] = true
	}
	p.applied = map[ServiceKey]*appliedVS{}
	p.pending = map[ServiceKey]map[netip.AddrPort]bool{}
	for _, vs := range svcs {
		if !p.ours(vs.Addr) && !made[vs.Addr] {
			continue
		}
		ds, err := p.opts.Kernel.Destinations(vs.ServiceKey)
		if err != nil {
			return err
		}
		a := &appliedVS{vs: vs, dests: map[netip.AddrPort]RealServer{}}
		for _, rs := range ds {
			a.dests[rs.AddrPort()] = rs
		}
		p.applied[vs.ServiceKey] = a
	}
	return nil
}

// graceful reports whether real servers of proto are drained before they
// are deleted. As in kube-proxy, UDP and SCTP real servers are deleted at
// once (expire_nodest_conn ends their flows on the next packet).
func graceful(proto model.Protocol) bool { return proto == model.TCP }

// syncVS makes one virtual server and its real servers match d.
func (p *Proxier) syncVS(d *desiredVS) error {
	k := d.vs.ServiceKey
	cur := p.applied[k]
	var errs []error
	if cur == nil {
		err := p.opts.Kernel.AddService(d.vs)
		cur = &appliedVS{vs: d.vs, dests: map[netip.AddrPort]RealServer{}}
		if IsExist(err) {
			// Someone else's, or ours from before a partial view: adopt it.
			if err = p.opts.Kernel.UpdateService(d.vs); err == nil {
				ds, lerr := p.opts.Kernel.Destinations(k)
				err = lerr
				for _, rs := range ds {
					cur.dests[rs.AddrPort()] = rs
				}
			}
		}
		if err != nil {
			return err
		}
		p.applied[k] = cur
	} else if !cur.vs.equal(d.vs) {
		if err := p.opts.Kernel.UpdateService(d.vs); err != nil {
			return err
		}
		cur.vs = d.vs
	} else if sameDests(cur.dests, d.dests) {
		return nil // the common case of a partial sync: nothing to do
	}
	for _, ap := range slices.SortedFunc(maps.Keys(d.dests), netip.AddrPort.Compare) {
		rs := d.dests[ap]
		have, ok := cur.dests[ap]
		switch {
		case !ok:
			if err := p.opts.Kernel.AddDest(k, rs); err != nil {
				errs = append(errs, err)
				continue
			}
			cur.dests[ap] = rs
		case have.Weight != rs.Weight:
			if err := p.opts.Kernel.UpdateDest(k, rs); err != nil {
				errs = append(errs, err)
				continue
			}
			have.Weight = rs.Weight
			cur.dests[ap] = have
		}
		delete(p.pending[k], ap)
	}
	for _, ap := range slices.SortedFunc(maps.Keys(cur.dests), netip.AddrPort.Compare) {
		if _, ok := d.dests[ap]; ok {
			continue
		}
		have := cur.dests[ap]
		if !graceful(k.Protocol) {
			if err := p.opts.Kernel.DelDest(k, have); err != nil && !IsNotFound(err) {
				errs = append(errs, err)
				continue
			}
			delete(cur.dests, ap)
			continue
		}
		if have.Weight != 0 {
			have.Weight = 0
			if err := p.opts.Kernel.UpdateDest(k, have); err != nil {
				errs = append(errs, err)
				continue
			}
			cur.dests[ap] = have
		}
		if p.pending[k] == nil {
			p.pending[k] = map[netip.AddrPort]bool{}
		}
		p.pending[k][ap] = true
	}
	return errors.Join(errs...)
}

// sameDests reports whether the applied real servers are exactly the
// wanted ones with the wanted weights (then none is pending either).
func sameDests(have, want map[netip.AddrPort]RealServer) bool {
	if len(have) != len(want) {
		return false
	}
	for ap, w := range want {
		h, ok := have[ap]
		if !ok || h.Weight != w.Weight {
			return false
		}
	}
	return true
}

// reapPending deletes the real servers at weight 0 that hold no active
// or inactive connection any more.
func (p *Proxier) reapPending() error {
	var errs []error
	for _, k := range slices.SortedFunc(maps.Keys(p.pending), ServiceKey.Compare) {
		aps := p.pending[k]
		cur := p.applied[k]
		if cur == nil || len(aps) == 0 {
			delete(p.pending, k)
			continue
		}
		ds, err := p.opts.Kernel.Destinations(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		inKernel := map[netip.AddrPort]RealServer{}
		for _, rs := range ds {
			inKernel[rs.AddrPort()] = rs
		}
		for _, ap := range slices.SortedFunc(maps.Keys(aps), netip.AddrPort.Compare) {
			rs, ok := inKernel[ap]
			if ok && rs.ActiveConn+rs.InactiveConn > 0 {
				continue
			}
			if ok {
				if err := p.opts.Kernel.DelDest(k, rs); err != nil && !IsNotFound(err) {
					errs = append(errs, err)
					continue
				}
				p.log.Debug("real server drained and deleted", "virtualServer", k.String(), "realServer", ap.String())
			}
			delete(cur.dests, ap)
			delete(aps, ap)
		}
		if len(aps) == 0 {
			delete(p.pending, k)
		}
	}
	return errors.Join(errs...)
}

// syncServers moves the kernel's virtual servers to d's: each wanted one
// programmed, each of vipproxy's no longer wanted deleted, drained real
// servers whose connections ended deleted.
func (p *Proxier) syncServers(d *desired, errs []error) []error {
	for _, k := range slices.SortedFunc(maps.Keys(d.vss), ServiceKey.Compare) {
		if err := p.syncVS(d.vss[k]); err != nil {
			errs = append(errs, err)
			p.log.Warn("virtual server not fully programmed", "virtualServer", k.String(), "err", err)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.applied), ServiceKey.Compare) {
		if _, ok := d.vss[k]; ok {
			continue
		}
		if err := p.opts.Kernel.DelService(k); err != nil && !IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		delete(p.applied, k)
		delete(p.pending, k)
	}
	if err := p.reapPending(); err != nil {
		errs = append(errs, err)
	}
	return errs
}
