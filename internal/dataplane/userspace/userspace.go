// Package userspace is the userspace proxy mode: a Go layer-4 proxy
// (package l4proxy) listening on every Service VIP and NodePort. It needs
// no netfilter, so it runs unprivileged and on systems other than Linux,
// and it retries a TCP connection on another endpoint when the first one
// refuses, which kernel NAT cannot.
//
// For each ServicePort (TCP or UDP) there is a listener on each ClusterIP,
// externalIP and load-balancer IP at the Service port, and on each NodePort
// address at the NodePort. VIP listeners use the port's internal endpoints,
// the others its external endpoints, each family its own; with
// externalTrafficPolicy Local, in-cluster clients (pods in ClusterCIDRs,
// the node itself) of the external listeners are short-circuited to the
// Cluster endpoints, as kube-proxy does. A port without endpoints has no
// listener, so the kernel refuses connections at once (TCP RST, ICMP port
// unreachable for UDP), as kube-proxy's reject rules do; accepting and
// resetting would look like a reset after a successful connect instead,
// and hold a socket per attempt.
//
// VIPs must be local addresses to be bound. With CAP_NET_ADMIN on Linux the
// mode adds each VIP that is not already local to lo as a /32 or /128 with
// the label lo:vipproxy (see LoAddrs) and removes it when no Service needs
// it and in Cleanup. Without, it serves the VIPs that are already local
// (such as a 127.0.0.0/8 service range on Linux) and logs which it cannot
// serve and why. Ports below net.ipv4.ip_unprivileged_port_start need
// CAP_NET_BIND_SERVICE; without it those listeners are logged once and
// skipped.
//
// What a socket proxy cannot do, unlike the kernel modes: client source
// addresses are not preserved (endpoints see connections from the node,
// so externalTrafficPolicy Local selects endpoints but does not keep the
// client IP); traffic the kernel modes drop (internalTrafficPolicy Local
// without local endpoints) is refused instead, since there is no listener;
// SCTP is not proxied; no conntrack entries exist to clean up.
// loadBalancerSourceRanges are enforced per connection (TCP reset, UDP
// datagram dropped).
package userspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/l4proxy"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/netinfo"
)

// Mode is the name this dataplane reports.
const Mode = "userspace"

// Options configure the userspace mode.
type Options struct {
	dataplane.Options
	// DialTimeout bounds each dial to an endpoint; zero means
	// l4proxy.DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxTries is how many endpoints a TCP connection tries; zero means
	// l4proxy.DefaultMaxTries.
	MaxTries int
	// UDPIdleTimeout ends idle UDP sessions; zero means
	// l4proxy.DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration
	// MaxUDPSessions caps the UDP sessions of each listener group (one
	// ServicePort's VIP or external listeners of one family); zero means
	// l4proxy.DefaultMaxUDPSessions.
	MaxUDPSessions int
	// MaxSockets caps the proxied sockets of the whole mode (a TCP
	// connection holds two, a UDP session one); zero means no cap.
	MaxSockets int
	// Addrs adds and removes VIP addresses; nil means the system's
	// (LoAddrs on Linux, NoAddrs elsewhere).
	Addrs AddrManager
	// LocalAddrs lists this host's addresses for nodePortAddresses; nil
	// means netinfo.LocalAddrs.
	LocalAddrs func() ([]netip.Addr, error)
	// NodePortsOnly serves NodePorts only (on the local addresses inside
	// NodePortAddresses, loopback included) and no VIP: how the kernel
	// modes serve loopback NodePorts without route_localnet. Addrs and
	// Guard are then unused: nothing is added to the host.
	NodePortsOnly bool
	// Flows, when set, counts the flows the mode takes on (see
	// l4proxy.Proxy.Flows).
	Flows *atomic.Uint64
	// Guard keeps the node's own listeners off owned VIP addresses; nil
	// means the system's (NFTGuard on Linux) when Addrs is nil too, and
	// NoGuard when Addrs is set (tests with fake addresses must not touch
	// the host's netfilter).
	Guard Guard
}

// Proxier is the userspace Dataplane. Create it with New.
type Proxier struct {
	o      Options
	log    *slog.Logger
	addrs  AddrManager
	canAdd error // why addresses cannot be added; nil when they can
	guard  Guard
	// unguarded says why owned VIPs are not guarded; nil when they are.
	unguarded error
	guarded   guardState
	// announced records that the first Sync logged how VIPs are bound.
	announced bool
	socks     *l4proxy.Limiter
	// listenFn and bindableFn are p.listen and bindable; tests replace
	// them to run without binding.
	listenFn   func(ctx context.Context, k listenKey, g *group) (io.Closer, error)
	bindableFn func(netip.Addr) bool

	mu        sync.Mutex
	groups    map[groupKey]*group
	listeners map[listenKey]*listener
	owned     map[netip.Addr]bool // VIPs we added
	vips      map[netip.Addr]vipState
	reported  map[netip.Addr]bool // unservable VIPs already logged
	warned    map[model.ServicePortName]bool
	denied    map[listenKey]bool // listeners refused for want of privilege, logged
	synced    bool
	clients   atomic.Pointer[clients]
}

type vipState int

const (
	vipLocal      vipState = iota + 1 // already local, not ours
	vipOwned                          // added by us
	vipUnservable                     // neither
)

// groupKey identifies the listeners that share one l4proxy.Proxy: one
// ServicePort, internal or external traffic, one family; load-balancer IPs
// with source ranges get their own group, filtered by those ranges. The
// affinity timeout and ranges are part of the key because a Proxy's options
// are fixed.
type groupKey struct {
	name     model.ServicePortName
	external bool
	v6       bool
	affinity int
	ranges   string // loadBalancerSourceRanges, for LB IP listeners only
	// alt: flows from in-cluster clients (pods in ClusterCIDRs, the node
	// itself) go to altKey()'s group: externalTrafficPolicy Local's
	// short-circuit to the cluster endpoints.
	alt bool
}

// altKey is the group in-cluster clients of an alt group are diverted to.
func (k groupKey) altKey() groupKey {
	return groupKey{name: k.name, v6: k.v6, affinity: k.affinity}
}

type group struct {
	key   groupKey
	proxy *l4proxy.Proxy
	eps   []l4proxy.Endpoint
}

type listenKey struct {
	proto model.Protocol
	addr  netip.AddrPort
}

type listener struct {
	group *group
	c     io.Closer
}

// New returns a userspace Proxier. It fails when the scheduler is unknown.
// It logs whether VIP addresses can be added and, if not, why.
func New(o Options) (*Proxier, error) {
	if _, err := l4proxy.NewScheduler(o.Scheduler); err != nil {
		return nil, fmt.Errorf("userspace: scheduler: %w", err)
	}
	p := &Proxier{
		o:         o,
		log:       o.Log().With("mode", Mode),
		addrs:     o.Addrs,
		socks:     &l4proxy.Limiter{Max: o.MaxSockets},
		groups:    map[groupKey]*group{},
		listeners: map[listenKey]*listener{},
		owned:     map[netip.Addr]bool{},
		vips:      map[netip.Addr]vipState{},
		reported:  map[netip.Addr]bool{},
		warned:    map[model.ServicePortName]bool{},
		denied:    map[listenKey]bool{},
	}
	if o.NodePortsOnly {
		p.addrs = NoAddrs{Reason: "NodePorts only"}
		o.Guard = NoGuard{Reason: "NodePorts only"}
	}
	p.guard = o.Guard
	if p.guard == nil {
		p.guard = NoGuard{Reason: "no guard for custom address managers"}
		if p.addrs == nil {
			p.guard = osGuard()
		}
	}
	if p.addrs == nil {
		p.addrs = osAddrs()
	}
	p.listenFn, p.bindableFn = p.listen, bindable
	if p.o.LocalAddrs == nil {
		p.o.LocalAddrs = netinfo.LocalAddrs
	}
	p.canAdd = p.addrs.CanAdd()
	p.unguarded = p.canAdd
	if p.unguarded == nil {
		p.unguarded = p.guard.Check()
	}
	return p, nil
}

// Mode implements dataplane.Dataplane.
func (p *Proxier) Mode() string { return Mode }

// Sockets returns the proxied sockets open now.
func (p *Proxier) Sockets() int { return p.socks.InUse() }

// desired is what one State asks for.
type desired struct {
	groups    map[groupKey][]l4proxy.Endpoint
	listeners map[listenKey]groupKey
	vips      map[netip.Addr]bool
}

// Sync implements dataplane.Dataplane. It opens listeners that are new,
// closes listeners that are gone (their connections drain), updates the
// endpoints of the others in place, and adds or removes VIP addresses.
// Listeners that cannot be opened (a port already taken, say) are skipped,
// logged and reported in the returned error; everything else is applied.
// Every sync re-reads the owned addresses from the kernel (one address
// dump), so an address removed behind vipproxy's back is added again by
// the next, even partial, sync; a full sync also re-checks which VIPs are
// local.
func (p *Proxier) Sync(ctx context.Context, st *model.State, full bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.announced {
		// Said at the first Sync, not in New: New also runs for Cleanup.
		p.announced = true
		if p.o.NodePortsOnly {
			p.log.Info("userspace: serving NodePorts on loopback addresses (no route_localnet)", "nodePortAddresses", p.o.NodePortAddresses)
		} else if p.canAdd != nil {
			p.log.Warn("userspace: cannot add VIP addresses; serving only VIPs that are already local", "reason", p.canAdd.Error())
		} else {
			p.log.Info("userspace: VIPs that are not local will be added to the loopback interface")
		}
		if p.o.NodePortsOnly {
			// No VIPs, nothing to guard.
		} else if p.unguarded != nil {
			p.log.Warn("userspace: VIP addresses are not guarded: the node's own listeners on wildcard addresses (sshd, the kubelet, …) also answer on VIP:port",
				"reason", p.unguarded.Error())
		} else {
			p.log.Info("userspace: VIP addresses are guarded: ports no Service serves are refused", "table", "inet "+guardTableName)
		}
	}
	full = full || !p.synced
	var errs []error

	if err := p.refreshOwned(); err != nil {
		errs = append(errs, err)
	}
	local, err := p.o.LocalAddrs()
	if err != nil {
		errs = append(errs, fmt.Errorf("userspace: %w", err))
	}
	d := p.desired(st, p.nodePortAddrs(local))

	if full {
		for ip, s := range p.vips {
			if s != vipOwned {
				delete(p.vips, ip)
			}
		}
	}
	// Make every wanted VIP local where possible. VIPs that are local
	// already and not ours are node addresses: served, never guarded.
	var unservable []string
	for ip := range d.vips {
		if p.vips[ip] != vipOwned && p.vips[ip] != vipLocal && p.bindableFn(ip) {
			p.vips[ip] = vipLocal
		}
	}
	// The guard first covers every VIP that will be ours, so that no host
	// listener answers on a VIP between its address and its guard.
	if err := p.syncGuard(ctx, d, full); err != nil {
		errs = append(errs, err)
	}
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

	p.updateClients(local)

	// Groups: update endpoints in place, create new ones; groups that
	// divert to another come second, and are replaced when the group they
	// divert to was.
	for _, alts := range []bool{false, true} {
		for k, eps := range d.groups {
			if k.alt != alts {
				continue
			}
			var alt *l4proxy.Proxy
			if k.alt {
				alt = p.groups[k.altKey()].proxy
			}
			g := p.groups[k]
			if g == nil || g.proxy.Alt != alt {
				g = &group{key: k, proxy: p.newProxy(k, alt)}
				p.groups[k] = g
			}
			if !slices.Equal(g.eps, eps) {
				g.eps = eps
				g.proxy.SetEndpoints(eps)
			}
		}
	}

	// Close listeners that are gone or moved to another group first, so
	// that their ports are free for the ones opened next.
	for k, l := range p.listeners {
		if gk, ok := d.listeners[k]; ok && p.vipServable(k.addr.Addr(), d) && l.group == p.groups[gk] {
			continue
		}
		l.c.Close()
		delete(p.listeners, k)
	}
	keys := make([]listenKey, 0, len(d.listeners))
	for k := range d.listeners {
		if _, ok := p.listeners[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b listenKey) int {
		if c := strings.Compare(string(a.proto), string(b.proto)); c != 0 {
			return c
		}
		return a.addr.Compare(b.addr)
	})
	for _, k := range keys {
		gk := d.listeners[k]
		if !p.vipServable(k.addr.Addr(), d) {
			continue
		}
		g := p.groups[gk]
		c, err := p.listenFn(ctx, k, g)
		if err != nil && errors.Is(err, os.ErrPermission) {
			// A privileged port without CAP_NET_BIND_SERVICE: retrying
			// soon will not help, so say it once and do not fail the sync;
			// every later Sync tries again quietly.
			if !p.denied[k] {
				p.denied[k] = true
				p.log.Warn("userspace: cannot listen: ports below net.ipv4.ip_unprivileged_port_start need CAP_NET_BIND_SERVICE; not served",
					"service", gk.name.String(), "proto", k.proto, "addr", k.addr.String(), "err", err)
			}
			continue
		}
		delete(p.denied, k)
		if err != nil {
			p.log.Error("userspace: cannot listen", "service", gk.name.String(), "proto", k.proto, "addr", k.addr.String(), "err", err)
			errs = append(errs, fmt.Errorf("userspace: service %s: listen %s %s: %w", gk.name, k.proto, k.addr, err))
			continue
		}
		p.listeners[k] = &listener{group: g, c: c}
	}

	// Drop groups without listeners; their connections drain.
	used := map[*group]bool{}
	for _, l := range p.listeners {
		used[l.group] = true
		if l.group.key.alt {
			used[p.groups[l.group.key.altKey()]] = true
		}
	}
	for k, g := range p.groups {
		if _, ok := d.groups[k]; !ok || !used[g] {
			delete(p.groups, k)
		}
	}

	// Remove owned VIPs nobody wants any more (their listeners are closed).
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
	// Narrow the guard to what remains (it is a superset until here).
	if err := p.syncGuard(ctx, d, false); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		p.synced = true
	}
	return errors.Join(errs...)
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

// Verify implements dataplane.Verifier: the guard must still be whole
// (someone may flush or delete its table). VIP addresses are re-read on
// every Sync already.
func (p *Proxier) Verify(ctx context.Context) error {
	p.mu.Lock()
	g, unguarded := p.guarded, p.unguarded
	p.mu.Unlock()
	if unguarded != nil || !g.set {
		return nil
	}
	return p.guard.Verify(ctx, g.vips, g.served)
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

func (p *Proxier) nodePortAddrs(local []netip.Addr) []netip.Addr {
	if len(p.o.NodePortAddresses) == 0 {
		return slices.Clone(p.o.NodeIPs)
	}
	// Unlike the kernel modes, loopback NodePort addresses work here: a
	// socket needs no route_localnet. vipproxy's own VIP addresses (found
	// by refreshOwned, also those left by an earlier run) are never node
	// addresses, even inside a nodePortAddresses prefix.
	var out []netip.Addr
	for _, a := range local {
		if p.vips[a] == vipOwned {
			continue
		}
		for _, pf := range p.o.NodePortAddresses {
			if pf.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

func (p *Proxier) desired(st *model.State, nodeAddrs []netip.Addr) *desired {
	d := &desired{
		groups:    map[groupKey][]l4proxy.Endpoint{},
		listeners: map[listenKey]groupKey{},
		vips:      map[netip.Addr]bool{},
	}
	if st == nil {
		return d
	}
	for _, sp := range st.Ports {
		if sp.Protocol != model.TCP && sp.Protocol != model.UDP {
			if !p.warned[sp.Name] {
				p.warned[sp.Name] = true
				p.log.Warn("userspace: protocol not proxied (Go has no portable SCTP sockets)", "service", sp.Name.String())
			}
			continue
		}
		endpoints := func(gk groupKey) []l4proxy.Endpoint {
			eps, ok := d.groups[gk]
			if !ok {
				src := sp.InternalEndpoints()
				if gk.external {
					src = sp.ExternalEndpoints()
				}
				for _, e := range src {
					if e.IP.Unmap().Is6() == gk.v6 {
						eps = append(eps, l4proxy.Endpoint{Addr: netip.AddrPortFrom(e.IP.Unmap(), e.Port)})
					}
				}
				d.groups[gk] = eps
			}
			return eps
		}
		add := func(ip netip.Addr, port uint16, external bool, ranges string) {
			ip = ip.Unmap()
			if !ip.IsValid() || port == 0 {
				return
			}
			gk := groupKey{name: sp.Name, external: external, v6: ip.Is6(), affinity: sp.AffinityTimeoutSeconds, ranges: ranges}
			// externalTrafficPolicy Local: in-cluster clients still reach
			// every (Cluster) endpoint, as kube-proxy short-circuits them.
			// With internalTrafficPolicy Local too there are no Cluster
			// endpoints, and no short-circuit.
			if external && sp.ExternalPolicyLocal() && !sp.InternalPolicyLocal() && len(endpoints(gk.altKey())) > 0 {
				gk.alt = true
			}
			if len(endpoints(gk)) == 0 && !gk.alt {
				return // no listener: the kernel refuses
			}
			lk := listenKey{proto: sp.Protocol, addr: netip.AddrPortFrom(ip, port)}
			if other, taken := d.listeners[lk]; taken && other != gk {
				if p.warned[sp.Name] {
					return
				}
				p.warned[sp.Name] = true
				p.log.Warn("userspace: address claimed by two services; keeping the first",
					"proto", sp.Protocol, "addr", lk.addr.String(), "kept", other.name.String(), "skipped", sp.Name.String())
				return
			}
			d.listeners[lk] = gk
		}
		if sp.NodePort != 0 {
			for _, ip := range nodeAddrs {
				add(ip, sp.NodePort, true, "")
			}
		}
		if p.o.NodePortsOnly {
			continue
		}
		for _, ip := range sp.ClusterIPs {
			d.vips[ip.Unmap()] = true
			add(ip, sp.Port, false, "")
		}
		for _, ip := range sp.ExternalIPs {
			d.vips[ip.Unmap()] = true
			add(ip, sp.Port, true, "")
		}
		var ranges []string
		for _, r := range sp.LoadBalancerSourceRanges {
			ranges = append(ranges, r.Masked().String())
		}
		for _, ip := range sp.LoadBalancerIPs {
			d.vips[ip.Unmap()] = true
			add(ip, sp.Port, true, strings.Join(ranges, ","))
		}
	}
	// Groups without endpoints are not needed, unless a listener serves
	// them (an alt group refuses outside clients itself).
	served := map[groupKey]bool{}
	for _, gk := range d.listeners {
		served[gk] = true
	}
	for k, eps := range d.groups {
		if len(eps) == 0 && !served[k] {
			delete(d.groups, k)
		}
	}
	return d
}

func (p *Proxier) newProxy(k groupKey, alt *l4proxy.Proxy) *l4proxy.Proxy {
	s, _ := l4proxy.NewScheduler(p.o.Scheduler) // validated in New
	var allow func(netip.Addr) bool
	if k.ranges != "" {
		allow = p.sourceFilter(k.ranges)
	}
	var useAlt func(netip.Addr) bool
	if alt != nil {
		useAlt = p.inCluster
	}
	return &l4proxy.Proxy{
		Allow:           allow,
		Alt:             alt,
		UseAlt:          useAlt,
		Scheduler:       s,
		DialTimeout:     p.o.DialTimeout,
		MaxTries:        p.o.MaxTries,
		AffinityTimeout: time.Duration(k.affinity) * time.Second,
		UDPIdleTimeout:  p.o.UDPIdleTimeout,
		MaxUDPSessions:  p.o.MaxUDPSessions,
		Sockets:         p.socks,
		Flows:           p.o.Flows,
		Logger:          p.log.With("service", k.name.String()),
	}
}

// sourceFilter admits clients inside ranges (loadBalancerSourceRanges,
// comma-separated, already validated). When a range contains one of the
// node's IPs, connections from the node itself are admitted too: they come
// from a local address (often the load-balancer IP itself), as kube-proxy
// allows hairpin traffic from the node in that case.
func (p *Proxier) sourceFilter(ranges string) func(netip.Addr) bool {
	var pfx []netip.Prefix
	for _, r := range strings.Split(ranges, ",") {
		if pf, err := netip.ParsePrefix(r); err == nil {
			pfx = append(pfx, pf)
		}
	}
	fromNode := false
	for _, pf := range pfx {
		for _, ip := range p.o.NodeIPs {
			fromNode = fromNode || pf.Contains(ip)
		}
	}
	return func(src netip.Addr) bool {
		for _, pf := range pfx {
			if pf.Contains(src) {
				return true
			}
		}
		return fromNode && (src.IsLoopback() || p.isLocal(src))
	}
}

// clients is what inCluster and the source filters know of addresses;
// Sync replaces it, connections read it without locking.
type clients struct {
	cluster []netip.Prefix
	local   map[netip.Addr]bool // this host's addresses and served VIPs
}

// updateClients records the host's addresses and VIPs for inCluster.
func (p *Proxier) updateClients(local []netip.Addr) {
	c := &clients{cluster: p.o.ClusterCIDRs, local: map[netip.Addr]bool{}}
	for _, ip := range slices.Concat(local, p.o.NodeIPs) {
		c.local[ip.Unmap()] = true
	}
	for ip, s := range p.vips {
		if s == vipLocal || s == vipOwned {
			c.local[ip] = true
		}
	}
	p.clients.Store(c)
}

// isLocal reports whether ip is one of this host's addresses or a VIP.
func (p *Proxier) isLocal(ip netip.Addr) bool {
	c := p.clients.Load()
	return ip.IsLoopback() || (c != nil && c.local[ip])
}

// inCluster reports whether a client is inside the cluster for
// externalTrafficPolicy Local's short-circuit: a pod (in ClusterCIDRs,
// when local detection is on) or the node itself.
func (p *Proxier) inCluster(ip netip.Addr) bool {
	if p.isLocal(ip) {
		return true
	}
	if c := p.clients.Load(); c != nil {
		for _, pf := range c.cluster {
			if pf.Contains(ip) {
				return true
			}
		}
	}
	return false
}

func (p *Proxier) listen(ctx context.Context, k listenKey, g *group) (io.Closer, error) {
	var lc net.ListenConfig
	addr := k.addr.String()
	if k.proto == model.UDP {
		pc, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return nil, err
		}
		go g.proxy.ServeUDP(pc)
		return pc, nil
	}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	go g.proxy.ServeTCP(ln)
	return ln, nil
}

// Cleanup implements dataplane.Dataplane: it closes every listener and
// proxied connection of this Proxier and removes every VIP address
// vipproxy owns, including ones an earlier process left, and the guard. It succeeds when
// there is nothing to remove.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, l := range p.listeners {
		l.c.Close()
		delete(p.listeners, k)
	}
	for k, g := range p.groups {
		g.proxy.Close()
		delete(p.groups, k)
	}
	var errs []error
	list, err := p.addrs.List()
	if err != nil {
		errs = append(errs, fmt.Errorf("userspace: cleanup: %w", err))
	}
	for ip := range p.owned {
		if !slices.Contains(list, ip) {
			list = append(list, ip)
		}
	}
	for _, ip := range list {
		if err := p.addrs.Del(ip); err != nil {
			errs = append(errs, fmt.Errorf("userspace: cleanup: %w", err))
			continue
		}
		delete(p.owned, ip)
	}
	if p.canAdd == nil {
		// Only a privileged run can have installed (or remove) a guard.
		if err := p.guard.Cleanup(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.guarded = guardState{ever: p.guarded.ever}
	clear(p.vips)
	clear(p.reported)
	p.synced = false
	return errors.Join(errs...)
}

var _ dataplane.Dataplane = (*Proxier)(nil)
