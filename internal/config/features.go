package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Feature gate stages.
const (
	stageAlpha = "ALPHA"
	stageBeta  = "BETA"
	stageGA    = "GA"
)

type featureGate struct {
	def    bool
	stage  string
	locked bool // GA and locked to def: setting the other value is an error
	note   string
}

// featureGates are the gates vipproxy accepts, with kube-proxy v1.34's
// defaults. Locked gates may be set only to their default, as upstream.
// Gates that only concern other components are accepted so that an
// existing kube-proxy configuration keeps working.
var featureGates = map[string]featureGate{
	// Honoured by vipproxy.
	"PreferSameTrafficDistribution":     {def: true, stage: stageBeta, note: "trafficDistribution PreferSameZone / PreferSameNode"},
	"ServiceTrafficDistribution":        {def: true, stage: stageGA, locked: true, note: "trafficDistribution PreferClose"},
	"TopologyAwareHints":                {def: true, stage: stageGA, locked: true, note: "EndpointSlice zone hints"},
	"ServiceIPStaticSubrange":           {def: true, stage: stageGA, locked: true, note: "static/dynamic ClusterIP bands (standalone allocator)"},
	"KubeProxyDrainingTerminatingNodes": {def: true, stage: stageGA, locked: true, note: "healthz fails while the Node is being deleted"},
	"NFTablesProxyMode":                 {def: true, stage: stageGA, locked: true, note: "the nftables mode"},
	// client-go's gate, in kube-proxy's registry too: with it the informers
	// stream their first state as watch events instead of one LIST. Off,
	// as in kube-proxy v1.34; at 10,000 Services the stream took twice as
	// long to sync (BENCHMARKS.md, issue 18). Read at start only.
	"WatchListClient": {def: false, stage: stageBeta, note: "informers start from a watch-list stream, not a LIST (read at start)"},
	// Accepted for compatibility.
	"MultiCIDRServiceAllocator": {def: false, stage: stageBeta},
	"LoggingAlphaOptions":       {def: false, stage: stageAlpha},
	"LoggingBetaOptions":        {def: true, stage: stageBeta},
	"ContextualLogging":         {def: true, stage: stageBeta},
	"ComponentFlagz":            {def: false, stage: stageAlpha},
	"ComponentStatusz":          {def: false, stage: stageAlpha},
	"WinDSR":                    {def: false, stage: stageAlpha},
	"WinOverlay":                {def: true, stage: stageBeta},
	"AllAlpha":                  {def: false, stage: stageAlpha, note: "all alpha gates"},
	"AllBeta":                   {def: false, stage: stageBeta, note: "all beta gates"},
}

// FeatureGateNames returns every known gate name, sorted.
func FeatureGateNames() []string {
	return slices.Sorted(maps.Keys(featureGates))
}

// featureEnabled resolves one gate against explicit settings.
func featureEnabled(set map[string]bool, name string) bool {
	g, known := featureGates[name]
	if !known {
		return false
	}
	if g.locked {
		return g.def
	}
	if v, ok := set[name]; ok {
		return v
	}
	if v, ok := set["AllAlpha"]; ok && g.stage == stageAlpha && name != "AllAlpha" {
		return v
	}
	if v, ok := set["AllBeta"]; ok && g.stage == stageBeta && name != "AllBeta" {
		return v
	}
	return g.def
}

// checkFeatureGates returns one problem per locked gate set to its
// non-default value (fatal, as in kube-proxy), and one warning per gate
// vipproxy does not know: kube-proxy accepts every Kubernetes gate (they
// share one registry), so a gate meant for another component must not
// stop vipproxy; it has no effect here.
func checkFeatureGates(set map[string]bool) (probs, warns []string) {
	for _, name := range slices.Sorted(maps.Keys(set)) {
		g, ok := featureGates[name]
		switch {
		case !ok:
			warns = append(warns, fmt.Sprintf("feature gate %q is unknown to vipproxy and has no effect here (known: %s)", name, strings.Join(FeatureGateNames(), ", ")))
		case g.locked && set[name] != g.def:
			probs = append(probs, fmt.Sprintf("feature gate %q is GA and locked to %t", name, g.def))
		}
	}
	return probs, warns
}

// featureGatesHelp describes the known gates for --help.
func featureGatesHelp() string {
	var b strings.Builder
	for _, name := range FeatureGateNames() {
		g := featureGates[name]
		fmt.Fprintf(&b, "\n%s=true|false (%s - default=%t)", name, g.stage, g.def)
	}
	return b.String()
}

// gatesValue is the pflag.Value of --feature-gates: "A=true,B=false",
// repeatable, merging into one map.
type gatesValue struct{ m *map[string]bool }

var _ pflag.Value = gatesValue{}

func (v gatesValue) String() string {
	if v.m == nil || len(*v.m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(*v.m)) {
		parts = append(parts, fmt.Sprintf("%s=%t", k, (*v.m)[k]))
	}
	return strings.Join(parts, ",")
}

func (v gatesValue) Set(s string) error {
	if *v.m == nil {
		*v.m = map[string]bool{}
	}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("missing bool value for %q", kv)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("invalid value of %s: %s, want true or false", k, val)
		}
		(*v.m)[strings.TrimSpace(k)] = b
	}
	return nil
}

func (v gatesValue) Type() string { return "mapStringBool" }
