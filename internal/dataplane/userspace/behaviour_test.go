package userspace

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/vipproxy/vipproxy/internal/dataplane"
	dpt "github.com/vipproxy/vipproxy/internal/dataplane/dataplanetest"
	"github.com/vipproxy/vipproxy/internal/model"
)

// fakeAddrs adds every address (nothing real).
type fakeAddrs struct{ m map[netip.Addr]bool }

func (f *fakeAddrs) CanAdd() error { return nil }
func (f *fakeAddrs) Add(ip netip.Addr) error {
	f.m[ip] = true
	return nil
}
func (f *fakeAddrs) Del(ip netip.Addr) error {
	delete(f.m, ip)
	return nil
}
func (f *fakeAddrs) List() ([]netip.Addr, error) {
	var out []netip.Addr
	for ip := range f.m {
		out = append(out, ip)
	}
	return out, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// newFakeProxier returns a Proxier whose listeners and VIP addresses are
// bookkeeping only, on the shared scenario node.
func newFakeProxier(t *testing.T, opts dataplane.Options) *Proxier {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	p, err := New(Options{
		Options: opts,
		Addrs:   &fakeAddrs{m: map[netip.Addr]bool{}},
		LocalAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{dpt.NodeIPv4, dpt.NodeIPv6, dpt.OtherLocalIPv4, dpt.OtherLocalIPv6}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.bindableFn = func(netip.Addr) bool { return false }
	p.listenFn = func(context.Context, listenKey, *group) (io.Closer, error) { return nopCloser{}, nil }
	return p
}

// Trace reports what the userspace mode does with the first packet of a
// connection. A listener on (proto, dst, port) proxies it (always from the
// node: "masquerade") to its group's endpoints, or to the alt group's for
// in-cluster clients, or resets it when Allow refuses the client or there
// is no endpoint. Without a listener, a local destination (a VIP of this
// mode or a node address) is refused by the kernel, and anything else is
// not this mode's business.
func (p *Proxier) Trace(pk dpt.Packet) dpt.Verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.listeners[listenKey{proto: pk.Proto, addr: netip.AddrPortFrom(pk.Dst, pk.DstPort)}]
	if l == nil {
		if s := p.vips[pk.Dst]; s == vipOwned || s == vipLocal || pk.DstLocal {
			return dpt.RejectV
		}
		return dpt.AcceptV
	}
	pr := l.group.proxy
	if pr.Allow != nil && !pr.Allow(pk.Src) {
		return dpt.RejectV
	}
	if pr.Alt != nil && pr.UseAlt(pk.Src) {
		pr = pr.Alt
	}
	eps := pr.Endpoints()
	if len(eps) == 0 {
		return dpt.RejectV
	}
	v := dpt.Verdict{Action: dpt.DNAT, AffinitySeconds: int(pr.AffinityTimeout.Seconds())}
	for _, e := range eps {
		v.Targets = append(v.Targets, dpt.Target{Endpoint: e.Addr, Masquerade: true})
	}
	return v
}

// userspaceVerdict translates what the kernel modes do into what a socket
// proxy can do. Every proxied connection comes from the node
// ("masquerade"). A socket proxy cannot tell drop, reject and "not
// touched" apart on a local address: nothing is proxied there and the
// kernel answers; so on a local destination (a VIP of the State or a node
// address) every non-DNAT verdict becomes reject, elsewhere accept.
func userspaceVerdict(want dpt.Verdict, pk dpt.Packet, vips map[netip.Addr]bool) dpt.Verdict {
	if want.Action == dpt.DNAT {
		out := want
		out.Targets = nil
		for _, tg := range want.Targets {
			tg.Masquerade = true
			out.Targets = append(out.Targets, tg)
		}
		return out
	}
	if vips[pk.Dst] || pk.DstLocal {
		return dpt.RejectV
	}
	return dpt.AcceptV
}

// noiseGone repeats dataplanetest's checks that NoiseState's default/noise
// and default/empty left nothing behind (that list is unexported).
var noiseGone = []dpt.Check{
	{Name: "noise clusterIP gone", Packet: dpt.UDP("10.1.1.9", "10.96.0.200", 80), Want: dpt.DropV},
	{Name: "empty clusterIP gone", Packet: dpt.TCP("10.1.1.9", "10.96.0.201", 80), Want: dpt.DropV},
	{Name: "noise nodePort gone", Packet: dpt.UDP("203.0.113.7", "192.168.0.10", 30999), Want: dpt.AcceptV},
	{Name: "noise externalIP gone", Packet: dpt.UDP("203.0.113.7", "198.51.100.200", 80), Want: dpt.AcceptV},
	{Name: "noise LB IP gone", Packet: dpt.UDP("198.18.0.5", "198.51.100.201", 80), Want: dpt.AcceptV},
}

func stateVIPs(st *model.State) map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, sp := range st.Ports {
		for _, ip := range append(append(append([]netip.Addr{}, sp.ClusterIPs...), sp.ExternalIPs...), sp.LoadBalancerIPs...) {
			m[ip] = true
		}
	}
	return m
}

// TestBehaviour runs the shared dataplane scenarios (cold, and partial
// after NoiseState) against the userspace mode's listener table, with the
// expectations translated by userspaceVerdict. SCTP checks are skipped.
func TestBehaviour(t *testing.T) {
	for _, sc := range dpt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			for _, partial := range []bool{false, true} {
				name := "cold"
				if partial {
					name = "partial"
				}
				t.Run(name, func(t *testing.T) {
					p := newFakeProxier(t, sc.Opts())
					ctx := context.Background()
					checks := sc.Checks
					if partial {
						if err := p.Sync(ctx, dpt.NoiseState(), true); err != nil {
							t.Fatalf("Sync(noise): %v", err)
						}
						checks = append(append([]dpt.Check(nil), checks...), noiseGone...)
					}
					st := sc.State()
					if err := p.Sync(ctx, st, !partial); err != nil {
						t.Fatalf("Sync: %v", err)
					}
					vips := stateVIPs(st)
					for _, c := range checks {
						pk := c.Packet
						if pk.Proto == model.SCTP {
							continue
						}
						pk.DstLocal = dpt.IsLocalAddr(pk.Dst)
						want := userspaceVerdict(c.Want, pk, vips).Normalize()
						if got := p.Trace(pk).Normalize(); got.String() != want.String() {
							t.Errorf("%s: %s: got %s, want %s (kernel modes: %s)", c.Name, pk, got, want, c.Want.Normalize())
						}
					}
				})
			}
		})
	}
}
