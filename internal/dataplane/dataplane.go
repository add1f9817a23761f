// Package dataplane defines the interface every proxy mode implements and
// the options they share.
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Dataplane programs a model.State into the kernel (or into sockets).
type Dataplane interface {
	// Mode returns the mode actually running ("nftables", "iptables",
	// "ipvs", "userspace"); after a fallback it names the fallback.
	Mode() string
	// Sync makes the dataplane match st. It is declarative and idempotent:
	// the same State twice writes nothing the second time. When full is
	// false the dataplane may send only what changed since its last
	// successful Sync; it must do a full sync anyway when it has never
	// synced, when the last Sync failed, or when it finds its own state
	// gone (table deleted or flushed). A failed Sync leaves what was
	// programmed before in force and returns the reason. st and its
	// ServicePorts are read-only: later States may share ports with it
	// (model.Builder passes unchanged ones on as the same pointers), and a
	// dataplane may rely on a port pointer it saw before being unchanged.
	Sync(ctx context.Context, st *model.State, full bool) error
	// Cleanup removes everything this mode ever installed. It succeeds
	// when there is nothing to remove.
	Cleanup(ctx context.Context) error
}

// Options are the settings every dataplane shares. The zero value of each
// field is documented; New functions of the modes validate what they use.
type Options struct {
	// NodeName is this node's name (for Local endpoints and logs).
	NodeName string
	// NodeIPs are this node's primary IPs (one per family).
	NodeIPs []netip.Addr
	// NodePortAddresses restricts NodePorts to local addresses inside these
	// prefixes. Empty means the node's primary IPs (the caller resolves
	// "primary" among other ranges into host prefixes of NodeIPs). The
	// kernel modes never serve loopback addresses, so a list of only
	// loopback prefixes means no NodePort address at all; the userspace
	// mode serves loopback addresses inside the prefixes.
	NodePortAddresses []netip.Prefix
	// MasqueradeAll masquerades all traffic to Service VIPs.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit used to mark packets for SNAT (default 14).
	MasqueradeBit int
	// ClusterCIDRs are the pod CIDRs, used to detect local (pod) traffic
	// by its source (detectLocalMode ClusterCIDR: the cluster's; NodeCIDR:
	// this node's). With neither ClusterCIDRs nor PodInterface local
	// traffic is not detected, and, as in kube-proxy, ClusterIP traffic is
	// not masqueraded (unless MasqueradeAll).
	ClusterCIDRs []netip.Prefix
	// PodInterface, when set, detects local (pod) traffic by the interface
	// it arrives on instead: an exact name (detectLocalMode
	// BridgeInterface), or with PodInterfacePrefix a name prefix
	// (InterfaceNamePrefix). It wins over ClusterCIDRs. The userspace
	// mode cannot see interfaces and ignores it.
	PodInterface       string
	PodInterfacePrefix bool
	// ServiceCIDRs are the service ranges; traffic to an unallocated
	// address inside them is dropped. Empty disables that rule.
	ServiceCIDRs []netip.Prefix
	// Scheduler is the IPVS / userspace scheduler name (rr when empty).
	Scheduler string
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultMasqueradeBit is the MasqueradeBit a zero value means
// (kube-proxy's default).
const DefaultMasqueradeBit = 14

// WithDefaults returns o with the defaults of its zero fields filled in
// (MasqueradeBit).
func (o Options) WithDefaults() Options {
	if o.MasqueradeBit == 0 {
		o.MasqueradeBit = DefaultMasqueradeBit
	}
	return o
}

// CheckPort returns why a kernel dataplane cannot program sp, or "". The
// model validates every ServicePort before a dataplane sees it; this is
// the dataplanes' shared guard for what their rules would otherwise get
// wrong.
func CheckPort(sp *model.ServicePort) string {
	switch sp.Protocol {
	case model.TCP, model.UDP, model.SCTP:
	default:
		return fmt.Sprintf("protocol %q is not TCP, UDP or SCTP", sp.Protocol)
	}
	if sp.Port == 0 {
		return "port 0"
	}
	if sp.AffinityTimeoutSeconds < 0 || sp.AffinityTimeoutSeconds > model.MaxAffinityTimeoutSecs {
		return fmt.Sprintf("sessionAffinityConfig.clientIP.timeoutSeconds %d is not in [0, %d]", sp.AffinityTimeoutSeconds, model.MaxAffinityTimeoutSecs)
	}
	return ""
}

// Log returns o.Logger or slog.Default().
func (o *Options) Log() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// ErrDrift is wrapped by Verifier.Verify when the kernel no longer holds
// what the last sync wrote.
var ErrDrift = errors.New("kernel state drifted from the last sync")

// Verifier is implemented by dataplanes that can check cheaply, without a
// rewrite, whether the kernel still holds what their last sync wrote
// (someone deleted a rule or a map element by hand, say). The reconcile
// loop calls Verify on its periodic syncs and repairs drift with a full
// sync. Verify returns nil when nothing differs (or it cannot tell), an
// error wrapping ErrDrift saying what differs, or another error when the
// check itself failed.
type Verifier interface {
	Verify(ctx context.Context) error
}

// DriftError returns nil for no diffs, else an error wrapping ErrDrift
// that names the first five differences (sorted) and counts the rest.
func DriftError(diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	diffs = slices.Sorted(slices.Values(diffs))
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	return fmt.Errorf("%w: %s", ErrDrift, strings.Join(diffs, "; "))
}

// AffinityEntry is a client's ClientIP session-affinity entry as the
// kernel (or the userspace proxy) holds it: the endpoint the client
// sticks to and the time left before the entry expires (0 when the
// dataplane cannot tell).
type AffinityEntry struct {
	Endpoint netip.AddrPort
	Expires  time.Duration
}

// AffinityReader is implemented by dataplanes that can report a client's
// affinity entry for a Service port (the explain command). ok is false
// when the client has none (never connected, or it expired).
type AffinityReader interface {
	Affinity(ctx context.Context, sp *model.ServicePort, client netip.Addr) (e AffinityEntry, ok bool, err error)
}

// AffinityEndpoints returns the distinct endpoints of sp's Cluster and
// Local sets in client's family: those an affinity entry of client can
// point at.
func AffinityEndpoints(sp *model.ServicePort, client netip.Addr) []model.Endpoint {
	v6 := client.Unmap().Is6()
	seen := map[netip.AddrPort]bool{}
	var out []model.Endpoint
	for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, e := range set {
			ep := netip.AddrPortFrom(e.IP.Unmap(), e.Port)
			if seen[ep] || ep.Addr().Is6() != v6 {
				continue
			}
			seen[ep] = true
			out = append(out, e)
		}
	}
	return out
}
