package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipvs"
	"github.com/vipproxy/vipproxy/internal/dataplane/modes"
	"github.com/vipproxy/vipproxy/internal/dataplane/nftables"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

// newDataplane builds the dataplane of mode. ipvs probes the kernel and
// falls back to iptables, with one warning and a metric, when IPVS or
// ipset is unusable; Mode() of the result says what runs.
func newDataplane(cfg *config.Config, mode string, opts dataplane.Options) (dataplane.Dataplane, error) {
	switch mode {
	case config.ModeNFTables, "":
		return nftables.New(opts, &nftables.NFT{})
	case config.ModeIPTables:
		registerCTInvalid()
		return iptables.New(iptables.Options{Options: opts, Runner: &iptables.Exec{Variant: iptablesBackend()}})
	case config.ModeIPVS:
		registerCTInvalid()
		o := ipvsOptions(cfg, opts)
		o.IPTables.Runner = &iptables.Exec{Variant: iptablesBackend()}
		return ipvs.New(o)
	case config.ModeUserspace:
		return userspace.New(userspace.Options{Options: opts})
	}
	return nil, fmt.Errorf("unknown proxy mode %q", mode)
}

// ipvsOptions adds the ipvs section of the config to opts.
func ipvsOptions(cfg *config.Config, opts dataplane.Options) ipvs.Options {
	o := ipvs.Options{Options: opts, IPTables: iptables.Options{Options: opts}}
	if cfg == nil {
		return o
	}
	// The IPVS sysctls go through the same journal as the conntrack
	// settings, so that --cleanup (another process, maybe after a crash)
	// puts back what ipvs mode changed.
	o.Sysctl = sysctl.Journaled{Setter: &sysctl.Setter{FS: sysctl.OSFS{}, Journal: sysctlJournal(cfg)}}
	c := cfg.KubeProxy.IPVS
	o.Timeouts = ipvs.Timeouts{TCP: c.TCPTimeout.Duration, TCPFin: c.TCPFinTimeout.Duration, UDP: c.UDPTimeout.Duration}
	o.StrictARP = c.StrictARP
	for _, s := range c.ExcludeCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			o.ExcludeCIDRs = append(o.ExcludeCIDRs, p)
		}
	}
	return o
}

// afterSyncHooks returns what runs after every successful sync: removal
// of other modes' leftovers (once) and stale conntrack cleanup for the NAT
// modes.
func afterSyncHooks(cfg *config.Config, mode string, nodeIPs []netip.Addr, log *slog.Logger) []func(context.Context, *model.State) {
	hooks := []func(context.Context, *model.State){leftoversHook(leftoversEnv(cfg, nodeIPs, log), mode)}
	if mode == config.ModeUserspace {
		return hooks
	}
	table, err := conntrack.NewNetlinkTable()
	if err != nil {
		log.Warn("stale conntrack cleanup disabled", "err", err)
		return hooks
	}
	r := &conntrack.Reconciler{Table: table, Logger: log.With("component", "conntrack")}
	return append(hooks, func(ctx context.Context, st *model.State) {
		if err := r.Reconcile(ctx, st); err != nil {
			log.Warn("stale conntrack cleanup failed; retried after the next sync", "err", err)
		}
	})
}

// leftoversEnv is how package modes reaches this node's state: the ipvs
// mode's cleanup gets the sysctl journal and excludeCIDRs of cfg.
func leftoversEnv(cfg *config.Config, nodeIPs []netip.Addr, log *slog.Logger) modes.Env {
	return modes.Env{Log: log, NodeIPs: nodeIPs, IPVS: ipvsOptions(cfg, dataplane.Options{})}
}

// leftoversHook returns an AfterSync hook that, once, after the running
// mode's first successful sync, removes what other vipproxy modes and
// kube-proxy left behind (modes.RemoveOthers). Running after the sync
// means the new rules are in place before the old ones go, so no VIP is
// unserved and no packet is DNATed twice for long. The removal runs on its
// own goroutine: it execs iptables-save and nft for every backend and mode
// (seconds on a loaded or emulated node), and the loop must not stop
// programming changes meanwhile; what it removes is never the running
// mode's.
func leftoversHook(env modes.Env, running string) func(context.Context, *model.State) {
	var once sync.Once
	return func(ctx context.Context, _ *model.State) {
		once.Do(func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
				defer cancel()
				if err := modes.RemoveOthers(ctx, env, running); err != nil {
					env.Log.Warn("could not remove all leftovers of other modes and kube-proxy", "err", err)
				}
			}()
		})
	}
}

// registerCTInvalid adds, once per process and only once an iptables-based
// mode runs (as kube-proxy registers it in iptables mode), the collector of
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total.
var registerCTInvalid = sync.OnceFunc(func() {
	metrics.Registry.MustRegister(&iptables.CTInvalidCollector{Exec: &iptables.Exec{Variant: iptablesBackend()}})
})

// iptablesBackend chooses, once per process, the iptables backend the
// iptables and ipvs modes program (see iptables.DetectVariant) and logs
// the choice.
var iptablesBackend = sync.OnceValue(func() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v, why := iptables.DetectVariant(ctx, &iptables.Exec{})
	name := "iptables-" + v
	if v == "" {
		name = "the system's iptables"
	}
	slog.Info("iptables backend: "+name, "reason", why)
	return v
})

// cleanupAll removes what every mode ever installed, in both families
// (and kube-proxy's leftovers with --cleanup-kube-proxy), puts back the
// kernel parameters vipproxy changed, and succeeds when there is nothing
// to remove.
func cleanupAll(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	err := modes.RemoveAll(ctx, leftoversEnv(cfg, nil, log), cfg.CleanupKubeProxy)
	return errors.Join(err, restoreHostSettings(cfg, log))
}

// sysctlJournal is where the originals of changed kernel parameters are
// recorded, so --cleanup can restore them.
func sysctlJournal(cfg *config.Config) string {
	return filepath.Join(cfg.StateDir, "sysctl-originals.json")
}

// applyHostSettings applies the conntrack settings as kube-proxy does.
// Missing or read-only parameters are warnings, never fatal.
func applyHostSettings(cfg *config.Config, log *slog.Logger) {
	ct := cfg.KubeProxy.Conntrack
	s := conntrack.Settings{TCPBeLiberal: ct.TCPBeLiberal, UDPTimeout: ct.UDPTimeout.Duration, UDPStreamTimeout: ct.UDPStreamTimeout.Duration}
	if ct.MaxPerCore != nil && ct.Min != nil {
		s.Max = conntrack.MaxFor(int(*ct.MaxPerCore), int(*ct.Min), runtime.NumCPU())
	}
	if ct.TCPEstablishedTimeout != nil {
		s.TCPEstablishedTimeout = ct.TCPEstablishedTimeout.Duration
	}
	if ct.TCPCloseWaitTimeout != nil {
		s.TCPCloseWaitTimeout = ct.TCPCloseWaitTimeout.Duration
	}
	err := conntrack.Apply(&sysctl.Setter{FS: sysctl.OSFS{}, Journal: sysctlJournal(cfg)}, s)
	switch {
	case err == nil:
	case conntrack.IsWarning(err):
		log.Warn("some conntrack settings could not be applied (missing or read-only here)", "err", err)
	default:
		log.Error("conntrack settings failed", "err", err)
	}
}

// restoreHostSettings puts back the kernel parameters vipproxy changed.
func restoreHostSettings(cfg *config.Config, log *slog.Logger) error {
	restored, err := sysctl.Restore(sysctl.OSFS{}, sysctlJournal(cfg))
	if len(restored) > 0 {
		log.Info("restored kernel parameters", "sysctls", restored)
	}
	return err
}

// ownAddrs returns the VIP addresses vipproxy's userspace and IPVS modes
// (and kube-proxy's IPVS mode, on kube-ipvs0) bound on this node. They are
// never node IPs: after a restart a leftover VIP must not become the
// primary IP or a NodePort address. Listing errors leave an address out.
func ownAddrs() []netip.Addr {
	var out []netip.Addr
	if l, err := (userspace.LoAddrs{}).List(); err == nil {
		out = append(out, l...)
	}
	if l, err := (&ipvs.LinkAddrs{NoDummy: true}).List(); err == nil {
		out = append(out, l...)
	}
	if ifi, err := net.InterfaceByName("kube-ipvs0"); err == nil {
		if as, err := ifi.Addrs(); err == nil {
			for _, a := range as {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					out = append(out, p.Addr().Unmap())
				}
			}
		}
	}
	return out
}
