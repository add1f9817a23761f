//go:build linux

package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// bed is one scenario's topology plus vipproxy on the nodes, reading a shared
// manifests directory (as if both nodes watched the same API server).
type bed struct {
	*Topology
	t    *testing.T
	mode modeSpec
	dir  string
	vp   []*Vipproxy // by node index-1; nil where not started
}

type bedOptions struct {
	// Nodes lists the nodes (1, 2) that run vipproxy; nil means both.
	Nodes      []int
	SyncPeriod time.Duration
	// Files are written before vipproxy starts: name → documents.
	Files map[string][]any
	// Before runs after the topology is built and before vipproxy starts.
	Before func(b *bed)
	// DefaultNodePortAddresses, NoClusterCIDR: see VipproxyOptions.
	DefaultNodePortAddresses bool
	NoClusterCIDR            bool
	// ExtraArgs go to every vipproxy.
	ExtraArgs []string
	// IPVSFallback: on a kernel with IPVS, ipvs mode is expected to fall
	// back to iptables (the test hid the modules).
	IPVSFallback bool
}

// newBed builds a topology, writes the Node objects (node1 in zone-a, node2 in
// zone-b) and o.Files, and starts vipproxy in mode on the chosen nodes.
func newBed(t *testing.T, mode modeSpec, o bedOptions) *bed {
	t.Helper()
	RequireRoot(t)
	for _, tool := range mode.Tools {
		if _, err := execLookPath(tool); err != nil {
			t.Skipf("e2e: mode %s needs %s: %v", mode.Name, tool, err)
		}
	}
	Binary(t) // skip early when the command does not exist yet
	topo := NewTopology(t, TopologyOptions{})
	b := &bed{Topology: topo, t: t, mode: mode, dir: filepath.Join(t.TempDir(), "manifests"), vp: make([]*Vipproxy, 2)}
	if err := os.Mkdir(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b.apply("nodes.yaml", NodeObject(topo.Nodes[0], "zone-a"), NodeObject(topo.Nodes[1], "zone-b"))
	for name, docs := range o.Files {
		b.apply(name, docs...)
	}
	for _, n := range topo.Nodes {
		b.setupNode(n, mode)
	}
	if o.Before != nil {
		o.Before(b)
	}
	nodes := o.Nodes
	if nodes == nil {
		nodes = []int{1, 2}
	}
	// Start all, then wait: the processes come up in parallel.
	for _, k := range nodes {
		v := topo.NewVipproxy(topo.Nodes[k-1], VipproxyOptions{
			Mode: mode.proxy(), Manifests: b.dir, SyncPeriod: o.SyncPeriod,
			DefaultNodePortAddresses: o.DefaultNodePortAddresses, NoClusterCIDR: o.NoClusterCIDR, ExtraArgs: o.ExtraArgs,
		})
		if err := v.Start(); err != nil {
			t.Fatal(err)
		}
		b.vp[k-1] = v
	}
	for _, k := range nodes {
		if err := b.vp[k-1].WaitHealthy(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		if mode.Proxy == "iptables" && len(mode.Setup) > 0 {
			b.wantBackend(b.vp[k-1], mode.Name)
		}
		if mode.Name == "ipvs" && realIPVS() && !o.IPVSFallback {
			// On a kernel with IPVS (hack/vm.sh), no fallback to iptables.
			if _, body, err := HTTPGet(topo.Nodes[k-1].NS, MetricsAddr, "/proxyMode"); err != nil || body != "ipvs" {
				t.Fatalf("%s=1 but node%d runs %q (%v): ipvs fell back", realIPVSEnv, k, body, err)
			}
		}
	}
	return b
}

// setupNode runs the mode's Setup commands in node's namespace: what the
// node's kubelet or distribution leaves before a proxy starts.
func (b *bed) setupNode(node *Node, mode modeSpec) {
	b.t.Helper()
	for _, c := range mode.Setup {
		if out, err := Exec(node.NS, c...); err != nil {
			b.t.Fatalf("mode %s setup %q: %v\n%s", mode.Name, c, err, out)
		}
	}
}

// wantBackend fails the test unless v logged that it programs want
// (iptables-nft or iptables-legacy): a spec for one backend must not
// silently test the other.
func (b *bed) wantBackend(v *Vipproxy, want string) {
	b.t.Helper()
	line, ok := logLine(v.Log(), "iptables backend")
	if !ok || !strings.Contains(line, "iptables backend: "+want) {
		b.t.Fatalf("mode %s: vipproxy did not choose %s; its log says %q", b.mode.Name, want, line)
	}
}

// realIPVSEnv, when set to 1, says the kernel has IPVS (the QEMU guests of
// hack/vm.sh): ipvs mode must not fall back, and the IPVS-only tests run.
const realIPVSEnv = "VIPPROXY_E2E_REAL_IPVS"

func realIPVS() bool { return os.Getenv(realIPVSEnv) == "1" }

// apply writes a manifest file or fails the test.
func (b *bed) apply(file string, docs ...any) {
	b.t.Helper()
	if err := WriteManifest(b.dir, file, docs...); err != nil {
		b.t.Fatal(err)
	}
}

// node returns node k (1-based).
func (b *bed) node(k int) *Node { return b.Nodes[k-1] }

// waitFor dials until check accepts a reply (bounded by timeout; 200 ms per
// dial) and fails the test otherwise. It returns the accepted reply.
func (b *bed) waitFor(ns, proto, addr string, timeout time.Duration, check func(Reply) error) Reply {
	b.t.Helper()
	var got Reply
	_, err := eventually(timeout, 50*time.Millisecond, func() error {
		r, err := DialWith(ns, proto, addr, DialOptions{Timeout: 300 * time.Millisecond})
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(r); err != nil {
				return err
			}
		}
		got = r
		return nil
	})
	if err != nil {
		b.t.Fatalf("%s %s from %s: %v", proto, addr, ns, err)
	}
	return got
}

// ready waits (10 s) until addr answers from ns: the first sync is done.
func (b *bed) ready(ns, proto, addr string) Reply {
	b.t.Helper()
	return b.waitFor(ns, proto, addr, 10*time.Second, nil)
}

// backendIn returns a check accepting replies from the named backends.
func backendIn(names ...string) func(Reply) error {
	return func(r Reply) error {
		for _, n := range names {
			if r.Backend == n {
				return nil
			}
		}
		return fmt.Errorf("reply from %s, want one of %v", r.Backend, names)
	}
}

// spread dials n times with w workers and counts replies per backend;
// failed dials are counted under "error: ...".
func spread(ns, proto, addr string, n, w int) map[string]int {
	var mu sync.Mutex
	counts := map[string]int{}
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				r, err := Dial(ns, proto, addr)
				key := r.Backend
				if err != nil {
					key = "error: " + err.Error()
				}
				mu.Lock()
				counts[key]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return counts
}

// vip joins an address and port.
func vip(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// isTimeout reports whether err is a deadline (a dropped packet).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// expectNoAnswer fails the test if addr answers from ns within 1 s.
func expectNoAnswer(t *testing.T, what, ns, proto, addr string) error {
	t.Helper()
	r, err := Dial(ns, proto, addr)
	if err == nil {
		t.Errorf("%s: %s %s answered by %v, want no answer", what, proto, addr, r)
	}
	return err
}
