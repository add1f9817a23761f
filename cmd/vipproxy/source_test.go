package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientfeatures "k8s.io/client-go/features"

	"github.com/vipproxy/vipproxy/internal/allocator"
	"github.com/vipproxy/vipproxy/internal/config"
	"github.com/vipproxy/vipproxy/internal/metrics"
	"github.com/vipproxy/vipproxy/internal/model"
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

// TestAfterColdStartOr: f runs once the cold start is done or the wait's
// bound has passed, whichever is first, and not when the context ends
// before either.
func TestAfterColdStartOr(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	for _, tc := range []struct {
		name      string
		coldStart chan struct{}
		max       time.Duration
		cancel    bool
		want      bool
	}{
		{"cold start done", closed, time.Hour, false, true},
		{"bound passed", make(chan struct{}), 20 * time.Millisecond, false, true},
		{"context ended", make(chan struct{}), time.Hour, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			ran := false
			done := make(chan struct{})
			go func() {
				defer close(done)
				afterColdStartOr(ctx, tc.coldStart, tc.max, func() { ran = true })
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("afterColdStartOr did not return")
			}
			if ran != tc.want {
				t.Errorf("f ran: %t, want %t", ran, tc.want)
			}
		})
	}
}

// TestRepairWaitsForColdStart: in standalone mode the allocation map's
// first repair pass runs once the cold start is done, not while it runs
// (it competes for the CPU): a record held by no Service is seen leaked
// only after coldStart is closed.
func TestRepairWaitsForColdStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, state := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]string{"--manifests", dir, "--state-dir", state, "--service-cluster-ip-range", "10.96.0.0/16"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Records of Services no manifest has: leaks for the repair pass
	// (three, a count no other test leaves in the gauge).
	const leaks = 3
	store, err := allocator.OpenStore(ctx, cfg.Registry, state)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.NewAssigner(allocator.AssignerOptions{Store: store, ServiceCIDRs: cfg.ServiceCIDRs()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range leaks {
		if _, err := a.Assign(ctx, model.Service{ServiceName: model.ServiceName{Namespace: "default", Name: fmt.Sprint("gone-", i)},
			Type: model.TypeClusterIP, Ports: []model.ServicePortSpec{{Name: "http", Protocol: model.TCP, Port: 80}}}); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	if v := gauge(t, "vipproxy_allocator_leaked_services"); v == leaks {
		t.Fatalf("leaked_services already %v", v)
	}
	coldStart := make(chan struct{})
	src, release, ready, err := newSource(ctx, cfg, "node", coldStart, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan *model.Snapshot, 1)
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, out) }()
	defer func() {
		cancel()
		<-errc
		release()
	}()
	select {
	case <-out:
	case err := <-errc:
		t.Fatalf("source: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no first snapshot")
	}
	if err := ready(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if v := gauge(t, "vipproxy_allocator_leaked_services"); v == leaks {
		t.Fatalf("leaked_services %v before the cold start is done: the repair pass ran during it", v)
	}
	close(coldStart)
	deadline := time.Now().Add(10 * time.Second)
	for gauge(t, "vipproxy_allocator_leaked_services") != leaks {
		if time.Now().After(deadline) {
			t.Fatal("no repair pass saw the leak after the cold start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gauge reads an unlabelled gauge from vipproxy's registry.
func gauge(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
