//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vishvananda/netlink"
)

// KubeProxyDummy is the interface kube-proxy's IPVS mode binds its VIPs to.
const KubeProxyDummy = "kube-ipvs0"

// KubeProxyLeftovers are what RemoveKubeProxyLeftovers found and removed.
type KubeProxyLeftovers struct {
	Interface      bool          // kube-ipvs0 existed and was deleted
	VirtualServers int           // virtual servers on its addresses, deleted
	IPSets         []string      // KUBE-* sets destroyed
	IPSetsWaited   time.Duration // waiting for the kernel to release them
}

// RemoveKubeProxyLeftovers removes what kube-proxy's IPVS mode leaves in
// the calling thread's network namespace after it stopped: the dummy
// interface kube-ipvs0 with its VIP addresses, the virtual servers on
// those addresses (unless keepVirtualServers: vipproxy's own IPVS mode
// serves the same VIP:port keys and has adopted them), and its ipsets
// (KUBE-*; call it after kube-proxy's iptables chains are gone, since
// rules referencing a set keep it alive; see destroyKubeProxySets). A namespace kube-proxy never ran
// in has nothing to remove; that is not an error. kube-proxy's NodePort
// virtual servers on the node's own addresses are not recognised (they
// cannot be told from anyone else's) and stay.
func RemoveKubeProxyLeftovers(ctx context.Context, set ipset.Runner, keepVirtualServers bool) (KubeProxyLeftovers, error) {
	var got KubeProxyLeftovers
	var errs []error
	link, err := netlink.LinkByName(KubeProxyDummy)
	if err == nil {
		vips := map[netip.Addr]bool{}
		if addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL); err == nil {
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok {
					vips[ip.Unmap()] = true
				}
			}
		}
		if !keepVirtualServers && len(vips) > 0 {
			if k, err := OpenNetlink(); err == nil {
				svcs, err := k.Services()
				if err != nil {
					errs = append(errs, err)
				}
				for _, vs := range svcs {
					if !vips[vs.Addr] {
						continue
					}
					if err := k.DelService(vs.ServiceKey); err != nil && !IsNotFound(err) {
						errs = append(errs, err)
						continue
					}
					got.VirtualServers++
				}
				k.Close()
			}
		}
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: delete %s: %w", KubeProxyDummy, err))
		} else {
			got.Interface = true
		}
	} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
		errs = append(errs, fmt.Errorf("ipvs: %s: %w", KubeProxyDummy, err))
	}
	if set != nil {
		gone, waited, err := destroyKubeProxySets(ctx, set)
		got.IPSets, got.IPSetsWaited = gone, waited
		if err != nil {
			errs = append(errs, err)
		}
	}
	return got, errors.Join(errs...)
}
