package userspace

// The VIP addresses the mode serves: local already, added to the
// loopback interface (owned) or unservable, and guarded.

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

type vipState int

const (
	vipLocal      vipState = iota + 1 // already local, not ours
	vipOwned                          // added by us
	vipUnservable                     // neither
)

// addVIPs adds the wanted VIPs that are not local to the loopback
// interface; where it cannot, they are unservable (logged once each).
func (p *Proxier) addVIPs(d *desired) []error {
	var errs []error
	var unservable []string
	for ip := range d.vips {
		if p.vips[ip] == vipOwned || p.vips[ip] == vipLocal {
			continue
		}
		if p.canAdd == nil {
			if err := p.addrs.Add(ip); err != nil {
				errs = append(errs, fmt.Errorf("userspace: %w", err))
				p.vips[ip] = vipUnservable
				continue
			}
			p.owned[ip] = true
			p.vips[ip] = vipOwned
			delete(p.reported, ip)
			continue
		}
		p.vips[ip] = vipUnservable
		if !p.reported[ip] {
			p.reported[ip] = true
			unservable = append(unservable, ip.String())
		}
	}
	if len(unservable) > 0 {
		sort.Strings(unservable)
		p.log.Warn("userspace: VIPs not served: not local addresses and cannot be added",
			"vips", strings.Join(unservable, ","), "reason", p.canAdd.Error())
	}
	return errs
}

// removeVIPs removes the owned VIPs nobody wants any more (their
// listeners are closed) and forgets the others no longer wanted.
func (p *Proxier) removeVIPs(d *desired) []error {
	var errs []error
	for ip := range p.owned {
		if d.vips[ip] {
			continue
		}
		if err := p.addrs.Del(ip); err != nil {
			errs = append(errs, fmt.Errorf("userspace: %w", err))
			continue
		}
		delete(p.owned, ip)
		delete(p.vips, ip)
	}
	for ip := range p.vips {
		if !d.vips[ip] && !p.owned[ip] {
			delete(p.vips, ip)
			delete(p.reported, ip)
		}
	}
	return errs
}

// vipServable reports whether a listener on ip can be opened: node
// addresses always are tried; VIPs only when local.
func (p *Proxier) vipServable(ip netip.Addr, d *desired) bool {
	if !d.vips[ip] {
		return true
	}
	s := p.vips[ip]
	return s == vipLocal || s == vipOwned
}

// refreshOwned re-reads the owned addresses from the kernel, forgetting
// ones that disappeared (so they are added again) and adopting ones left by
// an earlier process (so they are removed when not wanted).
func (p *Proxier) refreshOwned() error {
	list, err := p.addrs.List()
	if err != nil {
		return fmt.Errorf("userspace: %w", err)
	}
	now := make(map[netip.Addr]bool, len(list))
	for _, ip := range list {
		now[ip] = true
	}
	for ip := range p.owned {
		if !now[ip] {
			delete(p.owned, ip)
			delete(p.vips, ip)
		}
	}
	for ip := range now {
		p.owned[ip] = true
		p.vips[ip] = vipOwned
	}
	return nil
}

// syncGuard guards every owned VIP and every wanted VIP that is not a
// node address, letting through the ports open listeners serve on them
// (a listener that failed to open lets no host listener through).
// It calls the Guard only when that changed (or with force).
func (p *Proxier) syncGuard(ctx context.Context, d *desired, force bool) error {
	if p.unguarded != nil {
		return nil
	}
	guarded := maps.Clone(p.owned)
	for ip := range d.vips {
		if p.vips[ip] != vipLocal {
			guarded[ip] = true
		}
	}
	vips, served := guardContent(guarded, p.listeners)
	g := &p.guarded
	if g.set && !force && slices.Equal(g.vips, vips) && slices.Equal(g.served, served) {
		return nil
	}
	if err := p.guard.Set(ctx, vips, served); err != nil {
		if !g.ever {
			// Never installed (no nf_tables in this kernel, say): serve
			// unguarded, and say so once, rather than fail every sync.
			p.unguarded = err
			p.log.Warn("userspace: cannot guard VIP addresses: the node's own listeners on wildcard addresses also answer on VIP:port", "err", err)
			return nil
		}
		g.set = false
		return err
	}
	*g = guardState{vips: vips, served: served, set: true, ever: true}
	return nil
}
