package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/conntrack"
	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipvs"
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
	o.Sysctl = journaledSysctl{&sysctl.Setter{FS: sysctl.OSFS{}, Journal: sysctlJournal(cfg)}}
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

// journaledSysctl is an ipvs.Sysctl (names relative to /proc/sys) that
// records the original of every value it changes in a sysctl journal.
type journaledSysctl struct{ s *sysctl.Setter }

func (j journaledSysctl) Read(name string) (string, error) { return j.s.FS.Read("/proc/sys/" + name) }

func (j journaledSysctl) Write(name, value string) error {
	_, err := j.s.Set("/proc/sys/"+name, value)
	return err
}

// cleanupMode removes what one mode installed (iptables: in every
// installed backend). ipvs is cleaned without its
// availability probe (and so without a fallback warning); flushLocal makes
// it also delete IPVS virtual servers on every local address, as
// kube-proxy's --cleanup does.
func cleanupMode(ctx context.Context, cfg *config.Config, mode string, opts dataplane.Options, flushLocal bool) error {
	if mode == config.ModeIPTables {
		// Every installed backend: an earlier run may have used the other.
		var errs []error
		ran := false
		for _, v := range iptables.Variants {
			if _, err := exec.LookPath("iptables-" + v + "-save"); err != nil {
				continue
			}
			ran = true
			p, err := iptables.New(iptables.Options{Options: opts, Runner: &iptables.Exec{Variant: v}})
			if err == nil {
				err = p.Cleanup(ctx)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("iptables-%s: %w", v, err))
			}
		}
		if ran {
			return errors.Join(errs...)
		}
	}
	if mode == config.ModeIPVS {
		o := ipvsOptions(cfg, opts)
		o.FlushLocal = flushLocal
		return ipvs.Cleanup(ctx, o)
	}
	dp, err := newDataplane(cfg, mode, opts)
	if err != nil {
		return err
	}
	return dp.Cleanup(ctx)
}

// afterSyncHooks returns what runs after every successful sync: removal
// of other modes' leftovers (once) and stale conntrack cleanup for the NAT
// modes.
func afterSyncHooks(cfg *config.Config, mode string, log *slog.Logger) []func(context.Context, *model.State) {
	hooks := []func(context.Context, *model.State){leftoversHook(cfg, mode, log)}
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

// vipproxyModes are the modes whose state cleanupAll and leftoversHook
// remove.
var vipproxyModes = []string{config.ModeNFTables, config.ModeIPTables, config.ModeIPVS, config.ModeUserspace}

// leftoversHook returns an AfterSync hook that, once, after the running
// mode's first successful sync, removes what other vipproxy modes left
// behind (an earlier run in another mode, a crash during a mode change).
// Running after the sync means the new rules are in place before the old
// ones go, so no VIP is unserved and no packet is DNATed twice for long.
func leftoversHook(cfg *config.Config, running string, log *slog.Logger) func(context.Context, *model.State) {
	var once sync.Once
	return func(ctx context.Context, _ *model.State) {
		once.Do(func() { go removeLeftovers(context.WithoutCancel(ctx), cfg, running, log) })
	}
}

// removeLeftovers is leftoversHook's work. It runs on its own goroutine:
// it execs iptables-save and nft for every backend and mode (seconds on a
// loaded or emulated node), and the loop must not stop programming changes
// meanwhile; the rules it removes are never the running mode's.
func removeLeftovers(ctx context.Context, cfg *config.Config, running string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, mode := range vipproxyModes {
		if mode == running {
			continue
		}
		if err := cleanupMode(ctx, cfg, mode, dataplane.Options{Logger: log.With("leftovers", mode)}, false); err != nil {
			log.Warn("could not remove another mode's leftovers", "mode", mode, "err", err)
		}
	}
	// The iptables mode removes kube-proxy's chains itself in its
	// own backend; the other backend, and the other modes, here:
	// kube-proxy's DNAT rules would keep catching Service traffic
	// after a migration.
	skip := ""
	if running == config.ModeIPTables {
		skip = iptablesBackend()
		if skip == "" {
			skip = "system"
		}
	}
	if err := removeKubeProxyIPTables(ctx, log, skip); err != nil {
		log.Warn("could not remove kube-proxy's iptables leftovers", "err", err)
	}
	// kube-proxy's IPVS mode: after its chains (rules keep sets alive).
	removeKubeProxyIPVS(ctx, log, running == config.ModeIPVS)
	// The nftables mode removes kube-proxy's tables in its first
	// sync; the others do it here.
	if running != config.ModeNFTables {
		if err := removeKubeProxyNFTables(ctx, log); err != nil {
			log.Warn("could not remove kube-proxy's nftables tables", "err", err)
		}
	}
}

// removeKubeProxyIPVS removes what kube-proxy's IPVS mode left (its
// kube-ipvs0 interface and VIPs, the virtual servers on them unless
// vipproxy's ipvs mode has adopted them, its KUBE-* ipsets) and logs it.
func removeKubeProxyIPVS(ctx context.Context, log *slog.Logger, keepVirtualServers bool) {
	got, err := ipvs.RemoveKubeProxyLeftovers(ctx, &ipvs.IPSetExec{}, keepVirtualServers)
	if got.Interface || got.VirtualServers > 0 || len(got.IPSets) > 0 {
		log.Info("removed kube-proxy's IPVS leftovers", "interface", ipvs.KubeProxyDummy, "virtualServers", got.VirtualServers, "ipsets", got.IPSets)
	}
	if err != nil {
		log.Warn("could not remove all of kube-proxy's IPVS leftovers", "err", err)
	}
}

// removeKubeProxyIPTables removes kube-proxy's iptables chains in both
// families, in every iptables backend installed (kube-proxy may have run
// on the other one: legacy leftovers on an nft host, say) except skip, the
// one the running iptables mode cleans itself.
func removeKubeProxyIPTables(ctx context.Context, log *slog.Logger, skip string) error {
	var errs []error
	ran := false
	for _, v := range iptables.Variants {
		if v == skip {
			continue
		}
		if _, err := exec.LookPath("iptables-" + v + "-save"); err != nil {
			continue
		}
		ran = true
		p, err := iptables.New(iptables.Options{Options: dataplane.Options{Logger: log}, Runner: &iptables.Exec{Variant: v}})
		if err == nil {
			err = p.RemoveKubeProxyLeftovers(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("iptables-%s: %w", v, err))
		}
	}
	if !ran && skip == "" {
		// Only a plain iptables: the system's backend.
		p, err := iptables.New(iptables.Options{Options: dataplane.Options{Logger: log}})
		if err != nil {
			return err
		}
		return p.RemoveKubeProxyLeftovers(ctx)
	}
	return errors.Join(errs...)
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

// removeKubeProxyNFTables removes kube-proxy's nftables tables in both
// families.
func removeKubeProxyNFTables(ctx context.Context, log *slog.Logger) error {
	p, err := nftables.New(dataplane.Options{Logger: log}, &nftables.NFT{})
	if err != nil {
		return err
	}
	return p.RemoveKubeProxyTables(ctx)
}

// cleanupAll removes what every mode ever installed, in both families,
// and succeeds when there is nothing to remove.
func cleanupAll(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	opts := dataplane.Options{Logger: log}
	var errs []error
	for _, mode := range vipproxyModes {
		if err := cleanupMode(ctx, cfg, mode, opts, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", mode, err))
			continue
		}
		log.Info("cleaned up", "mode", mode)
	}
	if cfg.CleanupKubeProxy {
		if err := removeKubeProxyIPTables(ctx, log, ""); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy iptables leftovers: %w", err))
		} else {
			log.Info("removed kube-proxy's iptables leftovers")
		}
		if err := removeKubeProxyNFTables(ctx, log); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy nftables tables: %w", err))
		}
		removeKubeProxyIPVS(ctx, log, false)
	}
	if err := restoreHostSettings(cfg, log); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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
