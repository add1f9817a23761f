// Package config holds vipproxy's configuration: kube-proxy's flags and its
// KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, decoded
// into the published k8s.io/kube-proxy types), upstream's defaults, the few
// settings of vipproxy's own, and a validation that reports every problem
// before anything is programmed.
//
// The usual sequence is:
//
//	c, err := config.Parse(os.Args[1:], os.Stdout) // errors.Is(err, config.ErrHelp) → exit 0
//	if err := c.Validate(config.OSHost{}); err != nil { … exit 1 }
//	if c.WriteConfigTo != "" { config.WriteConfigFile(c.WriteConfigTo, c); exit }
//	… use c.Mode(), c.ClusterCIDRs(), c.SyncPeriod(), …
//
// Parse and LoadFile only decode and default; Validate judges. The parsed
// accessors (Mode, ClusterCIDRs, NodePortRange, …) assume Validate
// succeeded: on an invalid Config they return zero values, never panic.
package config

import (
	"fmt"
	logsapi "k8s.io/component-base/logs/api/v1"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Proxy modes vipproxy knows. An empty mode means ModeNFTables: unlike
// kube-proxy on Linux, whose default is still iptables, vipproxy's default
// is nftables.
const (
	ModeNFTables  = "nftables"
	ModeIPTables  = "iptables"
	ModeIPVS      = "ipvs"
	ModeUserspace = "userspace"
)

// Detect-local modes (kube-proxy's LocalMode values).
const (
	LocalModeClusterCIDR         = "ClusterCIDR"
	LocalModeNodeCIDR            = "NodeCIDR"
	LocalModeBridgeInterface     = "BridgeInterface"
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix"
)

// NodePortAddressesPrimary is the nodePortAddresses keyword meaning "the
// node's primary IPs" (also what an empty list means in nftables and
// userspace mode; see NodePorts).
const NodePortAddressesPrimary = "primary"

// NodePortAddressesAll is the nodePortAddresses keyword (kube-proxy 1.37)
// for every local address (loopback only as NodePorts.Loopback says).
const NodePortAddressesAll = "all"

// NodePortAddressesLocalhost is kube-proxy 1.37's keyword for loopback
// NodePorts (127.0.0.1 and ::1), served by the userspace proxy in every
// mode (see NodePorts).
const NodePortAddressesLocalhost = "localhost"

// Defaults of vipproxy's own settings.
const (
	DefaultStateDir              = "/var/lib/vipproxy"
	DefaultServiceClusterIPRange = "10.96.0.0/12"
	DefaultServiceNodePortRange  = "30000-32767"
	DefaultLoggingFormat         = "text"
)

// Config is vipproxy's complete configuration: the KubeProxyConfiguration
// (from --config or from kube-proxy's flags, fully defaulted) plus
// vipproxy's own flag-level settings, which never come from the file.
type Config struct {
	// KubeProxy is the fully defaulted kube-proxy configuration. Mode is
	// never empty after defaulting (see ModeNFTables).
	KubeProxy kpv1alpha1.KubeProxyConfiguration

	// ConfigFile is --config: where KubeProxy was read from ("" = flags).
	ConfigFile string
	// InitOnly is --init-only: apply the settings that need full root
	// privileges and exit.
	InitOnly bool
	// ModeDefaulted is true when neither the config file nor --proxy-mode
	// set the mode (kubeadm writes `mode: ""`): KubeProxy.Mode then holds
	// the default, nftables, where kube-proxy would run iptables.
	ModeDefaulted bool
	// WriteConfigTo is --write-config-to: write KubeProxy there and exit.
	WriteConfigTo string
	// Cleanup is --cleanup: remove everything vipproxy installed and exit.
	Cleanup bool
	// CleanupKubeProxy is --cleanup-kube-proxy: with Cleanup, also remove
	// kube-proxy's leftovers (for migrations).
	CleanupKubeProxy bool
	// Master is --master: overrides the API server address of the
	// kubeconfig. It is not part of the file, as in kube-proxy.
	Master string
	// Manifests is --manifests: the directory of Service / EndpointSlice
	// YAML for standalone mode ("" = Kubernetes mode).
	Manifests string
	// StateDir is --state-dir: where standalone state (the allocation
	// database) lives. Default DefaultStateDir.
	StateDir string
	// Registry is --registry: where standalone allocations are stored.
	// "" means a bbolt file in StateDir; "etcd://host:port[,host:port]"
	// means a shared etcd.
	Registry string
	// ServiceClusterIPRange is --service-cluster-ip-range: one CIDR or a
	// comma-separated dual-stack pair. Default DefaultServiceClusterIPRange.
	ServiceClusterIPRange string
	// ExternalIPCIDRs is --external-ip-cidrs: a comma-separated allow-list
	// of CIDRs for spec.externalIPs. Empty allows every externalIP that is
	// not refused anyway (loopback, link-local, multicast, unspecified, a
	// ClusterIP, the standalone service range).
	ExternalIPCIDRs string
	// OutlierEjection is --outlier-ejection: passive outlier ejection for
	// Services without the vipproxy.io/outlier-ejection annotation.
	OutlierEjection bool
	// OutlierFailures, OutlierWindow, OutlierBaseEjection and
	// OutlierMaxEjectedPercent tune it (--outlier-*; see outlier.Config).
	OutlierFailures          int
	OutlierWindow            time.Duration
	OutlierBaseEjection      time.Duration
	OutlierMaxEjectedPercent int
	// EndpointMetricsServices is --endpoint-metrics-services: per-endpoint
	// connection metrics for the N Service ports with the most new
	// connections (0: off).
	EndpointMetricsServices int
	// ServiceNodePortRange is --service-node-port-range: "lo-hi" or
	// "lo+n". Default DefaultServiceNodePortRange.
	ServiceNodePortRange string
	// LoggingFormat is "text" or "json" (--logging-format, else the file's
	// logging.format).
	LoggingFormat string
	// Verbosity is -v (else the file's logging.verbosity).
	Verbosity int
	// ProfilingEnabled mirrors KubeProxy.EnableProfiling (--profiling).
	ProfilingEnabled bool

	// IgnoredFlags lists kube-proxy flags that were given together with
	// --config and therefore ignored (kube-proxy ignores them silently;
	// the caller should warn).
	IgnoredFlags []string
	// Warnings are non-fatal findings of Parse and Validate (deprecated
	// flags, IPVS unavailable, …) for the caller to log.
	Warnings []string

	// parseWarns are the warnings Parse found; Validate keeps them.
	parseWarns []string

	// overrides are the flags that win over the file, kept so Reload can
	// apply them again to a new file.
	overrides overrides
}

// overrides are the command-line settings that take precedence over the
// --config file, as in kube-proxy: the logging flags and
// --hostname-override.
type overrides struct {
	hostname *string
	// logging holds the logging flags' values; loggingFlags names those
	// given on the command line (each wins over the file's field).
	logging      *logsapi.LoggingConfiguration
	loggingFlags []string
}

// Mode returns the proxy mode: nftables, iptables, ipvs or userspace.
func (c *Config) Mode() string {
	m := string(c.KubeProxy.Mode)
	if m == "" {
		return ModeNFTables
	}
	return m
}

// NodeName returns this node's name: hostnameOverride when set, else the
// kernel's hostname; trimmed and lower-cased, as kube-proxy does. It fails
// when the hostname cannot be read or the result is empty.
func (c *Config) NodeName() (string, error) {
	name := strings.TrimSpace(c.KubeProxy.HostnameOverride)
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("config: node name: %w", err)
		}
		name = strings.TrimSpace(h)
	}
	if name == "" {
		return "", fmt.Errorf("config: node name: hostname is empty; set --hostname-override")
	}
	return strings.ToLower(name), nil
}

// BindAddress returns bindAddress parsed canonically (the node's primary
// IP when it is not unspecified); the zero Addr when invalid.
func (c *Config) BindAddress() netip.Addr {
	a, _ := model.ParseAddr(c.KubeProxy.BindAddress)
	return a
}

// ClusterCIDRs returns the pod CIDRs of clusterCIDR (one per family at
// most, masked), nil when unset or invalid.
func (c *Config) ClusterCIDRs() []netip.Prefix {
	p, _ := parsePrefixList(c.KubeProxy.ClusterCIDR)
	return p
}

// ServiceCIDRs returns the service ranges of --service-cluster-ip-range
// (masked), nil when invalid.
func (c *Config) ServiceCIDRs() []netip.Prefix {
	p, _ := parsePrefixList(c.ServiceClusterIPRange)
	return p
}

// ExternalIPAllowList returns --external-ip-cidrs as prefixes (masked),
// nil when empty or invalid (Validate refuses an invalid list).
func (c *Config) ExternalIPAllowList() []netip.Prefix {
	p, _ := parseCIDRs(c.ExternalIPCIDRs)
	return p
}

// NodePorts is where NodePorts are served, resolved from
// nodePortAddresses and the mode.
type NodePorts struct {
	// Prefixes are the ranges NodePorts answer in (local addresses inside
	// them). In the kernel modes they hold no loopback range (loopback is
	// in Loopback instead); in userspace mode loopback addresses are host
	// prefixes here, since a socket needs no route_localnet.
	Prefixes []netip.Prefix
	// Primary: the node's primary IPs too ("primary", or the nftables and
	// userspace default).
	Primary bool
	// Loopback are the loopback addresses (127.0.0.1, ::1) the kernel
	// modes serve NodePorts on through the userspace proxy, without
	// route_localnet: "localhost" or a loopback CIDR in any kernel mode,
	// and in iptables mode, with iptables.localhostNodePorts (default
	// true), 127.0.0.1 whenever a range holds it, as kube-proxy's iptables
	// mode (IPv4 only). iptables.localhostNodePorts false turns it off in
	// iptables mode. Nil in userspace mode.
	Loopback []netip.Addr
}

var (
	loopback4 = netip.MustParseAddr("127.0.0.1")
	loopback6 = netip.IPv6Loopback()
)

// NodePorts resolves nodePortAddresses with kube-proxy's per-mode default:
// unset means every local address in iptables and ipvs mode (0.0.0.0/0 and
// ::/0) and the node's primary IPs in nftables and userspace mode. The
// keywords "primary", "all" (the two /0) and "localhost" (127.0.0.1 and
// ::1) combine with each other and with CIDRs, as in kube-proxy 1.37. An
// invalid list gives the zero NodePorts (Validate refuses it).
func (c *Config) NodePorts() NodePorts {
	all := []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0)}
	mode := c.Mode()
	var np NodePorts
	var loop []netip.Addr
	list := c.KubeProxy.NodePortAddresses
	if len(list) == 0 {
		switch mode {
		case ModeIPTables, ModeIPVS:
			np.Prefixes = all
		default:
			np.Primary = true
		}
	}
	for _, s := range list {
		switch s = strings.TrimSpace(s); s {
		case NodePortAddressesPrimary, "":
			np.Primary = true
			continue
		case NodePortAddressesAll:
			np.Prefixes = append(np.Prefixes, all...)
			continue
		case NodePortAddressesLocalhost:
			loop = append(loop, loopback4, loopback6)
			continue
		}
		p, err := model.ParsePrefix(s)
		if err != nil {
			return NodePorts{}
		}
		if p.Addr().IsLoopback() && (p.Addr().Is6() || p.Bits() >= 8) {
			// A loopback range: its loopback address, never a kernel rule.
			for _, a := range []netip.Addr{loopback4, loopback6} {
				if p.Contains(a) {
					loop = append(loop, a)
				}
			}
			continue
		}
		np.Prefixes = append(np.Prefixes, p)
	}
	if mode == ModeIPTables && c.KubeProxy.IPTables.LocalhostNodePorts != nil && *c.KubeProxy.IPTables.LocalhostNodePorts {
		for _, p := range np.Prefixes {
			if p.Contains(loopback4) {
				loop = append(loop, loopback4)
			}
		}
	}
	if mode == ModeIPTables && (c.KubeProxy.IPTables.LocalhostNodePorts == nil || !*c.KubeProxy.IPTables.LocalhostNodePorts) {
		loop = nil
	}
	slices.SortFunc(loop, netip.Addr.Compare)
	loop = slices.Compact(loop)
	if mode == ModeUserspace {
		for _, a := range loop {
			np.Prefixes = append(np.Prefixes, netip.PrefixFrom(a, a.BitLen()))
		}
		loop = nil
	}
	np.Loopback = loop
	slices.SortFunc(np.Prefixes, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	np.Prefixes = slices.Compact(np.Prefixes)
	return np
}

// NodePortRange returns the inclusive NodePort range of
// --service-node-port-range; (0, 0) when invalid.
func (c *Config) NodePortRange() (lo, hi uint16) {
	lo, hi, err := parsePortRange(c.ServiceNodePortRange)
	if err != nil {
		return 0, 0
	}
	return lo, hi
}

// SyncPeriod returns the full-resync period of the mode's section:
// nftables for nftables, ipvs for ipvs, iptables for iptables and
// userspace.
func (c *Config) SyncPeriod() time.Duration {
	switch c.Mode() {
	case ModeNFTables:
		return c.KubeProxy.NFTables.SyncPeriod.Duration
	case ModeIPVS:
		return c.KubeProxy.IPVS.SyncPeriod.Duration
	default:
		return c.KubeProxy.IPTables.SyncPeriod.Duration
	}
}

// DefaultNFTablesMinSyncPeriod is nftables.minSyncPeriod when neither the
// config file nor --iptables-min-sync-period sets it.
const DefaultNFTablesMinSyncPeriod = 100 * time.Millisecond

// MinSyncPeriod returns the minimum interval between syncs, from the same
// section as SyncPeriod. Zero means every change syncs at once.
func (c *Config) MinSyncPeriod() time.Duration {
	switch c.Mode() {
	case ModeNFTables:
		return c.KubeProxy.NFTables.MinSyncPeriod.Duration
	case ModeIPVS:
		return c.KubeProxy.IPVS.MinSyncPeriod.Duration
	default:
		return c.KubeProxy.IPTables.MinSyncPeriod.Duration
	}
}

// MasqueradeAll reports whether all Service traffic is masqueraded, from
// the mode's section (nftables, else iptables).
func (c *Config) MasqueradeAll() bool {
	if c.Mode() == ModeNFTables {
		return c.KubeProxy.NFTables.MasqueradeAll
	}
	return c.KubeProxy.IPTables.MasqueradeAll
}

// MasqueradeBit returns the fwmark bit that marks packets for SNAT, from
// the mode's section (nftables, else iptables); 14 when unset.
func (c *Config) MasqueradeBit() int {
	p := c.KubeProxy.IPTables.MasqueradeBit
	if c.Mode() == ModeNFTables {
		p = c.KubeProxy.NFTables.MasqueradeBit
	}
	if p == nil {
		return 14
	}
	return int(*p)
}

// Scheduler returns the IPVS (and userspace) scheduler; "rr" when unset.
func (c *Config) Scheduler() string {
	if c.KubeProxy.IPVS.Scheduler == "" {
		return "rr"
	}
	return c.KubeProxy.IPVS.Scheduler
}

// DetectLocalMode returns how local (pod) traffic is recognised;
// ClusterCIDR when unset.
func (c *Config) DetectLocalMode() string {
	if c.KubeProxy.DetectLocalMode == "" {
		return LocalModeClusterCIDR
	}
	return string(c.KubeProxy.DetectLocalMode)
}

// Standalone reports whether Services come from a manifests directory
// rather than from a Kubernetes API server.
func (c *Config) Standalone() bool { return c.Manifests != "" }

// RegistryEndpoints returns the etcd endpoints of an etcd:// Registry
// ("http://host:port" each), nil for the bbolt default.
func (c *Config) RegistryEndpoints() []string {
	eps, _ := parseRegistry(c.Registry)
	return eps
}

// RegistryFile returns the bbolt file used when Registry is empty.
func (c *Config) RegistryFile() string {
	return strings.TrimRight(c.StateDir, "/") + "/allocations.db"
}

// FeatureEnabled reports whether the named feature gate is on: the value
// given in featureGates (or by AllAlpha / AllBeta for gates of that
// stage), else the gate's kube-proxy v1.34 default. Locked GA gates are
// always their default; unknown names are off.
func (c *Config) FeatureEnabled(name string) bool {
	return featureEnabled(c.KubeProxy.FeatureGates, name)
}
