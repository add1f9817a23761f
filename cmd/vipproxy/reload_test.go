package main

import (
	"io"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/dataplane"
)

// TestRebuildReasons: a reload builds a new dataplane exactly when what it
// is built from changes. Periods change in place (a reload of syncPeriod
// alone used to rebuild the whole dataplane: the options carried a
// SyncPeriod no dataplane read); a detect-local interface or an ipvs
// section change used to be ignored (the comparison left them out).
func TestRebuildReasons(t *testing.T) {
	dir := t.TempDir()
	parse := func(t *testing.T, file string) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]string{"--manifests", dir, "--config", writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+file)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	opts := func(t *testing.T, cfg *config.Config) dataplane.Options {
		t.Helper()
		o, _, err := dataplaneOptions(cfg, "node1", nodeFacts{addrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for _, tc := range []struct {
		name, running, next string
		want                []string
	}{
		{"nothing", "mode: nftables\n", "mode: nftables\n", nil},
		{"syncPeriod", "mode: nftables\nnftables: {syncPeriod: 30s}\n", "mode: nftables\nnftables: {syncPeriod: 10s}\n", nil},
		{"minSyncPeriod", "mode: iptables\niptables: {minSyncPeriod: 1s}\n", "mode: iptables\niptables: {minSyncPeriod: 0s}\n", nil},
		{"ipvs syncPeriod", "mode: ipvs\nipvs: {syncPeriod: 30s}\n", "mode: ipvs\nipvs: {syncPeriod: 5s}\n", nil},
		{"mode", "mode: nftables\n", "mode: iptables\n", []string{"mode", "NodePortAddresses"}}, // iptables mode: every local address
		{"masqueradeAll", "mode: iptables\n", "mode: iptables\niptables: {masqueradeAll: true}\n", []string{"MasqueradeAll"}},
		{"bridge interface", "mode: nftables\ndetectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			"mode: nftables\ndetectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr1}\n", []string{"PodInterface"}},
		{"ipvs strictARP", "mode: ipvs\n", "mode: ipvs\nipvs: {strictARP: true}\n", []string{"ipvs.strictARP"}},
		{"ipvs udpTimeout", "mode: ipvs\n", "mode: ipvs\nipvs: {udpTimeout: 30s}\n", []string{"ipvs.udpTimeout"}},
		{"ipvs excludeCIDRs", "mode: ipvs\n", "mode: ipvs\nipvs: {excludeCIDRs: [10.0.0.0/8]}\n", []string{"ipvs.excludeCIDRs"}},
		{"ipvs section in nftables mode", "mode: nftables\n", "mode: nftables\nipvs: {strictARP: true}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			running, next := parse(t, tc.running), parse(t, tc.next)
			got := rebuildReasons(running, next, opts(t, running), opts(t, next))
			if !slices.Equal(got, tc.want) {
				t.Errorf("rebuildReasons = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestOptionChangesCoversEveryField sets each field of dataplane.Options in
// turn: optionChanges must name it (the logger excepted), so a field added
// to the options cannot be forgotten by the reload comparison.
func TestOptionChangesCoversEveryField(t *testing.T) {
	typ := reflect.TypeOf(dataplane.Options{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Name == "Logger" {
			continue
		}
		var b dataplane.Options
		v := reflect.ValueOf(&b).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int:
			v.SetInt(7)
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		default:
			t.Fatalf("field %s: kind %s not handled by this test", f.Name, v.Kind())
		}
		if got := optionChanges(dataplane.Options{}, b); !slices.Equal(got, []string{f.Name}) {
			t.Errorf("field %s changed: optionChanges = %q", f.Name, got)
		}
	}
}
