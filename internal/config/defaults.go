package config

import (
	"net"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/vipproxy/vipproxy/internal/model"
)

// Ports of kube-proxy's health and metrics servers.
const (
	HealthzPort = 10256
	MetricsPort = 10249
)

// APIVersion and Kind of the configuration file.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// SetDefaults fills every unset field of kp the way kube-proxy v1.34 does
// (its SetDefaults_KubeProxyConfiguration plus the Linux platform
// defaults), with one deliberate difference: an empty mode becomes
// nftables, not iptables. It sets apiVersion and kind. Values already set
// are kept, except that a health or metrics address without a port gets
// the default port appended. As in kube-proxy, a zero duration (and a
// zero clientConnection qps or burst) in the file counts as unset ("minSyncPeriod: 0s" becomes 1s; use the
// flag, applied after defaulting, for an explicit 0). It never fails;
// Validate judges the result.
//
// Defaults: bindAddress 0.0.0.0; healthzBindAddress 0.0.0.0:10256 and
// metricsBindAddress 127.0.0.1:10249 ([::]:10256 and [::1]:10249 when the
// bind address is IPv6); oomScoreAdj -999; iptables and nftables
// syncPeriod 30s, minSyncPeriod 1s, masqueradeBit 14; iptables
// localhostNodePorts true; ipvs syncPeriod 30s (minSyncPeriod stays 0,
// scheduler "" means rr); conntrack maxPerCore 32768, min 131072,
// tcpEstablishedTimeout 24h, tcpCloseWaitTimeout 1h; configSyncPeriod
// 15m; clientConnection contentType application/vnd.kubernetes.protobuf,
// qps 5, burst 10; detectLocalMode ClusterCIDR; logging format text.
// nodePortAddresses stays empty, which in vipproxy means the node's
// primary IPs in every mode (kube-proxy's nftables default; its iptables
// and ipvs modes would accept NodePorts on every local IP).
func SetDefaults(kp *kpv1alpha1.KubeProxyConfiguration) {
	kp.APIVersion = APIVersion
	kp.Kind = Kind
	if kp.BindAddress == "" {
		kp.BindAddress = "0.0.0.0"
	}
	defaultAddresses(kp)
	if kp.OOMScoreAdj == nil {
		kp.OOMScoreAdj = ptr[int32](-999)
	}
	if kp.Mode == "" {
		kp.Mode = ModeNFTables
	}
	defaultDuration(&kp.IPTables.SyncPeriod, 30*time.Second)
	defaultDuration(&kp.IPTables.MinSyncPeriod, time.Second)
	if kp.IPTables.LocalhostNodePorts == nil {
		kp.IPTables.LocalhostNodePorts = ptr(true)
	}
	if kp.IPTables.MasqueradeBit == nil {
		kp.IPTables.MasqueradeBit = ptr[int32](14)
	}
	defaultDuration(&kp.NFTables.SyncPeriod, 30*time.Second)
	// nftables: 100 ms, not upstream's 1 s. A partial nftables sync at
	// 10,000 Services costs vipproxy about a millisecond of CPU and one
	// netlink batch, so a second between syncs buys nothing but a second
	// of latency for every change that follows another within it.
	defaultDuration(&kp.NFTables.MinSyncPeriod, DefaultNFTablesMinSyncPeriod)
	if kp.NFTables.MasqueradeBit == nil {
		kp.NFTables.MasqueradeBit = ptr[int32](14)
	}
	defaultDuration(&kp.IPVS.SyncPeriod, 30*time.Second)
	if kp.Conntrack.MaxPerCore == nil {
		kp.Conntrack.MaxPerCore = ptr[int32](32 * 1024)
	}
	if kp.Conntrack.Min == nil {
		kp.Conntrack.Min = ptr[int32](128 * 1024)
	}
	if kp.Conntrack.TCPEstablishedTimeout == nil {
		kp.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if kp.Conntrack.TCPCloseWaitTimeout == nil {
		kp.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	defaultDuration(&kp.ConfigSyncPeriod, 15*time.Minute)
	if kp.ClientConnection.ContentType == "" {
		kp.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if kp.ClientConnection.QPS == 0 {
		kp.ClientConnection.QPS = 5
	}
	if kp.ClientConnection.Burst == 0 {
		kp.ClientConnection.Burst = 10
	}
	if kp.FeatureGates == nil {
		kp.FeatureGates = map[string]bool{}
	}
	if kp.DetectLocalMode == "" {
		kp.DetectLocalMode = LocalModeClusterCIDR
	}
	logsapi.SetRecommendedLoggingConfiguration(&kp.Logging)
}

// defaultAddresses fills the health and metrics addresses from the bind
// address's family, or appends the default port to a bare IP.
func defaultAddresses(kp *kpv1alpha1.KubeProxyConfiguration) {
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if a, err := model.ParseAddr(kp.BindAddress); err == nil && a.Is6() {
		healthzHost, metricsHost = "::", "::1"
	}
	if kp.HealthzBindAddress == "" {
		kp.HealthzBindAddress = net.JoinHostPort(healthzHost, itoa(HealthzPort))
	} else {
		kp.HealthzBindAddress = appendPortIfNeeded(kp.HealthzBindAddress, HealthzPort)
	}
	if kp.MetricsBindAddress == "" {
		kp.MetricsBindAddress = net.JoinHostPort(metricsHost, itoa(MetricsPort))
	} else {
		kp.MetricsBindAddress = appendPortIfNeeded(kp.MetricsBindAddress, MetricsPort)
	}
}

// setOwnDefaults fills vipproxy's own settings.
func (c *Config) setOwnDefaults() {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.ServiceClusterIPRange == "" {
		c.ServiceClusterIPRange = DefaultServiceClusterIPRange
	}
	if c.ServiceNodePortRange == "" {
		c.ServiceNodePortRange = DefaultServiceNodePortRange
	}
}

// Default returns a Config with every default applied and nothing else:
// what vipproxy runs with when given no flags (it is not valid as is,
// since neither a kubeconfig nor a manifests directory is set).
func Default() *Config {
	c := &Config{}
	c.complete()
	return c
}

// applyOverrides applies the flags that win over the file.
func (c *Config) applyOverrides() {
	if c.overrides.hostname != nil {
		c.KubeProxy.HostnameOverride = strings.ToLower(strings.TrimSpace(*c.overrides.hostname))
	}
	c.resolveLogging()
}

func defaultDuration(d *metav1.Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

// appendPortIfNeeded appends port to addr when addr is a bare IP address,
// as kube-proxy's AppendPortIfNeeded does; anything else is returned
// unchanged for Validate to judge.
func appendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	a, err := model.ParseAddr(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(a.String(), itoa(port))
}

func ptr[T any](v T) *T { return &v }
