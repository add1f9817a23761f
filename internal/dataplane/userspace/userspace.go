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
	"net/netip"
	"slices"
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
		p.announce()
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
	errs = append(errs, p.addVIPs(d)...)
	p.updateClients(local)
	p.syncGroups(d)
	errs = append(errs, p.syncListeners(ctx, d)...)
	p.dropUnusedGroups(d)
	errs = append(errs, p.removeVIPs(d)...)
	// Narrow the guard to what remains (it is a superset until here).
	if err := p.syncGuard(ctx, d, false); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		p.synced = true
	}
	return errors.Join(errs...)
}

// announce logs, once, how the mode serves VIPs and whether they are
// guarded.
func (p *Proxier) announce() {
	switch {
	case p.o.NodePortsOnly:
		p.log.Info("userspace: serving NodePorts on loopback addresses (no route_localnet)", "nodePortAddresses", p.o.NodePortAddresses)
		return // no VIPs, nothing to guard
	case p.canAdd != nil:
		p.log.Warn("userspace: cannot add VIP addresses; serving only VIPs that are already local", "reason", p.canAdd.Error())
	default:
		p.log.Info("userspace: VIPs that are not local will be added to the loopback interface")
	}
	if p.unguarded != nil {
		p.log.Warn("userspace: VIP addresses are not guarded: the node's own listeners on wildcard addresses (sshd, the kubelet, …) also answer on VIP:port",
			"reason", p.unguarded.Error())
	} else {
		p.log.Info("userspace: VIP addresses are guarded: ports no Service serves are refused", "table", "inet "+guardTableName)
	}
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

var (
	_ dataplane.Dataplane      = (*Proxier)(nil)
	_ dataplane.AffinityReader = (*Proxier)(nil)
)
