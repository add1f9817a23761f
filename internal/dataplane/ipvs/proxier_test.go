package ipvs

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/dataplane/ipset"
	"github.com/vipproxy/vipproxy/internal/dataplane/iptables"
	"github.com/vipproxy/vipproxy/internal/model"
	"github.com/vipproxy/vipproxy/internal/sysctl"
)

var ctx = context.Background()

// bed is a Proxier over fakes.
type bed struct {
	p      *Proxier
	kernel *FakeKernel
	sets   *ipset.Fake
	ipt    *iptables.Fake
	addrs  *FakeAddrs
	sysctl *sysctl.Fake
	logs   *bytes.Buffer
}

func newBed(t *testing.T, mod func(*Options)) *bed {
	t.Helper()
	b := &bed{kernel: &FakeKernel{}, sets: &ipset.Fake{}, ipt: iptables.NewFake(), addrs: &FakeAddrs{},
		sysctl: FakeSysctl(), logs: &bytes.Buffer{}}
	b.p = b.newProxier(t, mod)
	return b
}

// newProxier returns another Proxier over the same fakes (a restart).
func (b *bed) newProxier(t *testing.T, mod func(*Options)) *Proxier {
	t.Helper()
	o := Options{Options: dataplanetest.BaseOptions(), Kernel: b.kernel, IPSet: b.sets, Runner: b.ipt, Addrs: b.addrs, Sysctl: b.sysctl}
	o.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
	if mod != nil {
		mod(&o)
	}
	p, err := NewProxier(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (b *bed) sync(t *testing.T, st *model.State, full bool) {
	t.Helper()
	if err := b.p.Sync(ctx, st, full); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// clear forgets the call logs of every fake.
func (b *bed) clear() {
	b.kernel.Calls()
	b.sets.Scripts()
	b.addrs.Calls()
	b.ipt.Restores = nil
}

func lines(s string) []string {
	return strings.Split(strings.TrimSpace(s), "\n")
}

func want(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

var (
	ep    = dataplanetest.EP
	termE = dataplanetest.TermEP
	port  = dataplanetest.Port
	fill  = dataplanetest.Fill
	state = dataplanetest.NewState
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func web() *model.ServicePort {
	sp := port("default/web", "http", model.TCP, 80, "10.96.0.10")
	sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 8080, true), ep("10.1.2.9", 8080, false)}
	return fill(sp)
}

func TestClusterIP(t *testing.T) {
	b := newBed(t, nil)
	b.sync(t, state(web()), false)
	want(t, "kernel", lines(b.kernel.Dump()), []string{
		"TCP/10.96.0.10:80 rr",
		"  -> 10.1.1.9:8080 w1",
		"  -> 10.1.2.9:8080 w1",
	})
	got, _ := b.addrs.List()
	want(t, "bound VIPs", got, addrs("10.96.0.10"))
	want(t, "CLUSTER-IP set", b.sets.Members("VIPVS-CLUSTER-IP"), []string{"10.96.0.10,tcp:80"})
	want(t, "VIPS set", b.sets.Members("VIPVS-VIPS"), []string{"10.96.0.10"})
	want(t, "LOOP-BACK set", b.sets.Members("VIPVS-LOOP-BACK"), []string{"10.1.1.9,tcp:8080,10.1.1.9", "10.1.2.9,tcp:8080,10.1.2.9"})
	want(t, "REJECT set", b.sets.Members("VIPVS-NO-EP-REJECT"), []string{})
	if b.sets.Members("VIPVS6-CLUSTER-IP") == nil {
		t.Error("IPv6 sets not created")
	}
}

// TestServiceFeatures checks each Service feature's virtual servers, real
// servers and set members.
func TestServiceFeatures(t *testing.T) {
	type setWant struct {
		set     string
		members []string
	}
	cases := []struct {
		name   string
		mod    func(*Options)
		sp     func() *model.ServicePort
		kernel []string
		sets   []setWant
		vips   []netip.Addr
	}{{
		name: "dual-stack ClusterIP splits endpoints by family",
		sp: func() *model.ServicePort {
			sp := port("default/ds", "", model.TCP, 443, "10.96.0.11", "fd00:96::11")
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 8443, true), ep("fd00:10:1:1::9", 8443, true)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.11:443 rr", "  -> 10.1.1.9:8443 w1", "TCP/[fd00:96::11]:443 rr", "  -> [fd00:10:1:1::9]:8443 w1"},
		sets:   []setWant{{"VIPVS-CLUSTER-IP", []string{"10.96.0.11,tcp:443"}}, {"VIPVS6-CLUSTER-IP", []string{"fd00:96::11,tcp:443"}}, {"VIPVS6-VIPS", []string{"fd00:96::11"}}},
		vips:   addrs("10.96.0.11", "fd00:96::11"),
	}, {
		name: "externalIP with Cluster policy uses all endpoints and masquerades",
		sp: func() *model.ServicePort {
			sp := port("default/ext", "", model.TCP, 80, "10.96.0.12")
			sp.ExternalIPs = addrs("192.168.5.5")
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 80, true), ep("10.1.2.9", 80, false)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.12:80 rr", "  -> 10.1.1.9:80 w1", "  -> 10.1.2.9:80 w1", "TCP/192.168.5.5:80 rr", "  -> 10.1.1.9:80 w1", "  -> 10.1.2.9:80 w1"},
		sets:   []setWant{{"VIPVS-EXTERNAL-IP", []string{"192.168.5.5,tcp:80"}}, {"VIPVS-EXTERNAL-LOCAL", []string{}}, {"VIPVS-VIPS", []string{"10.96.0.12"}}},
		vips:   addrs("10.96.0.12", "192.168.5.5"),
	}, {
		name: "externalIP with Local policy uses local endpoints only",
		sp: func() *model.ServicePort {
			sp := port("default/ext", "", model.TCP, 80, "10.96.0.12")
			sp.ExternalIPs = addrs("192.168.5.5")
			sp.ExternalTrafficPolicy = model.PolicyLocal
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 80, true), ep("10.1.2.9", 80, false)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.12:80 rr", "  -> 10.1.1.9:80 w1", "  -> 10.1.2.9:80 w1", "TCP/192.168.5.5:80 rr", "  -> 10.1.1.9:80 w1"},
		sets:   []setWant{{"VIPVS-EXTERNAL-IP", []string{}}, {"VIPVS-EXTERNAL-LOCAL", []string{"192.168.5.5,tcp:80"}}},
	}, {
		name: "externalTrafficPolicy Local without local endpoints drops",
		sp: func() *model.ServicePort {
			sp := port("default/lb", "", model.TCP, 80, "10.96.0.13")
			sp.Type = model.TypeLoadBalancer
			sp.LoadBalancerIPs = addrs("203.0.113.50")
			sp.ExternalTrafficPolicy = model.PolicyLocal
			sp.Endpoints = []model.Endpoint{ep("10.1.2.9", 80, false)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.13:80 rr", "  -> 10.1.2.9:80 w1", "TCP/203.0.113.50:80 rr"},
		sets:   []setWant{{"VIPVS-LB-LOCAL", []string{"203.0.113.50,tcp:80"}}, {"VIPVS-NO-EP-DROP", []string{"203.0.113.50,tcp:80"}}, {"VIPVS-NO-EP-REJECT", []string{}}},
	}, {
		name: "load balancer with source ranges",
		sp: func() *model.ServicePort {
			sp := port("default/lb", "", model.TCP, 80, "10.96.0.13")
			sp.Type = model.TypeLoadBalancer
			sp.LoadBalancerIPs = addrs("203.0.113.50")
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")}
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 80, true)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.13:80 rr", "  -> 10.1.1.9:80 w1", "TCP/203.0.113.50:80 rr", "  -> 10.1.1.9:80 w1"},
		sets: []setWant{{"VIPVS-LB", []string{"203.0.113.50,tcp:80"}}, {"VIPVS-LB-FW", []string{"203.0.113.50,tcp:80"}},
			{"VIPVS-LB-SRC", []string{"203.0.113.50,tcp:80,203.0.113.0/24"}}},
		vips: addrs("10.96.0.13", "203.0.113.50"),
	}, {
		name: "NodePort on both node IPs, not bound",
		sp: func() *model.ServicePort {
			sp := port("default/np", "", model.UDP, 53, "10.96.0.14", "fd00:96::14")
			sp.Type = model.TypeNodePort
			sp.NodePort = 30053
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 5353, true), ep("fd00:10:1:1::9", 5353, true)}
			return fill(sp)
		},
		kernel: []string{"UDP/10.96.0.14:53 rr", "  -> 10.1.1.9:5353 w1", "UDP/192.168.0.10:30053 rr", "  -> 10.1.1.9:5353 w1",
			"UDP/[fd00:96::14]:53 rr", "  -> [fd00:10:1:1::9]:5353 w1", "UDP/[fd00:192::10]:30053 rr", "  -> [fd00:10:1:1::9]:5353 w1"},
		sets: []setWant{{"VIPVS-NODE-PORT", []string{"192.168.0.10,udp:30053"}}, {"VIPVS6-NODE-PORT", []string{"fd00:192::10,udp:30053"}}},
		vips: addrs("10.96.0.14", "fd00:96::14"),
	}, {
		name: "single-stack Service: NodePort in its family only",
		sp: func() *model.ServicePort {
			sp := port("default/np", "", model.UDP, 53, "fd00:96::14")
			sp.Type = model.TypeNodePort
			sp.NodePort = 30053
			sp.Endpoints = []model.Endpoint{ep("fd00:10:1:1::9", 5353, true)}
			return fill(sp)
		},
		kernel: []string{"UDP/[fd00:96::14]:53 rr", "  -> [fd00:10:1:1::9]:5353 w1", "UDP/[fd00:192::10]:30053 rr", "  -> [fd00:10:1:1::9]:5353 w1"},
		sets:   []setWant{{"VIPVS-NODE-PORT", []string{}}, {"VIPVS6-NODE-PORT", []string{"fd00:192::10,udp:30053"}}},
	}, {
		name: "NodePort with Local policy and nodePortAddresses",
		mod: func(o *Options) {
			o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}
			o.LocalAddrs = func() ([]netip.Addr, error) { return addrs("127.0.0.1", "192.168.0.10", "10.250.0.1"), nil }
		},
		sp: func() *model.ServicePort {
			sp := port("default/np", "", model.TCP, 80, "10.96.0.14")
			sp.Type = model.TypeNodePort
			sp.NodePort = 30080
			sp.ExternalTrafficPolicy = model.PolicyLocal
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 80, true), ep("10.1.2.9", 80, false)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.14:80 rr", "  -> 10.1.1.9:80 w1", "  -> 10.1.2.9:80 w1", "TCP/10.250.0.1:30080 rr", "  -> 10.1.1.9:80 w1"},
		sets:   []setWant{{"VIPVS-NODE-PORT-LOCAL", []string{"10.250.0.1,tcp:30080"}}, {"VIPVS-NODE-PORT", []string{}}},
	}, {
		name: "internalTrafficPolicy Local without local endpoints drops",
		sp: func() *model.ServicePort {
			sp := port("default/itp", "", model.TCP, 80, "10.96.0.15")
			sp.InternalTrafficPolicy = model.PolicyLocal
			sp.Endpoints = []model.Endpoint{ep("10.1.2.9", 80, false)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.15:80 rr"},
		sets:   []setWant{{"VIPVS-NO-EP-DROP", []string{"10.96.0.15,tcp:80"}}, {"VIPVS-CLUSTER-IP", []string{"10.96.0.15,tcp:80"}}},
	}, {
		name: "no endpoints rejects",
		sp: func() *model.ServicePort {
			return fill(port("default/none", "", model.TCP, 80, "10.96.0.16"))
		},
		kernel: []string{"TCP/10.96.0.16:80 rr"},
		sets:   []setWant{{"VIPVS-NO-EP-REJECT", []string{"10.96.0.16,tcp:80"}}, {"VIPVS-NO-EP-DROP", []string{}}},
	}, {
		name: "ClientIP affinity is persistence with the Service's timeout",
		sp: func() *model.ServicePort {
			sp := web()
			sp.AffinityTimeoutSeconds = 600
			return sp
		},
		kernel: []string{"TCP/10.96.0.10:80 rr persistent 600", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1"},
	}, {
		name: "only serving terminating endpoints: they take traffic",
		sp: func() *model.ServicePort {
			sp := port("default/term", "", model.TCP, 80, "10.96.0.17")
			sp.Endpoints = []model.Endpoint{termE("10.1.1.9", 80, true)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.17:80 rr", "  -> 10.1.1.9:80 w1"},
	}, {
		name: "SCTP",
		sp: func() *model.ServicePort {
			sp := port("default/sctp", "", model.SCTP, 3868, "10.96.0.18")
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 3868, true)}
			return fill(sp)
		},
		kernel: []string{"SCTP/10.96.0.18:3868 rr", "  -> 10.1.1.9:3868 w1"},
		sets:   []setWant{{"VIPVS-CLUSTER-IP", []string{"10.96.0.18,sctp:3868"}}},
	}, {
		name: "IPv4 only family",
		mod:  func(o *Options) { o.Families = []iptables.Family{iptables.IPv4} },
		sp: func() *model.ServicePort {
			sp := port("default/ds", "", model.TCP, 443, "10.96.0.11", "fd00:96::11")
			sp.Endpoints = []model.Endpoint{ep("10.1.1.9", 8443, true), ep("fd00:10:1:1::9", 8443, true)}
			return fill(sp)
		},
		kernel: []string{"TCP/10.96.0.11:443 rr", "  -> 10.1.1.9:8443 w1"},
		vips:   addrs("10.96.0.11"),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, tc.mod)
			b.sync(t, state(tc.sp()), false)
			want(t, "kernel", lines(b.kernel.Dump()), tc.kernel)
			for _, s := range tc.sets {
				want(t, "set "+s.set, b.sets.Members(s.set), s.members)
			}
			if tc.vips != nil {
				got, _ := b.addrs.List()
				want(t, "bound VIPs", got, tc.vips)
			}
		})
	}
}

func TestBadServicePortSkipped(t *testing.T) {
	b := newBed(t, nil)
	bad := web()
	bad.Name.Name = "bad"
	bad.ClusterIPs = addrs("10.96.0.99")
	bad.AffinityTimeoutSeconds = 100000
	dup := web()
	dup.Name.Name = "zdup" // sorts after web: web keeps the address
	dup.Endpoints = []model.Endpoint{ep("10.1.3.9", 1, false)}
	fill(dup)
	b.sync(t, state(bad, web(), dup), false)
	want(t, "kernel", lines(b.kernel.Dump()), []string{"TCP/10.96.0.10:80 rr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1"})
	logs := b.logs.String()
	for _, s := range []string{"default/bad:http/TCP", "timeoutSeconds 100000", "default/zdup:http/TCP", "another Service port already uses it"} {
		if !strings.Contains(logs, s) {
			t.Errorf("log lacks %q:\n%s", s, logs)
		}
	}
}

func TestSchedulers(t *testing.T) {
	for _, sched := range Schedulers {
		t.Run(sched, func(t *testing.T) {
			b := newBed(t, func(o *Options) { o.Scheduler = sched })
			sp := web()
			sp.AffinityTimeoutSeconds = 600
			b.sync(t, state(sp, fill(port("default/b", "", model.UDP, 53, "10.96.0.20"))), false)
			svcs, _ := b.kernel.Services()
			if len(svcs) != 2 {
				t.Fatalf("got %d virtual servers, want 2", len(svcs))
			}
			for _, vs := range svcs {
				if vs.Scheduler != sched {
					t.Errorf("%s: scheduler %q, want %q", vs.ServiceKey, vs.Scheduler, sched)
				}
				wantFlags, wantTimeout := uint32(0), uint32(0)
				if vs.Port == 80 {
					wantFlags, wantTimeout = FlagPersistent, 600
				}
				if vs.Flags&^FlagHashed != wantFlags || vs.Timeout != wantTimeout {
					t.Errorf("%s: flags %#x timeout %d, want %#x %d", vs.ServiceKey, vs.Flags, vs.Timeout, wantFlags, wantTimeout)
				}
				if vs.Flags&(FlagSched1|FlagSched2) != 0 {
					t.Errorf("%s: scheduler flags set: %#x", vs.ServiceKey, vs.Flags)
				}
			}
			// A restart with another scheduler updates the virtual
			// servers in place: no real server is touched.
			other := "rr"
			if sched == "rr" {
				other = "sh"
			}
			b.clear()
			b.p = b.newProxier(t, func(o *Options) { o.Scheduler = other })
			b.sync(t, state(sp, fill(port("default/b", "", model.UDP, 53, "10.96.0.20"))), false)
			want(t, "calls after scheduler change", b.kernel.Calls(), []string{
				"UpdateService TCP/10.96.0.10:80 " + other + " persistent 600",
				"UpdateService UDP/10.96.0.20:53 " + other,
			})
		})
	}
}

func TestSchedulerValidation(t *testing.T) {
	for _, tc := range []struct {
		sched, want string
	}{{"", "rr"}, {"sed", "sed"}, {"wrr", ""}, {"mh", ""}, {"RR", ""}, {"random", ""}} {
		t.Run(tc.sched, func(t *testing.T) {
			o := Options{Kernel: &FakeKernel{}, IPSet: &ipset.Fake{}}
			o.Scheduler = tc.sched
			p, err := NewProxier(o)
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), `"`+tc.sched+`"`) {
					t.Fatalf("NewProxier(%q) error %v, want one naming the scheduler", tc.sched, err)
				}
				if _, err := New(o); err == nil {
					t.Errorf("New(%q) accepted it", tc.sched)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.opts.Scheduler != tc.want {
				t.Errorf("scheduler %q, want %q", p.opts.Scheduler, tc.want)
			}
		})
	}
}

// TestIncremental proves with the fakes' call logs that a sync touches
// only what changed.
func TestIncremental(t *testing.T) {
	b := newBed(t, nil)
	other := fill(port("default/other", "", model.TCP, 81, "10.96.0.30"))
	other.Endpoints = []model.Endpoint{ep("10.1.1.7", 81, true)}
	fill(other)
	b.sync(t, state(web(), other), false)
	b.clear()

	// Same state twice: nothing written anywhere.
	b.sync(t, state(web(), other), false)
	want(t, "kernel calls, same state", b.kernel.Calls(), []string(nil))
	want(t, "ipset scripts, same state", b.sets.Scripts(), []string(nil))
	want(t, "address calls, same state", b.addrs.Calls(), []string(nil))
	want(t, "iptables restores, same state", len(b.ipt.Restores), 0)

	// One endpoint more on web: one AddDest, one set member.
	w := web()
	w.Endpoints = append(w.Endpoints, ep("10.1.3.9", 8080, false))
	fill(w)
	b.sync(t, state(w, other), false)
	want(t, "kernel calls, endpoint added", b.kernel.Calls(), []string{"AddDest TCP/10.96.0.10:80 10.1.3.9:8080 w1"})
	want(t, "ipset scripts, endpoint added", b.sets.Scripts(), []string{"add VIPVS-LOOP-BACK 10.1.3.9,tcp:8080,10.1.3.9 -exist\n"})
	want(t, "iptables restores, endpoint added", len(b.ipt.Restores), 0)

	// Affinity on other: one UpdateService.
	o2 := *other
	o2.AffinityTimeoutSeconds = 600
	b.sync(t, state(w, &o2), false)
	want(t, "kernel calls, affinity", b.kernel.Calls(), []string{"UpdateService TCP/10.96.0.30:81 rr persistent 600"})
	want(t, "ipset scripts, affinity", b.sets.Scripts(), []string(nil))

	// other removed: one DelService, its VIP unbound, its members deleted.
	b.sync(t, state(w), false)
	want(t, "kernel calls, removed", b.kernel.Calls(), []string{"DelService TCP/10.96.0.30:81"})
	want(t, "address calls, removed", b.addrs.Calls(), []string{"del 10.96.0.30"})
	want(t, "ipset scripts, removed", b.sets.Scripts(), []string{strings.Join([]string{
		"del VIPVS-CLUSTER-IP 10.96.0.30,tcp:81 -exist",
		"del VIPVS-LOOP-BACK 10.1.1.7,tcp:81,10.1.1.7 -exist",
		"del VIPVS-VIPS 10.96.0.30 -exist",
	}, "\n") + "\n"})
	want(t, "iptables restores, removed", len(b.ipt.Restores), 0)
}

// TestGracefulTermination: a TCP real server that leaves the endpoint set
// goes to weight 0 and is deleted once it holds no connection; UDP ones
// are deleted at once; one that comes back is restored.
func TestGracefulTermination(t *testing.T) {
	b := newBed(t, nil)
	key := ServiceKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: model.TCP}
	b.sync(t, state(web()), false)
	b.kernel.SetConns(key, netip.MustParseAddrPort("10.1.2.9:8080"), 3, 1)
	b.clear()

	// 10.1.2.9 terminates while 10.1.1.9 is ready: it leaves ClusterEndpoints.
	w := web()
	w.Endpoints[1] = termE("10.1.2.9", 8080, false)
	fill(w)
	b.sync(t, state(w), false)
	want(t, "calls, terminating", b.kernel.Calls(), []string{"UpdateDest TCP/10.96.0.10:80 10.1.2.9:8080 w0"})
	want(t, "pending", b.p.PendingDeletions(), []string{"TCP/10.96.0.10:80 -> 10.1.2.9:8080"})

	// Still connections: kept.
	b.sync(t, state(w), false)
	want(t, "calls, connections left", b.kernel.Calls(), []string(nil))
	want(t, "kernel, connections left", lines(b.kernel.Dump()), []string{"TCP/10.96.0.10:80 rr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w0"})

	// Drained: deleted on the next sync.
	b.kernel.SetConns(key, netip.MustParseAddrPort("10.1.2.9:8080"), 0, 0)
	b.sync(t, state(w), false)
	want(t, "calls, drained", b.kernel.Calls(), []string{"DelDest TCP/10.96.0.10:80 10.1.2.9:8080"})
	want(t, "pending after drain", b.p.PendingDeletions(), []string(nil))

	// Back again (and again removed then back before draining).
	b.sync(t, state(web()), false)
	b.kernel.SetConns(key, netip.MustParseAddrPort("10.1.2.9:8080"), 1, 0)
	b.sync(t, state(w), false)
	b.sync(t, state(web()), false)
	want(t, "calls, back", b.kernel.Calls(), []string{
		"AddDest TCP/10.96.0.10:80 10.1.2.9:8080 w1",
		"UpdateDest TCP/10.96.0.10:80 10.1.2.9:8080 w0",
		"UpdateDest TCP/10.96.0.10:80 10.1.2.9:8080 w1",
	})
	want(t, "pending when back", b.p.PendingDeletions(), []string(nil))

	// A restart finds a weight-0 real server with connections: the new
	// Proxier keeps draining it.
	b.sync(t, state(w), false)
	b.p = b.newProxier(t, nil)
	b.clear()
	b.sync(t, state(w), false)
	want(t, "calls after restart", b.kernel.Calls(), []string(nil))
	want(t, "pending after restart", b.p.PendingDeletions(), []string{"TCP/10.96.0.10:80 -> 10.1.2.9:8080"})

	// UDP: deleted at once.
	u := fill(port("default/dns", "", model.UDP, 53, "10.96.0.40"))
	u.Endpoints = []model.Endpoint{ep("10.1.1.9", 53, true), ep("10.1.2.9", 53, false)}
	fill(u)
	b.sync(t, state(w, u), false)
	b.kernel.Calls()
	u2 := *u // a new port: ports given to a dataplane are read-only
	u2.Endpoints = u.Endpoints[:1:1]
	fill(&u2)
	b.sync(t, state(w, &u2), false)
	want(t, "calls, UDP endpoint gone", b.kernel.Calls(), []string{"DelDest UDP/10.96.0.40:53 10.1.2.9:53"})
}

// takeWrites returns the fake's writes so far and forgets them.
func takeWrites(f *sysctl.Fake) []string {
	w := f.Writes
	f.Writes = nil
	return w
}

func TestSysctlsAndTimeouts(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run("strictARP="+map[bool]string{false: "false", true: "true"}[strict], func(t *testing.T) {
			b := newBed(t, func(o *Options) {
				o.StrictARP = strict
				o.Timeouts = Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}
			})
			b.sysctl.Values["/proc/sys/net/ipv4/ip_forward"] = "1"
			b.sysctl.Values["/proc/sys/net/ipv4/vs/expire_nodest_conn"] = "1"
			b.sync(t, state(web()), false)
			wantWrites := []string{"/proc/sys/net/ipv4/vs/conntrack=1", "/proc/sys/net/ipv4/vs/expire_quiescent_template=1"}
			wantOrig := map[string]string{"/proc/sys/net/ipv4/vs/conntrack": "0", "/proc/sys/net/ipv4/vs/expire_quiescent_template": "0"}
			if strict {
				wantWrites = append(wantWrites, "/proc/sys/net/ipv4/conf/all/arp_ignore=1", "/proc/sys/net/ipv4/conf/all/arp_announce=2")
				wantOrig["/proc/sys/net/ipv4/conf/all/arp_ignore"] = "0"
				wantOrig["/proc/sys/net/ipv4/conf/all/arp_announce"] = "0"
			}
			want(t, "sysctl writes", takeWrites(b.sysctl), wantWrites)
			want(t, "originals", b.p.SysctlOriginals(), wantOrig)
			want(t, "timeouts", b.kernel.Timeouts(), Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second})
			b.kernel.Calls()
			b.sync(t, state(web()), true)
			want(t, "sysctl writes on the second sync", takeWrites(b.sysctl), []string(nil))
			if c := b.kernel.Calls(); slices.ContainsFunc(c, func(s string) bool { return strings.HasPrefix(s, "SetTimeouts") }) {
				t.Errorf("timeouts set again: %v", c)
			}
			if err := b.p.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			want(t, "conntrack sysctl after Cleanup", b.sysctl.Values["/proc/sys/net/ipv4/vs/conntrack"], "0")
		})
	}
	t.Run("no timeouts: no call", func(t *testing.T) {
		b := newBed(t, nil)
		b.sync(t, state(web()), false)
		if c := b.kernel.Calls(); slices.ContainsFunc(c, func(s string) bool { return strings.HasPrefix(s, "SetTimeouts") }) {
			t.Errorf("SetTimeouts called: %v", c)
		}
	})
}

func TestIptablesRules(t *testing.T) {
	b := newBed(t, func(o *Options) { o.Families = []iptables.Family{iptables.IPv4} })
	b.sync(t, state(web()), false)
	b.sync(t, state(web()), true) // jumps must not be duplicated
	nat := b.ipt.Dump(iptables.IPv4, "nat")
	filter := b.ipt.Dump(iptables.IPv4, "filter")
	for _, r := range []string{
		"-A PREROUTING -m comment --comment vipproxy-ipvs -j VIPVS-SERVICES",
		"-A OUTPUT -m comment --comment vipproxy-ipvs -j VIPVS-SERVICES",
		"-A POSTROUTING -m comment --comment vipproxy-ipvs -j VIPVS-POSTROUTING",
		"-A VIPVS-CLUSTER-MASQ -s 10.1.0.0/16 -j RETURN",
		"-A VIPVS-CLUSTER-MASQ -j VIPVS-MARK-MASQ",
		"-A VIPVS-MARK-MASQ -j MARK --or-mark 0x4000",
		"-A VIPVS-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
		"-A VIPVS-SERVICES -m set --match-set VIPVS-CLUSTER-IP dst,dst -j VIPVS-CLUSTER-MASQ",
	} {
		if strings.Count(nat, r+"\n") != 1 {
			t.Errorf("nat: want exactly one %q in:\n%s", r, nat)
		}
	}
	for _, r := range []string{
		"-A INPUT -m comment --comment vipproxy-ipvs -j VIPVS-FILTER",
		"-A VIPVS-FILTER -m set --match-set VIPVS-LB-FW dst,dst -j VIPVS-FIREWALL",
		"-A VIPVS-FILTER -m conntrack --ctstate NEW -m set --match-set VIPVS-VIPS dst -m comment --comment \"unknown port on a VIP\" -j REJECT",
		"-A VIPVS-FIREWALL -m set --match-set VIPVS-LB-SRC dst,dst,src -j RETURN",
	} {
		if strings.Count(filter, r+"\n") != 1 {
			t.Errorf("filter: want exactly one %q in:\n%s", r, filter)
		}
	}
	t.Run("masqueradeAll", func(t *testing.T) {
		b := newBed(t, func(o *Options) { o.MasqueradeAll = true; o.Families = []iptables.Family{iptables.IPv4} })
		b.sync(t, state(web()), false)
		nat := b.ipt.Dump(iptables.IPv4, "nat")
		if strings.Contains(nat, "-A VIPVS-CLUSTER-MASQ -s") || !strings.Contains(nat, "--match-set VIPVS-NODE-PORT-LOCAL dst,dst -j VIPVS-MARK-MASQ") {
			t.Errorf("masqueradeAll rules wrong:\n%s", nat)
		}
	})
}

// TestBalanceSchedulers: vipproxy.io/lb-algorithm picks the virtual
// server's scheduler (wrr, mh), the weights of the endpoint sets (which
// slow start rewrites) become real-server weights, and each change
// updates the one virtual server in place.
func TestBalanceSchedulers(t *testing.T) {
	b := newBed(t, nil)
	for _, tc := range []struct {
		name    string
		balance model.Balance
		weigh   func(sp *model.ServicePort)
		want    []string
	}{
		{"consistent-hash, weighted", model.BalanceConsistentHash, func(sp *model.ServicePort) { sp.Endpoints[1].Weight = 3; fill(sp) },
			[]string{"TCP/10.96.0.10:80 mh flags 0x8", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w3"}},
		{"round-robin, weighted", model.BalanceRoundRobin, func(sp *model.ServicePort) { sp.Endpoints[1].Weight = 3; fill(sp) },
			[]string{"TCP/10.96.0.10:80 wrr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w3"}},
		{"round-robin", model.BalanceRoundRobin, func(*model.ServicePort) {},
			[]string{"TCP/10.96.0.10:80 wrr", "  -> 10.1.1.9:8080 w1", "  -> 10.1.2.9:8080 w1"}},
		{"round-robin, ramping set", model.BalanceRoundRobin, func(sp *model.ServicePort) {
			sp.ClusterEndpoints = slices.Clone(sp.ClusterEndpoints)
			sp.ClusterEndpoints[0].Weight = 10
		}, []string{"TCP/10.96.0.10:80 wrr", "  -> 10.1.1.9:8080 w10", "  -> 10.1.2.9:8080 w1"}},
	} {
		sp := web()
		sp.Balance = tc.balance
		tc.weigh(sp)
		b.sync(t, state(sp), false)
		want(t, tc.name, lines(b.kernel.Dump()), tc.want)
	}
}
