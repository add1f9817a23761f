//go:build linux

package userspace

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/model"
)

const childEnv = "VPUS_NETNS_CHILD"

// TestNetns runs TestNetnsChild in a fresh network namespace (vpus-…) as
// root: the child adds VIPs to that namespace's lo, never the machine's.
// Afterwards the parent checks that nothing of vipproxy's is left on lo.
func TestNetns(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	ns := fmt.Sprintf("vpus-%d-%d", os.Getpid(), rand.IntN(1e6))
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0],
		"-test.run=^TestNetnsChild$", "-test.v", "-test.count=1")
	parentNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), childEnv+"="+parentNS)
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestNetnsChild") {
		t.Fatal("child did not pass")
	}
	if left := ip("-n", ns, "addr", "show", "dev", "lo"); strings.Contains(left, "10.96.") || strings.Contains(left, "fd00:96::") {
		t.Errorf("VIPs left on lo after Cleanup:\n%s", left)
	}
}

func TestNetnsChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestNetns inside its namespace")
	}
	// Safety: refuse to run in the parent's (the machine's) namespace.
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil || self == os.Getenv(childEnv) {
		t.Fatalf("not in a separate network namespace (self %q %v, parent %q)", self, err, os.Getenv(childEnv))
	}
	ctx := context.Background()
	a := tcpBackend(t, "127.0.0.2", "a")
	b := tcpBackend(t, "127.0.0.3", "b")
	ua := udpBackend(t, "127.0.0.2", "ua", 0)
	a6 := tcpBackend(t, "::1", "a6")

	vip := netip.MustParseAddr("10.96.0.10")
	vip6 := netip.MustParseAddr("fd00:96::10")
	loVIP := netip.MustParseAddr("127.0.0.53") // already local: not added
	web := svc("web", model.TCP, vip, 80, ep(a), ep(b))
	web.ClusterIPs = append(web.ClusterIPs, vip6)
	web.Endpoints = append(web.Endpoints, ep(a6))
	web.ClusterEndpoints = web.Endpoints
	dns := svc("dns", model.UDP, vip, 53, ep(ua))
	local := svc("local", model.TCP, loVIP, 8080, ep(a))
	full := &model.State{Ports: []*model.ServicePort{dns, local, web}}
	onlyLocal := &model.State{Ports: []*model.ServicePort{local}}

	p, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup(ctx)
	if err := p.Sync(ctx, full, true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	want := []netip.Addr{vip, vip6}
	checkOwned(t, "after Sync", want)
	out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if !strings.Contains(string(out), "inet 10.96.0.10/32") || !strings.Contains(string(out), Label) ||
		!strings.Contains(string(out), "inet6 fd00:96::10/128") {
		t.Errorf("ip addr does not show the VIPs with label %s:\n%s", Label, out)
	}

	// Traffic through each VIP.
	for i, w := range []string{"a", "b"} {
		c, err := dialName(netip.AddrPortFrom(vip, 80))
		if err != nil {
			t.Fatalf("dial %s:80: %v", vip, err)
		}
		c.c.Close()
		if c.name != w {
			t.Errorf("connection %d reached %s, want %s", i, c.name, w)
		}
	}
	if c, err := dialName(netip.AddrPortFrom(vip6, 80)); err != nil || c.name != "a6" {
		t.Errorf("dial [%s]:80: %v (reached %v)", vip6, err, c)
	} else {
		c.c.Close()
	}
	if got := askUDP(netip.AddrPortFrom(vip, 53), "q", 2*time.Second); got != "ua:q" {
		t.Errorf("udp via %s:53: %q", vip, got)
	}
	if c, err := dialName(netip.AddrPortFrom(loVIP, 8080)); err != nil || c.name != "a" {
		t.Errorf("dial %s:8080: %v", loVIP, err)
	} else {
		c.c.Close()
	}

	// A Service going away takes its VIP with it.
	if err := p.Sync(ctx, onlyLocal, false); err != nil {
		t.Fatal(err)
	}
	checkOwned(t, "after removing the services", nil)

	// Flushed behind our back: a full Sync puts it back.
	if err := p.Sync(ctx, full, false); err != nil {
		t.Fatal(err)
	}
	if err := (LoAddrs{}).Del(vip); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, full, true); err != nil {
		t.Fatal(err)
	}
	checkOwned(t, "after a full Sync repaired a deleted VIP", want)
	if c, err := dialName(netip.AddrPortFrom(vip, 80)); err != nil {
		t.Errorf("dial after repair: %v", err)
	} else {
		c.c.Close()
	}

	// A restarted process adopts the addresses and removes unwanted ones.
	p2, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Sync(ctx, &model.State{}, true); err != nil {
		t.Fatal(err)
	}
	checkOwned(t, "after a new process synced without the services", nil)

	// Cleanup (as --cleanup in a fresh process) removes everything.
	if err := p.Sync(ctx, full, true); err != nil {
		t.Fatal(err)
	}
	checkOwned(t, "before Cleanup", want)
	p3, _ := New(Options{})
	if err := p3.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	checkOwned(t, "after Cleanup", nil)
	if err := p3.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	p.Cleanup(ctx)
	p2.Cleanup(ctx)
}

func checkOwned(t *testing.T, when string, want []netip.Addr) {
	t.Helper()
	got, err := LoAddrs{}.List()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	want = slices.Clone(want)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		t.Errorf("%s: owned addresses %v, want %v", when, got, want)
	}
}
