//go:build linux

package modes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipvs"
	"github.com/vipproxy/vipproxy/internal/dataplane/nftables"
	"github.com/vipproxy/vipproxy/internal/dataplane/userspace"
)

// vipproxy's modes, as the configuration spells them.
const (
	NFTables  = "nftables"
	IPTables  = "iptables"
	IPVS      = "ipvs"
	Userspace = "userspace"
)

// Vipproxy lists vipproxy's modes in the order their leftovers go.
var Vipproxy = []string{NFTables, IPTables, IPVS, Userspace}

// Env is how the package reaches each mode's state. Zero fields mean the
// real thing in the calling thread's network namespace.
type Env struct {
	Log *slog.Logger
	// NodeIPs are the node's primary IPs: IPVS virtual servers on them
	// (NodePorts) are the ipvs mode's.
	NodeIPs []netip.Addr
	// IPVS configures the ipvs mode's cleanup (its sysctl journal,
	// excludeCIDRs, fakes); FlushLocal is set by RemoveAll, and a nil
	// Runner is IPTables("").
	IPVS ipvs.Options
	// Variants lists the installed iptables backends ("nft", "legacy");
	// nil means those whose iptables-<variant>-save is on PATH, and the
	// system's iptables ("") when neither is.
	Variants func() []string
	// IPTables returns the runner of a backend; nil means iptables.Exec.
	IPTables func(variant string) iptables.Runner
	// NFT is the nftables transport; nil means nftables.NFT.
	NFT nftables.Transport
	// Userspace configures the userspace mode's cleanup (fake addresses
	// in tests); its dataplane.Options are replaced.
	Userspace userspace.Options
	// KubeProxyIPVS removes kube-proxy's IPVS leftovers, keeping the
	// virtual servers when asked; nil means ipvs.RemoveKubeProxyLeftovers.
	KubeProxyIPVS func(ctx context.Context, keepVirtualServers bool) (ipvs.KubeProxyLeftovers, error)
}

// RemoveOthers removes what vipproxy's modes other than running and
// kube-proxy left on the node. kube-proxy's iptables tables are read only
// where one of its marker chains exists (reading a table the running mode
// just filled with 10,000s of rules takes iptables-nft seconds); with
// running ipvs, virtual servers vipproxy adopted stay.
func RemoveOthers(ctx context.Context, env Env, running string) error {
	var errs []error
	for _, m := range Vipproxy {
		if m == running {
			continue
		}
		if err := env.removeMode(ctx, m, false); err != nil {
			errs = append(errs, fmt.Errorf("%s mode's leftovers: %w", m, err))
		}
	}
	errs = append(errs, env.removeKubeProxy(ctx, running == IPVS, true)...)
	return errors.Join(errs...)
}

// RemoveAll removes what every vipproxy mode installed (IPVS virtual
// servers on every local address, as kube-proxy's --cleanup flushes IPVS)
// and, with kubeProxy, kube-proxy's leftovers, reading every table. It
// succeeds when there is nothing to remove.
func RemoveAll(ctx context.Context, env Env, kubeProxy bool) error {
	var errs []error
	for _, m := range Vipproxy {
		if err := env.removeMode(ctx, m, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
			continue
		}
		env.log().Info("cleaned up", "mode", m)
	}
	if kubeProxy {
		errs = append(errs, env.removeKubeProxy(ctx, false, false)...)
	}
	return errors.Join(errs...)
}

func (env Env) log() *slog.Logger {
	if env.Log != nil {
		return env.Log
	}
	return slog.Default()
}

func (env Env) variants() []string {
	if env.Variants != nil {
		return env.Variants()
	}
	var out []string
	for _, v := range iptables.Variants {
		if _, err := exec.LookPath("iptables-" + v + "-save"); err == nil {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return []string{""}
	}
	return out
}

func (env Env) runner(variant string) iptables.Runner {
	if env.IPTables != nil {
		return env.IPTables(variant)
	}
	return &iptables.Exec{Variant: variant}
}

func (env Env) nft() nftables.Transport {
	if env.NFT != nil {
		return env.NFT
	}
	return &nftables.NFT{}
}

// iptables returns the iptables-mode proxier of a backend, for its
// removal methods.
func (env Env) iptables(variant string, log *slog.Logger) (*iptables.Proxier, error) {
	return iptables.New(iptables.Options{Options: dataplane.Options{Logger: log}, Runner: env.runner(variant)})
}

// removeMode removes what mode installed (iptables: in every backend).
func (env Env) removeMode(ctx context.Context, mode string, flushLocal bool) error {
	opts := dataplane.Options{Logger: env.log().With("leftovers", mode)}
	switch mode {
	case NFTables:
		p, err := nftables.New(opts, env.nft())
		if err != nil {
			return err
		}
		return p.Cleanup(ctx)
	case IPTables:
		// The chains of every backend first: the hairpin ipsets cannot be
		// destroyed while either backend's rules match them.
		var errs []error
		var last *iptables.Proxier
		for _, v := range env.variants() {
			p, err := env.iptables(v, opts.Logger)
			if err == nil {
				last = p
				err = p.CleanupChains(ctx)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("iptables-%s: %w", v, err))
			}
		}
		if last != nil {
			if err := last.DestroySets(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	case IPVS:
		o := env.IPVS
		o.Options = opts
		o.NodeIPs = env.NodeIPs
		o.FlushLocal = flushLocal
		if o.Runner == nil {
			o.Runner = env.runner("")
		}
		return ipvs.Cleanup(ctx, o)
	case Userspace:
		o := env.Userspace
		o.Options = opts
		p, err := userspace.New(o)
		if err != nil {
			return err
		}
		return p.Cleanup(ctx)
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// removeKubeProxy removes kube-proxy's leftovers: its iptables chains in
// every backend (onlyMarked: in tables holding one of its marker chains),
// then its IPVS state (its ipsets are referenced by those chains), then
// its nftables tables; each logged when something was removed.
func (env Env) removeKubeProxy(ctx context.Context, keepVirtualServers, onlyMarked bool) []error {
	var errs []error
	log := env.log().With("leftovers", "kube-proxy")
	for _, v := range env.variants() {
		p, err := env.iptables(v, log)
		if err == nil {
			err = p.RemoveKubeProxyLeftovers(ctx, onlyMarked)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy's iptables-%s chains: %w", v, err))
		}
	}
	rm := env.KubeProxyIPVS
	if rm == nil {
		rm = func(ctx context.Context, keep bool) (ipvs.KubeProxyLeftovers, error) {
			return ipvs.RemoveKubeProxyLeftovers(ctx, &ipset.Exec{}, keep)
		}
	}
	got, err := rm(ctx, keepVirtualServers)
	if got.Interface || got.VirtualServers > 0 || len(got.IPSets) > 0 {
		log.Info("removed kube-proxy's IPVS leftovers", "interface", ipvs.KubeProxyDummy, "virtualServers", got.VirtualServers, "ipsets", got.IPSets, "ipsetsWaited", got.IPSetsWaited)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy's IPVS leftovers: %w", err))
	}
	p, err := nftables.New(dataplane.Options{Logger: log}, env.nft())
	if err == nil {
		err = p.RemoveKubeProxyTables(ctx)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy's nftables tables: %w", err))
	}
	return errs
}
