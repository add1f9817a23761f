// Package ipvs is vipproxy's IPVS mode: one IPVS virtual server per
// Service VIP:port (ClusterIP, externalIP, load-balancer IP) and per node
// address:NodePort, one real server per endpoint, the VIPs bound to an
// interface the mode owns, and a fixed set of iptables rules whose
// decisions (masquerade, loadBalancerSourceRanges, Local policies,
// no-endpoint reject, unknown-port reject) are ipset lookups. The one
// exception is ClientIP affinity shorter than IPVS persistence can keep
// (sticky.go): a DNAT and a learning rule per real server.
//
// Files: proxier.go (Options, Sync's steps), fragment.go (a ServicePort's
// virtual servers and set members: the mode's rule-building function),
// rules.go (the ipsets and the fixed iptables rules), sticky.go (short
// affinity), servers.go (the kernel's virtual and real servers, graceful
// termination), cleanup.go (migration and Cleanup), verify.go (drift
// check), sysctl.go, kernel.go and netlink_*.go, ipset.go, addr*.go (the
// OS boundaries), new.go (probe and fallback).
//
// New probes the kernel and falls back to the iptables mode, with one
// warning and a metric, when IPVS or ipset is unusable. NewProxier builds
// the IPVS proxier without probing (for tests over fakes).
//
// Every OS boundary is an interface with a fake: Kernel (IPVS netlink),
// ipset.Runner (ipset restore), iptables.Runner (iptables-restore), Addrs (VIP
// binding) and Sysctl.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/portcache"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// Options configure the IPVS mode. Every OS boundary is a field; nil
// means the real one in the calling thread's network namespace.
type Options struct {
	dataplane.Options
	// Kernel programs IPVS; nil means OpenNetlink().
	Kernel Kernel
	// IPSet runs ipset; nil means &ipset.Exec{}.
	IPSet ipset.Runner
	// Runner runs iptables-restore/-save; nil means &iptables.Exec{}.
	Runner iptables.Runner
	// Addrs binds VIPs; nil means &LinkAddrs{} (dummy interface where the
	// kernel has them, else labelled addresses on lo).
	Addrs Addrs
	// Sysctl writes the IPVS sysctls; nil means sysctl.OSFS{} (the
	// wiring passes a sysctl.Journaled).
	Sysctl sysctl.FS
	// Families are the IP families programmed; nil means IPv4 and IPv6.
	Families []iptables.Family
	// Timeouts are ipvs.tcpTimeout, tcpFinTimeout and udpTimeout; zero
	// fields leave the kernel's values.
	Timeouts Timeouts
	// StrictARP sets arp_ignore=1 and arp_announce=2 (ipvs.strictARP).
	StrictARP bool
	// ExcludeCIDRs protects virtual servers in these prefixes: vipproxy
	// never deletes them (ipvs.excludeCIDRs).
	ExcludeCIDRs []netip.Prefix
	// LocalAddrs returns the node's local addresses, for
	// NodePortAddresses; nil uses net.InterfaceAddrs.
	LocalAddrs func() ([]netip.Addr, error)
	// IPTables configures the iptables mode New falls back to; its
	// embedded dataplane.Options are replaced by Options.Options.
	IPTables iptables.Options
	// FlushLocal makes Cleanup delete the virtual servers on every local
	// address (as kube-proxy's --cleanup flushes IPVS), not only those on
	// vipproxy's VIPs, on NodeIPs and those this Proxier made. Set it for
	// `vipproxy --cleanup`, not for removing leftovers at start.
	FlushLocal bool
}

// Proxier implements dataplane.Dataplane with IPVS. Create it with New or
// NewProxier.
type Proxier struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	needFull bool
	// applied is what vipproxy believes the kernel holds: its virtual
	// servers and their real servers.
	applied map[ServiceKey]*appliedVS
	// pending holds real servers at weight 0 waiting for their TCP
	// connections to end (graceful termination).
	pending map[ServiceKey]map[netip.AddrPort]bool
	sets    setState
	bound   map[netip.Addr]bool
	npAddrs []netip.Addr
	// cache holds each port's fragment while the port and the NodePort
	// addresses are unchanged (a change of npAddrs invalidates it).
	cache portcache.Cache[model.ServicePortName, fragment]

	// verifyNext is where Verify's window of real-server checks starts.
	verifyNext int

	// sticky is the last build's short-affinity pairs, which the nat
	// table's rules include; stickyHave is the sticky chains' restore
	// input last written, per family.
	sticky     []sticky
	stickyHave map[iptables.Family]string

	sysctlsDone  bool
	timeoutsDone bool
	originals    map[string]string
}

type appliedVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// validate checks and defaults the options New and NewProxier share.
func validate(opts *Options) error {
	if opts.Scheduler == "" {
		opts.Scheduler = "rr"
	}
	if !validScheduler(opts.Scheduler) {
		return fmt.Errorf("ipvs: ipvs.scheduler %q is not one of %s", opts.Scheduler, strings.Join(Schedulers, ", "))
	}
	opts.Options = opts.Options.WithDefaults()
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return fmt.Errorf("ipvs: masqueradeBit %d is not in [0, 31]", opts.MasqueradeBit)
	}
	for name, d := range map[string]int64{"tcpTimeout": int64(opts.Timeouts.TCP), "tcpFinTimeout": int64(opts.Timeouts.TCPFin), "udpTimeout": int64(opts.Timeouts.UDP)} {
		if d < 0 {
			return fmt.Errorf("ipvs: ipvs.%s %d is negative", name, d)
		}
	}
	if opts.Families == nil {
		opts.Families = []iptables.Family{iptables.IPv4, iptables.IPv6}
	}
	if opts.IPSet == nil {
		opts.IPSet = &ipset.Exec{}
	}
	if opts.Runner == nil {
		opts.Runner = &iptables.Exec{}
	}
	if opts.Addrs == nil {
		opts.Addrs = &LinkAddrs{}
	}
	if opts.Sysctl == nil {
		opts.Sysctl = sysctl.OSFS{}
	}
	if opts.LocalAddrs == nil {
		opts.LocalAddrs = interfaceAddrs
	}
	return nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("ipvs: list local addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// NewProxier validates opts and returns the IPVS proxier without probing.
// A nil Kernel is opened with OpenNetlink, whose failure is returned. It
// writes nothing to the kernel; the first Sync does.
func NewProxier(opts Options) (*Proxier, error) {
	if err := validate(&opts); err != nil {
		return nil, err
	}
	if opts.Kernel == nil {
		k, err := OpenNetlink()
		if err != nil {
			return nil, err
		}
		opts.Kernel = k
	}
	return &Proxier{
		opts:       opts,
		log:        opts.Log().With("mode", "ipvs"),
		needFull:   true,
		applied:    map[ServiceKey]*appliedVS{},
		pending:    map[ServiceKey]map[netip.AddrPort]bool{},
		sets:       setState{},
		bound:      map[netip.Addr]bool{},
		stickyHave: map[iptables.Family]string{},
	}, nil
}

// Mode implements dataplane.Dataplane.
func (p *Proxier) Mode() string { return "ipvs" }

// SysctlOriginals returns the values the sysctls had before this Proxier
// changed them (only those it changed).
func (p *Proxier) SysctlOriginals() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.originals))
	for k, v := range p.originals {
		out[k] = v
	}
	return out
}

// PendingDeletions returns the real servers at weight 0 waiting for their
// connections to end, as "TCP/vip:port -> ep:port", sorted.
func (p *Proxier) PendingDeletions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k, m := range p.pending {
		for ap := range m {
			out = append(out, k.String()+" -> "+ap.String())
		}
	}
	slices.Sort(out)
	return out
}

func (p *Proxier) wantFamily(a netip.Addr) bool {
	return slices.Contains(p.opts.Families, familyOf(a))
}

// setSysctls writes the IPVS sysctls, recording the original values of
// those it changes.
func (p *Proxier) setSysctls() error {
	var errs []error
	if p.originals == nil {
		p.originals = map[string]string{}
	}
	for _, s := range sysctls(p.opts.StrictARP) {
		old, err := p.opts.Sysctl.Read(s.name)
		if err == nil && old == s.value {
			continue
		}
		if err := p.opts.Sysctl.Write(s.name, s.value); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, seen := p.originals[s.name]; !seen && old != "" {
			p.originals[s.name] = old
		}
	}
	return errors.Join(errs...)
}

// Sync implements dataplane.Dataplane. A full sync (asked for, first,
// or after a failure) reads vipproxy's virtual servers and bound VIPs
// back from the kernel, rewrites every ipset through a swap and rewrites
// the iptables chains; a partial sync touches only the virtual servers,
// real servers, VIPs and set members that changed, and no iptables rule.
// Every sync deletes drained real servers. Errors of single objects do
// not stop the others; any error makes the next sync full.
func (p *Proxier) Sync(ctx context.Context, st *model.State, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st == nil {
		st = &model.State{}
	}
	if p.needFull {
		full = true
	}
	if !full {
		if reason := p.rulesGone(ctx); reason != "" {
			p.log.Warn("vipproxy IPVS-mode rules were removed; doing a full sync", "reason", reason)
			full = true
		}
	}
	errs := p.once()
	if full {
		var err error
		if errs, err = p.reread(errs); err != nil {
			p.needFull = true
			return errors.Join(append(errs, fmt.Errorf("ipvs: read kernel state: %w", err))...)
		}
	}
	d := p.build(st)
	errs = p.bindVIPs(d, errs)
	errs = p.syncServers(d, errs)
	errs = p.unbindVIPs(d, errs)
	errs = p.syncSets(ctx, d, full, errs)
	errs = p.syncRules(ctx, d, full, errs)
	if len(errs) > 0 {
		p.needFull = true
		err := errors.Join(errs...)
		p.log.Error("ipvs sync failed; next sync is full", "full", full, "err", err)
		return err
	}
	p.needFull = false
	return nil
}

// once does what the first Sync does and a failed one retries: set the
// sysctls and the IPVS timeouts.
func (p *Proxier) once() (errs []error) {
	if !p.sysctlsDone {
		if err := p.setSysctls(); err != nil {
			errs = append(errs, err)
		} else {
			p.sysctlsDone = true
		}
	}
	if !p.timeoutsDone {
		if t := p.opts.Timeouts; t != (Timeouts{}) {
			if err := p.opts.Kernel.SetTimeouts(t); err != nil {
				return append(errs, err)
			}
		}
		p.timeoutsDone = true
	}
	return errs
}

// reread refreshes, for a full sync, what the kernel holds: the bound
// VIPs, the NodePort addresses and the virtual servers. A failure to read
// the virtual servers is returned apart: the sync cannot go on.
func (p *Proxier) reread(errs []error) ([]error, error) {
	p.bound = map[netip.Addr]bool{}
	if addrs, err := p.opts.Addrs.List(); err == nil {
		for _, a := range addrs {
			p.bound[a] = true
		}
	}
	np, err := p.nodePortAddrs()
	if err != nil {
		errs = append(errs, err)
	} else if !slices.Equal(np, p.npAddrs) {
		p.npAddrs = np
		p.cache.Invalidate()
	}
	return errs, p.readKernel()
}

// bindVIPs binds the wanted VIPs not bound yet.
func (p *Proxier) bindVIPs(d *desired, errs []error) []error {
	for _, ip := range slices.SortedFunc(maps.Keys(d.vips), netip.Addr.Compare) {
		if p.bound[ip] {
			continue
		}
		if err := p.opts.Addrs.Add(ip); err != nil {
			errs = append(errs, err)
			continue
		}
		p.bound[ip] = true
	}
	return errs
}

// unbindVIPs unbinds the bound VIPs no longer wanted.
func (p *Proxier) unbindVIPs(d *desired, errs []error) []error {
	for _, ip := range slices.SortedFunc(maps.Keys(p.bound), netip.Addr.Compare) {
		if d.vips[ip] {
			continue
		}
		if err := p.opts.Addrs.Del(ip); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(p.bound, ip)
	}
	return errs
}

// syncSets writes the ipset members: every set swapped in whole on a full
// sync, the differences otherwise.
func (p *Proxier) syncSets(ctx context.Context, d *desired, full bool, errs []error) []error {
	exists := func(string) bool { return false }
	if full {
		names, err := p.opts.IPSet.List(ctx)
		if err != nil {
			return append(errs, err)
		}
		exists = func(n string) bool { return slices.Contains(names, n) }
	}
	for _, fam := range p.opts.Families {
		var script []byte
		if full {
			script = setsFull(fam, d.sets[fam], exists)
		} else {
			script = setsDiff(fam, p.sets[fam], d.sets[fam])
		}
		if script == nil {
			continue
		}
		if err := p.opts.IPSet.Restore(ctx, script); err != nil {
			errs = append(errs, err)
			continue
		}
		p.sets[fam] = d.sets[fam]
	}
	return errs
}

// syncRules writes the iptables rules: every chain of every table on a
// full sync; otherwise only the nat sticky chains, when they changed
// (everything else depends on the options alone).
func (p *Proxier) syncRules(ctx context.Context, d *desired, full bool, errs []error) []error {
	p.sticky = d.sticky
	for _, fam := range p.opts.Families {
		if !full {
			in := stickyInput(p.sticky, fam)
			if string(in) == p.stickyHave[fam] {
				continue
			}
			if err := p.opts.Runner.Restore(ctx, fam, iptables.TableNAT, in); err != nil {
				errs = append(errs, err)
				continue
			}
			p.stickyHave[fam] = string(in)
			continue
		}
		for _, table := range tables {
			saved, err := p.opts.Runner.Save(ctx, fam, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := p.opts.Runner.Restore(ctx, fam, table, p.rulesInput(fam, table, saved)); err != nil {
				errs = append(errs, err)
			} else if table == iptables.TableNAT {
				p.stickyHave[fam] = string(stickyInput(p.sticky, fam))
			}
		}
	}
	return errs
}
