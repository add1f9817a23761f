package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// Changes lists the KubeProxyConfiguration fields that differ between old
// and new, as sorted file field paths ("mode", "iptables.syncPeriod",
// "featureGates.AllBeta"), for a live reload to log and act on (a "mode"
// change means switching dataplanes). vipproxy's own flag-level settings
// are not compared: Reload carries them over unchanged.
func Changes(old, new *Config) []string {
	a, b := flatten(&old.KubeProxy), flatten(&new.KubeProxy)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if bv, ok := b[k]; !ok || !reflect.DeepEqual(a[k], bv) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// flatten turns v's JSON form into path → leaf value.
func flatten(v any) map[string]any {
	data, err := json.Marshal(v)
	if err != nil {
		return map[string]any{"": fmt.Sprint(err)}
	}
	var tree any
	if err := json.Unmarshal(data, &tree); err != nil {
		return map[string]any{"": fmt.Sprint(err)}
	}
	out := map[string]any{}
	var walk func(prefix string, n any)
	walk = func(prefix string, n any) {
		m, ok := n.(map[string]any)
		if !ok || len(m) == 0 {
			out[prefix] = n
			return
		}
		for k, v := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			walk(p, v)
		}
	}
	walk("", tree)
	return out
}
