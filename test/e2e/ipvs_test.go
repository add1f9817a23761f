//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	corev1 "k8s.io/api/core/v1"
)

// The tests in this file need a kernel with IPVS: they run in the QEMU
// guests of hack/vm.sh (VIPPROXY_E2E_REAL_IPVS=1, see hack/vm-test.sh) and
// skip elsewhere.

func requireRealIPVS(t *testing.T) {
	t.Helper()
	if !realIPVS() {
		t.Skipf("%s is not 1: this kernel has no IPVS (run through hack/vm-test.sh)", realIPVSEnv)
	}
	if !slices.ContainsFunc(modes(), func(m modeSpec) bool { return m.Name == "ipvs" }) {
		t.Skip("ipvs is not among the modes tested ($VIPPROXY_E2E_MODES)")
	}
}

// virtualServer returns the IPVS service for vip:port/TCP in namespace ns
// and its destinations ("ip:port" → weight).
func virtualServer(ns, vip string, port uint16) (*mobyipvs.Service, map[string]int, error) {
	return ipvsDests(ns, vip, port, func(d *mobyipvs.Destination) int { return d.Weight })
}

// activeConns returns the active connection count per destination of
// vip:port/TCP in ns.
func activeConns(ns, vip string, port uint16) (*mobyipvs.Service, map[string]int, error) {
	return ipvsDests(ns, vip, port, func(d *mobyipvs.Destination) int { return d.ActiveConnections })
}

// ipvsDests returns the IPVS service for vip:port/TCP in namespace ns and
// value(destination) per destination ("ip:port").
func ipvsDests(ns, vip string, port uint16, value func(*mobyipvs.Destination) int) (*mobyipvs.Service, map[string]int, error) {
	h, err := mobyipvs.New("/run/netns/" + ns)
	if err != nil {
		return nil, nil, fmt.Errorf("ipvs handle in %s: %w", ns, err)
	}
	defer h.Close()
	svcs, err := h.GetServices()
	if err != nil {
		return nil, nil, err
	}
	for _, s := range svcs {
		if s.Address.Equal(net.ParseIP(vip)) && s.Port == port && s.Protocol == 6 {
			dsts, err := h.GetDestinations(s)
			if err != nil {
				return nil, nil, err
			}
			out := map[string]int{}
			for _, d := range dsts {
				out[net.JoinHostPort(d.Address.String(), fmt.Sprint(d.Port))] = value(d)
			}
			return s, out, nil
		}
	}
	return nil, nil, fmt.Errorf("no IPVS virtual server %s:%d/TCP in %s (%d services)", vip, port, ns, len(svcs))
}

// ipvsBed starts vipproxy in ipvs mode on node1 only with the scheduler
// and a ClusterIP Service 10.96.0.50:80 over every pod.
func ipvsBed(t *testing.T, scheduler string, mutate func(*corev1.Service)) *bed {
	t.Helper()
	return newBed(t, modeSpecs["ipvs"], bedOptions{Nodes: []int{1}, ExtraArgs: []string{"--ipvs-scheduler=" + scheduler},
		Before: func(b *bed) {
			s := Service("web", "10.96.0.50", Port("http", TCP, 80, 8080))
			if mutate != nil {
				mutate(s)
			}
			b.apply("web.yaml", s, Slice(s, V4, "a", allEPs(b.Topology)...))
		}})
}

// TestIPVSVirtualServers: ipvs mode programs real virtual servers (no
// fallback): the ClusterIP has one with every endpoint, the scheduler
// asked for, and traffic through it.
func TestIPVSVirtualServers(t *testing.T) {
	requireRealIPVS(t)
	t.Parallel()
	b := ipvsBed(t, "rr", nil)
	ns := b.node(1).NS
	b.ready(b.Client, "tcp", "10.96.0.50:80")
	s, dsts, err := virtualServer(ns, "10.96.0.50", 80)
	if err != nil {
		t.Fatal(err)
	}
	if s.SchedName != "rr" {
		t.Errorf("scheduler %q, want rr", s.SchedName)
	}
	if len(dsts) != len(b.Pods()) {
		t.Errorf("destinations %v, want one per pod (%d)", dsts, len(b.Pods()))
	}
}

// TestIPVSSchedulers: each scheduler does what it says on a real kernel.
func TestIPVSSchedulers(t *testing.T) {
	requireRealIPVS(t)
	t.Parallel()
	t.Run("rr alternates", func(t *testing.T) {
		t.Parallel()
		b := ipvsBed(t, "rr", nil)
		b.ready(b.Client, "tcp", "10.96.0.50:80")
		n := len(b.Pods())
		var seq []string
		for i := 0; i < 3*n; i++ {
			r, err := Dial(b.Client, "tcp", "10.96.0.50:80")
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, r.Backend)
		}
		// Round robin: every window of n consecutive connections reaches
		// n distinct backends, and the cycle repeats.
		for i := 0; i+n <= len(seq); i++ {
			w := slices.Clone(seq[i : i+n])
			slices.Sort(w)
			if len(slices.Compact(w)) != n {
				t.Fatalf("rr: connections %d..%d reached %v, want %d distinct (sequence %v)", i, i+n-1, seq[i:i+n], n, seq)
			}
		}
	})
	t.Run("sh keeps a source", func(t *testing.T) {
		t.Parallel()
		b := ipvsBed(t, "sh", nil)
		b.ready(b.Client, "tcp", "10.96.0.50:80")
		if c := spread(b.Client, "tcp", "10.96.0.50:80", 20, 1); len(c) != 1 {
			t.Errorf("sh: one client reached %v, want one backend", c)
		}
		// Another source may hash elsewhere, but is as sticky.
		seen := map[string]bool{}
		for i := 0; i < 10; i++ {
			r, err := DialWith(b.Client, "tcp", "10.96.0.50:80", DialOptions{Source: ClientIP2})
			if err != nil {
				t.Fatal(err)
			}
			seen[r.Backend] = true
		}
		if len(seen) != 1 {
			t.Errorf("sh: client %s reached %v, want one backend", ClientIP2, seen)
		}
	})
	t.Run("dh keeps a destination", func(t *testing.T) {
		t.Parallel()
		b := ipvsBed(t, "dh", nil)
		b.ready(b.Client, "tcp", "10.96.0.50:80")
		// One destination (the VIP): every source reaches one backend.
		seen := map[string]bool{}
		for _, src := range []string{ClientIP, ClientIP2} {
			for i := 0; i < 8; i++ {
				r, err := DialWith(b.Client, "tcp", "10.96.0.50:80", DialOptions{Source: src})
				if err != nil {
					t.Fatal(err)
				}
				seen[r.Backend] = true
			}
		}
		if len(seen) != 1 {
			t.Errorf("dh: 16 connections from two sources to one VIP reached %v, want one backend", seen)
		}
	})
	t.Run("lc sends to the idle backend", func(t *testing.T) {
		t.Parallel()
		for _, sched := range []string{"lc", "sed", "nq"} {
			t.Run(sched, func(t *testing.T) {
				b := newBed(t, modeSpecs["ipvs"], bedOptions{Nodes: []int{1}, ExtraArgs: []string{"--ipvs-scheduler=" + sched},
					Before: func(b *bed) {
						s := Service("two", "10.96.0.51", Port("http", TCP, 80, 8080))
						b.apply("two.yaml", s, Slice(s, V4, "a", EP(b.Pod("pod1a")), EP(b.Pod("pod1b"))))
					}})
				b.ready(b.Client, "tcp", "10.96.0.51:80")
				time.Sleep(2 * time.Second) // let the probe's connection leave the active count
				// Hold connections open until they all sit on one backend:
				// each new one must then go to the other, idle one.
				var held []net.Conn
				defer func() {
					for _, c := range held {
						c.Close()
					}
				}()
				busy := ""
				for i := 0; i < 3; i++ {
					c, err := DialConn(b.Client, "tcp", "10.96.0.51:80", DialOptions{Timeout: 2 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					held = append(held, c)
				}
				_, dsts, err := activeConns(b.node(1).NS, "10.96.0.51", 80)
				if err != nil {
					t.Fatal(err)
				}
				for addr, n := range dsts {
					if n >= 2 {
						busy = addr
					}
				}
				if busy == "" {
					t.Fatalf("%s: 3 held connections spread %v: no busier backend", sched, dsts)
				}
				busyPod := ""
				for _, p := range b.Pods() {
					if strings.HasPrefix(busy, p.IPv4+":") {
						busyPod = p.Name
					}
				}
				for i := 0; i < 3; i++ {
					r, err := Dial(b.Client, "tcp", "10.96.0.51:80")
					if err != nil {
						t.Fatal(err)
					}
					if r.Backend == busyPod {
						t.Errorf("%s: a new connection went to %s, which holds %d of 3 open connections (active %v)", sched, r.Backend, dsts[busy], dsts)
					}
					// The closed connection must leave the active count
					// before the next one is scheduled, or the two
					// backends tie.
					if _, err := eventually(3*time.Second, 20*time.Millisecond, func() error {
						_, now, err := activeConns(b.node(1).NS, "10.96.0.51", 80)
						if err == nil && fmt.Sprint(now) != fmt.Sprint(dsts) {
							err = fmt.Errorf("active %v, want %v again", now, dsts)
						}
						return err
					}); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	})
}

// TestIPVSFallback: with the IPVS modules gone (unloaded, and hidden so
// the kernel cannot load them again), ipvs mode falls back to iptables
// with one warning and a metric, and Services work. Not parallel: it
// unloads modules every other IPVS test needs; Go runs it while the
// parallel tests wait.
func TestIPVSFallback(t *testing.T) {
	requireRealIPVS(t)
	modDir := "/lib/modules/" + strings.TrimSpace(mustOutput(t, "uname", "-r")) + "/kernel/net/netfilter/ipvs"
	// Unload every IPVS module (nothing uses them while this test runs).
	mods := strings.Fields(mustOutput(t, "sh", "-c", `lsmod | awk '$1 ~ /^ip_vs/ {print $1}'`))
	if len(mods) > 0 {
		// Schedulers first, then ip_vs itself.
		slices.SortFunc(mods, func(a, b string) int { return len(b) - len(a) })
		if out, err := exec.Command("modprobe", append([]string{"-r"}, mods...)...).CombinedOutput(); err != nil {
			t.Fatalf("modprobe -r %v: %v\n%s", mods, err, out)
		}
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "none", modDir).CombinedOutput(); err != nil {
		t.Fatalf("hide %s: %v\n%s", modDir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", modDir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", modDir, err, out)
		}
		if out, err := exec.Command("modprobe", "ip_vs").CombinedOutput(); err != nil {
			t.Errorf("modprobe ip_vs: %v\n%s", err, out)
		}
	})
	b := newBed(t, modeSpecs["ipvs"], bedOptions{Nodes: []int{1}, IPVSFallback: true, Before: func(b *bed) {
		s := Service("web", "10.96.0.55", Port("http", TCP, 80, 8080))
		b.apply("web.yaml", s, Slice(s, V4, "a", allEPs(b.Topology)...))
	}})
	ns := b.node(1).NS
	b.ready(b.Client, "tcp", "10.96.0.55:80")
	if _, body, err := HTTPGet(ns, MetricsAddr, "/proxyMode"); err != nil || body != "iptables" {
		t.Errorf("/proxyMode = %q (%v), want iptables after the fallback", body, err)
	}
	if v, err := metricValue(ns, "vipproxy_proxy_mode_fallbacks_total", `from="ipvs"`, `to="iptables"`); err != nil || v != 1 {
		t.Errorf("vipproxy_proxy_mode_fallbacks_total = %v (%v), want 1", v, err)
	}
	if log := b.vp[0].Log(); strings.Count(log, "falling back to iptables mode") != 1 {
		t.Errorf("want one fallback warning in the log:\n%s", log)
	}
}

func mustOutput(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return string(out)
}

// TestIPVSGracefulTermination: an endpoint removed while a TCP connection
// to it is open stays as a real server of weight 0, so the connection
// keeps working and new ones go elsewhere; once its connections are gone
// from IPVS's table (the closed one lingers in TIME_WAIT, two minutes) the
// real server is deleted.
func TestIPVSGracefulTermination(t *testing.T) {
	requireRealIPVS(t)
	t.Parallel()
	var svc *corev1.Service
	b := newBed(t, modeSpecs["ipvs"], bedOptions{Nodes: []int{1}, Before: func(b *bed) {
		svc = Service("drain", "10.96.0.56", Port("http", TCP, 80, 8080))
		b.apply("drain.yaml", svc, Slice(svc, V4, "a", EP(b.Pod("pod1a")), EP(b.Pod("pod1b"))))
	}})
	ns := b.node(1).NS
	b.ready(b.Client, "tcp", "10.96.0.56:80")
	c, err := DialConn(b.Client, "tcp", "10.96.0.56:80", DialOptions{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(Scaled(5 * time.Second)))
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	held, err := ParseReply(line)
	if err != nil {
		t.Fatal(err)
	}
	other := "pod1a"
	if held.Backend == "pod1a" {
		other = "pod1b"
	}
	heldDest := b.Pod(held.Backend).IPv4 + ":8080"
	// The held connection's endpoint goes away.
	b.apply("drain.yaml", svc, Slice(svc, V4, "a", EP(b.Pod(other))))
	if _, err := eventually(10*time.Second, 100*time.Millisecond, func() error {
		_, dsts, err := virtualServer(ns, "10.96.0.56", 80)
		if err != nil {
			return err
		}
		if w, ok := dsts[heldDest]; !ok || w != 0 {
			return fmt.Errorf("real servers %v, want %s at weight 0", dsts, heldDest)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The held connection still works; new ones avoid the draining endpoint.
	c.SetDeadline(time.Now().Add(Scaled(5 * time.Second)))
	if _, err := c.Write([]byte("still there?\n")); err != nil {
		t.Fatalf("held connection: %v", err)
	}
	if echo, err := br.ReadString('\n'); err != nil || echo != "still there?\n" {
		t.Fatalf("held connection to the removed endpoint: %q %v", echo, err)
	}
	if got := spread(b.Client, "tcp", "10.96.0.56:80", 6, 1); got[other] != 6 {
		t.Errorf("new connections while %s drains: %v, want all on %s", held.Backend, got, other)
	}
	c.Close()
	start := time.Now()
	if _, err := eventually(180*time.Second, time.Second, func() error {
		_, dsts, err := virtualServer(ns, "10.96.0.56", 80)
		if err != nil {
			return err
		}
		if _, ok := dsts[heldDest]; ok {
			return fmt.Errorf("real servers %v still hold %s", dsts, heldDest)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s deleted %v after its last connection closed (IPVS TIME_WAIT is 120 s)", heldDest, time.Since(start).Round(time.Second))
}
