//go:build linux

package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vpe2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	SetBuildDir(dir)
	if os.Geteuid() == 0 {
		SweepStale()
	}
	code := m.Run()
	os.RemoveAll(dir)
	if leaked := ownNamespaces(); len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: namespaces left behind (deleting them now): %v\n", leaked)
		SweepOwn()
		code = 1
	}
	os.Exit(code)
}

// modeSpec describes how a proxy mode is exercised. Adding a mode to the
// suite is adding an entry here (and naming it in VIPPROXY_E2E_MODES).
type modeSpec struct {
	// Name names the subtests and VIPPROXY_E2E_MODES entry.
	Name string
	// Proxy is the --proxy-mode vipproxy runs with; empty means Name.
	// Specs that share a proxy mode differ in the node they run on (Setup).
	Proxy string
	// Setup lists commands run in each node namespace before vipproxy
	// starts there: what the node's kubelet or distribution would leave.
	Setup [][]string
	// Tamper lists commands (run in the node namespace) that remove or empty
	// the mode's rules; scenario 12 expects each to be repaired within one
	// syncPeriod. Empty: the mode has no kernel rules to tamper with.
	Tamper [][]string
	// Tools the mode needs inside the node namespace.
	Tools []string
	// Userspace is true for a mode that proxies in the vipproxy process: the
	// backend sees the proxy's address, never the client's, and connections
	// end with the process (scenarios 6 and 11 adapt).
	Userspace bool
}

// proxy returns the --proxy-mode the spec runs vipproxy with.
func (m modeSpec) proxy() string {
	if m.Proxy != "" {
		return m.Proxy
	}
	return m.Name
}

// iptablesTamper removes or empties the tables iptables-nft keeps vipproxy's
// rules in, without depending on chain names.
var iptablesTamper = [][]string{
	{"nft", "delete", "table", "ip", "nat"},
	{"iptables", "-t", "nat", "-F"},
	{"nft", "delete", "table", "ip6", "nat"},
	// One rule (the Service's dispatch): found by the periodic drift check.
	{"sh", "-c", `iptables -t nat -D VIP-SERVICES $(iptables -t nat -L VIP-SERVICES -n --line-numbers | awk '/10\.96\.0\.120/ {print $1; exit}')`},
}

// realIPVSTamper damages ipvs mode on a kernel with IPVS (the QEMU guests):
// its iptables tables, and virtual servers deleted by hand (found by the
// periodic drift check).
var realIPVSTamper = [][]string{
	{"nft", "delete", "table", "ip", "nat"},
	{"iptables", "-t", "nat", "-F"},
	{"ipvsadm", "-D", "-t", "10.96.0.120:80"},
	{"ipvsadm", "-D", "-t", "[fd00:96::78]:80"},
}

// legacyTamper is iptablesTamper for iptables mode on the iptables-legacy
// backend (the chains live in the kernel's x_tables, not in nft tables).
var legacyTamper = [][]string{
	{"iptables-legacy", "-t", "nat", "-F"},
	{"ip6tables-legacy", "-t", "nat", "-F"},
	{"sh", "-c", `iptables-legacy -t nat -D VIP-SERVICES $(iptables-legacy -t nat -L VIP-SERVICES -n --line-numbers | awk '/10\.96\.0\.120/ {print $1; exit}')`},
}

var modeSpecs = map[string]modeSpec{
	"nftables": {
		Name: "nftables",
		Tamper: [][]string{
			{"nft", "delete", "table", "ip", "vipproxy"},
			{"nft", "flush", "table", "ip", "vipproxy"},
			{"nft", "delete", "table", "ip6", "vipproxy"},
			// One map element: found by the periodic drift check.
			{"nft", "delete", "element", "ip", "vipproxy", "service-ips", "{ 10.96.0.120 . tcp . 80 }"},
			{"nft", "delete", "element", "ip6", "vipproxy", "service-ips", "{ fd00:96::78 . tcp . 80 }"},
		},
		Tools: []string{"nft"},
	},
	"iptables": {Name: "iptables", Tamper: iptablesTamper, Tools: []string{"iptables", "iptables-restore", "iptables-save"}},
	// iptables mode on a legacy node: kubelet left its hint chain in
	// iptables-legacy's mangle table, so vipproxy (as kube-proxy) programs
	// the legacy backend.
	"iptables-legacy": {
		Name: "iptables-legacy", Proxy: "iptables", Tamper: legacyTamper,
		Setup: [][]string{
			{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
			{"ip6tables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
		},
		Tools: []string{"iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy"},
	},
	// ipvs falls back to iptables on a kernel without IPVS.
	"ipvs": {Name: "ipvs", Tamper: iptablesTamper, Tools: []string{"iptables", "iptables-restore", "iptables-save"}},
	// userspace owns its VIPs as addresses on lo (global scope; 127.0.0.1
	// is host scope and survives the flush).
	"userspace": {Name: "userspace", Userspace: true, Tamper: [][]string{
		{"ip", "-4", "addr", "flush", "dev", "lo", "scope", "global"},
		{"ip", "-6", "addr", "flush", "dev", "lo", "scope", "global"},
	}},
}

// defaultModes are the modes tested when $VIPPROXY_E2E_MODES is unset: every
// mode vipproxy has, and iptables mode on the legacy backend.
const defaultModes = "nftables,iptables,iptables-legacy,ipvs,userspace"

// modes returns the modes to test: $VIPPROXY_E2E_MODES (comma-separated) or
// defaultModes.
func modes() []modeSpec {
	env := os.Getenv("VIPPROXY_E2E_MODES")
	if env == "" {
		env = defaultModes
	}
	var out []modeSpec
	for _, name := range strings.Split(env, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		spec, ok := modeSpecs[name]
		if !ok {
			spec = modeSpec{Name: name}
		}
		if name == "ipvs" && realIPVS() {
			spec.Tamper, spec.Tools = realIPVSTamper, append(slices.Clone(spec.Tools), "ipvsadm")
		}
		out = append(out, spec)
	}
	return out
}

// forEachMode runs fn as a parallel subtest per mode (named by the mode, so
// -run 'TestX/nftables' selects one). The parent is parallel too: every
// scenario has its own namespaces, and -parallel bounds the concurrency.
func forEachMode(t *testing.T, fn func(t *testing.T, mode modeSpec)) {
	t.Parallel()
	for _, m := range modes() {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, m)
		})
	}
}

// eventually calls f every interval until it returns nil or timeout passes,
// and returns the time it took or the last error.
func eventually(timeout, interval time.Duration, f func() error) (time.Duration, error) {
	timeout = Scaled(timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := f()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("not within %v: %w", timeout, err)
		}
		time.Sleep(interval)
	}
}
