package nftables

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

func nsRun(t *testing.T, ns string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	return string(out), err
}

// TestKernelTraffic is a smoke test of the real datapath inside one
// namespace: TCP to a ClusterIP reaches every endpoint (local sockets on
// addresses of lo), a Service without endpoints and an unknown port of a
// ClusterIP are refused at once. The multi-namespace scenarios live in
// test/e2e.
func TestKernelTraffic(t *testing.T) {
	ns := newNetns(t, "traffic")
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", "10.1.1.5/32", "dev", "lo"},
		{"ip", "addr", "add", "10.1.1.6/32", "dev", "lo"},
		{"ip", "route", "add", "10.96.0.0/16", "dev", "lo"},
	} {
		if out, err := nsRun(t, ns, cmd...); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	for _, b := range []struct{ addr, name string }{{"10.1.1.5", "a"}, {"10.1.1.6", "b"}} {
		cmd := exec.Command("ip", "netns", "exec", ns, "socat", "TCP-LISTEN:8080,bind="+b.addr+",fork,reuseaddr", "SYSTEM:echo "+b.name)
		if err := cmd.Start(); err != nil {
			t.Fatalf("socat: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	web := dataplanetest.Port("default/web", "", model.TCP, 80, "10.96.0.10")
	web.Endpoints = []model.Endpoint{dataplanetest.EP("10.1.1.5", 8080, true), dataplanetest.EP("10.1.1.6", 8080, true)}
	none := dataplanetest.Port("default/none", "", model.TCP, 80, "10.96.0.11")
	o := dataplanetest.BaseOptions()
	o.Logger = quietLogger()
	p, err := New(o, &NFT{Netns: ns})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(context.Background(), dataplanetest.NewState(dataplanetest.Fill(web), dataplanetest.Fill(none)), true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let socat bind
	seen := map[string]int{}
	for i := 0; i < 30 && len(seen) < 2; i++ {
		out, err := nsRun(t, ns, "socat", "-T2", "-", "TCP:10.96.0.10:80,connect-timeout=2")
		if err != nil {
			t.Fatalf("connect to ClusterIP: %v: %s", err, out)
		}
		seen[strings.TrimSpace(out)]++
	}
	if seen["a"] == 0 || seen["b"] == 0 {
		t.Errorf("endpoints reached through the ClusterIP: %v, want both a and b", seen)
	}
	for _, dst := range []string{"10.96.0.11:80", "10.96.0.10:81"} {
		start := time.Now()
		out, err := nsRun(t, ns, "socat", "-T2", "-", "TCP:"+dst+",connect-timeout=3")
		if err == nil || !strings.Contains(out, "refused") {
			t.Errorf("connect to %s: err=%v out=%q, want connection refused", dst, err, out)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("connect to %s took %v, want an immediate refusal", dst, d)
		}
	}
}
