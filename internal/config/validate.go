package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipproxy/vipproxy/internal/model"
)

// FieldError is one validation problem: the flag (--cluster-cidr) or file
// field (clusterCIDR, conntrack.maxPerCore) at fault, its value as given,
// and why it is refused.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e FieldError) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Field, e.Value, e.Reason)
}

// ErrorList is every problem Validate found. Error lists them one per line.
type ErrorList []FieldError

func (l ErrorList) Error() string {
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return "invalid configuration:\n  " + strings.Join(lines, "\n  ")
}

// Has reports whether the list holds an error about field.
func (l ErrorList) Has(field string) bool {
	for _, e := range l {
		if e.Field == field {
			return true
		}
	}
	return false
}

// Validate checks everything that can be checked before anything is
// programmed and returns nil or an ErrorList with ALL problems found. It
// also replaces c.Warnings with the non-fatal findings of Parse and of
// this check (e.g. ipvs mode without IPVS in the kernel, which falls back
// to iptables). It touches nothing on the host; h is only asked.
//
// Problems name the flag when the setting came from the command line and
// the file field when it came from --config. Checked: the source
// (--kubeconfig / --master or in-cluster versus --manifests, exactly one,
// unless --cleanup; the kubeconfig file and manifests directory exist);
// the mode and whether this host supports it (nft for nftables,
// iptables-restore for iptables and for ipvs's fallback, the kernel's
// nf_tables / ip_tables when known); every CIDR (clusterCIDR,
// --service-cluster-ip-range, nodePortAddresses with the special value
// primary, ipvs.excludeCIDRs); addresses (bindAddress, and
// healthzBindAddress / metricsBindAddress as IP:port); the NodePort
// range; periods (syncPeriod > 0, 0 ≤ minSyncPeriod ≤ syncPeriod, of the
// sections the mode uses; configSyncPeriod > 0; timeouts ≥ 0); the
// masquerade bit (0-31); conntrack limits (≥ 0); oomScoreAdj; the IPVS
// scheduler; detectLocalMode and its companion fields; the node name;
// --registry; the logging format and verbosity; feature gates (unknown
// names, locked GA gates).
func (c *Config) Validate(h Host) error {
	errs, warns := c.Check(h)
	c.Warnings = append(append([]string(nil), c.parseWarns...), warns...)
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// checker accumulates problems.
type checker struct {
	c     *Config
	errs  ErrorList
	warns []string
}

// name picks the flag or the file field name for a setting, depending on
// where the KubeProxyConfiguration came from.
func (k *checker) name(flag, field string) string {
	if k.c.ConfigFile != "" || flag == "" {
		return field
	}
	return "--" + flag
}

// fail records a problem once (a flag feeding two sections is reported
// once).
func (k *checker) fail(field, value, format string, args ...any) {
	fe := FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
	for _, e := range k.errs {
		if e == fe {
			return
		}
	}
	k.errs = append(k.errs, fe)
}

func (k *checker) warn(format string, args ...any) {
	k.warns = append(k.warns, fmt.Sprintf(format, args...))
}

// Check is Validate without side effects: it returns the problems and the
// warnings.
func (c *Config) Check(h Host) (ErrorList, []string) {
	k := &checker{c: c}
	kp := &c.KubeProxy
	k.checkSource(h)
	k.checkMode(h)

	// Addresses.
	if _, err := model.ParseAddr(kp.BindAddress); err != nil {
		k.fail(k.name("bind-address", "bindAddress"), kp.BindAddress, "not an IP address")
	}
	for _, a := range []struct{ flag, field, value string }{
		{"healthz-bind-address", "healthzBindAddress", kp.HealthzBindAddress},
		{"metrics-bind-address", "metricsBindAddress", kp.MetricsBindAddress},
	} {
		if a.value == "" {
			continue // disabled (deprecated --healthz-port=0 / --metrics-port=0)
		}
		if _, err := parseHostPort(a.value); err != nil {
			k.fail(k.name(a.flag, a.field), a.value, "%v", err)
		}
	}
	if kp.HealthzBindAddress != "" && kp.HealthzBindAddress == kp.MetricsBindAddress {
		k.fail(k.name("metrics-bind-address", "metricsBindAddress"), kp.MetricsBindAddress, "same address as the health server")
	}

	// CIDRs.
	if _, err := parsePrefixList(kp.ClusterCIDR); err != nil {
		k.fail(k.name("cluster-cidr", "clusterCIDR"), kp.ClusterCIDR, "%v", err)
	}
	k.checkServiceRange()
	if _, err := parseCIDRs(k.c.ExternalIPCIDRs); err != nil {
		k.fail("--external-ip-cidrs", k.c.ExternalIPCIDRs, "%v", err)
	}
	k.checkNodePortAddresses()
	for i, s := range kp.IPVS.ExcludeCIDRs {
		if _, err := model.ParsePrefix(strings.TrimSpace(s)); err != nil {
			k.fail(k.name("ipvs-exclude-cidrs", fmt.Sprintf("ipvs.excludeCIDRs[%d]", i)), s, "not a CIDR")
		}
	}

	// Ports.
	if _, _, err := parsePortRange(c.ServiceNodePortRange); err != nil {
		k.fail("--service-node-port-range", c.ServiceNodePortRange, "%v", err)
	}

	// Outlier ejection. Zero values are the defaults (a Config built
	// without flags, in tests).
	if c.OutlierFailures < 0 || c.OutlierFailures > 1000 {
		k.fail("--outlier-failures", fmt.Sprint(c.OutlierFailures), "must be between 1 and 1000")
	}
	if c.OutlierWindow < 0 {
		k.fail("--outlier-window", c.OutlierWindow.String(), "must be positive")
	}
	if c.OutlierBaseEjection < 0 || c.OutlierBaseEjection > 5*time.Minute {
		k.fail("--outlier-base-ejection", c.OutlierBaseEjection.String(), "must be between 0s and 5m")
	}
	if c.EndpointMetricsServices < 0 || c.EndpointMetricsServices > 10000 {
		k.fail("--endpoint-metrics-services", fmt.Sprint(c.EndpointMetricsServices), "must be between 0 and 10000")
	}
	if c.OutlierMaxEjectedPercent < 0 || c.OutlierMaxEjectedPercent > 100 {
		k.fail("--outlier-max-ejected-percent", fmt.Sprint(c.OutlierMaxEjectedPercent), "must be between 1 and 100")
	}

	// Periods, per section the mode uses (iptables always: it is also the
	// fallback of ipvs and the section of userspace).
	mode := c.Mode()
	k.checkPeriods("iptables-sync-period", "iptables-min-sync-period", "iptables", kp.IPTables.SyncPeriod, kp.IPTables.MinSyncPeriod)
	k.checkMasqBit("iptables.masqueradeBit", kp.IPTables.MasqueradeBit)
	if mode == ModeNFTables {
		k.checkPeriods("iptables-sync-period", "iptables-min-sync-period", "nftables", kp.NFTables.SyncPeriod, kp.NFTables.MinSyncPeriod)
		k.checkMasqBit("nftables.masqueradeBit", kp.NFTables.MasqueradeBit)
	}
	if mode == ModeIPVS {
		k.checkPeriods("ipvs-sync-period", "ipvs-min-sync-period", "ipvs", kp.IPVS.SyncPeriod, kp.IPVS.MinSyncPeriod)
		k.nonNegative("ipvs-tcp-timeout", "ipvs.tcpTimeout", kp.IPVS.TCPTimeout.Duration)
		k.nonNegative("ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", kp.IPVS.TCPFinTimeout.Duration)
		k.nonNegative("ipvs-udp-timeout", "ipvs.udpTimeout", kp.IPVS.UDPTimeout.Duration)
	}
	k.checkScheduler()
	if kp.ConfigSyncPeriod.Duration <= 0 {
		k.fail(k.name("config-sync-period", "configSyncPeriod"), kp.ConfigSyncPeriod.Duration.String(), "must be greater than 0")
	}

	// Conntrack.
	ct := &kp.Conntrack
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		k.fail(k.name("conntrack-max-per-core", "conntrack.maxPerCore"), itoa(int(*ct.MaxPerCore)), "must be 0 (leave as is) or greater")
	}
	if ct.Min != nil && *ct.Min < 0 {
		k.fail(k.name("conntrack-min", "conntrack.min"), itoa(int(*ct.Min)), "must be 0 or greater")
	}
	if ct.TCPEstablishedTimeout != nil {
		k.nonNegative("conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout.Duration)
	}
	if ct.TCPCloseWaitTimeout != nil {
		k.nonNegative("conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout.Duration)
	}
	k.nonNegative("conntrack-udp-timeout", "conntrack.udpTimeout", ct.UDPTimeout.Duration)
	k.nonNegative("conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", ct.UDPStreamTimeout.Duration)

	// Process and client.
	if p := kp.OOMScoreAdj; p != nil && (*p < -1000 || *p > 1000) {
		k.fail(k.name("oom-score-adj", "oomScoreAdj"), itoa(int(*p)), "must be within [-1000, 1000]")
	}
	if kp.ClientConnection.QPS < 0 {
		k.fail(k.name("kube-api-qps", "clientConnection.qps"), strconv.FormatFloat(float64(kp.ClientConnection.QPS), 'g', -1, 32), "must be 0 or greater")
	}
	if kp.ClientConnection.Burst < 0 {
		k.fail(k.name("kube-api-burst", "clientConnection.burst"), itoa(int(kp.ClientConnection.Burst)), "must be 0 or greater")
	}
	if v := kp.ShowHiddenMetricsForVersion; v != "" && !regexp.MustCompile(`^\d+\.\d+$`).MatchString(v) {
		k.fail(k.name("show-hidden-metrics-for-version", "showHiddenMetricsForVersion"), v, "want <major>.<minor>, e.g. 1.33")
	}
	if kp.PortRange != "" {
		k.warn("portRange %q is ignored (deprecated in kube-proxy, unused by vipproxy)", kp.PortRange)
	}

	k.checkDetectLocal()
	if !c.Cleanup {
		// --cleanup removes rules and needs no Node name, as kube-proxy's
		// (a host named "(none)", a fresh VM's, must still clean up).
		k.checkNodeName(h)
	}

	// vipproxy's own.
	if _, err := parseRegistry(c.Registry); err != nil {
		k.fail("--registry", c.Registry, "%v", err)
	} else if c.Registry != "" && c.Manifests == "" && !c.Cleanup {
		k.warn("--registry %q is only used in standalone mode (--manifests); ignored", c.Registry)
	}
	if strings.TrimSpace(c.StateDir) == "" {
		k.fail("--state-dir", c.StateDir, "must not be empty")
	}
	if c.CleanupKubeProxy && !c.Cleanup {
		k.fail("--cleanup-kube-proxy", "true", "only valid together with --cleanup")
	}

	// Logging.
	c.checkLogging(k)

	// Feature gates.
	probs, warns := checkFeatureGates(kp.FeatureGates)
	for _, p := range probs {
		k.fail(k.name("feature-gates", "featureGates"), (gatesValue{&kp.FeatureGates}).String(), "%s", p)
	}
	for _, w := range warns {
		k.warn("%s", w)
	}
	return k.errs, k.warns
}

// checkSource: exactly one of Kubernetes (kubeconfig, master or in-cluster)
// and standalone (manifests), unless --cleanup; with --write-config-to the
// source files need not exist on this host.
func (k *checker) checkSource(h Host) {
	c := k.c
	kubeconfig := c.KubeProxy.ClientConnection.Kubeconfig
	kcField := k.name("kubeconfig", "clientConnection.kubeconfig")
	kube := kubeconfig != "" || c.Master != ""
	switch {
	case kube && c.Manifests != "":
		given := kcField
		if kubeconfig == "" {
			given = "--master"
		}
		k.fail("--manifests", c.Manifests, "cannot be combined with %s: choose Kubernetes or standalone", given)
	case !kube && c.Manifests == "" && !c.Cleanup && c.WriteConfigTo == "":
		if h.Getenv("KUBERNETES_SERVICE_HOST") == "" || h.Getenv("KUBERNETES_SERVICE_PORT") == "" {
			k.fail(kcField, "", "no source: give --kubeconfig or --master (Kubernetes), or --manifests (standalone); not running in a pod either (KUBERNETES_SERVICE_HOST unset)")
		}
	}
	if c.Cleanup || c.WriteConfigTo != "" {
		return // --write-config-to only writes a file: the source need not exist here
	}
	if kubeconfig != "" {
		if fi, err := h.Stat(kubeconfig); err != nil {
			k.fail(kcField, kubeconfig, "cannot read: %v", err)
		} else if fi.IsDir() {
			k.fail(kcField, kubeconfig, "is a directory, want a kubeconfig file")
		}
	}
	if c.Manifests != "" {
		if fi, err := h.Stat(c.Manifests); err != nil {
			k.fail("--manifests", c.Manifests, "cannot read: %v", err)
		} else if !fi.IsDir() {
			k.fail("--manifests", c.Manifests, "not a directory")
		}
	}
}

// checkMode: a known mode, and one this host can run (not checked for
// --cleanup, which removes whatever any mode left, nor for
// --write-config-to, which runs nothing).
func (k *checker) checkMode(h Host) {
	c := k.c
	field := k.name("proxy-mode", "mode")
	mode := string(c.KubeProxy.Mode)
	switch mode {
	case "", ModeNFTables, ModeIPTables, ModeIPVS, ModeUserspace:
	case "kernelspace":
		k.fail(field, mode, "kernelspace is kube-proxy's Windows mode; want nftables, iptables, ipvs or userspace")
		return
	default:
		k.fail(field, mode, "unknown mode; want nftables, iptables, ipvs or userspace")
		return
	}
	if c.Cleanup || c.WriteConfigTo != "" {
		return
	}
	iptablesOK := func(why string) {
		for _, bin := range []string{"iptables-restore", "iptables-save"} {
			if _, err := h.LookPath(bin); err != nil {
				k.fail(field, mode, "%s needs %s, which is not in PATH (install iptables, or use --proxy-mode=userspace)", why, bin)
			}
		}
		if _, err := h.LookPath("ip6tables-restore"); err != nil && hasIPv6(c) {
			k.fail(field, mode, "%s needs ip6tables-restore for the IPv6 ranges, which is not in PATH", why)
		}
		ipt, iptKnown := h.KernelFeature("ip_tables")
		nft, nftKnown := h.KernelFeature("nf_tables")
		if iptKnown && nftKnown && !ipt && !nft {
			k.fail(field, mode, "%s needs ip_tables or nf_tables in the kernel; it has neither", why)
		}
	}
	switch c.Mode() {
	case ModeNFTables:
		if _, err := h.LookPath("nft"); err != nil {
			k.fail(field, ModeNFTables, "nftables mode needs the nft command, which is not in PATH (install nftables, or use --proxy-mode=iptables or userspace)")
		}
		if present, known := h.KernelFeature("nf_tables"); known && !present {
			k.fail(field, ModeNFTables, "the kernel has no nf_tables (CONFIG_NF_TABLES)")
		}
	case ModeIPTables:
		iptablesOK("iptables mode")
	case ModeIPVS:
		present, known := h.KernelFeature("ip_vs")
		switch {
		case known && !present:
			k.warn("the kernel has no IPVS (ip_vs): ipvs mode will fall back to iptables")
			iptablesOK("ipvs mode (falling back to iptables)")
		case !known:
			k.warn("cannot tell whether the kernel has IPVS; ipvs mode falls back to iptables if it has not")
			iptablesOK("ipvs mode (and its iptables fallback)")
		default:
			iptablesOK("ipvs mode")
			if _, err := h.LookPath("ipset"); err != nil {
				k.warn("ipvs mode: ipset is not in PATH")
			}
		}
	}
}

func hasIPv6(c *Config) bool {
	for _, p := range append(c.ClusterCIDRs(), c.ServiceCIDRs()...) {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}

// checkServiceRange: a CIDR or dual-stack pair, each with 2 to 20 host
// bits (kube-apiserver's limit: /12 for IPv4, /108 for IPv6).
func (k *checker) checkServiceRange() {
	s := k.c.ServiceClusterIPRange
	ps, err := parsePrefixList(s)
	switch {
	case err != nil:
		k.fail("--service-cluster-ip-range", s, "%v", err)
		return
	case len(ps) == 0:
		k.fail("--service-cluster-ip-range", s, "must not be empty")
		return
	}
	for _, p := range ps {
		host := p.Addr().BitLen() - p.Bits()
		switch {
		case host > 20:
			min := 12
			if p.Addr().Is6() {
				min = 108
			}
			k.fail("--service-cluster-ip-range", s, "%s is too large: the prefix length must be at least /%d", p, min)
		case host < 2:
			k.fail("--service-cluster-ip-range", s, "%s is too small: it must hold at least 4 addresses", p)
		}
	}
}

// checkNodePortAddresses: CIDRs and the keywords primary, all and
// localhost, in any combination (kube-proxy 1.37).
func (k *checker) checkNodePortAddresses() {
	list := k.c.KubeProxy.NodePortAddresses
	value := strings.Join(list, ",")
	field := k.name("nodeport-addresses", "nodePortAddresses")
	for _, s := range list {
		switch strings.TrimSpace(s) {
		case NodePortAddressesPrimary, NodePortAddressesAll, NodePortAddressesLocalhost:
			continue
		}
		if _, err := model.ParsePrefix(strings.TrimSpace(s)); err != nil {
			k.fail(field, value, "%q is not a CIDR or one of the keywords \"primary\", \"all\", \"localhost\"", s)
		}
	}
}

// checkPeriods: sync > 0, 0 ≤ min ≤ sync.
func (k *checker) checkPeriods(syncFlag, minFlag, section string, sync, min metav1.Duration) {
	syncField := k.name(syncFlag, section+".syncPeriod")
	minField := k.name(minFlag, section+".minSyncPeriod")
	if sync.Duration <= 0 {
		k.fail(syncField, sync.Duration.String(), "must be greater than 0")
	}
	if min.Duration < 0 {
		k.fail(minField, min.Duration.String(), "must be 0 or greater")
	}
	if sync.Duration > 0 && min.Duration > sync.Duration {
		k.fail(minField, min.Duration.String(), "must not exceed the sync period (%s)", sync.Duration)
	}
}

func (k *checker) checkMasqBit(field string, bit *int32) {
	if bit != nil && (*bit < 0 || *bit > 31) {
		k.fail(k.name("iptables-masquerade-bit", field), itoa(int(*bit)), "must be within [0, 31]")
	}
}

func (k *checker) nonNegative(flag, field string, d time.Duration) {
	if d < 0 {
		k.fail(k.name(flag, field), d.String(), "must be 0 (leave as is) or greater")
	}
}

// Schedulers accepted per mode. ipvs takes every scheduler kube-proxy
// accepts (the kernel implements them); userspace adds random.
var (
	baseSchedulers      = []string{"rr", "lc", "dh", "sh", "sed", "nq"}
	ipvsSchedulers      = append(append([]string{}, baseSchedulers...), "wrr", "wlc", "lblc", "lblcr", "mh")
	userspaceSchedulers = append(append([]string{}, baseSchedulers...), "random")
)

func (k *checker) checkScheduler() {
	s := k.c.KubeProxy.IPVS.Scheduler
	if s == "" {
		return
	}
	field := k.name("ipvs-scheduler", "ipvs.scheduler")
	has := func(list []string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	switch k.c.Mode() {
	case ModeIPVS:
		if !has(ipvsSchedulers) {
			k.fail(field, s, "unknown IPVS scheduler; want one of %s", strings.Join(ipvsSchedulers, ", "))
		}
	case ModeUserspace:
		if !has(userspaceSchedulers) {
			k.fail(field, s, "unknown scheduler; want one of %s", strings.Join(userspaceSchedulers, ", "))
		}
	default:
		if !has(ipvsSchedulers) && !has(userspaceSchedulers) {
			k.fail(field, s, "unknown scheduler; want one of %s", strings.Join(ipvsSchedulers, ", "))
		} else if s != "rr" {
			k.warn("scheduler %q is only used in ipvs and userspace modes; ignored in %s mode", s, k.c.Mode())
		}
	}
}

// ifaceName matches a Linux interface name (IFNAMSIZ-1 = 15 bytes, no
// slash, colon or white space).
var ifaceName = regexp.MustCompile(`^[^/:\s]{1,15}$`)

func (k *checker) checkDetectLocal() {
	kp := &k.c.KubeProxy
	field := k.name("detect-local-mode", "detectLocalMode")
	mode := string(kp.DetectLocalMode)
	switch mode {
	case "", LocalModeClusterCIDR:
		if kp.ClusterCIDR == "" {
			k.warn("detectLocalMode ClusterCIDR without a cluster CIDR: local traffic is not detected (set --cluster-cidr)")
		}
	case LocalModeNodeCIDR:
		if k.c.Manifests != "" {
			k.warn("detectLocalMode NodeCIDR in standalone mode: the Node manifest must carry spec.podCIDRs")
		}
	case LocalModeBridgeInterface:
		bf := k.name("pod-bridge-interface", "detectLocal.bridgeInterface")
		if b := kp.DetectLocal.BridgeInterface; !ifaceName.MatchString(b) {
			k.fail(bf, b, "detectLocalMode BridgeInterface needs a valid interface name (1-15 characters)")
		}
	case LocalModeInterfaceNamePrefix:
		pf := k.name("pod-interface-name-prefix", "detectLocal.interfaceNamePrefix")
		if p := kp.DetectLocal.InterfaceNamePrefix; !ifaceName.MatchString(p) {
			k.fail(pf, p, "detectLocalMode InterfaceNamePrefix needs a valid interface name prefix (1-15 characters)")
		}
	default:
		k.fail(field, mode, "unknown mode; want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	}
}

// dns1123Subdomain is what a Node name must be.
var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func (k *checker) checkNodeName(h Host) {
	name := strings.ToLower(strings.TrimSpace(k.c.KubeProxy.HostnameOverride))
	field := "--hostname-override"
	if k.c.overrides.hostname == nil && k.c.ConfigFile != "" {
		field = "hostnameOverride"
	}
	given := k.c.KubeProxy.HostnameOverride
	if name == "" {
		if k.c.overrides.hostname != nil && *k.c.overrides.hostname != "" {
			k.fail(field, *k.c.overrides.hostname, "empty after trimming spaces")
			return
		}
		hn, err := h.Hostname()
		if err != nil {
			k.fail(field, "", "not set and the hostname cannot be read: %v", err)
			return
		}
		name = strings.ToLower(strings.TrimSpace(hn))
		if len(name) > 253 || !dns1123Subdomain.MatchString(name) {
			k.fail("hostname", hn, "this host's name is not a valid Node name (a DNS-1123 subdomain); set --hostname-override")
		}
		return
	}
	if len(name) > 253 || !dns1123Subdomain.MatchString(name) {
		k.fail(field, given, "not a valid Node name (a lower-case DNS-1123 subdomain)")
	}
}
