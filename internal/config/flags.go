package config

import (
	"errors"
	"fmt"
	"io"
	logsapi "k8s.io/component-base/logs/api/v1"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// ErrHelp is returned (wrapped) by Parse when --help, -h or --version was given; the
// help text has been written to stdout and the caller should exit 0.
var ErrHelp = errors.New("help requested")

// flagGroup is one titled section of --help.
type flagGroup struct {
	title string
	fs    *pflag.FlagSet
}

// notFromFile are the flags that are not part of the configuration file
// and therefore apply even with --config. Every other flag maps into
// KubeProxyConfiguration and is ignored when --config is given.
var notFromFile = map[string]bool{
	"help": true, "config": true, "write-config-to": true, "cleanup": true,
	"master": true, "hostname-override": true,
	"manifests": true, "state-dir": true, "registry": true,
	"service-cluster-ip-range": true, "service-node-port-range": true,
	"cleanup-kube-proxy": true,
	"outlier-ejection":   true, "outlier-failures": true, "outlier-window": true, "outlier-base-ejection": true,
	"outlier-max-ejected-percent": true, "endpoint-metrics-services": true,
}

// flagVals holds the flags that do not map one-to-one into a field.
type flagVals struct {
	help, version                        bool
	bootIDFile, machineIDFile            string
	hostname                             string
	logging                              logsapi.LoggingConfiguration
	iptSync, iptMinSync                  time.Duration
	ipvsSync, ipvsMinSync                time.Duration
	masqAll                              bool
	masqBit                              int32
	healthzPort, metricsPort             int32
	nodePortAddresses, ipvsExcludeCIDRs  []string
	healthzBindAddress, metricsBindAddr  string
	kubeconfig                           string
	bridgeInterface, interfaceNamePrefix string
}

// Parse parses kube-proxy's command line (plus vipproxy's own flags) into
// a fully defaulted Config. It does not validate: call Validate next.
//
// Flags have kube-proxy's names, meanings and defaults, parsed with pflag
// like kube-proxy's (so -v=2, -v 2, --v=2 and --v 2 all work), with one
// difference: the default --proxy-mode is nftables.
//
// Precedence follows kube-proxy v1.34 (cmd/kube-proxy/app/options.go,
// Options.Complete): without --config, each flag given overrides the
// default. With --config, the file is the whole KubeProxyConfiguration
// and every flag that maps into it (--proxy-mode, --cluster-cidr,
// --kubeconfig, --feature-gates, --conntrack-*, …) is ignored — kube-proxy
// ignores them silently, vipproxy lists them in Config.IgnoredFlags for
// the caller to warn about. Exceptions, which win over the file as in
// kube-proxy: the logging flags (-v, --logging-format) and
// --hostname-override. --master, --cleanup, --write-config-to and
// vipproxy's own flags are not in the file and always apply.
//
// --iptables-sync-period, --iptables-min-sync-period, --masquerade-all
// and --iptables-masquerade-bit set both the iptables and the nftables
// sections (kube-proxy's flags feed whichever mode runs); the ipvs
// periods set the ipvs section.
//
// --help / -h writes grouped help to stdout and returns an error wrapping
// ErrHelp. A flag that does not parse, an unknown flag or a positional
// argument is an error naming it. A --config file that cannot be read or
// decoded is an error (see LoadFile).
func Parse(args []string, stdout io.Writer) (*Config, error) {
	c := &Config{}
	fk := Default().KubeProxy // flag-bound KubeProxyConfiguration, defaults shown in help
	var v flagVals
	groups := defineFlags(c, &fk, &v)

	fs := pflag.NewFlagSet("vipproxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SortFlags = false
	for _, g := range groups {
		fs.AddFlagSet(g.fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			writeHelp(stdout, groups)
			return nil, fmt.Errorf("config: %w", ErrHelp)
		}
		return nil, fmt.Errorf("config: flags: %w (see --help)", err)
	}
	if v.help {
		writeHelp(stdout, groups)
		return nil, fmt.Errorf("config: %w", ErrHelp)
	}
	if v.version {
		fmt.Fprintln(stdout, VersionString())
		return nil, fmt.Errorf("config: %w", ErrHelp)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("config: flags: vipproxy takes no arguments, got %q (see --help)", fs.Args())
	}

	if v.hostname != "" { // as kube-proxy: an empty value does not override
		h := v.hostname
		c.overrides.hostname = &h
	}
	for _, name := range loggingFlags {
		if fs.Changed(name) {
			c.overrides.logging = &v.logging
			c.overrides.loggingFlags = append(c.overrides.loggingFlags, name)
		}
	}

	if c.ConfigFile != "" {
		kp, warns, err := LoadLenient(c.ConfigFile)
		if err != nil {
			return nil, err
		}
		c.parseWarns = append(c.parseWarns, warns...)
		c.KubeProxy = *kp
		c.ModeDefaulted = kp.Mode == ""
		fs.Visit(func(f *pflag.Flag) {
			if !notFromFile[f.Name] {
				c.IgnoredFlags = append(c.IgnoredFlags, "--"+f.Name)
			}
		})
		c.complete()
		return c, nil
	}

	applyFlags(fs, &fk, &v)
	c.KubeProxy = fk
	c.ModeDefaulted = !fs.Changed("proxy-mode")
	c.completeFlags()
	// Deprecated --healthz-port / --metrics-port, as kube-proxy applies
	// them when there is no config file: 0 disables the server.
	for _, d := range []struct {
		name string
		port int32
		addr *string
	}{
		{"healthz-port", v.healthzPort, &c.KubeProxy.HealthzBindAddress},
		{"metrics-port", v.metricsPort, &c.KubeProxy.MetricsBindAddress},
	} {
		if !fs.Changed(d.name) {
			continue
		}
		c.parseWarns = append(c.parseWarns, fmt.Sprintf("--%s is deprecated; use --%s-bind-address", d.name, strings.TrimSuffix(d.name, "-port")))
		if d.port == 0 {
			*d.addr = ""
			continue
		}
		if host, _, err := net.SplitHostPort(*d.addr); err == nil {
			*d.addr = net.JoinHostPort(host, itoa(int(d.port)))
		}
	}
	c.Warnings = append([]string(nil), c.parseWarns...)
	return c, nil
}

// applyFlags copies the flags that do not bind directly into fk.
func applyFlags(fs *pflag.FlagSet, fk *kpv1alpha1.KubeProxyConfiguration, v *flagVals) {
	ch := fs.Changed
	if ch("kubeconfig") {
		fk.ClientConnection.Kubeconfig = v.kubeconfig
	}
	if ch("iptables-sync-period") {
		fk.IPTables.SyncPeriod.Duration = v.iptSync
		fk.NFTables.SyncPeriod.Duration = v.iptSync
	}
	if ch("iptables-min-sync-period") {
		fk.IPTables.MinSyncPeriod.Duration = v.iptMinSync
		fk.NFTables.MinSyncPeriod.Duration = v.iptMinSync
	}
	if ch("ipvs-sync-period") {
		fk.IPVS.SyncPeriod.Duration = v.ipvsSync
	}
	if ch("ipvs-min-sync-period") {
		fk.IPVS.MinSyncPeriod.Duration = v.ipvsMinSync
	}
	if ch("masquerade-all") {
		fk.IPTables.MasqueradeAll = v.masqAll
		fk.NFTables.MasqueradeAll = v.masqAll
	}
	if ch("iptables-masquerade-bit") {
		fk.IPTables.MasqueradeBit = ptr(v.masqBit)
		fk.NFTables.MasqueradeBit = ptr(v.masqBit)
	}
	if ch("nodeport-addresses") {
		fk.NodePortAddresses = v.nodePortAddresses
	}
	if ch("ipvs-exclude-cidrs") {
		fk.IPVS.ExcludeCIDRs = v.ipvsExcludeCIDRs
	}
	if ch("pod-bridge-interface") {
		fk.DetectLocal.BridgeInterface = v.bridgeInterface
	}
	if ch("pod-interface-name-prefix") {
		fk.DetectLocal.InterfaceNamePrefix = v.interfaceNamePrefix
	}
	// Health and metrics addresses follow the bind address's family unless
	// given (SetDefaults recomputes them when empty).
	fk.HealthzBindAddress, fk.MetricsBindAddress = "", ""
	if ch("healthz-bind-address") {
		fk.HealthzBindAddress = v.healthzBindAddress
	}
	if ch("metrics-bind-address") {
		fk.MetricsBindAddress = v.metricsBindAddr
	}
}

// defineFlags declares every flag, grouped for --help.
func defineFlags(c *Config, fk *kpv1alpha1.KubeProxyConfiguration, v *flagVals) []flagGroup {
	newFS := func() *pflag.FlagSet {
		fs := pflag.NewFlagSet("", pflag.ContinueOnError)
		fs.SortFlags = false
		return fs
	}
	const ignored = " Ignored when --config is given."

	gen := newFS()
	gen.StringVar(&c.ConfigFile, "config", "", "The path to the KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON). It replaces every flag that maps into it; the logging flags (-v, --vmodule, --logging-format, ...) and --hostname-override still win.")
	gen.StringVar(&c.WriteConfigTo, "write-config-to", "", "If set, write the configuration (defaults plus flags or --config) to this file and exit.")
	gen.BoolVar(&c.Cleanup, "cleanup", false, "If true, remove everything any vipproxy mode installed (tables, chains, sets, addresses, changed sysctls) and exit.")
	gen.Var(gatesValue{&fk.FeatureGates}, "feature-gates", "A set of key=value pairs that describe feature gates (names vipproxy does not know are accepted with a warning, as kube-proxy accepts every Kubernetes gate)."+ignored+" Options are:"+featureGatesHelp())
	gen.Int32Var(fk.OOMScoreAdj, "oom-score-adj", *fk.OOMScoreAdj, "The oom-score-adj value for the vipproxy process, within [-1000, 1000]."+ignored)
	gen.BoolVar(&c.InitOnly, "init-only", false, "If true, apply the settings that need full root privileges (conntrack sysctls) and exit; run again with only CAP_NET_ADMIN.")
	gen.BoolVar(&v.version, "version", false, "Print the version and exit.")
	gen.StringVar(&v.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "Accepted for kube-proxy compatibility; vipproxy does not read it.")
	gen.StringVar(&v.machineIDFile, "machine-id-file", "/etc/machine-id,/var/lib/dbus/machine-id", "Accepted for kube-proxy compatibility; vipproxy does not read it.")
	gen.BoolVarP(&v.help, "help", "h", false, "Show this help and exit.")

	src := newFS()
	src.StringVar(&v.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file with authorization information (the API server location can be overridden by --master)."+ignored)
	src.StringVar(&c.Master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	src.StringVar(&v.hostname, "hostname-override", "", "If non-empty, the name of this Node (else the hostname); lower-cased. Wins over the file's hostnameOverride.")
	src.StringVar(&fk.ClientConnection.ContentType, "kube-api-content-type", fk.ClientConnection.ContentType, "Content type of requests sent to the API server."+ignored)
	src.Float32Var(&fk.ClientConnection.QPS, "kube-api-qps", fk.ClientConnection.QPS, "QPS to use while talking with the API server."+ignored)
	src.Int32Var(&fk.ClientConnection.Burst, "kube-api-burst", fk.ClientConnection.Burst, "Burst to use while talking with the API server."+ignored)
	src.DurationVar(&fk.ConfigSyncPeriod.Duration, "config-sync-period", fk.ConfigSyncPeriod.Duration, "How often configuration from the API server is refreshed. Must be greater than 0."+ignored)

	px := newFS()
	px.StringVar((*string)(&fk.Mode), "proxy-mode", string(fk.Mode), "Which proxy mode to use: 'nftables' (the default), 'iptables', 'ipvs' (falls back to iptables when the kernel has no IPVS) or 'userspace'."+ignored)
	px.StringVar(&fk.ClusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster (a comma-separated dual-stack pair is allowed). With --detect-local-mode=ClusterCIDR, traffic from it is local."+ignored)
	px.StringSliceVar(&v.nodePortAddresses, "nodeport-addresses", nil, "CIDR ranges of the node IPs NodePorts accept connections on, with the keywords 'primary' (the node's primary IPs), 'localhost' (127.0.0.1 and ::1, served by vipproxy's userspace proxy: no route_localnet) and 'all', in any combination. If unset: every local address in iptables and ipvs mode, the primary IPs in nftables and userspace mode."+ignored)
	px.BoolVar(&v.masqAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs."+ignored)
	px.StringVar(&fk.BindAddress, "bind-address", fk.BindAddress, "Overrides vipproxy's idea of the node's primary IP (no socket is bound to it)."+ignored)
	px.StringVar((*string)(&fk.DetectLocalMode), "detect-local-mode", string(fk.DetectLocalMode), "How local (pod) traffic is detected: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix."+ignored)
	px.StringVar(&v.bridgeInterface, "pod-bridge-interface", "", "With --detect-local-mode=BridgeInterface, traffic from this bridge is local."+ignored)
	px.StringVar(&v.interfaceNamePrefix, "pod-interface-name-prefix", "", "With --detect-local-mode=InterfaceNamePrefix, traffic from interfaces with this name prefix is local."+ignored)
	px.DurationVar(&v.iptSync, "iptables-sync-period", fk.IPTables.SyncPeriod.Duration, "How often rules are fully resynchronized in iptables and nftables modes (e.g. '5s', '1m'). Must be greater than 0."+ignored)
	px.DurationVar(&v.iptMinSync, "iptables-min-sync-period", fk.IPTables.MinSyncPeriod.Duration, "The minimum period between rule syncs in iptables and nftables modes; 0 syncs on every change."+ignored)
	px.Int32Var(&v.masqBit, "iptables-masquerade-bit", *fk.IPTables.MasqueradeBit, "The bit of the fwmark space that marks packets needing SNAT, within [0, 31]."+ignored)
	px.BoolVar(fk.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *fk.IPTables.LocalhostNodePorts, "In iptables mode, answer NodePorts on 127.0.0.1 when nodePortAddresses holds it (as by default), as kube-proxy does, but through vipproxy's userspace proxy: route_localnet stays off."+ignored)
	px.StringVar(&fk.IPVS.Scheduler, "ipvs-scheduler", "", "The IPVS scheduler: rr (default), lc, dh, sh, sed or nq; 'random' only in userspace mode."+ignored)
	px.DurationVar(&v.ipvsSync, "ipvs-sync-period", fk.IPVS.SyncPeriod.Duration, "How often rules are fully resynchronized in ipvs mode. Must be greater than 0."+ignored)
	px.DurationVar(&v.ipvsMinSync, "ipvs-min-sync-period", fk.IPVS.MinSyncPeriod.Duration, "The minimum period between rule syncs in ipvs mode; 0 syncs on every change."+ignored)
	px.StringSliceVar(&v.ipvsExcludeCIDRs, "ipvs-exclude-cidrs", nil, "CIDRs whose IPVS rules vipproxy never touches when cleaning up."+ignored)
	px.BoolVar(&fk.IPVS.StrictARP, "ipvs-strict-arp", false, "Enable strict ARP (arp_ignore=1, arp_announce=2)."+ignored)
	px.DurationVar(&fk.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "Idle timeout of IPVS TCP connections, 0 to leave as is."+ignored)
	px.DurationVar(&fk.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "Timeout of IPVS TCP connections after a FIN, 0 to leave as is."+ignored)
	px.DurationVar(&fk.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "Timeout of IPVS UDP packets, 0 to leave as is."+ignored)

	ct := newFS()
	ct.Int32Var(fk.Conntrack.MaxPerCore, "conntrack-max-per-core", *fk.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as is and ignore --conntrack-min)."+ignored)
	ct.Int32Var(fk.Conntrack.Min, "conntrack-min", *fk.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of --conntrack-max-per-core."+ignored)
	ct.DurationVar(&fk.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", fk.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as is)."+ignored)
	ct.DurationVar(&fk.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", fk.Conntrack.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state (0 to leave as is)."+ignored)
	ct.BoolVar(&fk.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "Enable liberal TCP tracking (nf_conntrack_tcp_be_liberal=1)."+ignored)
	ct.DurationVar(&fk.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "Idle timeout for UNREPLIED UDP connections (0 to leave as is)."+ignored)
	ct.DurationVar(&fk.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "Idle timeout for ASSURED UDP connections (0 to leave as is)."+ignored)

	hm := newFS()
	hm.StringVar(&v.healthzBindAddress, "healthz-bind-address", fk.HealthzBindAddress, "The IP:port of the health server (/healthz, /livez)."+ignored)
	hm.StringVar(&v.metricsBindAddr, "metrics-bind-address", fk.MetricsBindAddress, "The IP:port of the metrics server (/metrics, /proxyMode, /configz); '0.0.0.0:10249' or '[::]:10249' binds all interfaces."+ignored)
	hm.BoolVar(&fk.BindAddressHardFail, "bind-address-hard-fail", false, "If true, failing to bind a health or metrics port is fatal."+ignored)
	hm.BoolVar(&fk.EnableProfiling, "profiling", false, "If true, serve /debug/pprof on the metrics address."+ignored)
	hm.StringVar(&fk.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", "The previous version for which to show hidden metrics (<major>.<minor>)."+ignored)
	hm.Int32Var(&v.healthzPort, "healthz-port", HealthzPort, "Deprecated: use --healthz-bind-address. 0 disables.")
	hm.Int32Var(&v.metricsPort, "metrics-port", MetricsPort, "Deprecated: use --metrics-bind-address. 0 disables.")
	_ = hm.MarkHidden("healthz-port")
	_ = hm.MarkHidden("metrics-port")

	// kube-proxy's logging flags, from component-base as kube-proxy
	// defines them; each wins over the file's logging section.
	lg := newFS()
	v.logging = *logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(&v.logging, lg)

	own := newFS()
	own.StringVar(&c.Manifests, "manifests", "", "Standalone mode: a directory of Service / EndpointSlice (and optional Node) YAML to serve instead of a Kubernetes API server.")
	own.StringVar(&c.StateDir, "state-dir", DefaultStateDir, "Where state that outlives the process lives: the standalone allocation database and the journal of changed sysctls (what --cleanup restores).")
	own.StringVar(&c.Registry, "registry", "", "Where standalone ClusterIP / NodePort allocations are stored: empty for a bbolt file in --state-dir, or etcd://host:port[,host:port] to share them between hosts.")
	own.StringVar(&c.ServiceClusterIPRange, "service-cluster-ip-range", DefaultServiceClusterIPRange, "Standalone: the ClusterIP range(s), one CIDR or a comma-separated dual-stack pair.")
	own.StringVar(&c.ExternalIPCIDRs, "external-ip-cidrs", "", "Comma-separated CIDRs that spec.externalIPs must fall in; empty allows any externalIP not refused anyway (loopback, link-local, multicast, unspecified, a ClusterIP, the standalone service range).")
	own.StringVar(&c.ServiceNodePortRange, "service-node-port-range", DefaultServiceNodePortRange, "Standalone: the NodePort range, 'lo-hi' or 'lo+n', within 1-65535.")
	own.BoolVar(&c.CleanupKubeProxy, "cleanup-kube-proxy", false, "With --cleanup, also remove kube-proxy's leftovers (for migrations).")
	own.BoolVar(&c.OutlierEjection, "outlier-ejection", false, "Eject endpoints whose new connections keep failing, for Services without a vipproxy.io/outlier-ejection annotation (\"on\" or \"off\" on a Service wins).")
	own.IntVar(&c.OutlierFailures, "outlier-failures", 3, "Outlier ejection: failed new connections in a row (refused, or unanswered for 1 s) that eject an endpoint.")
	own.DurationVar(&c.OutlierWindow, "outlier-window", 10*time.Second, "Outlier ejection: the failures must fall within this time.")
	own.DurationVar(&c.OutlierBaseEjection, "outlier-base-ejection", 5*time.Second, "Outlier ejection: how long a first ejection lasts; it doubles each time the endpoint is ejected again (up to 5m).")
	own.IntVar(&c.EndpointMetricsServices, "endpoint-metrics-services", 0, "Export per-endpoint connection metrics (new, failed, live, from conntrack events) for the N Service ports with the most new connections; 0 turns them off.")
	own.IntVar(&c.OutlierMaxEjectedPercent, "outlier-max-ejected-percent", 50, "Outlier ejection: the largest share of a Service's endpoints ejected at once (its last endpoint never is).")

	return []flagGroup{
		{"General", gen},
		{"Source (Kubernetes API)", src},
		{"Proxy", px},
		{"Conntrack", ct},
		{"Health and metrics", hm},
		{"Logging", lg},
		{"vipproxy", own},
	}
}

func writeHelp(w io.Writer, groups []flagGroup) {
	fmt.Fprint(w, `vipproxy gives Services virtual IPs: a drop-in, faster kube-proxy that also
runs standalone from a directory of Service / EndpointSlice YAML.

Usage:
  vipproxy --kubeconfig FILE [flags]     on a Kubernetes node
  vipproxy --manifests DIR [flags]       standalone
  vipproxy --config FILE [flags]         kube-proxy's KubeProxyConfiguration file
  vipproxy --cleanup                     remove everything vipproxy installed
`)
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n%s", g.title, g.fs.FlagUsagesWrapped(100))
	}
}
