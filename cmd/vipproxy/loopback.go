package main

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// loopbackNodePorts serves NodePorts on loopback addresses (127.0.0.1,
// ::1) for the kernel modes, with the userspace proxy in NodePortsOnly
// mode: the kernel modes never DNAT loopback, because that needs
// route_localnet (CVE-2020-8558) and does not exist for IPv6. It runs
// beside the kernel dataplane, synced after each of its successful syncs,
// and adds nothing to the host (no address, no rule).
type loopbackNodePorts struct {
	log *slog.Logger

	mu    sync.Mutex
	addrs []netip.Addr
	opts  dataplane.Options
	px    *userspace.Proxier
	last  *model.State
}

// loopbackFlows counts the flows loopback NodePorts took on, for
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total. kube-proxy
// counts the packets its nat rule accepts, which is the first packet of
// each connection (or UDP flow): the same number.
var loopbackFlows atomic.Uint64

// registerLoopbackMetric registers, once per process, the counter
// kube-proxy exports in iptables mode.
var registerLoopbackMetric = sync.OnceFunc(func() {
	metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "kubeproxy",
		Name:      "iptables_localhost_nodeports_accepted_packets_total",
		Help:      "Number of new connections (and UDP flows) accepted on NodePorts of loopback addresses (served by vipproxy's userspace proxy, without route_localnet).",
	}, func() float64 { return float64(loopbackFlows.Load()) }))
})

// set makes l serve addrs (none: stop) with the kernel dataplane's opts.
// A change replaces the proxy (its listeners close and the new one opens
// them at once from the last State); no change does nothing.
func (l *loopbackNodePorts) set(ctx context.Context, addrs []netip.Addr, opts dataplane.Options) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Equal(addrs, l.addrs) && len(optionChanges(opts, l.opts)) == 0 && (l.px != nil) == (len(addrs) > 0) {
		return
	}
	l.stop(ctx)
	l.addrs, l.opts = addrs, opts
	if len(addrs) == 0 {
		return
	}
	registerLoopbackMetric()
	o := opts
	o.NodePortAddresses = nil
	for _, a := range addrs {
		o.NodePortAddresses = append(o.NodePortAddresses, netip.PrefixFrom(a, a.BitLen()))
	}
	o.Scheduler = "" // the kernel mode's scheduler (IPVS's) need not exist in l4proxy
	o.Logger = l.log
	px, err := userspace.New(userspace.Options{Options: o, NodePortsOnly: true, Flows: &loopbackFlows})
	if err != nil {
		l.log.Error("loopback NodePorts: not served", "err", err)
		return
	}
	l.px = px
	if l.last != nil {
		if err := px.Sync(ctx, l.last, true); err != nil {
			l.log.Warn("loopback NodePorts: sync failed; retried after the next sync", "err", err)
		}
	}
}

// sync is an AfterSync hook: the loopback listeners follow every State
// the kernel dataplane programmed.
func (l *loopbackNodePorts) sync(ctx context.Context, st *model.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = st
	if l.px == nil {
		return
	}
	if err := l.px.Sync(ctx, st, false); err != nil {
		l.log.Warn("loopback NodePorts: sync failed; retried after the next sync", "err", err)
	}
}

// close stops serving (at exit).
func (l *loopbackNodePorts) close(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stop(ctx)
}

func (l *loopbackNodePorts) stop(ctx context.Context) {
	if l.px == nil {
		return
	}
	if err := l.px.Cleanup(ctx); err != nil {
		l.log.Warn("loopback NodePorts: close", "err", err)
	}
	l.px = nil
}
