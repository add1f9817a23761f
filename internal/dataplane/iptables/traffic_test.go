package iptables

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// TestKernelTraffic sends real TCP connections inside a namespace, from
// the node itself (output hook), to ClusterIPs programmed by vipproxy:
// a Service with an endpoint on the namespace's loopback answers; a port
// of no Service, and a Service without endpoints, are refused at once; an
// unallocated address of the service range times out (dropped).
func TestKernelTraffic(t *testing.T) {
	if _, err := exec.LookPath("socat"); err != nil {
		t.Skip("needs socat")
	}
	ns := newNetns(t)
	nsRun(t, ns, "ip", "link", "set", "lo", "up")
	nsRun(t, ns, "ip", "addr", "add", "10.1.2.5/32", "dev", "lo")
	nsRun(t, ns, "ip", "addr", "add", "192.168.0.10/32", "dev", "lo")
	nsRun(t, ns, "ip", "route", "add", "local", "10.96.0.0/16", "dev", "lo")
	p := kernelProxier(t, ns, "", dataplanetest.BaseOptions(), nil)

	srv := exec.Command("ip", "netns", "exec", ns, "socat", "TCP-LISTEN:8080,bind=10.1.2.5,reuseaddr,fork", "SYSTEM:echo hello-from-endpoint")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })

	web := dataplanetest.Port("default/web", "", model.TCP, 80, "10.96.0.10")
	web.Type = model.TypeNodePort
	web.NodePort = 30080
	web.AffinityTimeoutSeconds = 60
	web.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.2.5", 8080, true)}
	none := dataplanetest.Port("default/none", "", model.TCP, 80, "10.96.0.50")
	st := dataplanetest.NewState(dataplanetest.Fill(web), dataplanetest.Fill(none))
	if err := p.Sync(context.Background(), st, true); err != nil {
		t.Fatal(err)
	}

	dial := func(dst string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "socat", "-T", "2", "-u", "TCP:"+dst+",connect-timeout=1.5", "STDOUT").CombinedOutput()
		return string(out), err
	}
	// Wait (bounded) for the listener.
	var out string
	var err error
	for i := 0; i < 50; i++ {
		if out, err = dial("10.1.2.5:8080"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("endpoint not reachable directly: %v: %s", err, out)
	}
	for _, tc := range []struct {
		name, dst, want string
	}{
		{"clusterIP reaches the endpoint", "10.96.0.10:80", "hello-from-endpoint"},
		{"nodePort on the node IP reaches the endpoint", "192.168.0.10:30080", "hello-from-endpoint"},
		{"unknown port refused", "10.96.0.10:81", "Connection refused"},
		{"no endpoints refused", "10.96.0.50:80", "Connection refused"},
		{"unallocated address dropped", "10.96.0.99:80", "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, _ := dial(tc.dst)
			if !strings.Contains(out, tc.want) {
				t.Errorf("dial %s: got %q, want it to contain %q", tc.dst, strings.TrimSpace(out), tc.want)
			}
			if tc.want == "Connection refused" && time.Since(start) > time.Second {
				t.Errorf("refusal took %v; a reject must be immediate", time.Since(start))
			}
		})
	}
	if err := p.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
}
