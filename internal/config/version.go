package config

import "runtime/debug"

// KubeProxyVersion is the kube-proxy release whose flags, configuration and
// metrics vipproxy follows.
const KubeProxyVersion = "v1.34"

// VersionString returns what --version prints: vipproxy's module version
// and commit (from the build information) and the kube-proxy release it
// is a drop-in for.
func VersionString() string {
	version, commit := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				commit = " " + s.Value[:12]
			}
		}
	}
	return "vipproxy " + version + commit + " (kube-proxy " + KubeProxyVersion + " compatible)"
}
