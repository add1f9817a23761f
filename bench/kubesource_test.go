//go:build linux

package bench

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/source/kube"
	"github.com/vipproxy/vipproxy/test/e2e"
)

// BenchmarkKubeSourceSync times the Kubernetes source from Run to its first
// snapshot against a real kube-apiserver holding $VIPPROXY_BENCH_N (default
// 10,000) Services with a slice of 10 endpoints each: the informers' sync
// and the conversion in their transform, the part of a Kubernetes-mode cold
// start before the first build. "list" is the default (kube-proxy v1.34's
// too); "watchlist" is --feature-gates WatchListClient=true. Needs
// VIPPROXY_CONTROLPLANE (hack/controlplane.sh) and root; loading the API
// server takes ~40 s at 10,000, before the timer starts.
func BenchmarkKubeSourceSync(b *testing.B) {
	bin := os.Getenv("VIPPROXY_CONTROLPLANE")
	if bin == "" || os.Geteuid() != 0 {
		b.Skip("needs root and VIPPROXY_CONTROLPLANE")
	}
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("VIPPROXY_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	b.Cleanup(SweepOwn)
	cp, err := StartControlPlane(bin, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cp.Close)
	set := NewSet(n, 10, 0)
	ctx := context.Background()
	if err := cp.Load(ctx, set, 0, n, 32); err != nil {
		b.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return e2e.DialConn(cp.NS, network, addr, e2e.DialOptions{Timeout: 5 * time.Second})
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf" // vipproxy's default, as kube-proxy's
	saved := clientfeatures.FeatureGates()
	b.Cleanup(func() { clientfeatures.ReplaceFeatureGates(saved) })
	for _, mode := range []struct {
		name      string
		watchList bool
	}{{"list", false}, {"watchlist", true}} {
		b.Run(mode.name, func(b *testing.B) {
			kube.SetWatchList(mode.watchList)
			for b.Loop() {
				client, err := kube.NewClient(rc)
				if err != nil {
					b.Fatal(err)
				}
				runCtx, cancel := context.WithCancel(ctx)
				out := make(chan *model.Snapshot, 1)
				done := make(chan error, 1)
				go func() { done <- kube.New(kube.Options{Client: client, NodeName: NodeName}).Run(runCtx, out) }()
				select {
				case snap := <-out:
					if len(snap.Services) < n || len(snap.Slices) < n {
						b.Fatalf("first snapshot: %d Services, %d slices, want %d", len(snap.Services), len(snap.Slices), n)
					}
				case err := <-done:
					b.Fatalf("source ended before its first snapshot: %v", err)
				}
				b.StopTimer()
				cancel()
				<-done
				b.StartTimer()
			}
		})
	}
}
