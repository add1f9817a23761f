//go:build linux

package userspace

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	"github.com/vipproxy/vipproxy/internal/model"
)

const childEnv = "VPUS_NETNS_CHILD"

// TestNetns runs TestNetnsChild in a fresh network namespace (vpus-…) as
// root: the child adds VIPs to that namespace's lo, never the machine's.
// Afterwards the parent checks that nothing of vipproxy's is left on lo.
// newNetns creates a network namespace named vpus-… with lo up and
// removes it when the test ends. It skips unless running as root with
// iproute2.
func newNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	ns := fmt.Sprintf("vpus-%d-%d", os.Getpid(), rand.IntN(1e6))
	ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// runChild runs test (a function of this test binary) in namespace ns,
// prefixed by wrap (such as a privilege-dropping command), with childEnv
// set to this process's namespace so the child can check it is elsewhere.
func runChild(t *testing.T, ns, bin, test string, wrap ...string) {
	t.Helper()
	parentNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"netns", "exec", ns}, wrap...)
	args = append(args, bin, "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = append(os.Environ(), childEnv+"="+parentNS)
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatal("child did not pass")
	}
}

// TestNetns runs TestNetnsChild in a fresh network namespace (vpus-…) as
// root: the child adds VIPs to that namespace's lo, never the machine's.
// Afterwards the parent checks that nothing of vipproxy's is left on lo.
func TestNetns(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	ns := newNetns(t)
	runChild(t, ns, os.Args[0], "TestNetnsChild")
	runChild(t, ns, os.Args[0], "TestWaitLocalChild")
	if left := ip(t, "-n", ns, "addr", "show", "dev", "lo"); strings.Contains(left, "10.96.") || strings.Contains(left, "fd00:96::") {
		t.Errorf("VIPs left on lo after Cleanup:\n%s", left)
	}
}

// TestNetnsUnprivileged runs TestUnprivilegedChild in a fresh namespace as
// uid 65534 without capabilities, with the default address manager.
func TestNetnsUnprivileged(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	ns := newNetns(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv")
	}
	// The test binary must be readable by the unprivileged user.
	dir, err := os.MkdirTemp("", "vpus-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "userspace.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	runChild(t, ns, bin, "TestUnprivilegedChild",
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")
}

// TestUnprivilegedChild: without CAP_NET_ADMIN the default manager cannot
// add addresses; a 127.0.0.0/8 VIP is served, a 10.96.0.0/16 one is
// logged as unservable with the reason, and Cleanup succeeds.
func TestUnprivilegedChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestNetnsUnprivileged")
	}
	if os.Geteuid() == 0 {
		t.Fatal("child runs as root")
	}
	var logs syncBuffer
	p, err := New(Options{Options: dataplane.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	if p.canAdd == nil || !strings.Contains(p.canAdd.Error(), "CAP_NET_ADMIN") {
		t.Fatalf("CanAdd = %v, want a missing CAP_NET_ADMIN", p.canAdd)
	}
	a := tcpBackend(t, "127.0.0.2", "a")
	vip := netip.MustParseAddr("127.77.0.12")
	st := &model.State{Ports: []*model.ServicePort{
		svc("near", model.TCP, vip, 8080, ep(a)),
		svc("far", model.TCP, netip.MustParseAddr("10.96.0.12"), 80, ep(a)),
		svc("low", model.TCP, vip, 80, ep(a)), // privileged port: logged, not an error
	}}
	if err := p.Sync(context.Background(), st, true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "10.96.0.12") || !strings.Contains(l, "no CAP_NET_ADMIN") {
		t.Errorf("log does not say which VIP is not served and why:\n%s", l)
	}
	if l := logs.String(); !strings.Contains(l, "127.77.0.12:80") || !strings.Contains(l, "CAP_NET_BIND_SERVICE") {
		t.Errorf("log does not say port 80 needs CAP_NET_BIND_SERVICE:\n%s", l)
	}
	if l := logs.String(); !strings.Contains(l, "VIP addresses are not guarded") {
		t.Errorf("log does not warn that host listeners answer on VIPs:\n%s", l)
	}
	t.Logf("log:\n%s", logs.String())
	c, err := dialName(netip.AddrPortFrom(vip, 8080))
	if err != nil {
		t.Fatalf("dial %s:8080: %v", vip, err)
	}
	c.c.Close()
	if c.name != "a" {
		t.Errorf("reached %s", c.name)
	}
	if err := p.Cleanup(context.Background()); err != nil {
		t.Errorf("Cleanup: %v", err)
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
