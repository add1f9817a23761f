package main

import (
	"io"
	"log/slog"
	"testing"

	clientfeatures "k8s.io/client-go/features"

	"github.com/vipproxy/vipproxy/internal/config"
)

// TestKubeSourceWatchListGate: the informers list (kube-proxy v1.34's
// default) unless --feature-gates WatchListClient=true asks for the
// watch-list stream; client-go reads its gate, so that is what is checked.
func TestKubeSourceWatchListGate(t *testing.T) {
	defer clientfeatures.ReplaceFeatureGates(clientfeatures.FeatureGates())
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--feature-gates", "WatchListClient=true"}, true},
		{[]string{"--feature-gates", "WatchListClient=false"}, false},
		{[]string{"--feature-gates", "AllBeta=true"}, true},
	} {
		cfg, err := config.Parse(append([]string{"--master", "http://127.0.0.1:1"}, tc.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kubeSource(cfg, "node", slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		if got := clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient); got != tc.want {
			t.Errorf("%v: client-go WatchListClient %t, want %t", tc.args, got, tc.want)
		}
		// The other client-go gates keep their defaults.
		if !clientfeatures.FeatureGates().Enabled(clientfeatures.InformerResourceVersion) {
			t.Errorf("%v: InformerResourceVersion turned off", tc.args)
		}
	}
}
