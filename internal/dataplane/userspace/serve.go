package userspace

// Serving a group: its l4proxy.Proxy (affinity, source ranges, the
// Local-policy short circuit for in-cluster clients) and its listeners.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/l4proxy"
	"github.com/vipproxy/vipproxy/internal/model"
)

type group struct {
	key   groupKey
	proxy *l4proxy.Proxy
	eps   []l4proxy.Endpoint
}

type listener struct {
	group *group
	c     io.Closer
}

func (p *Proxier) newProxy(k groupKey, alt *l4proxy.Proxy) *l4proxy.Proxy {
	var s l4proxy.Scheduler
	switch k.balance {
	case model.BalanceRandom:
		s = &l4proxy.Random{}
	case model.BalanceRoundRobin:
		s = &l4proxy.WeightedRoundRobin{}
	case model.BalanceConsistentHash:
		s = &l4proxy.ConsistentHash{}
	default:
		s, _ = l4proxy.NewScheduler(p.o.Scheduler) // validated in New
	}
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

// syncGroups updates the endpoints of the groups in place and creates
// new ones; groups that divert to another come second, and are replaced
// when the group they divert to was.
func (p *Proxier) syncGroups(d *desired) {
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
}

// syncListeners closes the listeners that are gone or moved to another
// group first, so that their ports are free for the ones opened next, then
// opens the new ones.
func (p *Proxier) syncListeners(ctx context.Context, d *desired) []error {
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
		return cmp.Or(strings.Compare(string(a.proto), string(b.proto)), a.addr.Compare(b.addr))
	})
	var errs []error
	for _, k := range keys {
		if !p.vipServable(k.addr.Addr(), d) {
			continue
		}
		if err := p.open(ctx, k, d.listeners[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// open opens the listener k of group gk. A privileged port without
// CAP_NET_BIND_SERVICE is said once and is no error (retrying soon will
// not help; every later Sync tries again quietly).
func (p *Proxier) open(ctx context.Context, k listenKey, gk groupKey) error {
	g := p.groups[gk]
	c, err := p.listenFn(ctx, k, g)
	if err != nil && errors.Is(err, os.ErrPermission) {
		if !p.denied[k] {
			p.denied[k] = true
			p.log.Warn("userspace: cannot listen: ports below net.ipv4.ip_unprivileged_port_start need CAP_NET_BIND_SERVICE; not served",
				"service", gk.name.String(), "proto", k.proto, "addr", k.addr.String(), "err", err)
		}
		return nil
	}
	delete(p.denied, k)
	if err != nil {
		p.log.Error("userspace: cannot listen", "service", gk.name.String(), "proto", k.proto, "addr", k.addr.String(), "err", err)
		return fmt.Errorf("userspace: service %s: listen %s %s: %w", gk.name, k.proto, k.addr, err)
	}
	p.listeners[k] = &listener{group: g, c: c}
	return nil
}

// dropUnusedGroups drops the groups without listeners (nor a listener
// of a group diverting to them); their connections drain.
func (p *Proxier) dropUnusedGroups(d *desired) {
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
}

// Affinity implements dataplane.AffinityReader from the proxies' own
// affinity tables: of sp's groups in client's family (cluster, external,
// diverted), the entry with the most time left.
func (p *Proxier) Affinity(_ context.Context, sp *model.ServicePort, client netip.Addr) (dataplane.AffinityEntry, bool, error) {
	client = client.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	var best dataplane.AffinityEntry
	found := false
	for k, g := range p.groups {
		if k.name != sp.Name || k.v6 != client.Is6() {
			continue
		}
		if ep, left, ok := g.proxy.Affinity(client); ok && (!found || left > best.Expires) {
			best, found = dataplane.AffinityEntry{Endpoint: ep, Expires: left}, true
		}
	}
	return best, found, nil
}
