package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
)

// ProbeService is the virtual server the availability probe creates and
// deletes at once: TCP port 1 of 192.0.2.254, an address of TEST-NET-1
// (RFC 5737, documentation only, never routed), so no real traffic can
// match it during the moment it exists. A probe server left by a crashed
// earlier probe is deleted and created again.
var ProbeService = ServiceKey{Addr: netip.MustParseAddr("192.0.2.254"), Port: 1, Protocol: model.TCP}

// probeSet is the ipset the probe creates and destroys.
const probeSet = SetPrefix + "PROBE"

// Probe checks that the IPVS mode can run with scheduler: the kernel
// boundary is there (a nil k means none could be opened), a virtual server
// with that scheduler can be created and deleted, and ipset can create a
// hash:ip,port set. It returns nil, or one error per missing piece, each
// naming what is missing.
func Probe(ctx context.Context, k Kernel, set ipset.Runner, scheduler string) []error {
	var missing []error
	if k != nil {
		vs := VirtualServer{ServiceKey: ProbeService, Scheduler: scheduler}
		err := k.AddService(vs)
		if IsExist(err) {
			if err = k.DelService(ProbeService); err == nil {
				err = k.AddService(vs)
			}
		}
		if err == nil {
			err = k.DelService(ProbeService)
		}
		if err != nil {
			missing = append(missing, fmt.Errorf("IPVS cannot create a virtual server with scheduler %q (kernel module ip_vs_%s?): %w", scheduler, scheduler, err))
		}
	}
	script := "create " + probeSet + " hash:ip,port family inet -exist\ndestroy " + probeSet + "\n"
	if err := set.Restore(ctx, []byte(script)); err != nil {
		missing = append(missing, fmt.Errorf("ipset is not usable (ipset binary or the kernel's ip_set/hash:ip,port): %w", err))
	}
	return missing
}

// New returns the IPVS proxier when IPVS is usable, else the iptables
// proxier. It first validates opts (an unknown ipvs.scheduler is an error
// whatever the kernel), then probes (see Probe): with a nil Kernel it
// opens the IPVS netlink family of the calling thread's network namespace,
// which is the node's in vipproxy. When anything is missing it logs one
// warning naming every missing piece, counts
// vipproxy_proxy_mode_fallbacks_total{from="ipvs",to="iptables"} and
// returns iptables.New(opts.IPTables) with opts.Options; Mode() of the
// result says "iptables". Errors of the iptables mode's New are returned.
func New(opts Options) (dataplane.Dataplane, error) {
	if err := validate(&opts); err != nil {
		return nil, err
	}
	var missing []error
	if opts.Kernel == nil {
		k, err := OpenNetlink()
		if err != nil {
			missing = append(missing, err)
		} else {
			opts.Kernel = k
		}
	}
	missing = append(missing, Probe(context.Background(), opts.Kernel, opts.IPSet, opts.Scheduler)...)
	if len(missing) == 0 {
		return NewProxier(opts)
	}
	if n, ok := opts.Kernel.(*Netlink); ok && n != nil {
		n.Close()
	}
	var why []string
	for _, m := range missing {
		why = append(why, m.Error())
	}
	opts.Log().Warn("IPVS proxy mode is not usable; falling back to iptables mode",
		"requested", "ipvs", "running", "iptables", "missing", strings.Join(why, "; "))
	metrics.ModeFallbacks.WithLabelValues("ipvs", "iptables").Inc()
	io := opts.IPTables
	io.Options = opts.Options
	dp, err := iptables.New(io)
	if err != nil {
		return nil, fmt.Errorf("ipvs: fallback to iptables: %w", errors.Join(append(missing, err)...))
	}
	return dp, nil
}

// Cleanup removes everything the IPVS mode may have installed in the
// calling thread's network namespace, without probing (so no fallback
// warning): virtual servers on vipproxy's VIPs and on opts.NodeIPs, with
// opts.FlushLocal on every local address (for `vipproxy --cleanup`), never
// those in ExcludeCIDRs; the VIPs and dummy interface; the VIPVS- chains
// and ipsets. A kernel without IPVS has no virtual servers to remove; that
// is not an error. Sysctls are left as they are (the originals are not
// known here). Use it, not New(...).Cleanup, to remove leftovers.
func Cleanup(ctx context.Context, opts Options) error {
	if err := validate(&opts); err != nil {
		return err
	}
	if opts.Kernel == nil {
		if k, err := OpenNetlink(); err == nil {
			defer k.Close()
			opts.Kernel = k
		}
	}
	return cleanup(ctx, &opts, nil, nil)
}
